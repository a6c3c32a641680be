package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"
	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/status"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// The tests of this file check the provider options protocol and
// playwright_version with real clients and real servers: which protocol each
// real client is recognised as, and where the gateway sends it.

// oldPlaywright is the npm alias of package.json for a playwright-core of
// another major.minor than the main one (its launchServer answers 428 to
// clients of the main version).
const oldPlaywright = "playwright-core-old"

// playwrightVersion returns the version of e2e/node_modules/<pkg> and its
// major.minor.
func playwrightVersion(t testing.TB, pkg string) (full, majorMinor string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir(t), "node_modules", pkg, "package.json"))
	if err != nil {
		t.Fatalf("reading %s's version: %v", pkg, err)
	}
	var p struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(b, &p); err != nil || p.Version == "" {
		t.Fatalf("%s's package.json has no version (%v)", pkg, err)
	}
	mm, err := upstreams.ParsePlaywrightVersion(strings.Join(strings.SplitN(p.Version, ".", 3)[:2], "."))
	if err != nil {
		t.Fatalf("%s version %q: %v", pkg, p.Version, err)
	}
	return p.Version, mm
}

// requireOldPlaywright is Require for the second playwright-core (setup.sh
// installs it): it skips without it, or fails under CI=true.
func requireOldPlaywright(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir(t), "node_modules", oldPlaywright, "package.json")); err == nil {
		return
	}
	msg := "browser e2e suite: missing e2e/node_modules/" + oldPlaywright + "; run e2e/setup.sh"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " (CI=true: not skipping)")
	}
	t.Skip(msg)
}

// startPlaywrightServerOf starts a launchServer of the playwright-core
// package pkg (js/pw-server-of.mjs) and returns it with the version that
// runs it.
func startPlaywrightServerOf(t testing.TB, pkg string) (*PlaywrightServer, string) {
	t.Helper()
	n := StartNode(t, "pw-server-of.mjs", pkg)
	f := strings.Fields(strings.TrimPrefix(n.Expect(t, "WS ", 60*time.Second), "WS "))
	if len(f) != 2 {
		t.Fatalf("pw-server-of.mjs printed %v, want WS <endpoint> <version>", f)
	}
	return &PlaywrightServer{WSEndpoint: f[0], n: n}, f[1]
}

// probe runs js/probe.mjs: one connection attempt by a real client that may
// fail. It returns the CONNECTED or FAILED line.
func probe(t *testing.T, mode, u string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), nodeTimeout)
	defer cancel()
	cmd := nodeCmd(ctx, t, "probe.mjs", mode, u)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil || err != nil {
		t.Fatalf("node probe.mjs %s %s: %v (%v)\nstdout:\n%s\nstderr:\n%s", mode, u, err, ctx.Err(), stdout.String(), stderr.String())
	}
	for _, line := range strings.Split(stdout.String(), "\n") {
		if strings.HasPrefix(line, "CONNECTED") || strings.HasPrefix(line, "FAILED") {
			t.Logf("probe %s %s: %s", mode, u, line)
			return line
		}
	}
	t.Fatalf("node probe.mjs %s %s printed neither CONNECTED nor FAILED:\n%s\nstderr:\n%s", mode, u, stdout.String(), stderr.String())
	return ""
}

// providerStatus reads one provider's object from the admin API's status.
func providerStatus(t *testing.T, g *testgw.Gateway, name string) status.Provider {
	t.Helper()
	code, b, err := g.AdminDo(http.MethodGet, status.StatusPath, nil)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	var st status.Status
	if code != http.StatusOK || json.Unmarshal(b, &st) != nil {
		t.Fatalf("status: %d %s", code, b)
	}
	for _, p := range st.Providers {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no provider %q in the status: %s", name, b)
	return status.Provider{}
}

// attemptsOf returns the outcomes of the debug "attempt" log entries of
// one provider (one entry per handshake the gateway tried with it).
func attemptsOf(g *testgw.Gateway, name string) []string {
	var out []string
	for _, e := range g.LogEntries("attempt") {
		if e["provider"] == name {
			out = append(out, fmt.Sprint(e["outcome"]))
		}
	}
	return out
}

// neverAttempted checks that the gateway tried no handshake with the named
// providers: no attempt in the log, no attempt counted in status. (A
// "session ended" entry may still list a provider passed over, so it is
// only logged.)
func neverAttempted(t *testing.T, g *testgw.Gateway, names ...string) {
	t.Helper()
	for _, name := range names {
		if a := attemptsOf(g, name); len(a) != 0 {
			t.Errorf("%s was attempted: %v", name, a)
		}
		if st := providerStatus(t, g, name); st.Attempts != 0 || st.Failures != 0 {
			t.Errorf("%s's status counts %d attempts and %d failures, want none", name, st.Attempts, st.Failures)
		}
	}
}

// servedBy waits for n "session ended" entries and checks that each ran
// on provider, its last attempt provider:ok.
func servedBy(t *testing.T, g *testgw.Gateway, n int, provider string) []sessionLog {
	t.Helper()
	waitIdle(t, provider)
	testgw.Eventually(t, 10*time.Second, fmt.Sprintf("%d sessions' end in the log", n), func() bool { return len(ended(g)) >= n })
	logs := ended(g)
	if len(logs) != n {
		t.Errorf("%d sessions logged, want %d: %+v", len(logs), n, logs)
	}
	for i, s := range logs {
		t.Logf("session %d: provider %s, attempts %v", i, s.Provider, s.Attempts)
		if s.Provider != provider || len(s.Attempts) == 0 || s.Attempts[len(s.Attempts)-1] != provider+":ok" {
			t.Errorf("session %d ran on %s (attempts %v), want %s", i, s.Provider, s.Attempts, provider)
		}
	}
	return logs
}

// playwrightHandshake is the handshake of chromium.connect() of the given
// version, as TestClientProtocolOfRealClients records it.
func playwrightHandshake(version string) http.Header {
	return http.Header{
		"User-Agent":           {"Playwright/" + version + " (x64; debian 12) node/20.20"},
		"X-Playwright-Browser": {"chromium"},
		"X-Playwright-Proxy":   {""},
	}
}

// rawDial dials u with the given handshake headers and expects a refusal:
// it returns the status and body of the answer.
func rawDial(t *testing.T, u string, h http.Header) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: h})
	if err == nil {
		c.CloseNow()
		t.Fatalf("dial %s: got a session, want a refusal", u)
	}
	if resp == nil {
		t.Fatalf("dial %s: no answer: %v", u, err)
	}
	body, _ := io.ReadAll(resp.Body)
	t.Logf("dial %s: %d %s %s", u, resp.StatusCode, resp.Header.Get("Content-Type"), bytes.TrimSpace(body))
	return resp.StatusCode, body
}

// handshakeRecorder is an HTTP server that records the WebSocket upgrade
// requests it gets and answers each with 500 (it is no browser).
type handshakeRecorder struct {
	srv   *httptest.Server
	mu    sync.Mutex
	seen  []http.Header
	paths []string // of the handshakes in seen
}

func startHandshakeRecorder(t *testing.T) *handshakeRecorder {
	r := &handshakeRecorder{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !strings.EqualFold(req.Header.Get("Upgrade"), "websocket") {
			http.NotFound(w, req)
			return
		}
		r.mu.Lock()
		r.seen = append(r.seen, req.Header.Clone())
		r.paths = append(r.paths, req.URL.Path)
		r.mu.Unlock()
		http.Error(w, "not a browser", http.StatusInternalServerError)
	}))
	t.Cleanup(r.srv.Close)
	if !strings.HasPrefix(r.srv.URL, "http://127.0.0.1:") {
		t.Fatalf("recorder listens on %s, want 127.0.0.1", r.srv.URL)
	}
	return r
}

// WS is the recorder's ws:// URL for path.
func (r *handshakeRecorder) WS(path string) string {
	return "ws" + strings.TrimPrefix(r.srv.URL, "http") + path
}

// take returns the handshakes recorded since the last call.
func (r *handshakeRecorder) take() []http.Header {
	out, _ := r.takeWithPaths()
	return out
}

// takeWithPaths returns the handshakes recorded since the last call, and
// their paths.
func (r *handshakeRecorder) takeWithPaths() ([]http.Header, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out, paths := r.seen, r.paths
	r.seen, r.paths = nil, nil
	return out, paths
}

// formatHeaders renders a handshake's headers, sorted, without the random
// Sec-WebSocket-Key.
func formatHeaders(h http.Header) string {
	keys := make([]string, 0, len(h))
	for k := range h {
		if k != "Sec-Websocket-Key" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %s: %q", k, strings.Join(h[k], ", "))
	}
	return b.String()
}

// TestClientProtocolOfRealClients points each real client at a server that
// records its handshake, and checks what upstreams.ClientProtocol makes of
// it. Recorded with puppeteer-core 25.16.0, playwright-core 1.65.1 (and
// 1.64.1) on node 20, chromedp v0.23.0; besides Host, Connection: Upgrade,
// Upgrade: websocket, Sec-WebSocket-Version: 13 and Sec-WebSocket-Key:
//
//   - puppeteer.connect({browserWSEndpoint}):
//     User-Agent: Puppeteer 25.16.0 — no permessage-deflate offer.
//   - chromium.connectOverCDP(ws url):
//     User-Agent: Playwright/1.65.1 (x64; debian 12) node/20.20,
//     Sec-WebSocket-Extensions: permessage-deflate; client_no_context_takeover; client_max_window_bits.
//     A Playwright User-Agent, yet CDP: why the User-Agent alone does not
//     count.
//   - chromium.connect(ws url):
//     User-Agent: Playwright/1.65.1 (x64; debian 12) node/20.20,
//     Sec-WebSocket-Extensions as connectOverCDP,
//     x-playwright-browser: chromium, x-playwright-proxy: "" (empty).
//     1.64.1 sends the same with Playwright/1.64.1.
//   - chromedp remote allocator: Accept-Encoding: gzip and
//     User-Agent: Go-http-client/1.1 (Go's own handshake defaults); no
//     extensions offer.
func TestClientProtocolOfRealClients(t *testing.T) {
	Require(t, true)
	full, mm := playwrightVersion(t, "playwright-core")
	rec := startHandshakeRecorder(t)

	clients := []struct {
		name    string
		connect func(t *testing.T)
		proto   upstreams.Protocol
		version string
	}{
		{"puppeteer/browserWSEndpoint", func(t *testing.T) {
			probe(t, "puppeteer-ws", rec.WS("/devtools/browser/recorder"))
		}, upstreams.ProtocolCDP, ""},
		{"playwright/connectOverCDP", func(t *testing.T) {
			probe(t, "pw-cdp", rec.WS("/devtools/browser/recorder"))
		}, upstreams.ProtocolCDP, ""},
		{"playwright/connect", func(t *testing.T) {
			probe(t, "pw-connect", rec.WS("/recorder"))
		}, upstreams.ProtocolPlaywright, mm},
		{"puppeteer/webDriverBiDi", func(t *testing.T) {
			probe(t, "puppeteer-bidi", rec.WS("/session"))
		}, upstreams.ProtocolBiDi, ""},
		{"chromedp/remote", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			actx, acancel := remote.NewAllocator(ctx, rec.WS("/devtools/browser/recorder"), remote.NoModifyURL)
			defer acancel()
			cctx, ccancel := chromedp.NewContext(actx)
			defer ccancel()
			err := chromedp.Do(cctx)
			t.Logf("chromedp: %v", err)
		}, upstreams.ProtocolCDP, ""},
	}
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			rec.take()
			c.connect(t)
			seen, paths := rec.takeWithPaths()
			if len(seen) == 0 {
				t.Fatal("the client sent no WebSocket handshake")
			}
			h := seen[0]
			t.Logf("%d handshake(s); the first, on %s:%s", len(seen), paths[0], formatHeaders(h))
			p, v := upstreams.ClientProtocol(h, paths[0])
			if p != c.proto || v != c.version {
				t.Fatalf("ClientProtocol = %q %q, want %q %q", p, v, c.proto, c.version)
			}
			if ua := h.Get("User-Agent"); c.proto == upstreams.ProtocolPlaywright && !strings.Contains(ua, "Playwright/"+full) {
				t.Errorf("chromium.connect's User-Agent %q does not name Playwright/%s", ua, full)
			}
		})
	}
}

// TestCDPClientsOnlyOnCDPProviders: a Playwright server (protocol
// playwright) ahead of a Chromium (protocol cdp). Every CDP client lands on
// the Chromium, and the Playwright server is never tried.
func TestCDPClientsOnlyOnCDPProviders(t *testing.T) {
	Require(t, true)
	srv := StartPlaywrightServer(t)
	c := StartChromium(t)
	g := testgw.Start(t, handler(`"queue":{"size":0}`,
		provider("pc-pw", srv.WSEndpoint, `"priority":1,"protocol":"playwright"`),
		provider("pc-cdp", c.HTTPURL(), `"priority":2,"protocol":"cdp"`)))

	sessions := 0
	for _, cl := range []struct{ name, mode, url string }{
		{"puppeteer/browserWSEndpoint", "puppeteer-ws", g.WS("/")},
		{"puppeteer/browserURL", "puppeteer-url", g.HTTP("/")},
		{"playwright/connectOverCDP-ws", "pw-cdp", g.WS("/")},
		{"playwright/connectOverCDP-http", "pw-cdp", g.HTTP("/")},
	} {
		t.Run(cl.name, func(t *testing.T) {
			sessions++
			checkResult(t, RunNode(t, "client.mjs", cl.mode, cl.url), cl.mode)
		})
	}
	t.Run("chromedp", func(t *testing.T) {
		sessions++
		runChromedp(t, g.HTTP("/"), nil)
	})

	servedBy(t, g, sessions, "pc-cdp")
	neverAttempted(t, g, "pc-pw")
}

// TestPlaywrightConnectSkipsCDP: a Chromium (protocol cdp) ahead of a
// Playwright server of the client's version. chromium.connect() lands on
// the Playwright server without trying the Chromium; a CDP client still
// lands on the Chromium.
func TestPlaywrightConnectSkipsCDP(t *testing.T) {
	Require(t, true)
	_, mm := playwrightVersion(t, "playwright-core")
	srv := StartPlaywrightServer(t)
	c := StartChromium(t)
	g := testgw.Start(t, handler(`"queue":{"size":0}`,
		provider("ps-cdp", c.HTTPURL(), `"priority":1,"protocol":"cdp"`),
		provider("ps-pw", srv.WSEndpoint, fmt.Sprintf(`"priority":2,"protocol":"playwright","playwright_version":%q`, mm))))

	checkResult(t, RunNode(t, "client.mjs", "pw-connect", g.WS("/")), "pw-connect")
	servedBy(t, g, 1, "ps-pw")
	neverAttempted(t, g, "ps-cdp")
	if a := attemptsOf(g, "ps-pw"); len(a) != 1 || a[0] != "ok" {
		t.Errorf("ps-pw's attempts %v, want [ok]", a)
	}

	// The other way round: a CDP client never meets the Playwright server.
	runChromedp(t, g.HTTP("/"), nil)
	waitIdle(t, "ps-cdp", "ps-pw")
	testgw.Eventually(t, 10*time.Second, "the CDP session's end in the log", func() bool { return len(ended(g)) == 2 })
	if s := ended(g)[1]; s.Provider != "ps-cdp" {
		t.Errorf("the CDP client's session %+v, want it on ps-cdp", s)
	}
	if a := attemptsOf(g, "ps-pw"); len(a) != 1 {
		t.Errorf("ps-pw's attempts %v after the CDP client, want only the Playwright client's", a)
	}
}

// TestPlaywrightVersionMismatch428: a launchServer of an older
// playwright-core answers 428 to a client of the main version. The gateway
// goes on to the server of the right version without holding the 428
// against the old one; and once the old server declares its version, or
// the right one declares its own, the client never tries the old one.
func TestPlaywrightVersionMismatch428(t *testing.T) {
	Require(t, true)
	requireOldPlaywright(t)
	curFull, curMM := playwrightVersion(t, "playwright-core")
	oldFull, oldMM := playwrightVersion(t, oldPlaywright)
	if curMM == oldMM {
		t.Fatalf("%s is %s, of the same major.minor as playwright-core %s: package.json must pin another one", oldPlaywright, oldFull, curFull)
	}
	old, oldRuns := startPlaywrightServerOf(t, oldPlaywright)
	if oldRuns != oldFull {
		t.Fatalf("the old server runs playwright-core %s, want %s", oldRuns, oldFull)
	}
	cur := StartPlaywrightServer(t)

	// The real servers themselves: the old one answers 428 to a client of
	// the main version; the current one takes it.
	if code, body := rawDial(t, old.WSEndpoint, playwrightHandshake(curFull)); code != http.StatusPreconditionRequired {
		t.Fatalf("playwright-core %s's server answered %d %s to a %s client, want 428", oldFull, code, body, curFull)
	}
	if line := probe(t, "pw-connect", old.WSEndpoint); !strings.HasPrefix(line, "FAILED") {
		t.Fatalf("chromium.connect %s to a %s server: %s", curFull, oldFull, line)
	}
	if line := probe(t, "pw-connect", cur.WSEndpoint); !strings.HasPrefix(line, "CONNECTED") {
		t.Fatalf("chromium.connect %s to a %s server: %s", curFull, curFull, line)
	}

	t.Run("428-skipped-without-failure", func(t *testing.T) {
		g := testgw.Start(t, handler(`"queue":{"size":0}`,
			provider("mm-old", old.WSEndpoint, `"priority":1,"protocol":"playwright"`),
			provider("mm-cur", cur.WSEndpoint, `"priority":2,"protocol":"playwright"`)))
		checkResult(t, RunNode(t, "client.mjs", "pw-connect", g.WS("/")), "pw-connect")
		s := servedBy(t, g, 1, "mm-cur")[0]
		if got := strings.Join(s.Attempts, ","); got != "mm-old:status_428,mm-cur:ok" {
			t.Errorf("attempts %s, want mm-old:status_428,mm-cur:ok", got)
		}
		if a := attemptsOf(g, "mm-old"); len(a) != 1 || a[0] != "status_428" {
			t.Errorf("mm-old's attempt entries %v, want [status_428]", a)
		}
		st := providerStatus(t, g, "mm-old")
		t.Logf("mm-old status: %+v", st)
		if st.Failures != 0 || !st.Healthy || st.CooldownUntil != nil {
			t.Errorf("mm-old after its 428: failures %d, healthy %v, cooldown until %v; want 0, true, none", st.Failures, st.Healthy, st.CooldownUntil)
		}
	})

	t.Run("old-version-declared", func(t *testing.T) {
		g := testgw.Start(t, handler(`"queue":{"size":0}`,
			provider("mv-old", old.WSEndpoint, fmt.Sprintf(`"priority":1,"protocol":"playwright","playwright_version":%q`, oldMM)),
			provider("mv-cur", cur.WSEndpoint, `"priority":2,"protocol":"playwright"`)))
		checkResult(t, RunNode(t, "client.mjs", "pw-connect", g.WS("/")), "pw-connect")
		servedBy(t, g, 1, "mv-cur")
		neverAttempted(t, g, "mv-old")
	})

	t.Run("exact-version-preferred", func(t *testing.T) {
		// The old server, undeclared, comes first by priority; the
		// current one declares the client's version and is preferred.
		g := testgw.Start(t, handler(`"queue":{"size":0}`,
			provider("mp-old", old.WSEndpoint, `"priority":1,"protocol":"playwright"`),
			provider("mp-cur", cur.WSEndpoint, fmt.Sprintf(`"priority":2,"protocol":"playwright","playwright_version":%q`, curMM))))
		checkResult(t, RunNode(t, "client.mjs", "pw-connect", g.WS("/")), "pw-connect")
		servedBy(t, g, 1, "mp-cur")
		neverAttempted(t, g, "mp-old")
	})
}

// TestNoProviderCouldServe502: no configured provider could ever serve a
// Playwright client (only CDP providers; or a Playwright server declared of
// another version). The client gets 502 with a JSON error at once, though a
// queue is configured, and the gateway logs it as rejected; no provider is
// tried.
func TestNoProviderCouldServe502(t *testing.T) {
	Require(t, true)
	curFull, _ := playwrightVersion(t, "playwright-core")
	c := StartChromium(t)
	// The queue would hold a client for two minutes: far longer than the
	// clients below wait (30 s), so a queued client fails the test.
	queue := `"queue":{"size":10,"timeout":"2m"}`

	check := func(t *testing.T, g *testgw.Gateway, providers ...string) {
		t.Helper()
		line := probe(t, "pw-connect", g.WS("/"))
		if !strings.HasPrefix(line, "FAILED") || !strings.Contains(line, "502") {
			t.Errorf("chromium.connect through the gateway: %s; want a failure naming 502", line)
		}
		code, body := rawDial(t, g.WS("/"), playwrightHandshake(curFull))
		var answer struct {
			Error string `json:"error"`
		}
		if code != http.StatusBadGateway || json.Unmarshal(body, &answer) != nil || answer.Error == "" {
			t.Errorf("a raw Playwright handshake got %d %s; want 502 with a JSON error", code, body)
		}
		testgw.Eventually(t, 10*time.Second, "two rejected entries in the log", func() bool { return len(g.LogEntries("rejected")) >= 2 })
		for _, e := range g.LogEntries("rejected") {
			t.Logf("rejected: %v", e)
			if fmt.Sprint(e["status"]) != "502" {
				t.Errorf("rejected with status %v, want 502", e["status"])
			}
		}
		if n := len(g.LogEntries("rejected")); n != 2 {
			t.Errorf("%d rejected entries, want 2", n)
		}
		neverAttempted(t, g, providers...)

		// CDP clients are still served.
		runChromedp(t, g.HTTP("/"), nil)
		waitIdle(t, providers...)
	}

	t.Run("only-cdp-providers", func(t *testing.T) {
		g := testgw.Start(t, handler(queue,
			provider("np-cdp-a", c.HTTPURL(), `"priority":1,"protocol":"cdp"`),
			provider("np-cdp-b", "ws://"+testgw.FreePort(t)+"/", `"priority":2,"protocol":"cdp"`)))
		check(t, g, "np-cdp-a", "np-cdp-b")
	})
	t.Run("playwright-of-another-version-only", func(t *testing.T) {
		// Nothing listens at the Playwright provider's address: it must
		// not be tried anyway.
		g := testgw.Start(t, handler(queue,
			provider("nv-cdp", c.HTTPURL(), `"priority":1,"protocol":"cdp"`),
			provider("nv-pw", "ws://"+testgw.FreePort(t)+"/", `"priority":2,"protocol":"playwright","playwright_version":"1.0"`)))
		check(t, g, "nv-cdp", "nv-pw")
	})
}
