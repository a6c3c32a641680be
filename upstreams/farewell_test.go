package upstreams

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"
)

// newFarewellRelay is a session with the BiDi farewell between a fake
// client and a fake provider; wait overrides the farewell's wait (0: the
// default).
func newFarewellRelay(t *testing.T, wait time.Duration, o SessionOptions) *holdRelay {
	t.Helper()
	o.Farewell = BiDiFarewell()
	if wait > 0 {
		o.Farewell.Wait = wait
	}
	return newHoldRelay(t, o)
}

// biDiEndID is the ID of the session.end command msg, checked to be one.
func biDiEndID(t *testing.T, msg []byte) string {
	t.Helper()
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params map[string]any  `json:"params"`
	}
	if err := json.Unmarshal(msg, &m); err != nil || m.Method != "session.end" || m.Params == nil || len(m.Params) != 0 {
		t.Fatalf("%s is not a session.end (%v)", msg, err)
	}
	return string(m.ID)
}

// wantFarewell reads the next frame the provider gets: the gateway's
// session.end, masked, in one text frame. It returns Firefox's answer to
// it.
func (h *holdRelay) wantFarewell(t *testing.T) []byte {
	t.Helper()
	f := h.providerFrame(t)
	if f.op != 0x1 || !f.fin || !f.masked || !bytes.Equal(f.payload, h.farewell.Message) {
		t.Fatalf("provider got opcode %#x masked %v %q, want the session.end of the gateway", f.op, f.masked, f.payload)
	}
	return []byte(`{"type":"success","id":` + biDiEndID(t, f.payload) + `,"result":{}}`)
}

// wantClosed reads the provider's next frame, a masked close with code,
// answers it and hangs up; the session then ends, OnEnd once, never
// parked for a resume.
func (h *holdRelay) wantClosed(t *testing.T, code int, reason string) {
	t.Helper()
	f := h.providerFrame(t)
	if !f.masked || !isClose(f, code, "") {
		t.Fatalf("provider got opcode %#x %q, want a masked close %d", f.op, f.payload, code)
	}
	h.provider.Write(closeFrame(code, "", false))
	h.provider.Close()
	h.waitEnd(t)
	if len(h.parks) != 0 {
		t.Fatal("OnPark was called for a session with a farewell")
	}
	if got := h.s.Reason(); got != reason || !h.s.ClientEnded() {
		t.Fatalf("reason %q (want %q), client ended %v", got, reason, h.s.ClientEnded())
	}
}

// TestFarewellOnClientClose: the client's close frame is not relayed: the
// provider gets the gateway's session.end first (behind what the client
// sent before), the client its close echoed; what the provider sends
// meanwhile is dropped, and once it answers session.end it gets the
// client's close code. Resume refuses the session all along.
func TestFarewellOnClientClose(t *testing.T) {
	for _, keepalive := range []time.Duration{0, time.Hour} {
		t.Run("keepalive "+keepalive.String(), func(t *testing.T) {
			h := newFarewellRelay(t, 0, SessionOptions{Keepalive: keepalive})
			h.client.Write(append(frameBytes(0x1, []byte(`{"id":1,"method":"session.status","params":{}}`), true),
				frameBytes(opClose, binary.BigEndian.AppendUint16(nil, 4001), true)...))
			if f := h.providerFrame(t); f.op != 0x1 || !bytes.Contains(f.payload, []byte("session.status")) {
				t.Fatalf("provider got %+v", f)
			}
			reply := h.wantFarewell(t)
			if got, want := readEnd(t, h.client), frameBytes(opClose, []byte{0x0f, 0xa1}, false); !bytes.Equal(got, want) {
				t.Fatalf("client got % x, want its close echoed, then the end", got)
			}
			if h.s.Parked() {
				t.Fatal("a session saying farewell reports parked")
			}
			if err := h.s.Resume(nil, nil); !errors.Is(err, ErrNotParked) {
				t.Fatalf("resume during the farewell: %v", err)
			}
			// An event, then the answer to a command of the client's,
			// then the answer: only the last one ends the wait.
			writeFrame(h.provider, 0x1, []byte(`{"type":"event","method":"log.entryAdded","params":{}}`), false)
			writeFrame(h.provider, 0x1, []byte(`{"type":"success","id":1,"result":{}}`), false)
			h.providerSilent(t, 100*time.Millisecond)
			h.provider.Write(frameBytes(0x1, reply, false))
			h.wantClosed(t, 4001, EndClientClosed)
			if fr, _ := h.s.ParkedDropped(); fr != 3 {
				t.Errorf("%d frames dropped after the client left, want 3", fr)
			}
		})
	}
}

// TestFarewellOnClientDrop: a client whose connection ends between two
// messages (FIN or RST) gets the same: session.end, then close 1001.
func TestFarewellOnClientDrop(t *testing.T) {
	for _, rst := range []bool{false, true} {
		name, reason := "FIN", EndClientClosed
		if rst {
			name, reason = "RST", EndClientError
		}
		t.Run(name, func(t *testing.T) {
			h := newFarewellRelay(t, 0, SessionOptions{})
			writeFrame(h.client, 0x1, []byte(`{"id":7,"method":"browsingContext.getTree","params":{}}`), true)
			h.providerFrame(t)
			if rst {
				resetConn(h.client)
			} else {
				h.client.Close()
			}
			reply := h.wantFarewell(t)
			// The answer in pieces, behind a message too long to be it.
			big := mkFrame(true, 0x1, bytes.Repeat([]byte("x"), MaxReplyMessage+10), false, 0)
			stream := append(big, frameBytes(0x1, reply, false)...)
			for len(stream) > 0 {
				n := min(len(stream), 1000)
				h.provider.Write(stream[:n])
				stream = stream[n:]
			}
			h.wantClosed(t, CloseGoingAway, reason)
		})
	}
}

// TestFarewellUnanswered: a provider that never answers session.end gets
// its close frame once the wait is over.
func TestFarewellUnanswered(t *testing.T) {
	h := newFarewellRelay(t, 20*time.Millisecond, SessionOptions{})
	h.client.Write(closeFrame(1000, "", true))
	h.wantFarewell(t)
	writeFrame(h.provider, 0x1, []byte(`{"type":"success","id":2,"result":{}}`), false)
	h.wantClosed(t, 1000, EndClientClosed)
}

// TestFarewellFragmentedReply: the answer may come as a fragmented message,
// with a ping in between, which the gateway answers as the client would.
func TestFarewellFragmentedReply(t *testing.T) {
	h := newFarewellRelay(t, 0, SessionOptions{})
	h.client.Close()
	reply := h.wantFarewell(t)
	half := len(reply) / 2
	h.provider.Write(mkFrame(false, 0x1, reply[:half], false, 0))
	writeFrame(h.provider, opPing, []byte("p1"), false)
	if f := h.providerFrame(t); f.op != opPong || !f.masked || string(f.payload) != "p1" {
		t.Fatalf("provider got %+v, want a masked pong", f)
	}
	h.provider.Write(mkFrame(true, 0x0, reply[half:], false, 0))
	h.wantClosed(t, CloseGoingAway, EndClientClosed)
}

// TestFarewellProviderClosesFirst: when the provider ends the session (its
// close frame, relayed to the client), the client's answer goes to it as
// it is, and no session.end.
func TestFarewellProviderClosesFirst(t *testing.T) {
	h := newFarewellRelay(t, 0, SessionOptions{})
	writeFrame(h.provider, opClose, binary.BigEndian.AppendUint16(nil, 1000), false)
	cr := bufio.NewReader(h.client)
	h.client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if f, err := readFrame(cr); err != nil || !isClose(f, 1000, "") {
		t.Fatalf("client got %+v %v", f, err)
	}
	h.client.Write(closeFrame(1000, "", true))
	f := h.providerFrame(t)
	if !isClose(f, 1000, "") {
		t.Fatalf("provider got opcode %#x %q, want the client's close", f.op, f.payload)
	}
	h.provider.Close()
	h.client.Close()
	h.waitEnd(t)
	if h.s.Reason() != EndProviderClosed {
		t.Fatalf("reason %q", h.s.Reason())
	}
}

// TestFarewellGatewayClose: when the gateway ends the session itself, the
// provider gets session.end right before its close frame.
func TestFarewellGatewayClose(t *testing.T) {
	h := newFarewellRelay(t, 0, SessionOptions{})
	writeFrame(h.client, 0x1, []byte(`{"id":1,"method":"session.status","params":{}}`), true)
	h.providerFrame(t)
	h.s.Close(CloseNormal, EndOperator)
	// The client answers the gateway's close frame at once (its answer
	// may reach the relay before the relay's read learns that the
	// session closes: it is not relayed).
	cr := bufio.NewReader(h.client)
	h.client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if f, err := readFrame(cr); err != nil || !isClose(f, CloseNormal, EndOperator) {
		t.Fatalf("client got %+v %v, want the gateway's close", f, err)
	}
	h.client.Write(closeFrame(1000, "", true))
	h.wantFarewell(t)
	f := h.providerFrame(t)
	if !f.masked || !isClose(f, CloseNormal, EndOperator) {
		t.Fatalf("provider got opcode %#x %q, want a masked close", f.op, f.payload)
	}
	h.provider.Write(closeFrame(1000, "", false))
	h.provider.Close()
	h.waitEnd(t)
	if fs := readFrames(cr); len(fs) != 0 {
		t.Fatalf("client got %+v after the close", fs)
	}
	if h.s.Reason() != EndOperator || h.s.ClientEnded() {
		t.Fatalf("reason %q, client ended %v", h.s.Reason(), h.s.ClientEnded())
	}
}

// TestBiDiFarewellID: each session's session.end has an ID of its own,
// drawn from the upper half of the IDs BiDi allows (far above what
// clients count up to, and unknown to them); only a message with that ID
// answers it, success or error, not one with the largest ID.
func TestBiDiFarewellID(t *testing.T) {
	seen := map[string]bool{}
	for range 50 {
		f := BiDiFarewell()
		id := biDiEndID(t, f.Message)
		n, err := strconv.ParseInt(id, 10, 64)
		if err != nil || n < 1<<52 || n > 1<<53-1 {
			t.Fatalf("session.end ID %s, want one in [2^52, 2^53-1]", id)
		}
		if seen[id] {
			t.Fatalf("two sessions with the session.end ID %s", id)
		}
		seen[id] = true
		if f.Wait != DefaultFarewellWait {
			t.Errorf("wait %v", f.Wait)
		}
		for msg, want := range map[string]bool{
			`{"type":"success","id":` + id + `,"result":{}}`:                              true,
			`{"type":"error","id":` + id + `,"error":"invalid session id","message":"x"}`: true,
			`{"id":` + id + `}`:                                     true,
			`{"type":"success","id":1,"result":{}}`:                 false,
			`{"type":"success","id":9007199254740991,"result":{}}`:  false,
			`{"type":"success","id":` + id + `0}`:                   false,
			`{"type":"success","id":"` + id + `"}`:                  false,
			`{"type":"error","id":null,"error":"invalid argument"}`: false,
			`{"type":"event","method":"session.end"}`:               false,
			`not json ` + id:                                        false,
			``:                                                      false,
		} {
			if got := f.IsReply([]byte(msg)); got != want {
				t.Errorf("%s: %v, want %v", msg, got, want)
			}
		}
	}
}
