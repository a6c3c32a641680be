package upstreams

import (
	"bufio"
	"bytes"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// testTap drops the messages that contain "gw", is sure early of those
// whose head starts with "keep:", and records what it saw.
type testTap struct {
	mu     sync.Mutex
	seen   []string // whole messages handed to Message
	early  int      // messages told by their head
	joined int
}

func (tt *testTap) Early(text bool, head []byte) (keep, sure bool) {
	if len(head) != TapPeek {
		panic("Early got a head that is not TapPeek long")
	}
	if bytes.HasPrefix(head, []byte("keep:")) {
		tt.mu.Lock()
		tt.early++
		tt.mu.Unlock()
		return true, true
	}
	return false, false
}

func (tt *testTap) Message(text bool, payload []byte) bool {
	tt.mu.Lock()
	tt.seen = append(tt.seen, string(payload))
	tt.mu.Unlock()
	return !bytes.Contains(payload, []byte("gw"))
}

func (tt *testTap) Joined() {
	tt.mu.Lock()
	tt.joined++
	tt.mu.Unlock()
}

// serverFrame is one unmasked frame as a provider sends it.
func serverFrame(op byte, fin bool, payload []byte) []byte {
	b := appendFrame(nil, op, payload, false)
	if !fin {
		b[0] &^= 0x80
	}
	return b
}

// TestTapTakesOutItsMessages: the provider's stream, written a byte at a
// time in places, mixes messages the tap keeps and takes out — short and
// long, text and binary, in one frame and fragmented, a ping in between
// fragments. The client receives exactly the kept messages' bytes, as the
// provider sent them, in order.
func TestTapTakesOutItsMessages(t *testing.T) {
	tap := &testTap{}
	f := newRelay(t, SessionOptions{Tap: tap})
	big := strings.Repeat("x", 200<<10)
	var stream, want []byte
	add := func(b []byte, kept bool) {
		stream = append(stream, b...)
		if kept {
			want = append(want, b...)
		}
	}
	add(serverFrame(opText, true, []byte(`{"id":1,"result":{}}`)), true)
	add(serverFrame(opText, true, []byte(`{"method":"Page.screencastFrame","sessionId":"gw"}`)), false)
	add(serverFrame(opText, true, []byte(`{"id":2,"big":"`+big+`"}`)), true)
	add(serverFrame(opText, true, []byte(`{"event":"gw","big":"`+big+`"}`)), false)
	// A fragmented kept message with a ping in between.
	add(serverFrame(opText, false, []byte(`{"method":"A",`)), true)
	add(controlFrame(opPing, []byte("p"), false), true)
	add(serverFrame(0, true, []byte(`"params":{}}`)), true)
	// A fragmented dropped one: the ping between its fragments still goes.
	add(serverFrame(opText, false, []byte(`{"method":"B",`)), false)
	add(controlFrame(opPing, []byte("q"), false), true)
	add(serverFrame(0, false, []byte(`"sessionId":`)), false)
	add(serverFrame(0, true, []byte(`"gw"}`)), false)
	add(serverFrame(0x2, true, []byte("binary kept")), true)
	add(serverFrame(opText, true, nil), true)

	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(f.client)
		got <- b
	}()
	// The first 300 bytes a byte at a time (headers split), the rest in
	// 7000-byte writes.
	for i := 0; i < len(stream); {
		n := 1
		if i >= 300 {
			n = min(7000, len(stream)-i)
		}
		if _, err := f.provider.Write(stream[i : i+n]); err != nil {
			t.Fatal(err)
		}
		i += n
	}
	f.provider.Close()
	b := <-got
	if !bytes.Equal(b, want) {
		t.Fatalf("the client got %d bytes, want %d (the kept frames as sent)", len(b), len(want))
	}
	f.waitEnd(t, 5*time.Second)
	tap.mu.Lock()
	defer tap.mu.Unlock()
	if len(tap.seen) != 8 {
		t.Fatalf("the tap saw %d whole messages, want 8", len(tap.seen))
	}
	if tap.seen[4] != `{"method":"A","params":{}}` || tap.seen[5] != `{"method":"B","sessionId":"gw"}` {
		t.Fatalf("fragmented messages put together as %.80q and %.80q", tap.seen[4], tap.seen[5])
	}
	if f.s.BytesDown() != int64(len(want)) {
		t.Fatalf("BytesDown %d, want the kept %d", f.s.BytesDown(), len(want))
	}
}

// TestTapEarlyStreams: a long message the tap is sure of from its head
// reaches the client before the provider has sent all of it.
func TestTapEarlyStreams(t *testing.T) {
	tap := &testTap{}
	f := newRelay(t, SessionOptions{Tap: tap})
	payload := "keep:" + strings.Repeat("y", 1<<20)
	msg := serverFrame(opText, true, []byte(payload))
	half := len(msg) / 2
	if _, err := f.provider.Write(msg[:half]); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, half)
	f.client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(f.client, buf); err != nil {
		t.Fatalf("the first half of a message the tap kept early did not come: %v", err)
	}
	if !bytes.Equal(buf, msg[:half]) {
		t.Fatal("the first half came changed")
	}
	f.provider.Write(msg[half:])
	rest := make([]byte, len(msg)-half)
	if _, err := io.ReadFull(f.client, rest); err != nil || !bytes.Equal(rest, msg[half:]) {
		t.Fatalf("the rest: %v", err)
	}
	tap.mu.Lock()
	defer tap.mu.Unlock()
	if tap.early != 1 || len(tap.seen) != 0 {
		t.Fatalf("early %d, whole %d: want 1 and 0", tap.early, len(tap.seen))
	}
}

// TestTapSendsBetweenClientMessages: the gateway's messages go to the
// provider between two of the client's messages, never inside one: the
// client sends a fragmented message slowly, the gateway sends meanwhile,
// and the provider reads the client's message whole, then the gateway's.
// A message sent while the client is silent goes at once.
func TestTapSendsBetweenClientMessages(t *testing.T) {
	f := newRelay(t, SessionOptions{Tap: &testTap{}})
	br := bufio.NewReader(f.provider)
	next := func() frame {
		t.Helper()
		f.provider.SetReadDeadline(time.Now().Add(5 * time.Second))
		fr, err := readFrame(br)
		if err != nil {
			t.Fatal(err)
		}
		return fr
	}
	// Silent client: the message goes now.
	if !f.s.Send([]byte(`{"id":1900000000,"method":"Target.attachToBrowserTarget"}`)) {
		t.Fatal("Send refused on a live session")
	}
	if fr := next(); !fr.masked || string(fr.payload) != `{"id":1900000000,"method":"Target.attachToBrowserTarget"}` {
		t.Fatalf("provider got %+v", fr)
	}
	// A fragmented client message, its first fragment and half a frame.
	first := appendFrame(nil, opText, []byte(`{"id":1,`), true)
	first[0] &^= 0x80
	second := appendFrame(nil, 0, []byte(`"method":"Page.navigate","params":{"url":"about:blank"}}`), true)
	f.client.Write(first)
	f.client.Write(second[:5])
	time.Sleep(50 * time.Millisecond)
	f.s.Send([]byte(`{"id":1900000001}`))
	time.Sleep(50 * time.Millisecond)
	f.client.Write(second[5:])
	// Then a whole client message and a ping.
	f.client.Write(appendFrame(nil, opText, []byte(`{"id":2}`), true))
	a, b := next(), next()
	if a.fin || string(a.payload) != `{"id":1,` || !b.fin || b.op != 0 {
		t.Fatalf("the client's fragments: %+v / %+v", a, b)
	}
	if c := next(); string(c.payload) != `{"id":1900000001}` {
		t.Fatalf("after the client's message the provider got %q, want the gateway's", c.payload)
	}
	if d := next(); string(d.payload) != `{"id":2}` {
		t.Fatalf("then %q", d.payload)
	}
	// The gateway's bytes are not the client's.
	if up := f.s.BytesUp(); up != int64(len(first)+len(second)+len(appendFrame(nil, opText, []byte(`{"id":2}`), true))) {
		t.Fatalf("BytesUp %d counts the gateway's own", up)
	}
}

// TestTapCloseInsideHeldMessage: the gateway closes the session while a
// message the tap has not judged is half read: nothing of it was written
// to the client, so its close frame goes at once.
func TestTapCloseInsideHeldMessage(t *testing.T) {
	f := newRelay(t, SessionOptions{Tap: &testTap{}})
	msg := serverFrame(opText, true, []byte(`{"method":"X","params":"`+strings.Repeat("z", 10000)+`"}`))
	f.provider.Write(msg[:3000])
	time.Sleep(50 * time.Millisecond)
	f.s.Close(CloseNormal, EndOperator)
	fromClient := answerClose(f.client, closeFrame(CloseNormal, "", true))
	go readFrames(f.provider)
	f.waitEnd(t, 5*time.Second)
	frames := <-fromClient
	if len(frames) != 1 || !isClose(frames[0], CloseNormal, EndOperator) {
		t.Fatalf("the client got %+v, want only the close frame", frames)
	}
}

// TestMessageEnd: the tracker copy stops at each message's end.
func TestMessageEnd(t *testing.T) {
	var p []byte
	a := appendFrame(nil, opText, []byte("one"), true)
	a[0] &^= 0x80
	p = append(p, a...)
	p = append(p, appendFrame(nil, opPing, nil, true)...)
	p = append(p, appendFrame(nil, 0, []byte("two"), true)...)
	end1 := len(p)
	p = append(p, appendFrame(nil, opText, []byte("three"), true)...)
	var tr frameTracker
	if n := tr.messageEnd(p); n != end1 {
		t.Fatalf("messageEnd %d, want %d", n, end1)
	}
	tr.advance(p[:end1], false)
	if n := tr.messageEnd(p[end1:]); n != len(p)-end1 {
		t.Fatalf("second messageEnd %d", n)
	}
	if n := tr.messageEnd(p[:2]); n != 2 || tr.hdrN != 0 {
		t.Fatal("messageEnd moved the tracker")
	}
}
