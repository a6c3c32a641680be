package cluster

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// TestRatesExactAcrossNodes: three nodes taking starts of one provider at
// once get exactly n of them in the window; every refusal says how long
// until the window admits one, within the window.
func TestRatesExactAcrossNodes(t *testing.T) {
	r := startRedis(t)
	var stores []*Store
	for _, n := range []string{"a", "b", "c"} {
		stores = append(stores, open(t, r, n, func(c *Config) {
			c.Timeout, c.LeaseTTL = caddy.Duration(5*time.Second), caddy.Duration(10*time.Second)
		}))
	}
	const n = 7
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 30)
	for g := range 30 {
		wg.Go(func() {
			st, err := stores[g%len(stores)].Rates().Take(context.Background(), "p", n, time.Minute)
			switch {
			case err != nil:
				errs <- err
			case st.OK:
				ok.Add(1)
			case st.Wait <= 0 || st.Wait > time.Minute:
				t.Errorf("refused with a wait of %v", st.Wait)
			default:
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if ok.Load() != n || refused.Load() != 30-n {
		t.Fatalf("%d starts counted, %d refused; want %d and %d", ok.Load(), refused.Load(), n, 30-n)
	}
	// Another provider has a window of its own.
	if st, err := stores[0].Rates().Take(context.Background(), "q", 1, time.Minute); err != nil || !st.OK {
		t.Fatalf("another provider: %+v %v", st, err)
	}
}

// TestRatesSlide: the window slides: once the oldest start has left, one
// more is admitted, and what left is dropped.
func TestRatesSlide(t *testing.T) {
	r := startRedis(t)
	s := open(t, r, "a", nil)
	ctx := context.Background()
	const window = 400 * time.Millisecond
	take := func() Start {
		t.Helper()
		st, err := s.Rates().Take(ctx, "p", 2, window)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	if !take().OK || !take().OK {
		t.Fatal("the first two starts refused")
	}
	st := take()
	if st.OK || st.Wait <= 0 || st.Wait > window {
		t.Fatalf("the third start: %+v", st)
	}
	time.Sleep(st.Wait)
	eventually(t, 5*time.Second, "a start once the oldest left", func() bool { return take().OK })
	// The set holds only the starts still in the window: never above n.
	if n, err := s.c.rdb.ZCard(ctx, s.c.startsKey("p")).Result(); err != nil || n < 1 || n > 2 {
		t.Fatalf("%d starts kept after the slide (%v), want 1 or 2", n, err)
	}
	// Bad arguments are refused without a call.
	if _, err := s.Rates().Take(ctx, "p", 0, window); err == nil {
		t.Fatal("n 0 accepted")
	}
}

// TestRatesGiveBack: a start given back leaves the window over every
// node at once: another node then takes a start in a full window, and
// every node hears that the provider has room (released). Only that
// start goes: giving it back twice, or giving back one that is not there,
// frees nothing more.
func TestRatesGiveBack(t *testing.T) {
	r := startRedis(t)
	a, b := open(t, r, "a", nil), open(t, r, "b", nil)
	rec := subscribe(t, b)
	ctx := context.Background()
	take := func(s *Store) Start {
		t.Helper()
		st, err := s.Rates().Take(ctx, "p", 2, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	first, second := take(a), take(b)
	if !first.OK || !second.OK || first.ID == "" || first.ID == second.ID {
		t.Fatalf("the first two starts: %+v %+v", first, second)
	}
	if st := take(b); st.OK {
		t.Fatal("a third start in a window of 2")
	}
	// Node a's provider refused its attempt: the start goes back.
	if err := a.Rates().GiveBack(ctx, "p", first.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the released event at the other node", func() bool {
		_, ok := rec.find(func(ev Event) bool { return ev.Kind == EventReleased && ev.Provider == "p" && ev.Node == "a" })
		return ok
	})
	third := take(b)
	if !third.OK {
		t.Fatalf("no start after one was given back: %+v", third)
	}
	// Twice, or one unknown: nothing more leaves the window.
	if err := a.Rates().GiveBack(ctx, "p", first.ID); err != nil {
		t.Fatal(err)
	}
	if err := a.Rates().GiveBack(ctx, "p", "a|unknown"); err != nil {
		t.Fatal(err)
	}
	if st := take(a); st.OK {
		t.Fatal("a start given back twice freed two")
	}
	if n, err := a.c.rdb.ZCard(ctx, a.c.startsKey("p")).Result(); err != nil || n != 2 {
		t.Fatalf("%d starts in the window (%v), want 2", n, err)
	}
	if err := a.Rates().GiveBack(ctx, "", first.ID); err == nil {
		t.Fatal("an empty provider name accepted")
	}
}
