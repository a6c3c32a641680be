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
		if _, ok, _ := p.Starts.Take(); !ok {
			t.Fatal("a start refused without create_rate")
		}
	}
	if p.Starts.InWindow() != 0 {
		t.Fatalf("%d starts counted without create_rate", p.Starts.InWindow())
	}

	p.Starts.SetRate(CreateRate{N: 3, Window: time.Minute})
	t0 := clk.Now()
	for i := range 3 {
		if _, ok, _ := p.Starts.Take(); !ok {
			t.Fatalf("start %d of 3 refused", i+1)
		}
		clk.Advance(10 * time.Second) // starts at t0, t0+10s, t0+20s
	}
	_, ok, retryAt := p.Starts.Take()
	if ok || !retryAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("the 4th start: ok %v, retry at %v; want refused until %v", ok, retryAt, t0.Add(time.Minute))
	}
	if p.Starts.InWindow() != 3 {
		t.Fatalf("%d starts in the window, want 3", p.Starts.InWindow())
	}
	// Just before the oldest leaves: still refused, same time.
	clk.Advance(retryAt.Sub(clk.Now()) - time.Millisecond)
	if _, ok, again := p.Starts.Take(); ok || !again.Equal(retryAt) {
		t.Fatalf("a millisecond early: ok %v, retry at %v", ok, again)
	}
	// The oldest left: one start, and the next waits for the second.
	clk.Advance(time.Millisecond)
	if _, ok, _ := p.Starts.Take(); !ok {
		t.Fatal("refused once the oldest start left the window")
	}
	if _, ok, next := p.Starts.Take(); ok || !next.Equal(t0.Add(70*time.Second)) {
		t.Fatalf("after the window slid: ok %v, retry at %v, want %v", ok, next, t0.Add(70*time.Second))
	}

	// A shared decision is recorded without a check.
	p.Starts.Record("")
	if p.Starts.InWindow() != 4 {
		t.Fatalf("%d starts after a recorded one, want 4", p.Starts.InWindow())
	}

	// A reload that lowers the cap applies it to the same starts: four
	// counted (t0+10s, t0+20s, t0+60s twice), two allowed, so three must
	// leave, the third at t0+120s.
	next := new(int)
	if _, err := r.Claim("rate-unit", "ws://h:1/", "ws://h:1/", next, cooldown.Config{}, false, 0); err != nil {
		t.Fatal(err)
	}
	p.Starts.SetRate(CreateRate{N: 2, Window: time.Minute})
	if _, ok, at := p.Starts.Take(); ok || !at.Equal(t0.Add(120*time.Second)) {
		t.Fatalf("a lower cap: ok %v, retry at %v, want %v", ok, at, t0.Add(120*time.Second))
	}
	// That load fails: the running load's cap comes back.
	r.ReleaseClaim("rate-unit", next)
	if got := p.Starts.Rate(); got != (CreateRate{N: 3, Window: time.Minute}) {
		t.Fatalf("after a failed load the cap is %+v", got)
	}
	// A cap removed counts nothing any more.
	p.Starts.SetRate(CreateRate{})
	if _, ok, _ := p.Starts.Take(); !ok || p.Starts.InWindow() != 0 {
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
	p.Starts.SetRate(CreateRate{N: 1, Window: time.Second})
	woken, err := wokenBy(t, r, []string{p.Resource()}, func() { p.Starts.SetRate(CreateRate{N: 2, Window: time.Second}) })
	if err != nil || !woken {
		t.Fatalf("raising the cap: woken %v, %v", woken, err)
	}
	if woken, _ = wokenBy(t, r, []string{p.Resource()}, func() { p.Starts.SetRate(CreateRate{N: 1, Window: time.Second}) }); woken {
		t.Fatal("lowering the cap woke a waiter")
	}
}

// TestCreateRateStartGivenBack: a start given back (its provider started
// nothing) leaves the window as if never taken, once; when the window
// had turned a client away, the waiter is offered the provider at once,
// not when the oldest start leaves. A ticket hands its start over once.
func TestCreateRateStartGivenBack(t *testing.T) {
	r, clk := fakeRegistry(t, true)
	gen := new(int)
	p, err := r.Claim("rate-back", "ws://h:1/", "ws://h:1/", gen, cooldown.Config{}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.ReleaseClaim("rate-back", gen)
	p.Starts.SetRate(CreateRate{N: 3, Window: time.Minute})
	var starts []Start
	for i := range 3 {
		s, ok, _ := p.Starts.Take()
		if !ok {
			t.Fatalf("start %d of 3 refused", i+1)
		}
		starts = append(starts, s)
		clk.Advance(time.Second)
	}
	_, ok, retryAt := p.Starts.Take()
	if ok {
		t.Fatal("a 4th start within the window")
	}
	p.Starts.Refused(retryAt) // as admission does
	clk.Advance(5 * time.Second)

	// The provider refused the second attempt with a 4xx: its start goes
	// back, and the client turned away is offered the provider now.
	woken, err := wokenBy(t, r, []string{p.Resource()}, func() { p.Starts.GiveBack(starts[1]) })
	if err != nil || !woken {
		t.Fatalf("a start given back: woken %v, %v", woken, err)
	}
	if n := p.Starts.InWindow(); n != 2 {
		t.Fatalf("%d starts in the window after one went back, want 2", n)
	}
	if u := p.Starts.RefusedUntil(); u.After(clk.Now()) {
		t.Fatalf("still refused until %v after a start went back", u)
	}
	again, ok, _ := p.Starts.Take()
	if !ok {
		t.Fatal("the start given back was not taken again")
	}
	// Given back twice: the second time changes nothing.
	p.Starts.GiveBack(starts[1])
	if n := p.Starts.InWindow(); n != 3 {
		t.Fatalf("%d starts in the window after the same start went back twice, want 3", n)
	}
	// Without a client turned away, nobody is woken.
	woken, _ = wokenBy(t, r, []string{p.Resource()}, func() { p.Starts.GiveBack(again) })
	if woken || p.Starts.InWindow() != 2 {
		t.Fatalf("a start given back with no refusal: woken %v, %d in the window", woken, p.Starts.InWindow())
	}
	// A start that already left the window changes nothing.
	clk.Advance(time.Minute)
	fresh, _, _ := p.Starts.Take()
	p.Starts.GiveBack(starts[0])
	if n := p.Starts.InWindow(); n != 1 {
		t.Fatalf("%d starts after an old one went back, want 1", n)
	}
	// A shared start keeps its member for the caller.
	if s := p.Starts.Record("gw-1|ab12"); s.Shared != "gw-1|ab12" || p.Starts.InWindow() != 2 {
		t.Fatalf("recorded %+v, %d in the window", s, p.Starts.InWindow())
	}

	// A ticket hands its start over once.
	tk := r.NewTicket()
	if _, ok := tk.TakeBackStart(); ok {
		t.Fatal("a ticket with no start handed one over")
	}
	tk.KeepStart(fresh)
	if s, ok := tk.TakeBackStart(); !ok || s != fresh {
		t.Fatalf("the ticket's start: %+v %v", s, ok)
	}
	if _, ok := tk.TakeBackStart(); ok {
		t.Fatal("a ticket handed its start over twice")
	}
	tk.Release()
}
