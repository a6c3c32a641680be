package gateway

import (
	"encoding/json"
	"testing"
)

// TestHeldResetCommands: the reset commands are CDP commands with the
// gateway's own IDs, which Chrome accepts (at most 2^31-1).
func TestHeldResetCommands(t *testing.T) {
	want := []struct {
		id     int64
		method string
	}{{heldResetAutoAttachID, "Target.setAutoAttach"}, {heldResetDiscoverID, "Target.setDiscoverTargets"}}
	if len(heldResetCommands) != len(want) {
		t.Fatalf("%d reset commands", len(heldResetCommands))
	}
	for i, w := range want {
		var m struct {
			ID     int64          `json:"id"`
			Method string         `json:"method"`
			Params map[string]any `json:"params"`
		}
		if err := json.Unmarshal(heldResetCommands[i], &m); err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
		if m.ID != w.id || m.Method != w.method || m.ID > 1<<31-1 {
			t.Fatalf("command %d: %+v, want id %d method %s", i, m, w.id, w.method)
		}
		switch w.method {
		case "Target.setAutoAttach":
			if m.Params["autoAttach"] != false || m.Params["waitForDebuggerOnStart"] != false || m.Params["flatten"] != true {
				t.Fatalf("setAutoAttach params %v", m.Params)
			}
		case "Target.setDiscoverTargets":
			if m.Params["discover"] != false {
				t.Fatalf("setDiscoverTargets params %v", m.Params)
			}
		}
	}
}

// TestResetReplies: only a top-level answer (no CDP session) to a reset
// command counts, once per command; an error answer counts too.
func TestResetReplies(t *testing.T) {
	isReply := newResetReplies()
	for i, c := range []struct {
		msg  string
		want bool
	}{
		{`{"method":"Target.targetCreated","params":{"targetInfo":{"targetId":"2147480001"}}}`, false},
		{`{"method":"Runtime.consoleAPICalled","params":{"id":2147480001}}`, false},
		{`{"id":2147480001,"result":{},"sessionId":"AB12"}`, false},
		{`{"id":1,"result":{}}`, false},
		{`{"id":2147480001,"result":{}`, false},
		{`{"id":2147480001,"result":{}}`, true},
		{`{"id":2147480001,"result":{}}`, false}, // answered already
		{`{"id":21474800011,"result":{}}`, false},
		{`{"id":2147480002,"error":{"code":-32601,"message":"'Target.setDiscoverTargets' wasn't found"}}`, true},
		{`{"id":2147480002,"result":{}}`, false},
	} {
		if got := isReply([]byte(c.msg)); got != c.want {
			t.Fatalf("message %d %s: %v, want %v", i, c.msg, got, c.want)
		}
	}
	// Each join counts afresh.
	if !newResetReplies()([]byte(`{"result":{},"id":2147480002}`)) {
		t.Fatal("a new join does not take the answer")
	}
}
