package upstreams

import (
	"encoding/binary"
	"math/rand/v2"
)

// WebSocket close codes the gateway sends itself.
const (
	CloseNormal    = 1000
	CloseGoingAway = 1001
)

// Opcodes of the control frames the gateway reads or writes, and the
// first byte of such a frame (FIN set, no RSV bits: control frames are
// never fragmented).
const (
	opClose        = 0x8
	opPing         = 0x9
	opPong         = 0xA
	closeFirstByte = 0x80 | opClose
	pingFirstByte  = 0x80 | opPing
	pongFirstByte  = 0x80 | opPong
)

// closeNoStatus stands for a close frame without a status code (it is
// never sent on the wire).
const closeNoStatus = 1005

// frameTracker follows the frame boundaries of one direction of a WebSocket
// byte stream by reading frame headers only: payload bytes are skipped by
// count, never looked at. It lets the relay stop at a boundary to inject a
// close frame without cutting a frame in half.
type frameTracker struct {
	remaining int64    // payload bytes left in the current frame
	hdr       [14]byte // header bytes collected so far
	hdrN      uint8    // how many; 0 with remaining 0 means at a boundary
	opcode    byte     // opcode of the current frame
	// sawClose is set once a whole close frame has passed.
	sawClose bool
	// fragmented: a data message is in progress (its latest frame had
	// FIN clear); control frames may come in between.
	fragmented bool
	// code collects the status code of the current close frame (its
	// payload's first two bytes, unmasked), codeN how many are in.
	code  [2]byte
	codeN uint8
	// followText: the tracker also follows the UTF-8 of the current
	// text message, a few bytes at the end of each piece of payload
	// (the client's stream of a session with a farewell, whose message
	// cut short the gateway completes: farewell_fill.go). u8Lead is the
	// lead byte of a character not whole yet (0: none; notText: the
	// message is not text), u8Have how many of its bytes have passed.
	followText bool
	u8Lead     byte
	u8Have     uint8
}

// atBoundary reports whether the stream is between two frames.
func (t *frameTracker) atBoundary() bool { return t.hdrN == 0 && t.remaining == 0 }

// atMessageBoundary reports whether the stream is between two messages.
func (t *frameTracker) atMessageBoundary() bool { return t.atBoundary() && !t.fragmented }

// headerLen returns the full header length once the first two bytes are
// known.
func headerLen(b1 byte) int {
	n := 2
	switch b1 & 0x7f {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if b1&0x80 != 0 {
		n += 4
	}
	return n
}

// advance consumes p and returns how many bytes it took. With stop set, it
// stops at the first frame boundary it reaches (possibly 0 bytes in, when it
// is already at one); otherwise it takes all of p.
func (t *frameTracker) advance(p []byte, stop bool) int {
	i := 0
	for i < len(p) {
		if stop && t.atBoundary() {
			return i
		}
		if t.remaining > 0 {
			n := int64(len(p) - i)
			if n > t.remaining {
				n = t.remaining
			}
			if t.opcode == opClose {
				t.takeCode(p[i : i+int(n)])
				if t.remaining == n {
					t.sawClose = true
				}
			} else if t.followText && t.opcode < opClose {
				t.followUTF8(p[i : i+int(n)])
			}
			t.remaining -= n
			i += int(n)
			continue
		}
		// Collect header bytes.
		if t.hdrN < 2 {
			t.hdr[t.hdrN] = p[i]
			t.hdrN++
			i++
			if t.hdrN < 2 {
				continue
			}
		}
		need := uint8(headerLen(t.hdr[1]))
		for t.hdrN < need && i < len(p) {
			t.hdr[t.hdrN] = p[i]
			t.hdrN++
			i++
		}
		if t.hdrN < need {
			return i
		}
		t.opcode = t.hdr[0] & 0x0f
		length := t.payloadLen()
		t.hdrN = 0
		t.remaining = length
		if t.opcode < opClose {
			t.fragmented = t.hdr[0]&0x80 == 0
			if t.followText && t.opcode != 0 {
				t.startMessage()
			}
		} else if t.opcode == opClose {
			t.codeN = 0
			if length == 0 {
				t.sawClose = true
			}
		}
	}
	return i
}

// payloadLen is the payload length of the frame whose header is whole in
// hdr.
func (t *frameTracker) payloadLen() int64 {
	switch l := t.hdr[1] & 0x7f; l {
	case 126:
		return int64(binary.BigEndian.Uint16(t.hdr[2:4]))
	case 127:
		// The most significant bit must be 0 (RFC 6455 5.2); a peer
		// that sets it gets a huge count, which only ever grows the
		// frame, never corrupts the count.
		return int64(binary.BigEndian.Uint64(t.hdr[2:10]) & (1<<63 - 1))
	default:
		return int64(l)
	}
}

// takeCode collects the first payload bytes of a close frame: its status
// code. The header (with the mask key) is still in hdr.
func (t *frameTracker) takeCode(b []byte) {
	for j := 0; j < len(b) && t.codeN < 2; j++ {
		c := b[j]
		if t.hdr[1]&0x80 != 0 {
			hl := headerLen(t.hdr[1])
			c ^= t.hdr[hl-4+int(t.codeN)]
		}
		t.code[t.codeN] = c
		t.codeN++
	}
}

// closeCode is the status code of the last close frame taken (whole or
// not): closeNoStatus when its payload held none.
func (t *frameTracker) closeCode() int {
	if t.codeN < 2 {
		return closeNoStatus
	}
	return int(binary.BigEndian.Uint16(t.code[:]))
}

// advanceToEither is advance(p, false) that stops at the first frame
// boundary where the next frame's first byte is a or b; it returns how many
// bytes it took. Payloads are skipped by count, as by advance.
func (t *frameTracker) advanceToEither(p []byte, a, b byte) int {
	i := 0
	for i < len(p) {
		if t.atBoundary() {
			if c := p[i]; c == a || c == b {
				return i
			}
			i += t.advance(p[i:i+1], false) // the frame's first byte
			continue
		}
		i += t.advance(p[i:], true) // up to the next boundary
	}
	return i
}

// closeFrame builds a close frame with code and reason (reason cut to fit
// a control frame). masked frames are for the provider side (client to
// server frames must be masked).
func closeFrame(code int, reason string, masked bool) []byte {
	if len(reason) > 123 {
		reason = reason[:123]
	}
	return controlFrame(opClose, append(binary.BigEndian.AppendUint16(nil, uint16(code)), reason...), masked)
}

// controlFrame builds a control frame (payload at most 125 bytes), masked
// toward the provider.
func controlFrame(op byte, payload []byte, masked bool) []byte {
	return appendFrame(make([]byte, 0, 6+len(payload)), op, payload, masked)
}

// appendDataFrame appends one masked frame (FIN set) with op and payload:
// the gateway speaks as the client toward the provider.
func appendDataFrame(b []byte, op byte, payload []byte) []byte {
	return appendFrame(b, op, payload, true)
}

// appendFrame appends one frame (FIN set) with op and payload, masked with
// a fresh key when masked is set.
func appendFrame(b []byte, op byte, payload []byte, masked bool) []byte {
	var m byte
	if masked {
		m = 0x80
	}
	b = append(b, 0x80|op)
	switch n := len(payload); {
	case n <= 125:
		b = append(b, m|byte(n))
	case n <= 0xffff:
		b = binary.BigEndian.AppendUint16(append(b, m|126), uint16(n))
	default:
		b = binary.BigEndian.AppendUint64(append(b, m|127), uint64(n))
	}
	if !masked {
		return append(b, payload...)
	}
	var key [4]byte
	binary.LittleEndian.PutUint32(key[:], rand.Uint32())
	b = append(b, key[:]...)
	start := len(b)
	b = append(b, payload...)
	for i := start; i < len(b); i++ {
		b[i] ^= key[(i-start)&3]
	}
	return b
}
