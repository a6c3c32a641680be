package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"

	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
)

// attackerPage is what a DNS-rebinding site serves: a script that, once
// its own name points at the victim's listener, reads the dashboard's
// JSON and drains a provider from it. steal(base) returns the status and
// body of both requests (-1 and the error when the browser refused to
// send or read one).
const attackerPage = `<!DOCTYPE html>
<title>attacker</title>
<script>
async function attempt(url, init) {
  try {
    const r = await fetch(url, init);
    return { status: r.status, body: await r.text() };
  } catch (e) {
    return { status: -1, body: String(e) };
  }
}
async function steal(base) {
  return {
    read: await attempt(base + 'status.json'),
    drain: await attempt(base + 'providers/rebind-a/drain',
      { method: 'POST', headers: { 'X-Browser-Failover-Dashboard': '1' } }),
    blindDrain: await attempt(base + 'providers/rebind-a/drain', { method: 'POST', mode: 'no-cors' }),
  };
}
</script>
<p>nothing to see</p>`

// answer is one request of attackerPage's steal, as the page saw it.
type answer struct {
	Status int    `json:"status"`
	Body   string `json:"body"`
}

// stolen is what attackerPage's steal returns.
type stolen struct {
	Read       answer `json:"read"`
	Drain      answer `json:"drain"`
	BlindDrain answer `json:"blindDrain"`
}

// rebinder plays the attacker's DNS at the TCP level: Chromium resolves
// rebind.test to 127.0.0.1, and this listener sends each new connection
// to the attacker's server until rebind, then to the victim. The page
// keeps its origin (http://rebind.test:<port>) while its requests reach
// the victim with that name as Host, as after a real rebinding.
type rebinder struct {
	ln    net.Listener
	mu    sync.Mutex
	to    string
	conns map[net.Conn]bool
}

func startRebinder(t *testing.T, to string) *rebinder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rb := &rebinder{ln: ln, to: to, conns: make(map[net.Conn]bool)}
	go rb.serve()
	t.Cleanup(func() {
		ln.Close()
		rb.closeAll()
	})
	return rb
}

func (rb *rebinder) serve() {
	for {
		c, err := rb.ln.Accept()
		if err != nil {
			return
		}
		rb.mu.Lock()
		to := rb.to
		rb.conns[c] = true
		rb.mu.Unlock()
		go rb.pipe(c, to)
	}
}

func (rb *rebinder) pipe(c net.Conn, to string) {
	defer func() {
		c.Close()
		rb.mu.Lock()
		delete(rb.conns, c)
		rb.mu.Unlock()
	}()
	up, err := net.Dial("tcp", to)
	if err != nil {
		return
	}
	defer up.Close()
	go func() {
		io.Copy(up, c)
		up.Close()
	}()
	io.Copy(c, up)
}

// rebind points the name at to from now on; connections already open
// (to the attacker's server) are closed, so the browser opens new ones.
func (rb *rebinder) rebind(to string) {
	rb.mu.Lock()
	rb.to = to
	rb.mu.Unlock()
	rb.closeAll()
}

func (rb *rebinder) closeAll() {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	for c := range rb.conns {
		c.Close()
	}
}

func (rb *rebinder) port() string { return fmt.Sprint(rb.ln.Addr().(*net.TCPAddr).Port) }

// TestDashboardHostRebinding: a DNS-rebinding attack on a dashboard with
// controls on, on a :port site (no host matcher) bound to 127.0.0.1, in
// real headless Chromium whose resolver maps rebind.test to 127.0.0.1.
//
//   - The attacker's page, loaded from http://rebind.test:<port>/, whose
//     name then points at the dashboard (same origin for the browser, Host
//     rebind.test for the dashboard): its fetch of status.json and its
//     drain, with the page's own header, get the dashboard's 403 naming
//     the Host; nothing is drained (the admin API says so).
//   - A page of another origin (http://127.0.0.1:<other port>/) trying
//     the same on http://rebind.test:<dashboard port>/: refused too.
//   - Chromium navigated to http://rebind.test:<dashboard port>/ shows the
//     403 error, not the page; at http://127.0.0.1:<dashboard port>/ it
//     shows the page with the provider.
func TestDashboardHostRebinding(t *testing.T) {
	Require(t, false)
	c := StartChromiumWith(t, "--host-resolver-rules=MAP rebind.test 127.0.0.1")

	dash, gw, admin := testgw.FreePort(t), testgw.FreePort(t), testgw.FreePort(t)
	_, dashPort, _ := net.SplitHostPort(dash)
	logPath := filepath.Join(t.TempDir(), "caddy.log")
	caddyfile := fmt.Sprintf(`{
	admin %[1]s
	persist_config off
	storage file_system %[2]s
	log {
		output file %[3]s
		format json
	}
}

http://%[4]s {
	browser_failover {
		provider rebind-a ws://%[5]s/
	}
}

:%[6]s {
	bind 127.0.0.1
	browser_failover_dashboard {
		controls on
	}
}
`, admin, filepath.Join(t.TempDir(), "storage"), logPath, gw, testgw.FreePort(t), dashPort)
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddy.Stop() })
	g := &testgw.Gateway{Addr: gw, Admin: admin, LogPath: logPath}
	notDrained := func(when string) {
		t.Helper()
		if p := providerStatus(t, g, "rebind-a"); p.Draining {
			t.Fatalf("%s: rebind-a is drained", when)
		}
	}

	// The attacker's server; every answer closes its connection, so no
	// request after the rebinding goes to it on an old connection.
	attacker := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		io.WriteString(w, attackerPage)
	}))
	attacker.Config.SetKeepAlivesEnabled(false)
	attacker.Start()
	defer attacker.Close()
	attackerAddr := strings.TrimPrefix(attacker.URL, "http://")
	rb := startRebinder(t, attackerAddr)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	actx, acancel := remote.NewAllocator(ctx, c.WSURL())
	defer acancel()
	cctx, ccancel := chromedp.NewContext(actx)
	defer ccancel()
	steal := func(base string) stolen {
		t.Helper()
		st, err := chromedp.Run(cctx, chromedp.Evaluate[stolen](fmt.Sprintf("steal(%q)", base), chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("the attacker's script: %v", err)
		}
		t.Logf("steal(%q): %+v", base, st)
		return st
	}
	refusedHost := func(what string, a answer, host string) {
		t.Helper()
		if a.Status != http.StatusForbidden || !strings.Contains(a.Body, fmt.Sprintf(`the Host \"%s\" is not one of the dashboard's names`, host)) ||
			!strings.Contains(a.Body, "hosts "+host) {
			t.Errorf("%s: %d %s, want the dashboard's 403 for the Host %s", what, a.Status, a.Body, host)
		}
	}

	// 1. The rebinding: the page is the attacker's first, then its name
	// is the dashboard's.
	rebound := "http://rebind.test:" + rb.port() + "/"
	resp, err := chromedp.Run(cctx, chromedp.NavigateResponse(rebound))
	if err != nil || resp.Status != http.StatusOK {
		t.Fatalf("the attacker's page at %s: %v %+v", rebound, err, resp)
	}
	if title, err := chromedp.Run(cctx, chromedp.Title()); err != nil || title != "attacker" {
		t.Fatalf("the attacker's page: title %q, %v", title, err)
	}
	rb.rebind(dash)
	st := steal("/")
	refusedHost("status.json read by the rebound page", st.Read, "rebind.test")
	refusedHost("drain from the rebound page", st.Drain, "rebind.test")
	if st.BlindDrain.Status != http.StatusForbidden {
		t.Errorf("drain without the page's header from the rebound page: %+v, want 403", st.BlindDrain)
	}
	notDrained("after the rebound page's attempts")

	// 2. Another origin tries the dashboard through the rebinding name:
	// the browser does not let it read anything, and nothing is drained.
	if _, err := chromedp.Run(cctx, chromedp.NavigateResponse(attacker.URL+"/")); err != nil {
		t.Fatal(err)
	}
	st = steal("http://rebind.test:" + dashPort + "/")
	for what, a := range map[string]answer{"read": st.Read, "drain": st.Drain} {
		if a.Status != -1 && a.Status != http.StatusForbidden {
			t.Errorf("cross-origin %s: %+v, want refused", what, a)
		}
	}
	notDrained("after the cross-origin attempts")

	// 3. Chromium navigated to the dashboard by the rebinding name: the
	// 403 error, not the page.
	page := "http://rebind.test:" + dashPort + "/"
	resp, err = chromedp.Run(cctx, chromedp.NavigateResponse(page))
	if err != nil || resp.Status != http.StatusForbidden {
		t.Fatalf("%s: %v %+v, want 403", page, err, resp)
	}
	text, err := chromedp.Run(cctx, chromedp.Evaluate[string](`document.body.innerText`))
	if err != nil || !strings.Contains(text, `the Host \"rebind.test\" is not one of the dashboard's names`) ||
		!strings.Contains(text, "hosts rebind.test") {
		t.Fatalf("%s shows %q (%v), want the refusal", page, text, err)
	}
	if n, err := chromedp.Run(cctx, chromedp.Evaluate[int](`document.querySelectorAll('table').length`)); err != nil || n != 0 {
		t.Fatalf("%s has %d tables (%v): the dashboard's page", page, n, err)
	}
	t.Logf("%s: %d %s", page, resp.Status, strings.TrimSpace(text))

	// 4. The control: by its address the dashboard shows its page.
	page = "http://" + dash + "/"
	resp, err = chromedp.Run(cctx, chromedp.NavigateResponse(page))
	if err != nil || resp.Status != http.StatusOK {
		t.Fatalf("%s: %v %+v, want 200", page, err, resp)
	}
	if _, err := chromedp.Run(cctx, chromedp.Poll[chromedp.Void](`document.querySelector('tr[data-provider="rebind-a"]')`,
		chromedp.WithPollingTimeout(45*time.Second))); err != nil {
		t.Fatalf("%s does not show rebind-a: %v", page, err)
	}
	notDrained("at the end")
}
