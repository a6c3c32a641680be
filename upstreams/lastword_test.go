package upstreams

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// askTalk is a last word of two questions: "ask-1" at once, "ask-2" once
// "answer-1" came, over at "answer-2". It notes what it heard.
type askTalk struct {
	mu    sync.Mutex
	send  func([]byte) bool
	heard []string
	over  bool
}

func (a *askTalk) Begin(send func([]byte) bool) {
	a.mu.Lock()
	a.send = send
	a.mu.Unlock()
	send([]byte("ask-1"))
}

func (a *askTalk) Heard(msg []byte) (mine, over bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.heard = append(a.heard, string(msg))
	switch string(msg) {
	case "answer-1":
		a.send([]byte("ask-2"))
		return true, false
	case "answer-2":
		a.over = true
		return true, true
	}
	return false, false
}

func (a *askTalk) result() ([]string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.heard...), a.over
}

// newWordRelay is a session with a last word (askTalk) between a fake
// client and a fake provider.
func newWordRelay(t *testing.T, wait time.Duration, o SessionOptions) (*holdRelay, *askTalk) {
	t.Helper()
	a := &askTalk{}
	o.LastWord = &LastWord{Talk: a, Wait: wait}
	return newHoldRelay(t, o), a
}

// converse answers the last word as a provider would, with an event and
// a long message of the client's in between, and a ping (which the
// gateway answers as the client would).
func (h *holdRelay) converse(t *testing.T) {
	t.Helper()
	if f := h.providerFrame(t); f.op != 0x1 || !f.masked || string(f.payload) != "ask-1" {
		t.Fatalf("provider got opcode %#x masked %v %q, want ask-1", f.op, f.masked, f.payload)
	}
	writeFrame(h.provider, 0x1, []byte(`{"method":"Page.loadEventFired"}`), false)
	writeFrame(h.provider, opPing, []byte("p"), false)
	if f := h.providerFrame(t); f.op != opPong || !f.masked || string(f.payload) != "p" {
		t.Fatalf("provider got %+v, want a masked pong", f)
	}
	writeFrame(h.provider, 0x1, []byte("answer-1"), false)
	if f := h.providerFrame(t); f.op != 0x1 || !f.masked || string(f.payload) != "ask-2" {
		t.Fatalf("provider got %q, want ask-2", f.payload)
	}
	// The answer in two fragments.
	h.provider.Write(mkFrame(false, 0x1, []byte("answer"), false, 0))
	h.provider.Write(mkFrame(true, 0x0, []byte("-2"), false, 0))
}

// TestLastWordOnClientClose: the client's close frame is not relayed; the
// client gets it echoed and its connection closed; the provider gets the
// gateway's last word, whose answers the talk hears (asking more), then
// the client's close code. The session is never parked for a resume.
func TestLastWordOnClientClose(t *testing.T) {
	h, a := newWordRelay(t, 0, SessionOptions{})
	writeFrame(h.client, 0x1, []byte(`{"id":1,"method":"Browser.getVersion"}`), true)
	if f := h.providerFrame(t); !strings.Contains(string(f.payload), "getVersion") {
		t.Fatalf("provider got %q", f.payload)
	}
	h.client.Write(frameBytes(opClose, binary.BigEndian.AppendUint16(nil, 4001), true))
	h.converse(t)
	if got, want := readEnd(t, h.client), frameBytes(opClose, []byte{0x0f, 0xa1}, false); !bytes.Equal(got, want) {
		t.Fatalf("client got % x, want its close echoed, then the end", got)
	}
	if h.s.Parked() {
		t.Fatal("a session saying its last word reports parked")
	}
	if err := h.s.Resume(nil, nil); !errors.Is(err, ErrNotParked) {
		t.Fatalf("resume during the last word: %v", err)
	}
	h.wantClosed(t, 4001, EndClientClosed)
	heard, over := a.result()
	if !over || strings.Join(heard, "|") != `{"method":"Page.loadEventFired"}|answer-1|answer-2` {
		t.Fatalf("heard %q, over %v", heard, over)
	}
}

// TestLastWordOnClientDrop: a client whose connection ends in the middle
// of a message has it completed for the provider, then the last word.
func TestLastWordOnClientDrop(t *testing.T) {
	h, a := newWordRelay(t, 0, SessionOptions{})
	msg := []byte(`{"id":2,"method":"Runtime.evaluate","params":{"expression":"1+1"}}`)
	whole := frameBytes(0x1, msg, true)
	h.client.Write(whole[:len(whole)-10])
	time.Sleep(50 * time.Millisecond)
	h.client.Close()
	if f := h.providerFrame(t); f.op != 0x1 || len(f.payload) != len(msg) {
		t.Fatalf("provider got opcode %#x %d bytes %q, want the client message completed", f.op, len(f.payload), f.payload)
	}
	h.converse(t)
	h.wantClosed(t, CloseGoingAway, EndClientClosed)
	if _, over := a.result(); !over {
		t.Fatal("the last word was not over")
	}
}

// TestLastWordGatewayClose: when the gateway ends a live session, the
// client gets its close frame first; the provider gets nothing more of the
// client's (no close frame), then the last word, then the gateway's close
// frame with its code and reason.
func TestLastWordGatewayClose(t *testing.T) {
	for _, answer := range []bool{true, false} {
		t.Run(map[bool]string{true: "client answers", false: "client silent"}[answer], func(t *testing.T) {
			h, a := newWordRelay(t, 0, SessionOptions{})
			writeFrame(h.client, 0x1, []byte(`{"id":1,"method":"Browser.getVersion"}`), true)
			h.providerFrame(t)
			h.s.Close(CloseNormal, EndIdle)
			cr := bufio.NewReader(h.client)
			h.client.SetReadDeadline(time.Now().Add(5 * time.Second))
			if f, err := readFrame(cr); err != nil || !isClose(f, CloseNormal, EndIdle) {
				t.Fatalf("client got %+v %v, want the gateway's close", f, err)
			}
			if answer {
				h.client.Write(closeFrame(1000, "", true))
			}
			h.converse(t)
			f := h.providerFrame(t)
			if !f.masked || !isClose(f, CloseNormal, EndIdle) {
				t.Fatalf("provider got opcode %#x %q, want the gateway's masked close", f.op, f.payload)
			}
			h.provider.Write(closeFrame(1000, "", false))
			h.provider.Close()
			h.waitEnd(t)
			if h.s.Reason() != EndIdle || h.s.ClientEnded() {
				t.Fatalf("reason %q, client ended %v", h.s.Reason(), h.s.ClientEnded())
			}
			if _, over := a.result(); !over {
				t.Fatal("the last word was not over")
			}
		})
	}
}

// TestLastWordGatewayCloseMidMessage: a gateway close while the client is
// in the middle of a message that stalls: the message is completed for
// the provider, then the last word.
func TestLastWordGatewayCloseMidMessage(t *testing.T) {
	h, _ := newWordRelay(t, 0, SessionOptions{})
	msg := bytes.Repeat([]byte("x"), 300)
	whole := mkFrame(true, 0x1, msg, true, 0)
	h.client.Write(whole[:100])
	time.Sleep(50 * time.Millisecond)
	h.s.Close(CloseGoingAway, EndShutdown)
	if f := h.providerFrame(t); f.op != 0x1 || len(f.payload) != len(msg) {
		t.Fatalf("provider got opcode %#x %d bytes %q, want the client message completed", f.op, len(f.payload), f.payload)
	}
	h.converse(t)
	if f := h.providerFrame(t); !isClose(f, CloseGoingAway, EndShutdown) {
		t.Fatalf("provider got %+v", f)
	}
	h.provider.Write(closeFrame(1001, "", false))
	h.waitEnd(t)
}

// TestLastWordUnanswered: a provider that never answers gets its close
// frame once the wait is over.
func TestLastWordUnanswered(t *testing.T) {
	h, a := newWordRelay(t, 50*time.Millisecond, SessionOptions{})
	h.client.Write(closeFrame(1000, "", true))
	if f := h.providerFrame(t); string(f.payload) != "ask-1" {
		t.Fatalf("provider got %q", f.payload)
	}
	h.wantClosed(t, 1000, EndClientClosed)
	if _, over := a.result(); over {
		t.Fatal("over without its answers")
	}
}

// TestLastWordProviderClosesFirst: a provider that ends the session hears
// no last word: its close goes to the client, the client's answer to it.
func TestLastWordProviderClosesFirst(t *testing.T) {
	h, a := newWordRelay(t, 0, SessionOptions{})
	writeFrame(h.provider, opClose, binary.BigEndian.AppendUint16(nil, 1000), false)
	cr := bufio.NewReader(h.client)
	h.client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if f, err := readFrame(cr); err != nil || !isClose(f, 1000, "") {
		t.Fatalf("client got %+v %v", f, err)
	}
	h.client.Write(closeFrame(1000, "", true))
	if f := h.providerFrame(t); !isClose(f, 1000, "") {
		t.Fatalf("provider got opcode %#x %q, want the client's close", f.op, f.payload)
	}
	h.provider.Close()
	h.client.Close()
	h.waitEnd(t)
	if heard, _ := a.result(); len(heard) != 0 || a.send != nil {
		t.Fatalf("a last word began: %q", heard)
	}
}

// TestLastWordWithHold: with hold, the client's leaving parks the session
// (no last word: a resume may come); a resumed client relays as before;
// when the parked session is closed (its window over), the last word
// comes before the close frame.
func TestLastWordWithHold(t *testing.T) {
	h, a := newWordRelay(t, 0, SessionOptions{Hold: true})
	h.client.Write(closeFrame(4001, "brb", true))
	h.waitPark(t)
	h.providerSilent(t, 100*time.Millisecond)
	c := h.resume(t, nil)
	writeFrame(c, 0x1, []byte(`{"id":3,"method":"Browser.getVersion"}`), true)
	if f := h.providerFrame(t); !strings.Contains(string(f.payload), "getVersion") {
		t.Fatalf("provider got %q after the resume", f.payload)
	}
	c.Write(closeFrame(4002, "", true))
	h.waitPark(t)
	h.s.Close(h.s.ClientCloseCode(), "resume window over")
	h.converse(t)
	if f := h.providerFrame(t); !f.masked || !isClose(f, 4002, "resume window over") {
		t.Fatalf("provider got %+v", f)
	}
	h.provider.Write(closeFrame(4002, "", false))
	h.waitEnd(t)
	if _, over := a.result(); !over {
		t.Fatal("the last word was not over")
	}
}
