package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/browserfailover/caddy-browser-failover/internal/conf"
)

// open opens a Store on r for node and closes it when the test ends.
func open(t *testing.T, r *redisServer, node string, tweak func(*Config)) *Store {
	t.Helper()
	cfg := Config{
		Address:   r.Addr(),
		LeaseTTL:  caddy.Duration(600 * time.Millisecond),
		KeyPrefix: "test:" + t.Name() + ":",
		Logger:    testLogger(t),
	}
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := Open(cfg, node)
	if err != nil {
		t.Fatalf("Open(%s): %v", node, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// recorder collects the events of a subscription.
type recorder struct {
	mu     sync.Mutex
	events []Event
}

func (r *recorder) add(ev Event) {
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.mu.Unlock()
}

// find returns the first recorded event matching.
func (r *recorder) find(match func(Event) bool) (Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range r.events {
		if match(ev) {
			return ev, true
		}
	}
	return Event{}, false
}

// subscribe subscribes s and waits until the subscription delivers (a
// probe "recovered" event of a provider no test uses).
func subscribe(t *testing.T, s *Store) *recorder {
	t.Helper()
	rec := &recorder{}
	cancel := s.News().Subscribe(rec.add)
	t.Cleanup(cancel)
	waitSubscribed(t, s, rec)
	return rec
}

func waitSubscribed(t *testing.T, s *Store, rec *recorder) {
	t.Helper()
	probe := "probe-" + t.Name()
	eventually(t, 10*time.Second, "subscription delivers", func() bool {
		_ = s.News().ClearCooldown(context.Background(), probe)
		time.Sleep(20 * time.Millisecond)
		_, ok := rec.find(func(ev Event) bool { return ev.Provider == probe })
		return ok
	})
}

// settle waits until the stores have written in Redis every lease
// registered and given back every lease released (both return at once;
// their round trip follows).
func settle(t *testing.T, stores ...*Store) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, s := range stores {
		ls := s.Leases()
		for {
			ls.mu.Lock()
			idle := !ls.w.running && len(ls.w.releasing) == 0 && len(ls.w.adding) == 0
			ls.mu.Unlock()
			if idle {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("released leases not given back within 10s")
			}
			time.Sleep(time.Millisecond)
		}
	}
}

func share(t *testing.T, s *Store, provider string) Share {
	t.Helper()
	m, err := s.Leases().Snapshot(context.Background(), []string{provider})
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	return m[provider]
}

func TestAcquireExactUnderContention(t *testing.T) {
	r := startRedis(t)
	const max = 5
	var stores []*Store
	for _, n := range []string{"a", "b", "c"} {
		// A generous bound: 60 goroutines share the connections (and a
		// lease outlives a call).
		stores = append(stores, open(t, r, n, func(c *Config) {
			c.Timeout, c.LeaseTTL = caddy.Duration(5*time.Second), caddy.Duration(10*time.Second)
		}))
	}
	ctx := context.Background()
	var held, peak, granted, full atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 60)
	for g := range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[g%len(stores)]
			for range 25 {
				gr, err := s.Leases().Acquire(ctx, "p", max)
				if err != nil {
					errs <- err
					return
				}
				if gr.Lease == nil {
					if !gr.Full {
						errs <- errors.New("no lease, not full, no cooldown")
						return
					}
					full.Add(1)
					continue
				}
				granted.Add(1)
				n := held.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				time.Sleep(time.Millisecond)
				held.Add(-1) // before Release: the slot is then still taken
				gr.Lease.Release()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if p := peak.Load(); p > max {
		t.Fatalf("%d leases held at once, max %d", p, max)
	}
	if granted.Load() == 0 || full.Load() == 0 {
		t.Fatalf("no contention exercised: granted %d, full %d", granted.Load(), full.Load())
	}
	t.Logf("granted %d, full %d, peak %d", granted.Load(), full.Load(), peak.Load())
	settle(t, stores...)
	if sh := share(t, stores[0], "p"); sh.Active != 0 || len(sh.Nodes) != 0 {
		t.Fatalf("after all releases: %+v", sh)
	}
}

func TestUnlimitedIsCountedPerNode(t *testing.T) {
	r := startRedis(t)
	a, b := open(t, r, "a", nil), open(t, r, "node|b", nil)
	ctx := context.Background()
	var leases []*Lease
	for i := range 7 {
		s := a
		if i%2 == 1 {
			s = b
		}
		g, err := s.Leases().Acquire(ctx, "p", 0)
		if err != nil || g.Lease == nil {
			t.Fatalf("Acquire unlimited: %+v, %v", g, err)
		}
		leases = append(leases, g.Lease)
	}
	sh := share(t, a, "p")
	if sh.Active != 7 || sh.Nodes["a"] != 4 || sh.Nodes["node|b"] != 3 {
		t.Fatalf("Snapshot: %+v", sh)
	}
	// A max smaller than what is live: full.
	if g, err := b.Leases().Acquire(ctx, "p", 7); err != nil || !g.Full {
		t.Fatalf("Acquire at max: %+v, %v", g, err)
	}
	for _, l := range leases {
		l.Release()
		l.Release() // idempotent
	}
	settle(t, a, b)
	if sh := share(t, b, "p"); sh.Active != 0 {
		t.Fatalf("after release: %+v", sh)
	}
}

// Register counts a slot of an unlimited provider without a round trip:
// the leases are written in the background, renewed, given back, and a
// lease released before it was written is never written.
func TestRegisterWritesInTheBackground(t *testing.T) {
	r := startRedis(t)
	a := open(t, r, "a", nil)
	b := open(t, r, "b", nil)
	var leases []*Lease
	for range 50 {
		l, err := a.Leases().Register("p")
		if err != nil || l == nil {
			t.Fatalf("Register: %v, %v", l, err)
		}
		leases = append(leases, l)
	}
	settle(t, a)
	if sh := share(t, b, "p"); sh.Active != 50 || sh.Nodes["a"] != 50 {
		t.Fatalf("registered leases over the nodes: %+v", sh)
	}
	// Renewed like any other: alive after several TTLs.
	time.Sleep(3 * 600 * time.Millisecond)
	if sh := share(t, b, "p"); sh.Active != 50 {
		t.Fatalf("registered leases not renewed: %+v", sh)
	}
	// Released while the next ones are being registered.
	for i, l := range leases {
		l.Release()
		if i%2 == 0 {
			nl, err := a.Leases().Register("p")
			if err != nil {
				t.Fatal(err)
			}
			nl.Release() // released, perhaps before it is written
		}
	}
	settle(t, a)
	if sh := share(t, b, "p"); sh.Active != 0 {
		t.Fatalf("after every release: %+v", sh)
	}
	// A capped acquire sees the registered ones of another node.
	kept, err := b.Leases().Register("p")
	if err != nil {
		t.Fatal(err)
	}
	settle(t, b)
	if g, err := a.Leases().Acquire(context.Background(), "p", 1); err != nil || !g.Full {
		t.Fatalf("Acquire at max 1 beside a registered lease: %+v, %v", g, err)
	}
	kept.Release()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if l, err := a.Leases().Register("p"); err == nil || l != nil {
		t.Fatalf("Register after Close: %v, %v", l, err)
	}
}

// A release queued on a node goes in the round trip of that node's next
// acquire of the provider: the slot freed here is free for it.
func TestAcquireCarriesQueuedReleases(t *testing.T) {
	r := startRedis(t)
	a := open(t, r, "a", nil)
	ctx := context.Background()
	g, err := a.Leases().Acquire(ctx, "p", 1)
	if err != nil || g.Lease == nil {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	// Queue the release without its flush running, as when the flush
	// is busy with an earlier batch.
	ls := a.Leases()
	ls.mu.Lock()
	delete(ls.held, g.Lease)
	g.Lease.released.Store(true)
	ls.w.releasing = append(ls.w.releasing, g.Lease)
	ls.mu.Unlock()
	g2, err := a.Leases().Acquire(ctx, "p", 1)
	if err != nil || g2.Lease == nil {
		t.Fatalf("Acquire after a queued release: %+v, %v (want a lease)", g2, err)
	}
	if sh := share(t, a, "p"); sh.Active != 1 {
		t.Fatalf("after the acquire: %+v", sh)
	}
	g2.Lease.Release()
	settle(t, a)
	if sh := share(t, a, "p"); sh.Active != 0 {
		t.Fatalf("after the release: %+v", sh)
	}
}

// A slot of a capped provider released on a node is kept there for its
// next acquire, counted all along, and given back when kept long enough,
// or at once when another node finds the provider full.
func TestSpareSlots(t *testing.T) {
	r := startRedis(t)
	a := open(t, r, "a", nil)
	b := open(t, r, "b", nil)
	rec := &recorder{}
	a.News().Subscribe(rec.add) // a's subscription also hears b's "wanted"
	// Slots are kept only by a node that hears the news.
	eventually(t, 5*time.Second, "a hears the news", a.News().Hearing)
	ctx := context.Background()
	g, err := a.Leases().Acquire(ctx, "p", 2)
	if err != nil || g.Lease == nil {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	g.Lease.Release()
	settle(t, a) // waits for the spare's end too
	if sh := share(t, b, "p"); sh.Active != 0 {
		t.Fatalf("a spare kept past its time: %+v", sh)
	}

	// Released, then taken again at once: the same slot, still counted.
	g, err = a.Leases().Acquire(ctx, "p", 2)
	if err != nil || g.Lease == nil {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	id := g.Lease.ID()
	g.Lease.Release()
	if sh := share(t, b, "p"); sh.Active != 1 {
		t.Fatalf("the spare is not counted: %+v", sh)
	}
	g2, err := a.Leases().Acquire(ctx, "p", 2)
	if err != nil || g2.Lease == nil || g2.Lease.ID() != id {
		t.Fatalf("Acquire after a release: %+v, %v (want the spare %s)", g2, err, id)
	}
	g.Lease.Release() // the old handle: a no-op, the slot is g2's now
	if sh := share(t, b, "p"); sh.Active != 1 {
		t.Fatalf("after a second Release of the old handle: %+v", sh)
	}

	// At the cap: a second slot on a, then b finds p full and says so;
	// the slot a releases now is given back, not kept.
	g3, err := a.Leases().Acquire(ctx, "p", 2)
	if err != nil || g3.Lease == nil {
		t.Fatalf("Acquire: %+v, %v", g3, err)
	}
	if g, err := b.Leases().Acquire(ctx, "p", 2); err != nil || !g.Full {
		t.Fatalf("b at the cap: %+v, %v", g, err)
	}
	eventually(t, 5*time.Second, "a hears b wait", func() bool {
		_, ok := rec.find(func(ev Event) bool { return ev.Kind == EventWanted && ev.Node == "b" })
		return ok
	})
	g2.Lease.Release()
	eventually(t, 5*time.Second, "the slot given back at once", func() bool {
		g, err := b.Leases().Acquire(ctx, "p", 2)
		if err == nil && g.Lease != nil {
			g.Lease.Release()
			return true
		}
		return false
	})
	g3.Lease.Release()
	settle(t, a, b)
	if sh := share(t, b, "p"); sh.Active != 0 {
		t.Fatalf("after every release: %+v", sh)
	}
}

func TestRenewalKeepsLeases(t *testing.T) {
	r := startRedis(t)
	a := open(t, r, "a", func(c *Config) { c.LeaseTTL = caddy.Duration(900 * time.Millisecond) })
	g, err := a.Leases().Acquire(context.Background(), "p", 1)
	if err != nil || g.Lease == nil {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	time.Sleep(3 * 900 * time.Millisecond)
	if sh := share(t, a, "p"); sh.Active != 1 {
		t.Fatalf("lease not kept alive by renewals: %+v", sh)
	}
	g.Lease.Release()
	settle(t, a)
	if sh := share(t, a, "p"); sh.Active != 0 {
		t.Fatalf("after release: %+v", sh)
	}
}

func TestDeadNodeSlotsExpire(t *testing.T) {
	r := startRedis(t)
	const ttl = 600 * time.Millisecond
	a, b, c := open(t, r, "a", nil), open(t, r, "b", nil), open(t, r, "c", nil)
	ctx := context.Background()
	for range 2 {
		if g, err := a.Leases().Acquire(ctx, "p", 2); err != nil || g.Lease == nil {
			t.Fatalf("a.Acquire: %+v, %v", g, err)
		}
	}
	if g, err := c.Leases().Acquire(ctx, "p", 2); err != nil || !g.Full {
		t.Fatalf("c.Acquire: %+v, %v", g, err)
	}
	rec := subscribe(t, c)

	// a dies: no more renewals, nothing released.
	a.Leases().r.stop()
	died := time.Now()
	// Watch (without sweeping) until a's leases are past their expiry.
	var freed time.Time
	eventually(t, 5*time.Second, "a's leases expire", func() bool {
		if share(t, b, "p").Nodes["a"] == 0 {
			freed = time.Now()
			return true
		}
		return false
	})
	// a's last renewal (or acquisition) was at most TTL/3 before it died,
	// so its leases lived at least 2/3 TTL after.
	if d := freed.Sub(died); d < ttl/2 {
		t.Fatalf("a's slots freed %v after it died, before its leases expired", d)
	}
	// The next acquisition sweeps them, takes one and, room being left,
	// tells the others that slots were freed.
	var got []*Lease
	for range 2 {
		g, err := b.Leases().Acquire(ctx, "p", 2)
		if err != nil || g.Lease == nil {
			t.Fatalf("b.Acquire after a died: %+v, %v", g, err)
		}
		got = append(got, g.Lease)
	}
	sh := share(t, b, "p")
	if sh.Active != 2 || sh.Nodes["a"] != 0 || sh.Nodes["b"] != 2 {
		t.Fatalf("Snapshot after a died: %+v", sh)
	}
	eventually(t, 5*time.Second, "released event after a died", func() bool {
		_, ok := rec.find(func(ev Event) bool { return ev.Kind == EventReleased && ev.Provider == "p" })
		return ok
	})
}

// near reports whether a and b are within tol of each other.
func near(a, b time.Time, tol time.Duration) bool {
	d := a.Sub(b)
	return d <= tol && d >= -tol
}

// tol is how far apart two readings of one deadline may be: a round trip
// to Redis and the milliseconds Redis keeps.
const tol = 250 * time.Millisecond

// A subscription that comes up gives the holds in force as events (news
// published before it heard anything is not lost), then the store hears
// the news; an outage stops that until it is back and caught up again.
func TestSubscriptionCatchesUp(t *testing.T) {
	r := startRedis(t)
	a := open(t, r, "a", nil)
	b := open(t, r, "b", nil)
	ctx := context.Background()
	until := time.Now().Add(time.Minute)
	if err := a.News().PublishCooldown(ctx, "p", until, 2); err != nil {
		t.Fatal(err)
	}
	if err := a.News().PublishSkip(ctx, "q", until); err != nil {
		t.Fatal(err)
	}
	if b.News().Hearing() {
		t.Fatal("hearing before any subscription")
	}
	b.Leases().Watch("p", "q")
	rec := &recorder{}
	b.News().Subscribe(rec.add)
	eventually(t, 5*time.Second, "caught up and hearing", b.News().Hearing)
	cd, ok := rec.find(func(ev Event) bool { return ev.Kind == EventCooldown && ev.Provider == "p" })
	if !ok || cd.Streak != 2 || cd.Until.Before(until.Add(-time.Second)) || cd.Node != "" {
		t.Fatalf("the cooldown in force, caught up: %+v %v", cd, ok)
	}
	if sk, ok := rec.find(func(ev Event) bool { return ev.Kind == EventSkip && ev.Provider == "q" }); !ok || sk.Until.Before(until.Add(-time.Second)) {
		t.Fatalf("the skip in force, caught up: %+v %v", sk, ok)
	}
	r.Stop()
	eventually(t, 10*time.Second, "not hearing while Redis is down", func() bool { return !b.News().Hearing() })
	r.Start()
	eventually(t, 20*time.Second, "hearing again", b.News().Hearing)
}

func TestSharedCooldown(t *testing.T) {
	r := startRedis(t)
	a, b := open(t, r, "a", nil), open(t, r, "b", nil)
	rec := subscribe(t, b)
	ctx := context.Background()

	until := time.Now().Add(time.Minute)
	if err := a.News().PublishCooldown(ctx, "p", until, 2); err != nil {
		t.Fatal(err)
	}
	g, err := b.Leases().Acquire(ctx, "p", 0)
	if err != nil || g.Lease != nil || !near(g.Hold.CooldownUntil, until, tol) || g.Hold.Streak != 2 || !g.Hold.SkipUntil.IsZero() || g.Full {
		t.Fatalf("b.Acquire in a's cooldown: %+v, %v", g, err)
	}
	if h, err := b.News().Hold(ctx, "p"); err != nil || !near(h.CooldownUntil, until, tol) || h.Streak != 2 {
		t.Fatalf("b.Hold: %+v %v", h, err)
	}
	if sh := share(t, b, "p"); !near(sh.Hold.Until(), until, tol) || sh.Active != 0 {
		t.Fatalf("Snapshot: %+v", sh)
	}

	// An earlier cooldown does not shorten it; a later one wins.
	if err := b.News().PublishCooldown(ctx, "p", until.Add(-30*time.Second), 1); err != nil {
		t.Fatal(err)
	}
	if h, _ := a.News().Hold(ctx, "p"); !near(h.CooldownUntil, until, tol) || h.Streak != 2 {
		t.Fatalf("earlier cooldown replaced the later one: %+v", h)
	}
	later := until.Add(time.Minute)
	if err := b.News().PublishCooldown(ctx, "p", later, 3); err != nil {
		t.Fatal(err)
	}
	if h, _ := a.News().Hold(ctx, "p"); !near(h.CooldownUntil, later, tol) || h.Streak != 3 {
		t.Fatalf("later cooldown not applied: %+v", h)
	}

	// Clearing ends it everywhere.
	if err := a.News().ClearCooldown(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	if h, err := b.News().Hold(ctx, "p"); err != nil || !h.IsZero() {
		t.Fatalf("after clear: %+v %v", h, err)
	}
	g, err = b.Leases().Acquire(ctx, "p", 1)
	if err != nil || g.Lease == nil || g.Live != 1 {
		t.Fatalf("Acquire after clear: %+v, %v", g, err)
	}
	g.Lease.Release()

	// A cooldown ends by itself at until.
	if err := a.News().PublishCooldown(ctx, "q", time.Now().Add(300*time.Millisecond), 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "short cooldown expires", func() bool {
		h, err := b.News().Hold(ctx, "q")
		return err == nil && h.IsZero()
	})
	// One already over changes nothing.
	if err := a.News().PublishCooldown(ctx, "q", time.Now().Add(-time.Second), 1); err != nil {
		t.Fatal(err)
	}
	if h, _ := b.News().Hold(ctx, "q"); !h.IsZero() {
		t.Fatalf("past cooldown set: %+v", h)
	}

	for _, want := range []Event{
		{Kind: EventCooldown, Provider: "p", Until: until, Streak: 2, Node: "a"},
		{Kind: EventCooldown, Provider: "p", Until: later, Streak: 3, Node: "b"},
		{Kind: EventRecovered, Provider: "p", Node: "a"},
		{Kind: EventReleased, Provider: "p", Node: "b"},
	} {
		eventually(t, 5*time.Second, "event "+want.Kind+" by "+want.Node, func() bool {
			_, ok := rec.find(func(ev Event) bool {
				return ev.Kind == want.Kind && ev.Provider == want.Provider && ev.Node == want.Node &&
					ev.Streak == want.Streak && (want.Until.IsZero() && ev.Until.IsZero() || near(ev.Until, want.Until, tol))
			})
			return ok
		})
	}
	if ev, ok := rec.find(func(ev Event) bool {
		return ev.Kind == EventCooldown && near(ev.Until, until.Add(-30*time.Second), tol)
	}); ok {
		t.Fatalf("a cooldown that was not applied was announced: %+v", ev)
	}
}

// TestSharedSkip: a 408/429 skip travels as a skip, apart from a
// cooldown: its own kind in the events, in Acquire's answer and in Hold;
// a later cooldown does not end it, and it does not end a cooldown.
func TestSharedSkip(t *testing.T) {
	r := startRedis(t)
	a, b := open(t, r, "a", nil), open(t, r, "b", nil)
	rec := subscribe(t, b)
	ctx := context.Background()

	skip := time.Now().Add(2 * time.Second)
	if err := a.News().PublishSkip(ctx, "p", skip); err != nil {
		t.Fatal(err)
	}
	g, err := b.Leases().Acquire(ctx, "p", 0)
	if err != nil || g.Lease != nil || !near(g.Hold.SkipUntil, skip, tol) || !g.Hold.CooldownUntil.IsZero() || g.Hold.Streak != 0 {
		t.Fatalf("b.Acquire in a's skip: %+v, %v", g, err)
	}
	eventually(t, 5*time.Second, "the skip event", func() bool {
		_, ok := rec.find(func(ev Event) bool {
			return ev.Kind == EventSkip && ev.Provider == "p" && ev.Node == "a" && near(ev.Until, skip, tol)
		})
		return ok
	})
	// A shorter cooldown beside it: both kept, each with its own end.
	cd := time.Now().Add(time.Second)
	if err := a.News().PublishCooldown(ctx, "p", cd, 1); err != nil {
		t.Fatal(err)
	}
	h, err := b.News().Hold(ctx, "p")
	if err != nil || !near(h.SkipUntil, skip, tol) || !near(h.CooldownUntil, cd, tol) || h.Streak != 1 || !near(h.Until(), skip, tol) {
		t.Fatalf("skip and cooldown: %+v %v", h, err)
	}
	// The key lives until the later of the two: after the skip, a slot.
	eventually(t, 10*time.Second, "the skip ends", func() bool {
		g, err := b.Leases().Acquire(ctx, "p", 0)
		if err == nil && g.Lease != nil {
			g.Lease.Release()
			return true
		}
		return false
	})
	if time.Now().Before(skip.Add(-tol)) {
		t.Fatalf("a slot before the skip's end (%v early)", skip.Sub(time.Now()))
	}
}

// TestSkewedClocks: two nodes whose clocks are 10 s apart (either way)
// keep the length of every cooldown and skip they share: what one
// publishes to last 2 s lasts 2 s on the other's own clock, in events,
// Acquire answers and Hold alike; nothing is dropped as already past.
func TestSkewedClocks(t *testing.T) {
	r := startRedis(t)
	for _, skew := range []time.Duration{10 * time.Second, -10 * time.Second} {
		t.Run(skew.String(), func(t *testing.T) {
			off := offClock{skew}
			a := open(t, r, "a", func(c *Config) { c.Clock = off; c.KeyPrefix += skew.String() + ":" })
			b := open(t, r, "b", func(c *Config) { c.KeyPrefix += skew.String() + ":" })
			rec := subscribe(t, b)
			ctx := context.Background()
			const length = 2 * time.Second
			// a's 2 s, on a's clock.
			if err := a.News().PublishSkip(ctx, "s", off.Now().Add(length)); err != nil {
				t.Fatal(err)
			}
			if err := a.News().PublishCooldown(ctx, "c", off.Now().Add(length), 1); err != nil {
				t.Fatal(err)
			}
			// On b's clock: 2 s from now, whatever a's says.
			h, err := b.News().Hold(ctx, "s")
			if err != nil || !near(h.SkipUntil, time.Now().Add(length), tol) {
				t.Fatalf("b sees a's 2 s skip end in %v (%+v %v)", time.Until(h.SkipUntil), h, err)
			}
			g, err := b.Leases().Acquire(ctx, "c", 0)
			if err != nil || !near(g.Hold.CooldownUntil, time.Now().Add(length), tol) {
				t.Fatalf("b's Acquire sees a's 2 s cooldown end in %v (%+v %v)", time.Until(g.Hold.CooldownUntil), g, err)
			}
			for _, kind := range []string{EventSkip, EventCooldown} {
				eventually(t, 5*time.Second, kind+" event", func() bool {
					ev, ok := rec.find(func(ev Event) bool { return ev.Kind == kind })
					return ok && ev.Until.Sub(time.Now()) <= length && ev.Until.Sub(time.Now()) > length-time.Second
				})
			}
			// And the other way: b's 2 s as a (off) reads them.
			if err := b.News().PublishSkip(ctx, "t", time.Now().Add(length)); err != nil {
				t.Fatal(err)
			}
			if h, err := a.News().Hold(ctx, "t"); err != nil || !near(h.SkipUntil, off.Now().Add(length), tol) {
				t.Fatalf("a sees b's 2 s skip end in %v on its clock (%+v %v)", h.SkipUntil.Sub(off.Now()), h, err)
			}
			// The skip ends after 2 s of real time.
			start := time.Now()
			eventually(t, 10*time.Second, "the skip ends", func() bool {
				h, err := b.News().Hold(ctx, "s")
				return err == nil && h.IsZero()
			})
			if got := time.Since(start); got < length-500*time.Millisecond {
				t.Fatalf("a 2 s skip ended after %v", got)
			}
		})
	}
}

// offClock is a node clock off by d.
type offClock struct{ d time.Duration }

func (c offClock) Now() time.Time { return time.Now().Add(c.d) }

func TestSubscribeCancel(t *testing.T) {
	r := startRedis(t)
	a := open(t, r, "a", nil)
	rec := &recorder{}
	cancel := a.News().Subscribe(rec.add)
	waitSubscribed(t, a, rec)
	cancel()
	cancel()
	rec.mu.Lock()
	n := len(rec.events)
	rec.mu.Unlock()
	_ = a.News().ClearCooldown(context.Background(), "p")
	time.Sleep(100 * time.Millisecond)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.events) != n {
		t.Fatalf("event delivered after cancel: %+v", rec.events[n:])
	}
}

func TestRedisOutage(t *testing.T) {
	r := startRedis(t)
	a := open(t, r, "a", func(c *Config) { c.Timeout = caddy.Duration(300 * time.Millisecond) })
	rec := subscribe(t, a)
	ctx := context.Background()
	kept, err := a.Leases().Acquire(ctx, "p", 3)
	if err != nil || kept.Lease == nil {
		t.Fatalf("Acquire: %+v, %v", kept, err)
	}
	dropped, err := a.Leases().Acquire(ctx, "p", 3)
	if err != nil || dropped.Lease == nil {
		t.Fatalf("Acquire: %+v, %v", dropped, err)
	}

	if err := a.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	r.Stop()
	bounded(t, "Ping", func() error { return a.Ping(ctx) })
	bounded(t, "Acquire", func() error { _, err := a.Leases().Acquire(ctx, "p", 3); return err })
	bounded(t, "PublishCooldown", func() error { return a.News().PublishCooldown(ctx, "p", time.Now().Add(time.Minute), 1) })
	bounded(t, "ClearCooldown", func() error { return a.News().ClearCooldown(ctx, "p") })
	bounded(t, "PublishSkip", func() error { return a.News().PublishSkip(ctx, "p", time.Now().Add(time.Minute)) })
	bounded(t, "Hold", func() error { _, err := a.News().Hold(ctx, "p"); return err })
	bounded(t, "Snapshot", func() error { _, err := a.Leases().Snapshot(ctx, []string{"p"}); return err })
	releaseDone := make(chan struct{})
	go func() { dropped.Lease.Release(); close(releaseDone) }()
	select {
	case <-releaseDone:
	case <-time.After(5 * time.Second):
		t.Fatal("Release with Redis down did not return")
	}
	time.Sleep(600 * time.Millisecond) // a renewal or two fail meanwhile

	// Redis comes back empty: the live lease is put back, not the one
	// released during the outage.
	r.Start()
	eventually(t, 10*time.Second, "renewal puts back the live lease", func() bool {
		m, err := a.Leases().Snapshot(ctx, []string{"p"})
		return err == nil && m["p"].Active == 1 && m["p"].Nodes["a"] == 1
	})
	g, err := a.Leases().Acquire(ctx, "p", 2)
	if err != nil || g.Lease == nil {
		t.Fatalf("Acquire after restart: %+v, %v", g, err)
	}
	if g, err := a.Leases().Acquire(ctx, "p", 2); err != nil || !g.Full {
		t.Fatalf("Acquire at max after restart: %+v, %v", g, err)
	}
	g.Lease.Release()
	kept.Lease.Release()
	settle(t, a)
	if sh := share(t, a, "p"); sh.Active != 0 {
		t.Fatalf("after releases: %+v", sh)
	}
	// The subscription reconnected.
	rec.mu.Lock()
	rec.events = nil
	rec.mu.Unlock()
	waitSubscribed(t, a, rec)
}

// bounded fails the test unless call returns an error wrapping
// ErrUnavailable within a generous bound.
func bounded(t *testing.T, what string, call func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%s with Redis down: %v, want ErrUnavailable", what, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s with Redis down did not return", what)
	}
}

func TestRedisHangs(t *testing.T) {
	r := startRedis(t)
	a := open(t, r, "a", func(c *Config) { c.Timeout = caddy.Duration(300 * time.Millisecond) })
	subscribe(t, a)
	ctx := context.Background()
	g, err := a.Leases().Acquire(ctx, "p", 1)
	if err != nil || g.Lease == nil {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	r.Pause()
	bounded(t, "Acquire", func() error { _, err := a.Leases().Acquire(ctx, "p", 3); return err })
	bounded(t, "PublishCooldown", func() error { return a.News().PublishCooldown(ctx, "p", time.Now().Add(time.Minute), 1) })
	bounded(t, "Snapshot", func() error { _, err := a.Leases().Snapshot(ctx, []string{"p"}); return err })
	closed := make(chan struct{})
	go func() { _ = a.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close with Redis hung did not return")
	}
	r.Resume()
}

func TestPassword(t *testing.T) {
	const secret = "s3cr3t-Pa55word"
	r := startRedis(t, "--requirepass", secret)
	const wrong = "wr0ng-Pa55word"
	bad := open(t, r, "a", func(c *Config) { c.Password = wrong })
	ctx := context.Background()
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%s with a wrong password: %v, want ErrUnavailable", what, err)
		}
		if strings.Contains(err.Error(), wrong) || strings.Contains(err.Error(), secret) {
			t.Fatalf("%s: error shows a password: %v", what, err)
		}
	}
	_, err := bad.Leases().Acquire(ctx, "p", 1)
	check("Acquire", err)
	check("PublishCooldown", bad.News().PublishCooldown(ctx, "p", time.Now().Add(time.Minute), 1))
	_, err = bad.Leases().Snapshot(ctx, []string{"p"})
	check("Snapshot", err)
	noPass := open(t, r, "a", nil)
	_, err = noPass.Leases().Acquire(ctx, "p", 1)
	check("Acquire without password", err)

	good := open(t, r, "b", func(c *Config) { c.Password = secret })
	g, err := good.Leases().Acquire(ctx, "p", 1)
	if err != nil || g.Lease == nil {
		t.Fatalf("Acquire with the password: %+v, %v", g, err)
	}
	g.Lease.Release()
	acl := open(t, r, "c", func(c *Config) { c.Username, c.Password = "default", secret })
	if _, err := acl.Leases().Snapshot(ctx, []string{"p"}); err != nil {
		t.Fatalf("Snapshot as user default: %v", err)
	}
}

func TestCloseReleasesLeases(t *testing.T) {
	r := startRedis(t)
	a, b := open(t, r, "a", nil), open(t, r, "b", nil)
	rec := subscribe(t, b)
	ctx := context.Background()
	g, err := a.Leases().Acquire(ctx, "p", 1)
	if err != nil || g.Lease == nil {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	g.Lease.Release() // no-op now
	if sh := share(t, b, "p"); sh.Active != 0 {
		t.Fatalf("Close left leases: %+v", sh)
	}
	eventually(t, 5*time.Second, "released event of Close", func() bool {
		_, ok := rec.find(func(ev Event) bool { return ev.Kind == EventReleased && ev.Node == "a" })
		return ok
	})
	if _, err := a.Leases().Acquire(ctx, "p", 1); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Acquire after Close: %v", err)
	}
	if _, err := a.Leases().Snapshot(ctx, []string{"p"}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Snapshot after Close: %v", err)
	}
	a.News().Subscribe(func(Event) { t.Error("event after Close") })()

	// Release racing Close: every lease is released by one or the other.
	c := open(t, r, "c", nil)
	var leases []*Lease
	for range 20 {
		g, err := c.Leases().Acquire(ctx, "q", 0)
		if err != nil || g.Lease == nil {
			t.Fatalf("Acquire: %+v, %v", g, err)
		}
		leases = append(leases, g.Lease)
	}
	var wg sync.WaitGroup
	for _, l := range leases {
		wg.Add(1)
		go func() { defer wg.Done(); l.Release() }()
	}
	_ = c.Close()
	wg.Wait()
	if sh := share(t, b, "q"); sh.Active != 0 {
		t.Fatalf("Release racing Close left leases: %+v", sh)
	}
}

func TestOpenValidates(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, "ca.pem")
	writeCA(t, ca)

	for _, tc := range []struct {
		name, node string
		cfg        Config
		want       string // in the error; "" for no error
		secret     string // never in the error
	}{
		{name: "ok", node: "a", cfg: Config{Address: "127.0.0.1:6379"}},
		{name: "tls", node: "a", cfg: Config{Address: "redis.internal:6380", TLS: &conf.TLS{TrustedCACertFiles: []string{ca}}}},
		{name: "no node", cfg: Config{Address: "127.0.0.1:6379"}, want: "node name"},
		{name: "no address", node: "a", want: "redis needs one of address"},
		{name: "url", node: "a", cfg: Config{Address: "redis://user:hunter22@host:6379"}, want: "not a URL", secret: "hunter22"},
		{name: "user info", node: "a", cfg: Config{Address: "user:hunter22@host:6379"}, want: "not a URL", secret: "hunter22"},
		{name: "no port", node: "a", cfg: Config{Address: "hunter22"}, want: "host:port", secret: "hunter22"},
		{name: "bad port", node: "a", cfg: Config{Address: "host:hunter22"}, want: "port", secret: "hunter22"},
		{name: "db", node: "a", cfg: Config{Address: "h:1", DB: -1}, want: "db"},
		{name: "ttl", node: "a", cfg: Config{Address: "h:1", LeaseTTL: caddy.Duration(-time.Second)}, want: "lease_ttl"},
		{name: "timeout", node: "a", cfg: Config{Address: "h:1", Timeout: caddy.Duration(-time.Second)}, want: "timeout"},
		{name: "ca missing", node: "a", cfg: Config{Address: "h:1", TLS: &conf.TLS{TrustedCACertFiles: []string{filepath.Join(dir, "none.pem")}}}, want: "none.pem"},
		{name: "ca not pem", node: "a", cfg: Config{Address: "h:1", TLS: &conf.TLS{TrustedCACertFiles: []string{notPEM}}}, want: "no PEM"},
		{name: "password", node: "a", cfg: Config{Address: "h", Password: "hunter22"}, want: "host:port", secret: "hunter22"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open(tc.cfg, tc.node)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				if s.Node() != tc.node {
					t.Fatalf("Node() = %q", s.Node())
				}
				_ = s.Close()
				return
			}
			if err == nil {
				_ = s.Close()
				t.Fatalf("Open accepted %+v", tc.cfg)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
			if tc.secret != "" && strings.Contains(err.Error(), tc.secret) {
				t.Fatalf("error shows a secret: %q", err)
			}
		})
	}
}

// writeCA writes a self-signed CA certificate as PEM.
func writeCA(t *testing.T, path string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestEventCodec(t *testing.T) {
	n := newNews(&conn{node: "n|1"}, nil)
	at := time.Unix(1_900_000_000, 0)
	ev, ok := decodeEvent(n.event(EventCooldown, "p \"x\"", 1500*time.Millisecond, 3), at)
	if !ok || ev.Kind != EventCooldown || ev.Provider != `p "x"` || !ev.Until.Equal(at.Add(1500*time.Millisecond)) || ev.Streak != 3 || ev.Node != "n|1" {
		t.Fatalf("round trip: %+v %v", ev, ok)
	}
	ev, ok = decodeEvent(n.event(EventReleased, "p", 0, 0), at)
	if !ok || !ev.Until.IsZero() || ev.Streak != 0 {
		t.Fatalf("released: %+v %v", ev, ok)
	}
	for _, bad := range []string{"", "{", `{"kind":"released"}`, `{"provider":"p"}`} {
		if _, ok := decodeEvent(bad, at); ok {
			t.Fatalf("decoded %q", bad)
		}
	}
	if got := memberNode("a|b|0123"); got != "a|b" {
		t.Fatalf("memberNode = %q", got)
	}
}

// TestLibraryLogRouted: the Redis library's own messages (a refused dial)
// go to the Store's logger at debug level, not to stderr, and stop going
// there once the Store is closed.
func TestLibraryLogRouted(t *testing.T) {
	r := startRedis(t)
	addr := r.Addr()
	r.Stop()
	core, logs := observer.New(zap.DebugLevel)
	s, err := Open(Config{Address: addr, Timeout: caddy.Duration(300 * time.Millisecond), Logger: zap.New(core)}, "a")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(context.Background()); err == nil {
		t.Fatal("Ping to a stopped server succeeded")
	}
	found := logs.FilterMessage("redis client").FilterLevelExact(zap.DebugLevel).All()
	if len(found) == 0 {
		t.Fatalf("no library message in the Store's log; got %d entries: %v", logs.Len(), logs.All())
	}
	if d, _ := found[0].ContextMap()["detail"].(string); !strings.Contains(d, "dial") {
		t.Errorf("library message detail %q does not tell of the dial", d)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	n := logs.Len()
	libLog{}.Printf(context.Background(), "after close")
	if logs.Len() != n {
		t.Error("a closed Store's logger still receives the library's messages")
	}
}
