package pool

import (
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/cooldown"
)

// TestCreateRateWindow: n starts in the sliding window, the n+1st refused
// with the time the oldest leaves, admitted again from that moment (not at
// a calendar boundary); a reload that changes the cap applies it to the
// starts already counted, and one that fails gives the cap back.
func TestCreateRateWindow(t *testing.T) {
	r, clk := fakeRegistry(t, true)
	running := new(int)
	p, err := r.Claim("rate-unit", "ws://h:1/", "ws://h:1/", running, cooldown.Config{}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	// No cap: every start allowed, none counted.
	for range 5 {
		if ok, _ := p.TakeStart(); !ok {
			t.Fatal("a start refused without create_rate")
		}
	}
	if p.StartsInWindow() != 0 {
		t.Fatalf("%d starts counted without create_rate", p.StartsInWindow())
	}

	p.SetCreateRate(CreateRate{N: 3, Window: time.Minute})
	t0 := clk.Now()
	for i := range 3 {
		if ok, _ := p.TakeStart(); !ok {
			t.Fatalf("start %d of 3 refused", i+1)
		}
		clk.Advance(10 * time.Second) // starts at t0, t0+10s, t0+20s
	}
	ok, retryAt := p.TakeStart()
	if ok || !retryAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("the 4th start: ok %v, retry at %v; want refused until %v", ok, retryAt, t0.Add(time.Minute))
	}
	if p.StartsInWindow() != 3 {
		t.Fatalf("%d starts in the window, want 3", p.StartsInWindow())
	}
	// Just before the oldest leaves: still refused, same time.
	clk.Advance(retryAt.Sub(clk.Now()) - time.Millisecond)
	if ok, again := p.TakeStart(); ok || !again.Equal(retryAt) {
		t.Fatalf("a millisecond early: ok %v, retry at %v", ok, again)
	}
	// The oldest left: one start, and the next waits for the second.
	clk.Advance(time.Millisecond)
	if ok, _ := p.TakeStart(); !ok {
		t.Fatal("refused once the oldest start left the window")
	}
	if ok, next := p.TakeStart(); ok || !next.Equal(t0.Add(70*time.Second)) {
		t.Fatalf("after the window slid: ok %v, retry at %v, want %v", ok, next, t0.Add(70*time.Second))
	}

	// A shared decision is recorded without a check.
	p.RecordStart()
	if p.StartsInWindow() != 4 {
		t.Fatalf("%d starts after a recorded one, want 4", p.StartsInWindow())
	}

	// A reload that lowers the cap applies it to the same starts: four
	// counted (t0+10s, t0+20s, t0+60s twice), two allowed, so three must
	// leave, the third at t0+120s.
	next := new(int)
	if _, err := r.Claim("rate-unit", "ws://h:1/", "ws://h:1/", next, cooldown.Config{}, false, 0); err != nil {
		t.Fatal(err)
	}
	p.SetCreateRate(CreateRate{N: 2, Window: time.Minute})
	if ok, at := p.TakeStart(); ok || !at.Equal(t0.Add(120*time.Second)) {
		t.Fatalf("a lower cap: ok %v, retry at %v, want %v", ok, at, t0.Add(120*time.Second))
	}
	// That load fails: the running load's cap comes back.
	r.ReleaseClaim("rate-unit", next)
	if got := p.CreateRate(); got != (CreateRate{N: 3, Window: time.Minute}) {
		t.Fatalf("after a failed load the cap is %+v", got)
	}
	// A cap removed counts nothing any more.
	p.SetCreateRate(CreateRate{})
	if ok, _ := p.TakeStart(); !ok || p.StartsInWindow() != 0 {
		t.Fatal("a removed cap still refuses or counts")
	}
	r.ReleaseClaim("rate-unit", running)
}

// TestCreateRateRaisedWakes: a cap that grows is an offer to the waiters.
func TestCreateRateRaisedWakes(t *testing.T) {
	r, _ := fakeRegistry(t, true)
	gen := new(int)
	p, err := r.Claim("rate-wake", "ws://h:1/", "ws://h:1/", gen, cooldown.Config{}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.ReleaseClaim("rate-wake", gen)
	p.SetCreateRate(CreateRate{N: 1, Window: time.Second})
	woken, err := wokenBy(t, r, []string{p.Resource()}, func() { p.SetCreateRate(CreateRate{N: 2, Window: time.Second}) })
	if err != nil || !woken {
		t.Fatalf("raising the cap: woken %v, %v", woken, err)
	}
	if woken, _ = wokenBy(t, r, []string{p.Resource()}, func() { p.SetCreateRate(CreateRate{N: 1, Window: time.Second}) }); woken {
		t.Fatal("lowering the cap woke a waiter")
	}
}
