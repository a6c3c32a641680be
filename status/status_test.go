package status

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/queue"
)

// serve runs the admin route for path and returns the recorder and the
// handler's error (the admin server turns an APIError into its status).
func serve(t *testing.T, reg *pool.Registry, method, path string) (*httptest.ResponseRecorder, error) {
	t.Helper()
	var h caddy.AdminHandler
	for _, r := range (Admin{reg: reg}).Routes() {
		// Like the admin server's mux: exact patterns, and patterns ending
		// in "/" for their subtree.
		if r.Pattern == path || (strings.HasSuffix(r.Pattern, "/") && len(path) > len(r.Pattern) && strings.HasPrefix(path, r.Pattern)) {
			h = r.Handler
		}
	}
	if h == nil {
		t.Fatalf("no route for %s", path)
	}
	rec := httptest.NewRecorder()
	return rec, h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
}

func apiStatus(err error) int {
	var ae caddy.APIError
	if errors.As(err, &ae) {
		return ae.HTTPStatus
	}
	return 0
}

// stoppedClock is a clock whose time stands still; its timers are real.
type stoppedClock struct{ now time.Time }

func (c stoppedClock) Now() time.Time { return c.now }
func (stoppedClock) AfterFunc(d time.Duration, f func()) queue.Timer {
	return time.AfterFunc(d, f)
}

func TestAdminRoutes(t *testing.T) {
	now := time.Now()
	reg := pool.NewRegistry(stoppedClock{now})

	cfg := cooldown.Config{Duration: caddy.Duration(time.Minute), MinRequests: 1}
	p, err := reg.Claim("status-unit-a", "ws://u:pw@h/?k=secret", "ws://REDACTED@h/?k=REDACTED", t, cfg, false, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.ReleaseClaim("status-unit-a", t)

	// One failure trips the cooldown (min_requests 1).
	permit, _ := p.Health.Acquire()
	p.Stats.SetLastError("status_500")
	if ch := p.Health.Done(permit, cooldown.Failure, 0); ch != cooldown.CooledDown {
		t.Fatalf("change %v", ch)
	}

	rec, err := serve(t, reg, http.MethodGet, StatusPath)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Providers []Provider `json:"providers"`
		Queues    []Queue    `json:"queues"`
		Clients   []Client   `json:"clients"`
		Parked    Parked     `json:"parked"`
	}
	dec := json.NewDecoder(bytes.NewReader(rec.Body.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		t.Fatalf("%s: %v", rec.Body, err)
	}
	var got *Provider
	for i := range st.Providers {
		if st.Providers[i].Name == "status-unit-a" {
			got = &st.Providers[i]
		}
	}
	if got == nil {
		t.Fatalf("provider missing: %s", rec.Body)
	}
	if got.Healthy || got.CooldownUntil == nil || !got.CooldownUntil.Equal(now.Add(time.Minute)) ||
		got.Attempts != 1 || got.Failures != 1 || got.LastError != "status_500" ||
		got.MaxConcurrent != 4 || got.URL != "ws://REDACTED@h/?k=REDACTED" {
		t.Fatalf("status %+v", *got)
	}

	rec, err = serve(t, reg, http.MethodPost, ProvidersPath+"status-unit-a/drain")
	if err != nil || !bytes.Contains(rec.Body.Bytes(), []byte(`"draining":true`)) || !p.Draining() {
		t.Fatalf("drain: %v %s", err, rec.Body)
	}
	rec, err = serve(t, reg, http.MethodPost, ProvidersPath+"status-unit-a/undrain")
	if err != nil || p.Draining() {
		t.Fatalf("undrain: %v %s", err, rec.Body)
	}
	rec, err = serve(t, reg, http.MethodPost, ProvidersPath+"status-unit-a/reset")
	if err != nil {
		t.Fatal(err)
	}
	var one Provider
	dec = json.NewDecoder(bytes.NewReader(rec.Body.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&one); err != nil {
		t.Fatal(err)
	}
	if !one.Healthy || one.CooldownUntil != nil || one.Attempts != 0 || one.Failures != 0 || one.LastError != "" {
		t.Fatalf("after reset %+v", one)
	}
	if !bytes.Contains(rec.Body.Bytes(), []byte(`"cooldown_until":null`)) {
		t.Fatalf("cooldown_until must be null: %s", rec.Body)
	}

	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{http.MethodPost, ProvidersPath + "nope/drain", 404},
		{http.MethodPost, ProvidersPath + "status-unit-a/explode", 404},
		{http.MethodPost, ProvidersPath + "status-unit-a", 404},
		{http.MethodGet, ProvidersPath + "status-unit-a/drain", 405},
		{http.MethodPost, StatusPath, 405},
	} {
		_, err := serve(t, reg, tc.method, tc.path)
		if got := apiStatus(err); got != tc.status {
			t.Errorf("%s %s: %d (%v), want %d", tc.method, tc.path, got, err, tc.status)
		}
	}
}

// TestStatusClients: client_limit keys show hashed, with their live and
// waiting counts, and the raw key value appears nowhere in the answer.
func TestStatusClients(t *testing.T) {
	reg := pool.NewRegistry(nil)
	const secret = "sk-live-4f9a1c0ffee"
	k := pool.QuotaKey{Template: "{http.request.header.X-Api-Key}", Value: secret}
	a, b, c := reg.NewTicket(), reg.NewTicket(), reg.NewTicket()
	if !a.TakeShare(k, 2) || !b.TakeShare(k, 2) {
		t.Fatal("quota refused below its limit")
	}
	if c.TakeShare(k, 2) {
		t.Fatal("quota granted over its limit")
	}
	reg.Quotas.AddWaiting(k, 1)
	rec, err := serve(t, reg, http.MethodGet, StatusPath)
	if err != nil {
		t.Fatal(err)
	}
	body := rec.Body.String()
	if strings.Contains(body, secret) || strings.Contains(body, "4f9a1c") {
		t.Fatalf("raw key in status: %s", body)
	}
	var st struct {
		Clients []Client `json:"clients"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	want := Client{Key: reg.Hashes.ShownKey(secret), Active: 2, Waiting: 1}
	if len(st.Clients) != 1 || st.Clients[0] != want {
		t.Fatalf("clients %+v, want [%+v]", st.Clients, want)
	}
	reg.Quotas.AddWaiting(k, -1)
	a.Release()
	b.Release()
	a.Release() // twice: ignored
	if n := reg.Quotas.Active(k); n != 0 {
		t.Fatalf("active %d after release", n)
	}
	if c := reg.Quotas.Counts(); len(c) != 0 {
		t.Fatalf("clients %+v after release", c)
	}
}

// TestClusterJSON: the two forms of a provider's "cluster" object, built
// from its cluster-wide state.
func TestClusterJSON(t *testing.T) {
	until := time.Date(2030, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))
	share := func(active int, nodes map[string]int, hold cluster.Hold) cluster.ProviderState {
		return cluster.ProviderState{Node: "n1", Up: true, Share: cluster.Share{Active: active, Nodes: nodes, Hold: hold}}
	}
	for _, tc := range []struct {
		st   cluster.ProviderState
		max  int64
		want string
	}{
		{share(0, nil, cluster.Hold{}), 0, `{"node":"n1","active":0,"nodes":{},"cooldown_until":null,"over_limit":0}`},
		{share(3, map[string]int{"n1": 1, "n2": 2}, cluster.Hold{CooldownUntil: until, Streak: 2}), 0, `{"node":"n1","active":3,"nodes":{"n1":1,"n2":2},"cooldown_until":"2030-01-02T02:04:05Z","over_limit":0}`},
		// A skip ending after the cooldown is the end shown.
		{share(1, map[string]int{"n2": 1}, cluster.Hold{CooldownUntil: until.Add(-time.Minute), SkipUntil: until}), 4, `{"node":"n1","active":1,"nodes":{"n2":1},"cooldown_until":"2030-01-02T02:04:05Z","over_limit":0}`},
		{share(7, map[string]int{"n1": 7}, cluster.Hold{}), 4, `{"node":"n1","active":7,"nodes":{"n1":7},"cooldown_until":null,"over_limit":3}`},
		{cluster.ProviderState{Node: "n1"}, 4, `{"error":"shared state unavailable","node":"n1"}`},
	} {
		b, err := json.Marshal(clusterObject(tc.st, tc.max))
		if err != nil || string(b) != tc.want {
			t.Errorf("%+v max %d: %s %v, want %s", tc.st, tc.max, b, err, tc.want)
		}
	}
}

// fakeView is a pool.ClusterView answering from fixed figures, or hanging
// until its context ends when hang is set.
type fakeView struct {
	active map[string]int
	up     bool
	hang   bool
	calls  atomic.Int32
}

func (v *fakeView) ClusterStates(ctx context.Context, providers []string) (map[string]cluster.ProviderState, bool) {
	v.calls.Add(1)
	out := map[string]cluster.ProviderState{}
	if v.hang {
		<-ctx.Done()
	}
	for _, p := range providers {
		if !v.up || v.hang {
			out[p] = cluster.ProviderState{Node: "n1"}
		} else {
			out[p] = cluster.ProviderState{Node: "n1", Up: true, Share: cluster.Share{Active: v.active[p], Nodes: map[string]int{"n1": v.active[p]}}}
		}
	}
	return out, v.up && !v.hang
}

func (v *fakeView) ClusterActive(p string) (int, bool) { return v.active[p], v.up }

func (v *fakeView) ResetShared(context.Context, string) {}

func (v *fakeView) Endpoint() cluster.Endpoint {
	return cluster.Endpoint{Mode: cluster.ModeStandalone, Address: "127.0.0.1:6379"}
}

// TestStatusCluster: the providers sharing one store are read in one call;
// over_limit is the live sessions above max_concurrent over every node;
// shared_state_up tells whether the store answered; and a store that does
// not answer holds the status up for a bounded time only.
func TestStatusCluster(t *testing.T) {
	reg := pool.NewRegistry(nil)
	cfg := cooldown.Config{}
	a, err := reg.Claim("status-cl-a", "ws://h/a", "ws://h/a", t, cfg, false, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.ReleaseClaim("status-cl-a", t)
	b, err := reg.Claim("status-cl-b", "ws://h/b", "ws://h/b", t, cfg, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.ReleaseClaim("status-cl-b", t)
	v := &fakeView{active: map[string]int{"status-cl-a": 7, "status-cl-b": 9}, up: true}
	a.SetCluster(v)
	b.SetCluster(v)
	defer a.SetCluster(nil)
	defer b.SetCluster(nil)

	st := Snapshot(reg)
	if v.calls.Load() != 1 {
		t.Fatalf("%d calls to the store for two providers, want 1", v.calls.Load())
	}
	over := map[string]int{}
	for _, p := range st.Providers {
		if c, ok := p.Cluster.(Cluster); ok {
			over[p.Name] = c.OverLimit
		}
	}
	if over["status-cl-a"] != 3 || over["status-cl-b"] != 0 {
		t.Fatalf("over_limit %v, want a 3 (7 live, max 4) and b 0 (unlimited)", over)
	}
	if st.SharedStateUp == nil || !*st.SharedStateUp {
		t.Fatalf("shared_state_up %v", st.SharedStateUp)
	}
	b2, _ := json.Marshal(st)
	if !bytes.Contains(b2, []byte(`"over_limit":3`)) || !bytes.Contains(b2, []byte(`"shared_state_up":true`)) {
		t.Fatalf("status JSON %s", b2)
	}

	v.up = false
	if st := Snapshot(reg); st.SharedStateUp == nil || *st.SharedStateUp {
		t.Fatalf("shared_state_up %v while down", st.SharedStateUp)
	}

	// A store that hangs: the status still answers, with the local
	// figures, once the read's bound has passed.
	v.hang = true
	start := time.Now()
	st = Snapshot(reg)
	if took := time.Since(start); took < clusterReadTimeout-10*time.Millisecond || took > 20*clusterReadTimeout {
		t.Fatalf("status with a hanging store took %v (bound %v)", took, clusterReadTimeout)
	}
	if *st.SharedStateUp {
		t.Fatal("shared_state_up true with a hanging store")
	}
	for _, p := range st.Providers {
		if (p.Name == "status-cl-a" || p.Name == "status-cl-b") && p.MaxConcurrent != map[string]int64{"status-cl-a": 4, "status-cl-b": 0}[p.Name] {
			t.Fatalf("local figures missing: %+v", p)
		}
	}

	// Without shared state the field is absent.
	a.SetCluster(nil)
	b.SetCluster(nil)
	b2, _ = json.Marshal(Snapshot(reg))
	if bytes.Contains(b2, []byte("shared_state_up")) {
		t.Fatalf("shared_state_up without shared state: %s", b2)
	}
}
