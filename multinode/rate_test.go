package multinode_test

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
)

// TestClusterCreateRateExact: two nodes sharing a provider of create_rate
// 3 per minute start no more than 3 sessions there together: of 5 clients
// at once, spread over both, exactly 3 get a session (3 upgrades reach the
// provider), and the other 2 are answered 503 with the provider skipped as
// rate; ended sessions still count, so one more client later is refused
// too, through either node. The provider stays healthy.
func TestClusterCreateRateExact(t *testing.T) {
	r := testredis.Start(t)
	echo := startEcho(t)
	cc := clusterConfig{providers: []map[string]any{{
		"name": "rated", "url": echo.URL(),
		"create_rate": map[string]any{"n": 3, "per": "minute"},
	}}}
	nodes := []*node{startNode(t, "gw-1", cc.handler(t, r, "gw-1")), startNode(t, "gw-2", cc.handler(t, r, "gw-2"))}

	const clients = 5
	errs := make([]error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		g := nodes[i%len(nodes)]
		wg.Go(func() {
			ctx, cancel := withTimeout(20 * time.Second)
			defer cancel()
			c, err := openSession(ctx, g.WS())
			if err == nil {
				closeSession(c)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	served := 0
	for i, err := range errs {
		switch {
		case err == nil:
			served++
		case !refusedForRate(err, "rated"):
			t.Errorf("client %d: %v", i, err)
		}
	}
	if served != 3 || echo.Hits.Load() != 3 {
		t.Fatalf("%d clients served, %d upgrades at the provider; want 3 and 3 (create_rate 3 per minute over both nodes)", served, echo.Hits.Load())
	}
	for _, g := range nodes {
		if err := serveOnce(g.WS(), 10*time.Second); !refusedForRate(err, "rated") {
			t.Fatalf("a client through %s after the window filled: %v", g.Name, err)
		}
		p, raw, err := g.Provider("rated")
		if err != nil || p.CooldownUntil != nil {
			t.Fatalf("%s: the rate skips cooled the provider down: %v %s", g.Name, err, raw)
		}
	}
	if echo.Hits.Load() != 3 {
		t.Fatalf("%d upgrades at the provider, want 3", echo.Hits.Load())
	}
}

// refusedForRate reports whether err is the gateway's 503 listing
// provider skipped as rate.
func refusedForRate(err error, provider string) bool {
	var de *dialError
	if !errors.As(err, &de) || de.Status != http.StatusServiceUnavailable {
		return false
	}
	var body struct {
		Attempts []struct {
			Provider string `json:"provider"`
			Outcome  string `json:"outcome"`
		} `json:"attempts"`
	}
	if json.Unmarshal([]byte(strings.TrimSpace(de.Body)), &body) != nil {
		return false
	}
	return len(body.Attempts) == 1 && body.Attempts[0].Provider == provider && body.Attempts[0].Outcome == "rate"
}

// TestClusterCreateRateGivenBack: a start given back on one node frees the
// window for a client waiting on another. With create_rate 1 per minute
// over two nodes, a client through gw-1 takes the only start, and the
// provider holds its upgrade; a client through gw-2 is turned away as
// rate and waits in the queue. The provider then refuses the first
// upgrade with 400 (relayed to its client): it started nothing, its start
// goes back, and the waiter on gw-2 gets its session at once, long before
// the minute is over.
func TestClusterCreateRateGivenBack(t *testing.T) {
	r := testredis.Start(t)
	echo := startEcho(t)
	hold := make(chan struct{})
	var refusing atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Query().Has("refuse") {
			refusing.Add(1)
			<-hold
			http.Error(w, "unknown option", http.StatusBadRequest)
			return
		}
		echo.ServeHTTP(w, req)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	cc := clusterConfig{queueSize: 10, providers: []map[string]any{{
		"name": "rated", "url": "ws://" + ln.Addr().String() + "/", "pass_query": true,
		"create_rate": map[string]any{"n": 1, "per": "minute"},
	}}}
	a, b := startNode(t, "gw-1", cc.handler(t, r, "gw-1")), startNode(t, "gw-2", cc.handler(t, r, "gw-2"))

	refused := make(chan error, 1)
	go func() { refused <- serveOnce(a.WS()+"?refuse=1", 30*time.Second) }()
	waitUntil(t, 10*time.Second, "the first upgrade at the provider", func() bool { return refusing.Load() == 1 })
	served := make(chan error, 1)
	go func() { served <- serveOnce(b.WS(), 25*time.Second) }()
	waitUntil(t, 10*time.Second, "a client waiting on gw-2", func() bool {
		raw, err := b.get("/browser_failover/status")
		return err == nil && strings.Contains(string(raw), `"waiting":1`)
	})
	close(hold)
	if err := <-refused; statusOf(err) != http.StatusBadRequest {
		t.Fatalf("the refused upgrade: %v", err)
	}
	if err := <-served; err != nil {
		t.Fatalf("the client waiting on gw-2: %v", err)
	}
	if echo.Hits.Load() != 1 {
		t.Fatalf("%d sessions at the provider, want 1", echo.Hits.Load())
	}
	for _, g := range []*node{a, b} {
		p, raw, err := g.Provider("rated")
		if err != nil || p.CooldownUntil != nil {
			t.Fatalf("%s: %v %s", g.Name, err, raw)
		}
	}
}
