package browserfailover_test

// In-process tests of recording with fake CDP providers, for what no real
// browser shows: a provider that answers the gateway's attachment to the
// browser target with an error, and which sessions are recorded (the
// session option record honoured by every CDP provider once the handler
// records; a provider that records itself left to it).

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/status"
)

// fakeCDP is a CDP provider that answers every command with its method's
// name, and the attachment to the browser target with an error; it notes
// the methods it was sent.
type fakeCDP struct {
	srv     *httptest.Server
	mu      sync.Mutex
	methods []string
}

func newFakeCDP(t *testing.T) *fakeCDP {
	f := &fakeCDP{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := context.Background()
		for {
			_, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			var m struct {
				ID        int64  `json:"id"`
				Method    string `json:"method"`
				SessionID string `json:"sessionId"`
			}
			json.Unmarshal(b, &m)
			f.mu.Lock()
			f.methods = append(f.methods, m.Method)
			f.mu.Unlock()
			answer := fmt.Sprintf(`{"id":%d,"result":{"method":%q}}`, m.ID, m.Method)
			if m.Method == "Target.attachToBrowserTarget" {
				answer = fmt.Sprintf(`{"id":%d,"error":{"code":-32000,"message":"Not allowed"}}`, m.ID)
			}
			if c.Write(ctx, websocket.MessageText, []byte(answer)) != nil {
				return
			}
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeCDP) url() string {
	return "ws://" + f.srv.Listener.Addr().(*net.TCPAddr).String() + "/devtools/browser/x"
}

func (f *fakeCDP) sent() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.methods...)
}

// cdpRoundTrip sends one command and reads its answer.
func cdpRoundTrip(t *testing.T, c *websocket.Conn, id int, method string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte(fmt.Sprintf(`{"id":%d,"method":%q}`, id, method))); err != nil {
		t.Fatal(err)
	}
	_, b, err := c.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sessionRecording is the sessions list's recording of session id.
func sessionRecording(t *testing.T, g *testgw.Gateway, id string) any {
	t.Helper()
	_, b, _ := g.AdminDo(http.MethodGet, status.SessionsPath, nil)
	var list status.Sessions
	json.Unmarshal(b, &list)
	for _, s := range list.Sessions {
		if s.ID == id {
			return s.Recording
		}
	}
	t.Fatalf("no session %s in %s", id, b)
	return nil
}

// TestRecordingRefusedByProvider: a provider that answers the gateway's
// attachment to the browser target with an error: the client asked for
// record, gets its session, sees nothing of the refusal (its own command's
// answer first), and the session runs unrecorded, the sessions list and
// its end entry saying why; the gateway sends nothing more of its own.
func TestRecordingRefusedByProvider(t *testing.T) {
	f := newFakeCDP(t)
	g := testgw.Start(t, fmt.Sprintf(`{"handler":"browser_failover","providers":[{"name":"fake","url":%q,"protocol":"cdp"}],"recording":{}}`, f.url()))
	c, resp, err := dial(t, g.WS("/?bf_record=true"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	id := resp.Header.Get("Browser-Failover-Session")
	if got := cdpRoundTrip(t, c, 1, "Browser.getVersion"); got != `{"id":1,"result":{"method":"Browser.getVersion"}}` {
		t.Fatalf("the client got %s", got)
	}
	rec, _ := sessionRecording(t, g, id).(string)
	if !strings.HasPrefix(rec, "unavailable: ") || !strings.Contains(rec, "Not allowed") {
		t.Fatalf("the sessions list's recording: %q", rec)
	}
	if got := cdpRoundTrip(t, c, 2, "Page.navigate"); !strings.Contains(got, `"id":2`) {
		t.Fatalf("second answer %s", got)
	}
	c.Close(websocket.StatusNormalClosure, "")
	testgw.Eventually(t, 10*time.Second, "the session's end", func() bool { return len(g.LogEntries("session ended")) == 1 })
	if rec, _ := g.LogEntries("session ended")[0]["recording"].(string); !strings.HasPrefix(rec, "unavailable: ") || !strings.Contains(rec, "Not allowed") {
		t.Fatalf("the end entry's recording: %q", rec)
	}
	if got := strings.Join(f.sent(), " "); got != "Target.attachToBrowserTarget Browser.getVersion Page.navigate" {
		t.Fatalf("the provider was sent %s", got)
	}
}

// TestRecordWhichSessions: the session option record goes to a provider
// that does not support it only when the handler records (else 502 at
// once); a provider that supports record records itself, and the gateway
// does not take part; a session whose client did not ask is not recorded
// under sessions asked.
func TestRecordWhichSessions(t *testing.T) {
	f := newFakeCDP(t)
	plain := fmt.Sprintf(`{"name":"fake","url":%q,"protocol":"cdp"}`, f.url())
	g := testgw.Start(t, `{"handler":"browser_failover","providers":[`+plain+`]}`)
	if code := refusedAt(t, g, "/?bf_record=true"); code != http.StatusBadGateway {
		t.Fatalf("record without recording: %d, want 502", code)
	}
	if err := g.Reload(`{"handler":"browser_failover","providers":[` + plain + `],"recording":{}}`); err != nil {
		t.Fatal(err)
	}
	session := func(path string) (rec any, sent []string) {
		t.Helper()
		before := len(f.sent())
		c, resp, err := dial(t, g.WS(path), nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		cdpRoundTrip(t, c, 1, "Browser.getVersion")
		rec = sessionRecording(t, g, resp.Header.Get("Browser-Failover-Session"))
		c.Close(websocket.StatusNormalClosure, "")
		return rec, f.sent()[before:]
	}
	if rec, sent := session("/?bf_record=true"); rec == nil || sent[0] != "Target.attachToBrowserTarget" {
		t.Fatalf("asked: recording %v, provider sent %v", rec, sent)
	}
	if rec, sent := session("/"); rec != nil || strings.Join(sent, " ") != "Browser.getVersion" {
		t.Fatalf("not asked: recording %v, provider sent %v", rec, sent)
	}
	own := fmt.Sprintf(`{"name":"fake","url":%q,"protocol":"cdp","supports":["record"]}`, f.url())
	if err := g.Reload(`{"handler":"browser_failover","providers":[` + own + `],"recording":{"sessions":"all"}}`); err != nil {
		t.Fatal(err)
	}
	if rec, sent := session("/?bf_record=true"); rec != nil || strings.Join(sent, " ") != "Browser.getVersion" {
		t.Fatalf("a provider that records: recording %v, provider sent %v", rec, sent)
	}
	if rec, sent := session("/"); rec == nil || sent[0] != "Target.attachToBrowserTarget" {
		t.Fatalf("sessions all: recording %v, provider sent %v", rec, sent)
	}
	// The two recordings are written whole (each one's meta stored with
	// its end) before the test's storage goes.
	testgw.Eventually(t, 10*time.Second, "the two recordings ended", func() bool {
		_, b, _ := g.AdminDo(http.MethodGet, status.RecordingsPath, nil)
		var list status.RecordingList
		if json.Unmarshal(b, &list) != nil || len(list.Recordings) != 2 {
			return false
		}
		for _, r := range list.Recordings {
			if r.Live || r.End == nil {
				return false
			}
		}
		return true
	})
}
