package multinode_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
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
