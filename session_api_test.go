package browserfailover_test

// Providers that create each browser over REST (session_api): the create
// call, the dial of the connect URL it gives, and the release of every
// created session exactly once on every way a session or an attempt ends,
// checked by the fake provider's own books.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/status"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// apiSecret is the API key the session_api providers of these tests send;
// it must never show.
const apiSecret = "bb-live-key-7f3a91c2"

// apiProvider renders a provider backed by the fake REST provider f.
func apiProvider(name string, f *fakes.REST, extra string) string {
	api := fmt.Sprintf(`{"create_method":"POST","create_url":"/v1/sessions",`+
		`"headers":[{"field":"X-BB-API-Key","value":%q}],`+
		`"body":%q,"connect_url":"/connectUrl","session_id":"/id",`+
		`"release_method":"POST","release_url":"/v1/sessions/{session_id}/release",`+
		`"release_body":%q}`, apiSecret,
		`{"projectId":"proj-1","userMetadata":{"client":"{http.request.header.X-Client}"}}`,
		`{"status":"REQUEST_RELEASE","id":"{session_id}"}`)
	if extra != "" {
		extra = "," + extra
	}
	return fmt.Sprintf(`{"name":%q,"url":%q,"session_api":%s%s}`, name, f.URL(), api, extra)
}

// waitBooks waits until f created n sessions and released each exactly
// once (and nothing else), and until the gateway's own books agree.
func waitBooks(t *testing.T, f *fakes.REST, provider string, n int) {
	t.Helper()
	var last error
	testgw.Eventually(t, 20*time.Second, "every created session released once", func() bool {
		b := f.Books()
		last = b.Balanced()
		if last == nil && len(b.Created) != n {
			last = fmt.Errorf("created %d sessions, want %d", len(b.Created), n)
		}
		return last == nil
	})
	if last != nil {
		t.Fatal(last)
	}
	testgw.Eventually(t, 10*time.Second, "the gateway's books", func() bool {
		gb, ok := pool.Current().Books.Lookup(provider)
		return ok && gb.Unreleased() == 0
	})
}

// echoREST starts an echo provider and a fake REST provider that creates
// sessions connecting to it.
func echoREST(t *testing.T) (*fakes.REST, *fakes.Server) {
	echo := fakes.Echo("api-echo", nil)
	t.Cleanup(echo.Close)
	f := fakes.NewREST(func(id string) string { return echo.URL() + "devtools/browser/" + id })
	t.Cleanup(f.Close)
	return f, echo
}

// rejectAttempts dials and expects a 503, returning its attempts' words.
func rejectAttempts(t *testing.T, url string) []string {
	t.Helper()
	_, resp, err := dial(t, url, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("want 503, got %v %v", resp, err)
	}
	var body struct {
		Attempts []struct{ Provider, Outcome string }
	}
	b, _ := io.ReadAll(resp.Body)
	json.Unmarshal(b, &body)
	var words []string
	for _, a := range body.Attempts {
		words = append(words, a.Outcome)
	}
	if strings.Contains(string(b), apiSecret) {
		t.Fatalf("503 body shows the API key: %s", b)
	}
	return words
}

// TestSessionAPICreateConnectRelease: a client gets the browser the
// create call made (headers and body with placeholders as configured);
// when it closes, the session is released with the release body; status
// shows nothing unreleased.
func TestSessionAPICreateConnectRelease(t *testing.T) {
	f, echo := echoREST(t)
	g := testgw.Start(t, handler(`"queue":{"size":0}`, apiProvider("api-main", f, "")))
	c, _, err := dial(t, g.WS("/"), &websocket.DialOptions{HTTPHeader: http.Header{"X-Client": {`team "a"`}}})
	if err != nil {
		t.Fatal(err)
	}
	echoOnce(t, c, []byte("hello"))
	if got := echo.LastHeader(); got == nil {
		t.Fatal("the echo provider saw no upgrade")
	}
	creates := f.Creates()
	if len(creates) != 1 || creates[0].Get("X-BB-API-Key") != apiSecret || creates[0].Get("Content-Type") != "application/json" {
		t.Fatalf("create headers: %v", creates)
	}
	var body struct {
		ProjectID    string `json:"projectId"`
		UserMetadata struct {
			Client string `json:"client"`
		} `json:"userMetadata"`
	}
	if err := json.Unmarshal(f.CreateBodies()[0], &body); err != nil || body.ProjectID != "proj-1" || body.UserMetadata.Client != `team "a"` {
		t.Fatalf("create body %s: %v", f.CreateBodies()[0], err)
	}
	gb, _ := pool.Current().Books.Lookup("api-main")
	if gb.Unreleased() != 1 {
		t.Fatalf("unreleased while live: %d", gb.Unreleased())
	}
	st := providerStatus(t, g, "api-main")
	if st.Unreleased == nil || *st.Unreleased != 1 {
		t.Fatalf("status unreleased while live: %v", st.Unreleased)
	}
	c.Close(websocket.StatusNormalClosure, "")
	waitBooks(t, f, "api-main", 1)
	if rb := f.ReleaseBodies(); len(rb) != 1 || string(rb[0]) != `{"id":"s1","status":"REQUEST_RELEASE"}` {
		t.Fatalf("release body: %q", rb)
	}
	st = providerStatus(t, g, "api-main")
	if st.Unreleased == nil || *st.Unreleased != 0 {
		t.Fatalf("status unreleased after: %v", st.Unreleased)
	}
	// The metrics say the same.
	code, m, err := g.AdminDo(http.MethodGet, "/metrics", nil)
	if err != nil || code != 200 {
		t.Fatal(code, err)
	}
	for _, want := range []string{
		`caddy_browser_failover_sessions_created_total{provider="api-main"}`,
		`caddy_browser_failover_sessions_released_total{provider="api-main"}`,
		`caddy_browser_failover_sessions_unreleased{provider="api-main"} 0`,
	} {
		if !strings.Contains(string(m), want) {
			t.Fatalf("metrics lack %s", want)
		}
	}
	if strings.Contains(string(m), apiSecret) || strings.Contains(g.Logs(), apiSecret) {
		t.Fatal("the API key shows in metrics or logs")
	}
}

// providerStatus reads one provider's status object.
func providerStatus(t *testing.T, g *testgw.Gateway, name string) status.Provider {
	t.Helper()
	code, b, err := g.AdminDo(http.MethodGet, status.StatusPath, nil)
	if err != nil || code != 200 {
		t.Fatalf("status: %d %v", code, err)
	}
	if strings.Contains(string(b), apiSecret) {
		t.Fatalf("status shows the API key: %s", b)
	}
	var st status.Status
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Providers {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no provider %s in %s", name, b)
	return status.Provider{}
}

// TestSessionAPIReleaseOnEveryEnd: whatever ends a session or an attempt,
// the provider's books end with created == released.
func TestSessionAPIReleaseOnEveryEnd(t *testing.T) {
	t.Run("provider closes", func(t *testing.T) {
		// A browser that answers one message, then goes away.
		closer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			typ, msg, err := c.Read(context.Background())
			if err == nil {
				c.Write(context.Background(), typ, msg)
			}
			c.Close(websocket.StatusGoingAway, "browser closed")
		}))
		defer closer.Close()
		f := fakes.NewREST(func(string) string { return "ws" + strings.TrimPrefix(closer.URL, "http") + "/" })
		defer f.Close()
		g := testgw.Start(t, handler(`"queue":{"size":0}`, apiProvider("api-pc", f, "")))
		c, _, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		echoOnce(t, c, []byte("x"))
		go c.Read(context.Background())
		waitBooks(t, f, "api-pc", 1)
	})
	t.Run("operator ends it", func(t *testing.T) {
		f, _ := echoREST(t)
		g := testgw.Start(t, handler(`"queue":{"size":0}`, apiProvider("api-op", f, "")))
		c, _, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		ss := listSessions(t, g.Admin)
		if len(ss) != 1 {
			t.Fatalf("sessions: %+v", ss)
		}
		if code, b := deleteSession(t, g.Admin, ss[0].ID); code != 200 {
			t.Fatalf("delete: %d %s", code, b)
		}
		waitBooks(t, f, "api-op", 1)
	})
	t.Run("idle timeout", func(t *testing.T) {
		f, _ := echoREST(t)
		g := testgw.Start(t, handler(`"queue":{"size":0},"session":{"idle_timeout":"300ms"}`, apiProvider("api-idle", f, "")))
		c, _, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		go c.Read(context.Background()) // answer the close
		waitBooks(t, f, "api-idle", 1)
	})
	t.Run("max duration", func(t *testing.T) {
		f, _ := echoREST(t)
		g := testgw.Start(t, handler(`"queue":{"size":0},"session":{"max_duration":"400ms"}`, apiProvider("api-maxdur", f, "")))
		c, _, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		go func() { // busy, never idle
			for range 50 {
				if c.Write(context.Background(), websocket.MessageText, []byte("tick")) != nil {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
		go func() {
			for {
				if _, _, err := c.Read(context.Background()); err != nil {
					return
				}
			}
		}()
		waitBooks(t, f, "api-maxdur", 1)
	})
	t.Run("dial refused after create", func(t *testing.T) {
		refused := fakes.Refused("api-ref")
		defer refused.Close()
		f := fakes.NewREST(func(string) string { return refused.URL() })
		defer f.Close()
		g := testgw.Start(t, handler(`"queue":{"size":0}`, apiProvider("api-ref", f, "")))
		if w := rejectAttempts(t, g.WS("/")); len(w) != 1 || w[0] != upstreams.WordRefused {
			t.Fatalf("attempts: %v", w)
		}
		waitBooks(t, f, "api-ref", 1)
	})
	t.Run("dial times out after create", func(t *testing.T) {
		hang := fakes.Hang("api-hang", nil)
		defer hang.Close()
		f := fakes.NewREST(func(string) string { return hang.URL() })
		defer f.Close()
		g := testgw.Start(t, handler(`"queue":{"size":0},"connect_timeout":"500ms"`, apiProvider("api-hang", f, "")))
		if w := rejectAttempts(t, g.WS("/")); len(w) != 1 || w[0] != upstreams.WordTimeout {
			t.Fatalf("attempts: %v", w)
		}
		waitBooks(t, f, "api-hang", 1)
	})
	t.Run("client leaves during the dial", func(t *testing.T) {
		hang := fakes.Hang("api-hang2", nil)
		defer hang.Close()
		f := fakes.NewREST(func(string) string { return hang.URL() })
		defer f.Close()
		g := testgw.Start(t, handler(`"queue":{"size":0}`, apiProvider("api-gone", f, "")))
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		if c, _, err := websocket.Dial(ctx, g.WS("/"), nil); err == nil {
			c.CloseNow()
			t.Fatal("connected to a hanging provider")
		}
		waitBooks(t, f, "api-gone", 1)
	})
	t.Run("client leaves during create", func(t *testing.T) {
		f, _ := echoREST(t)
		unblock := make(chan struct{})
		entered := make(chan struct{}, 1)
		f.OnCreate = func(http.ResponseWriter, *http.Request) bool {
			entered <- struct{}{}
			<-unblock
			return false // the provider creates the session anyway
		}
		g := testgw.Start(t, handler(`"queue":{"size":0}`, apiProvider("api-gone2", f, "")))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			c, _, err := websocket.Dial(ctx, g.WS("/"), nil)
			if c != nil {
				c.CloseNow()
			}
			done <- err
		}()
		<-entered
		cancel()
		if err := <-done; err == nil {
			t.Fatal("connected after leaving")
		}
		close(unblock)
		waitBooks(t, f, "api-gone2", 1)
	})
	t.Run("hedge loser", func(t *testing.T) {
		fast, _ := echoREST(t)
		slow, _ := echoREST(t)
		var once sync.Once
		gate := make(chan struct{})
		slow.OnCreate = func(http.ResponseWriter, *http.Request) bool {
			<-gate // answers only once the other has won
			return false
		}
		g := testgw.Start(t, handler(`"queue":{"size":0},"hedge_after":"100ms"`,
			apiProvider("api-slow", slow, `"priority":1`), apiProvider("api-fast", fast, `"priority":2`)))
		c, _, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatal(err)
		}
		echoOnce(t, c, []byte("x"))
		once.Do(func() { close(gate) })
		waitBooks(t, slow, "api-slow", 1)
		c.Close(websocket.StatusNormalClosure, "")
		waitBooks(t, fast, "api-fast", 1)
	})
	t.Run("reload", func(t *testing.T) {
		f, _ := echoREST(t)
		g := testgw.Start(t, handler(`"queue":{"size":0}`, apiProvider("api-reload", f, "")))
		c, _, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Reload(handler(`"queue":{"size":3}`, apiProvider("api-reload", f, ""))); err != nil {
			t.Fatal(err)
		}
		echoOnce(t, c, []byte("after reload"))
		if b := f.Books(); len(b.Released) != 0 {
			t.Fatalf("released by the reload: %+v", b)
		}
		c.Close(websocket.StatusNormalClosure, "")
		waitBooks(t, f, "api-reload", 1)
	})
}

// TestSessionAPIReleasedAtExit: SIGTERM to a real Caddy process ends its
// live sessions, and the process waits for their releases (slow ones
// included) before it exits. The Caddyfile form and {env.X} in a header
// are used as an operator would.
func TestSessionAPIReleasedAtExit(t *testing.T) {
	f, _ := echoREST(t)
	var mu sync.Mutex
	var keys []string
	f.OnRelease = func(_ http.ResponseWriter, r *http.Request, _ string) bool {
		mu.Lock()
		keys = append(keys, r.Header.Get("X-BB-API-Key"))
		mu.Unlock()
		time.Sleep(300 * time.Millisecond) // a slow release
		return false
	}
	t.Setenv("BF_TEST_BB_KEY", apiSecret)
	addr, admin := testgw.FreePort(t), testgw.FreePort(t)
	p := startCaddy(t, fmt.Sprintf(`{
	admin %s
	auto_https off
}

http://%s {
	browser_failover {
		provider bb %s {
			session_api {
				create POST /v1/sessions
				header X-BB-API-Key {env.BF_TEST_BB_KEY}
				body `+"`"+`{"projectId": "proj-1"}`+"`"+`
				connect_url /connectUrl
				session_id /id
				release POST /v1/sessions/{session_id}/release
				release_body `+"`"+`{"status": "REQUEST_RELEASE"}`+"`"+`
			}
		}
	}
}
`, admin, addr, f.URL()), func() bool {
		resp, err := http.Get("http://" + addr + "/json/version")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
	var conns []*websocket.Conn
	for i := range 3 {
		c, _, err := dial(t, "ws://"+addr+"/", nil)
		if err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
		defer c.CloseNow()
		echoOnce(t, c, []byte("hi"))
		go c.Read(context.Background())
		conns = append(conns, c)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Fatalf("caddy exited with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("caddy did not exit after SIGTERM")
	}
	b := f.Books()
	if err := b.Balanced(); err != nil || len(b.Created) != 3 {
		t.Fatalf("at exit: %v %+v", err, b)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, k := range keys {
		if k != apiSecret {
			t.Fatalf("a release went without the API key: %q", k)
		}
	}
	if strings.Contains(p.output(), apiSecret) {
		t.Fatal("the API key shows in the output")
	}
}

// TestSessionAPICreateAnswers: create answers are classified like
// handshake answers: 429 is a capacity skip honouring Retry-After, any
// other non-2xx is create_failed, an answer that is not JSON or lacks the
// connect URL is bad_create (and a session it names is released).
func TestSessionAPICreateAnswers(t *testing.T) {
	cases := []struct {
		name   string
		answer func(w http.ResponseWriter)
		word   string
	}{
		{"429", func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "30")
			http.Error(w, "busy", http.StatusTooManyRequests)
		}, "status_429"},
		{"500", func(w http.ResponseWriter) { http.Error(w, "boom", 500) }, upstreams.WordCreateFailed},
		{"401", func(w http.ResponseWriter) { http.Error(w, "bad key", 401) }, upstreams.WordCreateFailed},
		{"not json", func(w http.ResponseWriter) { io.WriteString(w, "<html>") }, upstreams.WordBadCreate},
		{"no id", func(w http.ResponseWriter) { io.WriteString(w, `{"connectUrl":"ws://127.0.0.1:1/"}`) }, upstreams.WordBadCreate},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, _ := echoREST(t)
			f.OnCreate = func(w http.ResponseWriter, _ *http.Request) bool { tc.answer(w); return true }
			name := fmt.Sprintf("api-create-%d", i)
			g := testgw.Start(t, handler(`"queue":{"size":0}`, apiProvider(name, f, "")))
			if w := rejectAttempts(t, g.WS("/")); len(w) != 1 || w[0] != tc.word {
				t.Fatalf("attempts: %v, want [%s]", w, tc.word)
			}
			st := providerStatus(t, g, name)
			if st.LastError != tc.word {
				t.Fatalf("last_error %q", st.LastError)
			}
			if tc.word == "status_429" && st.CooldownUntil == nil {
				t.Fatal("a 429 create answer did not skip the provider")
			}
			if len(f.Books().Created) != 0 {
				t.Fatal("the fake booked a session")
			}
			after, _ := opScrape(t, g)
			const attempts = "caddy_browser_failover_attempts_total"
			if d := after.get(attempts, "outcome="+tc.word, "provider="+name); d != 1 {
				t.Fatalf("attempts_total{outcome=%q,provider=%q} moved %v, want 1", tc.word, name, d)
			}
		})
	}
	t.Run("no connect URL", func(t *testing.T) {
		f := fakes.NewREST(func(string) string { return "" })
		defer f.Close()
		g := testgw.Start(t, handler(`"queue":{"size":0}`, apiProvider("api-nocu", f, "")))
		if w := rejectAttempts(t, g.WS("/")); len(w) != 1 || w[0] != upstreams.WordBadCreate {
			t.Fatalf("attempts: %v", w)
		}
		waitBooks(t, f, "api-nocu", 1)
	})
}

// TestSessionAPIReleaseRetries: a failed release call is tried again and
// each failure counted; the session ends released.
func TestSessionAPIReleaseRetries(t *testing.T) {
	f, _ := echoREST(t)
	var mu sync.Mutex
	calls := 0
	f.OnRelease = func(w http.ResponseWriter, _ *http.Request, _ string) bool {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls <= 2 {
			http.Error(w, "try later", http.StatusBadGateway)
			return true
		}
		return false
	}
	g := testgw.Start(t, handler(`"queue":{"size":0}`, apiProvider("api-retry", f, "")))
	// The gateway's registry is this test's (a fresh one with each
	// start): no wait between the tries.
	pool.Current().Releaser().Sleep = func(time.Duration) {}
	gb, _ := pool.Current().Books.Lookup("api-retry")
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Close(websocket.StatusNormalClosure, "")
	waitBooks(t, f, "api-retry", 1)
	if n := gb.ReleaseFailures.Load(); n != 2 {
		t.Fatalf("release failures %d, want 2", n)
	}
	// Counted by provider: the log is the process's, and a release an
	// earlier test left retrying at its own provider may land in it.
	testgw.Eventually(t, 5*time.Second, "the failures logged", func() bool {
		n := 0
		for _, e := range g.LogEntries("provider session release failed") {
			if e["provider"] == "api-retry" {
				n++
			}
		}
		return n == 2
	})
	if strings.Contains(g.Logs(), apiSecret) {
		t.Fatal("the API key shows in the logs")
	}
}

// TestSessionAPISlowReleaseNeverDelays: while a release hangs at the
// provider, the next client gets its session.
func TestSessionAPISlowReleaseNeverDelays(t *testing.T) {
	f, _ := echoREST(t)
	hold := make(chan struct{})
	inRelease := make(chan struct{}, 4)
	var once sync.Once
	f.OnRelease = func(http.ResponseWriter, *http.Request, string) bool {
		inRelease <- struct{}{}
		<-hold
		return false
	}
	defer once.Do(func() { close(hold) })
	g := testgw.Start(t, handler(`"queue":{"size":0}`, apiProvider("api-slowrel", f, `"max_concurrent":1`)))
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Close(websocket.StatusNormalClosure, "")
	<-inRelease // the release is under way, and hangs
	testgw.Eventually(t, 10*time.Second, "the slot freed", func() bool {
		return providerStatus(t, g, "api-slowrel").Active == 0
	})
	c2, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatalf("the next client waited for a release: %v", err)
	}
	echoOnce(t, c2, []byte("not delayed"))
	c2.Close(websocket.StatusNormalClosure, "")
	once.Do(func() { close(hold) })
	waitBooks(t, f, "api-slowrel", 2)
}

// TestSessionAPIConnectHosts: a create answer whose connect URL points to
// a host other than the create call's (here localhost, the create call
// going to 127.0.0.1) is not dialed: the attempt fails with
// bad_connect_url, counted like any failure, and the session is released.
// connect_hosts opens that host; JSON and the Caddyfile check its values
// alike.
func TestSessionAPIConnectHosts(t *testing.T) {
	echo := fakes.Echo("api-elsewhere-echo", nil)
	defer echo.Close()
	port := echo.Addr[strings.LastIndexByte(echo.Addr, ':')+1:]
	f := fakes.NewREST(func(id string) string { return "ws://localhost:" + port + "/devtools/browser/" + id })
	defer f.Close()

	const name = "api-elsewhere"
	g := testgw.Start(t, handler(`"queue":{"size":0}`, apiProvider(name, f, "")))
	if w := rejectAttempts(t, g.WS("/")); len(w) != 1 || w[0] != upstreams.WordBadConnectURL {
		t.Fatalf("attempts: %v, want [%s]", w, upstreams.WordBadConnectURL)
	}
	if n := echo.Hits.Load(); n != 0 {
		t.Fatalf("the connect URL's host was dialed %d times", n)
	}
	waitBooks(t, f, name, 1)
	if st := providerStatus(t, g, name); st.LastError != upstreams.WordBadConnectURL {
		t.Fatalf("last_error %q", st.LastError)
	}
	after, _ := opScrape(t, g)
	const attempts = "caddy_browser_failover_attempts_total"
	if d := after.get(attempts, "outcome="+upstreams.WordBadConnectURL, "provider="+name); d != 1 {
		t.Fatalf("attempts_total{outcome=%q} moved %v, want 1", upstreams.WordBadConnectURL, d)
	}

	// Named in connect_hosts: dialed.
	named := strings.Replace(apiProvider(name, f, ""), `"release_body"`, `"connect_hosts":["LocalHost"],"release_body"`, 1)
	if err := g.Reload(handler(`"queue":{"size":0}`, named)); err != nil {
		t.Fatal(err)
	}
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatalf("with connect_hosts: %v", err)
	}
	echoOnce(t, c, []byte("allowed"))
	c.Close(websocket.StatusNormalClosure, "")
	waitBooks(t, f, name, 2)
	if strings.Contains(g.Logs(), apiSecret) {
		t.Fatal("the API key shows in the logs")
	}

	// A bad value: JSON validation and the Caddyfile parser say the same,
	// the Caddyfile at its line.
	bad := strings.Replace(apiProvider("api-badhosts", f, ""), `"release_body"`, `"connect_hosts":["connect.example.com:443"],"release_body"`, 1)
	if err := g.Reload(handler("", bad)); err == nil || !strings.Contains(err.Error(), `session_api: connect_hosts: \"connect.example.com:443\" is not a host name`) {
		t.Fatalf("JSON: %v", err)
	}
	caddyfile := ":8080\nbrowser_failover {\n provider a https://api.example.com {\n  session_api {\n   create POST /v1/sessions\n   connect_hosts ok.example.net\n   connect_hosts *.com\n  }\n }\n}"
	if _, err := adapt(t, caddyfile); err == nil || !strings.Contains(err.Error(), `session_api: connect_hosts: "*.com" would allow every site under the public suffix com`) ||
		!strings.Contains(err.Error(), "Caddyfile:7") {
		t.Fatalf("Caddyfile: %v", err)
	}
	if _, err := adapt(t, ":8080\nbrowser_failover {\n provider a https://api.example.com {\n  session_api {\n   connect_hosts\n  }\n }\n}"); err == nil ||
		!strings.Contains(err.Error(), "connect_hosts needs at least one host") {
		t.Fatalf("Caddyfile without a host: %v", err)
	}
	good := ":8080\nbrowser_failover {\n provider a https://api.example.com {\n  session_api {\n   create POST /v1/sessions\n   connect_url /connectUrl\n   session_id /id\n   release DELETE /v1/sessions/{session_id}\n   connect_hosts browsers.example.net 10.0.0.7\n   connect_hosts *.cdn.example.org\n  }\n }\n}"
	out, err := adapt(t, good)
	if err != nil || !strings.Contains(string(out), `"connect_hosts":["browsers.example.net","10.0.0.7","*.cdn.example.org"]`) {
		t.Fatalf("Caddyfile: %v %s", err, out)
	}
}

// TestSessionAPICreateAnswerLimit: a create answer over 64 KiB is read (up
// to the 1 MiB limit); a larger one is bad_create, its session released
// when its ID comes within the limit, otherwise counted in
// session_orphans_total and logged at error level with the provider's
// name, as is a 2xx answer without a session ID.
func TestSessionAPICreateAnswerLimit(t *testing.T) {
	const orphansTotal = "caddy_browser_failover_session_orphans_total"
	const logMsg = "provider session cannot be released: the create answer gave no session ID"
	t.Run("large answer connects", func(t *testing.T) {
		f, _ := echoREST(t)
		f.Pad = 300 << 10
		g := testgw.Start(t, handler(`"queue":{"size":0}`, apiProvider("api-big-ok", f, "")))
		c, _, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatal(err)
		}
		echoOnce(t, c, []byte("big"))
		c.Close(websocket.StatusNormalClosure, "")
		waitBooks(t, f, "api-big-ok", 1)
	})
	t.Run("over the limit, ID within it", func(t *testing.T) {
		f, _ := echoREST(t)
		f.Pad = 2 << 20
		g := testgw.Start(t, handler(`"queue":{"size":0}`, apiProvider("api-big-id", f, "")))
		if w := rejectAttempts(t, g.WS("/")); len(w) != 1 || w[0] != upstreams.WordBadCreate {
			t.Fatalf("attempts: %v", w)
		}
		waitBooks(t, f, "api-big-id", 1)
		after, _ := opScrape(t, g)
		if d := after.get(orphansTotal, "provider=api-big-id"); d != 0 {
			t.Fatalf("orphans moved %v", d)
		}
	})
	for _, tc := range []struct {
		name  string
		setup func(f *fakes.REST)
	}{
		{"over the limit, ID beyond it", func(f *fakes.REST) { f.Pad, f.PadFirst = 2<<20, true }},
		{"no session ID", func(f *fakes.REST) {
			f.OnCreate = func(w http.ResponseWriter, _ *http.Request) bool {
				io.WriteString(w, `{"connectUrl":"ws://127.0.0.1:1/"}`)
				return true
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, _ := echoREST(t)
			tc.setup(f)
			name := "api-orphan-" + strings.ReplaceAll(tc.name, " ", "-")
			name = strings.ReplaceAll(name, ",", "")
			g := testgw.Start(t, handler(`"queue":{"size":0}`, apiProvider(name, f, "")))
			if w := rejectAttempts(t, g.WS("/")); len(w) != 1 || w[0] != upstreams.WordBadCreate {
				t.Fatalf("attempts: %v", w)
			}
			after, body := opScrape(t, g)
			if d := after.get(orphansTotal, "provider="+name); d != 1 {
				t.Fatalf("%s{provider=%q} moved %v, want 1", orphansTotal, name, d)
			}
			if strings.Contains(body, apiSecret) {
				t.Fatal("the API key shows in the metrics")
			}
			var entries []map[string]any
			testgw.Eventually(t, 5*time.Second, "the orphan logged", func() bool {
				entries = nil
				for _, e := range g.LogEntries(logMsg) {
					if e["provider"] == name {
						entries = append(entries, e)
					}
				}
				return len(entries) == 1
			})
			if entries[0]["level"] != "error" {
				t.Fatalf("logged at %v", entries[0]["level"])
			}
			if logs := g.Logs(); strings.Contains(logs, apiSecret) || strings.Contains(logs, "xxxxxxxx") || strings.Contains(logs, "ws://127.0.0.1:1/") {
				t.Fatal("the log shows a header, a URL or the answer's body")
			}
		})
	}
}

// TestLedgerWriteFailsOver: when the ledger cannot be written (Caddy's
// storage broke), a session created over a session API is released at
// once and never dialed, and the client fails over to the next provider;
// the provider is not counted as failing.
func TestLedgerWriteFailsOver(t *testing.T) {
	contacts := &fakes.Contacts{}
	browser := fakes.Echo("api-browser", contacts)
	defer browser.Close()
	f := fakes.NewREST(func(string) string { return browser.URL() })
	defer f.Close()
	plain := fakes.Echo("plain", contacts)
	defer plain.Close()
	g := testgw.Start(t, handler(`"strategy":"priority"`,
		apiProvider("api", f, `"priority":1`), provider("plain", plain.URL(), `"priority":2`)))
	// The storage becomes a file: every write under it fails.
	if err := os.Rename(g.Storage, g.Storage+".gone"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(g.Storage, []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _, err := dial(t, "ws://"+g.Addr+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	echoOnce(t, c, []byte("served by plain"))
	if got := contacts.List(); len(got) != 1 || got[0] != "plain" {
		t.Fatalf("dialed %v, want only plain (the created session is never dialed)", got)
	}
	waitBooks(t, f, "api", 1)
	st := providerStatus(t, g, "api")
	if st.LastError != "ledger_failed" || st.Failures != 0 || st.CooldownUntil != nil || st.Ledger == nil || st.Ledger.Pending != 0 {
		t.Fatalf("api status %+v", st)
	}
	logs := g.Logs()
	if !strings.Contains(logs, "ledger of provider sessions: write failed") || strings.Contains(logs, apiSecret) {
		t.Fatal("the ledger failure is not logged, or the log shows the API key")
	}
}

// TestLedgerKeepsFailingRelease: a session whose release keeps failing
// stays in the ledger, shown as pending in the status, and is released by
// a later round of tries once the provider accepts; nothing is dropped.
func TestLedgerKeepsFailingRelease(t *testing.T) {
	f, _ := echoREST(t)
	var mu sync.Mutex
	refuse := true
	f.OnRelease = func(w http.ResponseWriter, _ *http.Request, _ string) bool {
		mu.Lock()
		defer mu.Unlock()
		if refuse {
			http.Error(w, "try later", http.StatusBadGateway)
		}
		return refuse
	}
	g := testgw.Start(t, handler(`"queue":{"size":0}`, apiProvider("api-keeps", f, "")))
	// The test's own registry: no wait between tries, and the next round
	// runs when the test says.
	rel := pool.Current().Releaser()
	rel.Sleep = func(time.Duration) {}
	rounds := make(chan func(), 8)
	rel.Later = func(_ time.Duration, fn func()) *time.Timer {
		rounds <- fn
		return nil
	}
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Close(websocket.StatusNormalClosure, "")
	var next func()
	select {
	case next = <-rounds:
	case <-time.After(20 * time.Second):
		t.Fatal("no later round after the failed tries")
	}
	st := providerStatus(t, g, "api-keeps")
	if st.Ledger == nil || st.Ledger.Pending != 1 || st.Unreleased == nil || *st.Unreleased != 1 {
		t.Fatalf("status after the failed tries: ledger %+v, unreleased %v", st.Ledger, st.Unreleased)
	}
	mu.Lock()
	refuse = false
	mu.Unlock()
	next()
	waitBooks(t, f, "api-keeps", 1)
	testgw.Eventually(t, 10*time.Second, "the entry removed", func() bool {
		st := providerStatus(t, g, "api-keeps")
		return st.Ledger != nil && st.Ledger.Pending == 0
	})
}

// TestLedgerReapsUntracked: with list and reap_untracked, a session the
// provider lists that no ledger names (created by a process whose ledger
// is lost, or outside the gateway) is released once it has been seen so
// for a reap interval; the gateway's own live session is never touched.
func TestLedgerReapsUntracked(t *testing.T) {
	f, _ := echoREST(t)
	api := `{"create_method":"POST","create_url":"/v1/sessions","connect_url":"/connectUrl","session_id":"/id",` +
		`"release_method":"POST","release_url":"/v1/sessions/{session_id}/release",` +
		`"list_method":"GET","list_url":"/v1/sessions","list_ids":"/sessions","reap_untracked":true}`
	g := testgw.Start(t, handler(`"reap_interval":"300ms"`, fmt.Sprintf(`{"name":"api-list","url":%q,"session_api":%s}`, f.URL(), api)))
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	f.Plant("stray-1")
	testgw.Eventually(t, 10*time.Second, "the stray session released", func() bool { return f.Books().Released["stray-1"] == 1 })
	time.Sleep(time.Second) // more reaps
	b := f.Books()
	if b.Released["stray-1"] != 1 || b.Released["s1"] != 0 {
		t.Fatalf("released %v: want the stray once and the live session not at all", b.Released)
	}
	echoOnce(t, c, []byte("still mine"))
	st := providerStatus(t, g, "api-list")
	if st.Ledger == nil || st.Ledger.Reaped != 1 || st.Ledger.Pending != 1 {
		t.Fatalf("ledger status %+v", st.Ledger)
	}
	var entries []map[string]any // the log is the process's: this provider's
	for _, e := range g.LogEntries("session reaped") {
		if e["provider"] == "api-list" {
			entries = append(entries, e)
		}
	}
	if len(entries) != 1 || entries[0]["owner"] != "untracked" || entries[0]["provider_session_id"] != "stray-1" {
		t.Fatalf("reaped log %v", entries)
	}
}
