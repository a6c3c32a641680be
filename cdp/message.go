package cdp

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// Reading a message's envelope — its ID, its method, its CDP session —
// without decoding the rest. Chrome writes every message the same way: an
// answer starts {"id":N, an event {"method":"X", and the flat session a
// message belongs to is its last member, ,"sessionId":"S"} (the browser
// appends it). A message in that layout is told apart by its first and
// last bytes; any other is decoded whole.

// envelope is what the participant reads of a message.
type envelope struct {
	id        int64
	hasID     bool
	method    string
	sessionID string
}

var (
	idHead     = []byte(`{"id":`)
	methodHead = []byte(`{"method":"`)
	sidTail    = []byte(`,"sessionId":"`)
)

// leadingID reads the ID of a message that starts {"id":N followed by ,
// or }.
func leadingID(msg []byte) (int64, bool) {
	if !bytes.HasPrefix(msg, idHead) {
		return 0, false
	}
	rest := msg[len(idHead):]
	n := 0
	for n < len(rest) && n < 19 && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	if n == 0 || n >= len(rest) || (rest[n] != ',' && rest[n] != '}') {
		return 0, false
	}
	id, err := strconv.ParseInt(string(rest[:n]), 10, 64)
	return id, err == nil
}

// leadingMethod reads the method of a message that starts
// {"method":"X".
func leadingMethod(msg []byte) (string, bool) {
	if !bytes.HasPrefix(msg, methodHead) {
		return "", false
	}
	rest := msg[len(methodHead):]
	end := bytes.IndexByte(rest, '"')
	if end <= 0 || end > 128 || bytes.IndexByte(rest[:end], '\\') >= 0 {
		return "", false
	}
	return string(rest[:end]), true
}

// trailingSession reads the session a message in Chrome's layout belongs
// to: its last member ,"sessionId":"S"} ("" when it has none: the root
// session). A member whose closing brace ends the message is the
// message's own (a nested object would close there too), and its key is
// a key (a quote inside a string is escaped).
func trailingSession(msg []byte) string {
	end := len(msg) - 1
	for end >= 0 && isSpace(msg[end]) {
		end--
	}
	if end < 2 || msg[end] != '}' || msg[end-1] != '"' {
		return ""
	}
	// The value: back to its opening quote.
	start := end - 2
	for start >= 0 && msg[start] != '"' {
		if msg[start] == '\\' || end-start > 128 {
			return ""
		}
		start--
	}
	if start < len(sidTail)-1 || !bytes.Equal(msg[start-len(sidTail)+1:start+1], sidTail) {
		return ""
	}
	return string(msg[start+1 : end-1])
}

func isSpace(b byte) bool { return b == ' ' || b == '\n' || b == '\r' || b == '\t' }

// readEnvelope reads msg's envelope: from its first and last bytes when
// it is in Chrome's layout, else by decoding it (ok false: not a JSON
// object).
func readEnvelope(msg []byte) (e envelope, ok bool) {
	if id, isAnswer := leadingID(msg); isAnswer {
		return envelope{id: id, hasID: true, sessionID: trailingSession(msg)}, true
	}
	if m, isEvent := leadingMethod(msg); isEvent {
		return envelope{method: m, sessionID: trailingSession(msg)}, true
	}
	var whole struct {
		ID        *int64 `json:"id"`
		Method    string `json:"method"`
		SessionID string `json:"sessionId"`
	}
	if json.Unmarshal(msg, &whole) != nil {
		return envelope{}, false
	}
	e = envelope{method: whole.Method, sessionID: whole.SessionID}
	if whole.ID != nil {
		e.id, e.hasID = *whole.ID, true
	}
	return e, true
}
