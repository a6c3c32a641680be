package cdp

import (
	"encoding/json"
	"math/rand/v2"
	"strconv"
)

// commands are what one speaker of the gateway's (the participant, a
// profile's conversation) sends on a session's connection: its IDs, from
// a random start in a range of its own, and what waits for each answer.
type commands struct {
	// firstID and nextID bound the IDs it has sent with.
	firstID, nextID int64
	// calls are the commands whose answers are waited for, by ID: what to
	// do with the answer.
	calls map[int64]func(answer)
}

// newCommands starts IDs at base plus a random offset under idSpan.
func newCommands(base int64) commands {
	first := base + rand.Int64N(idSpan)
	return commands{firstID: first, nextID: first, calls: map[int64]func(answer){}}
}

// command takes the next ID and makes the message of method with params
// (JSON) in session ("": the root session).
func (c *commands) command(session, method string, params []byte) (int64, []byte) {
	id := c.nextID
	c.nextID++
	b := make([]byte, 0, 96+len(method)+len(params)+len(session))
	b = append(b, `{"id":`...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, `,"method":"`...)
	b = append(b, method...)
	b = append(b, `","params":`...)
	b = append(b, params...)
	if session != "" {
		b = append(b, `,"sessionId":"`...)
		b = append(b, session...)
		b = append(b, '"')
	}
	return id, append(b, '}')
}

// sent reports whether id is one it sent a command with.
func (c *commands) sent(id int64) bool { return id >= c.firstID && id < c.nextID }

// answered hands msg, the answer to id, to what waits for it, if
// anything does.
func (c *commands) answered(id int64, msg []byte) {
	then, waits := c.calls[id]
	if !waits {
		return
	}
	delete(c.calls, id)
	var a answer
	json.Unmarshal(msg, &a)
	then(a)
}
