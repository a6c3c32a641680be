package multinode_test

import (
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
)

// Modes of a modalProvider.
const (
	modeEcho = iota // accept, after its delay, and echo
	mode429         // 429 with Retry-After: 2
	mode500         // 500
)

// modalProvider is an echo provider whose answer the test switches: echo
// (after a delay, so attempts overlap), 429 with Retry-After: 2, or 500.
type modalProvider struct {
	*echoProvider
	mode   atomic.Int32
	delay  atomic.Int64 // ns before accepting, in echo mode
	status atomic.Int64 // 429 and 500 answers given
}

// startModal starts a modalProvider on 127.0.0.1 in echo mode.
func startModal(t *testing.T) *modalProvider {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoProvider{Addr: ln.Addr().String(), conns: map[*websocket.Conn]bool{}}
	m := &modalProvider{echoProvider: e}
	e.srv = &http.Server{Handler: m, ReadHeaderTimeout: 10 * time.Second}
	go e.srv.Serve(ln)
	t.Cleanup(e.close)
	return m
}

func (m *modalProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch m.mode.Load() {
	case mode429:
		m.Hits.Add(1)
		m.status.Add(1)
		w.Header().Set("Retry-After", "2")
		http.Error(w, "too many sessions", http.StatusTooManyRequests)
	case mode500:
		m.Hits.Add(1)
		m.status.Add(1)
		http.Error(w, "provider exploded", http.StatusInternalServerError)
	default:
		time.Sleep(time.Duration(m.delay.Load()))
		m.echoProvider.ServeHTTP(w, r)
	}
}

// TestClusterSharedSkipIsASkip: a 429 with Retry-After: 2 on gw-1 makes
// gw-2 and gw-3 skip the provider for those 2 s (not a 30 s cooldown);
// then they take it again with several clients at once (no single trial
// in front), and a single failure afterwards cools nothing down, on any
// node.
func TestClusterSharedSkipIsASkip(t *testing.T) {
	r := testredis.Start(t)
	limited := startModal(t)
	fallback := startEcho(t)
	providers := []map[string]any{
		{"name": "limited", "url": limited.URL(), "priority": 1},
		{"name": "fallback", "url": fallback.URL(), "priority": 2},
	}
	nodes := startCluster(t, r, clusterConfig{providers: providers, queueSize: 50}, nil)
	gw1, gw2, gw3 := nodes[0], nodes[1], nodes[2]
	// Every node serves through limited first.
	for _, g := range nodes {
		hits := limited.Hits.Load()
		if err := serveOnce(g.WS(), 15*time.Second); err != nil {
			t.Fatalf("before: %s: %v", g.Name, err)
		}
		if limited.Hits.Load() != hits+1 {
			t.Fatalf("before: %s did not serve through limited", g.Name)
		}
	}

	// gw-1's client gets 429 Retry-After: 2 and lands on fallback.
	limited.mode.Store(mode429)
	if err := serveOnce(gw1.WS(), 15*time.Second); err != nil {
		t.Fatalf("through gw-1 during the 429: %v", err)
	}
	skipped := time.Now()
	if limited.status.Load() != 1 {
		t.Fatalf("limited answered %d times 429, want 1", limited.status.Load())
	}
	// gw-2 and gw-3 skip it: their clients land on fallback without
	// reaching limited, and their own status shows a skip of about 2 s,
	// not a cooldown of 30 s.
	for _, g := range []*node{gw2, gw3} {
		// The skip reaches the other nodes as news (a connect there asks
		// Redis for nothing of an unlimited provider).
		eventually(t, 5*time.Second, g.Name+": the skip heard", func() (bool, string) {
			p, raw, err := g.Provider("limited")
			return err == nil && p.CooldownUntil != nil, raw
		})
		if err := serveOnce(g.WS(), 15*time.Second); err != nil {
			t.Fatalf("%s during the skip: %v", g.Name, err)
		}
		p, raw, err := g.Provider("limited")
		if err != nil {
			t.Fatal(err)
		}
		if (p.CooldownUntil == nil && time.Since(skipped) < 1500*time.Millisecond) ||
			(p.CooldownUntil != nil && p.CooldownUntil.After(skipped.Add(3*time.Second))) {
			t.Errorf("%s: limited's own cooldown_until %v; want the 2 s skip: %s", g.Name, p.CooldownUntil, raw)
		}
	}
	if got := limited.status.Load(); got != 1 {
		t.Errorf("limited was tried %d times in all during the skip; gw-2 and gw-3 should have skipped it", got)
	}
	for _, g := range []*node{gw2, gw3} {
		eventually(t, 10*time.Second, g.Name+": the client skipped limited as cooldown", func() (bool, string) {
			for _, e := range g.LogEntries("session ended") {
				if skippedAs(e, "limited", "cooldown") {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%d session ended entries", len(g.LogEntries("session ended")))
		})
	}

	// After the skip, a single failure on gw-3 (its first attempt at
	// limited since): no trial to fail, so no cooldown anywhere.
	limited.mode.Store(mode500)
	eventually(t, 10*time.Second, "gw-3 tries limited again after the skip", func() (bool, string) {
		before := limited.status.Load()
		if err := serveOnce(gw3.WS(), 15*time.Second); err != nil {
			return false, err.Error()
		}
		return limited.status.Load() == before+1, fmt.Sprintf("limited answered %d times", limited.status.Load())
	})
	if took := time.Since(skipped); took < 1500*time.Millisecond {
		t.Errorf("gw-3 tried limited again %v after the 429 with Retry-After: 2", took)
	} else {
		t.Logf("gw-3 tried limited again %v after the 429 with Retry-After: 2", took.Round(time.Millisecond))
	}
	limited.mode.Store(modeEcho)
	for _, g := range nodes {
		p, raw, err := g.Provider("limited")
		if err != nil {
			t.Fatal(err)
		}
		if p.CooldownUntil != nil || p.Cluster == nil || p.Cluster.CooldownUntil != nil {
			t.Errorf("%s: limited held after one failure: %s", g.Name, raw)
		}
	}
	hits := limited.Hits.Load()
	if err := serveOnce(gw3.WS(), 15*time.Second); err != nil {
		t.Fatal(err)
	}
	if limited.Hits.Load() != hits+1 {
		t.Errorf("gw-3 cooled limited down after a single failure")
	}

	// Several clients at once through gw-2 all go to limited: nothing
	// gates them behind a single trial. Its handshake takes 500 ms, so
	// their attempts overlap.
	limited.delay.Store(int64(500 * time.Millisecond))
	const together = 4
	openBefore, fallbackHits := limited.Open(), fallback.Hits.Load()
	var wg sync.WaitGroup
	conns := make(chan *websocket.Conn, together)
	errs := make(chan error, together)
	for range together {
		wg.Go(func() {
			ctx, cancel := withTimeout(15 * time.Second)
			defer cancel()
			c, err := openSession(ctx, gw2.WS())
			if err != nil {
				errs <- err
				return
			}
			conns <- c
		})
	}
	wg.Wait()
	close(conns)
	close(errs)
	for err := range errs {
		t.Errorf("a client of the %d: %v", together, err)
	}
	if got := limited.Open() - openBefore; got != together || fallback.Hits.Load() != fallbackHits {
		t.Errorf("%d clients at once through gw-2: %d on limited, %d on fallback; want all on limited",
			together, got, fallback.Hits.Load()-fallbackHits)
	}
	for c := range conns {
		closeSession(c)
	}
}
