package upstreams

import (
	"encoding/binary"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// Keepalive: when no frame has gone to one side of a session for the
// interval, the gateway sends that side a ping of its own, at a frame
// boundary of the stream going there (masked toward the provider, as a
// client's frames must be). The pongs that answer it carry the session's
// ping payload and are not relayed. A side that answers none of two
// consecutive pings, each given the interval, is dead: the session ends
// with close 1001 "keepalive timeout".
//
// The relay pays nothing per byte for it: a timer samples the byte
// counters the relay keeps anyway, as the idle timeout does; a direction
// is interrupted (a read deadline in the past) only when a ping is due,
// and writes the ping itself between two frames. Pongs are found by the
// frame tracker, which reads frame headers only: the first byte of each
// frame tells a pong, and only a pong's few bytes are looked at.

// EndKeepalive is the close reason of a session whose side answered no
// ping.
const EndKeepalive = "keepalive timeout"

// Frame bytes of pings and pongs.
const (
	opPing        = 0x9
	opPong        = 0xA
	pongFirstByte = 0x80 | opPong // FIN, no RSV bits: control frames are never fragmented
	// maxPongFrame is the longest pong frame: header, mask key, and a
	// control frame's payload of at most 125 bytes.
	maxPongFrame = 2 + 4 + 125
	// pingTokenLen is the length of the session's ping payload.
	pingTokenLen = 8
)

// keepaliveAction is what the keepalive timer does for one side.
type keepaliveAction int

const (
	kaNothing keepaliveAction = iota
	kaPing                    // send the side a ping
	kaDead                    // the side answered no ping: end the session
)

// pinger decides, for one side of a session, from counters sampled at each
// tick, when to ping it and when it is dead. It is pure: the caller gives
// the time and the counters.
type pinger struct {
	interval time.Duration
	started  bool
	// The counters at the previous tick: bytes relayed to the side (its
	// frames), bytes and pongs from it (its answers), pings sent to it.
	lastTo, lastFrom, lastSent int64
	// quietSince is when the last frame (a ping too) went to the side.
	quietSince time.Time
	// While pings go unanswered: the first one's time, the latest's, and
	// how many were sent.
	waiting             bool
	firstPing, lastPing time.Time
	unanswered          int
}

// step takes the counters at now and says what to do. to counts the bytes
// relayed to the side, from what came from it (relayed bytes and pongs to
// the gateway's pings), sent the pings sent to it. Anything from the side
// answers the pings sent before. A side is dead when the second ping in a
// row has gone a whole interval without answer, or when the second could
// not even be sent for an interval after it was due.
func (k *pinger) step(now time.Time, to, from, sent int64) keepaliveAction {
	if !k.started {
		k.started = true
		k.quietSince = now
		k.lastTo, k.lastFrom, k.lastSent = to, from, sent
		return kaNothing
	}
	if sent != k.lastSent {
		k.unanswered += int(sent - k.lastSent)
		k.lastSent = sent
		k.lastPing, k.quietSince = now, now
		if !k.waiting {
			k.waiting, k.firstPing = true, now
		}
	}
	if from != k.lastFrom {
		k.lastFrom = from
		k.waiting, k.unanswered = false, 0
	}
	if to != k.lastTo {
		k.lastTo = to
		k.quietSince = now
	}
	if k.waiting {
		switch {
		case k.unanswered >= 2 && now.Sub(k.lastPing) >= k.interval:
			return kaDead
		case k.unanswered < 2 && now.Sub(k.firstPing) >= 2*k.interval:
			return kaDead
		case now.Sub(k.lastPing) >= k.interval:
			return kaPing
		}
		return kaNothing
	}
	if now.Sub(k.quietSince) >= k.interval {
		return kaPing
	}
	return kaNothing
}

// keepaliveTimer samples the session's counters every interval/4 and pings
// a quiet side, or ends the session when a side is dead.
func (s *Session) keepaliveTimer(interval time.Duration) *time.Timer {
	tick := interval / 4
	if tick < time.Millisecond {
		tick = time.Millisecond
	}
	toProvider, toClient := &pinger{interval: interval}, &pinger{interval: interval}
	var epoch int64 // the client the pingers know (hold.go)
	var tp atomic.Pointer[time.Timer]
	t := time.AfterFunc(24*time.Hour, func() {
		select {
		case <-s.done:
			return
		default:
		}
		if s.closing.Load() {
			return
		}
		if s.hold.on && s.keepaliveRests(&epoch, toProvider, toClient) {
			tp.Load().Reset(tick)
			return
		}
		now := time.Now()
		for _, side := range []struct {
			d *direction
			k *pinger
		}{{&s.up, toProvider}, {&s.down, toClient}} {
			d := side.d
			from := d.other().bytes.Load() + d.kaPongs.Load()
			switch side.k.step(now, d.bytes.Load(), from, d.kaPings.Load()) {
			case kaPing:
				d.wantPing()
			case kaDead:
				if d == &s.down && s.clientDead() {
					// The session parks instead (hold.go).
					tp.Load().Reset(tick)
					return
				}
				s.Close(CloseGoingAway, EndKeepalive)
				return
			}
		}
		tp.Load().Reset(tick)
	})
	tp.Store(t)
	t.Reset(tick)
	return t
}

// KeepalivePings counts the pings the gateway sent, both sides together.
func (s *Session) KeepalivePings() int64 {
	return s.up.kaPings.Load() + s.down.kaPings.Load()
}

// wantPing asks the direction to ping dst at its next frame boundary: it
// interrupts the direction's read of src, unless the session is closing or
// the direction has ended (their deadlines are not to be touched).
func (d *direction) wantPing() {
	s := d.s
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closing.Load() || d.quiet || s.halfClosed || d.holdKeepsDeadline() {
		return
	}
	d.kaDue.Store(true)
	d.src.SetReadDeadline(aLongTimeAgo)
}

// keepaliveStep runs on the direction's goroutine when a read was
// interrupted for a ping: it lets reads block again and, at a frame
// boundary of the stream to dst, writes the ping. It reports false when
// dst cannot be written.
func (d *direction) keepaliveStep() bool {
	s := d.s
	s.closeMu.Lock()
	due := d.kaDue.Swap(false)
	closing := s.closing.Load()
	// A read interrupted for parking stays interrupted (hold.go).
	held := d.holdKeepsDeadline()
	if !closing && !s.halfClosed && !held {
		d.src.SetReadDeadline(time.Time{})
	}
	s.closeMu.Unlock()
	if !due || closing || held || !d.frames.atBoundary() {
		// Mid-frame: the timer asks again at its next tick.
		return true
	}
	// Counted before the write: a write that blocks (a peer that takes
	// nothing) counts as an unanswered ping.
	d.kaPings.Add(1)
	if _, err := d.dst.Write(pingFrame(s.pingToken[:], d.toUpstream)); err != nil {
		if s.hold.on && d.lostClientWrite() {
			return true
		}
		s.setReason(d.writeFailWord())
		return false
	}
	return true
}

// keepaliveInterrupt reports whether a read error is the interruption
// wantPing caused.
func (d *direction) keepaliveInterrupt(err error) bool {
	return d.s.keepalive && !d.s.closing.Load() && d.kaDue.Load() && isTimeout(err)
}

// pingFrame builds a ping carrying payload; masked for the provider side.
func pingFrame(payload []byte, masked bool) []byte { return controlFrame(opPing, payload, masked) }

// newPingToken is a session's ping payload: random, so a pong that
// carries it answers this gateway's ping and no one else's.
func newPingToken() (t [pingTokenLen]byte) {
	binary.LittleEndian.PutUint64(t[:], rand.Uint64())
	return t
}

// pongHold collects a pong frame read from src, which may arrive over
// several reads, until it can be told whether it answers the gateway.
type pongHold struct {
	buf [maxPongFrame]byte
	n   int
}

// frameLen is the held frame's full length once its first two bytes are
// in; 0 before that, -1 when it cannot be a pong (a payload over 125).
func (h *pongHold) frameLen() int {
	if h.n < 2 {
		return 0
	}
	b1 := h.buf[1]
	l := int(b1 & 0x7f)
	if l > 125 {
		return -1
	}
	if b1&0x80 != 0 {
		return 2 + 4 + l
	}
	return 2 + l
}

// collect moves bytes of p into the held frame until it is whole, or
// known not to be a control frame; it returns the rest of p and the held
// frame's length (see frameLen).
func (h *pongHold) collect(p []byte) ([]byte, int) {
	for len(p) > 0 && (h.n < 2 || h.n < h.frameLen()) {
		h.buf[h.n] = p[0]
		h.n++
		p = p[1:]
		if h.frameLen() < 0 {
			break
		}
	}
	return p, h.frameLen()
}

// answers reports whether the held (whole) frame is a pong carrying token.
func (h *pongHold) answers(token []byte) bool {
	f := h.buf[:h.n]
	l := int(f[1] & 0x7f)
	if l != len(token) {
		return false
	}
	if f[1]&0x80 == 0 {
		return string(f[2:]) == string(token)
	}
	key, payload := f[2:6], f[6:]
	for i := range payload {
		if payload[i]^key[i&3] != token[i] {
			return false
		}
	}
	return true
}

// forwardWatching is forward for a session with keepalive: the same, but
// pongs that answer the gateway's pings are taken out of the stream (and
// counted as the answers of src's side) instead of relayed. With hold, the
// client's stream is watched for its close frame the same way.
func (d *direction) forwardWatching(p []byte) bool {
	for len(p) > 0 {
		if d.pong.n == 0 {
			n := d.frames.advanceToEither(p, d.h.watchA, d.h.watchB)
			if n > 0 {
				if !d.write(p[:n]) {
					return false
				}
				p = p[n:]
				continue
			}
		}
		// p starts with (the rest of) a pong frame.
		h := &d.pong
		var total int
		if p, total = h.collect(p); total == 0 || (total > 0 && h.n < total) {
			return true // the frame goes on in the next read
		}
		held := h.buf[:h.n]
		if total > 0 && held[0] == pongFirstByte && d.s.keepalive && h.answers(d.s.pingToken[:]) {
			h.n = 0
			d.other().kaPongs.Add(1)
			continue
		}
		if total > 0 && held[0] == closeFirstByte && d.h.parkClose && d.parkOnClose(held) {
			// The session parks: the client's close frame is not relayed
			// (nor anything behind it).
			h.n = 0
			return false
		}
		// Not the gateway's pong (or not a pong at all): relay it as it
		// is, and let the tracker take it from there.
		d.frames.advance(held, false)
		ok := d.write(held)
		h.n = 0
		if !ok {
			return false
		}
	}
	return true
}
