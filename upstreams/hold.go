package upstreams

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"time"
)

// Hold: a session whose client leaves can keep its provider connection and
// wait for the client to come back.
//
// The client side ends in one of three ways: its close frame, its
// connection ending (EOF, reset, a write to it that fails), or keepalive
// finding it answers no ping. With hold, when that happens while the
// client's stream is between two messages, the session parks instead of
// ending: the client's close frame is not relayed (the gateway answers it
// itself), the client's connection is closed, and the provider's
// connection stays open with its slot. While parked, whatever the
// provider sends is read and dropped (counted), whole frames only being
// followed by their headers; its pings are answered with masked pongs;
// the idle timeout and keepalive rest; the time limit still applies.
// Resume joins a new client where the provider's stream is next between
// two messages (so its first frame starts a message), and the relay goes
// on as before: it may park and resume again. ResumeWith may have the
// gateway send the provider messages of its own first, and await their
// answers (hold_preamble.go). A client that leaves in the middle of one of
// its frames (or between the frames of a fragmented message) cannot be
// held: the provider would wait for the rest of it. The session then ends
// as it would without hold (one with a farewell has that message
// completed first: farewell.go).
//
// These are the relay's hooks for it: the up direction's control (the
// client's close frame) and leave (its connection ending); the down
// direction's lose (a write to the client failed), held (its read
// interrupted while the session has no client) and drop (what it reads
// then). The phases they go through are in relay_state.go.
//
// The relay's hot path pays nothing for hold when it is off; with hold,
// the client's stream is watched for close frames the way keepalive
// watches for pongs (the first byte of each frame), and the provider's
// stream toward the client is not spliced.

// ErrNotParked is Resume's error when the session is not parked (it has
// ended, is closing, or another client has resumed it).
var ErrNotParked = errors.New("the session is not parked")

// resumeReq is a client waiting to join a parked session.
type resumeReq struct {
	client  net.Conn
	pending []byte
	opts    ResumeOptions
}

// refuse gives a client that will not join a close frame and closes it.
func (r *resumeReq) refuse(code int, reason string) {
	if r == nil {
		return
	}
	r.client.SetWriteDeadline(time.Now().Add(CloseWait))
	r.client.Write(closeFrame(code, reason, false))
	r.client.Close()
}

// Parked reports whether the session is parked: its client has left, the
// provider's connection is held, and Resume can join a new client.
func (s *Session) Parked() bool {
	return !s.farewells() && s.sync(change{ev: evLook}).phase == parked
}

// ClientEnded reports whether the session ended, or parked, because of the
// client's side: its close frame, its connection ending or failing (a write
// toward it that fails too), or keepalive finding it answers no ping. It is
// false when the provider ended it, when the gateway closed it (an
// operator, the idle timeout, the time limit, shutdown), and for a session
// that ended while parked. Valid once Done is closed, or while parked.
func (s *Session) ClientEnded() bool {
	v := s.sync(change{ev: evLook})
	switch {
	case v.phase.withoutClient():
		return true
	case v.reason == EndKeepalive:
		return v.kaClientDead
	}
	return v.reason == EndClientClosed || v.reason == EndClientError
}

// ClientCloseCode is the status code of the client's close frame when it
// sent one (1000 when the frame carried none, or one that may not be sent
// on the wire), and 1001 when it sent none (its connection dropped: the
// 1006 a receiver reports then can never be sent). For a parked session it
// is the code of the client that left last.
func (s *Session) ClientCloseCode() int {
	switch c := s.sync(change{ev: evLook}).clientCode; {
	case c == 0:
		return CloseGoingAway
	case !sendableCode(c):
		return CloseNormal
	default:
		return c
	}
}

// sendableCode reports whether a close status code may be sent in a close
// frame.
func sendableCode(c int) bool {
	switch {
	case c >= 1000 && c <= 1003, c >= 1007 && c <= 1014, c >= 3000 && c <= 4999:
		return true
	}
	return false
}

// ParkedDropped counts what the provider sent while the session had no
// client (over all its parks): frames (a frame in flight toward the client
// that left counts as one), and bytes.
func (s *Session) ParkedDropped() (frames, bytes int64) {
	v := s.sync(change{ev: evLook})
	return v.dropFrames, v.dropBytes
}

// Resume joins client to the parked session. pending are bytes the client
// sent behind its handshake: they go to the provider first. The caller has
// answered the client's handshake; from a nil return on, the session owns
// client: it joins where the provider's stream is next between two
// messages (what the provider sent until then is dropped), or, when the
// session ends before that, it gets a close frame and is closed. The error is
// ErrNotParked when the session is not parked: it ended or is closing
// meanwhile, or another client resumed it first.
func (s *Session) Resume(client net.Conn, pending []byte) error {
	return s.resume(&resumeReq{client: client, pending: pending})
}

func (s *Session) resume(req *resumeReq) error {
	if !s.sync(change{ev: evResume, req: req}).moved {
		return ErrNotParked
	}
	return nil
}

// parkOnClose is the up direction's hook for the client's close frame f
// (whole): between two of the client's messages the session parks (the
// view returned has moved), and the frame is not relayed; the client gets
// the answer to it. A session with a farewell has a message the client
// had begun completed first (farewell_fill.go).
func (d *direction) parkOnClose(f []byte) view {
	if d.frames.fragmented && !(d.sendsFarewell() && d.completeMessage(&d.frames)) {
		// The provider would wait for the rest of the message.
		return d.s.sync(change{ev: evLook})
	}
	c := change{ev: evLeft, code: closeNoStatus, echo: controlFrame(opClose, nil, false), reason: EndClientClosed}
	if p := unmasked(f); len(p) >= 2 {
		c.code, c.echo = int(binary.BigEndian.Uint16(p)), controlFrame(opClose, p[:2], false)
	}
	return d.s.sync(c)
}

// leave is the up direction's hook when the client's side ended (err) or
// looks gone (an interrupted read, while leaving): between two of the
// client's messages the session parks; in the middle of one it ends as it
// would without hold. A session with a farewell has the provider's side of
// a message the client cut short completed first (farewell_fill.go), and
// the bytes of a control frame it had begun (held back, never relayed)
// dropped: it parks, to say its farewell.
func (d *direction) leave(err error) bool {
	var v view
	cut := !d.frames.atMessageBoundary() || d.ctl.held() > 0
	if cut && d.sendsFarewell() && d.completeMessage(&d.frames) {
		d.ctl.clear()
		if v = d.s.sync(change{ev: evLeft, reason: leftWord(err)}); v.moved {
			return false
		}
		// The provider's stream no longer lines up with the client's:
		// nothing more of the client's is relayed. A session the gateway
		// is closing meanwhile has its farewell there.
		if v.phase == closing {
			return d.closeOut(nil)
		}
		return d.s.cut(leftWord(err))
	}
	if !cut {
		if v = d.s.sync(change{ev: evLeft, reason: leftWord(err)}); v.moved {
			return false
		}
	} else {
		v = d.s.sync(change{ev: evLook})
	}
	switch {
	case v.phase == leaving && !v.byWrite && isTimeout(err):
		// Keepalive found the client dead: it closes the session, and
		// the next read finds it closing.
		d.s.sync(change{ev: evClose, code: CloseGoingAway, reason: EndKeepalive, clientDead: true})
		return true
	case v.phase == leaving && v.byWrite:
		// A write toward the client failed: it is gone.
		if errors.Is(err, io.EOF) {
			return d.s.cut(EndClientClosed)
		}
		return d.s.cut(EndClientError)
	case isTimeout(err):
		return true // the session moved on: the next read finds where
	}
	return d.ended(err)
}

// lose is the down direction's hook when a write to the client failed:
// with hold, the client is taken as gone: the up direction is asked
// whether the session parks (leaving), and this direction drops what the
// provider sends from here on. It reports whether the direction goes on.
func (d *direction) lose() bool {
	v := d.s.sync(change{ev: evLost, byWrite: true})
	if !v.moved && v.phase != parking {
		return false
	}
	d.startDropping()
	return true
}

// startDropping has the down direction drop what it reads from here on; a
// frame in flight counts as one dropped.
func (d *direction) startDropping() {
	if d.mode == dropping {
		return
	}
	d.mode = dropping
	if !d.frames.atBoundary() || d.ctl.held() > 0 {
		d.s.sync(change{ev: evDropped, frames: 1})
	}
	if d.tr != nil {
		d.tr.reset() // the tap sees nothing until a client joins
	}
}

// held is the down direction's hook when its read of the provider failed
// (err) while the session has no client, as v tells: parking, it lets the
// old client go; joining, the client may join; closing, the provider gets
// the close frame.
func (d *direction) held(err error, v view) bool {
	if !isTimeout(err) {
		return d.heldEnd(err)
	}
	switch v.phase {
	case parking:
		return d.letGo(v.echo)
	case parked:
		if w := d.wait; w != nil && w.farewell && w.check(time.Now()) {
			d.wait = nil
			return w.then(nil) // its answer did not come in time
		}
	case closing:
		if d.s.lastWord != nil && !d.talked {
			return d.beginLastWord(d.closeHeld, nil) // lastword.go
		}
		return d.closeHeld(nil)
	case joining:
		ready, err := d.joinReady(v.req)
		switch {
		case err != nil:
			return d.heldEnd(err)
		case ready && d.frames.atMessageBoundary() && d.ctl.held() == 0 && d.join():
			return true
		}
		// Reads block again, or until the wait for the answers ends.
		d.s.sync(change{ev: evWake, d: d})
	}
	return true
}

// letGo lets the old client go once the up direction is gone: the answer
// to its close frame when it sent one (and the stream toward it is between
// two frames), then its connection closes; the session is parked, and
// OnPark follows.
func (d *direction) letGo(echo []byte) bool {
	if echo != nil && d.mode != dropping && d.frames.atBoundary() {
		d.dst.Write(echo) // parking gave it a write deadline
	}
	d.startDropping()
	d.letGoOld()
	if !d.s.sync(change{ev: evLetGo}).moved {
		return true
	}
	if d.s.farewells() {
		return d.sayFarewell() // farewell.go
	}
	if d.s.onPark != nil {
		d.s.onPark(d.s)
	}
	return true
}

// letGoOld closes the client that left, once: the session no longer writes
// to it, and the down direction alone writes to the provider.
func (d *direction) letGoOld() {
	if !d.alone {
		d.dst.Close()
		d.alone = true
	}
}

// drop takes what the provider sends while the session has no client (or
// is losing it): its frames are followed and dropped, and counted; pings
// are answered (masked pongs, as a client answers) once the old client is
// let go, and so is its close frame; a waiting client joins at a message
// boundary, and what follows is relayed to it.
func (d *direction) drop(p []byte) bool {
	var frames int64
	n0 := len(p)
	counted := false
	count := func() {
		if !counted {
			counted = true
			d.s.sync(change{ev: evDropped, frames: frames, bytes: int64(n0 - len(p))})
		}
	}
	defer count()
	for {
		if d.ctl.held() == 0 && d.frames.atBoundary() {
			if d.wait == nil && len(p) > 0 && !d.frames.fragmented {
				// A client may have asked to join since this read
				// began: it takes the stream from this message
				// boundary on, not from the next read.
				if v := d.s.sync(change{ev: evLook}); v.phase == joining && v.req != nil {
					if _, err := d.joinReady(v.req); err != nil {
						count()
						return d.heldEnd(err)
					}
				}
			}
			if d.wait != nil && !d.frames.fragmented {
				ready, err := d.joinReady(nil)
				if err != nil {
					count()
					return d.heldEnd(err)
				}
				if ready {
					count()
					if w := d.wait; w.farewell {
						d.wait = nil
						return w.then(p)
					}
					if d.join() {
						return d.take(p)
					}
					return d.closeHeld(p) // the session closes meanwhile
				}
			}
			if len(p) == 0 {
				return true
			}
			frames++
			if b := p[0]; b != pingFirstByte && b != closeFirstByte {
				d.frames.advance(p[:1], false)
				p = p[1:]
				continue
			}
		}
		if len(p) == 0 {
			return true
		}
		if d.ctl.held() == 0 && !d.frames.atBoundary() {
			if w := d.wait; w != nil && !w.ready {
				p = d.collect(p)
			} else {
				p = p[d.frames.advance(p, true):]
			}
			continue
		}
		// p starts with (the rest of) a control frame: collect it.
		var done bool
		if p, done = d.ctl.collect(p); !done {
			return true // the frame goes on in the next read
		}
		f := d.ctl.bytes()
		switch {
		case !d.ctl.whole():
			// Too long for a control frame: the tracker skips it.
			d.frames.advance(f, false)
		case f[0] == closeFirstByte:
			count()
			return d.providerClosed()
		case f[0] == pingFirstByte && d.alone:
			if _, err := d.src.Write(controlFrame(opPong, unmasked(f), true)); err != nil {
				d.ctl.clear()
				count()
				return d.heldEnd(err)
			}
		}
		d.ctl.clear()
	}
}

// join makes the waiting client the session's client, at a message
// boundary of the provider's stream: this direction relays to it from
// here, and a new up direction from it (step starts it). It reports false
// when the session is closing.
func (d *direction) join() bool {
	v := d.s.sync(change{ev: evJoin, d: d})
	if !v.moved {
		return false
	}
	d.dst, d.mode, d.alone = v.client, relaying, false
	w := d.wait
	d.wait = nil
	if w.onJoin != nil {
		w.onJoin(w.report())
	}
	if d.tr != nil {
		d.tr.tap.Joined()
	}
	return true
}

// heldEnd ends a session without a client whose provider's side ended or
// failed (err), or could not be written to: a client waiting to join gets
// a close frame.
func (d *direction) heldEnd(err error) bool {
	word := EndProviderError
	switch {
	case errors.Is(err, io.EOF):
		word = EndProviderClosed
	case errors.Is(err, net.ErrClosed):
		word = "" // the session's own cut: its reason stays
	}
	d.s.sync(change{ev: evEnd, reason: word, code: CloseGoingAway})
	d.letGoOld()
	return false
}

// providerClosed: the provider sent a close frame (whole in d.ctl) while
// the session had no client. The gateway answers it as the client would,
// and the session ends once the provider hangs up (or CloseWait has
// passed).
func (d *direction) providerClosed() bool {
	payload := unmasked(d.ctl.bytes())
	d.ctl.clear()
	code := CloseGoingAway
	var echo []byte
	if len(payload) >= 2 {
		echo = payload[:2]
		if c := int(binary.BigEndian.Uint16(echo)); sendableCode(c) {
			code = c
		}
	}
	if !d.s.sync(change{ev: evEnd, code: code, reason: EndProviderClosed}).held {
		// The up direction is still there (and may be writing to the
		// provider): it finds the session ending.
		return false
	}
	return d.closeProvider(controlFrame(opClose, echo, true), nil)
}

// closeHeld: Close on a session without a client (a client waiting to join
// got its close frame as closing began): the provider gets it. rest are
// bytes read from the provider not taken yet.
func (d *direction) closeHeld(rest []byte) bool {
	return d.closeProvider(closeFrame(d.s.closeCode, d.s.closeReason, true), rest)
}

// closeProvider writes close, a close frame (masked: the gateway speaks as
// the client), to the provider of a session without a client, and reads
// the provider until its close frame or its end, at most CloseWait.
func (d *direction) closeProvider(close, rest []byte) bool {
	d.letGoOld()
	d.src.SetWriteDeadline(time.Now().Add(CloseWait))
	if _, err := d.src.Write(close); err != nil {
		return false
	}
	d.src.SetReadDeadline(time.Now().Add(CloseWait))
	d.frames.sawClose = false
	return d.await(rest)
}
