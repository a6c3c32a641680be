package upstreams

import (
	"encoding/binary"
	"math/rand/v2"
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
// The relay pays nothing per byte for it: the session's tick samples the
// byte counters the relay keeps anyway; a direction is interrupted only
// when a ping is due, and writes the ping itself between two frames
// (ping). Pongs are found by the frame tracker, which reads frame
// headers only: the first byte of each frame tells a pong, and only a
// pong's few bytes are looked at (pong).

// EndKeepalive is the close reason of a session whose side answered no
// ping.
const EndKeepalive = "keepalive timeout"

// pingTokenLen is the length of the session's ping payload.
const pingTokenLen = 8

// kaLostTicks is how many ticks the up direction has, once keepalive found
// the client dead, to park the session (hold) before keepalive closes it as
// it would without hold.
const kaLostTicks = 4

// keepalive is a session's keepalive state (under s.mu but for token).
type keepalive struct {
	interval time.Duration
	token    [pingTokenLen]byte // the payload of the gateway's pings
	pingers  [2]pinger          // by side
	// pings sent to each side, and pongs to them from it.
	pings, pongs [2]int64
}

func newKeepalive(interval time.Duration) *keepalive {
	k := &keepalive{interval: interval}
	binary.LittleEndian.PutUint64(k.token[:], rand.Uint64())
	k.restart()
	return k
}

// restart has the pingers start afresh (a new client joined).
func (k *keepalive) restart() { k.pingers = [2]pinger{{interval: k.interval}, {interval: k.interval}} }

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

// keepaliveTick is keepalive's part of the session's tick (under s.mu): it
// asks for pings to quiet sides, and ends the session when a side is dead.
// It rests while the session has no client, or is ending.
func (s *Session) keepaliveTick(now time.Time) {
	k := s.ka
	switch s.phase {
	case live:
	case leaving:
		// Keepalive found the client dead and the up direction decides
		// whether it parks: after a few ticks, as without hold.
		if !s.leaveByWrite {
			if s.leaveTicks++; s.leaveTicks >= kaLostTicks {
				s.step(change{ev: evClose, code: CloseGoingAway, reason: EndKeepalive, clientDead: true})
			}
		}
		return
	default:
		return
	}
	for side, d := range [2]*direction{s.up, s.down} {
		from := s.bytes[1-side].Load() + k.pongs[side]
		switch k.pingers[side].step(now, s.bytes[side].Load(), from, k.pings[side]) {
		case kaPing:
			if d.quietAt.IsZero() && !d.awaitsReply {
				d.pingDue = true
				d.src.SetReadDeadline(aLongTimeAgo)
			}
		case kaDead:
			// A dead client may park the session instead (hold.go).
			if side == toClient && s.step(change{ev: evLost}) {
				return
			}
			s.step(change{ev: evClose, code: CloseGoingAway, reason: EndKeepalive, clientDead: side == toClient})
			return
		}
	}
}

// KeepalivePings counts the pings the gateway sent, both sides together.
func (s *Session) KeepalivePings() int64 { return s.sync(change{ev: evLook}).pings }

// ping is keepalive's hook when a read of src was interrupted for a ping
// and the stream to dst is at a frame boundary (evWake counted it: a write
// that blocks, to a peer that takes nothing, counts as an unanswered
// ping): the direction writes it. It reports false when dst cannot be
// written.
func (d *direction) ping() bool {
	if _, err := d.dst.Write(controlFrame(opPing, d.s.ka.token[:], d.side == toProvider)); err != nil {
		return d.writeFailed()
	}
	return true
}

// pong is keepalive's hook for a whole pong frame f from src: one that
// answers the gateway's ping is counted as the answer of src's side and
// taken out of the stream.
func (d *direction) pong(f []byte) bool {
	if d.s.ka == nil || !pongAnswers(f, d.s.ka.token[:]) {
		return false
	}
	d.s.sync(change{ev: evPong, d: d})
	return true
}

// pongAnswers reports whether the whole pong frame f carries token.
func pongAnswers(f, token []byte) bool {
	if int(f[1]&0x7f) != len(token) {
		return false
	}
	return string(unmasked(f)) == string(token)
}

// ctlFrame collects a control frame read from src, which may arrive over
// several reads, until it is whole and the gateway can tell whether it is
// one to act on.
type ctlFrame struct {
	buf [maxCtlFrame]byte
	n   int
}

// held is how many bytes of a frame are collected (0 on a nil one).
func (h *ctlFrame) held() int {
	if h == nil {
		return 0
	}
	return h.n
}

// clear drops the collected frame (a no-op on a nil one).
func (h *ctlFrame) clear() {
	if h != nil {
		h.n = 0
	}
}

// maxCtlFrame is the longest control frame: header, mask key, and a
// payload of at most 125 bytes.
const maxCtlFrame = 2 + 4 + 125

// frameLen is the held frame's full length once its first two bytes are
// in; 0 before that, -1 when it cannot be a control frame (a payload over
// 125).
func (h *ctlFrame) frameLen() int {
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

// collect moves bytes of p into the held frame until it is whole, or known
// not to be a control frame (done); it returns the rest of p.
func (h *ctlFrame) collect(p []byte) (rest []byte, done bool) {
	for len(p) > 0 && (h.n < 2 || h.n < h.frameLen()) {
		h.buf[h.n] = p[0]
		h.n++
		p = p[1:]
		if h.frameLen() < 0 {
			return p, true
		}
	}
	return p, h.n >= 2 && h.n == h.frameLen()
}

// whole reports whether the held bytes are a whole control frame (and not
// the start of a longer frame).
func (h *ctlFrame) whole() bool { return h.frameLen() > 0 }

// bytes are the held bytes.
func (h *ctlFrame) bytes() []byte { return h.buf[:h.n] }

// unmasked is the payload of the whole control frame f, unmasked (a copy).
func unmasked(f []byte) []byte {
	if f[1]&0x80 == 0 {
		return append([]byte(nil), f[2:]...)
	}
	out := append([]byte(nil), f[6:]...)
	for i := range out {
		out[i] ^= f[2+(i&3)]
	}
	return out
}
