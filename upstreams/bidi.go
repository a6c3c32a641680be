package upstreams

import (
	"encoding/json"
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

// BiDiEndID is the command ID of the gateway's session.end: the largest
// one WebDriver BiDi allows (2^53-1), far above the IDs clients count up
// from 1.
const BiDiEndID = 1<<53 - 1

// biDiEndIDText is BiDiEndID as JSON writes it.
var biDiEndIDText = strconv.FormatInt(BiDiEndID, 10)

// biDiEnd is the session.end command the gateway sends.
var biDiEnd = []byte(`{"id":` + biDiEndIDText + `,"method":"session.end","params":{}}`)

// BiDiFarewell is the farewell of a WebDriver BiDi session: session.end
// with BiDiEndID, whose answer (success or error) is awaited
// DefaultFarewellWait.
func BiDiFarewell() *Farewell {
	return &Farewell{Message: biDiEnd, IsReply: isBiDiEndReply, Wait: DefaultFarewellWait}
}

// isBiDiEndReply reports whether msg is the answer to the gateway's
// session.end: a BiDi message with its ID.
func isBiDiEndReply(msg []byte) bool {
	var m struct {
		ID json.RawMessage `json:"id"`
	}
	return json.Unmarshal(msg, &m) == nil && string(m.ID) == biDiEndIDText
}
