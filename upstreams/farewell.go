package upstreams

import (
	"errors"
	"io"
	"time"
)

// A farewell: a message the gateway itself sends the provider when the
// client's side of a session ends, so that the provider can let go of what
// the client set up there, before the provider's connection is closed.
// WebDriver BiDi needs it: Firefox keeps a session after its WebSocket
// closes, until session.end, and runs only one at a time (bidi.go).
//
// When the client's side ends between two of its messages (its close
// frame, its connection ending or failing, a write to it failing, or
// keepalive finding it dead), the session goes the way hold parks it
// (hold.go): the client's close frame is answered by the gateway and not
// relayed, the client's connection is closed, and the down direction alone
// holds the provider's. There, instead of waiting for a client to resume,
// it sends the farewell message (a masked text frame: the gateway speaks
// as the client), puts together the provider's small text messages as a
// resume's preamble does (hold_preamble.go) and hands each to IsReply,
// and once the answer is in, or Wait is over, it closes the provider's
// connection with the client's close code. Everything else the provider
// sends meanwhile is dropped. A session whose farewell is under way is not
// parked for anyone: Resume refuses it.
//
// A client that leaves in the middle of one of its messages (inside a
// frame, its header too, or between the frames of a fragmented message)
// has the gateway complete that message for the provider first, as the
// client could have (farewell_fill.go); the farewell follows as above.
// Only a frame that still owes more than fillMax bytes is not completed:
// that session ends as without a farewell.
//
// When the gateway ends a session itself (Close: an operator, the idle
// timeout, the time limit, shutdown), the client's frame in flight may
// finish as for any session; then, or once it has stalled for CloseWait
// or the client's connection ended, the gateway completes the client's
// message, and the farewell goes to the provider right before the close
// frame, without waiting for its answer. When the provider ends the
// session first, it gets none.

// DefaultFarewellWait is how long the gateway waits for the answer to a
// farewell when Farewell.Wait is not set.
const DefaultFarewellWait = time.Second

// Farewell is the message a session sends its provider when its client's
// side ends (SessionOptions.Farewell).
type Farewell struct {
	// Message is the payload of the text message sent. Required.
	Message []byte
	// IsReply reports whether a whole text message from the provider
	// (unmasked, at most MaxReplyMessage bytes) answers Message. It is
	// called on a relay goroutine and must not block. Required.
	IsReply func(msg []byte) bool
	// Wait bounds the wait for the answer (0: DefaultFarewellWait).
	Wait time.Duration
}

// leftWord is the end reason of a session with a farewell whose client's
// side ended with err, as the up direction read it; "" for an interrupted
// read (the session was leaving: leavingReason tells why).
func leftWord(err error) string {
	switch {
	case errors.Is(err, io.EOF):
		return EndClientClosed
	case isTimeout(err):
		return ""
	}
	return EndClientError
}

// leavingReason gives a session with a farewell, whose client has left,
// its end reason: r, or when "" (it was leaving) why it was. Under s.mu.
func (s *Session) leavingReason(r string) {
	if r == "" {
		r = EndClientError // a write to the client failed
		if !s.leaveByWrite {
			r, s.kaClientDead = EndKeepalive, true
		}
	}
	s.setReason(r)
}

// sendsFarewell reports whether d is the client's stream of a session with
// a farewell: it completes a message the client cuts short, and sends the
// farewell when the gateway closes the session.
func (d *direction) sendsFarewell() bool {
	return d.side == toProvider && (d.s.farewell != nil || d.s.lastWord != nil)
}

// sayFarewell is the down direction's farewell, once the client has left
// and it alone holds the provider's connection: it sends the message and
// waits, reading the provider, for the answer (drop and held hand the end
// of the wait to farewellDone).
func (d *direction) sayFarewell() bool {
	if d.s.lastWord != nil {
		return d.beginLastWord(d.farewellDone, nil) // lastword.go
	}
	f := d.s.farewell
	wait := f.Wait
	if wait <= 0 {
		wait = DefaultFarewellWait
	}
	now := time.Now()
	w := &replyWait{want: 1, isReply: f.IsReply, sentAt: now, until: now.Add(wait), farewell: true}
	w.then = d.farewellDone
	d.wait = w
	d.src.SetWriteDeadline(w.until)
	_, err := d.src.Write(appendDataFrame(nil, 0x1, f.Message))
	d.src.SetWriteDeadline(time.Time{})
	if err != nil {
		return d.heldEnd(err)
	}
	// Reads stop at the end of the wait (unless the session is closing
	// meanwhile: then they already stop at once).
	d.s.sync(change{ev: evWake, d: d})
	return true
}

// farewellDone: the farewell's answer came, or the wait for it is over.
// The provider gets the client's close code and the session ends once it
// answers (at most CloseWait later). rest are bytes read from the provider
// not taken yet.
func (d *direction) farewellDone(rest []byte) bool {
	d.wait = nil
	return d.closeProvider(closeFrame(d.s.ClientCloseCode(), "", true), rest)
}
