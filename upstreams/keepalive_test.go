package upstreams

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"net"
	"sync"
	"testing"
	"time"
)

// TestPingerSteps: the keepalive decisions for one side, tick by tick on a
// made-up clock: a quiet side is pinged after the interval; anything from
// it answers; a second unanswered ping given a whole interval makes it
// dead; a second ping that could not even go out makes it dead two
// intervals after the first; relayed frames and answered pings put the
// next ping an interval off.
func TestPingerSteps(t *testing.T) {
	const iv = 4 * time.Second
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	type tick struct {
		at             float64
		to, from, sent int64
		want           keepaliveAction
	}
	cases := []struct {
		name  string
		ticks []tick
	}{
		{"answered pings keep it alive", []tick{
			{0, 0, 0, 0, kaNothing},
			{3, 0, 0, 0, kaNothing},
			{4, 0, 0, 0, kaPing},
			{5, 0, 0, 1, kaNothing},  // the ping went out
			{6, 0, 10, 1, kaNothing}, // its pong
			{8, 0, 10, 1, kaNothing}, // quiet since the ping at 5
			{9, 0, 10, 1, kaPing},
		}},
		{"two unanswered pings: dead", []tick{
			{0, 0, 0, 0, kaNothing},
			{4, 0, 0, 0, kaPing},
			{4.5, 0, 0, 1, kaNothing},
			{8, 0, 0, 1, kaNothing},
			{8.5, 0, 0, 1, kaPing}, // the first got an interval: the second
			{9, 0, 0, 2, kaNothing},
			{12.5, 0, 0, 2, kaNothing}, // the second has had 3.5s
			{13, 0, 0, 2, kaDead},
		}},
		{"an answer to the second ping saves it", []tick{
			{0, 0, 0, 0, kaNothing},
			{4, 0, 0, 0, kaPing},
			{4, 0, 0, 1, kaNothing},
			{8, 0, 0, 1, kaPing},
			{8, 0, 0, 2, kaNothing},
			{11, 0, 3, 2, kaNothing}, // bytes from the side count as an answer
			{11.5, 0, 3, 2, kaNothing},
			{12, 0, 3, 2, kaPing}, // an interval after the last ping
		}},
		{"frames to the side defer pings", []tick{
			{0, 0, 0, 0, kaNothing},
			{3, 100, 0, 0, kaNothing},
			{6, 200, 0, 0, kaNothing},
			{9.5, 200, 0, 0, kaNothing},
			{10, 200, 0, 0, kaPing},
		}},
		{"a second ping that cannot go out", []tick{
			{0, 0, 0, 0, kaNothing},
			{4, 0, 0, 0, kaPing},
			{4, 0, 0, 1, kaNothing},
			{8, 0, 0, 1, kaPing},
			{10, 0, 0, 1, kaPing}, // still not sent (mid-frame, or a blocked write)
			{11.9, 0, 0, 1, kaPing},
			{12, 0, 0, 1, kaDead},
		}},
		{"frames to the side do not answer a ping", []tick{
			{0, 0, 0, 0, kaNothing},
			{4, 0, 0, 0, kaPing},
			{4, 0, 0, 1, kaNothing},
			{6, 50, 0, 1, kaNothing},
			{8, 90, 0, 1, kaPing},
			{8, 90, 0, 2, kaNothing},
			{12, 120, 0, 2, kaDead},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := &pinger{interval: iv}
			for i, tk := range tc.ticks {
				if got := k.step(at(tk.at), tk.to, tk.from, tk.sent); got != tk.want {
					t.Fatalf("tick %d (t=%vs): %v, want %v", i, tk.at, got, tk.want)
				}
			}
		})
	}
}

// TestAdvanceTo: the tracker stops at the boundary before a frame starting
// with the given byte, whatever the reads' cuts, and never inside a
// payload (even one holding that byte).
func TestAdvanceTo(t *testing.T) {
	var stream []byte
	stream = append(stream, 0x81, 3, pongFirstByte, pongFirstByte, 'x') // text "\x8a\x8ax"
	stream = append(stream, 0x82, 126, 0x01, 0x00)                      // binary, 256 bytes of 0x8a
	stream = append(stream, bytes.Repeat([]byte{pongFirstByte}, 256)...)
	pong := len(stream)
	stream = append(stream, pongFirstByte, 0, 0x81, 0)
	for cut := 1; cut <= len(stream); cut++ {
		var tr frameTracker
		off := 0
		stopped := -1
		for off < len(stream) {
			end := min(off+cut, len(stream))
			n := tr.advanceToEither(stream[off:end], pongFirstByte, pongFirstByte)
			off += n
			if off < end {
				stopped = off
				break
			}
		}
		if stopped != pong {
			t.Fatalf("reads of %d bytes: stopped at %d, want %d", cut, stopped, pong)
		}
	}
}

// writeFrame writes one frame (masked for the client side's frames).
func writeFrame(c net.Conn, op byte, payload []byte, masked bool) {
	b := []byte{0x80 | op}
	if masked {
		b = append(b, 0x80|byte(len(payload)))
		key := []byte{1, 2, 3, 4}
		b = append(b, key...)
		for i, x := range payload {
			b = append(b, x^key[i&3])
		}
	} else {
		b = append(b, byte(len(payload)))
		b = append(b, payload...)
	}
	c.Write(b)
}

// peer reads the frames a fake side gets, answering the gateway's pings
// (or not) and recording everything.
type peer struct {
	c      net.Conn
	masked bool // its own frames are masked (it is the client)
	mu     sync.Mutex
	frames []frame
	answer bool
	// split writes each pong one byte at a time.
	split bool
	done  chan struct{}
	// wmu keeps the peer's writes whole: a pong and the test's own frames
	// never interleave.
	wmu sync.Mutex
}

// send writes raw bytes as the peer.
func (p *peer) send(b []byte) {
	p.wmu.Lock()
	p.c.Write(b)
	p.wmu.Unlock()
}

// frameBytes renders one frame.
func frameBytes(op byte, payload []byte, masked bool) []byte {
	var buf bytes.Buffer
	writeFrame(&bufConn{w: &buf}, op, payload, masked)
	return buf.Bytes()
}

func newPeer(c net.Conn, masked, answer bool) *peer {
	p := &peer{c: c, masked: masked, answer: answer, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		br := bufio.NewReader(c)
		for {
			f, err := readFrame(br)
			if err != nil {
				return
			}
			p.mu.Lock()
			p.frames = append(p.frames, f)
			answer, split := p.answer, p.split
			p.mu.Unlock()
			if f.op == opPing && answer {
				pong := frameBytes(opPong, f.payload, masked)
				p.wmu.Lock()
				if split {
					for _, b := range pong {
						c.Write([]byte{b})
						time.Sleep(time.Millisecond)
					}
				} else {
					c.Write(pong)
				}
				p.wmu.Unlock()
			}
			if f.op == opClose {
				return
			}
		}
	}()
	return p
}

type bufConn struct {
	net.Conn
	w *bytes.Buffer
}

func (b *bufConn) Write(p []byte) (int, error) { return b.w.Write(p) }

func (p *peer) got() []frame {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]frame(nil), p.frames...)
}

func (p *peer) count(op byte) int {
	n := 0
	for _, f := range p.got() {
		if f.op == op {
			n++
		}
	}
	return n
}

func waitCond(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestKeepalivePingsBothSides: an idle session with keepalive pings each
// side (unmasked to the client, masked to the provider) with the
// session's payload; their pongs are not relayed and count as no bytes;
// the session lives on for many intervals.
func TestKeepalivePingsBothSides(t *testing.T) {
	const iv = 100 * time.Millisecond
	f := newRelay(t, SessionOptions{Keepalive: iv})
	client := newPeer(f.client, true, true)
	provider := newPeer(f.provider, false, true)
	client.mu.Lock()
	client.split = true // the client's pongs come a byte at a time
	client.mu.Unlock()
	start := time.Now()
	waitCond(t, 5*time.Second, "three pings each side", func() bool {
		return client.count(opPing) >= 3 && provider.count(opPing) >= 3
	})
	if d := time.Since(start); d < 3*iv {
		t.Fatalf("three pings within %v: pinged before the interval", d)
	}
	for _, side := range []struct {
		name   string
		p      *peer
		masked bool
	}{{"client", client, false}, {"provider", provider, true}} {
		for _, fr := range side.p.got() {
			if fr.op != opPing {
				t.Fatalf("%s got a frame of opcode %#x: a pong was relayed", side.name, fr.op)
			}
			if fr.masked != side.masked || len(fr.payload) != pingTokenLen || !bytes.Equal(fr.payload, f.s.ka.token[:]) {
				t.Fatalf("%s got ping masked %v payload %x", side.name, fr.masked, fr.payload)
			}
		}
	}
	if f.s.BytesUp() != 0 || f.s.BytesDown() != 0 {
		t.Fatalf("pongs counted as relayed bytes: up %d down %d", f.s.BytesUp(), f.s.BytesDown())
	}
	select {
	case <-f.s.Done():
		t.Fatalf("the session ended (%s) though both sides answer", f.s.Reason())
	default:
	}
	if n := f.s.KeepalivePings(); n < 6 {
		t.Fatalf("%d pings counted", n)
	}
	// Data flows as before, and other pongs are relayed.
	client.send(frameBytes(0x1, []byte("hello"), true))
	client.send(frameBytes(opPong, []byte("not ours"), true))
	waitCond(t, 5*time.Second, "the text and the foreign pong at the provider", func() bool {
		var text, pong bool
		for _, fr := range provider.got() {
			text = text || (fr.op == 0x1 && string(fr.payload) == "hello")
			pong = pong || (fr.op == opPong && string(fr.payload) == "not ours")
		}
		return text && pong
	})
	f.s.Close(CloseNormal, "bye")
	f.waitEnd(t, 5*time.Second)
}

// TestKeepaliveDeadProvider: a provider that reads nothing (a vanished
// peer) answers no ping: about two intervals after the first ping the
// session ends, and the client gets close 1001 "keepalive timeout".
func TestKeepaliveDeadProvider(t *testing.T) {
	const iv = 100 * time.Millisecond
	f := newRelay(t, SessionOptions{Keepalive: iv})
	client := newPeer(f.client, true, true)
	start := time.Now()
	f.waitEnd(t, 30*iv+2*CloseWait)
	d := time.Since(start)
	if f.s.Reason() != EndKeepalive {
		t.Fatalf("reason %q, want %q", f.s.Reason(), EndKeepalive)
	}
	// First ping after an interval, dead two intervals later.
	if d < 3*iv {
		t.Fatalf("ended after %v, before three intervals", d)
	}
	<-client.done
	fs := client.got()
	last := fs[len(fs)-1]
	if !isClose(last, CloseGoingAway, EndKeepalive) {
		t.Fatalf("client's last frame %+v, want close 1001 %q", last, EndKeepalive)
	}
	t.Logf("dead provider found after %v (interval %v)", d.Round(time.Millisecond), iv)
}

// TestKeepaliveNotMidFrame: a side in the middle of a frame is not pinged
// (the ping would split the frame); once the frame is whole, it is.
func TestKeepaliveNotMidFrame(t *testing.T) {
	const iv = 200 * time.Millisecond
	f := newRelay(t, SessionOptions{Keepalive: iv})
	provider := newPeer(f.provider, false, true)
	// The provider sends half a 1000-byte frame and stalls for more than
	// two intervals (answering no ping meanwhile: a pong would land inside
	// its own frame; it answers once the frame is out, before it would
	// count as dead).
	hdr := binary.BigEndian.AppendUint16([]byte{0x82, 126}, 1000)
	payload := bytes.Repeat([]byte{pongFirstByte}, 1000)
	provider.wmu.Lock()
	f.provider.Write(append(hdr, payload[:500]...))
	time.Sleep(iv * 9 / 4)
	f.provider.Write(payload[500:])
	provider.wmu.Unlock()
	br := bufio.NewReader(f.client)
	fr, err := readFrame(br)
	if err != nil || fr.op != 0x2 || !bytes.Equal(fr.payload, payload) {
		t.Fatalf("client got %+v %v before the whole frame", fr.op, err)
	}
	f.client.SetReadDeadline(time.Now().Add(5 * time.Second))
	fr, err = readFrame(br)
	if err != nil || fr.op != opPing {
		t.Fatalf("after the frame: %+v %v, want a ping", fr, err)
	}
	writeFrame(f.client, opPong, fr.payload, true)
	f.s.Close(CloseNormal, "bye")
	f.waitEnd(t, 5*time.Second)
}

// TestKeepaliveKeepsIdleTimeout: pings and pongs are no activity: the
// count its lifecycle's idle timeout reads does not move while both sides
// answer every ping.
func TestKeepaliveKeepsIdleTimeout(t *testing.T) {
	const iv = 40 * time.Millisecond
	f := newRelay(t, SessionOptions{Keepalive: iv})
	newPeer(f.client, true, true)
	provider := newPeer(f.provider, false, true)
	before, _ := f.s.Activity()
	waitCond(t, 10*time.Second, "three pings to the provider", func() bool { return provider.count(opPing) >= 3 })
	if after, waiting := f.s.Activity(); after != before || waiting {
		t.Fatalf("activity %d (waiting %v) after pings and pongs, was %d", after, waiting, before)
	}
	f.s.Close(CloseNormal, "bye")
	f.waitEnd(t, 5*time.Second)
}
