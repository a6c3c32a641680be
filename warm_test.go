package browserfailover_test

// Warm sessions: opened ahead of demand, handed to a client at once with
// the gateway's own 101, refilled in the background, counted where live
// sessions count, replaced when the provider closes them or they age,
// kept across a reload, closed by a drain.

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// waitWarm waits until provider name has ready warm sessions ready.
func waitWarm(t *testing.T, g *testgw.Gateway, name string, ready int64) {
	t.Helper()
	testgw.Eventually(t, 15*time.Second, fmt.Sprintf("%s: %d warm sessions ready", name, ready), func() bool {
		st := providerStatus(t, g, name)
		return st.Warm != nil && st.Warm.Ready == ready
	})
}

func TestWarmSessions(t *testing.T) {
	slow := fakes.Slow("warm-slow", nil, fakes.After(300*time.Millisecond))
	defer slow.Close()
	g := testgw.Start(t, handler(`"queue":{"size":0}`, provider("warm-slow", slow.URL(), `"warm":2,"max_concurrent":3`)))
	waitWarm(t, g, "warm-slow", 2)
	if st := providerStatus(t, g, "warm-slow"); st.Warm.Target != 2 || st.Active != 0 {
		t.Fatalf("status %+v", st)
	}

	// Three clients: each handed a warm session (the gateway's 101, no
	// provider round trip); live and warm together stay within
	// max_concurrent, so the third leaves none to refill.
	var conns []*websocket.Conn
	for i := range 3 {
		c, resp, err := dial(t, g.WS("/devtools/browser/x"), nil)
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		if resp.Header.Get("Browser-Failover-Session") == "" {
			t.Fatalf("client %d: no session header", i)
		}
		echoOnce(t, c, []byte(fmt.Sprintf("warm %d", i)))
		conns = append(conns, c)
		// Refilled while there is room: live 1 + warm 2, then live 2 +
		// warm 1.
		if i < 2 {
			waitWarm(t, g, "warm-slow", int64(2-i))
		}
	}
	testgw.Eventually(t, 10*time.Second, "no warm session left", func() bool {
		st := providerStatus(t, g, "warm-slow")
		return st.Active == 3 && st.Warm.Ready == 0
	})
	if n := slow.Answered.Load(); n != 3 {
		t.Fatalf("%d upgrades at the provider, want 3 (warm + live within max_concurrent 3)", n)
	}
	// A fourth finds the provider full.
	if code, body := upgradeAnswer(t, g, "/", nil); code != http.StatusServiceUnavailable || !strings.Contains(string(body), `"full"`) {
		t.Fatalf("a fourth client: %d %s", code, body)
	}
	for _, c := range conns {
		c.Close(websocket.StatusNormalClosure, "")
	}
	// Refilled once the sessions end.
	waitWarm(t, g, "warm-slow", 2)
	entries := g.LogEntries("session ended")
	warm := 0
	for _, e := range entries {
		as, _ := e["attempts"].([]any)
		if e["warm"] == true && len(as) == 1 && as[0].(map[string]any)["outcome"] == "warm" {
			warm++
		}
	}
	if warm != 3 {
		t.Fatalf("%d session ended entries say warm, want 3: %v", warm, entries)
	}
	code, m, _ := g.AdminDo(http.MethodGet, "/metrics", nil)
	if code != 200 || !strings.Contains(string(m), `caddy_browser_failover_warm_handed_total{provider="warm-slow"} 3`) ||
		!strings.Contains(string(m), `caddy_browser_failover_warm_sessions{provider="warm-slow"} 2`) {
		t.Fatalf("metrics: %d\n%s", code, grepLines(string(m), "warm"))
	}
}

// grepLines keeps the lines of s that hold sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Clients a warm session does not fit get a new one: session options, a
// subprotocol, a Playwright client.
func TestWarmNotForEveryClient(t *testing.T) {
	e := fakes.Echo("warm-fit", nil, "x-proto")
	defer e.Close()
	g := testgw.Start(t, handler(`"queue":{"size":0}`, provider("warm-fit", e.URL(), `"warm":1,"supports":["stealth"]`)))
	waitWarm(t, g, "warm-fit", 1)
	base := e.Hits.Load()
	for _, tc := range []struct {
		path string
		opts *websocket.DialOptions
	}{
		{"/?bf_stealth=1", nil},
		{"/", &websocket.DialOptions{Subprotocols: []string{"x-proto"}}},
		{"/", &websocket.DialOptions{HTTPHeader: http.Header{"User-Agent": {"Playwright/1.50.0"}, "x-playwright-browser": {"chromium"}}}},
	} {
		c, _, err := dial(t, g.WS(tc.path), tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		echoOnce(t, c, []byte("new"))
		c.Close(websocket.StatusNormalClosure, "")
	}
	if got := e.Hits.Load() - base; got != 3 {
		t.Fatalf("%d new upgrades for three clients a warm session does not fit", got)
	}
	if st := providerStatus(t, g, "warm-fit"); st.Warm == nil || st.Warm.Ready != 1 {
		t.Fatalf("the warm session went: %+v", st.Warm)
	}
}

// A warm session its provider closes, or one older than warm_max_age, is
// closed and replaced; never more than the target idle.
func TestWarmReplaced(t *testing.T) {
	var upgrades atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if err != nil {
			return
		}
		upgrades.Add(1)
		time.Sleep(100 * time.Millisecond)
		c.CloseNow() // a provider ending an idle session
	})}
	ln := listenLoopback(t)
	go srv.Serve(ln)
	defer srv.Close()
	aging := fakes.Echo("warm-aging", nil)
	defer aging.Close()
	g := testgw.Start(t, handler("",
		provider("warm-closing", "ws://"+ln.Addr().String()+"/", `"warm":1`),
		provider("warm-aging", aging.URL(), `"priority":2,"warm":2,"warm_max_age":"200ms"`)))
	testgw.Eventually(t, 15*time.Second, "closed warm sessions replaced", func() bool { return upgrades.Load() >= 4 })
	testgw.Eventually(t, 15*time.Second, "aged warm sessions replaced", func() bool { return aging.Hits.Load() >= 6 })
	for range 20 {
		if st := providerStatus(t, g, "warm-aging"); st.Warm.Ready > 2 {
			t.Fatalf("%d warm sessions idle, target 2", st.Warm.Ready)
		}
		if p, _ := pool.Current().Lookup("warm-aging"); p.Slots.Reserved() > 2 {
			t.Fatalf("%d slots held, target 2", p.Slots.Reserved())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A reload that keeps the handler's configuration keeps its warm
// sessions, one that changes it makes a new set; a drain closes them, an
// undrain brings them back; a reload without warm closes them.
func TestWarmReloadAndDrain(t *testing.T) {
	e := fakes.Echo("warm-reload", nil)
	defer e.Close()
	cfg := handler("", provider("warm-reload", e.URL(), `"warm":2`))
	g := testgw.Start(t, cfg)
	waitWarm(t, g, "warm-reload", 2)
	before := e.Hits.Load()
	if err := g.ReloadSame(cfg); err != nil {
		t.Fatal(err)
	}
	waitWarm(t, g, "warm-reload", 2)
	time.Sleep(300 * time.Millisecond)
	if got := e.Hits.Load(); got != before {
		t.Fatalf("a reload that kept the handler made %d new warm sessions", got-before)
	}
	cfg = strings.Replace(cfg, `"warm":2`, `"warm":2,"priority":1`, 1)
	if err := g.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	testgw.Eventually(t, 10*time.Second, "a new set for the changed handler, the old one closed", func() bool {
		p, _ := pool.Current().Lookup("warm-reload")
		return e.Hits.Load() == before+2 && p.Slots.Reserved() == 2
	})
	waitWarm(t, g, "warm-reload", 2)
	// A warm session still works.
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	echoOnce(t, c, []byte("after reload"))
	c.Close(websocket.StatusNormalClosure, "")

	if code, _, err := g.AdminDo(http.MethodPost, "/browser_failover/providers/warm-reload/drain", nil); err != nil || code != 200 {
		t.Fatal(code, err)
	}
	waitWarm(t, g, "warm-reload", 0)
	testgw.Eventually(t, 10*time.Second, "drained: no slot held", func() bool {
		p, _ := pool.Current().Lookup("warm-reload")
		return p.Slots.Reserved() == 0
	})
	g.AdminDo(http.MethodPost, "/browser_failover/providers/warm-reload/undrain", nil)
	waitWarm(t, g, "warm-reload", 2)
	if err := g.Reload(handler("", provider("warm-reload", e.URL(), ""))); err != nil {
		t.Fatal(err)
	}
	testgw.Eventually(t, 10*time.Second, "no warm session without warm", func() bool {
		p, _ := pool.Current().Lookup("warm-reload")
		return p.Slots.Reserved() == 0
	})
	if st := providerStatus(t, g, "warm-reload"); st.Warm != nil {
		t.Fatalf("status warm %+v without warm", st.Warm)
	}
}

// Warm sessions are billed from their creation and held in the budget:
// no warm session is made that the budget could not pay for.
func TestWarmBudgetAndLedger(t *testing.T) {
	f, _ := echoREST(t)
	g := testgw.Start(t, handler("",
		apiProvider("warm-api", f, `"warm":2,"cost":{"amount":1,"per":"session"},"budget":{"amount":1,"per":"day"}`)))
	waitWarm(t, g, "warm-api", 1)
	time.Sleep(500 * time.Millisecond)
	if n := len(f.Books().Created); n != 1 {
		t.Fatalf("%d sessions created for a budget that pays for one", n)
	}
	if st := providerStatus(t, g, "warm-api"); st.Warm.Ready != 1 || st.Unreleased == nil || *st.Unreleased != 1 {
		t.Fatalf("status %+v (unreleased %v)", st.Warm, st.Unreleased)
	}
	// The warm session is in the ledger's books like a live one; a reload
	// without warm releases it, and its cost counts.
	if err := g.Reload(handler("", apiProvider("warm-api", f, `"cost":{"amount":1,"per":"session"},"budget":{"amount":1,"per":"day"}`))); err != nil {
		t.Fatal(err)
	}
	waitBooks(t, f, "warm-api", 1)
	testgw.Eventually(t, 10*time.Second, "the warm session's cost counted", func() bool {
		return providerStatus(t, g, "warm-api").Spend.Spent == 1
	})
}

func TestWarmConfigErrors(t *testing.T) {
	for _, tc := range []struct{ cf, want string }{
		{"protocol playwright\nwarm 1", "warm does not apply to a playwright provider"},
		{"max_concurrent 1\nwarm 2", "warm 2 is more than max_concurrent 1"},
		{"warm -1", "warm must not be negative"},
		{"warm 1\nwarm_max_age 0s", "warm_max_age must be positive"},
		{"warm_options stealth=true\nsupports stealth", "warm_options needs warm"},
		{"warm 1\nwarm_options stealth=true", "warm_options asks for what the provider does not honour (stealth)"},
		{"warm 1\nregion us-east\nwarm_options region=eu-central", "does not honour (region)"},
		{"warm 1\nsupports stealth\nwarm_options stealth=maybe", `warm_options: session option "stealth": want true, false, 1 or 0`},
		{"warm 1\nwarm_options colour=red", `"colour": not a session option`},
		{"warm 1\nwarm_options stealth", `want <option>=<value>, got "stealth"`},
		{"warm 1\nsupports stealth\nwarm_options stealth=1 stealth=0", "stealth given twice"},
	} {
		_, err := adapt(t, fmt.Sprintf(":80 {\n\tbrowser_failover {\n\t\tprovider p ws://127.0.0.1:1/ {\n\t\t\t%s\n\t\t}\n\t}\n}", strings.ReplaceAll(tc.cf, "\n", "\n\t\t\t")))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.cf, err, tc.want)
		}
	}
}

// listenLoopback listens on a free loopback port for the test.
func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// A failed warm-up counts as a failed attempt: the provider cools down,
// and no client sees it.
func TestWarmUpFailureCoolsDown(t *testing.T) {
	down := fakes.Refused("warm-down")
	g := testgw.Start(t, handler(`"cooldown":{"failure_threshold":0.5,"min_requests":1}`, provider("warm-down", down.URL(), `"warm":1`)))
	testgw.Eventually(t, 10*time.Second, "the provider cooling down after its warm-ups failed", func() bool {
		st := providerStatus(t, g, "warm-down")
		return st.CooldownUntil != nil && st.Failures > 0 && st.LastError == "refused"
	})
	if st := providerStatus(t, g, "warm-down"); st.Warm.Ready != 0 {
		t.Fatalf("warm %+v", st.Warm)
	}
}

// A client handed a warm session pays for it from its client key's
// client_budget as for a session made for it: the key's book counts it,
// and a key whose budget is spent gets 429, not a warm session.
func TestWarmClientBudget(t *testing.T) {
	e := fakes.Echo("warm-cb", nil)
	defer e.Close()
	g := testgw.Start(t, handler(`"queue":{"size":0},"client_budget":{"key":"{http.request.header.X-Tenant}","amount":1,"per":"hour"}`,
		provider("warm-cb", e.URL(), `"warm":2,"max_concurrent":6,"cost":{"amount":0.6,"per":"session"}`)))
	tenant := &websocket.DialOptions{HTTPHeader: http.Header{"X-Tenant": {"acme-secret-key"}}}
	var open []*websocket.Conn
	defer func() {
		for _, c := range open {
			c.CloseNow()
		}
	}()
	// 0.6, then 1.2: both handed warm sessions, the second admitted with
	// 0.6 spent of 1.
	for i := range 2 {
		waitWarm(t, g, "warm-cb", 2)
		c, _, err := dial(t, g.WS("/"), tenant)
		if err != nil {
			t.Fatalf("session %d: %v", i+1, err)
		}
		echoOnce(t, c, []byte("x"))
		open = append(open, c)
	}
	waitWarm(t, g, "warm-cb", 2)
	code, body := upgradeAnswer(t, g, "/", http.Header{"X-Tenant": {"acme-secret-key"}})
	if code != http.StatusTooManyRequests {
		t.Fatalf("a third session for the spent key: %d %s", code, body)
	}
	st := readStatus(t, g)
	if len(st.Clients) != 1 || st.Clients[0].Spent == nil || math.Abs(*st.Clients[0].Spent-1.2) > 1e-9 {
		t.Fatalf("the key's book: %+v", st.Clients)
	}
	if p := providerStatus(t, g, "warm-cb"); p.Warm.Ready != 2 || p.Active != 2 {
		t.Fatalf("after the 429: warm %+v, active %d", p.Warm, p.Active)
	}
	// Another key is handed one.
	c, _, err := dial(t, g.WS("/"), &websocket.DialOptions{HTTPHeader: http.Header{"X-Tenant": {"globex"}}})
	if err != nil {
		t.Fatal(err)
	}
	open = append(open, c)
	for _, c := range open {
		c.Close(websocket.StatusNormalClosure, "")
	}
	open = nil
	testgw.Eventually(t, 10*time.Second, "three sessions ended", func() bool { return len(g.LogEntries("session ended")) == 3 })
	for _, e := range g.LogEntries("session ended") {
		if e["warm"] != true {
			t.Fatalf("a session that was not warm: %v", e)
		}
	}
}

// Warm sessions made with warm_options: their connect URL carries the
// options in the provider's words; a client that states exactly those
// options, or none, is handed one (and its session shows the options it
// was made with); a client whose options differ gets a new session.
func TestWarmOptions(t *testing.T) {
	e := fakes.Echo("warm-opt", nil)
	defer e.Close()
	g := testgw.Start(t, handler(`"queue":{"size":0}`, provider("warm-opt",
		e.URL()+"?stealth={bf.option.stealth}&proxyCountry={bf.option.proxy_country}&region={bf.option.region}",
		`"warm":1,"region":["eu-central"],"supports":["stealth","proxy_country"],"option_map":{"region":{"eu-central":"eu-central-1"}},`+
			`"warm_options":{"region":"eu-central","stealth":true,"proxy_country":"DE"}`)))
	waitWarm(t, g, "warm-opt", 1)
	if q := queryOf(t, e.LastURI()); q.Get("stealth") != "true" || q.Get("proxyCountry") != "de" || q.Get("region") != "eu-central-1" {
		t.Fatalf("the warm-up's URL %q", e.LastURI())
	}
	base := e.Hits.Load()
	// The same options, another way of writing them: handed the warm one.
	c, _, err := dial(t, g.WS("/?bf_region=eu-central&bf_proxy_country=de"), &websocket.DialOptions{
		HTTPHeader: http.Header{"Browser-Failover-Options": {"stealth=1"}}})
	if err != nil {
		t.Fatal(err)
	}
	echoOnce(t, c, []byte("same"))
	c.Close(websocket.StatusNormalClosure, "")
	waitWarm(t, g, "warm-opt", 1)
	// No options: handed one too.
	c, _, err = dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	echoOnce(t, c, []byte("none"))
	c.Close(websocket.StatusNormalClosure, "")
	waitWarm(t, g, "warm-opt", 1)
	if got := e.Hits.Load() - base; got != 2 {
		t.Fatalf("%d upgrades at the provider for two warm clients, want their 2 refills", got)
	}
	// Different options: a session of its own, in its own words.
	c, _, err = dial(t, g.WS("/?bf_stealth=false"), nil)
	if err != nil {
		t.Fatal(err)
	}
	echoOnce(t, c, []byte("other"))
	c.Close(websocket.StatusNormalClosure, "")
	if q := queryOf(t, e.LastURI()); q.Get("stealth") != "false" || q.Has("region") || q.Has("proxyCountry") {
		t.Fatalf("the different client's URL %q", e.LastURI())
	}
	testgw.Eventually(t, 10*time.Second, "three sessions ended", func() bool { return len(g.LogEntries("session ended")) == 3 })
	var warm int
	for _, e := range g.LogEntries("session ended") {
		o, _ := e["options"].(map[string]any)
		switch e["warm"] {
		case true:
			warm++
			if o["stealth"] != true || o["proxy_country"] != "de" {
				t.Fatalf("a warm session's options: %v", e)
			}
		default:
			if o["stealth"] != false {
				t.Fatalf("the other session's options: %v", e)
			}
		}
	}
	if warm != 2 {
		t.Fatalf("%d warm sessions, want 2", warm)
	}
}

// closingProvider is a provider that ends the first session it opens
// while it is idle, as browserless does with an idle browser: it sends a
// close frame (1001 "idle"), then waits for the client's answer before it
// hangs up; its other sessions stay open. It records the answer.
type closingProvider struct {
	upgrades atomic.Int64
	// answer is the first frame that came back on the closed session.
	answer chan wsFrame
}

// wsFrame is one frame as read off the wire.
type wsFrame struct {
	op      byte
	masked  bool
	payload []byte // unmasked
}

func newClosingProvider(t *testing.T) (*closingProvider, string) {
	p := &closingProvider{answer: make(chan wsFrame, 1)}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := p.upgrades.Add(1)
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprintf(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
			upstreams.AcceptFor(r.Header.Get("Sec-WebSocket-Key")))
		if n != 1 {
			io.Copy(io.Discard, brw) // idle until the gateway closes it
			return
		}
		time.Sleep(50 * time.Millisecond)
		conn.Write([]byte{0x88, 7, 0x03, 0xe9, 'i', 'd', 'l', 'e', '!'})
		f, err := readFrame(brw.Reader)
		if err != nil {
			return
		}
		p.answer <- f
	})}
	ln := listenLoopback(t)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return p, "ws://" + ln.Addr().String() + "/"
}

// readFrame reads one frame (payloads up to 125 bytes).
func readFrame(r *bufio.Reader) (wsFrame, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return wsFrame{}, err
	}
	f := wsFrame{op: hdr[0] & 0x0f, masked: hdr[1]&0x80 != 0}
	n := int(hdr[1] & 0x7f)
	var key [4]byte
	if f.masked {
		if _, err := io.ReadFull(r, key[:]); err != nil {
			return wsFrame{}, err
		}
	}
	f.payload = make([]byte, n)
	if _, err := io.ReadFull(r, f.payload); err != nil {
		return wsFrame{}, err
	}
	if f.masked {
		for i := range f.payload {
			f.payload[i] ^= key[i%4]
		}
	}
	return f, nil
}

// A provider's close frame on an idle warm session is answered as its
// client would answer it (a masked close frame echoing its code), and the
// session is replaced.
func TestWarmProviderCloseAnswered(t *testing.T) {
	p, url := newClosingProvider(t)
	g := testgw.Start(t, handler(`"queue":{"size":0}`, provider("warm-bye", url, `"warm":1`)))
	var f wsFrame
	select {
	case f = <-p.answer:
	case <-time.After(20 * time.Second):
		t.Fatal("the provider's close frame was not answered")
	}
	if f.op != 0x8 || !f.masked || len(f.payload) != 2 || f.payload[0] != 0x03 || f.payload[1] != 0xe9 {
		t.Fatalf("answer: opcode %#x, masked %v, payload %q: want a masked close echoing 1001", f.op, f.masked, f.payload)
	}
	testgw.Eventually(t, 15*time.Second, "the closed warm session replaced", func() bool {
		st := providerStatus(t, g, "warm-bye")
		return p.upgrades.Load() == 2 && st.Warm != nil && st.Warm.Ready == 1
	})
	// The replacement serves a client.
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.CloseNow()
}

// A warm session is made only when the provider's budget can pay for a
// session of expected_duration besides what it spent, accrued and holds:
// at 1 a session, 1.5 a day pays for one warm session of the two asked,
// and none after it is taken; a client, who needs only the budget not
// reached, is still admitted.
func TestWarmOnlyWhatTheBudgetPays(t *testing.T) {
	e := fakes.Echo("warm-budget", nil)
	defer e.Close()
	g := testgw.Start(t, handler(`"queue":{"size":0}`, provider("warm-budget", e.URL(),
		`"warm":2,"cost":{"amount":1,"per":"session"},"budget":{"amount":1.5,"per":"day"}`)))
	testgw.Eventually(t, 15*time.Second, "a warm session ready", func() bool {
		st := providerStatus(t, g, "warm-budget")
		return st.Warm != nil && st.Warm.Ready > 0
	})
	// The warmer looks again each second: a few more looks make nothing.
	for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if n := e.Hits.Load(); n != 1 {
			t.Fatalf("%d warm sessions made, the budget pays for one", n)
		}
	}
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	echoOnce(t, c, []byte("warm"))
	// 1 accrued of 1.5: no room for another warm session, but a client
	// is admitted.
	c2, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatalf("a client under the budget: %v", err)
	}
	defer c2.CloseNow()
	echoOnce(t, c2, []byte("new"))
	if n := e.Hits.Load(); n != 2 {
		t.Fatalf("%d upgrades at the provider, want the warm session and the second client's", n)
	}
	if st := providerStatus(t, g, "warm-budget"); st.Warm.Ready != 0 {
		t.Fatalf("warm %+v after the budget was spent", st.Warm)
	}
}
