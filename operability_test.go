package browserfailover_test

// Integration tests of the operability surface: the admin
// API's status JSON and provider actions, the metrics on the admin /metrics
// endpoint, the events through Caddy's events app, the webhooks, and that no
// credential reaches any of them or the logs. Provider names are unique per
// test: their state is process-wide.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/coder/websocket"

	browserfailover "github.com/browserfailover/caddy-browser-failover"
	"github.com/browserfailover/caddy-browser-failover/config"
	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// opAdmin calls the admin API and returns the status and body.
func opAdmin(t *testing.T, g *testgw.Gateway, method, path string) (int, []byte) {
	t.Helper()
	code, body, err := g.AdminDo(method, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return code, body
}

// opProvider is a provider's status object as the admin API shows it.
type opProvider struct {
	Name          string     `json:"name"`
	URL           string     `json:"url"`
	Healthy       bool       `json:"healthy"`
	Draining      bool       `json:"draining"`
	Active        int64      `json:"active"`
	MaxConcurrent int64      `json:"max_concurrent"`
	CooldownUntil *time.Time `json:"cooldown_until"`
	Attempts      int64      `json:"attempts"`
	Failures      int64      `json:"failures"`
	HandshakeMS   float64    `json:"handshake_ms"`
	LastError     string     `json:"last_error"`
	LastProbe     *opProbe   `json:"last_probe"`
	// Capacity is shown only for a health check that reads capacity.
	Capacity *opCapacity `json:"capacity,omitempty"`
	// MaxConcurrentLearned is shown only with max_concurrent auto.
	MaxConcurrentLearned *int64  `json:"max_concurrent_learned,omitempty"`
	Spend                opSpend `json:"spend"`
}

// opSpend is what a provider's sessions cost in the current window.
type opSpend struct {
	WindowStart time.Time `json:"window_start"`
	Spent       float64   `json:"spent"`
	Accrued     float64   `json:"accrued"`
	Budget      *float64  `json:"budget"`
}

// opProbe is a provider's last probe.
type opProbe struct {
	At      time.Time `json:"at"`
	Outcome string    `json:"outcome"`
	MS      float64   `json:"ms"`
}

// opCapacity is what a capacity probe said.
type opCapacity struct {
	Running int  `json:"running"`
	Max     int  `json:"max"`
	Queued  int  `json:"queued"`
	Full    bool `json:"full"`
}

type opQueue struct {
	Handler   string    `json:"handler"`
	Waiting   int       `json:"waiting"`
	Size      int       `json:"size"`
	TimeoutMS int64     `json:"timeout_ms"`
	Providers []string  `json:"providers"`
	Scaling   opScaling `json:"scaling"`
}

type opScaling struct {
	Waiting     int      `json:"waiting"`
	Active      int64    `json:"active"`
	Capacity    int64    `json:"capacity"`
	Utilization *float64 `json:"utilization"`
}

type opStatusDoc struct {
	Providers []opProvider `json:"providers"`
	Queues    []opQueue    `json:"queues"`
	Clients   []opClient   `json:"clients"`
	Parked    struct {
		Sessions int `json:"sessions"`
		Held     int `json:"held"`
	} `json:"parked"`
}

// opClient is a client_limit key's entry.
type opClient struct {
	Key     string `json:"key"`
	Active  int    `json:"active"`
	Waiting int    `json:"waiting"`
}

var (
	opProviderKeys = []string{"active", "attempts", "cooldown_until", "draining", "failures", "handshake_ms", "healthy", "last_error", "last_probe", "max_concurrent", "name", "spend", "url"}
	opQueueKeys    = []string{"handler", "providers", "scaling", "size", "timeout_ms", "waiting"}
)

// opStrict decodes body into v refusing unknown fields, and checks that
// the object has exactly the keys want.
func opStrict(t *testing.T, body []byte, v any, want []string) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decoding %s: %v", body, err)
	}
	if want == nil {
		return
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	opKeys(t, m, want, string(body))
}

func opKeys(t *testing.T, m map[string]json.RawMessage, want []string, where string) {
	t.Helper()
	var got []string
	for k := range m {
		got = append(got, k)
	}
	sort.Strings(got)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("keys %v, want %v in %s", got, want, where)
	}
}

// opStatus fetches and strictly decodes the status document.
func opStatus(t *testing.T, g *testgw.Gateway) (opStatusDoc, []byte) {
	t.Helper()
	code, body := opAdmin(t, g, http.MethodGet, "/browser_failover/status")
	if code != 200 {
		t.Fatalf("status: %d %s", code, body)
	}
	var doc opStatusDoc
	opStrict(t, body, &doc, []string{"clients", "parked", "providers", "queues"})
	var raw struct {
		Providers []map[string]json.RawMessage `json:"providers"`
		Queues    []map[string]json.RawMessage `json:"queues"`
	}
	json.Unmarshal(body, &raw)
	for _, p := range raw.Providers {
		want := opProviderKeys
		if _, ok := p["capacity"]; ok {
			// Only a health check that reads capacity shows it.
			want = append([]string{"active", "attempts", "capacity"}, opProviderKeys[2:]...)
		}
		opKeys(t, p, want, string(body))
	}
	for _, q := range raw.Queues {
		opKeys(t, q, opQueueKeys, string(body))
	}
	return doc, body
}

func (d opStatusDoc) provider(t *testing.T, name string) opProvider {
	t.Helper()
	for _, p := range d.Providers {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no provider %q in status", name)
	return opProvider{}
}

// opAction posts a provider action and decodes the answer strictly.
func opAction(t *testing.T, g *testgw.Gateway, name, action string) opProvider {
	t.Helper()
	code, body := opAdmin(t, g, http.MethodPost, "/browser_failover/providers/"+name+"/"+action)
	if code != 200 {
		t.Fatalf("%s %s: %d %s", action, name, code, body)
	}
	var p opProvider
	opStrict(t, body, &p, opProviderKeys)
	if p.Name != name {
		t.Fatalf("%s answered for %q", action, p.Name)
	}
	return p
}

// TestAdminStatus: the status document during a live session, during a
// cooldown and after a reset; drain and undrain; 404 and 405.
func TestAdminStatus(t *testing.T) {
	bad := fakes.Status("op-bad", nil, 500, nil, "boom")
	defer bad.Close()
	e1, e2 := fakes.Echo("op-e1", nil), fakes.Echo("op-e2", nil)
	defer e1.Close()
	defer e2.Close()
	g := testgw.Start(t, handler(`"queue":{"size":7,"timeout":"3s"}`,
		provider("op-bad", bad.URL(), `"priority":1,"cooldown":{"min_requests":1,"duration":"1m"}`),
		provider("op-e1", e1.URL(), `"priority":2,"max_concurrent":5`),
		provider("op-e2", e2.URL(), `"priority":3`)))

	doc, _ := opStatus(t, g)
	for _, n := range []string{"op-bad", "op-e1", "op-e2"} {
		p := doc.provider(t, n)
		if !p.Healthy || p.Draining || p.Active != 0 || p.CooldownUntil != nil || p.Attempts != 0 || p.Failures != 0 || p.HandshakeMS != 0 || p.LastError != "" {
			t.Fatalf("fresh %+v", p)
		}
	}
	if p := doc.provider(t, "op-e1"); p.MaxConcurrent != 5 || p.URL != e1.URL() {
		t.Fatalf("op-e1 %+v", p)
	}
	if p := doc.provider(t, "op-e2"); p.MaxConcurrent != 0 {
		t.Fatalf("op-e2 %+v", p)
	}
	var q *opQueue
	for i := range doc.Queues {
		if strings.Join(doc.Queues[i].Providers, ",") == "op-bad,op-e1,op-e2" {
			q = &doc.Queues[i]
		}
	}
	if q == nil || q.Waiting != 0 || q.Size != 7 || q.TimeoutMS != 3000 {
		t.Fatalf("queues %+v", doc.Queues)
	}

	// A live session on op-e1, after op-bad failed and cooled down.
	before := time.Now()
	c1, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.CloseNow()
	echoOnce(t, c1, []byte("one"))
	doc, _ = opStatus(t, g)
	p := doc.provider(t, "op-e1")
	if !p.Healthy || p.Active != 1 || p.Attempts != 1 || p.Failures != 0 || p.HandshakeMS <= 0 || p.CooldownUntil != nil || p.LastError != "" {
		t.Fatalf("live op-e1 %+v", p)
	}
	p = doc.provider(t, "op-bad")
	if p.Healthy || p.CooldownUntil == nil || p.Attempts != 1 || p.Failures != 1 || p.LastError != "status_500" || p.Active != 0 {
		t.Fatalf("cooling op-bad %+v", p)
	}
	if d := p.CooldownUntil.Sub(before); d < 55*time.Second || d > 65*time.Second {
		t.Fatalf("cooldown_until %v is %v after the connect", p.CooldownUntil, d)
	}

	// Reset ends the cooldown and clears the counters.
	p = opAction(t, g, "op-bad", "reset")
	if !p.Healthy || p.CooldownUntil != nil || p.Attempts != 0 || p.Failures != 0 || p.LastError != "" {
		t.Fatalf("after reset %+v", p)
	}
	if p := func() opProvider { d, _ := opStatus(t, g); return d.provider(t, "op-bad") }(); !p.Healthy || p.Attempts != 0 {
		t.Fatalf("status after reset %+v", p)
	}

	// Drain op-e1: its live session goes on, the next one lands on op-e2.
	if p := opAction(t, g, "op-e1", "drain"); !p.Draining || p.Active != 1 {
		t.Fatalf("drained %+v", p)
	}
	c2, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.CloseNow()
	echoOnce(t, c2, []byte("two"))
	echoOnce(t, c1, []byte("still echoing"))
	if e1.Hits.Load() != 1 || e2.Hits.Load() != 1 {
		t.Fatalf("hits e1 %d e2 %d", e1.Hits.Load(), e2.Hits.Load())
	}
	doc, _ = opStatus(t, g)
	if a, b := doc.provider(t, "op-e1"), doc.provider(t, "op-e2"); a.Active != 1 || !a.Draining || b.Active != 1 || b.Draining {
		t.Fatalf("after drain: %+v %+v", a, b)
	}
	if p := opAction(t, g, "op-e1", "undrain"); p.Draining {
		t.Fatalf("undrained %+v", p)
	}

	// Unknown names and actions: 404; wrong methods: 405.
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{http.MethodPost, "/browser_failover/providers/op-nope/drain", 404},
		{http.MethodPost, "/browser_failover/providers/op-nope/reset", 404},
		{http.MethodPost, "/browser_failover/providers/op-e1/explode", 404},
		{http.MethodGet, "/browser_failover/providers/op-e1/drain", 405},
		{http.MethodGet, "/browser_failover/providers/op-e1/undrain", 405},
		{http.MethodGet, "/browser_failover/providers/op-e1/reset", 405},
		{http.MethodPost, "/browser_failover/status", 405},
		{http.MethodDelete, "/browser_failover/status", 405},
	} {
		code, body := opAdmin(t, g, tc.method, tc.path)
		var e struct {
			Error string `json:"error"`
		}
		if code != tc.code || json.Unmarshal(body, &e) != nil || e.Error == "" {
			t.Errorf("%s %s: %d %s, want %d with a JSON error", tc.method, tc.path, code, body, tc.code)
		}
	}
	c1.Close(websocket.StatusNormalClosure, "")
	c2.Close(websocket.StatusNormalClosure, "")
	testgw.Eventually(t, 5*time.Second, "sessions to end", func() bool {
		d, _ := opStatus(t, g)
		return d.provider(t, "op-e1").Active == 0 && d.provider(t, "op-e2").Active == 0
	})
}

// opSeries is a scrape: series ("name{k=v,...}" with labels sorted) to value.
type opSeries map[string]float64

var opLabelRE = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

func opScrape(t *testing.T, g *testgw.Gateway) (opSeries, string) {
	t.Helper()
	code, body := opAdmin(t, g, http.MethodGet, "/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	out := opSeries{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		series := line[:i]
		name, labels, _ := strings.Cut(series, "{")
		var pairs []string
		for _, m := range opLabelRE.FindAllStringSubmatch(labels, -1) {
			pairs = append(pairs, m[1]+"="+m[2])
		}
		sort.Strings(pairs)
		out[name+"{"+strings.Join(pairs, ",")+"}"] = v
	}
	return out, string(body)
}

// get returns the value of name with the given k=v labels (0 if absent).
func (s opSeries) get(name string, labels ...string) float64 {
	sort.Strings(labels)
	return s[name+"{"+strings.Join(labels, ",")+"}"]
}

func (s opSeries) has(name string, labels ...string) bool {
	sort.Strings(labels)
	_, ok := s[name+"{"+strings.Join(labels, ",")+"}"]
	return ok
}

// TestMetricsMove: counters, gauges and histograms on the admin /metrics
// endpoint move with traffic, with provider names and fixed words as
// labels, and survive a reload.
func TestMetricsMove(t *testing.T) {
	const p = "caddy_browser_failover_"
	s500 := fakes.Status("mt-500", nil, 500, nil, "")
	defer s500.Close()
	echo := fakes.Echo("mt-echo", nil)
	defer echo.Close()
	cfg := handler(`"queue":{"size":5,"timeout":"600ms"}`,
		provider("mt-500", s500.URL(), `"priority":1`),
		provider("mt-echo", echo.URL(), `"priority":2,"max_concurrent":1`))
	g := testgw.Start(t, cfg)

	before, _ := opScrape(t, g)
	if !before.has(p+"active_sessions", "provider=mt-echo") || !before.has(p+"provider_healthy", "provider=mt-500") || !before.has(p+"queue_waiting", "handler=mt-500,mt-echo") {
		t.Fatal("pool gauges missing before traffic")
	}
	for name, v := range before {
		if strings.HasPrefix(name, p+"attempts_total") && v != 0 {
			t.Fatalf("%s is %v before any traffic: a new gateway's counters start at zero", name, v)
		}
	}

	c1, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.CloseNow()
	echoOnce(t, c1, []byte("x"))
	// mt-echo is full: the next client fails on mt-500, queues, times out.
	resp, err := http.DefaultClient.Do(upgradeRequest(t, g.HTTP("/")))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Fatalf("second client got %d", resp.StatusCode)
	}
	mid, _ := opScrape(t, g)
	if mid.get(p+"active_sessions", "provider=mt-echo") != 1 || mid.get(p+"provider_healthy", "provider=mt-echo") != 1 {
		t.Fatalf("gauges during the session: active %v healthy %v",
			mid.get(p+"active_sessions", "provider=mt-echo"), mid.get(p+"provider_healthy", "provider=mt-echo"))
	}
	c1.Close(websocket.StatusNormalClosure, "")
	testgw.Eventually(t, 5*time.Second, "session_seconds to count the session", func() bool {
		s, _ := opScrape(t, g)
		return s.get(p+"session_seconds_count", "provider=mt-echo") == 1
	})
	after, body := opScrape(t, g)
	// The counters are the gateway's registry's, which this test's
	// gateway made: they count this test's traffic only.
	delta := after.get
	if d := delta(p+"attempts_total", "provider=mt-500", "outcome=status_500"); d < 2 {
		t.Errorf("attempts status_500 moved %v, want >= 2", d)
	}
	if d := delta(p+"attempts_total", "provider=mt-echo", "outcome=ok"); d != 1 {
		t.Errorf("attempts ok moved %v, want 1", d)
	}
	// Only the first client failed over from mt-500 to mt-echo; the
	// second found mt-echo full after each failed attempt, and a failed
	// attempt with nowhere to go is not a failover.
	if d := delta(p+"failovers_total", "provider=mt-500"); d != 1 {
		t.Errorf("mt-500 failovers moved %v, want 1", d)
	}
	if d := delta(p+"failovers_total", "provider=mt-echo"); d != 0 {
		t.Errorf("mt-echo failovers %v", d)
	}
	if d := delta(p+"rejections_total", "reason=queue_timeout"); d != 1 {
		t.Errorf("rejections queue_timeout moved %v, want 1", d)
	}
	if d := delta(p + "queue_wait_seconds_count"); d != 1 {
		t.Errorf("queue_wait_seconds_count moved %v, want 1", d)
	}
	if d := delta(p + "queue_wait_seconds_sum"); d < 0.5 || d > 5 {
		t.Errorf("queue_wait_seconds_sum moved %v, want about 0.6", d)
	}
	if d := delta(p+"handshake_seconds_count", "provider=mt-echo"); d != 1 {
		t.Errorf("handshake_seconds_count moved %v, want 1", d)
	}
	if after.get(p+"active_sessions", "provider=mt-echo") != 0 || after.get(p+"queue_waiting", "handler=mt-500,mt-echo") != 0 {
		t.Errorf("gauges after: active %v waiting %v", after.get(p+"active_sessions", "provider=mt-echo"), after.get(p+"queue_waiting", "handler=mt-500,mt-echo"))
	}
	// Every label of ours holds a provider name or a fixed word.
	words := map[string]*regexp.Regexp{
		"provider": regexp.MustCompile(`^[^/:@?=]+$`), // a name, nothing URL-like
		"handler":  regexp.MustCompile(`^[^/:@?=]+$`), // provider names
		"outcome":  regexp.MustCompile(`^(ok|refused|timeout|dns_error|tls_error|reset|bad_handshake|bad_discovery|client_gone|create_failed|bad_create|bad_connect_url|status_(\d{3}|4xx|5xx|other)|other)$`),
		"reason":   regexp.MustCompile(`^(queue_full|queue_timeout|no_provider|relayed|unservable|client_limit|resume|origin|shutdown|other)$`),
		"sink":     regexp.MustCompile(`^(events_app|webhook)$`),
		"result":   regexp.MustCompile(`^(ok|failed|resumed|unknown|unavailable|refused|conflict|not_resumable)$`),
		"held":     regexp.MustCompile(`^(true|false)$`),
		"op":       regexp.MustCompile(`^(acquire|publish|status|ping|reset)$`),
		"le":       regexp.MustCompile(`.`),
	}
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, p) {
			continue
		}
		for _, m := range opLabelRE.FindAllStringSubmatch(line, -1) {
			if re := words[m[1]]; re == nil || !re.MatchString(m[2]) {
				t.Errorf("label %s=%q in %s", m[1], m[2], line)
			}
		}
	}

	// A reload gets a new registry: the same collectors, no panic, the
	// counters keep their values.
	if err := g.Reload(handler(`"queue":{"size":5,"timeout":"700ms"}`,
		provider("mt-500", s500.URL(), `"priority":1`),
		provider("mt-echo", echo.URL(), `"priority":2,"max_concurrent":1`))); err != nil {
		t.Fatal(err)
	}
	reloaded, _ := opScrape(t, g)
	if got, want := reloaded.get(p+"attempts_total", "provider=mt-echo", "outcome=ok"), after.get(p+"attempts_total", "provider=mt-echo", "outcome=ok"); got != want {
		t.Fatalf("after reload attempts ok %v, want %v", got, want)
	}
	if !reloaded.has(p+"queue_waiting", "handler=mt-500,mt-echo") || !reloaded.has(p+"provider_healthy", "provider=mt-echo") {
		t.Fatal("pool gauges missing after reload")
	}
}

// opReceiver is a webhook receiver that records what it gets.
type opReceiver struct {
	*httptest.Server
	mu      sync.Mutex
	bodies  [][]byte
	headers []http.Header
	hits    atomic.Int64
}

func newOpReceiver(t *testing.T, handle func(w http.ResponseWriter, r *http.Request)) *opReceiver {
	rv := &opReceiver{}
	rv.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rv.hits.Add(1)
		body, _ := io.ReadAll(r.Body)
		rv.mu.Lock()
		rv.bodies = append(rv.bodies, body)
		rv.headers = append(rv.headers, r.Header.Clone())
		rv.mu.Unlock()
		if handle != nil {
			handle(w, r)
		}
	}))
	return rv
}

func (rv *opReceiver) got() ([][]byte, []http.Header) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	return append([][]byte(nil), rv.bodies...), append([]http.Header(nil), rv.headers...)
}

type opEnvelope struct {
	Event string         `json:"event"`
	Time  string         `json:"time"`
	Data  map[string]any `json:"data"`
}

// TestWebhookCooldownSigned: a cooldown reaches the webhook as a signed
// JSON body; events it did not ask for do not.
func TestWebhookCooldownSigned(t *testing.T) {
	const secret = "wh-signing-key"
	rv := newOpReceiver(t, nil)
	defer rv.Close()
	s500 := fakes.Status("wh-500", nil, 500, nil, "")
	defer s500.Close()
	echo := fakes.Echo("wh-echo", nil)
	defer echo.Close()
	hook := fmt.Sprintf(`"webhooks":[{"url":%q,"events":["cooldown"],"secret":%q}]`, rv.URL+"/hook", secret)
	g := testgw.Start(t, handler(`"queue":{"size":0},`+hook,
		provider("wh-500", s500.URL(), `"priority":1,"cooldown":{"min_requests":1,"duration":"1m"}`),
		provider("wh-echo", echo.URL(), `"priority":2,"max_concurrent":1`)))

	start := time.Now()
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	// A rejection (wh-echo full, wh-500 cooling): not subscribed.
	resp, err := http.DefaultClient.Do(upgradeRequest(t, g.HTTP("/")))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Fatalf("second client got %d", resp.StatusCode)
	}
	testgw.Eventually(t, 5*time.Second, "the cooldown webhook", func() bool { return rv.hits.Load() >= 1 })
	time.Sleep(200 * time.Millisecond) // room for an unwanted delivery to show up
	bodies, headers := rv.got()
	if len(bodies) != 1 {
		t.Fatalf("%d deliveries, want 1: %q", len(bodies), bodies)
	}
	body, hd := bodies[0], headers[0]
	ts, err := strconv.ParseInt(hd.Get("X-Browser-Failover-Timestamp"), 10, 64)
	if err != nil || ts < start.Unix()-1 || ts > time.Now().Unix()+1 {
		t.Fatalf("timestamp %q: %v", hd.Get("X-Browser-Failover-Timestamp"), err)
	}
	if got, want := hd.Get("X-Browser-Failover-Signature"), observe.Sign([]byte(secret), hd.Get("X-Browser-Failover-Timestamp"), body); got != want {
		t.Fatalf("signature %q, want %q", got, want)
	}
	if hd.Get("Content-Type") != "application/json" || hd.Get("X-Browser-Failover-Event") != "browser_failover.cooldown" {
		t.Fatalf("headers %v", hd)
	}
	var env opEnvelope
	opStrict(t, body, &env, []string{"data", "event", "time"})
	if env.Event != "browser_failover.cooldown" {
		t.Fatalf("event %q", env.Event)
	}
	at, err := time.Parse(time.RFC3339, env.Time)
	if err != nil || at.Before(start.Add(-time.Second)) || at.After(time.Now()) {
		t.Fatalf("time %q: %v", env.Time, err)
	}
	var data map[string]json.RawMessage
	json.Unmarshal(body, &struct {
		Data *map[string]json.RawMessage `json:"data"`
	}{&data})
	opKeys(t, data, []string{"provider", "reason", "until"}, string(body))
	until, err := time.Parse(time.RFC3339, env.Data["until"].(string))
	if env.Data["provider"] != "wh-500" || env.Data["reason"] != "status_500" || err != nil ||
		until.Sub(at) < 55*time.Second || until.Sub(at) > 65*time.Second {
		t.Fatalf("data %s", body)
	}
}

// TestResetReportsRecovered: an operator's reset of a provider in cooldown
// sends browser_failover.recovered (here to a webhook), once; a reset of a
// healthy provider sends nothing.
func TestResetReportsRecovered(t *testing.T) {
	rv := newOpReceiver(t, nil)
	defer rv.Close()
	s500 := fakes.Status("rr-500", nil, 500, nil, "")
	defer s500.Close()
	echo := fakes.Echo("rr-echo", nil)
	defer echo.Close()
	hook := fmt.Sprintf(`"webhooks":[{"url":%q,"events":["cooldown","recovered"],"secret":"k"}]`, rv.URL)
	g := testgw.Start(t, handler(`"queue":{"size":0},`+hook,
		provider("rr-500", s500.URL(), `"priority":1,"cooldown":{"min_requests":1,"duration":"1m"}`),
		provider("rr-echo", echo.URL(), `"priority":2`)))

	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Close(websocket.StatusNormalClosure, "")
	testgw.Eventually(t, 5*time.Second, "the cooldown webhook", func() bool { return rv.hits.Load() >= 1 })
	if p := opAction(t, g, "rr-500", "reset"); !p.Healthy {
		t.Fatalf("after reset %+v", p)
	}
	testgw.Eventually(t, 5*time.Second, "the recovered webhook", func() bool { return rv.hits.Load() >= 2 })
	opAction(t, g, "rr-500", "reset")  // healthy already: no event
	opAction(t, g, "rr-echo", "reset") // never cooled down: no event
	time.Sleep(300 * time.Millisecond) // room for an unwanted delivery to show up
	bodies, _ := rv.got()
	var got []string
	for _, b := range bodies {
		var env opEnvelope
		if err := json.Unmarshal(b, &env); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %v", env.Event, env.Data["provider"]))
	}
	if want := "browser_failover.cooldown rr-500,browser_failover.recovered rr-500"; strings.Join(got, ",") != want {
		t.Fatalf("deliveries %q, want %q", got, want)
	}
}

// TestWebhookHangDoesNotSlowClients: a receiver that never answers does
// not delay connects.
func TestWebhookHangDoesNotSlowClients(t *testing.T) {
	release := make(chan struct{})
	rv := newOpReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(10 * time.Second):
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer rv.Close()
	defer close(release)
	s500 := fakes.Status("hg-500", nil, 500, nil, "")
	defer s500.Close()
	echo := fakes.Echo("hg-echo", nil)
	defer echo.Close()
	hook := fmt.Sprintf(`"webhooks":[{"url":%q,"secret":"k"}]`, rv.URL)
	g := testgw.Start(t, handler(`"queue":{"size":0},`+hook,
		provider("hg-500", s500.URL(), `"priority":1,"cooldown":{"min_requests":1,"duration":"1m"}`),
		provider("hg-echo", echo.URL(), `"priority":2`)))

	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Close(websocket.StatusNormalClosure, "")
	testgw.Eventually(t, 5*time.Second, "the receiver to hang on the cooldown event", func() bool { return rv.hits.Load() >= 1 })
	for i := range 5 {
		start := time.Now()
		c, _, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatal(err)
		}
		echoOnce(t, c, []byte("x"))
		c.Close(websocket.StatusNormalClosure, "")
		// The receiver hangs until the test ends: a connect waiting on
		// it would never come back.
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("connect %d took %v while the webhook hangs", i, d)
		}
	}
}

// TestNoSecretLeaks: credentials in provider URLs, header_up values and
// webhook URLs and secrets reach none of status, metrics, events, webhook
// bodies or logs, after failures, cooldowns, sessions and rejections.
func TestNoSecretLeaks(t *testing.T) {
	secrets := []string{"uSeRsEcReT7", "qUeRySeCrEt7", "hEaDeRsEcReT7", "hOoKsEcReT7", "hOoKqUeRy7", "hOoKuSeR7"}
	rv := newOpReceiver(t, nil)
	defer rv.Close()
	dead := newOpReceiver(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(400) })
	defer dead.Close()
	refused := fakes.Refused("lk-refused")
	s500 := fakes.Status("lk-500", nil, 500, nil, "")
	defer s500.Close()
	echo := fakes.Echo("lk-echo", nil)
	defer echo.Close()
	hookURL := strings.Replace(rv.URL, "http://", "http://hOoKuSeR7:pw@", 1) + "/hook?key=hOoKqUeRy7&x=1"
	deadURL := strings.Replace(dead.URL, "http://", "http://u:hOoKuSeR7@", 1) + "/x?key=hOoKqUeRy7"
	hooks := fmt.Sprintf(`"webhooks":[{"url":%q,"secret":"hOoKsEcReT7"},{"url":%q,"secret":"hOoKsEcReT7","events":["browser_failover.rejected"]}]`, hookURL, deadURL)
	cool := `"cooldown":{"min_requests":1,"duration":"1m"}`
	g := testgw.Start(t, handler(`"queue":{"size":0},`+hooks,
		provider("lk-refused", "ws://user:uSeRsEcReT7@"+refused.Addr+"/?apiKey=qUeRySeCrEt7", `"priority":1,`+cool),
		provider("lk-500", "ws://"+s500.Addr+"/p?token=qUeRySeCrEt7", `"priority":2,`+cool+`,"headers_up":[{"op":"set","field":"X-Api-Key","value":"hEaDeRsEcReT7"}]`),
		provider("lk-echo", "ws://bob:uSeRsEcReT7@"+echo.Addr+"/?key=qUeRySeCrEt7", `"priority":3,"max_concurrent":1,"headers_up":[{"op":"set","field":"Authorization","value":"Bearer hEaDeRsEcReT7"}]`)))

	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	echoOnce(t, c, []byte("x"))
	reject := func() {
		resp, err := http.DefaultClient.Do(upgradeRequest(t, g.HTTP("/?token=client")))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 {
			t.Fatalf("got %d", resp.StatusCode)
		}
		for _, s := range secrets {
			if bytes.Contains(body, []byte(s)) {
				t.Fatalf("503 body holds %s", s)
			}
		}
	}
	reject()
	opAction(t, g, "lk-500", "reset")
	reject() // lk-500 fails again and cools down again
	c.Close(websocket.StatusNormalClosure, "")
	testgw.Eventually(t, 5*time.Second, "webhook deliveries", func() bool { return rv.hits.Load() >= 5 }) // 3 cooldowns, 2 rejections
	testgw.Eventually(t, 5*time.Second, "the dead webhook's failure log", func() bool { return len(g.LogEntries("webhook delivery failed")) >= 2 })
	testgw.Eventually(t, 5*time.Second, "session end log", func() bool { return len(g.LogEntries("session ended")) >= 1 })

	_, statusBody := opStatus(t, g)
	status := string(statusBody)
	_, metrics := opScrape(t, g)
	bodies, headers := rv.got()
	var hooked bytes.Buffer
	kinds := map[string]int{}
	for i, b := range bodies {
		hooked.Write(b)
		hooked.WriteString(headers[i].Get("X-Browser-Failover-Signature"))
		var env opEnvelope
		json.Unmarshal(b, &env)
		kinds[env.Event]++
	}
	if kinds["browser_failover.cooldown"] < 3 || kinds["browser_failover.rejected"] < 2 {
		t.Fatalf("events %v", kinds)
	}
	deadBodies, _ := dead.got()
	for _, b := range deadBodies {
		hooked.Write(b)
	}
	logs := g.Logs()
	if !strings.Contains(status, "REDACTED@") || !strings.Contains(status, "apiKey=REDACTED") {
		t.Fatalf("status URLs not redacted: %s", status)
	}
	for _, w := range g.LogEntries("webhook delivery failed") {
		if s, _ := w["webhook"].(string); !strings.Contains(s, "REDACTED@") || !strings.Contains(s, "key=REDACTED") {
			t.Fatalf("webhook shown as %q", s)
		}
	}
	for where, text := range map[string]string{"status": status, "metrics": metrics, "webhook bodies": hooked.String(), "logs": logs} {
		for _, s := range secrets {
			if strings.Contains(text, s) {
				i := strings.Index(text, s)
				t.Errorf("%s holds %s: …%s…", where, s, text[max(0, i-200):min(len(text), i+100)])
			}
		}
	}
}

// opCapture is an events handler module for tests: it records every event
// it is given.
type opCapture struct{}

var (
	opCapturedMu sync.Mutex
	opCaptured   []caddy.Event
)

func init() { caddy.RegisterModule(opCapture{}) }

func (opCapture) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "events.handlers.op_capture", New: func() caddy.Module { return new(opCapture) }}
}

func (opCapture) Handle(_ context.Context, e caddy.Event) error {
	opCapturedMu.Lock()
	opCaptured = append(opCaptured, e)
	opCapturedMu.Unlock()
	return nil
}

func opEvents(prefix string) []caddy.Event {
	opCapturedMu.Lock()
	defer opCapturedMu.Unlock()
	var out []caddy.Event
	for _, e := range opCaptured {
		if p, _ := e.Data["provider"].(string); p == "" || strings.HasPrefix(p, prefix) {
			out = append(out, e)
		}
	}
	return out
}

// TestEventsApp: cooldown, recovered and rejected go through Caddy's events
// app, from the browser_failover handler, with their data.
func TestEventsApp(t *testing.T) {
	var n atomic.Int64
	// ev-flaky answers 500 once, then serves.
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.WriteHeader(500)
			return
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		fakes.EchoMessages(c)
	}))
	defer flaky.Close()
	echo := fakes.Echo("ev-echo", nil)
	defer echo.Close()
	hjson := handler(`"queue":{"size":0}`,
		provider("ev-flaky", "ws"+strings.TrimPrefix(flaky.URL, "http")+"/", `"priority":1,"max_concurrent":1,"cooldown":{"min_requests":1,"duration":"300ms"}`),
		provider("ev-echo", echo.URL(), `"priority":2,"max_concurrent":1`))
	g := testgw.Start(t, hjson)
	var cfg map[string]any
	if err := json.Unmarshal(g.Config(hjson), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["apps"].(map[string]any)["events"] = map[string]any{"subscriptions": []any{map[string]any{
		"events":   []string{"browser_failover.cooldown", "browser_failover.recovered", "browser_failover.rejected"},
		"handlers": []any{map[string]any{"handler": "op_capture"}},
	}}}
	b, _ := json.Marshal(cfg)
	if err := g.Load(b); err != nil {
		t.Fatal(err)
	}
	opCapturedMu.Lock()
	opCaptured = nil
	opCapturedMu.Unlock()

	c1, _, err := dial(t, g.WS("/"), nil) // ev-flaky 500: cooldown; session on ev-echo
	if err != nil {
		t.Fatal(err)
	}
	defer c1.CloseNow()
	time.Sleep(400 * time.Millisecond)    // the cooldown ends
	c2, _, err := dial(t, g.WS("/"), nil) // the trial succeeds: recovered
	if err != nil {
		t.Fatal(err)
	}
	defer c2.CloseNow()
	resp, err := http.DefaultClient.Do(upgradeRequest(t, g.HTTP("/"))) // both full: rejected
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Fatalf("third client got %d", resp.StatusCode)
	}
	testgw.Eventually(t, 5*time.Second, "three events", func() bool { return len(opEvents("ev-")) >= 3 })
	evs := opEvents("ev-")
	var names []string
	for _, e := range evs {
		names = append(names, e.Name())
		if e.Origin() == nil || e.Origin().CaddyModule().ID != "http.handlers.browser_failover" {
			t.Errorf("event %s from %v", e.Name(), e.Origin())
		}
	}
	if strings.Join(names, ",") != "browser_failover.cooldown,browser_failover.recovered,browser_failover.rejected" {
		t.Fatalf("events %v", names)
	}
	if d := evs[0].Data; d["provider"] != "ev-flaky" || d["reason"] != "status_500" || d["until"] == "" {
		t.Fatalf("cooldown data %v", d)
	}
	if d := evs[1].Data; d["provider"] != "ev-flaky" {
		t.Fatalf("recovered data %v", d)
	}
	if d := evs[2].Data; d["status"] != 503 || d["reason"] != "no_provider" || d["attempts"] != 2 {
		t.Fatalf("rejected data %v", d)
	}
}

// TestWebhookConfig: the Caddyfile webhook option and its checks (JSON too).
func TestWebhookConfig(t *testing.T) {
	out, err := adapt(t, `:8080
browser_failover {
	provider a ws://h:1
	webhook https://hooks.example.com/in?token={env.HOOK_TOKEN} {
		events cooldown browser_failover.rejected
		secret {env.HOOK_SECRET}
	}
	webhook http://127.0.0.1:9000/all
}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"webhooks":[{"events":["cooldown","browser_failover.rejected"],"secret":"{env.HOOK_SECRET}","url":"https://hooks.example.com/in?token={env.HOOK_TOKEN}"},{"url":"http://127.0.0.1:9000/all"}]`,
	} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("adapted %s\nwant %s", out, want)
		}
	}
	// line is the line of the block (the site address is line 1).
	for _, tc := range []struct {
		body, want string
		line       int
	}{
		{"browser_failover {\n provider a ws://h:1\n webhook ftp://h/x\n}", `webhook URL scheme "ftp" is not http or https`, 4},
		{"browser_failover {\n provider a ws://h:1\n webhook http://h/x {\n  events exploded\n }\n}", `webhook: unknown event "exploded"`, 0},
		{"browser_failover {\n provider a ws://h:1\n webhook http://h/x {\n  colour blue\n }\n}", `webhook: unknown option "colour"`, 5},
		{"browser_failover {\n provider a ws://h:1\n webhook\n}", "webhook needs a URL", 4},
		{"browser_failover {\n provider a ws://h:1\n webhook http://h/x {\n  events\n }\n}", "needs at least one event name", 5},
		{"browser_failover {\n provider a ws://h:1\n webhook http://h/x?token=zz9 {\n  secret\n }\n}", "secret needs a value", 5},
	} {
		_, err := adapt(t, ":8080\n"+tc.body)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "zz9") {
			t.Errorf("%q: error %v, want %q", tc.body, err, tc.want)
			continue
		}
		if tc.line > 0 && !strings.HasSuffix(err.Error(), "at Caddyfile:"+strconv.Itoa(tc.line)) {
			t.Errorf("%q: error %v does not name line %d", tc.body, err, tc.line)
		}
	}
	h := browserfailover.Handler{Handler: config.Handler{
		Providers: []*browserfailover.ProviderConfig{{Config: upstreams.Config{Name: "a", URL: "ws://h:1"}}},
		Webhooks:  []*observe.WebhookConfig{{URL: "gopher://h/?secret=zz"}, {URL: "http://h/", Events: []string{"nope"}}},
	}}
	err = h.Validate()
	if err == nil || !strings.Contains(err.Error(), `webhook 1: webhook URL scheme "gopher"`) || !strings.Contains(err.Error(), `webhook 2: webhook: unknown event "nope"`) || strings.Contains(err.Error(), "zz") {
		t.Fatalf("Validate: %v", err)
	}
}
