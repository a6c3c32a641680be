package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// TestPuppeteerThroughSessionAPI: a real Puppeteer client through a
// provider that creates each browser over REST (a fake REST provider
// whose sessions are a real Chromium), after a first provider whose
// create answers 503. The browser works; when the client disconnects, the
// session is released exactly once, and the failed create left nothing to
// release.
func TestPuppeteerThroughSessionAPI(t *testing.T) {
	Require(t, true)
	chrome := StartChromium(t)
	rest := fakes.NewREST(func(string) string { return chrome.WSURL() })
	defer rest.Close()
	down := fakes.NewREST(nil)
	defer down.Close()
	down.OnCreate = func(w http.ResponseWriter, _ *http.Request) bool {
		http.Error(w, "no capacity in this region", http.StatusServiceUnavailable)
		return true
	}
	api := func(name string, f *fakes.REST, priority int) string {
		return provider(name, f.URL(), fmt.Sprintf(`"priority":%d,"session_api":{"create_method":"POST","create_url":"/v1/sessions",`+
			`"headers":[{"field":"X-BB-API-Key","value":"e2e-key"}],"body":"{\"projectId\":\"e2e\"}",`+
			`"connect_url":"/connectUrl","session_id":"/id","release_method":"POST",`+
			`"release_url":"/v1/sessions/{session_id}/release","release_body":"{\"status\":\"REQUEST_RELEASE\"}"}`, priority))
	}
	g := testgw.Start(t, handler(`"queue":{"size":0},"connect_timeout":"15s"`, api("sa-down", down, 1), api("sa-chrome", rest, 2)))
	for i := range 2 {
		out := RunNode(t, "client.mjs", "puppeteer-ws", g.WS("/"))
		checkResult(t, out, "puppeteer-ws")
		b := rest.Books()
		if len(b.Created) != i+1 {
			t.Fatalf("created %d sessions after %d clients", len(b.Created), i+1)
		}
	}
	waitIdle(t, "sa-chrome")
	testgw.Eventually(t, 15*time.Second, "every created session released once", func() bool {
		gb, ok := pool.Current().Books.Lookup("sa-chrome")
		return rest.Books().Balanced() == nil && ok && gb.Unreleased() == 0
	})
	if b := down.Books(); len(b.Created) != 0 || len(b.Released) != 0 {
		t.Fatalf("the failing provider's books: %+v", b)
	}
	if a := endedAtLeast(t, g, 1)[0].Attempts; len(a) != 2 || a[0] != "sa-down:"+upstreams.WordCreateFailed || a[1] != "sa-chrome:ok" {
		t.Fatalf("attempts %v", a)
	}
}
