package browserfailover_test

// WebDriver sessions over HTTP through a real Caddy, against fake WebDriver
// servers: the create with failover and its answer rewritten, commands
// forwarded to the provider session, the session's ends (the client's
// DELETE, idleness, an operator), sockets, the queue, and the errors
// WebDriver clients get.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/status"
)

// wdProvider is a webdriver provider's JSON.
func wdProvider(name, url, extra string) string {
	if extra != "" {
		extra = "," + extra
	}
	return provider(name, url, `"protocol":"webdriver"`+extra)
}

// wdCall sends one WebDriver request and returns its status and decoded
// value.
func wdCall(t *testing.T, method, url string, body any, hdr http.Header) (int, map[string]any, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var v struct {
		Value any `json:"value"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s %s: %d, not WebDriver JSON: %s", method, url, resp.StatusCode, raw)
	}
	m, _ := v.Value.(map[string]any)
	return resp.StatusCode, m, resp.Header
}

// newSession is a create's body for browser (webSocketUrl when ws).
func newSession(browser string, ws bool) map[string]any {
	always := map[string]any{"browserName": browser}
	if ws {
		always["webSocketUrl"] = true
	}
	return map[string]any{"capabilities": map[string]any{"alwaysMatch": always}}
}

// sessionsList reads the admin API's sessions.
func sessionsList(t *testing.T, g *testgw.Gateway) []status.Session {
	t.Helper()
	code, b, err := g.AdminDo(http.MethodGet, status.SessionsPath, nil)
	if err != nil || code != 200 {
		t.Fatalf("sessions: %d %v", code, err)
	}
	var l status.Sessions
	if err := json.Unmarshal(b, &l); err != nil {
		t.Fatal(err)
	}
	return l.Sessions
}

// TestWebDriverSession: a create through the gateway gets the provider's
// answer with the session's path ID (the client's secret, not the ID
// operators see, which is on Browser-Failover-Session) and socket URL and
// none of the provider's address or session ID; commands reach the
// provider session with their method, query and body on kept-alive
// connections; the sessions list shows it under the operator's ID, which
// names no session in a path; the client's DELETE ends it (the provider
// gets that one DELETE), and later commands get invalid session id.
func TestWebDriverSession(t *testing.T) {
	f := fakes.NewWebDriver("/wd/hub")
	defer f.Close()
	g := testgw.Start(t, handler("", wdProvider("wd-a", "http://u:s3cret-key@"+f.Addr+"/wd/hub", `"max_concurrent":2,"cost":{"amount":0.5,"per":"session"}`)))
	base := g.HTTP("/wd/hub")

	code, v, hdr := wdCall(t, http.MethodPost, base+"/session", newSession("chrome", true), nil)
	if code != 200 {
		t.Fatalf("create: %d %v", code, v)
	}
	id, _ := v["sessionId"].(string)
	op := hdr.Get("Browser-Failover-Session")
	if len(id) < 22 || op == "" || op == id {
		t.Fatalf("session ID %q, header %q", id, op)
	}
	live := f.Live()
	if len(live) != 1 || live[0] == id {
		t.Fatalf("provider sessions %v, gateway's %s", live, id)
	}
	pid := live[0]
	raw, _ := json.Marshal(v)
	for _, leak := range []string{pid, f.Addr, "45678", "s3cret-key", "debuggerAddress"} {
		if strings.Contains(string(raw), leak) {
			t.Errorf("the create answer holds %q: %s", leak, raw)
		}
	}
	caps, _ := v["capabilities"].(map[string]any)
	if want := "ws://" + g.Addr + "/wd/hub/session/" + id; caps["webSocketUrl"] != want {
		t.Errorf("webSocketUrl %v, want %s", caps["webSocketUrl"], want)
	}
	// The provider got the URL's credentials as Basic auth.
	if reqs := f.Requests(); len(reqs) == 0 || !strings.HasPrefix(reqs[0].Header.Get("Authorization"), "Basic ") {
		t.Fatalf("create at the provider: %+v", reqs)
	}

	conns := f.Conns()
	code, v, _ = wdCall(t, http.MethodGet, base+"/session/"+id+"/title?x=1", nil, nil)
	if reqs := f.Requests(); reqs[len(reqs)-1].URI != "/wd/hub/session/"+pid+"/title?x=1" {
		t.Fatalf("command at the provider: %s", reqs[len(reqs)-1].URI)
	}
	// The provider's answer names its session ID: the client reads its own.
	if code != 200 || v["uri"] != "/wd/hub/session/"+id+"/title?x=1" || v["method"] != "GET" {
		t.Fatalf("command: %d %v", code, v)
	}
	code, v, _ = wdCall(t, http.MethodPost, base+"/session/"+id+"/url", map[string]string{"url": "about:blank"}, nil)
	if code != 200 || v["body"] != `{"url":"about:blank"}` {
		t.Fatalf("command with a body: %d %v", code, v)
	}
	if f.Conns() != conns {
		t.Errorf("commands opened %d new connections to the provider", f.Conns()-conns)
	}
	l := sessionsList(t, g)
	if len(l) != 1 || l[0].ID != op || l[0].Protocol != "webdriver" || l[0].Commands == nil || *l[0].Commands != 2 ||
		l[0].Browser == nil || *l[0].Browser != "chrome" || l[0].LastCommand == nil {
		t.Fatalf("sessions list %+v", l)
	}
	if p := providerStatus(t, g, "wd-a"); p.Active != 1 {
		t.Fatalf("active %d", p.Active)
	}
	// The operator's ID drives nothing.
	reqs := len(f.Requests())
	for _, m := range []string{http.MethodGet, http.MethodDelete} {
		if code, v, _ := wdCall(t, m, base+"/session/"+op+"/title", nil, nil); code != 404 || v["error"] != "invalid session id" {
			t.Fatalf("%s with the operator's ID: %d %v", m, code, v)
		}
	}
	if code, v, _ := wdCall(t, http.MethodDelete, base+"/session/"+op, nil, nil); code != 404 || v["error"] != "invalid session id" {
		t.Fatalf("DELETE with the operator's ID: %d %v", code, v)
	}
	if n := len(f.Requests()); n != reqs {
		t.Fatalf("the provider heard %d requests for the operator's ID", n-reqs)
	}

	code, _, _ = wdCall(t, http.MethodDelete, base+"/session/"+id, nil, nil)
	if code != 200 {
		t.Fatalf("delete: %d", code)
	}
	code, v, _ = wdCall(t, http.MethodGet, base+"/session/"+id+"/title", nil, nil)
	if code != 404 || v["error"] != "invalid session id" {
		t.Fatalf("after delete: %d %v", code, v)
	}
	testgw.Eventually(t, 5*time.Second, "the slot given back", func() bool { return providerStatus(t, g, "wd-a").Active == 0 })
	if n := f.Deleted(pid); n != 1 {
		t.Fatalf("the provider got %d DELETEs", n)
	}
	e := endedEntry(t, g, op)
	if e["close_reason"] != "client deleted the session" || e["commands"].(float64) != 3 || e["protocol"] != "webdriver" || e["cost"] != 0.5 {
		t.Fatalf("session ended entry %v", e)
	}
	if strings.Contains(g.Logs(), "s3cret-key") {
		t.Fatal("a provider credential is in the logs")
	}
	if p := providerStatus(t, g, "wd-a"); !nearly(p.Spend.Spent, 0.5) {
		t.Fatalf("spend %+v", p.Spend)
	}
	code, metrics := opAdmin(t, g, http.MethodGet, "/metrics")
	if code != 200 || !strings.Contains(string(metrics), `caddy_browser_failover_webdriver_commands_total{provider="wd-a"} 3`) {
		t.Fatalf("no webdriver_commands_total of 3 in /metrics")
	}
}

// TestWebDriverFailover: a create fails over past a provider that is
// down and one whose create fails (500), skips one that says it is full
// (as full, not a failure), and relays an invalid argument as it is.
func TestWebDriverFailover(t *testing.T) {
	dead := fakes.Refused("wd-dead")
	defer dead.Close()
	broken := fakes.NewWebDriver("")
	defer broken.Close()
	broken.OnCreate = func(w http.ResponseWriter, _ *http.Request, _ []byte) bool {
		fakes.WriteError(w, 500, "session not created", "chrome crashed on start")
		return true
	}
	full := fakes.NewWebDriver("")
	defer full.Close()
	full.OnCreate = func(w http.ResponseWriter, _ *http.Request, _ []byte) bool {
		fakes.WriteError(w, 500, "session not created", "Could not start a new session. Maximum number of active sessions reached")
		return true
	}
	good := fakes.NewWebDriver("")
	defer good.Close()
	g := testgw.Start(t, handler(`"queue":{"size":0}`,
		wdProvider("wd-dead", "http://"+dead.Addr, `"priority":1`),
		wdProvider("wd-broken", broken.URL(), `"priority":2`),
		wdProvider("wd-full", full.URL(), `"priority":3`),
		wdProvider("wd-good", good.URL(), `"priority":4`)))
	code, v, hdr := wdCall(t, http.MethodPost, g.HTTP("/session"), newSession("chrome", false), nil)
	if code != 200 {
		t.Fatalf("create: %d %v", code, v)
	}
	id, op := v["sessionId"].(string), hdr.Get("Browser-Failover-Session")
	if len(good.Live()) != 1 {
		t.Fatal("the good provider has no session")
	}
	if p := providerStatus(t, g, "wd-full"); p.Failures != 0 {
		t.Errorf("a full provider counted %d failures", p.Failures)
	}
	if p := providerStatus(t, g, "wd-broken"); p.Failures != 0 {
		t.Errorf("a session not created counted %d failures", p.Failures)
	}
	wdCall(t, http.MethodDelete, g.HTTP("/session/"+id), nil, nil)
	e := endedEntry(t, g, op)
	if got := strings.Join(outcomes(e), " "); got != "wd-dead:refused wd-broken:not_created wd-full:full wd-good:ok" {
		t.Fatalf("attempts %s", got)
	}

	// The full provider is skipped for its cooldown duration; an invalid
	// argument goes to the client as the provider wrote it.
	good.OnCreate = func(w http.ResponseWriter, _ *http.Request, _ []byte) bool {
		fakes.WriteError(w, 400, "invalid argument", "unknown capability")
		return true
	}
	code, v, _ = wdCall(t, http.MethodPost, g.HTTP("/session"), newSession("chrome", false), nil)
	if code != 400 || v["error"] != "invalid argument" || v["message"] != "unknown capability" {
		t.Fatalf("invalid argument: %d %v", code, v)
	}
	if n := len(full.Requests()); n != 1 {
		t.Fatalf("the full provider was asked %d times", n)
	}

	// Nothing left: session not created, with Retry-After, in WebDriver's
	// JSON.
	good.Close()
	code, v, hdr = wdCall(t, http.MethodPost, g.HTTP("/session"), newSession("chrome", false), nil)
	if code != 500 || v["error"] != "session not created" || hdr.Get("Retry-After") == "" {
		t.Fatalf("nothing available: %d %v %v", code, v, hdr)
	}
}

// TestWebDriverBadRequests: what no provider should see: a body that is
// not a create, a browser no provider starts, a web page's request, a
// session that is not live.
func TestWebDriverBadRequests(t *testing.T) {
	f := fakes.NewWebDriver("")
	defer f.Close()
	g := testgw.Start(t, handler("", wdProvider("wd-only", f.URL(), `"browsers":["chrome"]`)))
	for _, tc := range []struct {
		name, method, path, body string
		hdr                      http.Header
		status                   int
		code                     string
	}{
		{"not JSON", "POST", "/session", "{", nil, 400, "invalid argument"},
		{"no capabilities", "POST", "/session", `{"desiredCapabilities":{}}`, nil, 400, "invalid argument"},
		{"another browser", "POST", "/session", `{"capabilities":{"alwaysMatch":{"browserName":"firefox"}}}`, nil, 500, "session not created"},
		{"a web page", "POST", "/session", `{"capabilities":{}}`, http.Header{"Origin": {"https://evil.example"}}, 403, "unknown error"},
		{"unknown session", "GET", "/session/nope/title", "", nil, 404, "invalid session id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, g.HTTP(tc.path), strings.NewReader(tc.body))
			for k, vs := range tc.hdr {
				req.Header[k] = vs
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var v struct {
				Value struct {
					Error   string `json:"error"`
					Message string `json:"message"`
				} `json:"value"`
			}
			json.NewDecoder(resp.Body).Decode(&v)
			if resp.StatusCode != tc.status || v.Value.Error != tc.code {
				t.Fatalf("%d %+v, want %d %s", resp.StatusCode, v.Value, tc.status, tc.code)
			}
		})
	}
	if n := len(f.Requests()); n != 0 {
		t.Fatalf("the provider got %d requests", n)
	}
	// The gateway's own status.
	code, v, _ := wdCall(t, http.MethodGet, g.HTTP("/status"), nil, nil)
	if code != 200 || v["ready"] != true {
		t.Fatalf("status: %d %v", code, v)
	}
}

// TestWebDriverEnds: the gateway's own ends (idleness, an operator) send
// the provider DELETE; a provider that ended the session itself (invalid
// session id) gets none; each gives the slot back once.
func TestWebDriverEnds(t *testing.T) {
	f := fakes.NewWebDriver("")
	defer f.Close()
	g := testgw.Start(t, handler(`"session":{"idle_timeout":"1s"}`, wdProvider("wd-ends", f.URL(), `"max_concurrent":1`)))
	// create returns the session's path ID, its operator's ID and the
	// provider's ID.
	create := func() (string, string, string) {
		t.Helper()
		code, v, hdr := wdCall(t, http.MethodPost, g.HTTP("/session"), newSession("chrome", false), nil)
		if code != 200 {
			t.Fatalf("create: %d %v", code, v)
		}
		live := f.Live()
		if len(live) != 1 {
			t.Fatalf("provider sessions %v", live)
		}
		return v["sessionId"].(string), hdr.Get("Browser-Failover-Session"), live[0]
	}
	// Idle: no command for a second.
	_, op, pid := create()
	testgw.Eventually(t, 10*time.Second, "the idle session's end", func() bool { return f.Deleted(pid) == 1 })
	if e := endedEntry(t, g, op); e["close_reason"] != "idle timeout" {
		t.Fatalf("idle end %v", e)
	}
	testgw.Eventually(t, 5*time.Second, "its slot", func() bool { return providerStatus(t, g, "wd-ends").Active == 0 })

	// An operator ends one.
	_, op, pid = create()
	if code, b, _ := g.AdminDo(http.MethodDelete, status.SessionsPath+"/"+op, nil); code != 200 {
		t.Fatalf("operator end: %d %s", code, b)
	}
	testgw.Eventually(t, 5*time.Second, "the operator's DELETE", func() bool { return f.Deleted(pid) == 1 })
	if e := endedEntry(t, g, op); e["close_reason"] != "closed by operator" {
		t.Fatalf("operator end %v", e)
	}

	// The provider ends one itself: the next command's invalid session id
	// is relayed, and the session ends without a DELETE.
	id, op, pid := create()
	f.Forget(pid)
	code, v, _ := wdCall(t, http.MethodGet, g.HTTP("/session/"+id+"/url"), nil, nil)
	if code != 404 || v["error"] != "invalid session id" {
		t.Fatalf("provider's end: %d %v", code, v)
	}
	if e := endedEntry(t, g, op); e["close_reason"] != "provider ended the session" {
		t.Fatalf("provider end %v", e)
	}
	if n := f.Deleted(pid); n != 0 {
		t.Fatalf("a session the provider ended got %d DELETEs", n)
	}
	testgw.Eventually(t, 5*time.Second, "its slot", func() bool { return providerStatus(t, g, "wd-ends").Active == 0 })
}

// TestWebDriverQueue: a create beyond max_concurrent waits in the queue
// and gets the slot the first session's DELETE frees.
func TestWebDriverQueue(t *testing.T) {
	f := fakes.NewWebDriver("")
	defer f.Close()
	g := testgw.Start(t, handler(`"queue":{"size":5,"timeout":"20s"}`, wdProvider("wd-q", f.URL(), `"max_concurrent":1`)))
	code, v, _ := wdCall(t, http.MethodPost, g.HTTP("/session"), newSession("chrome", false), nil)
	if code != 200 {
		t.Fatalf("first: %d", code)
	}
	first := v["sessionId"].(string)
	done := make(chan int, 1)
	go func() {
		code, _, _ := wdCall(t, http.MethodPost, g.HTTP("/session"), newSession("chrome", false), nil)
		done <- code
	}()
	testgw.Eventually(t, 5*time.Second, "the second create waiting", func() bool {
		st := readStatus(t, g)
		return len(st.Queues) > 0 && st.Queues[0].Waiting == 1
	})
	select {
	case c := <-done:
		t.Fatalf("the second create was answered %d while the first lives", c)
	default:
	}
	wdCall(t, http.MethodDelete, g.HTTP("/session/"+first), nil, nil)
	select {
	case c := <-done:
		if c != 200 {
			t.Fatalf("the waiting create got %d", c)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the waiting create got no session")
	}
}

// TestWebDriverSocket: the create answer's webSocketUrl reaches the
// provider session's own socket through the gateway, byte for byte.
func TestWebDriverSocket(t *testing.T) {
	f := fakes.NewWebDriver("")
	defer f.Close()
	g := testgw.Start(t, handler("", wdProvider("wd-ws", f.URL(), "")))
	code, v, hdr := wdCall(t, http.MethodPost, g.HTTP("/session"), newSession("chrome", true), nil)
	if code != 200 {
		t.Fatalf("create: %d", code)
	}
	url, _ := v["capabilities"].(map[string]any)["webSocketUrl"].(string)
	c, resp, err := dial(t, url, nil)
	if err != nil {
		t.Fatalf("socket %s: %v", url, err)
	}
	if resp.Header.Get("Browser-Failover-Session") != hdr.Get("Browser-Failover-Session") {
		t.Errorf("socket's session header %q", resp.Header.Get("Browser-Failover-Session"))
	}
	echoOnce(t, c, []byte(`{"id":1,"method":"session.status","params":{}}`))
	// A web page cannot open it.
	if _, resp, err := dial(t, url, &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {"https://evil.example"}}}); err == nil || resp == nil || resp.StatusCode != 403 {
		t.Fatalf("a web page's socket: %v %v", resp, err)
	}
	// The session's end closes its socket.
	wdCall(t, http.MethodDelete, g.HTTP("/session/"+v["sessionId"].(string)), nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Fatalf("the socket after the session's end: %v", err)
	}
}
