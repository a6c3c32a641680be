package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"

	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
)

// originAttackerPage is a page on some other site that the operator's
// browser happens to open: its script tries to drive the browsers behind
// a gateway on 127.0.0.1, opening a new tab at a file:// URL. drive(url)
// tells whether the socket opened and what the browser answered.
const originAttackerPage = `<!DOCTYPE html>
<title>another site</title>
<script>
function drive(url) {
  return new Promise(resolve => {
    let opened = false;
    const done = v => resolve(Object.assign({ opened }, v));
    const ws = new WebSocket(url);
    ws.onopen = () => {
      opened = true;
      ws.send(JSON.stringify({ id: 1, method: 'Target.createTarget', params: { url: 'file:///etc/hostname' } }));
    };
    ws.onmessage = e => { done({ message: String(e.data) }); ws.close(); };
    ws.onclose = e => done({ code: e.code });
    setTimeout(() => done({ timeout: true }), 15000);
  });
}
</script>
<p>nothing to see</p>`

// driven is what originAttackerPage's drive returns.
type driven struct {
	Opened  bool   `json:"opened"`
	Message string `json:"message"`
	Code    int    `json:"code"`
	Timeout bool   `json:"timeout"`
}

// TestForeignPageCannotDriveBrowsers: a page served on another origin,
// opened in real Chromium, opens a WebSocket to the gateway in front of a
// real Chromium provider and sends Target.createTarget with a file:// URL.
// The gateway refuses the upgrade (403: it carries the page's Origin),
// the provider is never contacted and opens no tab, and the refusal is
// logged with the reason origin. As a control, the same page through a
// gateway whose allowed_origins names the page's origin does drive the
// provider (so the test can tell the two apart).
func TestForeignPageCannotDriveBrowsers(t *testing.T) {
	Require(t, false)
	bs := StartChromiums(t, 2)
	user, prov := bs[0], bs[1]

	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, originAttackerPage)
	}))
	defer attacker.Close()

	g := testgw.Start(t, handler("", provider("chrome", prov.HTTPURL(), "")))
	targets := func() []string {
		t.Helper()
		resp, err := http.Get(prov.HTTPURL() + "/json/list")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var list []struct {
			URL string `json:"url"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
			t.Fatal(err)
		}
		var urls []string
		for _, l := range list {
			urls = append(urls, l.URL)
		}
		return urls
	}
	opened := func() bool {
		for _, u := range targets() {
			if strings.HasPrefix(u, "file://") {
				return true
			}
		}
		return false
	}

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	actx, acancel := remote.NewAllocator(ctx, user.WSURL())
	defer acancel()
	cctx, ccancel := chromedp.NewContext(actx)
	defer ccancel()
	if resp, err := chromedp.Run(cctx, chromedp.NavigateResponse(attacker.URL+"/")); err != nil || resp.Status != http.StatusOK {
		t.Fatalf("the other site's page: %v %+v", err, resp)
	}
	drive := func() driven {
		t.Helper()
		d, err := chromedp.Run(cctx, chromedp.Evaluate[driven](fmt.Sprintf("drive(%q)", g.WS("/")), chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("the page's script: %v", err)
		}
		t.Logf("drive(%s) from %s: %+v", g.WS("/"), attacker.URL, d)
		return d
	}

	st := providerStatus(t, g, "chrome")
	d := drive()
	if d.Opened || d.Message != "" || d.Timeout {
		t.Fatalf("the page drove the gateway: %+v", d)
	}
	if opened() {
		t.Fatalf("the provider opened the page's tab: %v", targets())
	}
	if after := providerStatus(t, g, "chrome"); after.Attempts != st.Attempts {
		t.Fatalf("the provider was attempted for the page (%d -> %d)", st.Attempts, after.Attempts)
	}
	var rejected map[string]any
	testgw.Eventually(t, 10*time.Second, "the rejection in the log", func() bool {
		for _, e := range g.LogEntries("rejected") {
			if e["close_reason"] == "origin" && e["status"] == float64(http.StatusForbidden) {
				rejected = e
				return true
			}
		}
		return false
	})
	t.Logf("logged: %v", rejected)

	// The control: the page's own origin allowed.
	if err := g.Reload(handler(fmt.Sprintf(`"allowed_origins":[%q]`, attacker.URL), provider("chrome", prov.HTTPURL(), ""))); err != nil {
		t.Fatal(err)
	}
	d = drive()
	if !d.Opened || !strings.Contains(d.Message, `"targetId"`) {
		t.Fatalf("with the page's origin allowed, it could not drive the provider: %+v", d)
	}
	testgw.Eventually(t, 10*time.Second, "the page's tab at the provider", opened)
}
