package browserfailover_test

// Active health checks and keepalive through an in-process Caddy, with
// real time and fake providers: probes find a dead provider and its
// recovery without any client, their trial wakes a waiting client, a
// browserless provider that says it is full is skipped, and keepalive
// finds a dead peer, frees its slot and leaves idle_timeout as it was.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
)

// hcProvider is a fake browser provider with an HTTP side: /json/version
// answers status (200 by default), /pressure answers pressure, and an
// upgrade is accepted and echoed. It can be stopped and started again on
// the same address, like a browser that is killed and restarted.
type hcProvider struct {
	Addr     string
	status   atomic.Int64
	pressure atomic.Value // string
	upgrades atomic.Int64
	probes   atomic.Int64

	mu  sync.Mutex
	srv *http.Server
}

func newHCProvider(t *testing.T) *hcProvider {
	t.Helper()
	p := &hcProvider{}
	p.status.Store(200)
	p.pressure.Store(`{"pressure":{"running":0,"maxConcurrent":10,"queued":0,"isAvailable":true}}`)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.Addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.stop)
	return p
}

func (p *hcProvider) serve(ln net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			p.upgrades.Add(1)
			c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: websocket.CompressionDisabled})
			if err != nil {
				return
			}
			fakes.EchoMessages(c)
			return
		}
		p.probes.Add(1)
		switch r.URL.Path {
		case "/pressure":
			fmt.Fprint(w, p.pressure.Load().(string))
		default:
			w.WriteHeader(int(p.status.Load()))
			fmt.Fprintf(w, `{"Browser":"fake","webSocketDebuggerUrl":"ws://%s/devtools/browser/x"}`, p.Addr)
		}
	})}
	p.mu.Lock()
	p.srv = srv
	p.mu.Unlock()
	go srv.Serve(ln)
}

// stop kills it: the listener and every connection close at once.
func (p *hcProvider) stop() {
	p.mu.Lock()
	srv := p.srv
	p.srv = nil
	p.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

// start brings it back on the same address.
func (p *hcProvider) start(t *testing.T) {
	t.Helper()
	var ln net.Listener
	var err error
	for try := 0; try < 50; try++ {
		if ln, err = net.Listen("tcp", p.Addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("restarting on %s: %v", p.Addr, err)
	}
	p.serve(ln)
}

func (p *hcProvider) wsURL() string   { return "ws://" + p.Addr + "/" }
func (p *hcProvider) httpURL() string { return "http://" + p.Addr }

// withEvents adds the test events capture to a config.
func withEvents(t *testing.T, g *testgw.Gateway, handlerJSON string) []byte {
	t.Helper()
	var cfg map[string]any
	if err := json.Unmarshal(g.Config(handlerJSON), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["apps"].(map[string]any)["events"] = map[string]any{"subscriptions": []any{map[string]any{
		"events":   []string{"browser_failover.cooldown", "browser_failover.recovered"},
		"handlers": []any{map[string]any{"handler": "op_capture"}},
	}}}
	b, _ := json.Marshal(cfg)
	return b
}

// eventsOf lists "name provider reason" of the captured events of provider.
func eventsOf(provider string) []string {
	var out []string
	for _, e := range opEvents(provider) {
		if e.Data["provider"] != provider {
			continue
		}
		s := e.Name() + " " + provider
		if r, ok := e.Data["reason"].(string); ok {
			s += " " + r
		}
		out = append(out, s)
	}
	return out
}

// TestProbesFindDeadProviderWithoutClients: a provider killed while no
// client is connected is found unhealthy by its probes, with the cooldown
// event and log of a client-caused cooldown; the next client goes straight
// to the other provider; brought back, the provider is healthy again with
// no client having tried it.
func TestProbesFindDeadProviderWithoutClients(t *testing.T) {
	a, b := newHCProvider(t), newHCProvider(t)
	const interval = 200 * time.Millisecond
	hjson := handler(`"queue":{"size":0},"health_check":{"interval":"200ms","timeout":"150ms"},"cooldown":{"window":"1s","min_requests":2,"duration":"500ms","max_duration":"2s"}`,
		provider("hc-dead-a", a.httpURL(), `"priority":1`),
		provider("hc-dead-b", b.wsURL(), `"priority":2,"health_check":{"uri":"/json/version"}`))
	g := testgw.Start(t, handler(`"queue":{"size":0}`, provider("hc-boot", b.wsURL(), "")))
	if err := g.Load(withEvents(t, g, hjson)); err != nil {
		t.Fatal(err)
	}
	testgw.Eventually(t, 10*time.Second, "both providers probed", func() bool {
		st, _ := opStatus(t, g)
		pa, pb := st.provider(t, "hc-dead-a"), st.provider(t, "hc-dead-b")
		return pa.LastProbe != nil && pa.LastProbe.Outcome == "ok" && pb.LastProbe != nil && pb.LastProbe.Outcome == "ok"
	})

	killed := time.Now()
	a.stop()
	testgw.Eventually(t, 20*interval+5*time.Second, "hc-dead-a unhealthy", func() bool {
		return !state(t, "hc-dead-a").Health.Available()
	})
	found := time.Since(killed)
	t.Logf("dead provider found unhealthy %v after the kill (interval %v)", found.Round(time.Millisecond), interval)
	st, _ := opStatus(t, g)
	pa := st.provider(t, "hc-dead-a")
	if pa.Healthy || pa.CooldownUntil == nil || pa.LastError != "refused" || pa.LastProbe == nil || pa.LastProbe.Outcome != "refused" {
		t.Fatalf("status of the dead provider: %+v", pa)
	}
	if a.upgrades.Load() != 0 {
		t.Fatal("a client was sent to the provider before the probes found it dead")
	}
	testgw.Eventually(t, 5*time.Second, "the cooldown log entry", func() bool { return len(g.LogEntries("provider cooling down")) > 0 })
	cooling := g.LogEntries("provider cooling down")
	if cooling[0]["provider"] != "hc-dead-a" || cooling[0]["reason"] != "refused" || cooling[0]["by"] != "health check" {
		t.Fatalf("cooldown log %v", cooling)
	}
	testgw.Eventually(t, 5*time.Second, "the cooldown event", func() bool {
		return contains(eventsOf("hc-dead-a"), "browser_failover.cooldown hc-dead-a refused")
	})

	// The next client goes straight to b: a is never attempted.
	mustRoundTrip(t, g, nil)
	entries := waitSessionLogs(t, g, 1)
	words := attemptWords(entries[len(entries)-1])
	if entries[len(entries)-1]["provider"] != "hc-dead-b" || strings.Join(words, ",") != "hc-dead-a:cooldown,hc-dead-b:ok" {
		t.Fatalf("the client's way: %v to %v; want a skipped, b its one attempt", words, entries[len(entries)-1]["provider"])
	}

	// Brought back: healthy again through its probes alone.
	a.start(t)
	testgw.Eventually(t, 10*time.Second, "hc-dead-a healthy again", func() bool {
		return state(t, "hc-dead-a").Health.Available()
	})
	if a.upgrades.Load() != 0 {
		t.Fatal("a client paid for the trial")
	}
	// Log entries follow the state change.
	testgw.Eventually(t, 5*time.Second, "the recovered log entry", func() bool { return len(g.LogEntries("provider recovered")) > 0 })
	recovered := g.LogEntries("provider recovered")
	if recovered[len(recovered)-1]["by"] != "health check" {
		t.Fatalf("recovered log %v", recovered)
	}
	testgw.Eventually(t, 5*time.Second, "the recovered event", func() bool {
		return contains(eventsOf("hc-dead-a"), "browser_failover.recovered hc-dead-a")
	})
	// Metrics count the probes by outcome.
	code, metrics := opAdmin(t, g, http.MethodGet, "/metrics")
	if code != 200 || !strings.Contains(string(metrics), `caddy_browser_failover_probes_total{outcome="refused",provider="hc-dead-a"}`) ||
		!strings.Contains(string(metrics), `caddy_browser_failover_probes_total{outcome="ok",provider="hc-dead-b"}`) {
		t.Fatalf("no probes_total by outcome in /metrics")
	}
}

// TestProbeTrialWakesWaiter: a single provider in cooldown that probes
// find back: the waiting client is served once the probe (the trial)
// passes, and its session is the provider's first upgrade.
func TestProbeTrialWakesWaiter(t *testing.T) {
	p := newHCProvider(t)
	p.status.Store(503)
	g := testgw.Start(t, handler(`"queue":{"size":5,"timeout":"20s"},"health_check":{"interval":"100ms"},"cooldown":{"min_requests":1,"duration":"300ms","max_duration":"600ms"}`,
		provider("hc-solo", p.httpURL(), "")))
	// Single provider protection: five failed probes in a row.
	testgw.Eventually(t, 15*time.Second, "hc-solo to cool down", func() bool {
		return !state(t, "hc-solo").Health.Available()
	})
	type res struct {
		c   *websocket.Conn
		err error
	}
	done := make(chan res, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, _, err := session(ctx, g.WS("/"), nil)
		done <- res{c, err}
	}()
	testgw.Eventually(t, 5*time.Second, "the client to wait", func() bool { return pool.Current().Waiting.Len() > 0 })
	time.Sleep(500 * time.Millisecond) // a few more failing trials meanwhile
	if p.upgrades.Load() != 0 {
		t.Fatal("the waiter was sent to the provider during its cooldown")
	}
	p.status.Store(200)
	var r res
	select {
	case r = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter was not served after the probe passed")
	}
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	r.c.Close(websocket.StatusNormalClosure, "")
	if n := p.upgrades.Load(); n != 1 {
		t.Fatalf("%d upgrades at the provider, want the waiter's only", n)
	}
	entries := waitSessionLogs(t, g, 1)
	for _, w := range attemptWords(entries[0]) {
		if w != "hc-solo:cooldown" && w != "hc-solo:ok" {
			t.Fatalf("the waiter's way %v: it attempted the provider in cooldown", attemptWords(entries[0]))
		}
	}
}

// TestCapacityBrowserlessFull: a browserless provider whose /pressure says
// isAvailable false (or running at maxConcurrent) is skipped as full and
// never attempted; a waiter is served when the pressure falls; the learnt
// maxConcurrent shows as its capacity.
func TestCapacityBrowserlessFull(t *testing.T) {
	bl, other := newHCProvider(t), newHCProvider(t)
	bl.pressure.Store(`{"pressure":{"running":1,"maxConcurrent":4,"queued":3,"isAvailable":false}}`)
	g := testgw.Start(t, handler(`"queue":{"size":5,"timeout":"20s"}`,
		provider("hc-bl", "ws://"+bl.Addr+"/?token=t0k3n", `"priority":1,"health_check":{"interval":"100ms","capacity":"browserless"}`),
		provider("hc-other", other.wsURL(), `"priority":2`)))
	testgw.Eventually(t, 10*time.Second, "the capacity read", func() bool {
		st, _ := opStatus(t, g)
		c := st.provider(t, "hc-bl").Capacity
		return c != nil && c.Full
	})
	st, body := opStatus(t, g)
	if c := st.provider(t, "hc-bl").Capacity; *c != (opCapacity{Running: 1, Max: 4, Queued: 3, Full: true}) {
		t.Fatalf("capacity %+v", c)
	}
	if strings.Contains(string(body), "t0k3n") {
		t.Fatal("the status shows the provider's token")
	}
	if st.provider(t, "hc-other").Capacity != nil {
		t.Fatal("a provider without capacity check shows a capacity")
	}
	mustRoundTrip(t, g, nil)
	entries := waitSessionLogs(t, g, 1)
	if w := attemptWords(entries[0]); strings.Join(w, ",") != "hc-bl:full,hc-other:ok" || bl.upgrades.Load() != 0 {
		t.Fatalf("the client's way %v (%d upgrades at hc-bl): want hc-bl skipped as full", w, bl.upgrades.Load())
	}

	// Only hc-bl left: a client waits, and is served when a slot frees.
	opAction(t, g, "hc-other", "drain")
	done := make(chan error, 1)
	go func() { done <- roundTrip(g.WS("/"), nil) }()
	testgw.Eventually(t, 5*time.Second, "the client to wait", func() bool { return pool.Current().Waiting.Len() > 0 })
	bl.pressure.Store(`{"pressure":{"running":3,"maxConcurrent":4,"queued":0,"isAvailable":true}}`)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter was not served when the provider had room")
	}
	if bl.upgrades.Load() != 1 {
		t.Fatalf("%d upgrades at hc-bl", bl.upgrades.Load())
	}
	// The learnt maxConcurrent is its limit here.
	if lim := state(t, "hc-bl").Slots.Limit(); lim != 4 {
		t.Fatalf("limit %d, want the learnt maxConcurrent 4", lim)
	}
}

// deafProvider accepts WebSocket sessions and then never reads: a peer that
// vanished (its pings go unanswered).
func deafProvider(t *testing.T) (url string, accepted *atomic.Int64) {
	t.Helper()
	accepted = new(atomic.Int64)
	stop := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if err != nil {
			return
		}
		accepted.Add(1)
		<-stop
		c.CloseNow()
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { close(stop); srv.Close() })
	return "ws://" + ln.Addr().String() + "/", accepted
}

// TestKeepaliveDeadPeerFreesSlot: a provider that reads nothing is found
// dead by keepalive: the client gets close 1001 "keepalive timeout", the
// log says so, the slot is freed and the waiting client served.
func TestKeepaliveDeadPeerFreesSlot(t *testing.T) {
	const interval = 200 * time.Millisecond
	u, accepted := deafProvider(t)
	g := testgw.Start(t, handler(`"keepalive":"200ms","queue":{"size":5,"timeout":"20s"}`,
		provider("ka-deaf", u, `"max_concurrent":1`)))
	first, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	closed := make(chan error, 1)
	go func() {
		_, _, err := first.Read(context.Background()) // answers pings while it reads
		closed <- err
	}()
	second := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, _, err := websocket.Dial(ctx, g.WS("/"), nil)
		if err == nil {
			c.CloseNow()
		}
		second <- err
	}()
	var cerr error
	select {
	case cerr = <-closed:
	case <-time.After(40 * interval):
		t.Fatalf("the session with a dead provider was not closed within %v", 40*interval)
	}
	took := time.Since(start)
	var ce websocket.CloseError
	if !errors.As(cerr, &ce) || ce.Code != websocket.StatusGoingAway || ce.Reason != "keepalive timeout" {
		t.Fatalf("client got %v, want close 1001 keepalive timeout", cerr)
	}
	if took < 2*interval {
		t.Fatalf("closed after %v, before two intervals", took)
	}
	t.Logf("dead provider's session closed %v after it started (interval %v)", took.Round(time.Millisecond), interval)
	select {
	case err := <-second:
		if err != nil {
			t.Fatalf("the waiter: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter was not served when the slot freed")
	}
	// The provider counts a session after its 101 is written, so the
	// waiter may hold that 101 a moment before the count moves.
	testgw.Eventually(t, 5*time.Second, "the provider's second session", func() bool { return accepted.Load() >= 2 })
	if accepted.Load() != 2 {
		t.Fatalf("%d sessions accepted, want 2", accepted.Load())
	}
	entries := waitSessionLogs(t, g, 1)
	if entries[0]["close_reason"] != "keepalive timeout" {
		t.Fatalf("session log %v", entries[0])
	}
	if n, _ := entries[0]["keepalive_pings"].(float64); n < 2 {
		t.Fatalf("keepalive_pings %v, want at least the two unanswered", entries[0]["keepalive_pings"])
	}
}

// TestKeepaliveLeavesIdleTimeout: pings and their pongs are not activity:
// an idle session whose sides answer every ping is closed at idle_timeout.
func TestKeepaliveLeavesIdleTimeout(t *testing.T) {
	echo := fakes.Echo("ka-idle", nil)
	defer echo.Close()
	g := testgw.Start(t, handler(`"keepalive":"100ms","session":{"idle_timeout":"1s"}`, provider("ka-idle", echo.URL(), "")))
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, _, err = c.Read(context.Background())
	took := time.Since(start)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusNormalClosure || ce.Reason != "idle timeout" {
		t.Fatalf("client got %v, want close 1000 idle timeout", err)
	}
	if took < time.Second {
		t.Fatalf("closed after %v, before idle_timeout", took)
	}
	entries := waitSessionLogs(t, g, 1)
	if n, _ := entries[0]["keepalive_pings"].(float64); n < 4 || entries[0]["close_reason"] != "idle timeout" {
		t.Fatalf("log %v: want idle timeout after several pings", entries[0])
	}
	// No ping or pong is relayed. The provider's answer to the gateway's
	// close frame may be (a read already under way when the session began
	// to close returns it, and it goes on to the client): 16 bytes.
	if down := entries[0]["bytes_down"].(float64); entries[0]["bytes_up"].(float64) != 0 || (down != 0 && down != 16) {
		t.Fatalf("pings counted as relayed bytes: %v", entries[0])
	}
}

// TestHealthCheckConfig: the options in the Caddyfile and JSON, and every
// bad value rejected with a message naming it (in the Caddyfile, at its
// line).
func TestHealthCheckConfig(t *testing.T) {
	out, err := adapt(t, `:8080
browser_failover {
	keepalive 30s
	health_check {
		interval 5s
		timeout 1s
	}
	provider chrome http://127.0.0.1:9222
	provider bl wss://production-sfo.browserless.io/?token={env.BL_TOKEN} {
		health_check {
			capacity browserless
			expect_status 200
		}
	}
	provider pw ws://127.0.0.1:3000/pw {
		health_check off
	}
	provider cloud wss://connect.example.com/?apiKey=k {
		health_check {
			uri https://status.example.com/up
			interval 30s
		}
	}
}`)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Routes []struct {
						Handle []json.RawMessage `json:"handle"`
					} `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	var h struct {
		Keepalive   caddy.Duration `json:"keepalive"`
		HealthCheck map[string]any `json:"health_check"`
		Providers   []struct {
			Name        string         `json:"name"`
			HealthCheck map[string]any `json:"health_check"`
		} `json:"providers"`
	}
	var raw json.RawMessage
	for _, s := range cfg.Apps.HTTP.Servers {
		raw = s.Routes[0].Handle[0]
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		t.Fatal(err)
	}
	if time.Duration(h.Keepalive) != 30*time.Second || fmt.Sprint(h.HealthCheck) != "map[interval:5e+09 timeout:1e+09]" {
		t.Fatalf("handler: %s", raw)
	}
	want := []string{"map[]", "map[capacity:browserless expect_status:200]", "map[off:true]", "map[interval:3e+10 uri:https://status.example.com/up]"}
	for i, p := range h.Providers {
		if got := fmt.Sprint(p.HealthCheck); got != want[i] && !(want[i] == "map[]" && p.HealthCheck == nil) {
			t.Fatalf("provider %s: health_check %s, want %s", p.Name, got, want[i])
		}
	}

	bad := []struct{ name, body, want string }{
		{"interval", "browser_failover {\n provider a http://h:1\n health_check {\n  interval soon\n }\n}", `Caddyfile:4 - Error during parsing: interval: invalid duration "soon"`},
		{"capacity", "browser_failover {\n provider a http://h:1\n health_check {\n  capacity sessions\n }\n}", `Caddyfile:4 - Error during parsing: health_check capacity "sessions": want browserless`},
		{"status", "browser_failover {\n provider a http://h:1\n health_check {\n  expect_status 99\n }\n}", `Caddyfile:4 - Error during parsing: health_check expect_status 99 is not an HTTP status`},
		{"uri", "browser_failover {\n provider a http://h:1\n health_check {\n  uri health\n }\n}", "Caddyfile:4 - Error during parsing: health_check uri: want a path starting with / or an http:// or https:// URL"},
		{"twice", "browser_failover {\n provider a http://h:1\n health_check {\n  uri /a\n  uri /b\n }\n}", "Caddyfile:5 - Error during parsing: uri given twice in the same block"},
		{"unknown", "browser_failover {\n provider a http://h:1\n health_check {\n  path /a\n }\n}", `Caddyfile:4 - Error during parsing: health_check: unknown option "path"`},
		{"timeout", "browser_failover {\n provider a http://h:1\n health_check {\n  interval 1s\n  timeout 5s\n }\n}", "Caddyfile:5 - Error during parsing: health_check timeout (5s) must not exceed its interval (1s)"},
		{"off at handler", "browser_failover {\n provider a http://h:1\n health_check off\n}", "Caddyfile:3 - Error during parsing: health_check off is for a provider"},
		{"block twice", "browser_failover {\n provider a http://h:1\n health_check {\n }\n health_check {\n }\n}", "Caddyfile:5 - Error during parsing: health_check given twice"},
		{"ws default", "browser_failover {\n health_check {\n  interval 5s\n }\n provider a ws://h:1/x\n}", `Caddyfile:2 - Error during parsing: provider "a": health_check needs a uri for a ws:// or wss:// provider`},
		{"ws own", "browser_failover {\n provider a ws://h:1/x {\n  priority 2\n  health_check {\n   interval 5s\n  }\n }\n}", `Caddyfile:4 - Error during parsing: provider "a": health_check needs a uri`},
		{"merged timeout", "browser_failover {\n health_check {\n  timeout 5s\n }\n provider a http://h:1 {\n  health_check {\n   interval 1s\n  }\n }\n}", `Caddyfile:6 - Error during parsing: provider "a": health_check timeout (5s) must not exceed its interval (1s)`},
		{"off with block", "browser_failover {\n provider a http://h:1 {\n  health_check off {\n   uri /x\n  }\n }\n}", "health_check off takes no block"},
		{"keepalive", "browser_failover {\n provider a http://h:1\n keepalive soon\n}", `Caddyfile:3 - Error during parsing: keepalive: invalid duration "soon"`},
		{"keepalive negative", "browser_failover {\n provider a http://h:1\n keepalive -1s\n}", "Caddyfile:3 - Error during parsing: keepalive must not be negative"},
		{"keepalive twice", "browser_failover {\n provider a http://h:1\n keepalive 5s\n keepalive 6s\n}", "Caddyfile:4 - Error during parsing: keepalive given twice"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := adapt(t, ":8080\n"+tc.body)
			if err == nil {
				t.Fatalf("adapted without error, want %q", tc.want)
			}
			msg, line := tc.want, ""
			if rest, ok := strings.CutPrefix(tc.want, "Caddyfile:"); ok {
				n, m, _ := strings.Cut(rest, " - Error during parsing: ")
				msg, line = m, shiftLine("Caddyfile:"+n)
			}
			if !strings.Contains(err.Error(), msg) {
				t.Fatalf("error %q does not contain %q", err, msg)
			}
			if line != "" && !strings.HasSuffix(err.Error(), "at "+line) {
				t.Fatalf("error %q does not name %s", err, line)
			}
		})
	}

	jsonBad := []struct{ name, handler, want string }{
		{"keepalive", `{"handler":"browser_failover","providers":[{"name":"a","url":"http://h:1"}],"keepalive":-1}`, "keepalive must not be negative"},
		{"off at handler", `{"handler":"browser_failover","providers":[{"name":"a","url":"http://h:1"}],"health_check":{"off":true}}`, "health_check off is for a provider"},
		{"off with settings", `{"handler":"browser_failover","providers":[{"name":"a","url":"http://h:1","health_check":{"off":true,"uri":"/x"}}]}`, `provider "a": health_check off takes no other setting`},
		{"ws without uri", `{"handler":"browser_failover","providers":[{"name":"a","url":"wss://h:1/"}],"health_check":{}}`, `provider "a": health_check needs a uri`},
		{"capacity", `{"handler":"browser_failover","providers":[{"name":"a","url":"http://h:1","health_check":{"capacity":"steel"}}]}`, `health_check capacity "steel": want browserless`},
		{"status", `{"handler":"browser_failover","providers":[{"name":"a","url":"http://h:1"}],"health_check":{"expect_status":700}}`, "health_check expect_status 700 is not an HTTP status"},
		{"timeout", `{"handler":"browser_failover","providers":[{"name":"a","url":"http://h:1"}],"health_check":{"interval":"1s","timeout":"3s"}}`, "health_check timeout (3s) must not exceed its interval (1s)"},
		{"negative", `{"handler":"browser_failover","providers":[{"name":"a","url":"http://h:1"}],"health_check":{"interval":-5}}`, "health_check interval must be positive"},
		{"uri", `{"handler":"browser_failover","providers":[{"name":"a","url":"http://h:1","health_check":{"uri":"ftp://x/"}}]}`, "want a path starting with / or an http:// or https:// URL"},
	}
	for _, tc := range jsonBad {
		t.Run("json "+tc.name, func(t *testing.T) {
			cfg := `{"admin":{"disabled":true},"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:0"],"routes":[{"handle":[` + tc.handler + `]}]}}}}}`
			var c caddy.Config
			if err := json.Unmarshal([]byte(cfg), &c); err != nil {
				t.Fatal(err)
			}
			err := caddy.Validate(&c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestHealthCheckReloads: a reload keeps one probe loop per provider and
// its pace (no extra probe, no reset); a reload without the health check
// stops it.
func TestHealthCheckReloads(t *testing.T) {
	p := newHCProvider(t)
	cfg := func(extra string) string {
		return handler(`"health_check":{"interval":"300ms"}`+extra, provider("hc-reload", p.httpURL(), ""))
	}
	g := testgw.Start(t, cfg(""))
	testgw.Eventually(t, 5*time.Second, "the first probe", func() bool { return p.probes.Load() > 0 })
	// Two handlers of one config, and reloads: still one loop.
	twice := `{"handler":"subroute","routes":[{"handle":[` + cfg("") + `]},{"handle":[` + cfg("") + `]}]}`
	for range 3 {
		if err := g.Reload(twice); err != nil {
			t.Fatal(err)
		}
	}
	before, start := p.probes.Load(), time.Now()
	time.Sleep(3 * time.Second)
	n := p.probes.Load() - before
	// One loop at 300ms: about 10 in 3s (a loaded machine may make fewer).
	if max := int64(time.Since(start)/(300*time.Millisecond)) + 2; n > max {
		t.Fatalf("%d probes in %v at a 300ms interval: more than one loop", n, time.Since(start))
	}
	if n == 0 {
		t.Fatal("the reloads stopped the probes")
	}
	if err := g.Reload(handler("", provider("hc-reload", p.httpURL(), ""))); err != nil {
		t.Fatal(err)
	}
	testgw.Eventually(t, 5*time.Second, "the loop to stop", func() bool { return !state(t, "hc-reload").Probes.Running() })
	settledAt := p.probes.Load()
	time.Sleep(time.Second)
	if p.probes.Load() != settledAt {
		t.Fatal("probes after the health check left the config")
	}
}

// TestKeepaliveHTTP2: an HTTP/2 extended CONNECT session is pinged too
// (unmasked, on its stream, between the frames of its interrupted reads),
// and goes on working after answering several pings.
func TestKeepaliveHTTP2(t *testing.T) {
	echo := fakes.Echo("ka-h2", nil)
	defer echo.Close()
	g, tr := startH2(t, handler(`"keepalive":"150ms"`, provider("ka-h2", echo.URL(), "")))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := dialH2(ctx, tr, "https://"+g.addr+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	for i := range 3 {
		op, p, err := c.readFrame()
		if err != nil || op != 0x9 || len(p) == 0 {
			t.Fatalf("frame %d: op %#x %v, want a ping", i, op, err)
		}
		if err := c.writeFrame(0xA, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.writeFrame(0x1, []byte("after the pings")); err != nil {
		t.Fatal(err)
	}
	for {
		op, p, err := c.readFrame()
		if err != nil {
			t.Fatal(err)
		}
		if op == 0x9 {
			c.writeFrame(0xA, p)
			continue
		}
		if op != 0x1 || string(p) != "after the pings" {
			t.Fatalf("got op %#x %q: a pong came back, or the echo is wrong", op, p)
		}
		break
	}
}

// shiftLine moves a "Caddyfile:N" reference down one line (adapt puts a
// site address line before the handler's text).
func shiftLine(s string) string {
	const p = "Caddyfile:"
	i := strings.Index(s, p)
	if i < 0 {
		return s
	}
	j := i + len(p)
	k := j
	for k < len(s) && s[k] >= '0' && s[k] <= '9' {
		k++
	}
	n, _ := strconv.Atoi(s[j:k])
	return s[:j] + strconv.Itoa(n+1) + s[k:]
}
