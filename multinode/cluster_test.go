package multinode_test

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
)

// Metric names.
const (
	upMetric     = "caddy_browser_failover_shared_state_up"
	errorsMetric = "caddy_browser_failover_shared_state_errors_total"
)

// maxConcurrent is the echo provider's max_concurrent on every node.
const maxConcurrent = 5

// echoJSON is the echo provider's object.
func echoJSON(p *echoProvider, priority int) map[string]any {
	return map[string]any{"name": "echo", "url": p.URL(), "priority": priority, "max_concurrent": maxConcurrent}
}

// holdSessions opens n sessions through g and closes them when the test
// ends.
func holdSessions(t *testing.T, g *node, n int) []*websocket.Conn {
	t.Helper()
	var conns []*websocket.Conn
	for i := range n {
		ctx, cancel := withTimeout(15 * time.Second)
		c, err := openSession(ctx, g.WS())
		cancel()
		if err != nil {
			t.Fatalf("session %d through %s: %v", i+1, g.Name, err)
		}
		t.Cleanup(func() { c.CloseNow() })
		conns = append(conns, c)
	}
	return conns
}

// TestClusterMaxConcurrentExact: 30 clients over three nodes sharing one
// provider of max_concurrent 5 never have more than 5 sessions open at
// the provider, and all of them are served through the queues.
func TestClusterMaxConcurrentExact(t *testing.T) {
	r := testredis.Start(t)
	echo := startEcho(t)
	nodes := startCluster(t, r, clusterConfig{providers: []map[string]any{echoJSON(echo, 1)}, queueSize: 50}, nil)

	const clients = 30
	var served atomic.Int64
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		g := nodes[i%len(nodes)]
		wg.Go(func() {
			ctx, cancel := withTimeout(45 * time.Second)
			defer cancel()
			c, err := openSession(ctx, g.WS())
			if err != nil {
				errs <- fmt.Errorf("client %d through %s: %w", i, g.Name, err)
				return
			}
			time.Sleep(300 * time.Millisecond) // hold the session
			closeSession(c)
			served.Add(1)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("served %d/%d, provider peak %d open sessions, %d upgrade requests", served.Load(), clients, echo.Peak(), echo.Hits.Load())
	if got := echo.Peak(); got > maxConcurrent {
		t.Errorf("the provider had %d sessions open at once; max_concurrent is %d across the cluster", got, maxConcurrent)
	}
	if got := served.Load(); got != clients {
		t.Fatalf("%d of %d clients served", got, clients)
	}
	for _, g := range nodes {
		clusterZero := clusterIs(g, "echo", 0, nil)
		eventually(t, 10*time.Second, g.Name+": cluster and local active 0", func() (bool, string) {
			ok, raw := clusterZero()
			if !ok {
				return false, raw
			}
			p, raw, err := g.Provider("echo")
			return err == nil && p.Active == 0, raw
		})
	}
}

// TestClusterDeadNodeFreesSlots: the slots of a node killed with SIGKILL
// come back to the other nodes within about one lease_ttl.
func TestClusterDeadNodeFreesSlots(t *testing.T) {
	r := testredis.Start(t)
	echo := startEcho(t)
	// gw-2 has no queue: a client it cannot serve gets 503 at once.
	nodes := startCluster(t, r, clusterConfig{providers: []map[string]any{echoJSON(echo, 1)}, queueSize: 50},
		func(name string, h map[string]any) {
			if name == "gw-2" {
				h["queue"] = map[string]any{"size": 0}
			}
		})
	gw1, gw2 := nodes[0], nodes[1]

	holdSessions(t, gw1, maxConcurrent)
	for _, g := range nodes {
		eventually(t, 10*time.Second, g.Name+": gw-1 holds every slot", clusterIs(g, "echo", maxConcurrent, map[string]int{"gw-1": maxConcurrent}))
	}
	hits := echo.Hits.Load()
	err := serveOnce(gw2.WS(), 10*time.Second)
	if statusOf(err) != http.StatusServiceUnavailable {
		t.Fatalf("a client through gw-2 while gw-1 holds every slot: want 503, got %v", err)
	}
	t.Logf("gw-2 while full: %v", err)
	if got := echo.Hits.Load(); got != hits {
		t.Errorf("gw-2 reached the provider (%d upgrade requests, %d before) while gw-1 held every slot", got, hits)
	}

	gw1.Kill()
	killed := time.Now()
	var held *websocket.Conn
	eventually(t, 3*leaseTTL+5*time.Second, "a session through gw-2 after gw-1 died", func() (bool, string) {
		ctx, cancel := withTimeout(5 * time.Second)
		defer cancel()
		c, err := openSession(ctx, gw2.WS())
		if err != nil {
			return false, err.Error()
		}
		held = c
		return true, ""
	})
	t.Cleanup(func() { held.CloseNow() })
	t.Logf("gw-2 served again %v after gw-1 was killed (lease_ttl %v)", time.Since(killed).Round(time.Millisecond), leaseTTL)
	eventually(t, 10*time.Second, "gw-2: gw-1 holds nothing", clusterIs(gw2, "echo", 1, map[string]int{"gw-2": 1}))
	closeSession(held)
	eventually(t, 10*time.Second, "gw-2: cluster active 0", clusterIs(gw2, "echo", 0, nil))
	if got := echo.Peak(); got > maxConcurrent {
		t.Errorf("the provider had %d sessions open at once; max_concurrent is %d", got, maxConcurrent)
	}
}

// TestClusterSharedCooldown: a cooldown started on gw-1 is honoured by
// gw-2 and gw-3, which never try the provider while it lasts.
func TestClusterSharedCooldown(t *testing.T) {
	r := testredis.Start(t)
	echo := startEcho(t)
	broken := fakes.Status("broken", nil, http.StatusInternalServerError, nil, "provider exploded")
	t.Cleanup(broken.Close)
	providers := []map[string]any{
		{
			"name": "broken", "url": broken.URL(), "priority": 1,
			"cooldown": map[string]any{"min_requests": 1, "failure_threshold": 0.5, "duration": "30s"},
		},
		echoJSON(echo, 2),
	}
	nodes := startCluster(t, r, clusterConfig{providers: providers, queueSize: 50}, nil)
	gw1 := nodes[0]

	if err := serveOnce(gw1.WS(), 15*time.Second); err != nil {
		t.Fatalf("client through gw-1: %v", err)
	}
	if got := broken.Hits.Load(); got != 1 {
		t.Fatalf("the broken provider got %d requests from one client, want 1", got)
	}
	for _, g := range nodes {
		// In Redis (the cluster object), and heard by the node itself: a
		// connect there asks Redis for nothing of an unlimited provider,
		// so the cooldown reaches it as news.
		eventually(t, 10*time.Second, g.Name+": broken in shared cooldown", func() (bool, string) {
			p, raw, err := g.Provider("broken")
			if err != nil {
				return false, err.Error()
			}
			c := p.Cluster
			if c == nil || c.Error != "" || c.CooldownUntil == nil || !c.CooldownUntil.After(time.Now()) || p.CooldownUntil == nil {
				return false, raw
			}
			return true, raw
		})
	}

	for _, g := range nodes[1:] {
		for i := range 3 {
			if err := serveOnce(g.WS(), 15*time.Second); err != nil {
				t.Fatalf("client %d through %s: %v", i+1, g.Name, err)
			}
		}
	}
	if got := broken.Hits.Load(); got != 1 {
		t.Errorf("the broken provider got %d requests in all, want only gw-1's first one: gw-2 and gw-3 did not honour the shared cooldown", got)
	}
	// Each session through gw-2 and gw-3 passed over broken as cooling
	// down.
	for _, g := range nodes[1:] {
		eventually(t, 10*time.Second, g.Name+": 3 sessions logged", func() (bool, string) {
			ended := g.LogEntries("session ended")
			return len(ended) >= 3, fmt.Sprintf("%d session ended entries", len(ended))
		})
		for _, e := range g.LogEntries("session ended") {
			if !skippedAs(e, "broken", "cooldown") {
				t.Errorf("%s: session ended without broken skipped as cooldown: %v", g.Name, e["attempts"])
			}
		}
	}
}

// skippedAs reports whether a log entry's attempts hold provider with
// outcome word.
func skippedAs(entry map[string]any, provider, word string) bool {
	list, _ := entry["attempts"].([]any)
	for _, a := range list {
		m, _ := a.(map[string]any)
		if m["provider"] == provider && m["outcome"] == word {
			return true
		}
	}
	return false
}

// TestClusterRedisDown: the nodes go on without Redis (on_unavailable
// local) or turn clients away (reject), never hang, show the outage in
// status and metrics, and take the shared state up again when Redis is
// back.
func TestClusterRedisDown(t *testing.T) {
	t.Run("local", testRedisDownLocal)
	t.Run("reject", testRedisDownReject)
}

// clientsThrough runs per clients through every node at once, each bounded
// by d, and returns their errors.
func clientsThrough(nodes []*node, per int, d time.Duration) []error {
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, g := range nodes {
		for i := range per {
			wg.Go(func() {
				if err := serveOnce(g.WS(), d); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("client %d through %s: %w", i+1, g.Name, err))
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return errs
}

// sharedStateError is an eventually condition: provider's cluster object
// on g shows the outage.
func sharedStateError(g *node, provider string) func() (bool, string) {
	return func() (bool, string) {
		p, raw, err := g.Provider(provider)
		if err != nil {
			return false, err.Error()
		}
		return p.Cluster != nil && p.Cluster.Error == "shared state unavailable", raw
	}
}

func testRedisDownLocal(t *testing.T) {
	r := testredis.Start(t)
	echo := startEcho(t)
	nodes := startCluster(t, r, clusterConfig{providers: []map[string]any{echoJSON(echo, 1)}, queueSize: 50, onUnavailable: "local"}, nil)
	gw1, gw2 := nodes[0], nodes[1]

	// Sessions that live through the outage: 2 on gw-1, 1 on gw-2.
	held := append(holdSessions(t, gw1, 2), holdSessions(t, gw2, 1)...)
	want := map[string]int{"gw-1": 2, "gw-2": 1}
	for _, g := range nodes {
		eventually(t, 10*time.Second, g.Name+": 3 leases before the outage", clusterIs(g, "echo", 3, want))
		eventually(t, 10*time.Second, g.Name+": shared state up", metricIs(g, upMetric, 1))
	}

	r.Stop()
	// New clients are served on per-node limits, each within its bound.
	for _, err := range clientsThrough(nodes, 2, 10*time.Second) {
		t.Errorf("while Redis is down (on_unavailable local): %v", err)
	}
	for _, g := range nodes {
		eventually(t, 10*time.Second, g.Name+": status shows the outage", sharedStateError(g, "echo"))
		eventually(t, 10*time.Second, g.Name+": shared_state_up 0", metricIs(g, upMetric, 0))
		eventually(t, 10*time.Second, g.Name+": shared_state_errors_total counted", func() (bool, string) {
			m, err := g.Metric(errorsMetric)
			if err != nil {
				return false, err.Error()
			}
			var sum float64
			for _, v := range m {
				sum += v
			}
			return sum > 0, fmt.Sprintf("%s = %v", errorsMetric, m)
		})
		m, _ := g.Metric(errorsMetric)
		t.Logf("%s: %s during the outage: %v", g.Name, errorsMetric, m)
	}
	if got := echo.Open(); got != 3 {
		t.Errorf("the provider has %d sessions open, want the 3 held ones", got)
	}

	// Redis comes back empty on the same port: the live sessions' leases
	// are put back.
	r.Start()
	// Nothing but /metrics is asked until the gauge is back: an idle node
	// must notice by itself (its lease renewals and event subscription
	// talk to Redis), as an operator's scrape would see it.
	eventuallyOrError(t, 10*time.Second, "shared_state_up 1 again on every node, with only /metrics read", onEvery(nodes, func(g *node) func() (bool, string) {
		return metricIs(g, upMetric, 1)
	}))
	for _, g := range nodes {
		eventually(t, 15*time.Second, g.Name+": the 3 held leases counted again", clusterIs(g, "echo", 3, want))
		eventually(t, 10*time.Second, g.Name+": shared_state_up 1", metricIs(g, upMetric, 1))
	}
	for _, c := range held {
		closeSession(c)
	}
	for _, g := range nodes {
		eventually(t, 10*time.Second, g.Name+": cluster active 0", clusterIs(g, "echo", 0, nil))
	}
	if err := serveOnce(gw2.WS(), 10*time.Second); err != nil {
		t.Errorf("after Redis came back: %v", err)
	}
}

func testRedisDownReject(t *testing.T) {
	r := testredis.Start(t)
	echo := startEcho(t)
	nodes := startCluster(t, r, clusterConfig{providers: []map[string]any{echoJSON(echo, 1)}, queueSize: 50, onUnavailable: "reject"}, nil)
	for _, g := range nodes {
		if err := serveOnce(g.WS(), 10*time.Second); err != nil {
			t.Fatalf("before the outage, through %s: %v", g.Name, err)
		}
		eventually(t, 10*time.Second, g.Name+": shared state up", metricIs(g, upMetric, 1))
	}

	r.Stop()
	hits := echo.Hits.Load()
	errs := clientsThrough(nodes, 2, 10*time.Second)
	if len(errs) != 2*len(nodes) {
		t.Errorf("while Redis is down (on_unavailable reject): %d of %d clients failed, want all", len(errs), 2*len(nodes))
	}
	for _, err := range errs {
		if statusOf(err) != http.StatusServiceUnavailable {
			t.Errorf("while Redis is down (on_unavailable reject): want 503, got %v", err)
		}
	}
	if len(errs) > 0 {
		t.Logf("a rejected client: %v", errs[0])
	}
	if got := echo.Hits.Load(); got != hits {
		t.Errorf("the provider got %d upgrade requests while Redis was down with on_unavailable reject", got-hits)
	}
	for _, g := range nodes {
		eventually(t, 10*time.Second, g.Name+": status shows the outage", sharedStateError(g, "echo"))
		eventually(t, 10*time.Second, g.Name+": shared_state_up 0", metricIs(g, upMetric, 0))
	}

	r.Start()
	for _, g := range nodes {
		eventually(t, 15*time.Second, g.Name+": serving again", func() (bool, string) {
			err := serveOnce(g.WS(), 5*time.Second)
			if err != nil {
				return false, err.Error()
			}
			return true, ""
		})
		eventually(t, 15*time.Second, g.Name+": shared state up again", metricIs(g, upMetric, 1))
		eventually(t, 10*time.Second, g.Name+": cluster active 0", clusterIs(g, "echo", 0, nil))
	}
}
