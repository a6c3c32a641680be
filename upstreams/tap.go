package upstreams

// A tap: a participant of the gateway's own in a session, speaking on the
// client's connection to the provider (package cdp: the gateway recording
// a CDP session). It is one generic mechanism of the relay, with two
// hooks:
//
//   - toward the client, the tap sees each whole data message the
//     provider sends and says whether the client gets it: the message
//     goes on unchanged, in order with the others, or is taken out of the
//     stream (an answer or an event of the tap's own). The relay puts a
//     message together only until the tap is sure of its verdict: most
//     answers to the client are told by their first bytes (Tap.Early),
//     and relayed as they come from there on;
//   - toward the provider, the tap sends messages of its own (Send): each
//     goes in between two of the client's messages, at the client
//     stream's next message boundary, written by the up direction itself
//     (as keepalive writes its pings), so no byte of the client's is ever
//     split. A client that sends nothing is interrupted for it, as for a
//     ping.
//
// Nothing of this runs for a session without a tap: its relay's hot path
// is the same. A tapped session's provider stream is not spliced, and a
// session that negotiated an extension (compression) is never tapped:
// its messages cannot be read.

// Tap is a session's participant (SessionOptions.Tap). Its methods are
// called on the relay's goroutine toward the client, one at a time, and
// must not block; they may call the session's Send.
type Tap interface {
	// Early is handed the start of a data message from the provider (its
	// first TapPeek payload bytes), before the rest is read: when sure,
	// keep is the verdict, and the message is relayed (or dropped) as it
	// comes without being put together. A message shorter than that goes
	// to Message alone.
	Early(text bool, head []byte) (keep, sure bool)
	// Message is handed each whole data message from the provider that
	// Early was not sure of (payload unmasked; it is the relay's buffer,
	// valid during the call only), and says whether the client gets it.
	Message(text bool, payload []byte) (keep bool)
	// Joined tells the tap that a client joined the session after it had
	// none (hold): what the provider sent meanwhile was dropped unseen.
	Joined()
}

// Tap bounds.
const (
	// TapPeek is how many payload bytes of a message Tap.Early sees.
	TapPeek = 64
	// MaxTapMessage bounds a message the relay puts together for its tap:
	// one still undecided past it goes on to the client as it comes (a
	// tap's own messages are far shorter).
	MaxTapMessage = 64 << 20
	// maxOutbox bounds the gateway's messages waiting for the client's
	// stream to reach a message boundary; Send refuses more.
	maxOutbox = 4 << 20
	// tapWriteChunk: what a tapped direction has gathered for the client
	// is written once it is this long, else at the end of each read.
	tapWriteChunk = 256 << 10
	// tapKeepBuf: a message buffer that grew past this is let go after
	// use rather than kept for the next message.
	tapKeepBuf = 1 << 20
)

const opText = 0x1

// Send queues msg, the payload of a text message of the tap's, for the
// provider: it goes in at the next message boundary of the client's
// stream. It reports false, sending nothing, when the session has no
// live client (parked, leaving, ending) or too much waits already.
func (s *Session) Send(msg []byte) bool {
	return s.sync(change{ev: evSend, msg: appendDataFrame(nil, opText, msg)}).sent
}

// queueOut is evSend's work (under s.mu): the frame is queued, and the up
// direction is interrupted unless it is already.
func (s *Session) queueOut(f []byte) bool {
	if s.phase != live || s.up == nil || len(s.outbox)+len(f) > maxOutbox {
		return false
	}
	s.outbox = append(s.outbox, f...)
	s.outPending.Store(true)
	if u := s.up; !u.sendDue && u.quietAt.IsZero() {
		u.sendDue = true
		u.src.SetReadDeadline(aLongTimeAgo)
	}
	return true
}

// takeOut hands d, at a message boundary of the client's stream, what
// waits for the provider (under s.mu): nothing unless the session is
// live. What is not sent then is dropped.
func (s *Session) takeOut(d *direction) []byte {
	d.sendDue = false
	if !s.outPending.Load() {
		return nil
	}
	out := s.outbox
	s.outbox = nil
	s.outPending.Store(false)
	if s.phase != live {
		return nil
	}
	return out
}

// relayTapped is the relay of a tapped session's direction.
func (d *direction) relayTapped(p []byte) bool {
	if d.side == toClient {
		return d.relayMessages(p)
	}
	return d.relayBetween(p)
}

// relayBetween relays the client's bytes p, the gateway's messages going
// in at each message boundary once some wait.
func (d *direction) relayBetween(p []byte) bool {
	for {
		if d.s.outPending.Load() && d.frames.atMessageBoundary() && d.ctl.held() == 0 {
			if !d.sendOut() {
				return false
			}
		}
		if len(p) == 0 {
			return true
		}
		n := len(p)
		if d.s.outPending.Load() && d.ctl.held() == 0 {
			n = d.frames.messageEnd(p)
		}
		if !d.relayPart(p[:n]) {
			return false
		}
		p = p[n:]
		if d.mode != relaying {
			return d.take(p) // the session closes
		}
	}
}

// relayPart relays p toward the provider as an untapped direction would.
func (d *direction) relayPart(p []byte) bool {
	if d.controls {
		return d.relayControl(p)
	}
	d.frames.advance(p, false)
	return d.write(p)
}

// sendOut writes the gateway's waiting messages to the provider, the
// client's stream being at a message boundary.
func (d *direction) sendOut() bool {
	out := d.s.sync(change{ev: evOut, d: d}).out
	return out == nil || d.writeOut(out)
}

// writeOut writes the gateway's own frames to the provider (not counted
// as the client's bytes).
func (d *direction) writeOut(b []byte) bool {
	if _, err := d.dst.Write(b); err != nil {
		return d.writeFailed()
	}
	return true
}

// messageEnd is how many bytes of p take the stream to the end of the
// message in flight (or to the next message's end, at a boundary); all of
// p when it does not end there. t is a copy: the tracker is not moved.
func (t frameTracker) messageEnd(p []byte) int {
	i := 0
	for i < len(p) {
		if t.atBoundary() {
			i += t.advance(p[i:i+1], false) // the next frame's first byte
			continue
		}
		i += t.advance(p[i:], true)
		if t.atMessageBoundary() {
			return i
		}
	}
	return i
}

// The states of the message a tapped direction reads.
const (
	msgNone uint8 = iota // between messages (or inside a control frame)
	msgHold              // undecided: put together
	msgKeep              // relayed as it comes
	msgDrop              // dropped as it comes
)

// tapReader puts together the provider's messages for the tap, on the
// down direction of a tapped session (the direction's goroutine's own).
type tapReader struct {
	tap   Tap
	state uint8
	text  bool
	// peeked: Early was asked (or the message was too short for it).
	peeked bool
	// raw holds the message's frames as read while it is held (control
	// frames between them too, so that a kept message goes on exactly as
	// it came); payAt is where the payload starts in raw while it is one
	// piece; once it is not (split), pay holds the payload, and ctl the
	// control frames in between, which go on whatever the verdict.
	raw   []byte
	payAt int
	split bool
	pay   []byte
	ctl   []byte
	// hdr collects the header of the data frame being read.
	hdr []byte
	// out gathers what goes to the client from one read.
	out []byte
}

func newTapReader(tap Tap) *tapReader { return &tapReader{tap: tap, hdr: make([]byte, 0, 14)} }

// reset forgets the message in flight (the session lost its client: what
// the provider sends is dropped until another joins at a message
// boundary).
func (tr *tapReader) reset() {
	tr.state, tr.split, tr.peeked = msgNone, false, false
	tr.raw, tr.pay, tr.ctl, tr.hdr = tr.raw[:0], tr.pay[:0], tr.ctl[:0], tr.hdr[:0]
	tr.out = tr.out[:0]
}

// midFrame reports whether what was written to the client stops inside a
// frame: a frame relayed as it comes is in flight. (A held or dropped
// message's frames are not written until the verdict.)
func (tr *tapReader) midFrame(t *frameTracker) bool {
	return t.remaining > 0 && (tr.state == msgKeep || tr.state == msgNone)
}

// atWriteBoundary reports whether the stream written to dst is between two
// frames: where the gateway may write a frame of its own.
func (d *direction) atWriteBoundary() bool {
	if d.tr == nil {
		return d.frames.atBoundary()
	}
	return !d.tr.midFrame(&d.frames)
}

// relayMessages relays the provider's bytes p toward the client, message
// by message as the tap says.
func (d *direction) relayMessages(p []byte) bool {
	tr, t := d.tr, &d.frames
	tr.out = tr.out[:0]
	for len(p) > 0 {
		switch {
		case d.ctl.held() > 0 || t.atBoundary() && len(tr.hdr) == 0 && p[0]&0x0f >= opClose:
			// A control frame (between frames, a message's too): relayed
			// at once, unless the gateway takes it (keepalive's pongs).
			var done bool
			if p, done = d.ctl.collect(p); !done {
				return d.flushTapped()
			}
			f := d.ctl.bytes()
			if d.ctl.whole() && d.controls {
				if taken, ok := d.control(f); taken || !ok {
					d.ctl.clear()
					if !ok {
						return false
					}
					continue
				}
			}
			t.advance(f, false)
			if tr.state == msgHold {
				// Inside a held message: it keeps its place.
				tr.splitPayload()
				tr.raw = append(tr.raw, f...)
				tr.ctl = append(tr.ctl, f...)
			} else if !tr.emit(d, f) {
				return false
			}
			d.ctl.clear()
		case t.atBoundary() || t.hdrN > 0:
			// A data frame's header, a byte at a time.
			for len(p) > 0 {
				tr.hdr = append(tr.hdr, p[0])
				t.advance(p[:1], false)
				p = p[1:]
				if t.hdrN == 0 {
					break
				}
			}
			if t.hdrN > 0 {
				return d.flushTapped() // the header goes on in the next read
			}
			if !tr.frameStart(d, t) {
				return false
			}
			if t.remaining == 0 && !tr.frameEnd(d, t) {
				return false
			}
		default:
			n := int(min(int64(len(p)), t.remaining))
			t.advance(p[:n], false)
			if !tr.payload(d, p[:n]) {
				return false
			}
			p = p[n:]
			if t.remaining == 0 && !tr.frameEnd(d, t) {
				return false
			}
		}
	}
	return d.flushTapped()
}

// flushTapped writes what one read gathered for the client.
func (d *direction) flushTapped() bool {
	tr := d.tr
	if len(tr.out) == 0 {
		return true
	}
	ok := d.write(tr.out)
	tr.out = tr.out[:0]
	return ok
}

// emit adds b to what goes to the client, writing it once it is long.
func (tr *tapReader) emit(d *direction, b []byte) bool {
	if len(tr.out) == 0 && len(b) >= tapWriteChunk {
		return d.write(b)
	}
	tr.out = append(tr.out, b...)
	if len(tr.out) >= tapWriteChunk {
		return d.flushTapped()
	}
	return true
}

// frameStart: a data frame's header is whole in tr.hdr (and t).
func (tr *tapReader) frameStart(d *direction, t *frameTracker) bool {
	hdr := tr.hdr
	tr.hdr = tr.hdr[:0]
	switch {
	case t.opcode == 0x1 || t.opcode == 0x2:
		if tr.state == msgHold || tr.state == msgKeep || tr.state == msgDrop {
			// A new message where one was not over: the provider broke
			// the protocol. What was held goes on as it was.
			if !tr.release(d) {
				return false
			}
		}
		tr.state, tr.text, tr.peeked, tr.split = msgHold, t.opcode == 0x1, false, false
		tr.raw = append(tr.raw[:0], hdr...)
		tr.payAt, tr.pay, tr.ctl = len(tr.raw), tr.pay[:0], tr.ctl[:0]
		return true
	case tr.state == msgHold:
		// The next frame of a held message.
		tr.splitPayload()
		tr.raw = append(tr.raw, hdr...)
		return tr.checkSize(d)
	case tr.state == msgDrop:
		return true
	}
	// Kept, or a continuation of nothing: as it comes.
	return tr.emit(d, hdr)
}

// payload takes b, payload of the data frame in flight.
func (tr *tapReader) payload(d *direction, b []byte) bool {
	switch tr.state {
	case msgHold:
		tr.raw = append(tr.raw, b...)
		if tr.split {
			tr.pay = append(tr.pay, b...)
		}
		if !tr.peeked {
			if head := tr.payloadSoFar(); len(head) >= TapPeek {
				tr.peeked = true
				if keep, sure := tr.tap.Early(tr.text, head[:TapPeek]); sure {
					return tr.decide(d, keep)
				}
			}
		}
		return tr.checkSize(d)
	case msgDrop:
		return true
	}
	return tr.emit(d, b)
}

// payloadSoFar is the held message's payload read so far.
func (tr *tapReader) payloadSoFar() []byte {
	if tr.split {
		return tr.pay
	}
	return tr.raw[tr.payAt:]
}

// splitPayload: something other than payload follows in raw (a header, a
// control frame); the payload is gathered apart from here on.
func (tr *tapReader) splitPayload() {
	if !tr.split {
		tr.split = true
		tr.pay = append(tr.pay[:0], tr.raw[tr.payAt:]...)
	}
}

// checkSize lets a held message that outgrew MaxTapMessage go on as it
// comes.
func (tr *tapReader) checkSize(d *direction) bool {
	if len(tr.raw) <= MaxTapMessage {
		return true
	}
	return tr.decide(d, true)
}

// decide ends the hold of the message in flight: kept, what was held goes
// to the client and the rest follows as it comes; dropped, nothing does.
func (tr *tapReader) decide(d *direction, keep bool) bool {
	tr.state = msgDrop
	if !keep {
		// The control frames it held go on all the same.
		ctl := tr.ctl
		tr.forget()
		return len(ctl) == 0 || tr.emit(d, ctl)
	}
	tr.state = msgKeep
	raw := tr.raw
	tr.forget()
	return tr.emit(d, raw)
}

// release relays what is held as it was (the message's verdict is keep).
func (tr *tapReader) release(d *direction) bool {
	if tr.state != msgHold {
		return true
	}
	return tr.decide(d, true)
}

// forget lets go of the held bytes (their buffers are kept for the next
// message unless they grew large). After emit of raw, raw is not touched
// until the next message starts.
func (tr *tapReader) forget() {
	if cap(tr.raw) > tapKeepBuf {
		tr.raw = nil
	} else {
		tr.raw = tr.raw[:0]
	}
	if cap(tr.pay) > tapKeepBuf {
		tr.pay = nil
	} else {
		tr.pay = tr.pay[:0]
	}
	tr.ctl = tr.ctl[:0]
}

// frameEnd: the data frame in flight ended; the message with it when it
// was its last, and a held one is judged by the tap.
func (tr *tapReader) frameEnd(d *direction, t *frameTracker) bool {
	if t.fragmented {
		return true
	}
	state := tr.state
	tr.state = msgNone
	if state != msgHold {
		return true
	}
	keep := tr.tap.Message(tr.text, tr.payloadSoFar())
	tr.state = msgHold
	return tr.decide(d, keep) && tr.over()
}

// over: the message is over.
func (tr *tapReader) over() bool {
	tr.state = msgNone
	return true
}
