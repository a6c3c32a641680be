package upstreams

import (
	"encoding/binary"
	"math/rand/v2"
	"time"
)

// Completing a message the client cut short, so that a farewell can
// follow it.
//
// A provider that got part of a message waits for the rest of it, and
// takes no other message until then. When the client of a session with a
// farewell leaves in the middle of one of its messages, or the gateway
// ends such a session while the client is in the middle of one, the
// gateway writes the provider the rest of that message as the client
// could have: the rest of the frame header (the shortest payload length
// its bytes allow), the rest of the payload (masked with the frame's key,
// as the client's bytes are), then, for a fragmented message, a last empty
// continuation frame. A text message must stay valid UTF-8 (Firefox closes
// the connection on invalid text, and keeps the session): the filler
// first completes a character cut in half with continuation bytes, then
// is spaces. The provider gets a message it cannot use (Firefox drops
// text that is not JSON without an answer, and answers a JSON message
// without a valid command with an error that names no command ID), then
// the farewell.
//
// For that the frame tracker of the client's stream follows, in such a
// session only, the UTF-8 of the current text message: it looks at the
// last three bytes at most of each piece of payload that passes (a
// character not whole at the end of a piece began there), and keeps the
// lead byte of a character not whole and its count. The client's stream
// is not spliced then: the tracker sees every piece.

// fillMax bounds the filler of a frame cut short: a frame that owes more
// is not completed, and its session ends without a farewell.
const fillMax = 64 << 20

// notText is u8Lead for a data message that is not text: 0xff is never a
// byte of UTF-8.
const notText = 0xff

// startMessage: the first frame of a data message starts (followText).
func (t *frameTracker) startMessage() {
	t.u8Lead, t.u8Have = 0, 0
	if t.opcode != 0x1 {
		t.u8Lead = notText
	}
}

// followUTF8 follows b, payload of the current data frame not yet counted
// off remaining, for the UTF-8 of a text message.
func (t *frameTracker) followUTF8(b []byte) {
	if t.u8Lead == notText {
		return
	}
	j := 0
	if len(b) >= 3 {
		// A character not whole at the end of b began in its last three
		// bytes; whatever came before is whole (or not UTF-8: Firefox
		// refuses it anyway).
		j, t.u8Lead, t.u8Have = len(b)-3, 0, 0
	}
	key, off := t.maskKey(), t.payloadLen()-t.remaining
	for ; j < len(b); j++ {
		t.utf8Byte(b[j] ^ key[(off+int64(j))&3])
	}
}

// utf8Byte follows one unmasked byte of a text message.
func (t *frameTracker) utf8Byte(c byte) {
	switch {
	case c < 0x80:
		t.u8Lead, t.u8Have = 0, 0
	case c < 0xc0: // a continuation byte
		if t.u8Lead != 0 {
			if t.u8Have++; t.u8Have == utf8Len(t.u8Lead) {
				t.u8Lead, t.u8Have = 0, 0
			}
		}
	default: // a lead byte
		t.u8Lead, t.u8Have = c, 1
	}
}

// utf8Len is the length of the character a lead byte starts.
func utf8Len(lead byte) uint8 {
	switch {
	case lead < 0xe0:
		return 2
	case lead < 0xf0:
		return 3
	}
	return 4
}

// utf8Tail appends to b the continuation bytes that complete the
// character the current text message has not finished, the smallest
// valid ones (after 0xe0 or 0xf0 the next byte must be high enough not to
// be an overlong form).
func (t *frameTracker) utf8Tail(b []byte) []byte {
	if t.u8Lead == 0 || t.u8Lead == notText {
		return b
	}
	for h := t.u8Have; h < utf8Len(t.u8Lead); h++ {
		c := byte(0x80)
		if h == 1 {
			switch t.u8Lead {
			case 0xe0:
				c = 0xa0
			case 0xf0:
				c = 0x90
			}
		}
		b = append(b, c)
	}
	return b
}

// maskKey is the mask key of the frame whose header is whole in hdr
// (zeros when it is not masked).
func (t *frameTracker) maskKey() (k [4]byte) {
	if t.hdr[1]&0x80 != 0 {
		hl := headerLen(t.hdr[1])
		copy(k[:], t.hdr[hl-4:hl])
	}
	return k
}

// headerRest returns the bytes that complete the frame header begun in
// hdr (0 < hdrN): with only the first byte in, a masked frame without
// payload; else the missing bytes of the extended length the smallest that
// still need that form (126 bytes and more for the 16-bit length, 64 KiB
// and more for the 64-bit one, as a length must be written in the
// shortest form), and a random mask key's missing bytes.
func (t *frameTracker) headerRest() []byte {
	h, n := t.hdr, int(t.hdrN)
	if n == 1 {
		h[1], n = 0x80, 2
	}
	end := headerLen(h[1])
	w := 0
	switch h[1] & 0x7f {
	case 126:
		w = 2
	case 127:
		w = 8
	}
	if k := min(n-2, w); k < w {
		var known uint64
		for _, c := range h[2 : 2+k] {
			known = known<<8 | uint64(c)
		}
		shift := uint(8 * (w - k))
		v := known << shift
		least := uint64(126)
		if w == 8 {
			least = 1 << 16
		}
		if v < least && least>>shift == known {
			v = least
		}
		var ext [8]byte
		binary.BigEndian.PutUint64(ext[:], v)
		copy(h[2+k:2+w], ext[8-w+k:])
	}
	if h[1]&0x80 != 0 {
		key := rand.Uint32()
		for i := max(n, end-4); i < end; i++ {
			h[i] = byte(key >> (8 * (i & 3)))
		}
	}
	return h[t.hdrN:end]
}

// completeMessage writes to the provider (dst, the up direction's) what
// brings its stream, where the client's stops at t, to a message boundary,
// and moves t there. It reports false, with t unchanged, when the frame in
// flight owes more than fillMax bytes, and false when a write fails. (A
// control frame the client had begun and the relay holds back, whole
// frames only, never went to the provider: it needs nothing.)
func (d *direction) completeMessage(t *frameTracker) bool {
	if t.atMessageBoundary() {
		return true
	}
	c := *t
	var head []byte
	if c.hdrN > 0 {
		head = c.headerRest()
		c.advance(head, false)
	}
	if c.remaining > fillMax {
		return false
	}
	*t = c
	bp := relayBufs.Get().(*[]byte)
	defer relayBufs.Put(bp)
	d.dst.SetWriteDeadline(time.Now().Add(CloseFrameLimit))
	defer d.dst.SetWriteDeadline(time.Time{})
	out := append((*bp)[:0], head...)
	for {
		// The payload still owed, a buffer at a time: spaces, behind
		// the bytes that complete a character of a text message.
		n := int(min(t.remaining, int64(cap(out)-len(out))))
		fill := out[len(out) : len(out)+n]
		for i := range fill {
			fill[i] = ' '
		}
		if t.opcode < opClose {
			copy(fill, t.utf8Tail(nil))
		}
		key, off := t.maskKey(), t.payloadLen()-t.remaining
		for i := range fill {
			fill[i] ^= key[(off+int64(i))&3]
		}
		t.advance(fill, false)
		out = out[:len(out)+n]
		if t.remaining == 0 && t.fragmented {
			// The message's last frame, with what completes its last
			// character.
			last := appendDataFrame(nil, 0x0, t.utf8Tail(nil))
			t.advance(last, false)
			out = append(out, last...)
		}
		if len(out) > 0 {
			if _, err := d.dst.Write(out); err != nil {
				return false
			}
		}
		if t.remaining == 0 {
			return true
		}
		out = out[:0]
	}
}
