package cluster

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
	"github.com/browserfailover/caddy-browser-failover/ledger"
	"github.com/caddyserver/caddy/v2"
)

// openHA opens a Store for node with cfg's way of reaching Redis and the
// test's settings, and closes it when the test ends.
func openHA(t *testing.T, cfg Config, node string) *Store {
	t.Helper()
	cfg.LeaseTTL = caddy.Duration(3 * time.Second)
	cfg.KeyPrefix = "test:" + t.Name() + ":"
	cfg.Logger = testLogger(t)
	s, err := Open(cfg, node)
	if err != nil {
		t.Fatalf("Open(%s): %v", node, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestSentinelFailover: two nodes share a provider's cap through a
// Sentinel-managed master; the master is killed; both follow the promoted
// replica, and once the lost leases are put back the cap is exact again.
func TestSentinelFailover(t *testing.T) {
	sn := testredis.StartSentinel(t)
	cfg := Config{Sentinel: &Sentinel{Master: sn.Master, Addresses: sn.SentinelAddrs()}}
	a := openHA(t, cfg, "a")
	b := openHA(t, cfg, "b")
	ctx := context.Background()
	const p = "prov"
	var held []*Lease
	for range 2 {
		g, err := a.Leases().Acquire(ctx, p, 2)
		if err != nil || g.Lease == nil {
			t.Fatalf("Acquire on a: %+v, %v", g, err)
		}
		held = append(held, g.Lease)
	}
	if g, err := b.Leases().Acquire(ctx, p, 2); err != nil || !g.Full {
		t.Fatalf("third Acquire on b: %+v, %v (want full)", g, err)
	}
	if a.Address() != sn.Primary.Addr() || a.Mode() != ModeSentinel {
		t.Fatalf("a uses %s %q, want the primary %s", a.Mode(), a.Address(), sn.Primary.Addr())
	}

	killed := time.Now()
	sn.Primary.Stop()
	testredis.WaitFor(t, 60*time.Second, "the sentinels to name the replica", func() bool {
		return sn.MasterAddr(t) == sn.Replica.Addr()
	})
	named := time.Now()
	// The promoted replica lacks the leases, as if they had not been
	// replicated before the kill.
	testredis.Cmd(t, sn.Replica.Addr(), "FLUSHALL")
	flushed := time.Now()

	var followedA, followedB time.Duration
	testredis.WaitFor(t, 30*time.Second, "both nodes to follow the new master", func() bool {
		if _, err := b.Leases().Acquire(ctx, "probe", 0); err == nil && followedB == 0 {
			followedB = time.Since(named)
		}
		if err := a.Ping(ctx); err == nil && followedA == 0 {
			followedA = time.Since(named)
		}
		return followedA > 0 && followedB > 0
	})
	t.Logf("failover: sentinels named the replica %v after the kill; nodes answered again %v (a) and %v (b) after that",
		named.Sub(killed).Round(time.Millisecond), followedA.Round(time.Millisecond), followedB.Round(time.Millisecond))
	for _, s := range []*Store{a, b} {
		if s.Address() != sn.Replica.Addr() || s.Failovers() != 1 {
			t.Errorf("node %s uses %q after %d failovers, want %s after 1", s.Node(), s.Address(), s.Failovers(), sn.Replica.Addr())
		}
	}
	// a's leases are back (its Ping re-asserted them, or a renewal did).
	testredis.WaitFor(t, 10*time.Second, "a's leases put back", func() bool {
		sh, err := b.Leases().Snapshot(ctx, []string{p})
		return err == nil && sh[p].Active == 2
	})
	t.Logf("leases back %v after the flush", time.Since(flushed).Round(time.Millisecond))
	if g, err := b.Leases().Acquire(ctx, p, 2); err != nil || !g.Full {
		t.Fatalf("Acquire beyond the cap after the failover: %+v, %v (want full)", g, err)
	}
	held[0].Release()
	settle(t, a)
	g, err := b.Leases().Acquire(ctx, p, 2)
	if err != nil || g.Lease == nil {
		t.Fatalf("Acquire after a release: %+v, %v (want a lease)", g, err)
	}
	g.Lease.Release()
}

// TestReassertBeforeAdmission: after a failed call, the next Acquire
// puts this node's leases back before it takes a slot, so a Redis that
// lost them counts them again first.
func TestReassertBeforeAdmission(t *testing.T) {
	r := startRedis(t)
	reasserted := make(chan struct{}, 4)
	a := openHA(t, Config{Address: r.Addr(), Hooks: Hooks{Reasserted: func() { reasserted <- struct{}{} }}}, "a")
	ctx := context.Background()
	g, err := a.Leases().Acquire(ctx, "p", 2)
	if err != nil || g.Lease == nil {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	r.Stop()
	if err := a.Ping(ctx); err == nil {
		t.Fatal("Ping answered with Redis stopped")
	}
	r.Start() // empty: the lease is lost
	g2, err := a.Leases().Acquire(ctx, "p", 2)
	if err != nil || g2.Lease == nil || g2.Live != 2 {
		t.Fatalf("Acquire after the restart: %+v, %v (want a lease, 2 live)", g2, err)
	}
	g3, err := a.Leases().Acquire(ctx, "p", 2)
	if err != nil || !g3.Full {
		t.Fatalf("Acquire beyond the cap: %+v, %v (want full)", g3, err)
	}
	// The gateway hears of it, to write its ledger again.
	select {
	case <-reasserted:
	case <-time.After(10 * time.Second):
		t.Fatal("Reasserted was not called once the leases were back")
	}
}

// TestClusterMode: a three-master Redis Cluster; providers whose keys
// fall in different slots; exact caps, shared cooldowns, snapshots,
// renewals, spend, resumes and the ledger, with no CROSSSLOT.
func TestClusterMode(t *testing.T) {
	c := testredis.StartCluster(t)
	cfg := Config{Cluster: c.Addrs()[:1]}
	a := openHA(t, cfg, "a")
	b := openHA(t, cfg, "b")
	ctx := context.Background()
	providers := []string{"alpha", "bravo", "charlie", "delta", "echo"}
	slots := map[string]bool{}
	for _, p := range providers {
		out := testredis.Cmd(t, c.Addrs()[0], "CLUSTER", "KEYSLOT", a.c.leaseKey(p))
		slots[strings.TrimSpace(out)] = true
		if k := strings.TrimSpace(testredis.Cmd(t, c.Addrs()[0], "CLUSTER", "KEYSLOT", a.c.cooldownKey(p))); !slots[k] {
			t.Fatalf("the cooldown key of %s is in slot %s, not its lease's", p, k)
		}
	}
	if len(slots) < 3 {
		t.Fatalf("providers in %d slots only", len(slots))
	}
	var leases []*Lease
	for _, p := range providers {
		g, err := a.Leases().Acquire(ctx, p, 1)
		if err != nil || g.Lease == nil {
			t.Fatalf("Acquire(%s) on a: %+v, %v", p, g, err)
		}
		leases = append(leases, g.Lease)
		if g, err := b.Leases().Acquire(ctx, p, 1); err != nil || !g.Full {
			t.Fatalf("Acquire(%s) on b: %+v, %v (want full)", p, g, err)
		}
	}
	// Renewal, over every provider, keeps them.
	a.Leases().r.renew()
	if !a.Leases().r.ok.Load() {
		t.Fatal("renewal failed in cluster mode")
	}
	sh, err := b.Leases().Snapshot(ctx, providers)
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	for _, p := range providers {
		if sh[p].Active != 1 || sh[p].Nodes["a"] != 1 {
			t.Errorf("share of %s: %+v", p, sh[p])
		}
	}
	// Shared cooldown.
	if err := a.News().PublishCooldown(ctx, "bravo", time.Now().Add(time.Minute), 1); err != nil {
		t.Fatalf("PublishCooldown: %v", err)
	}
	if h, err := b.News().Hold(ctx, "bravo"); err != nil || h.CooldownUntil.IsZero() {
		t.Fatalf("Hold on b: %+v, %v", h, err)
	}
	// Release of several, across slots, at Close: b can take them all.
	if err := a.Leases().w.remove(ctx, leases); err != nil {
		t.Fatalf("release: %v", err)
	}
	for _, p := range []string{"alpha", "charlie", "delta"} {
		g, err := b.Leases().Acquire(ctx, p, 1)
		if err != nil || g.Lease == nil {
			t.Fatalf("Acquire(%s) on b after a released: %+v, %v", p, g, err)
		}
		g.Lease.Release()
	}
	// Spend over several scopes.
	now := time.Now().Truncate(time.Hour)
	windows := []SpendWindow{
		{Scope: ProviderScope("alpha"), Start: now, End: now.Add(time.Hour)},
		{Scope: ProviderScope("bravo"), Start: now, End: now.Add(time.Hour)},
		{Scope: ClientScope("k1"), Start: now, End: now.Add(time.Hour)},
	}
	a.Spend().QueueSpend(windows, 1.5, nil)
	b.Spend().QueueSpend(windows, 2, nil)
	testredis.WaitFor(t, 10*time.Second, "spend written", func() bool {
		got, err := a.Spend().ReadSpend(ctx, windows)
		return err == nil && got[0] == 3.5 && got[1] == 3.5 && got[2] == 3.5
	})
	// Resumes.
	if err := a.ParkResume(ctx, "sess1", "", []byte("v"), time.Minute); err != nil {
		t.Fatalf("ParkResume: %v", err)
	}
	if v, _, ok, err := b.ClaimResume(ctx, "sess1", ""); err != nil || !ok || string(v) != "v" {
		t.Fatalf("ClaimResume: %q %v %v", v, ok, err)
	}
	// Ledger: entries, a listing, a delete.
	la, lb := a.Ledger(), b.Ledger()
	for i := range 3 {
		if err := la.Store(ctx, fmt.Sprintf("entries/n%d/x", i), []byte("e")); err != nil {
			t.Fatalf("ledger Store: %v", err)
		}
	}
	if keys, err := lb.List(ctx, "entries", false); err != nil || len(keys) != 3 {
		t.Fatalf("ledger List: %v, %v", keys, err)
	}
	if err := lb.Lock(ctx, "l"); err != nil {
		t.Fatalf("ledger Lock: %v", err)
	}
	if err := lb.Unlock(ctx, "l"); err != nil {
		t.Fatalf("ledger Unlock: %v", err)
	}
	if err := lb.Delete(ctx, "entries"); err != nil {
		t.Fatalf("ledger Delete: %v", err)
	}
	if keys, err := la.List(ctx, "entries", true); err != nil || len(keys) != 0 {
		t.Fatalf("ledger List after Delete: %v, %v", keys, err)
	}
	// The ledger itself: b reaps what a gone a left, in both layouts.
	clockAt := time.Now()
	clock := func() time.Time { return clockAt }
	gone := ledger.New(la, "a", clock)
	gone.SetTiming(time.Second, 3*time.Second)
	older := ledger.New(oldLayout{LedgerStore: la, old: la.Legacy()}, "a-old", clock)
	for _, l := range []*ledger.Ledger{gone, older} {
		if err := l.Beat(ctx); err != nil {
			t.Fatalf("ledger Beat: %v", err)
		}
		for _, id := range []string{"s1", "s2"} {
			if err := l.Record(ctx, "cloud", id); err != nil {
				t.Fatalf("ledger Record: %v", err)
			}
		}
	}
	if err := gone.Remove(ctx, "cloud", "s2"); err != nil {
		t.Fatalf("ledger Remove: %v", err)
	}
	clockAt = clockAt.Add(4 * time.Second)
	reaper := ledger.New(lb, "b", clock)
	reaper.SetTiming(time.Second, 3*time.Second)
	if moved, left, err := reaper.MoveLegacy(ctx, lb.Legacy()); err != nil || moved != 2 || left {
		t.Fatalf("ledger MoveLegacy: moved %d, left %v, %v", moved, left, err)
	}
	orphans, _, err := reaper.Orphans(ctx)
	if err != nil || len(orphans) != 3 {
		t.Fatalf("ledger Orphans: %v, %v (want 3)", orphans, err)
	}
	for _, e := range orphans {
		if _, ok, err := reaper.Adopt(ctx, e); err != nil || !ok {
			t.Fatalf("ledger Adopt: %v, %v", ok, err)
		}
		if err := reaper.Remove(ctx, e.Provider, e.ID); err != nil {
			t.Fatalf("ledger Remove: %v", err)
		}
	}
	if known, err := reaper.Known(ctx, "cloud"); err != nil || len(known) != 0 {
		t.Fatalf("ledger Known after the reap: %v, %v", known, err)
	}
	// WebDriver routes, in several slots: a puts, b reads, touches and
	// drops, a reads the activity.
	wdSlots := map[string]bool{}
	for i := range 5 {
		id := fmt.Sprintf("wd%d", i)
		wdSlots[strings.TrimSpace(testredis.Cmd(t, c.Addrs()[0], "CLUSTER", "KEYSLOT", a.c.routeKey(id)))] = true
		rt := Route{Provider: "alpha", ProviderID: "p" + id, SocketURL: "ws://127.0.0.1:1/session/p" + id}
		if err := a.Routes().Put(ctx, id, rt, time.Minute); err != nil {
			t.Fatalf("Routes.Put(%s): %v", id, err)
		}
		rt.Node = "a"
		if got, ok, err := b.Routes().Get(ctx, id); err != nil || !ok || !reflect.DeepEqual(got, rt) {
			t.Fatalf("Routes.Get(%s) on b: %+v, %v, %v", id, got, ok, err)
		}
		if err := b.Routes().Touch(ctx, id, time.Minute); err != nil {
			t.Fatalf("Routes.Touch(%s) on b: %v", id, err)
		}
		if idle, ok, err := a.Routes().Idle(ctx, id); err != nil || !ok || idle > time.Minute {
			t.Fatalf("Routes.Idle(%s) on a: %v, %v, %v", id, idle, ok, err)
		}
		if err := b.Routes().Drop(ctx, id); err != nil {
			t.Fatalf("Routes.Drop(%s) on b: %v", id, err)
		}
		if _, ok, err := a.Routes().Get(ctx, id); err != nil || ok {
			t.Fatalf("Routes.Get(%s) after Drop: %v, %v", id, ok, err)
		}
	}
	if len(wdSlots) < 3 {
		t.Fatalf("routes in %d slots only", len(wdSlots))
	}
	// Events cross the cluster's nodes.
	rec := subscribe(t, b)
	if err := a.News().ClearCooldown(ctx, "bravo"); err != nil {
		t.Fatalf("ClearCooldown: %v", err)
	}
	testredis.WaitFor(t, 10*time.Second, "b hearing a's recovered event", func() bool {
		_, ok := rec.find(func(ev Event) bool { return ev.Kind == EventRecovered && ev.Provider == "bravo" && ev.Node == "a" })
		return ok
	})
	if err := a.News().AnnounceWebDriverEnd(ctx, "wd0"); err != nil {
		t.Fatalf("AnnounceWebDriverEnd: %v", err)
	}
	testredis.WaitFor(t, 10*time.Second, "b hearing a's WebDriver end", func() bool {
		_, ok := rec.find(func(ev Event) bool { return ev.Kind == EventWebDriverEnd && ev.Session == "wd0" && ev.Node == "a" })
		return ok
	})
	for _, n := range c.Nodes {
		if st := n.ErrorStats(t); strings.Contains(st, "CROSSSLOT") {
			t.Errorf("%s answered CROSSSLOT: %s", n.Addr(), st)
		}
	}
}
