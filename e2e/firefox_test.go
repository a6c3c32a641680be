package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/status"
)

// The tests of this file drive real Firefox (Debian's firefox-esr) over
// WebDriver BiDi through the gateway with Puppeteer's BiDi client
// (protocol: 'webDriverBiDi'): providers of protocol bidi, BiDi clients
// told by their /session path, pools of their own beside Chromium's, and
// the session.end the gateway sends when a client leaves without one.
// Each test shares one Firefox among its parts: it starts in seconds.

// checkBiDiResult checks a BiDi client's output: the page's title, 6*7,
// and a Firefox version.
func checkBiDiResult(t *testing.T, out, mode string) {
	t.Helper()
	if !strings.Contains(out, "TITLE hello bidi") {
		t.Errorf("%s: no page title in the output:\n%s", mode, out)
	}
	if !strings.Contains(out, "RESULT "+mode+" 42 firefox/") {
		t.Fatalf("%s: no 6*7 = 42 from a firefox/… browser in the output:\n%s", mode, out)
	}
}

// queueWaiting is how many clients wait in the gateway's queue.
func queueWaiting(t *testing.T, g *testgw.Gateway) int {
	t.Helper()
	code, b, err := g.AdminDo(http.MethodGet, status.StatusPath, nil)
	var st status.Status
	if err != nil || code != http.StatusOK || json.Unmarshal(b, &st) != nil {
		t.Fatalf("status: %d %s (%v)", code, b, err)
	}
	n := 0
	for _, q := range st.Queues {
		n += q.Waiting
	}
	return n
}

// TestFirefoxBiDi: one real Firefox behind the gateway as a bidi provider,
// given by its ws:// endpoint or its http:// address. A BiDi client gets a
// page and Firefox's version; two at once are served one after the other
// (max_concurrent defaults to 1: Firefox runs one BiDi session at a time);
// a client killed mid-session, which never sends session.end, does not
// keep the next one out (the gateway ends the session for it), nor does a
// session an operator ends; a web page cannot open a BiDi session through
// the gateway.
func TestFirefoxBiDi(t *testing.T) {
	RequireFirefox(t)
	ff := StartFirefox(t)
	const mode = "puppeteer-ws"

	for _, tc := range []struct{ name, url string }{{"ws-url", ff.WSURL()}, {"http-url", ff.HTTPURL()}} {
		t.Run(tc.name, func(t *testing.T) {
			g := testgw.Start(t, handler(`"queue":{"size":5,"timeout":"60s"}`,
				provider("ff", tc.url, `"protocol":"bidi","health_check":{"interval":"1s"}`)))
			checkBiDiResult(t, RunNode(t, "client.mjs", mode, g.WS("/session"), "--bidi"), mode)
			servedBy(t, g, 1, "ff")
			st := providerStatus(t, g, "ff")
			if st.MaxConcurrent != 1 {
				t.Errorf("status: max_concurrent %d, want the bidi default 1", st.MaxConcurrent)
			}
			// The health check GETs Firefox's / (its /json/version is 404).
			logEntry(t, g, "probe", "outcome", "ok")
		})
	}

	g := testgw.Start(t, handler(`"queue":{"size":5,"timeout":"60s"}`, provider("ff", ff.WSURL(), `"protocol":"bidi"`)))

	t.Run("two-at-once", func(t *testing.T) {
		// The first client keeps its session until the second waits in
		// the queue for it; the second is served once the first ends.
		release := filepath.Join(t.TempDir(), "release")
		first := StartNode(t, "client.mjs", "puppeteer-idle", g.WS("/session"), "--bidi", "--until-file="+release)
		first.Expect(t, "IDLE", 60*time.Second)
		var out string
		ft := &fatalCatcher{TB: t}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if r := recover(); r != nil && r != errFatal {
					panic(r)
				}
			}()
			out = RunNode(ft, "client.mjs", mode, g.WS("/session"), "--bidi")
		}()
		testgw.Eventually(t, 30*time.Second, "the second client to wait in the queue", func() bool { return queueWaiting(t, g) == 1 })
		if n := active("ff"); n != 1 {
			t.Errorf("ff holds %d sessions while the second client waits, want 1", n)
		}
		if err := os.WriteFile(release, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		first.Expect(t, "AFTER 42", 60*time.Second)
		if err := first.Wait(t, 30*time.Second); err != nil {
			t.Fatalf("the first client: %v\n%s", err, first.Output())
		}
		wg.Wait()
		if ft.msg != "" {
			t.Fatal(ft.msg)
		}
		checkBiDiResult(t, out, mode)
		servedBy(t, g, 2, "ff")
	})

	t.Run("killed-client", func(t *testing.T) {
		before := len(ended(g))
		n := StartNode(t, "client.mjs", "puppeteer-hold", g.WS("/session"), "--bidi")
		n.Expect(t, "READY", 60*time.Second)
		ss := sessionsList(t, g)
		if len(ss) != 1 || ss[0].Protocol != "bidi" || ss[0].Provider != "ff" {
			t.Fatalf("sessions list %+v, want one bidi session on ff", ss)
		}
		// Killed: no session.end from the client, its connection reset by
		// the kernel. Without the gateway's session.end, Firefox would
		// refuse every later session ("Maximum number of active
		// sessions") until it restarts.
		syscall.Kill(-n.p.cmd.Process.Pid, syscall.SIGKILL)
		waitIdle(t, "ff")
		checkBiDiResult(t, RunNode(t, "client.mjs", mode, g.WS("/session"), "--bidi"), mode)
		logs := endedAtLeast(t, g, before+2)[before:]
		if len(logs) != 2 || !strings.HasPrefix(logs[0].Reason, "client") {
			t.Errorf("sessions ended: %+v, want the killed client's (a client end reason), then the next one's", logs)
		}
	})

	t.Run("operator-end", func(t *testing.T) {
		// An operator ends a live session: the gateway sends Firefox
		// session.end right before its close frame, so Firefox is free
		// for the next client.
		n := StartNode(t, "client.mjs", "puppeteer-hold", g.WS("/session"), "--bidi")
		n.Expect(t, "READY", 60*time.Second)
		ss := sessionsList(t, g)
		if len(ss) != 1 {
			t.Fatalf("sessions list %+v, want one session", ss)
		}
		code, b, err := g.AdminDo(http.MethodDelete, status.SessionsPath+"/"+ss[0].ID, nil)
		if err != nil || code != http.StatusOK {
			t.Fatalf("DELETE session: %d %s (%v)", code, b, err)
		}
		waitIdle(t, "ff")
		logEntry(t, g, "session ended", "close_reason", "closed by operator")
		checkBiDiResult(t, RunNode(t, "client.mjs", mode, g.WS("/session"), "--bidi"), mode)
	})

	t.Run("foreign-origin", func(t *testing.T) {
		before := len(attemptsOf(g, "ff"))
		h := http.Header{"Origin": {"http://evil.example"}}
		if code, _ := rawDial(t, g.WS("/session"), h); code != http.StatusForbidden {
			t.Errorf("a BiDi upgrade with a foreign Origin got %d, want 403", code)
		}
		if a := attemptsOf(g, "ff"); len(a) != before {
			t.Errorf("Firefox was contacted for an upgrade with a foreign Origin: %v", a[before:])
		}
	})
}

// TestChromiumAndFirefoxPools: a real Chromium and a real Firefox behind one
// gateway, of protocols cdp and bidi. Whatever their priorities, each
// client reaches its own kind: Puppeteer over CDP gets Chromium, Puppeteer
// over BiDi gets Firefox, and neither is ever tried for the other kind.
// With Chromium drained, a CDP client gets 503, never Firefox; with no
// provider for it at all, 502.
func TestChromiumAndFirefoxPools(t *testing.T) {
	RequireFirefox(t)
	// Both browsers start at once.
	var c *Chromium
	ft := &fatalCatcher{TB: t}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() {
			if r := recover(); r != nil && r != errFatal {
				panic(r)
			}
		}()
		c = StartChromium(ft)
	}()
	ff := StartFirefox(t)
	wg.Wait()
	if ft.msg != "" {
		t.Fatal(ft.msg)
	}
	queue := `"queue":{"size":5,"timeout":"30s"}`

	for _, tc := range []struct{ name, chromium, firefox string }{
		{"firefox-first", `"priority":2,"protocol":"cdp"`, `"priority":1,"protocol":"bidi"`},
		{"chromium-first", `"priority":1,"protocol":"cdp"`, `"priority":2,"protocol":"bidi"`},
		{"same-priority", `"protocol":"cdp"`, `"protocol":"bidi"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := testgw.Start(t, handler(queue+`,"strategy":"round_robin"`,
				provider("mx-chromium", c.HTTPURL(), tc.chromium),
				provider("mx-firefox", ff.HTTPURL(), tc.firefox)))
			checkResult(t, RunNode(t, "client.mjs", "puppeteer-ws", g.WS("/")), "puppeteer-ws")
			checkBiDiResult(t, RunNode(t, "client.mjs", "puppeteer-ws", g.WS("/session"), "--bidi"), "puppeteer-ws")
			waitIdle(t, "mx-chromium", "mx-firefox")
			testgw.Eventually(t, 10*time.Second, "2 sessions' end in the log", func() bool { return len(ended(g)) >= 2 })
			for i, s := range ended(g) {
				want := "mx-chromium"
				if i%2 == 1 {
					want = "mx-firefox"
				}
				if s.Provider != want || s.Attempts[len(s.Attempts)-1] != want+":ok" {
					t.Errorf("session %d ran on %s (attempts %v), want %s", i, s.Provider, s.Attempts, want)
				}
			}
			for _, who := range []struct{ name, other string }{{"mx-chromium", "mx-firefox"}, {"mx-firefox", "mx-chromium"}} {
				for _, a := range attemptsOf(g, who.name) {
					if a != "ok" {
						t.Errorf("%s had an attempt %s: a client of %s's kind reached it", who.name, a, who.other)
					}
				}
			}
		})
	}

	t.Run("chromium-drained", func(t *testing.T) {
		g := testgw.Start(t, handler(queue,
			provider("dr-chromium", c.HTTPURL(), `"priority":2,"protocol":"cdp"`),
			provider("dr-firefox", ff.WSURL(), `"priority":1,"protocol":"bidi"`)))
		act(t, g, "dr-chromium", "drain")
		line := probe(t, "puppeteer-ws", g.WS("/"))
		if !strings.HasPrefix(line, "FAILED") || !strings.Contains(line, "503") {
			t.Errorf("Puppeteer over CDP with Chromium drained: %s; want a failure naming 503", line)
		}
		if code, _ := rawDial(t, g.WS("/devtools/browser/x"), nil); code != http.StatusServiceUnavailable {
			t.Errorf("a CDP handshake with Chromium drained got %d, want 503", code)
		}
		neverAttempted(t, g, "dr-firefox", "dr-chromium")
		// Firefox still serves its own kind.
		checkBiDiResult(t, RunNode(t, "client.mjs", "puppeteer-ws", g.WS("/session"), "--bidi"), "puppeteer-ws")
	})

	t.Run("firefox-only", func(t *testing.T) {
		g := testgw.Start(t, handler(queue, provider("fo-firefox", ff.WSURL(), `"protocol":"bidi"`)))
		code, body := rawDial(t, g.WS("/"), nil)
		if code != http.StatusBadGateway || !strings.Contains(string(body), "CDP") {
			t.Errorf("a CDP handshake to a gateway of Firefox only got %d %s, want 502 naming CDP", code, body)
		}
		neverAttempted(t, g, "fo-firefox")
	})
}
