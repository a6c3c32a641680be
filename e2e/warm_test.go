package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp/remote"

	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
)

// TestWarmSessionsRealClients: a real Chromium behind a provider with
// warm 1: Puppeteer, Playwright (connectOverCDP) and chromedp are each
// handed the browser connection the gateway opened before they came, and
// work it; the warm session is refilled after each.
func TestWarmSessionsRealClients(t *testing.T) {
	Require(t, true)
	chrome := StartChromium(t)
	g := testgw.Start(t, handler(`"queue":{"size":0}`, provider("warm-chrome", chrome.HTTPURL(), `"warm":1`)))
	waitReady := func() {
		testgw.Eventually(t, 20*time.Second, "a warm session ready", func() bool {
			p, ok := pool.Current().Lookup("warm-chrome")
			ready, _ := p.Warm()
			return ok && ready == 1
		})
	}
	waitReady()
	checkResult(t, RunNode(t, "client.mjs", "puppeteer-ws", g.WS("/")), "puppeteer-ws")
	waitReady()
	checkResult(t, RunNode(t, "client.mjs", "pw-cdp", g.WS("/")), "pw-cdp")
	waitReady()
	runChromedp(t, g.WS("/"), nil, remote.NoModifyURL)
	waitIdle(t, "warm-chrome")
	// The entry is written once the session's relay has wound down,
	// which may come after its slot is free.
	testgw.Eventually(t, 20*time.Second, "three sessions ended", func() bool { return len(g.LogEntries("session ended")) >= 3 })
	entries := g.LogEntries("session ended")
	if len(entries) != 3 {
		t.Fatalf("%d sessions ended, want 3", len(entries))
	}
	for i, e := range entries {
		if e["warm"] != true {
			t.Fatalf("client %d was not handed the warm session: %v", i, e)
		}
	}
	if out := chrome.Output(); strings.Contains(out, "FATAL") {
		t.Fatalf("chromium: %s", out)
	}
}

// TestWarmSessionFirefox: a Firefox ESR behind a bidi provider with warm 1
// (its one WebDriver BiDi session): two Puppeteer clients in turn are each
// handed the connection the gateway opened, and the next one is made once
// the first's session ended.
func TestWarmSessionFirefox(t *testing.T) {
	RequireFirefox(t)
	ff := StartFirefox(t)
	g := testgw.Start(t, handler(`"queue":{"size":5,"timeout":"60s"}`, provider("warm-ff", ff.WSURL(), `"protocol":"bidi","warm":1`)))
	for i := range 2 {
		testgw.Eventually(t, 30*time.Second, "a warm session ready", func() bool {
			p, ok := pool.Current().Lookup("warm-ff")
			ready, _ := p.Warm()
			return ok && ready == 1
		})
		checkBiDiResult(t, RunNode(t, "client.mjs", "puppeteer-ws", g.WS("/session"), "--bidi"), "puppeteer-ws")
		testgw.Eventually(t, 20*time.Second, "the session ended", func() bool { return len(g.LogEntries("session ended")) == i+1 })
	}
	for i, e := range g.LogEntries("session ended") {
		if e["warm"] != true {
			t.Fatalf("client %d was not handed the warm session: %v", i, e)
		}
	}
}
