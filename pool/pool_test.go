package pool

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/queue"
)

// TestReleaseClaimRestores: a config load that claims a running provider
// and then fails (its claims released while the running load still holds
// the name) leaves the running load's settings; a load that replaces the
// running one keeps its own when the old one lets go.
func TestReleaseClaimRestores(t *testing.T) {
	r := NewRegistry(nil)
	running, failed, next := new(int), new(int), new(int) // load identities
	cfg := cooldown.Config{MinRequests: 3}
	p, err := r.Claim("pool-unit", "ws://h:1/", "ws://h:1/", running, cfg, false, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer r.ReleaseClaim("pool-unit", next)

	// A failing load: two handlers claim it with other settings.
	for range 2 {
		if _, err := r.Claim("pool-unit", "ws://other:1/", "ws://other:1/", failed, cooldown.Config{MinRequests: 9}, true, 1); err != nil {
			t.Fatal(err)
		}
	}
	if p.Slots.MaxConcurrent() != 1 || p.URL() != "ws://other:1/" {
		t.Fatalf("the claims did not apply: max %d url %s", p.Slots.MaxConcurrent(), p.URL())
	}
	r.ReleaseClaim("pool-unit", failed)
	if p.Slots.MaxConcurrent() != 1 {
		t.Fatal("restored before the failed load's last claim went")
	}
	r.ReleaseClaim("pool-unit", failed)
	if p.Slots.MaxConcurrent() != 2 || p.URL() != "ws://h:1/" || p.Health.Config().MinRequests != 3 {
		t.Fatalf("the failed load's settings stayed: max %d url %s min_requests %d", p.Slots.MaxConcurrent(), p.URL(), p.Health.Config().MinRequests)
	}

	// A load that runs: the old load's release keeps the new settings.
	if _, err := r.Claim("pool-unit", "ws://h:1/", "ws://h:1/", next, cfg, false, 5); err != nil {
		t.Fatal(err)
	}
	r.ReleaseClaim("pool-unit", running)
	if p.Slots.MaxConcurrent() != 5 {
		t.Fatalf("the replaced load's release changed the new settings: max %d", p.Slots.MaxConcurrent())
	}
	if q, ok := r.Lookup("pool-unit"); !ok || q != p {
		t.Fatal("the entry went away while the new load holds it")
	}
}

// wokenBy puts a waiter for want in the process queue, runs do, and
// reports whether do woke it (or how its wait ended).
func wokenBy(t *testing.T, r *Registry, want []string, do func()) (woken bool, err error) {
	t.Helper()
	line := r.Waiting.NewLine(t, 10, time.Minute, want, nil)
	defer line.Close()
	w, jerr := line.Join(r.Waiting.Mark(), nil, want, time.Time{})
	if jerr != nil {
		t.Fatal(jerr)
	}
	defer w.Leave()
	do()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err = w.Wait(ctx, time.Time{})
	return err == nil, err
}

// TestProviderEventsReachTheQueue: what a provider's state does is offered
// to the waiters that want it: a freed slot, a limit raised by a reload,
// an undrain; a drain ends the wait of a client that could use nothing
// else; a provider that nobody waits for offers nothing to others.
func TestProviderEventsReachTheQueue(t *testing.T) {
	r := NewRegistry(nil)
	cfg := cooldown.Config{MinRequests: 3}
	gen1, gen2 := new(int), new(int)
	p, err := r.Claim("pool-q", "ws://h:1/", "ws://h:1/", gen1, cfg, false, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.ReleaseClaim("pool-q", gen2)
	want := []string{p.Resource()}
	if !p.Slots.tryReserve() {
		t.Fatal("no slot")
	}
	if woken, _ := wokenBy(t, r, want, func() {}); woken {
		t.Fatal("woken with nothing offered")
	}
	if woken, _ := wokenBy(t, r, []string{Resource("other")}, p.Slots.unreserve); woken {
		t.Fatal("a waiter for another provider was woken by this one's slot")
	}
	p.Slots.tryReserve()
	if woken, _ := wokenBy(t, r, want, p.Slots.unreserve); !woken {
		t.Fatal("a freed slot did not reach the waiter")
	}
	p.Slots.tryReserve()
	if woken, _ := wokenBy(t, r, want, func() {
		if _, err := r.Claim("pool-q", "ws://h:1/", "ws://h:1/", gen2, cfg, false, 2); err != nil {
			t.Fatal(err)
		}
	}); !woken {
		t.Fatal("a reload that raised max_concurrent did not reach the waiter")
	}
	r.ReleaseClaim("pool-q", gen1)
	p.Slots.unreserve()
	if _, err := wokenBy(t, r, want, func() { p.SetDraining(true) }); !errors.Is(err, queue.ErrUnavailable) {
		t.Fatalf("drain: waiter got %v, want ErrUnavailable", err)
	}
	if woken, _ := wokenBy(t, r, append(want, Resource("other")), func() { p.SetDraining(false) }); !woken {
		t.Fatal("an undrain did not reach the waiter")
	}
	if !p.HasRoom() {
		t.Fatal("HasRoom false for an idle, healthy, undrained provider")
	}
	k := QuotaKey{Template: "{x}", Value: "v"}
	if !r.Quotas.take(k, 1) || r.Quotas.take(k, 1) {
		t.Fatal("quota")
	}
	if woken, _ := wokenBy(t, r, []string{k.Resource()}, func() { r.Quotas.release(k) }); !woken {
		t.Fatal("a released quota did not reach its key's waiter")
	}
}
