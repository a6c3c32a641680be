package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
)

// checkWebDriverRun checks a webdriver.mjs run's lines: its session, the
// page's title, 6*7, the BiDi answer when it spoke BiDi, and its end.
func checkWebDriverRun(t *testing.T, out string, bidi bool) {
	t.Helper()
	for _, want := range []string{"SESSION ", "TITLE hello webdriver", "RESULT 42", "DONE"} {
		if !strings.Contains(out, "\n"+want) && !strings.HasPrefix(out, want) {
			t.Fatalf("no %q in:\n%s", want, out)
		}
	}
	if bidi && !strings.Contains(out, "\nBIDI ") {
		t.Fatalf("no BiDi answer in:\n%s", out)
	}
}

// TestWebDriverClients: Selenium (selenium-webdriver 4) and WebdriverIO 9,
// classic and BiDi, through the gateway to real chromedrivers, the first
// of which is dead: each create fails over to the live one, the client
// drives Chromium (BiDi over the socket its create answer names, on the
// gateway's host), its DELETE ends the session at chromedriver, and no
// browser is left open.
func TestWebDriverClients(t *testing.T) {
	Require(t, true)
	dead := StartChromedriver(t)
	dead.Kill()
	live := StartChromedriver(t)
	g := testgw.Start(t, handler(`"connect_timeout":"30s","queue":{"size":0}`,
		provider("cd-dead", dead.URL(), `"protocol":"webdriver","priority":1`),
		provider("cd-live", live.URL(), `"protocol":"webdriver","priority":2,"browsers":["chrome"]`)))
	profiles := filepath.Join(os.TempDir(), "wd-chrome-")
	before := BrowsersUnder(profiles)
	for i, tc := range []struct {
		client string
		bidi   bool
	}{{"selenium", false}, {"selenium", true}, {"wdio", false}, {"wdio", true}} {
		name := tc.client
		if tc.bidi {
			name += "-bidi"
		}
		t.Run(name, func(t *testing.T) {
			args := []string{tc.client, g.HTTP("/wd/hub")}
			if tc.bidi {
				args = append(args, "--bidi")
			}
			out := RunNode(t, "webdriver.mjs", args...)
			checkWebDriverRun(t, out, tc.bidi)
			waitIdle(t, "cd-live")
			testgw.Eventually(t, 15*time.Second, "the client's browser closed", func() bool { return BrowsersUnder(profiles) <= before })
			e := endedAtLeast(t, g, i+1)
			last := e[i]
			// The dead one is tried, until its failures cool it down.
			if a := strings.Join(last.Attempts, " "); last.Provider != "cd-live" || last.Reason != "client deleted the session" ||
				(a != "cd-dead:refused cd-live:ok" && a != "cd-dead:cooldown cd-live:ok") {
				t.Fatalf("session ended %+v", last)
			}
		})
	}
	if strings.Contains(g.Logs(), live.Addr) && strings.Contains(g.Logs(), "webSocketUrl") {
		t.Error("the provider's socket address is in the logs")
	}
}

// TestWebDriverIdleClosesBrowser: a client that creates a session and
// goes away without DELETE leaves a browser at chromedriver only until
// the session's idle timeout: the gateway then ends it there.
func TestWebDriverIdleClosesBrowser(t *testing.T) {
	Require(t, true)
	cd := StartChromedriver(t)
	g := testgw.Start(t, handler(`"connect_timeout":"30s","session":{"idle_timeout":"2s"}`,
		provider("cd-idle", cd.URL(), `"protocol":"webdriver"`)))
	profiles := filepath.Join(os.TempDir(), "wd-chrome-")
	before := BrowsersUnder(profiles)
	out := RunNode(t, "webdriver.mjs", "selenium", g.HTTP("/"), "--no-delete")
	checkWebDriverRun(t, out, false)
	if active("cd-idle") != 1 || BrowsersUnder(profiles) <= before {
		t.Fatalf("no live session after the client left: active %d", active("cd-idle"))
	}
	waitIdleFor(t, 20*time.Second, "cd-idle")
	testgw.Eventually(t, 15*time.Second, "the browser closed at its idle end", func() bool { return BrowsersUnder(profiles) <= before })
	if e := endedAtLeast(t, g, 1); len(e) != 1 || e[0].Reason != "idle timeout" {
		t.Fatalf("session ended %+v", e)
	}
}

// waitIdleFor is waitIdle with a wait of its own.
func waitIdleFor(t *testing.T, wait time.Duration, names ...string) {
	t.Helper()
	testgw.Eventually(t, wait, "sessions of "+strings.Join(names, ", ")+" to end", func() bool {
		for _, n := range names {
			if active(n) != 0 {
				return false
			}
		}
		return true
	})
}
