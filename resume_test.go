package browserfailover_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
)

// fakeBrowser is a provider that behaves like Chrome for what resume needs:
// /json/version names its browser's DevTools URL, and the browser's state
// (one value, set and read over the WebSocket) outlives a connection to it.
// With killOnClose it is like a provider that ends the browser when its
// connection closes: the state is gone and the old URL answers 404.
type fakeBrowser struct {
	name        string
	killOnClose bool
	contacts    *fakes.Contacts
	// compress: accept permessage-deflate when the client offers it.
	compress bool

	mu       sync.Mutex
	id       int
	value    string
	conns    int // WebSocket connections accepted
	closes   []int
	srv      *http.Server
	addr     string
	upgrades int
	lastURI  string
	// failing: /json/version answers 500 (a provider that is down).
	failing bool
	// got lists the messages the browser received, in order; a CDP
	// command (a JSON object with an id) is answered {"id":…,"result":{}}
	// unless cdpMute is set.
	got     []string
	cdpMute bool
}

func startFakeBrowser(t *testing.T, name string, contacts *fakes.Contacts, killOnClose bool) *fakeBrowser {
	t.Helper()
	b := &fakeBrowser{name: name, killOnClose: killOnClose, contacts: contacts, id: 1}
	mux := http.NewServeMux()
	mux.HandleFunc("/json/version", func(w http.ResponseWriter, r *http.Request) {
		b.mu.Lock()
		id, failing := b.id, b.failing
		b.mu.Unlock()
		if failing {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, `{"Browser":"Fake/1","webSocketDebuggerUrl":"ws://%s/devtools/browser/%s-%d"}`, r.Host, name, id)
	})
	mux.HandleFunc("/devtools/browser/", func(w http.ResponseWriter, r *http.Request) {
		b.contacts.Add(name)
		b.mu.Lock()
		b.upgrades++
		b.lastURI = r.RequestURI
		want := fmt.Sprintf("%s-%d", name, b.id)
		b.mu.Unlock()
		if strings.TrimPrefix(r.URL.Path, "/devtools/browser/") != want {
			http.Error(w, "no such browser", http.StatusNotFound)
			return
		}
		mode := websocket.CompressionDisabled
		if b.compress {
			mode = websocket.CompressionContextTakeover
		}
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: mode, Subprotocols: []string{"cdp.v1"}})
		if err != nil {
			return
		}
		b.mu.Lock()
		b.conns++
		b.mu.Unlock()
		b.serve(c)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b.addr = ln.Addr().String()
	b.srv = &http.Server{Handler: mux}
	go b.srv.Serve(ln)
	t.Cleanup(func() { b.srv.Close() })
	return b
}

// serve answers "set <v>", "get" and "who" until the connection ends.
func (b *fakeBrowser) serve(c *websocket.Conn) {
	defer c.CloseNow()
	ctx := context.Background()
	for {
		_, msg, err := c.Read(ctx)
		if err != nil {
			b.mu.Lock()
			b.closes = append(b.closes, int(websocket.CloseStatus(err)))
			if b.killOnClose {
				b.id++
				b.value = ""
			}
			b.mu.Unlock()
			return
		}
		b.mu.Lock()
		b.got = append(b.got, string(msg))
		mute := b.cdpMute
		b.mu.Unlock()
		var reply string
		var cmd struct {
			ID *int64 `json:"id"`
		}
		switch m := string(msg); {
		case strings.HasPrefix(m, "{") && json.Unmarshal(msg, &cmd) == nil && cmd.ID != nil:
			if mute {
				continue
			}
			reply = fmt.Sprintf(`{"id":%d,"result":{}}`, *cmd.ID)
		case strings.HasPrefix(m, "set "):
			b.mu.Lock()
			b.value = strings.TrimPrefix(m, "set ")
			b.mu.Unlock()
			reply = "ok"
		case m == "get":
			b.mu.Lock()
			reply = b.value
			b.mu.Unlock()
		case m == "who":
			reply = b.name
		}
		if err := c.Write(ctx, websocket.MessageText, []byte(reply)); err != nil {
			return
		}
	}
}

func (b *fakeBrowser) url() string { return "http://" + b.addr }

func (b *fakeBrowser) setFailing(on bool) {
	b.mu.Lock()
	b.failing = on
	b.mu.Unlock()
}

func (b *fakeBrowser) uri() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lastURI
}

func (b *fakeBrowser) upgradeCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.upgrades
}

// received returns the messages the browser received, from the i-th on.
func (b *fakeBrowser) received(i int) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.got[min(i, len(b.got)):]...)
}

func (b *fakeBrowser) closeCodes() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int(nil), b.closes...)
}

// ask sends msg and returns the answer.
func ask(t *testing.T, c *websocket.Conn, msg string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		t.Fatalf("write %q: %v", msg, err)
	}
	_, got, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("read the answer to %q: %v", msg, err)
	}
	return string(got)
}

// resumeConnect dials the gateway and returns the connection, its
// session ID and the resume token the gateway handed out on the 101 (""
// when it handed out none).
func resumeConnect(t *testing.T, url string, h http.Header) (*websocket.Conn, string, string) {
	t.Helper()
	c, resp, err := dial(t, url, &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	id := resp.Header.Get("Browser-Failover-Session")
	if id == "" {
		t.Fatal("no session ID on the 101")
	}
	return c, id, resp.Header.Get("Browser-Failover-Resume-Token")
}

// resumeRefused dials a resume that must be refused with status, and
// returns the JSON error.
func resumeRefused(t *testing.T, url string, h http.Header, status int) string {
	t.Helper()
	c, resp, err := dial(t, url, &websocket.DialOptions{HTTPHeader: h})
	if err == nil {
		c.CloseNow()
		t.Fatalf("resume at %s was served, want %d", url, status)
	}
	if resp == nil || resp.StatusCode != status {
		t.Fatalf("resume at %s: %v (response %v), want %d", url, err, resp, status)
	}
	var body struct {
		Error string `json:"error"`
	}
	json.NewDecoder(resp.Body).Decode(&body)
	if body.Error == "" {
		t.Fatalf("a %d without a JSON error", status)
	}
	return body.Error
}

// waitLog waits for a log entry msg of the session id.
func waitLog(t *testing.T, g *testgw.Gateway, msg, id string) map[string]any {
	t.Helper()
	var e map[string]any
	testgw.Eventually(t, 10*time.Second, fmt.Sprintf("a %q log entry of session %s", msg, id), func() bool {
		for _, x := range g.LogEntries(msg) {
			if x["session_id"] == id {
				e = x
				return true
			}
		}
		return false
	})
	return e
}

// waitParked waits for the session id to be parked.
func waitParked(t *testing.T, g *testgw.Gateway, id string) map[string]any {
	t.Helper()
	var e map[string]any
	testgw.Eventually(t, 10*time.Second, "session "+id+" parked", func() bool {
		for _, x := range g.LogEntries("session parked") {
			if x["session_id"] == id {
				e = x
				return true
			}
		}
		return false
	})
	return e
}

// TestResumeSameBrowser: a client whose connection drops, and one that
// closes cleanly, take the same browser back with the resume token the
// gateway handed out (bf_resume, or the header), at the same provider
// whatever the strategy says, with a new session ID each time and the
// same token; the session ID itself never resumes, and presenting it
// spends nothing.
func TestResumeSameBrowser(t *testing.T) {
	var contacts fakes.Contacts
	a := startFakeBrowser(t, "rs-a", &contacts, false)
	b := startFakeBrowser(t, "rs-b", &contacts, false)
	g := testgw.Start(t, handler(`"strategy":"round_robin","resume":{"window":"1m"}`,
		provider("rs-a", a.url(), ""), provider("rs-b", b.url(), "")))

	c, id, tok := resumeConnect(t, g.WS("/"), nil)
	if len(tok) != 22 || tok == id {
		t.Fatalf("resume token %q (session %q): want 22 characters of its own", tok, id)
	}
	first := ask(t, c, "who")
	if ask(t, c, "set 42") != "ok" {
		t.Fatal("set")
	}
	// The connection drops: no close frame.
	c.CloseNow()
	e := waitParked(t, g, id)
	if e["provider"] != first || e["held"] != false {
		t.Fatalf("parked entry %v", e)
	}
	contacts.Reset()

	// The session ID, which operators see, is no resume credential.
	if msg := resumeRefused(t, g.WS("/?bf_resume="+id), nil, http.StatusGone); !strings.Contains(msg, "not a resume token") {
		t.Fatalf("resume by session ID: %q", msg)
	}
	if l := contacts.List(); len(l) != 0 {
		t.Fatalf("a resume by session ID contacted %v", l)
	}

	// The next fresh client would go to the other provider (round robin);
	// the resume goes back.
	c2, id2, tok2 := resumeConnect(t, g.WS("/?bf_resume="+tok), nil)
	if tok2 != "" {
		t.Fatalf("a resume was handed a new token %q: it keeps its own", tok2)
	}
	if got := ask(t, c2, "who"); got != first {
		t.Fatalf("resumed at %s, want %s", got, first)
	}
	if got := ask(t, c2, "get"); got != "42" {
		t.Fatalf("the browser's state after resume: %q, want 42", got)
	}
	if id2 == id || len(id2) != 22 {
		t.Fatalf("resumed session ID %q (first %q): want a new 22-character ID", id2, id)
	}
	if l := contacts.List(); len(l) != 1 || l[0] != first {
		t.Fatalf("providers contacted for the resume: %v, want only %s", l, first)
	}
	res := g.LogEntries("session resumed")
	if len(res) != 1 || res[0]["session_id"] != id2 || res[0]["resumed_from"] != id || res[0]["provider"] != first {
		t.Fatalf("session resumed log: %v", res)
	}

	// A clean close, then the header form.
	c2.Close(websocket.StatusNormalClosure, "bye")
	waitParked(t, g, id2)
	contacts.Reset()
	c3, id3, _ := resumeConnect(t, g.WS("/"), http.Header{"Browser-Failover-Resume": {tok}})
	if got := ask(t, c3, "get"); got != "42" {
		t.Fatalf("state after the second resume: %q", got)
	}
	if l := contacts.List(); len(l) != 1 || l[0] != first {
		t.Fatalf("providers contacted for the second resume: %v", l)
	}
	// While its client is connected, nothing is parked to take back.
	contacts.Reset()
	resumeRefused(t, g.WS("/?bf_resume="+tok), nil, http.StatusGone)
	if l := contacts.List(); len(l) != 0 {
		t.Fatalf("a resume of a connected session contacted %v", l)
	}
	c3.Close(websocket.StatusNormalClosure, "")
	waitParked(t, g, id3)

	// No ID resumes.
	for _, x := range []string{id, id2, id3} {
		resumeRefused(t, g.WS("/?bf_resume="+x), nil, http.StatusGone)
	}
	if _, ok := pool.Current().Parked.ByID(id3); !ok {
		t.Fatal("presenting session IDs spent the parked session")
	}
}

// TestResumeRefused: whatever cannot be resumed is answered 410 with a JSON
// error, and no provider is contacted for it (none at all, or only the
// session's own when it is asked and refuses): an unknown token, a session
// ID, a window that is over, a session whose client is connected, another
// resume_key value or none, a Playwright client, a route without resume,
// the provider drained or in cooldown (the window goes on: the same token
// resumes once the provider is back). None of these spends the token.
func TestResumeRefused(t *testing.T) {
	var contacts fakes.Contacts
	a := startFakeBrowser(t, "rr-a", &contacts, false)
	b := startFakeBrowser(t, "rr-b", &contacts, false)
	g := testgw.Start(t, handler(`"resume":{"window":"1m"},"resume_key":"{http.request.header.X-User}","queue":{"size":0},`+
		`"cooldown":{"min_requests":1,"failure_threshold":0.1,"duration":"1s","max_duration":"1s"}`,
		provider("rr-a", a.url(), `"priority":1,"pass_query":true`), provider("rr-b", b.url(), `"priority":2`)))
	alice, bob := http.Header{"X-User": {"alice"}}, http.Header{"X-User": {"bob"}}

	c, id, tok := resumeConnect(t, g.WS("/?token=t1"), alice)
	ask(t, c, "set 42")
	c.CloseNow()
	waitParked(t, g, id)
	contacts.Reset()

	refused := func(what, url string, h http.Header, status int) string {
		t.Helper()
		msg := resumeRefused(t, url, h, status)
		if l := contacts.List(); len(l) != 0 {
			t.Fatalf("%s: providers contacted: %v", what, l)
		}
		return msg
	}
	refused("unknown token", g.WS("/?bf_resume=AAAAAAAAAAAAAAAAAAAAAA"), alice, http.StatusGone)
	refused("not a token", g.WS("/?bf_resume=short"), alice, http.StatusGone)
	refused("session ID", g.WS("/?bf_resume="+id), alice, http.StatusGone)
	refused("another key", g.WS("/?bf_resume="+tok), bob, http.StatusGone)
	if msg := refused("no key", g.WS("/?bf_resume="+tok), nil, http.StatusGone); !strings.Contains(msg, "resume_key has no value") {
		t.Fatalf("refusal without a key value: %q", msg)
	}
	pw := http.Header{"X-User": {"alice"}, "X-Playwright-Browser": {"chromium"}}
	if msg := refused("Playwright", g.WS("/?bf_resume="+tok), pw, http.StatusGone); !strings.Contains(msg, "Playwright") {
		t.Fatalf("Playwright refusal: %q", msg)
	}

	// Drained: refused, and the window goes on.
	opAction(t, g, "rr-a", "drain")
	if msg := refused("drained", g.WS("/?bf_resume="+tok), alice, http.StatusGone); !strings.Contains(msg, "drained") {
		t.Fatalf("drained refusal: %q", msg)
	}
	opAction(t, g, "rr-a", "undrain")

	// In cooldown: a fresh client finds rr-a down and lands on rr-b; the
	// resume is refused without trying rr-a or rr-b.
	a.setFailing(true)
	fresh, _, _ := resumeConnect(t, g.WS("/"), alice)
	if got := ask(t, fresh, "who"); got != "rr-b" {
		t.Fatalf("fresh client at %s", got)
	}
	fresh.Close(websocket.StatusNormalClosure, "")
	contacts.Reset()
	if msg := refused("cooldown", g.WS("/?bf_resume="+tok), alice, http.StatusGone); !strings.Contains(msg, "cooldown") {
		t.Fatalf("cooldown refusal: %q", msg)
	}
	a.setFailing(false)
	testgw.Eventually(t, 10*time.Second, "rr-a's cooldown to end", func() bool {
		p, ok := pool.Current().Lookup("rr-a")
		return ok && p.Health.Available()
	})

	// Still resumable, with the right key, at rr-a only, and the
	// bf_resume item never reaches it (pass_query passes the rest).
	c2, id2, _ := resumeConnect(t, g.WS("/?bf_resume="+tok+"&token=t2"), alice)
	if got := ask(t, c2, "get"); got != "42" {
		t.Fatalf("state after resume: %q", got)
	}
	if l := contacts.List(); len(l) != 1 || l[0] != "rr-a" {
		t.Fatalf("contacted for the resume: %v", l)
	}
	if u := a.uri(); strings.Contains(u, "bf_resume") || !strings.Contains(u, "token=t1") {
		t.Fatalf("the resume dialled %q: want the first connection's URL, without bf_resume", u)
	}
	contacts.Reset()
	refused("client connected", g.WS("/?bf_resume="+tok), alice, http.StatusGone)

	// A short window: over, then 410.
	if err := g.Reload(handler(`"resume":{"window":"300ms"}`, provider("rr-a", a.url(), ""), provider("rr-b", b.url(), ""))); err != nil {
		t.Fatal(err)
	}
	c3, id3, tok3 := resumeConnect(t, g.WS("/"), nil)
	if tok3 == "" {
		t.Fatal("no resume token under the reloaded config (no resume_key)")
	}
	ask(t, c3, "who")
	c3.CloseNow()
	c2.CloseNow()
	waitParked(t, g, id3)
	testgw.Eventually(t, 10*time.Second, "the window to end", func() bool {
		for _, e := range g.LogEntries("resume window over") {
			if e["session_id"] == id3 {
				return true
			}
		}
		return false
	})
	contacts.Reset()
	refused("window over", g.WS("/?bf_resume="+tok3), nil, http.StatusGone)
	// The session parked under the old config's resume_key is bound to it
	// still.
	if t.Failed() {
		return
	}
	defer func() {
		if t.Failed() {
			t.Log(g.Logs())
		}
	}()
	refused("old key", g.WS("/?bf_resume="+tok), nil, http.StatusGone)

	// A route without resume.
	if err := g.Reload(handler("", provider("rr-a", a.url(), ""))); err != nil {
		t.Fatal(err)
	}
	if msg := refused("no resume here", g.WS("/?bf_resume="+tok), alice, http.StatusGone); !strings.Contains(msg, "not resumable") {
		t.Fatalf("refusal without resume: %q", msg)
	}
	if _, ok := pool.Current().Parked.ByID(id2); !ok {
		t.Fatalf("%s is no longer parked: its window goes on", id2)
	}
	if _, ok := pool.Current().Parked.ByID(id3); ok {
		t.Fatalf("%s still parked after its window", id3)
	}
}

// TestResumeSessionAPI: a session created over a provider's session API
// is not released while parked; a resume dials the connect URL its create
// answered, creating nothing; the session is released once, at the end of
// the window after its last client left.
func TestResumeSessionAPI(t *testing.T) {
	f, echo := echoREST(t)
	g := testgw.Start(t, handler(`"resume":{"window":"1500ms"}`, apiProvider("rs-api", f, "")))
	c, id, tok := resumeConnect(t, g.WS("/"), nil)
	echoOnce(t, c, []byte("one"))
	c.CloseNow()
	waitParked(t, g, id)
	hits := echo.Hits.Load()
	if b := f.Books(); len(b.Created) != 1 || len(b.Released) != 0 {
		t.Fatalf("parked: created %d, released %d; want 1 and 0", len(b.Created), len(b.Released))
	}

	c2, id2, _ := resumeConnect(t, g.WS("/?bf_resume="+tok), nil)
	echoOnce(t, c2, []byte("two"))
	if b := f.Books(); len(b.Created) != 1 || len(b.Released) != 0 {
		t.Fatalf("resumed: created %d, released %d; want 1 and 0", len(b.Created), len(b.Released))
	}
	if echo.Hits.Load() != hits+1 {
		t.Fatalf("the resume did not dial the created session's connect URL")
	}
	c2.Close(websocket.StatusNormalClosure, "")
	waitParked(t, g, id2)
	if b := f.Books(); len(b.Released) != 0 {
		t.Fatal("released while parked")
	}
	// The window ends: released, once.
	waitBooks(t, f, "rs-api", 1)
	resumeRefused(t, g.WS("/?bf_resume="+tok), nil, http.StatusGone)
	if b := f.Books(); len(b.Created) != 1 {
		t.Fatalf("a refused resume created a session: %d", len(b.Created))
	}
}

// TestResumeVisible: parked sessions in the status, the sessions list
// (parked, resumable_until) and the metrics; an operator's DELETE ends a
// parked session, which then cannot be resumed.
func TestResumeVisible(t *testing.T) {
	var contacts fakes.Contacts
	a := startFakeBrowser(t, "rv-a", &contacts, false)
	g := testgw.Start(t, handler(`"resume":{"window":"1m"}`, provider("rv-a", a.url(), "")))
	c, id, tok := resumeConnect(t, g.WS("/"), nil)
	ask(t, c, "set 1")
	c.Close(websocket.StatusNormalClosure, "")
	waitParked(t, g, id)

	code, body, err := g.AdminDo(http.MethodGet, "/browser_failover/sessions", nil)
	if err != nil || code != 200 {
		t.Fatal(code, err)
	}
	var list struct {
		Sessions []struct {
			ID             string     `json:"id"`
			Provider       string     `json:"provider"`
			Parked         bool       `json:"parked"`
			ResumableUntil *time.Time `json:"resumable_until"`
			BytesUp        int64      `json:"bytes_up"`
		} `json:"sessions"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range list.Sessions {
		if s.ID == id {
			found = true
			if !s.Parked || s.ResumableUntil == nil || s.Provider != "rv-a" || s.BytesUp == 0 ||
				time.Until(*s.ResumableUntil) < 30*time.Second || time.Until(*s.ResumableUntil) > time.Minute {
				t.Fatalf("parked session listed as %+v", s)
			}
		}
	}
	if !found {
		t.Fatalf("parked session %s not listed: %s", id, body)
	}
	if strings.Contains(string(body), a.addr) || strings.Contains(string(body), "devtools") || strings.Contains(string(body), tok) {
		t.Fatalf("the sessions list shows where the browser is, or its resume token: %s", body)
	}
	var st struct {
		Parked struct {
			Sessions int `json:"sessions"`
			Held     int `json:"held"`
		} `json:"parked"`
	}
	_, sb, _ := g.AdminDo(http.MethodGet, "/browser_failover/status", nil)
	if err := json.Unmarshal(sb, &st); err != nil || st.Parked.Sessions < 1 || strings.Contains(string(sb), tok) {
		t.Fatalf("status parked: %s", sb)
	}

	// Resume once, refuse once: the metrics count both.
	c2, id2, _ := resumeConnect(t, g.WS("/?bf_resume="+tok), nil)
	c2.Close(websocket.StatusNormalClosure, "")
	resumeRefused(t, g.WS("/?bf_resume="+id), nil, http.StatusGone)
	waitParked(t, g, id2)
	_, m, _ := g.AdminDo(http.MethodGet, "/metrics", nil)
	for _, want := range []string{
		`caddy_browser_failover_resumes_total{result="resumed"}`,
		`caddy_browser_failover_resumes_total{result="unknown"}`,
		`caddy_browser_failover_parked_sessions{held="false"}`,
		`caddy_browser_failover_rejections_total{reason="resume"}`,
	} {
		if !strings.Contains(string(m), want) {
			t.Fatalf("metrics lack %s", want)
		}
	}

	// The operator ends it.
	code, body, _ = g.AdminDo(http.MethodDelete, "/browser_failover/sessions/"+id2, nil)
	if code != 200 || !strings.Contains(string(body), `"parked":true`) {
		t.Fatalf("DELETE of a parked session: %d %s", code, body)
	}
	if _, ok := pool.Current().Parked.ByID(id2); ok {
		t.Fatal("still parked after DELETE")
	}
	resumeRefused(t, g.WS("/?bf_resume="+tok), nil, http.StatusGone)
	code, _, _ = g.AdminDo(http.MethodDelete, "/browser_failover/sessions/"+id2, nil)
	if code != 404 {
		t.Fatalf("second DELETE: %d", code)
	}
}

// TestResumeHold: with hold, in front of a provider that ends the browser
// when its connection closes, the provider connection stays open while the
// client is away (and keeps its slot), and a resuming client is joined to
// it: the browser's state survives. Without hold the same provider has
// nothing to give back (410). A resuming client must offer the session's
// subprotocol (409 otherwise). At the window's end the provider gets the
// client's own close code.
func TestResumeHold(t *testing.T) {
	var contacts fakes.Contacts
	a := startFakeBrowser(t, "rh-a", &contacts, true)
	b := startFakeBrowser(t, "rh-b", &contacts, false)
	g := testgw.Start(t, handler(`"resume":{"window":"1m"}`,
		provider("rh-a", a.url(), `"priority":1`), provider("rh-b", b.url(), `"priority":2`)))

	// Without hold: the browser is gone with the connection.
	c, id, tok := resumeConnect(t, g.WS("/"), nil)
	ask(t, c, "set 42")
	c.CloseNow()
	waitParked(t, g, id)
	contacts.Reset()
	if msg := resumeRefused(t, g.WS("/?bf_resume="+tok), nil, http.StatusGone); !strings.Contains(msg, "did not give it back") {
		t.Fatalf("refusal without hold: %q", msg)
	}
	if l := contacts.List(); len(l) != 1 || l[0] != "rh-a" {
		t.Fatalf("contacted: %v, want rh-a alone", l)
	}

	// With hold.
	if err := g.Reload(handler(`"resume":{"window":"3s","hold":true}`,
		provider("rh-a", a.url(), `"priority":1`), provider("rh-b", b.url(), `"priority":2`))); err != nil {
		t.Fatal(err)
	}
	proto := &websocket.DialOptions{Subprotocols: []string{"cdp.v1"}}
	var upgrades, closed int
	for try := 1; ; try++ {
		closed = len(a.closeCodes())
		c, resp, err := dial(t, g.WS("/"), proto)
		if err != nil {
			t.Fatal(err)
		}
		id, tok = resp.Header.Get("Browser-Failover-Session"), resp.Header.Get("Browser-Failover-Resume-Token")
		if c.Subprotocol() != "cdp.v1" {
			t.Fatalf("subprotocol %q", c.Subprotocol())
		}
		ask(t, c, "set 42")
		upgrades = a.upgradeCount()
		c.CloseNow()
		e := waitParked(t, g, id)
		if e["held"] == true {
			break
		}
		// Right after a reload the old config's listener may still
		// take a connection (Caddy swaps SO_REUSEPORT listeners): that
		// session parks under the old config, without hold.
		if until, _ := e["resumable_until"].(float64); try == 3 || until-e["ts"].(float64) < 30 {
			t.Fatalf("parked entry %v, want held", e)
		}
	}
	if cc := a.closeCodes(); len(cc) != closed {
		t.Fatalf("the provider saw its connections close with %v: the held one must stay open", cc)
	}
	if active("rh-a") != 1 {
		t.Fatalf("a held session keeps its slot: active %d", active("rh-a"))
	}
	contacts.Reset()

	// A client that does not offer the subprotocol cannot join.
	if msg := resumeRefused(t, g.WS("/?bf_resume="+tok), nil, http.StatusConflict); !strings.Contains(msg, "cdp.v1") {
		t.Fatalf("409: %q", msg)
	}
	seen := len(a.received(0))
	c2, resp, err := dial(t, g.WS("/?bf_resume="+tok), proto)
	if err != nil {
		t.Fatalf("resume of the held session: %v", err)
	}
	id2 := resp.Header.Get("Browser-Failover-Session")
	if id2 == "" || id2 == id || c2.Subprotocol() != "cdp.v1" {
		t.Fatalf("resumed: ID %q subprotocol %q", id2, c2.Subprotocol())
	}
	if got := ask(t, c2, "get"); got != "42" {
		t.Fatalf("the held browser's state: %q, want 42 (the answers to the reset are not the client's)", got)
	}
	// Before the client's first message, the gateway turned off what the
	// earlier client may have set up on the connection; the browser's
	// answers were not relayed.
	if got := a.received(seen); len(got) != 3 || !strings.Contains(got[0], `"Target.setAutoAttach"`) ||
		!strings.Contains(got[1], `"Target.setDiscoverTargets"`) || got[2] != "get" {
		t.Fatalf("the held browser received %q, want the two reset commands, then the client's get", got)
	}
	if e := waitLog(t, g, "held session reset", id2); e["answered"] != float64(2) || e["sent"] != float64(2) {
		t.Fatalf("held session reset: %v, want 2 sent, 2 answered", e)
	}
	if a.upgradeCount() != upgrades || len(contacts.List()) != 0 {
		t.Fatalf("the provider was asked for a new connection: upgrades %d -> %d, contacts %v", upgrades, a.upgradeCount(), contacts.List())
	}
	// (The entry follows the join, which may have been quicker.)
	if res := waitLog(t, g, "session resumed", id2); res["held"] != true || res["resumed_from"] != id {
		t.Fatalf("session resumed log: %v", res)
	}
	// The sessions list shows the live session under its new ID.
	_, body, _ := g.AdminDo(http.MethodGet, "/browser_failover/sessions", nil)
	if !strings.Contains(string(body), id2) || strings.Contains(string(body), `"id":"`+id+`"`) {
		t.Fatalf("sessions list after the resume: %s", body)
	}

	// It leaves cleanly (code 4001), nobody comes back: at the window's end
	// the provider gets 4001 "resume window over", and the slot is free.
	c2.Close(4001, "later")
	waitParked(t, g, id2)
	testgw.Eventually(t, 15*time.Second, "the held connection to close at the window's end", func() bool {
		return len(a.closeCodes()) == closed+1
	})
	if cc := a.closeCodes(); cc[closed] != 4001 {
		t.Fatalf("the provider's close code %d, want the client's 4001", cc[closed])
	}
	testgw.Eventually(t, 10*time.Second, "the slot to be free", func() bool { return active("rh-a") == 0 })
	// The slot is given back before the session's log entry is written.
	if endReason, _ := waitLog(t, g, "session ended", id2)["close_reason"].(string); endReason != "resume window over" {
		t.Fatalf("the held session ended with %q", endReason)
	}
	if n, held := pool.Current().Parked.Count(); held != 0 {
		t.Fatalf("%d parked (%d held) after the window", n, held)
	}
}

// TestResumeHoldCompressed: a session that negotiated compression cannot
// be held (a new connection cannot share its compression state): under
// hold, its resume is answered 409 and nothing is kept open for it.
func TestResumeHoldCompressed(t *testing.T) {
	var contacts fakes.Contacts
	a := startFakeBrowser(t, "rz-a", &contacts, true)
	a.compress = true
	g := testgw.Start(t, handler(`"resume":{"window":"1m","hold":true}`, provider("rz-a", a.url(), "")))
	c, resp, err := dial(t, g.WS("/"), &websocket.DialOptions{CompressionMode: websocket.CompressionContextTakeover})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(resp.Header.Get("Sec-WebSocket-Extensions"), "permessage-deflate") {
		t.Fatalf("no compression negotiated: %v", resp.Header)
	}
	id, tok := resp.Header.Get("Browser-Failover-Session"), resp.Header.Get("Browser-Failover-Resume-Token")
	ask(t, c, "set 42")
	c.CloseNow()
	if e := waitParked(t, g, id); e["held"] != false {
		t.Fatalf("parked %v: a compressed session is not held", e)
	}
	testgw.Eventually(t, 10*time.Second, "the slot to be free", func() bool { return active("rz-a") == 0 })
	contacts.Reset()
	if msg := resumeRefused(t, g.WS("/?bf_resume="+tok), nil, http.StatusConflict); !strings.Contains(msg, "permessage-deflate") {
		t.Fatalf("409: %q", msg)
	}
	if l := contacts.List(); len(l) != 0 {
		t.Fatalf("contacted: %v", l)
	}
}

// TestResumeHoldHTTP2: an HTTP/2 client (extended CONNECT) leaves a held
// session and another HTTP/2 client resumes it: its stream gets the same
// browser; each client's request ends when it leaves, not with the
// session.
func TestResumeHoldHTTP2(t *testing.T) {
	var contacts fakes.Contacts
	a := startFakeBrowser(t, "r2-a", &contacts, true)
	g, tr := startH2(t, handler(`"resume":{"window":"1m","hold":true}`, provider("r2-a", a.url(), "")))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	talk := func(c *h2WS, msg string) string {
		t.Helper()
		if err := c.writeFrame(0x1, []byte(msg)); err != nil {
			t.Fatalf("write: %v", err)
		}
		_, p, err := c.readFrame()
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		return string(p)
	}
	c, err := dialH2(ctx, tr, "https://"+g.addr+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	id, tok := c.resp.Header.Get("Browser-Failover-Session"), c.resp.Header.Get("Browser-Failover-Resume-Token")
	if tok == "" {
		t.Fatal("no resume token on the HTTP/2 200")
	}
	talk(c, "set 42")
	c.close() // the stream ends without a close frame
	testgw.Eventually(t, 10*time.Second, "parked", func() bool {
		for _, e := range logEntries(g.logPath, "session parked") {
			if e["session_id"] == id && e["held"] == true {
				return true
			}
		}
		return false
	})
	c2, err := dialH2(ctx, tr, "https://"+g.addr+"/?bf_resume="+tok, nil)
	if err != nil {
		t.Fatalf("resume over HTTP/2: %v", err)
	}
	if got := talk(c2, "get"); got != "42" {
		t.Fatalf("state after an HTTP/2 resume: %q", got)
	}
	id2 := c2.resp.Header.Get("Browser-Failover-Session")
	if err := c2.closeFrame(1000, "bye"); err != nil {
		t.Fatal(err)
	}
	// The gateway answers the close itself, and the stream ends.
	if op, _, err := c2.readFrame(); err != nil || op != 0x8 {
		t.Fatalf("after the client's close: op %d, %v", op, err)
	}
	if _, _, err := c2.readFrame(); err == nil {
		t.Fatal("the stream goes on after the close")
	}
	c2.close()
	testgw.Eventually(t, 10*time.Second, "parked again", func() bool {
		for _, e := range logEntries(g.logPath, "session parked") {
			if e["session_id"] == id2 {
				return true
			}
		}
		return false
	})
	if cc := a.closeCodes(); len(cc) != 0 {
		t.Fatalf("the provider connection closed: %v", cc)
	}
}

// TestResumeHoldResetUnanswered: a held provider that does not answer the
// gateway's reset commands delays the join by the reset's bound, and no
// more: the client joins then, its first message reaches the browser
// behind the commands, and it gets nothing but its own answers.
func TestResumeHoldResetUnanswered(t *testing.T) {
	var contacts fakes.Contacts
	a := startFakeBrowser(t, "rhu-a", &contacts, true)
	a.mu.Lock()
	a.cdpMute = true
	a.mu.Unlock()
	g := testgw.Start(t, handler(`"resume":{"window":"1m","hold":true}`, provider("rhu-a", a.url(), "")))
	c, id, tok := resumeConnect(t, g.WS("/"), nil)
	ask(t, c, "set 42")
	c.CloseNow()
	waitParked(t, g, id)
	seen := len(a.received(0))
	start := time.Now()
	c2, id2, _ := resumeConnect(t, g.WS("/?bf_resume="+tok), nil)
	if got := ask(t, c2, "get"); got != "42" {
		t.Fatalf("the held browser's state: %q, want 42", got)
	}
	took := time.Since(start)
	if took < 2*time.Second {
		t.Fatalf("the client joined %v after its resume, before the reset's 2 s were over", took)
	}
	t.Logf("joined and answered %v after the resume", took.Round(time.Millisecond))
	if got := a.received(seen); len(got) != 3 || got[2] != "get" {
		t.Fatalf("the held browser received %q, want the two reset commands, then get", got)
	}
	e := waitLog(t, g, "held session reset unanswered: the client joins anyway", id2)
	if e["answered"] != float64(0) || e["sent"] != float64(2) || e["level"] != "info" {
		t.Fatalf("log entry %v, want 0 answered of 2, at info", e)
	}
	// Parked again before the cleanup ends every parked session.
	c2.CloseNow()
	waitParked(t, g, id2)
}

// TestParkedSessionsCount: a parked session that still holds a provider
// session (created over a session API, not released while parked) counts
// against max_concurrent and client_limit until its window ends or it is
// resumed. One client that connects and drops again and again gets one
// billed session, not one per connect: the others are refused (429, no
// queue) without a create; the resume takes the parked session's slot and
// share over; at the window's end everything is given back, released
// once, and a new client gets a session.
func TestParkedSessionsCount(t *testing.T) {
	f, _ := echoREST(t)
	g := testgw.Start(t, handler(`"resume":{"window":"2s"},"queue":{"size":0},`+
		`"client_limit":{"key":"{http.request.header.X-Client}","limit":1}`,
		apiProvider("pc-api", f, `"max_concurrent":1`)))
	me := http.Header{"X-Client": {"c1"}}
	other := http.Header{"X-Client": {"c2"}}

	c, id, tok := resumeConnect(t, g.WS("/"), me)
	echoOnce(t, c, []byte("one"))
	c.CloseNow()
	waitParked(t, g, id)
	for i := range 6 {
		// The same client connects afresh and drops: over its limit.
		cx, resp, err := dial(t, g.WS("/"), &websocket.DialOptions{HTTPHeader: me})
		if err == nil {
			cx.CloseNow()
			t.Fatalf("connect %d beside the parked session was served", i)
		}
		if resp == nil || resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("connect %d: %v %v, want 429", i, err, resp)
		}
	}
	// Another client: the provider's one slot is the parked session's.
	if _, resp, err := dial(t, g.WS("/"), &websocket.DialOptions{HTTPHeader: other}); err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("another client beside the parked session: %v %v, want 503", err, resp)
	}
	if b := f.Books(); len(b.Created) != 1 || len(b.Released) != 0 {
		t.Fatalf("created %d, released %d: want 1 and 0", len(b.Created), len(b.Released))
	}
	if st, ok := pool.Current().Lookup("pc-api"); !ok || st.Slots.Reserved() != 1 || st.Slots.Active() != 0 {
		t.Fatal("the parked session does not hold its slot (or counts as connected)")
	}

	// The resume takes the slot and the share over: nothing more is taken.
	c2, id2, _ := resumeConnect(t, g.WS("/?bf_resume="+tok), me)
	echoOnce(t, c2, []byte("two"))
	if st, _ := pool.Current().Lookup("pc-api"); st.Slots.Reserved() != 1 || active("pc-api") != 1 {
		t.Fatalf("resumed: reserved %d, active %d; want 1 and 1", st.Slots.Reserved(), active("pc-api"))
	}
	if n := pool.Current().Quotas.Active(pool.QuotaKey{Template: "{http.request.header.X-Client}", Value: "c1"}); n != 1 {
		t.Fatalf("the client's share counts %d sessions, want 1", n)
	}
	c2.Close(websocket.StatusNormalClosure, "")
	waitParked(t, g, id2)
	if b := f.Books(); len(b.Created) != 1 {
		t.Fatalf("created %d", len(b.Created))
	}

	// The window ends: released once, the slot and the share given back.
	waitBooks(t, f, "pc-api", 1)
	testgw.Eventually(t, 10*time.Second, "the slot to be free", func() bool {
		st, _ := pool.Current().Lookup("pc-api")
		return st.Slots.Reserved() == 0
	})
	if n := pool.Current().Quotas.Active(pool.QuotaKey{Template: "{http.request.header.X-Client}", Value: "c1"}); n != 0 {
		t.Fatalf("the client's share still counts %d", n)
	}
	c3, _, _ := resumeConnect(t, g.WS("/"), me)
	echoOnce(t, c3, []byte("three"))
	c3.Close(websocket.StatusNormalClosure, "")
	waitBooks(t, f, "pc-api", 2)
}

// TestResumeTokenReused: a client that brings one token for two sessions
// can take back only the one parked last; the earlier one's window ends
// when the later one parks (a session created for it over a session API is
// released then), so nothing parked is left unreachable. A token of the
// wrong form gets 400.
func TestResumeTokenReused(t *testing.T) {
	f, _ := echoREST(t)
	g := testgw.Start(t, handler(`"resume":{"window":"1m"}`, apiProvider("tr-api", f, "")))
	const token = "one-token-for-two-sessions"
	c1, id1, _ := resumeConnect(t, g.WS("/?bf_resume_token="+token), nil)
	c2, id2, _ := resumeConnect(t, g.WS("/?bf_resume_token="+token), nil)
	echoOnce(t, c1, []byte("one"))
	echoOnce(t, c2, []byte("two"))
	c1.CloseNow()
	waitParked(t, g, id1)
	c2.CloseNow()
	waitParked(t, g, id2)
	waitLog(t, g, "resume window over", id1)
	testgw.Eventually(t, 10*time.Second, "the first session released", func() bool { return len(f.Books().Released) == 1 })
	c3, _, _ := resumeConnect(t, g.WS("/?bf_resume="+token), nil)
	echoOnce(t, c3, []byte("three"))
	if b := f.Books(); len(b.Created) != 2 || len(b.Released) != 1 {
		t.Fatalf("created %d, released %d: want 2 and 1", len(b.Created), len(b.Released))
	}
	c3.Close(websocket.StatusNormalClosure, "")

	for _, bad := range []string{"short", "has space in it 0123456789", strings.Repeat("x", 300)} {
		_, resp, err := dial(t, g.WS("/?bf_resume_token="+url.QueryEscape(bad)), nil)
		if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("token %q: %v %v, want 400", bad, err, resp)
		}
	}
}
