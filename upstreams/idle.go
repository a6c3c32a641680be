package upstreams

import (
	"encoding/binary"
	"time"
)

// IdleWatch follows what a provider sends on a connection no client uses
// yet (a warm session), by its frame headers only, to see the provider
// close it: a provider ends an idle session with a close frame and waits
// for the answer before it hangs up, so the gateway answers it as the
// session's client would.
type IdleWatch struct {
	t frameTracker
}

// Closed takes p, what the provider sent next, and reports whether a
// whole close frame has come, in p or before.
func (w *IdleWatch) Closed(p []byte) bool {
	w.t.advance(p, false)
	return w.t.sawClose
}

// AnswerClose answers the provider's close frame on c as a client does: a
// close frame of its own, masked, echoing the provider's status code
// (without one when the provider's had none, or one that may not be
// sent), written within CloseWait. The connection is the caller's to
// close then.
func (w *IdleWatch) AnswerClose(c *Conn) error {
	var payload []byte
	if code := w.t.closeCode(); sendableCode(code) {
		payload = binary.BigEndian.AppendUint16(nil, uint16(code))
	}
	c.Conn.SetWriteDeadline(time.Now().Add(CloseWait))
	_, err := c.Conn.Write(controlFrame(opClose, payload, true))
	return err
}
