package upstreams

import (
	"encoding/json"
	"math/rand/v2"
	"strconv"
)

// WebDriver BiDi (Firefox): what the gateway does beyond relaying.
//
// Firefox keeps a BiDi session after the WebSocket it was created on
// closes, until session.end is sent on that same connection (another
// connection cannot end it), and it runs one session at a time: a client
// that drops without ending its session would have every later
// session.new fail with "Maximum number of active sessions" until Firefox
// restarts. So a BiDi session's farewell (farewell.go) is a session.end
// command of the gateway's own, under an ID no client uses, and the
// provider's connection is closed once Firefox has answered it (or a
// second has passed).

// The command ID of a session's session.end is drawn at random from the
// upper half of the IDs WebDriver BiDi allows (up to 2^53-1): far above
// the IDs clients count up from 1, and one no client can know, so the
// answer to a command of the client's (which Firefox may send while the
// gateway waits) is never taken for the answer to the gateway's.
const (
	biDiEndIDMin = 1 << 52
	biDiEndIDMax = 1<<53 - 1
)

// BiDiFarewell is the farewell of a WebDriver BiDi session: session.end
// with an ID of its own, whose answer (success or error) is awaited
// DefaultFarewellWait.
func BiDiFarewell() *Farewell {
	const head, tail = `{"id":`, `,"method":"session.end","params":{}}`
	// One array, the ID within it (16 digits).
	msg := append(make([]byte, 0, len(head)+16+len(tail)), head...)
	msg = strconv.AppendInt(msg, biDiEndIDMin+rand.Int64N(biDiEndIDMax-biDiEndIDMin+1), 10)
	id := msg[len(head):]
	msg = append(msg, tail...)
	return &Farewell{Message: msg, IsReply: func(m []byte) bool { return isBiDiReply(m, id) }, Wait: DefaultFarewellWait}
}

// isBiDiReply reports whether msg is the answer to the command with ID id
// (as JSON writes it): a BiDi message with that ID.
func isBiDiReply(msg, id []byte) bool {
	var m struct {
		ID json.RawMessage `json:"id"`
	}
	return json.Unmarshal(msg, &m) == nil && string(m.ID) == string(id)
}
