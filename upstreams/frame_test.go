package upstreams

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
)

// mkFrame builds one WebSocket frame: header (in the shortest length form
// unless form forces 126 or 127), optional mask, payload.
func mkFrame(fin bool, op byte, payload []byte, masked bool, form int) []byte {
	b0 := op & 0x0f
	if fin {
		b0 |= 0x80
	}
	n := len(payload)
	if form == 0 {
		switch {
		case n <= 125:
			form = 7
		case n <= 0xffff:
			form = 126
		default:
			form = 127
		}
	}
	var mbit byte
	if masked {
		mbit = 0x80
	}
	b := []byte{b0}
	switch form {
	case 7:
		b = append(b, mbit|byte(n))
	case 126:
		b = append(b, mbit|126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	case 127:
		b = append(b, mbit|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	if !masked {
		return append(b, payload...)
	}
	key := [4]byte{0x37, 0xfa, 0x21, 0x3d}
	b = append(b, key[:]...)
	for i, c := range payload {
		b = append(b, c^key[i&3])
	}
	return b
}

func payloadOf(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		// Bytes that look like frame headers, to catch a tracker that
		// peeks into payloads.
		p[i] = byte(0x80 | (i % 11))
	}
	return p
}

// walk feeds p to t as the relay does while closing: it stops at every
// boundary, records its offset (base + position), then steps one byte
// past it. It returns the boundary offsets found before each frame start.
func walk(t *frameTracker, p []byte, base int, out []int) []int {
	for len(p) > 0 {
		if t.atBoundary() {
			out = append(out, base)
			if n := t.advance(p[:1], false); n != 1 {
				panic(fmt.Sprintf("advance of one byte took %d", n))
			}
			p, base = p[1:], base+1
			continue
		}
		n := t.advance(p, true)
		if n == 0 {
			panic("advance with stop made no progress off a boundary")
		}
		p, base = p[n:], base+n
	}
	return out
}

// boundaries walks the whole stream in the given chunks and adds the end
// offset when the stream ends at a boundary.
func boundaries(stream []byte, chunks []int) ([]int, frameTracker) {
	var t frameTracker
	var out []int
	pos := 0
	for _, c := range chunks {
		out = walk(&t, stream[pos:pos+c], pos, out)
		pos += c
	}
	out = walk(&t, stream[pos:], pos, out)
	if t.atBoundary() {
		out = append(out, len(stream))
	}
	return out, t
}

// refBoundaries parses the whole stream independently of frameTracker.
func refBoundaries(stream []byte) (out []int, sawClose bool) {
	pos := 0
	for {
		if pos == len(stream) {
			return append(out, pos), sawClose
		}
		out = append(out, pos)
		if len(stream)-pos < 2 {
			return out, sawClose
		}
		b0, b1 := stream[pos], stream[pos+1]
		hl := 2
		switch b1 & 0x7f {
		case 126:
			hl += 2
		case 127:
			hl += 8
		}
		if b1&0x80 != 0 {
			hl += 4
		}
		if len(stream)-pos < hl {
			return out, sawClose
		}
		var length uint64
		switch l := b1 & 0x7f; l {
		case 126:
			length = uint64(binary.BigEndian.Uint16(stream[pos+2:]))
		case 127:
			length = binary.BigEndian.Uint64(stream[pos+2:]) & (1<<63 - 1)
		default:
			length = uint64(l)
		}
		rest := uint64(len(stream) - pos - hl)
		if length > rest {
			return out, sawClose
		}
		if b0&0x0f == opClose {
			sawClose = true
		}
		pos += hl + int(length)
	}
}

func TestFrameTrackerLengthForms(t *testing.T) {
	cases := []struct {
		n    int
		form int
		hdr  int // header length unmasked
	}{
		{0, 7, 2}, {1, 7, 2}, {125, 7, 2},
		{126, 126, 4}, {127, 126, 4}, {65535, 126, 4},
		{65536, 127, 10}, {70000, 127, 10},
		// Non-minimal encodings are legal to count.
		{5, 126, 4}, {5, 127, 10}, {300, 127, 10}, {0, 127, 10},
	}
	for _, tc := range cases {
		for _, masked := range []bool{false, true} {
			t.Run(fmt.Sprintf("len%d_form%d_masked%v", tc.n, tc.form, masked), func(t *testing.T) {
				f := mkFrame(true, 0x2, payloadOf(tc.n), masked, tc.form)
				hdr := tc.hdr
				if masked {
					hdr += 4
				}
				if len(f) != hdr+tc.n {
					t.Fatalf("frame length %d, want %d", len(f), hdr+tc.n)
				}
				// Whole.
				var tr frameTracker
				if n := tr.advance(f, false); n != len(f) {
					t.Fatalf("advance took %d of %d", n, len(f))
				}
				if !tr.atBoundary() || tr.opcode != 0x2 || tr.sawClose {
					t.Fatalf("after the whole frame: %+v", tr)
				}
				// Byte by byte: at a boundary only at the very end; the
				// payload count is known exactly when the header is done.
				tr = frameTracker{}
				for i := range f {
					if tr.advance(f[i:i+1], false) != 1 {
						t.Fatalf("byte %d not taken", i)
					}
					end := i == len(f)-1
					if tr.atBoundary() != end {
						t.Fatalf("after byte %d of %d: atBoundary %v", i+1, len(f), tr.atBoundary())
					}
					if i+1 < hdr {
						if int(tr.hdrN) != i+1 || tr.remaining != 0 {
							t.Fatalf("in the header after %d bytes: hdrN %d remaining %d", i+1, tr.hdrN, tr.remaining)
						}
					} else if want := int64(len(f) - i - 1); tr.remaining != want || tr.hdrN != 0 {
						t.Fatalf("after %d bytes: remaining %d, want %d (hdrN %d)", i+1, tr.remaining, want, tr.hdrN)
					}
				}
				// Followed by another frame, with stop: it stops exactly at
				// the end of the first.
				next := mkFrame(true, 0x1, []byte("next"), masked, 0)
				tr = frameTracker{}
				tr.advance(f[:1], false)
				stream := append(append([]byte{}, f...), next...)
				if n := tr.advance(stream[1:], true); n != len(f)-1 {
					t.Fatalf("stop took %d, want %d", n, len(f)-1)
				}
				if !tr.atBoundary() {
					t.Fatal("not at a boundary after stopping")
				}
			})
		}
	}
}

// TestFrameTrackerSplitHeaders feeds streams of mixed frames in every
// chunk size from 1 to 19 and compares the boundaries with a whole feed and
// with an independent parser.
func TestFrameTrackerSplitHeaders(t *testing.T) {
	var stream []byte
	for i, n := range []int{0, 3, 125, 126, 200, 65535, 65536, 1, 0, 70000, 7} {
		stream = append(stream, mkFrame(i%3 != 0, byte(i%3), payloadOf(n), i%2 == 0, 0)...)
	}
	stream = append(stream, mkFrame(true, 0x9, []byte("ping"), true, 127)...)
	stream = append(stream, closeFrame(1000, "bye", true)...)
	want, wantClose := refBoundaries(stream)
	whole, wt := boundaries(stream, nil)
	if !equalInts(whole, want) || wt.sawClose != wantClose || !wantClose {
		t.Fatalf("whole feed: boundaries %v sawClose %v, want %v %v", whole, wt.sawClose, want, wantClose)
	}
	for size := 1; size < 20; size++ {
		var chunks []int
		for rest := len(stream); rest > 0; rest -= size {
			chunks = append(chunks, min(size, rest))
		}
		got, gt := boundaries(stream, chunks)
		if !equalInts(got, want) || gt.sawClose != wantClose || !gt.atBoundary() {
			t.Fatalf("chunks of %d: %v (sawClose %v), want %v", size, got, gt.sawClose, want)
		}
		// Without stop every chunk is taken whole and the end state is
		// the same.
		var tr frameTracker
		pos := 0
		for _, c := range chunks {
			if n := tr.advance(stream[pos:pos+c], false); n != c {
				t.Fatalf("advance took %d of %d", n, c)
			}
			pos += c
		}
		if tr != gt {
			t.Fatalf("end states differ: %+v vs %+v", tr, gt)
		}
	}
}

func TestFrameTrackerStopAtBoundary(t *testing.T) {
	a := mkFrame(true, 0x1, []byte("hello"), false, 0)
	b := mkFrame(true, 0x2, payloadOf(300), false, 0)
	stream := append(append([]byte{}, a...), b...)

	var tr frameTracker
	// At a boundary already: nothing is taken.
	if n := tr.advance(stream, true); n != 0 {
		t.Fatalf("stop at a boundary took %d", n)
	}
	// Mid-header of the first frame: it finishes that frame only.
	tr.advance(stream[:1], false)
	if n := tr.advance(stream[1:], true); n != len(a)-1 {
		t.Fatalf("took %d, want %d", n, len(a)-1)
	}
	if n := tr.advance(stream[len(a):], true); n != 0 || !tr.atBoundary() {
		t.Fatalf("second stop took %d", n)
	}
	// Mid-payload of the second frame, in pieces.
	tr.advance(stream[len(a):len(a)+10], false)
	if tr.atBoundary() {
		t.Fatal("at a boundary mid-frame")
	}
	p := append(append([]byte{}, stream[len(a)+10:]...), a...)
	if n := tr.advance(p[:50], true); n != 50 || tr.atBoundary() {
		t.Fatalf("took %d of a piece inside the frame", n)
	}
	if n := tr.advance(p[50:], true); n != len(b)-60 || !tr.atBoundary() {
		t.Fatalf("took %d, want %d", n, len(b)-60)
	}
	// Empty input.
	if n := tr.advance(nil, true); n != 0 {
		t.Fatal("took bytes from nothing")
	}
}

func TestFrameTrackerClose(t *testing.T) {
	for _, masked := range []bool{false, true} {
		// An empty close frame.
		var tr frameTracker
		tr.advance(mkFrame(true, opClose, nil, masked, 0), false)
		if !tr.sawClose || !tr.atBoundary() {
			t.Fatalf("empty close (masked %v): %+v", masked, tr)
		}
		// A close with a payload is seen only when its last byte passed.
		f := closeFrame(1001, "server shutting down", masked)
		tr = frameTracker{}
		for i := range f {
			tr.advance(f[i:i+1], false)
			if tr.sawClose != (i == len(f)-1) {
				t.Fatalf("masked %v: sawClose %v after %d of %d bytes", masked, tr.sawClose, i+1, len(f))
			}
		}
	}
	// A data frame carrying the close opcode's bytes in its payload is not
	// a close.
	var tr frameTracker
	tr.advance(mkFrame(true, 0x2, closeFrame(1000, "x", false), false, 0), false)
	if tr.sawClose {
		t.Fatal("a close frame inside a payload was taken for a close")
	}
}

// TestFrameTrackerHugeLength: a 64-bit length with its top bit set (not
// allowed by RFC 6455) is counted without it and never goes negative.
func TestFrameTrackerHugeLength(t *testing.T) {
	h := []byte{0x82, 127, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 'x'}
	var tr frameTracker
	if n := tr.advance(h, false); n != len(h) {
		t.Fatalf("took %d", n)
	}
	if tr.remaining != 1<<63-1-1 {
		t.Fatalf("remaining %d", tr.remaining)
	}
}

// parseClose reads a close frame built by closeFrame.
func parseClose(t *testing.T, f []byte) (masked bool, code int, reason string) {
	t.Helper()
	if f[0] != 0x80|opClose {
		t.Fatalf("first byte %#x", f[0])
	}
	masked = f[1]&0x80 != 0
	n := int(f[1] & 0x7f)
	if n > 125 {
		t.Fatalf("control frame payload length %d", n)
	}
	p := f[2:]
	if masked {
		key := p[:4]
		p = append([]byte{}, p[4:]...)
		for i := range p {
			p[i] ^= key[i&3]
		}
	}
	if len(p) != n {
		t.Fatalf("payload %d bytes, header says %d", len(p), n)
	}
	return masked, int(binary.BigEndian.Uint16(p)), string(p[2:])
}

func TestCloseFrame(t *testing.T) {
	long := string(bytes.Repeat([]byte("r"), 200))
	for _, tc := range []struct {
		code   int
		reason string
		want   string
	}{
		{CloseNormal, "idle timeout", "idle timeout"},
		{CloseNormal, "session time limit", "session time limit"},
		{CloseGoingAway, "server shutting down", "server shutting down"},
		{CloseNormal, "", ""},
		{CloseNormal, long, long[:123]},
	} {
		for _, masked := range []bool{false, true} {
			f := closeFrame(tc.code, tc.reason, masked)
			gotMasked, code, reason := parseClose(t, f)
			if gotMasked != masked || code != tc.code || reason != tc.want {
				t.Fatalf("closeFrame(%d, %q, %v) parses as %v %d %q", tc.code, tc.reason, masked, gotMasked, code, reason)
			}
			var tr frameTracker
			if n := tr.advance(f, false); n != len(f) || !tr.sawClose || !tr.atBoundary() {
				t.Fatalf("tracker over the close frame: %d %+v", n, tr)
			}
		}
	}
	// Masking keys differ between frames.
	a, b := closeFrame(1000, "x", true), closeFrame(1000, "x", true)
	if bytes.Equal(a[2:6], b[2:6]) && bytes.Equal(a[2:6], closeFrame(1000, "x", true)[2:6]) {
		t.Fatal("the same masking key three times")
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// FuzzFrameTracker: feeding a stream in random chunk splits gives the same
// boundaries and end state as feeding it whole, and the same boundaries as
// an independent parser; nothing panics.
func FuzzFrameTracker(f *testing.F) {
	f.Add([]byte{0x81, 0x05, 'h', 'e', 'l', 'l', 'o'}, uint64(1))
	f.Add(append(mkFrame(true, 2, payloadOf(130), true, 0), closeFrame(1000, "bye", true)...), uint64(7))
	f.Fuzz(func(t *testing.T, stream []byte, seed uint64) {
		want, wantClose := refBoundaries(stream)
		whole, wt := boundaries(stream, nil)
		if !equalInts(whole, want) || wt.sawClose != wantClose {
			t.Fatalf("whole: %v sawClose %v; reference %v %v", whole, wt.sawClose, want, wantClose)
		}
		r := rand.New(rand.NewPCG(seed, seed>>32|1))
		var chunks []int
		for rest := len(stream); rest > 0; {
			c := 1 + r.IntN(min(rest, 16))
			if r.IntN(4) == 0 {
				c = 1 + r.IntN(rest)
			}
			chunks = append(chunks, c)
			rest -= c
		}
		got, gt := boundaries(stream, chunks)
		if !equalInts(got, whole) || gt != wt {
			t.Fatalf("chunks %v: %v %+v; whole %v %+v", chunks, got, gt, whole, wt)
		}
		var tr frameTracker
		pos := 0
		for _, c := range chunks {
			if n := tr.advance(stream[pos:pos+c], false); n != c {
				t.Fatalf("advance took %d of %d", n, c)
			}
			pos += c
		}
		if tr != wt {
			t.Fatalf("without stop: %+v, want %+v", tr, wt)
		}
	})
}
