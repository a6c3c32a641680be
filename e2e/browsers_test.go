package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"
	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
)

// provider renders one provider's JSON.
func provider(name, u, extra string) string {
	if extra != "" {
		extra = "," + extra
	}
	return fmt.Sprintf(`{"name":%q,"url":%q%s}`, name, u, extra)
}

// handler renders the handler JSON; extra holds more handler keys.
func handler(extra string, providers ...string) string {
	if extra != "" {
		extra = "," + extra
	}
	return fmt.Sprintf(`{"handler":"browser_failover","providers":[%s]%s}`, strings.Join(providers, ","), extra)
}

// active is the provider's live session count (-1: unknown provider).
func active(name string) int64 {
	p, ok := pool.Current().Lookup(name)
	if !ok {
		return -1
	}
	return p.Slots.Active()
}

// waitIdle waits until the named providers hold no session.
func waitIdle(t *testing.T, names ...string) {
	t.Helper()
	testgw.Eventually(t, 10*time.Second, "sessions of "+strings.Join(names, ", ")+" to end", func() bool {
		for _, n := range names {
			if active(n) != 0 {
				return false
			}
		}
		return true
	})
}

// endedAtLeast waits until the log holds at least n "session ended"
// entries (a session's entry follows the give-back of its slot) and
// returns them.
func endedAtLeast(t *testing.T, g *testgw.Gateway, n int) []sessionLog {
	t.Helper()
	testgw.Eventually(t, 10*time.Second, fmt.Sprintf("%d sessions' end in the log", n), func() bool { return len(ended(g)) >= n })
	return ended(g)
}

// ended returns the "session ended" entries, each as provider and the
// attempts' "provider:outcome" words.
func ended(g *testgw.Gateway) []sessionLog {
	var out []sessionLog
	for _, e := range g.LogEntries("session ended") {
		s := sessionLog{Provider: fmt.Sprint(e["provider"]), Reason: fmt.Sprint(e["close_reason"])}
		as, _ := e["attempts"].([]any)
		for _, a := range as {
			m, _ := a.(map[string]any)
			s.Attempts = append(s.Attempts, fmt.Sprintf("%v:%v", m["provider"], m["outcome"]))
		}
		out = append(out, s)
	}
	return out
}

type sessionLog struct {
	Provider string
	Reason   string
	Attempts []string
}

// dataPage is a page with a known title, served without any network.
var dataPage = "data:text/html," + url.PathEscape("<title>hello e2e</title><p>gateway</p>")

// runChromedp connects chromedp's remote allocator to u, opens a tab,
// navigates to dataPage, reads the title and evaluates 6*7; during (if
// set) runs while the session is live.
func runChromedp(t *testing.T, u string, during func(), opts ...remote.Option) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	actx, acancel := remote.NewAllocator(ctx, u, opts...)
	defer acancel()
	cctx, ccancel := chromedp.NewContext(actx)
	defer ccancel()
	start := time.Now()
	title, err := "", chromedp.Do(cctx, chromedp.Navigate(dataPage))
	if err == nil {
		title, err = chromedp.Run(cctx, chromedp.Title())
	}
	var v int
	if err == nil {
		v, err = chromedp.Run(cctx, chromedp.Evaluate[int](`6*7`))
	}
	if err != nil {
		t.Fatalf("chromedp via %s: %v", u, err)
	}
	if title != "hello e2e" || v != 42 {
		t.Fatalf("chromedp via %s: title %q, 6*7 = %d", u, title, v)
	}
	t.Logf("chromedp via %s: title %q, 6*7 = %d in %v", u, title, v, time.Since(start).Round(time.Millisecond))
	if during != nil {
		during()
	}
	// Close the tab, then the connection.
	if err := chromedp.Cancel(cctx); err != nil {
		t.Logf("closing the tab: %v", err)
	}
}

// checkResult checks a client script's RESULT line.
func checkResult(t *testing.T, out, mode string) {
	t.Helper()
	if !strings.Contains(out, "RESULT "+mode+" 42 ") {
		t.Fatalf("%s: no 6*7 = 42 in the output:\n%s", mode, out)
	}
}

// TestRealClientsThroughFailover: two real Chromium providers given as
// http:// URLs (the ws URL is discovered on each connect), the first one
// killed. chromedp, Puppeteer and Playwright, in every way they connect,
// get a working browser through the gateway.
func TestRealClientsThroughFailover(t *testing.T) {
	Require(t, true)
	bs := StartChromiums(t, 2)
	dead, live := bs[0], bs[1]
	dead.Kill()
	g := testgw.Start(t, handler(`"queue":{"size":0},"connect_timeout":"10s","allowed_origins":["http://app.example"]`,
		provider("rc-dead", dead.HTTPURL(), `"priority":1`),
		provider("rc-live", live.HTTPURL(), `"priority":2`)))

	// The gateway's own discovery answer points back at the gateway.
	v, err := JSONVersion(g.HTTP("/"))
	if err != nil {
		t.Fatal(err)
	}
	if v.WebSocketDebuggerURL != g.WS("/") {
		t.Fatalf("gateway's webSocketDebuggerUrl %q, want %q", v.WebSocketDebuggerURL, g.WS("/"))
	}

	sessions := 0
	t.Run("raw-cdp-with-origin", func(t *testing.T) {
		// Chrome refuses an upgrade whose Origin it was not told to allow
		// (403), and so does the gateway, before any provider is asked;
		// an origin that allowed_origins names goes through, and the
		// gateway holds it back from Chromium.
		sessions++
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		withOrigin := &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {"http://app.example"}}}
		foreign := &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {"http://evil.example"}}}
		for name, url := range map[string]string{"Chromium itself": live.WSURL(), "the gateway": g.WS("/")} {
			if c, resp, err := websocket.Dial(ctx, url, foreign); err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
				if c != nil {
					c.CloseNow()
				}
				t.Fatalf("%s took an upgrade with a foreign Origin: %v %v", name, err, resp)
			}
		}
		c, _, err := websocket.Dial(ctx, g.WS("/"), withOrigin)
		if err != nil {
			t.Fatalf("dial with an Origin: %v", err)
		}
		defer c.CloseNow()
		c.SetReadLimit(-1)
		if err := c.Write(ctx, websocket.MessageText, []byte(`{"id":1,"method":"Browser.getVersion"}`)); err != nil {
			t.Fatal(err)
		}
		_, msg, err := c.Read(ctx)
		if err != nil || !strings.Contains(string(msg), `"id":1`) || !strings.Contains(string(msg), `"product"`) {
			t.Fatalf("Browser.getVersion: %v %s", err, msg)
		}
		c.Close(websocket.StatusNormalClosure, "")
	})
	t.Run("chromedp/http", func(t *testing.T) {
		sessions++
		runChromedp(t, g.HTTP("/"), func() {
			if n := active("rc-live"); n != 1 {
				t.Errorf("rc-live holds %d sessions during chromedp's, want 1", n)
			}
		})
	})
	t.Run("chromedp/ws", func(t *testing.T) {
		// chromedp turns a ws:// URL without /devtools/browser/ into a
		// GET /json/version first.
		sessions++
		runChromedp(t, g.WS("/"), nil)
	})
	t.Run("chromedp/ws-direct", func(t *testing.T) {
		sessions++
		runChromedp(t, g.WS("/"), nil, remote.NoModifyURL)
	})
	// Puppeteer and Playwright keep a path prefix and the query of an http
	// URL when they fetch /json/version (chromedp keeps only the query).
	prefixed := g.HTTP("/team/a?token=t1")
	clients := []struct{ name, mode, url, flag string }{
		{"puppeteer/browserWSEndpoint", "puppeteer-ws", g.WS("/"), "--big-screenshot"},
		{"puppeteer/browserURL", "puppeteer-url", g.HTTP("/"), ""},
		{"puppeteer/browserURL-prefix-query", "puppeteer-url", prefixed, ""},
		{"playwright/connectOverCDP-ws", "pw-cdp", g.WS("/"), ""},
		{"playwright/connectOverCDP-http", "pw-cdp", g.HTTP("/"), ""},
		{"playwright/connectOverCDP-http-prefix-query", "pw-cdp", prefixed, ""},
	}
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			sessions++
			args := []string{c.mode, c.url}
			if c.flag != "" {
				args = append(args, c.flag)
			}
			out := RunNode(t, "client.mjs", args...)
			checkResult(t, out, c.mode)
			if c.flag == "--big-screenshot" && !strings.Contains(out, "SCREENSHOT ") {
				t.Fatalf("no screenshot:\n%s", out)
			}
		})
	}

	waitIdle(t, "rc-live", "rc-dead")
	testgw.Eventually(t, 10*time.Second, "every session's end in the log", func() bool { return len(ended(g)) >= sessions })
	logs := ended(g)
	for i, s := range logs {
		if s.Provider != "rc-live" {
			t.Errorf("session %d ran on %s (attempts %v), want rc-live", i, s.Provider, s.Attempts)
		}
	}
	if len(logs) != sessions {
		t.Errorf("%d sessions logged, want %d: %+v", len(logs), sessions, logs)
	}
	if a := logs[0].Attempts; len(a) != 2 || a[0] != "rc-dead:refused" || a[1] != "rc-live:ok" {
		t.Errorf("first session's attempts %v, want [rc-dead:refused rc-live:ok]", a)
	}
}

// TestPlaywrightServerBehindRefused: Playwright's own protocol
// (chromium.connect to a launchServer) through the gateway, failing over
// from a provider that refuses connections.
func TestPlaywrightServerBehindRefused(t *testing.T) {
	Require(t, true)
	srv := StartPlaywrightServer(t)
	refused := testgw.FreePort(t)
	g := testgw.Start(t, handler(`"queue":{"size":0}`,
		provider("pw-refused", "ws://"+refused+"/", `"priority":1`),
		provider("pw-server", srv.WSEndpoint, `"priority":2`)))

	// A client of another Playwright version: the real server answers 428,
	// the gateway goes on (nothing else left here: 503 naming the 428) and
	// does not hold it against the server.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, g.WS("/"), &websocket.DialOptions{HTTPHeader: http.Header{
		"User-Agent":           {"Playwright/1.10.0 (x64; debian 12) node/20.0"},
		"X-Playwright-Browser": {"chromium"},
	}})
	if err == nil {
		c.CloseNow()
		t.Fatal("a client of another Playwright version got a session")
	}
	var body []byte
	if resp != nil {
		body, _ = io.ReadAll(resp.Body)
	}
	if resp == nil || resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"provider":"pw-server","outcome":"status_428"`) {
		t.Fatalf("mismatched client: %v %v %s", err, resp, body)
	}
	if st, _ := pool.Current().Lookup("pw-server"); st.Stats.LastError() != "status_428" {
		t.Logf("pw-server last error %q", st.Stats.LastError())
	}

	checkResult(t, RunNode(t, "client.mjs", "pw-connect", g.WS("/")), "pw-connect")

	waitIdle(t, "pw-server")
	testgw.Eventually(t, 10*time.Second, "the session's end in the log", func() bool { return len(ended(g)) == 1 })
	s := ended(g)[0]
	if s.Provider != "pw-server" || strings.Join(s.Attempts, ",") != "pw-refused:refused,pw-server:ok" {
		t.Fatalf("session %+v, want pw-refused:refused then pw-server:ok", s)
	}
}

// TestChromiumKilledMidSession: the provider of a live session dies. The
// client sees the disconnect, the slot is freed, and the next client goes
// to the other provider.
func TestChromiumKilledMidSession(t *testing.T) {
	Require(t, true)
	bs := StartChromiums(t, 2)
	a, b := bs[0], bs[1]
	g := testgw.Start(t, handler(`"queue":{"size":0}`,
		provider("kill-a", a.HTTPURL(), `"priority":1`),
		provider("kill-b", b.HTTPURL(), `"priority":2`)))

	n := StartNode(t, "client.mjs", "puppeteer-hold", g.WS("/"))
	n.Expect(t, "READY", 60*time.Second)
	if na, nb := active("kill-a"), active("kill-b"); na != 1 || nb != 0 {
		t.Fatalf("live sessions: kill-a %d, kill-b %d; want 1 and 0", na, nb)
	}

	killed := time.Now()
	a.Kill()
	n.Expect(t, "DISCONNECTED", 15*time.Second)
	t.Logf("client saw the disconnect %v after the kill", time.Since(killed).Round(time.Millisecond))
	if err := n.Wait(t, 15*time.Second); err != nil {
		t.Fatalf("client exit: %v\n%s", err, n.Output())
	}
	waitIdle(t, "kill-a")
	testgw.Eventually(t, 10*time.Second, "the session's end in the log", func() bool { return len(ended(g)) == 1 })
	if s := ended(g)[0]; s.Provider != "kill-a" || !strings.HasPrefix(s.Reason, "provider") {
		t.Fatalf("first session %+v, want kill-a ended by the provider", s)
	}

	// The next client lands on kill-b.
	runChromedp(t, g.HTTP("/"), func() {
		if na, nb := active("kill-a"), active("kill-b"); na != 0 || nb != 1 {
			t.Errorf("live sessions during the second client: kill-a %d, kill-b %d; want 0 and 1", na, nb)
		}
	})
	waitIdle(t, "kill-a", "kill-b")
	testgw.Eventually(t, 10*time.Second, "the second session's end in the log", func() bool { return len(ended(g)) == 2 })
	if s := ended(g)[1]; s.Provider != "kill-b" || strings.Join(s.Attempts, ",") != "kill-a:refused,kill-b:ok" {
		t.Fatalf("second session %+v, want kill-a:refused then kill-b:ok", s)
	}
	if pool.Current().Sessions.Count() != 0 {
		t.Fatalf("%d sessions still live", pool.Current().Sessions.Count())
	}
}

// loopbackName returns a host name other than localhost that resolves to
// 127.0.0.1 only (the machine's own name often does), or "".
func loopbackName() string {
	name, err := os.Hostname()
	if err != nil || name == "" || strings.EqualFold(name, "localhost") || net.ParseIP(name) != nil {
		return ""
	}
	addrs, err := net.LookupHost(name)
	if err != nil || len(addrs) == 0 {
		return ""
	}
	for _, a := range addrs {
		if a != "127.0.0.1" {
			return ""
		}
	}
	return name
}

// TestChromiumByHostName: a Chromium provider named by a host name (as in
// http://chrome:9222 in a compose file). Chrome refuses /json/* and the
// WebSocket upgrade alike when Host is neither an IP nor localhost; the
// gateway falls back to the dialed address for both. Needs a name that
// resolves to 127.0.0.1 (the machine's host name, when /etc/hosts maps it
// so); upstreams.TestDiscoverHostFallbackAppliesToUpgrade covers the same
// rule everywhere with a fake.
func TestChromiumByHostName(t *testing.T) {
	Require(t, false)
	name := loopbackName()
	if name == "" {
		t.Skip("no host name other than localhost resolves to 127.0.0.1 only on this machine " +
			"(the machine's name does when /etc/hosts maps it); upstreams.TestDiscoverHostFallbackAppliesToUpgrade covers the rule")
	}
	c := StartChromium(t)
	_, port, _ := net.SplitHostPort(c.Addr)
	byName := "http://" + net.JoinHostPort(name, port)
	// Real Chrome does refuse the name.
	if _, err := JSONVersion(byName); err == nil || !strings.Contains(err.Error(), "Host header") {
		t.Fatalf("Chromium answered /json/version for Host %s: %v", name, err)
	}
	g := testgw.Start(t, handler(`"queue":{"size":0}`, provider("byname", byName, "")))
	runChromedp(t, g.HTTP("/"), nil)
	waitIdle(t, "byname")
}
