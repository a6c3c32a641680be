package cdp

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// sink records what the participant tells it.
type sink struct {
	targets     []string
	frames      []string
	unavailable string
}

func (s *sink) Target(id, url, title string) { s.targets = append(s.targets, id+" "+url+" "+title) }
func (s *sink) Frame(target string, data []byte, at time.Time) {
	s.frames = append(s.frames, fmt.Sprintf("%s %s %d", target, data, at.UnixMilli()))
}
func (s *sink) Unavailable(why string) { s.unavailable = why }

// sent is one command of the participant's as the provider reads it.
type sent struct {
	ID        int64           `json:"id"`
	Method    string          `json:"method"`
	Params    json.RawMessage `json:"params"`
	SessionID string          `json:"sessionId"`
}

type harness struct {
	t    *testing.T
	p    *Participant
	sink *sink
	out  []sent
}

func newHarness(t *testing.T) *harness {
	h := &harness{t: t, sink: &sink{}}
	h.p = New(Screencast{Format: "jpeg", Quality: 70, MaxWidth: 1280, MaxHeight: 800, EveryNthFrame: 1}, h.sink)
	h.p.Start(func(b []byte) bool {
		var s sent
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatalf("the participant sent %s: %v", b, err)
		}
		h.out = append(h.out, s)
		return true
	})
	return h
}

// last is the participant's last command, which must be method.
func (h *harness) last(method string) sent {
	h.t.Helper()
	if len(h.out) == 0 || h.out[len(h.out)-1].Method != method {
		h.t.Fatalf("the participant's last command: %+v, want %s", h.out, method)
	}
	return h.out[len(h.out)-1]
}

// lastOf is the participant's last command of method.
func (h *harness) lastOf(method string) sent {
	h.t.Helper()
	for i := len(h.out) - 1; i >= 0; i-- {
		if h.out[i].Method == method {
			return h.out[i]
		}
	}
	h.t.Fatalf("the participant sent no %s: %+v", method, h.out)
	return sent{}
}

// keeps asserts the participant's verdict on msg.
func (h *harness) keeps(msg string, want bool) {
	h.t.Helper()
	if got := h.p.Message(true, []byte(msg)); got != want {
		h.t.Fatalf("Message(%.120s) = %v, want %v", msg, got, want)
	}
}

// attached runs the participant up to a followed page: browser session
// "GWB", page session "GWP" of target "T1".
func (h *harness) attached() {
	h.t.Helper()
	a := h.last("Target.attachToBrowserTarget")
	if a.ID < idBase || a.ID >= idBase+idSpan || a.SessionID != "" {
		h.t.Fatalf("attach sent with ID %d in session %q", a.ID, a.SessionID)
	}
	// Chrome's event of the attachment comes on the root session first.
	h.keeps(`{"method":"Target.attachedToTarget","params":{"sessionId":"GWB","targetInfo":{"targetId":"B","type":"browser","title":"","url":"","attached":true},"waitingForDebugger":false}}`, false)
	h.keeps(fmt.Sprintf(`{"id":%d,"result":{"sessionId":"GWB"}}`, a.ID), false)
	n := len(h.out)
	if n < 3 || h.out[n-2].Method != "Target.setAutoAttach" || h.out[n-1].Method != "Target.setDiscoverTargets" || h.out[n-2].SessionID != "GWB" {
		h.t.Fatalf("after the attachment: %+v", h.out)
	}
	if !strings.Contains(string(h.out[n-2].Params), `"flatten":true`) || !strings.Contains(string(h.out[n-2].Params), `"waitForDebuggerOnStart":false`) {
		h.t.Fatalf("setAutoAttach %s", h.out[n-2].Params)
	}
	h.keeps(fmt.Sprintf(`{"id":%d,"result":{},"sessionId":"GWB"}`, h.out[n-2].ID), false)
	h.keeps(`{"method":"Target.attachedToTarget","params":{"sessionId":"GWP","targetInfo":{"targetId":"T1","type":"page","title":"one","url":"data:text/html,one","attached":true},"waitingForDebugger":false},"sessionId":"GWB"}`, false)
	sc := h.last("Page.startScreencast")
	if sc.SessionID != "GWP" || string(sc.Params) != `{"format":"jpeg","quality":70,"maxWidth":1280,"maxHeight":800,"everyNthFrame":1}` {
		h.t.Fatalf("screencast %+v", sc)
	}
}

// TestParticipantFollowsPagesAndTakesOutItsOwn: the participant's answers
// and events are taken out, the client's — the same methods in its own
// sessions, IDs near the participant's, its own attachment events — go
// on; frames are acknowledged in their session and handed on.
func TestParticipantFollowsPagesAndTakesOutItsOwn(t *testing.T) {
	h := newHarness(t)
	h.attached()
	if len(h.sink.targets) != 1 || h.sink.targets[0] != "T1 data:text/html,one one" {
		t.Fatalf("targets %v", h.sink.targets)
	}
	// A frame in the participant's page session.
	h.keeps(`{"method":"Page.screencastFrame","params":{"data":"QUJD","metadata":{"offsetTop":0,"pageScaleFactor":1,"deviceWidth":780,"deviceHeight":437,"scrollOffsetX":0,"scrollOffsetY":0,"timestamp":1796531287.548},"sessionId":7},"sessionId":"GWP"}`, false)
	ack := h.lastOf("Page.screencastFrameAck")
	if ack.SessionID != "GWP" || string(ack.Params) != `{"sessionId":7}` {
		t.Fatalf("ack %+v", ack)
	}
	// With its first frame, the page's title is asked for.
	info := h.last("Target.getTargetInfo")
	if info.SessionID != "GWB" || string(info.Params) != `{"targetId":"T1"}` {
		t.Fatalf("getTargetInfo %+v", info)
	}
	h.keeps(fmt.Sprintf(`{"id":%d,"result":{"targetInfo":{"targetId":"T1","type":"page","title":"One","url":"data:text/html,one"}},"sessionId":"GWB"}`, info.ID), false)
	if got := h.sink.targets[len(h.sink.targets)-1]; got != "T1 data:text/html,one One" {
		t.Fatalf("title from getTargetInfo: %q", got)
	}
	if len(h.sink.frames) != 1 || h.sink.frames[0] != "T1 QUJD 1796531287548" {
		t.Fatalf("frames %v", h.sink.frames)
	}
	// Its answer, its other events.
	h.keeps(fmt.Sprintf(`{"id":%d,"result":{},"sessionId":"GWP"}`, ack.ID), false)
	h.keeps(`{"method":"Page.screencastVisibilityChanged","params":{"visible":true},"sessionId":"GWP"}`, false)
	h.keeps(`{"method":"Target.targetInfoChanged","params":{"targetInfo":{"targetId":"T1","type":"page","title":"One!","url":"data:text/html,one","attached":true}},"sessionId":"GWB"}`, false)
	if h.sink.targets[len(h.sink.targets)-1] != "T1 data:text/html,one One!" {
		t.Fatalf("title change %v", h.sink.targets)
	}

	// The client's: the same methods in its own session, on the root.
	h.keeps(`{"method":"Page.screencastFrame","params":{"data":"WFla","metadata":{},"sessionId":1},"sessionId":"CLIENT1"}`, true)
	h.keeps(`{"method":"Target.attachedToTarget","params":{"sessionId":"CLIENT1","targetInfo":{"targetId":"T1","type":"page","title":"","url":"","attached":true},"waitingForDebugger":true}}`, true)
	h.keeps(`{"method":"Target.attachedToTarget","params":{"sessionId":"CLIENTB","targetInfo":{"targetId":"B","type":"browser","title":"","url":"","attached":true},"waitingForDebugger":false}}`, true)
	h.keeps(`{"method":"Target.targetCreated","params":{"targetInfo":{"targetId":"T1","type":"page","title":"","url":"","attached":true}}}`, true)
	h.keeps(`{"id":1,"result":{}}`, true)
	h.keeps(`{"id":5,"result":{},"sessionId":"CLIENT1"}`, true)
	// IDs next to the participant's, which it did not send: the
	// client's.
	h.keeps(fmt.Sprintf(`{"id":%d,"result":{}}`, h.p.nextID), true)
	h.keeps(fmt.Sprintf(`{"id":%d,"result":{}}`, h.out[0].ID-1), true)
	h.keeps(fmt.Sprintf(`{"id":%d,"result":{},"sessionId":"CLIENT1"}`, h.p.nextID+1), true)
	// An answer to one it sent, whatever session it names (a proxy in
	// front of the browser answering itself), is its own.
	h.keeps(fmt.Sprintf(`{"error":{"code":-32000,"message":"no"},"id":%d}`, ack.ID), false)
	// A client's events that mention "sessionId" elsewhere.
	h.keeps(`{"method":"Runtime.consoleAPICalled","params":{"args":[{"type":"string","value":"\",\"sessionId\":\"GWP\"}"}]}}`, true)
	h.keeps(`{"method":"Target.detachedFromTarget","params":{"sessionId":"CLIENT1","targetId":"T1"}}`, true)
	h.keeps(`not json`, true)
	if h.p.Message(false, []byte(`{"sessionId":"GWP"}`)) != true {
		t.Fatal("a binary message was taken")
	}

	// A popup: a second page is followed.
	h.keeps(`{"method":"Target.attachedToTarget","params":{"sessionId":"GWP2","targetInfo":{"targetId":"T2","type":"page","title":"","url":"about:blank","attached":true},"waitingForDebugger":false},"sessionId":"GWB"}`, false)
	if sc := h.last("Page.startScreencast"); sc.SessionID != "GWP2" {
		t.Fatalf("popup screencast in %q", sc.SessionID)
	}
	// A worker is let go.
	h.keeps(`{"method":"Target.attachedToTarget","params":{"sessionId":"GWW","targetInfo":{"targetId":"W","type":"service_worker","title":"","url":"","attached":true},"waitingForDebugger":false},"sessionId":"GWB"}`, false)
	if d := h.last("Target.detachFromTarget"); d.SessionID != "GWB" || !strings.Contains(string(d.Params), "GWW") {
		t.Fatalf("detach %+v", d)
	}
	// Messages in a layout other than Chrome's are read whole.
	h.keeps(`{"sessionId":"GWP2","method":"Page.screencastVisibilityChanged","params":{"visible":false}}`, false)
	h.keeps(` {"method":"X","sessionId":"CLIENT9"}`, true)
	if h.sink.unavailable != "" {
		t.Fatalf("unavailable %q", h.sink.unavailable)
	}
}

// TestParticipantEarly: the client's answers are told by their head; the
// participant's are not.
func TestParticipantEarly(t *testing.T) {
	h := newHarness(t)
	attach := h.out[0].ID
	pad := strings.Repeat(" ", 64)
	head := func(s string) []byte { return []byte((s + pad)[:64]) }
	if keep, sure := h.p.Early(true, head(`{"id":12,"result":{"data":"`)); !keep || !sure {
		t.Fatal("a client's answer was not told early")
	}
	if _, sure := h.p.Early(true, head(fmt.Sprintf(`{"id":%d,"result":{`, attach))); sure {
		t.Fatal("the participant's answer was told early")
	}
	// An answer to one of its commands that it does not wait for (an
	// acknowledgement) is its own too.
	h.attached()
	h.keeps(`{"method":"Page.screencastFrame","params":{"data":"QUJD","metadata":{},"sessionId":1},"sessionId":"GWP"}`, false)
	ack := h.lastOf("Page.screencastFrameAck")
	if _, sure := h.p.Early(true, head(fmt.Sprintf(`{"id":%d,"result":{},"sessionId":"GWP"}`, ack.ID))); sure {
		t.Fatal("the answer to an acknowledgement was told early")
	}
	if keep, sure := h.p.Early(true, head(fmt.Sprintf(`{"id":%d,"result":{`, h.p.nextID))); !keep || !sure {
		t.Fatal("an ID above the participant's was not told early")
	}
	if _, sure := h.p.Early(true, head(`{"method":"Page.screencastFrame","params":{"data":"`)); sure {
		t.Fatal("an event was told early")
	}
}

// TestParticipantUnavailable: a browser that refuses the attachment (a
// page's endpoint) leaves the session unrecorded, with the reason; the
// refusal is taken out and nothing else is.
func TestParticipantUnavailable(t *testing.T) {
	h := newHarness(t)
	a := h.last("Target.attachToBrowserTarget")
	h.keeps(fmt.Sprintf(`{"id":%d,"error":{"code":-32000,"message":"Not allowed"}}`, a.ID), false)
	if !strings.HasPrefix(h.sink.unavailable, "unavailable: ") || !strings.Contains(h.sink.unavailable, "Not allowed") {
		t.Fatalf("unavailable %q", h.sink.unavailable)
	}
	if h.p.Stopped() == "" {
		t.Fatal("not stopped")
	}
	h.keeps(`{"method":"Target.attachedToTarget","params":{"sessionId":"X","targetInfo":{"targetId":"B","type":"browser"}}}`, true)
	if len(h.out) != 1 {
		t.Fatalf("the participant went on sending: %+v", h.out)
	}
}

// TestParticipantJoined: after a client joins a held session the
// participant attaches afresh; the old attachment's events are still its
// own.
func TestParticipantJoined(t *testing.T) {
	h := newHarness(t)
	h.attached()
	h.p.Joined()
	n := len(h.out)
	if h.out[n-2].Method != "Target.detachFromTarget" || h.out[n-1].Method != "Target.attachToBrowserTarget" {
		t.Fatalf("after Joined: %+v", h.out[n-2:])
	}
	h.keeps(`{"method":"Target.detachedFromTarget","params":{"sessionId":"GWB","targetId":"B"}}`, false)
	h.keeps(`{"method":"Page.screencastFrame","params":{"data":"QUJD","metadata":{},"sessionId":9},"sessionId":"GWP"}`, false)
	h.keeps(`{"method":"Target.attachedToTarget","params":{"sessionId":"GWB2","targetInfo":{"targetId":"B","type":"browser"}}}`, false)
	h.keeps(fmt.Sprintf(`{"id":%d,"result":{"sessionId":"GWB2"}}`, h.out[n-1].ID), false)
	if h.out[len(h.out)-2].Method != "Target.setAutoAttach" || h.out[len(h.out)-2].SessionID != "GWB2" {
		t.Fatalf("the new attachment: %+v", h.out[len(h.out)-2:])
	}
}

// TestTrailingSession reads the session only from a message's own last
// member.
func TestTrailingSession(t *testing.T) {
	for msg, want := range map[string]string{
		`{"id":1,"result":{},"sessionId":"ABC"}`:                       "ABC",
		`{"method":"M","params":{},"sessionId":"ABC"}` + "\n":          "ABC",
		`{"method":"M","params":{"sessionId":"ABC"}}`:                  "",
		`{"method":"M","params":{"x":"a,\"sessionId\":\"ABC\"}"}}`:     "",
		`{"method":"M","params":{"v":"\",\"sessionId\":\"ABC\""}}`:     "",
		`{"method":"M","params":{},"sessionId":"A\"BC"}`:               "",
		`{"sessionId":"ABC"}`:                                          "",
		`{"method":"M","params":{},"otherId":"ABC"}`:                   "",
		`{"method":"M","params":{"a":[1]},"sessionId":"0123456789AB"}`: "0123456789AB",
	} {
		if got := trailingSession([]byte(msg)); got != want {
			t.Errorf("trailingSession(%s) = %q, want %q", msg, got, want)
		}
	}
}
