package upstreams

import (
	"bufio"
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestConverse: before the relay, the talk's messages go to the provider
// masked; its answers come back put together (fragments, a ping answered
// in between); a message that is not the talk's, and what came behind the
// talk's last one, are kept for the client, in order, as they came.
func TestConverse(t *testing.T) {
	gw, provider := tcpPair(t)
	a := &askTalk{}
	// Something the provider sent right behind its 101, not the talk's.
	early := frameBytes(0x1, []byte(`{"method":"Target.targetCreated"}`), false)
	up := &Conn{Conn: gw, Leftover: early}
	pr := bufio.NewReader(provider)
	behind := frameBytes(0x1, []byte(`{"method":"after"}`), false)
	done := make(chan error, 1)
	go func() { done <- Converse(up, a, 5*time.Second, 0) }()
	provider.SetReadDeadline(time.Now().Add(5 * time.Second))
	if f, err := readFrame(pr); err != nil || f.op != 0x1 || !f.masked || string(f.payload) != "ask-1" {
		t.Fatalf("provider got %+v %v", f, err)
	}
	writeFrame(provider, opPing, []byte("p"), false)
	if f, err := readFrame(pr); err != nil || f.op != opPong || !f.masked || string(f.payload) != "p" {
		t.Fatalf("provider got %+v %v, want a masked pong", f, err)
	}
	provider.Write(mkFrame(false, 0x1, []byte("answ"), false, 0))
	provider.Write(mkFrame(true, 0x0, []byte("er-1"), false, 0))
	if f, err := readFrame(pr); err != nil || string(f.payload) != "ask-2" {
		t.Fatalf("provider got %+v %v", f, err)
	}
	// The answer and what follows it in one write.
	provider.Write(append(frameBytes(0x1, []byte("answer-2"), false), behind...))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	heard, over := a.result()
	if !over || strings.Join(heard, "|") != `{"method":"Target.targetCreated"}|answer-1|answer-2` {
		t.Fatalf("heard %q over %v", heard, over)
	}
	// The early message (not the talk's) comes first, then what was
	// behind; nothing of the talk's own.
	if want := append(append([]byte(nil), early...), behind...); !bytes.HasPrefix(up.Leftover, early) || !bytes.Equal(up.Leftover, want) {
		// behind may not have been read yet by the time the talk was
		// over: then it is still on the connection.
		if !bytes.Equal(up.Leftover, early) {
			t.Fatalf("leftover % x", up.Leftover)
		}
	}
}

// TestConverseFails: a provider that closes, or never answers within the
// wait, fails the talk.
func TestConverseFails(t *testing.T) {
	gw, provider := tcpPair(t)
	go func() {
		readFrame(bufio.NewReader(provider))
		writeFrame(provider, opClose, []byte{0x03, 0xe8}, false)
	}()
	if err := Converse(&Conn{Conn: gw}, &askTalk{}, 5*time.Second, 0); !errors.Is(err, ErrConverseClosed) {
		t.Fatalf("closed: %v", err)
	}
	gw2, _ := tcpPair(t)
	start := time.Now()
	if err := Converse(&Conn{Conn: gw2}, &askTalk{}, 100*time.Millisecond, 0); err == nil || !isTimeout(err) {
		t.Fatalf("silent: %v", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatal("the wait was not kept")
	}
}
