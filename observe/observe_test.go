package observe

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

func TestOutcomeLabel(t *testing.T) {
	for in, want := range map[string]string{
		"ok": "ok", "refused": "refused", "bad_discovery": "bad_discovery", "client_gone": "client_gone",
		"status_500": "status_500", "status_429": "status_429", "status_404": "status_404",
		"status_418": "status_4xx", "status_599": "status_5xx", "status_302": "status_other",
		"status_x": "status_other", "weird": "other", "": "other",
	} {
		if got := OutcomeLabel(in); got != want {
			t.Errorf("OutcomeLabel(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{
		"queue full": ReasonQueueFull, "queue timeout": ReasonQueueTimeout,
		"no provider available": ReasonNoProvider, ReasonRelayed: ReasonRelayed, "?": "other",
	} {
		if got := ReasonWord(in); got != want {
			t.Errorf("ReasonWord(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestWebhookValidate(t *testing.T) {
	good := []WebhookConfig{
		{URL: "https://hooks.example.com/x?token=1"},
		{URL: "http://127.0.0.1:9/x", Events: []string{"cooldown", "browser_failover.rejected"}},
		{URL: "https://{env.HOOK_HOST}/x?key={env.HOOK_KEY}"},
	}
	for _, c := range good {
		c := c
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
	bad := map[string]WebhookConfig{
		"no URL":        {},
		"placeholder":   {URL: "{env.HOOK_URL}"},
		"scheme":        {URL: "ftp://h/x?secret=zz"},
		"no host":       {URL: "http:///x"},
		"unknown event": {URL: "http://h/", Events: []string{"exploded"}},
	}
	for name, c := range bad {
		c := c
		err := c.Validate()
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		if strings.Contains(err.Error(), "zz") {
			t.Errorf("%s: message holds the URL: %v", name, err)
		}
	}
}

// TestMetricsPerValue: one Metrics value registers with every config
// load's metrics registry (twice with the same one is not an error), and
// counts only what was counted in it.
func TestMetricsPerValue(t *testing.T) {
	m, other := NewMetrics(), NewMetrics()
	r1 := prometheus.NewPedanticRegistry()
	if err := Register(r1, m); err != nil {
		t.Fatal(err)
	}
	if err := Register(r1, m); err != nil {
		t.Fatalf("second registration with the same registry: %v", err)
	}
	m.Attempt("unit-reg", upstreams.Outcome{Word: "ok", Kind: upstreams.Success, Elapsed: 5 * time.Millisecond})
	other.Attempt("unit-reg", upstreams.Outcome{Word: "ok", Kind: upstreams.Success})
	m.SharedStateOpened()
	m.SharedStateUp(true)
	// A reload: a new metrics registry gets the same collectors.
	r2 := prometheus.NewPedanticRegistry()
	if err := Register(r2, m); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*prometheus.Registry{r1, r2} {
		mfs, err := r.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			for _, x := range mf.GetMetric() {
				switch {
				case x.GetCounter() != nil:
					got[mf.GetName()] += x.GetCounter().GetValue()
				case x.GetHistogram() != nil:
					got[mf.GetName()] += float64(x.GetHistogram().GetSampleCount())
				case x.GetGauge() != nil:
					got[mf.GetName()] += x.GetGauge().GetValue()
				}
			}
		}
		if got["caddy_browser_failover_attempts_total"] != 1 || got["caddy_browser_failover_handshake_seconds"] != 1 {
			t.Errorf("attempts %v, handshakes %v: want 1 each (the other value's attempt not counted)",
				got["caddy_browser_failover_attempts_total"], got["caddy_browser_failover_handshake_seconds"])
		}
		if v, ok := got["caddy_browser_failover_shared_state_up"]; !ok || v != 1 {
			t.Errorf("shared_state_up %v (shown: %v), want 1 while a store is open", v, ok)
		}
	}
	m.SharedStateClosed()
	mfs, _ := r1.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "caddy_browser_failover_shared_state_up" {
			t.Error("shared_state_up shown with no store open")
		}
	}
	if err := Register(nil, m); err != nil {
		t.Fatal(err)
	}
}

// shortPacing delivers at once, retrying after 10, 20 and 40 ms.
func shortPacing() pacing {
	p := defaultPacing()
	p.backoff = []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond}
	p.timeout = 200 * time.Millisecond
	return p
}

func TestWebhookSignedRetried(t *testing.T) {
	var mu sync.Mutex
	var bodies [][]byte
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if n.Add(1) < 3 {
			w.WriteHeader(503)
			return
		}
		if r.Header.Get(SignatureHeader) != Sign([]byte("k3y"), r.Header.Get(TimestampHeader), body) {
			w.WriteHeader(400)
			return
		}
		mu.Lock()
		bodies = append(bodies, body)
		mu.Unlock()
	}))
	defer srv.Close()
	wh, err := newWebhook(&WebhookConfig{URL: srv.URL + "/h?token=t0k", Secret: "k3y", Events: []string{"recovered"}}, caddy.NewReplacer(), zap.NewNop(), NewMetrics(), shortPacing())
	if err != nil {
		t.Fatal(err)
	}
	if !wh.wants(EventRecovered) || wh.wants(EventCooldown) {
		t.Fatal("event filter")
	}
	wh.start()
	defer wh.close()
	body, _ := encodeEvent(event{name: EventRecovered, at: time.Unix(0, 0), data: map[string]any{"provider": "a"}})
	wh.enqueue(delivery{event: EventRecovered, body: body})
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		got := len(bodies)
		mu.Unlock()
		if got == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not delivered after %d tries", n.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n.Load() != 3 {
		t.Fatalf("%d tries, want 3", n.Load())
	}
	var env struct {
		Event string         `json:"event"`
		Time  string         `json:"time"`
		Data  map[string]any `json:"data"`
	}
	if err := json.Unmarshal(bodies[0], &env); err != nil || env.Event != EventRecovered || env.Data["provider"] != "a" || env.Time != "1970-01-01T00:00:00Z" {
		t.Fatalf("%s %v", bodies[0], err)
	}
}

func TestWebhookFailureLogRedacted(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }))
	defer srv.Close()
	core, logs := observer.New(zap.DebugLevel)
	u := strings.Replace(srv.URL, "http://", "http://user:pAsSwOrD@", 1) + "/h?token=qUeRySeCrEt"
	wh, err := newWebhook(&WebhookConfig{URL: u, Secret: "sIgNsEcReT"}, caddy.NewReplacer(), zap.New(core), NewMetrics(), shortPacing())
	if err != nil {
		t.Fatal(err)
	}
	wh.start()
	defer wh.close()
	wh.enqueue(delivery{event: EventCooldown, body: []byte(`{}`)})
	deadline := time.Now().Add(5 * time.Second)
	for logs.FilterMessage("webhook delivery failed").Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no failure log")
		}
		time.Sleep(5 * time.Millisecond)
	}
	entry := logs.FilterMessage("webhook delivery failed").All()[0]
	if entry.ContextMap()["tries"] != int64(4) {
		t.Fatalf("tries %v", entry.ContextMap())
	}
	for _, e := range logs.All() {
		for k, v := range e.ContextMap() {
			s, _ := v.(string)
			for _, secret := range []string{"pAsSwOrD", "qUeRySeCrEt", "sIgNsEcReT"} {
				if strings.Contains(s, secret) {
					t.Fatalf("log field %s holds a secret: %q", k, s)
				}
			}
		}
	}
	if got := entry.ContextMap()["webhook"]; !strings.Contains(got.(string), "REDACTED@") || !strings.Contains(got.(string), "token=REDACTED") {
		t.Fatalf("shown URL %v", got)
	}
}

func TestWebhookDropsOldestWhenFull(t *testing.T) {
	pace := defaultPacing()
	pace.queue = 3
	wh, err := newWebhook(&WebhookConfig{URL: "http://127.0.0.1:1/"}, caddy.NewReplacer(), zap.NewNop(), NewMetrics(), pace)
	if err != nil {
		t.Fatal(err)
	}
	// Not started: nothing drains the queue.
	for i := 0; i < 5; i++ {
		wh.enqueue(delivery{event: string(rune('a' + i))})
	}
	var got []string
	for len(wh.queue) > 0 {
		got = append(got, (<-wh.queue).event)
	}
	if strings.Join(got, "") != "cde" {
		t.Fatalf("kept %v, want the newest c d e", got)
	}
	wh.close()
}

func TestNilObserver(t *testing.T) {
	var o *Observer
	o.Cooldown("a", time.Now(), "status_500")
	o.Recovered("a")
	o.Rejected(503, "queue full", 2)
	o.Close()
}
