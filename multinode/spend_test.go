package multinode_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
)

// TestClusterSpendAndLearntCap: two nodes on one redis-server share a
// provider whose real cap is 3 (it answers 429 above it), with
// max_concurrent auto, a price of 1 per session and a budget of 3 a day.
// Three sessions over both nodes fill it; the next one, on the node with
// one of them, is answered 429, and the cap learnt is 3 over both nodes:
// the next client of the other node skips the provider as full without an
// attempt. Once the three sessions end, each node's status counts the 3
// they cost together, and both skip the provider with the word budget.
func TestClusterSpendAndLearntCap(t *testing.T) {
	r := testredis.Start(t)
	var contacts fakes.Contacts
	capped := fakes.NewCapped("capped", &contacts, 3)
	t.Cleanup(capped.Close)
	spare := fakes.Echo("spare", &contacts)
	t.Cleanup(spare.Close)
	cc := clusterConfig{queueSize: 0, providers: []map[string]any{
		{"name": "capped", "url": capped.URL(), "priority": 1, "max_concurrent": "auto",
			"cooldown": map[string]any{"duration": "1h"},
			"cost":     map[string]any{"amount": 1, "per": "session"},
			"budget":   map[string]any{"amount": 3, "per": "day"}},
		{"name": "spare", "url": spare.URL(), "priority": 2},
	}}
	a := startNode(t, "gw-a", cc.handler(t, r, "gw-a"))
	b := startNode(t, "gw-b", cc.handler(t, r, "gw-b"))

	dial := func(n *node) *websocket.Conn {
		t.Helper()
		ctx, cancel := withTimeout(15 * time.Second)
		defer cancel()
		c, err := openSession(ctx, n.WS())
		if err != nil {
			t.Fatalf("session through %s: %v", n.Name, err)
		}
		return c
	}
	var onCapped []*websocket.Conn
	onCapped = append(onCapped, dial(a), dial(a), dial(b))
	if capped.Live() != 3 {
		t.Fatalf("the capped provider holds %d, want 3", capped.Live())
	}
	// Its fourth: 429, the cap learnt over both nodes, the spare serves.
	fourth := dial(b)
	if capped.Refused.Load() != 1 || capped.Live() != 3 {
		t.Fatalf("refused %d, live %d", capped.Refused.Load(), capped.Live())
	}
	eventually(t, 5*time.Second, "gw-b to show the learnt cap", func() (bool, string) {
		p, raw, err := b.Provider("capped")
		return err == nil && p.MaxConcurrentLearned != nil && *p.MaxConcurrentLearned == 3 && p.CooldownUntil == nil, raw
	})
	// The other node learns it from the shared state: no attempt.
	hits := capped.Hits.Load()
	fifth := dial(a)
	if capped.Hits.Load() != hits {
		t.Fatal("a client beyond the cluster's learnt cap reached the provider")
	}
	if p, raw, _ := a.Provider("capped"); p.MaxConcurrentLearned == nil || *p.MaxConcurrentLearned != 3 {
		t.Fatalf("gw-a's learnt cap: %s", raw)
	}
	closeSession(fourth)
	closeSession(fifth)

	// The three end: 3 spent, written once each, read by both.
	for _, c := range onCapped {
		closeSession(c)
	}
	for _, n := range []*node{a, b} {
		eventually(t, 10*time.Second, n.Name+" to count the cluster's spend", func() (bool, string) {
			p, raw, err := n.Provider("capped")
			return err == nil && p.Spend.Spent == 3 && p.Spend.Accrued == 0 && p.Spend.Budget != nil && *p.Spend.Budget == 3, raw
		})
	}
	// Both skip it now: the budget is spent, though gw-b's own sessions
	// cost only 1.
	for i, n := range []*node{b, a} {
		closeSession(dial(n))
		eventually(t, 5*time.Second, fmt.Sprintf("%s's session %d logged", n.Name, i), func() (bool, string) {
			for _, e := range n.LogEntries("session ended") {
				if skippedAs(e, "capped", "budget") && e["provider"] == "spare" {
					return true, ""
				}
			}
			return false, fmt.Sprint(n.LogEntries("session ended"))
		})
	}
	if capped.Hits.Load() != hits {
		t.Fatal("a client reached the provider over its budget")
	}
	ma, _ := a.Metric("caddy_browser_failover_spend_total")
	mb, _ := b.Metric("caddy_browser_failover_spend_total")
	if ma[`provider="capped"`] != 2 || mb[`provider="capped"`] != 1 {
		t.Fatalf("spend_total: gw-a %v, gw-b %v", ma, mb)
	}
}
