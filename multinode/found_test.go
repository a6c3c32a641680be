package multinode_test

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/internal/fakedns"
	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
)

// TestFoundProviderExactAcrossNodes: two gateway processes on one real
// redis-server find the same provider through the SRV records of a DNS
// server on loopback, and keep its max_concurrent exact over both: 20
// clients, never more than 3 sessions open at the provider, every client
// served through the queues; both list it as found, with its cluster-wide
// figures back at 0.
func TestFoundProviderExactAcrossNodes(t *testing.T) {
	r := testredis.Start(t)
	dns := fakedns.Start(t)
	echo := startEcho(t)
	_, p, _ := net.SplitHostPort(echo.Addr)
	port, _ := strconv.Atoi(p)
	const srv, found, limit = "_cdp._tcp.multinode.browsers.test.", "br/localhost:", 3
	name := found + p
	dns.SetSRV(srv, fakedns.SRV{Target: "localhost.", Port: uint16(port), Weight: 1})

	var nodes []*node
	for i := 1; i <= 2; i++ {
		n := fmt.Sprintf("gw-%d", i)
		h := clusterConfig{queueSize: 50}.handler(t, r, n)
		delete(h, "providers")
		h["dynamic_providers"] = []map[string]any{{
			"name":           "br",
			"dynamic":        map[string]any{"source": "srv", "name": srv, "refresh": "200ms", "resolver": map[string]any{"addresses": []string{dns.Addr}}},
			"scheme":         "ws",
			"max_concurrent": limit,
		}}
		nodes = append(nodes, startNode(t, n, h))
	}
	for _, g := range nodes {
		eventually(t, 10*time.Second, g.Name+": the provider found", func() (bool, string) {
			p, raw, err := g.Provider(name)
			return err == nil && p.MaxConcurrent == limit && p.Cluster != nil, raw
		})
	}

	const clients = 20
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
	if got := echo.Peak(); got > limit {
		t.Errorf("the found provider had %d sessions open at once; its max_concurrent is %d across the cluster", got, limit)
	}
	if got := served.Load(); got != clients {
		t.Fatalf("%d of %d clients served", got, clients)
	}
	for _, g := range nodes {
		eventually(t, 10*time.Second, g.Name+": cluster and local active 0", func() (bool, string) {
			ok, raw := clusterIs(g, name, 0, nil)()
			if !ok {
				return false, raw
			}
			p, raw, err := g.Provider(name)
			return err == nil && p.Active == 0, raw
		})
	}
}
