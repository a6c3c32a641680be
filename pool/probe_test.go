package pool

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/queue"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// ---- a fake clock for the probe loop ----

type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	// async: a timer's callback runs on a goroutine of its own, as
	// time.AfterFunc's does (else in place, within Advance).
	async bool
}

type fakeTimer struct {
	c    *fakeClock
	when time.Time
	f    func()
	done bool
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) queue.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, when: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.done {
		return false
	}
	t.done = true
	for i, x := range c.timers {
		if x == t {
			c.timers = append(c.timers[:i], c.timers[i+1:]...)
			break
		}
	}
	return true
}

// Advance moves the clock by d, firing due timers in time order, each with
// the clock set to its due time; callbacks run without the clock's lock.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	target := c.now.Add(d)
	for {
		var next *fakeTimer
		for _, t := range c.timers {
			if !t.when.After(target) && (next == nil || t.when.Before(next.when)) {
				next = t
			}
		}
		if next == nil {
			break
		}
		next.done = true
		for i, x := range c.timers {
			if x == next {
				c.timers = append(c.timers[:i], c.timers[i+1:]...)
				break
			}
		}
		if next.when.After(c.now) {
			c.now = next.when
		}
		c.mu.Unlock()
		if c.async {
			go next.f()
		} else {
			next.f()
		}
		c.mu.Lock()
	}
	c.now = target
	c.mu.Unlock()
}

// fakeRegistry is a registry of the test's own on a fake clock; probes
// run in place (inline, within Advance) or on their timer's own
// goroutine. The clock starts at a multiple of every interval the tests
// use, and the probe times' phase is zero: the first probe of a loop comes
// at once.
func fakeRegistry(t *testing.T, inline bool) (*Registry, *fakeClock) {
	t.Helper()
	c := &fakeClock{now: time.Unix(1_700_000_000, 0), async: !inline}
	r := NewRegistry(c)
	r.probeOffset = 0
	return r, c
}

// pending is the number of timers set and not yet run or stopped.
func (c *fakeClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// ---- a fake prober ----

// fakeProber answers each probe with its current result; with hold set,
// each probe waits for a release first.
type fakeProber struct {
	name     string
	mu       sync.Mutex
	result   upstreams.ProbeResult
	hold     chan struct{} // nil: answer at once
	calls    atomic.Int64
	inFlight atomic.Int64
	maxIn    atomic.Int64
	closed   atomic.Int64
}

func passing() upstreams.ProbeResult {
	return upstreams.ProbeResult{Outcome: upstreams.Outcome{Word: upstreams.WordOK, Kind: upstreams.Success}}
}

func failing(word string) upstreams.ProbeResult {
	return upstreams.ProbeResult{Outcome: upstreams.Outcome{Word: word, Kind: upstreams.Failure}}
}

func pressure(running, max int, available bool) upstreams.ProbeResult {
	r := passing()
	r.Pressure = &upstreams.Pressure{Running: running, MaxConcurrent: max, IsAvailable: available}
	return r
}

func (f *fakeProber) set(r upstreams.ProbeResult) {
	f.mu.Lock()
	f.result = r
	f.mu.Unlock()
}

func (f *fakeProber) Probe(ctx context.Context) upstreams.ProbeResult {
	f.calls.Add(1)
	n := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	for {
		m := f.maxIn.Load()
		if n <= m || f.maxIn.CompareAndSwap(m, n) {
			break
		}
	}
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-ctx.Done():
			return upstreams.ProbeResult{Outcome: upstreams.Outcome{Word: upstreams.WordClientGone, Kind: upstreams.ClientGone}}
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.result
}

func (f *fakeProber) Close() { f.closed.Add(1) }

// recorder collects values added from any goroutine.
type recorder[T any] struct {
	mu  sync.Mutex
	got []T
}

func (r *recorder[T]) add(v T) {
	r.mu.Lock()
	r.got = append(r.got, v)
	r.mu.Unlock()
}

func (r *recorder[T]) list() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]T(nil), r.got...)
}

// reports collects what a registration is told.
type reports = recorder[ProbeReport]

func claimProbed(t *testing.T, r *Registry, name string, cfg cooldown.Config, max int) *ProviderState {
	t.Helper()
	gen := new(int)
	p, err := r.Claim(name, "ws://h:1/"+name, "ws://h:1/"+name, gen, cfg, false, max)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.ReleaseClaim(name, gen) })
	return p
}

// TestProbeFailuresTripCooldown: failing probes trip a cooldown with no
// client involved; during the cooldown nothing is probed; the probe at its
// end is the trial, and clients get nothing until it passes; a passing
// probe ends the cooldown and its doubling.
func TestProbeFailuresTripCooldown(t *testing.T) {
	r, c := fakeRegistry(t, true)
	p := claimProbed(t, r, "probe-trip", cooldown.Config{Duration: caddy.Duration(10 * time.Second), MaxDuration: caddy.Duration(time.Minute), MinRequests: 2}, 0)
	fp := &fakeProber{}
	fp.set(failing(upstreams.WordRefused))
	var rs reports
	owner := new(int)
	p.Probes.Add(owner, ProbeConfig{Prober: fp, Interval: time.Second, Report: rs.add})
	defer p.Probes.Remove(owner)

	c.Advance(0) // the first probe: at once (the clock is at a probe time)
	if fp.calls.Load() != 1 || !p.Health.Available() {
		t.Fatalf("after one failed probe: %d probes, available %v", fp.calls.Load(), p.Health.Available())
	}
	c.Advance(time.Second)
	if fp.calls.Load() != 2 || p.Health.Available() {
		t.Fatalf("two failed probes did not trip the cooldown (%d probes)", fp.calls.Load())
	}
	got := rs.list()
	if len(got) != 2 || got[1].Change != cooldown.CooledDown || got[1].Result.Outcome.Word != upstreams.WordRefused {
		t.Fatalf("reports %+v, want the second to be the cooldown", got)
	}
	if p.Stats.LastError() != upstreams.WordRefused {
		t.Fatalf("last error %q", p.Stats.LastError())
	}
	if r, ok := p.Probes.Last(); !ok || r.Outcome != upstreams.WordRefused || !r.At.Equal(c.Now()) {
		t.Fatalf("last probe %+v %v", r, ok)
	}
	snap := p.Health.Snapshot()
	if snap.Attempts != 2 || snap.Failures != 2 {
		t.Fatalf("probes not counted like attempts: %+v", snap)
	}

	// Nothing is probed while the cooldown runs.
	c.Advance(9 * time.Second)
	if fp.calls.Load() != 2 {
		t.Fatalf("probed during the cooldown: %d probes", fp.calls.Load())
	}
	// The trial is the probe's: a client is refused it at the end.
	fp.set(failing(upstreams.WordTimeout))
	if _, ok := p.Health.Acquire(); ok {
		t.Fatal("a client got a permit during the cooldown")
	}
	c.Advance(time.Second) // the cooldown ends: the probe is the trial, and fails
	got = rs.list()
	if fp.calls.Load() != 3 || !got[2].Trial || got[2].Change != cooldown.CooledDown {
		t.Fatalf("the probe at the cooldown's end: %d probes, report %+v", fp.calls.Load(), got[len(got)-1])
	}
	if u := p.Health.Until(); !u.Equal(c.Now().Add(20 * time.Second)) {
		t.Fatalf("failed trial: next cooldown %v, want doubled to 20s", u.Sub(c.Now()))
	}
	fp.set(passing())
	c.Advance(19 * time.Second)
	if _, ok := p.Health.Acquire(); ok || fp.calls.Load() != 3 {
		t.Fatal("the second cooldown was cut short")
	}
	c.Advance(time.Second)
	got = rs.list()
	if fp.calls.Load() != 4 || !got[3].Trial || got[3].Change != cooldown.Recovered {
		t.Fatalf("the passing trial: %d probes, report %+v", fp.calls.Load(), got[len(got)-1])
	}
	if s := p.Health.Snapshot(); !s.Healthy || s.Streak != 0 {
		t.Fatalf("after the passing probe: %+v", s)
	}
	// Back to its pace: one probe per interval.
	c.Advance(time.Second)
	c.Advance(time.Second)
	if fp.calls.Load() != 6 {
		t.Fatalf("%d probes, want 6 after two more intervals", fp.calls.Load())
	}
}

// TestProbesNeverOverlap: a probe slower than the interval delays the
// next; one provider never has two probes in flight.
func TestProbesNeverOverlap(t *testing.T) {
	r, c := fakeRegistry(t, false)
	p := claimProbed(t, r, "probe-overlap", cooldown.Config{}, 0)
	fp := &fakeProber{hold: make(chan struct{})}
	fp.set(passing())
	owner := new(int)
	var reported atomic.Int64
	count := func(ProbeReport) { reported.Add(1) }
	p.Probes.Add(owner, ProbeConfig{Prober: fp, Interval: time.Second, Report: count})
	defer p.Probes.Remove(owner)

	c.Advance(0)
	waitUntil(t, "the first probe to start", func() bool { return fp.inFlight.Load() == 1 })
	for range 10 {
		c.Advance(time.Second)
	}
	// A second registration (a reload) while the probe hangs.
	owner2 := new(int)
	p.Probes.Add(owner2, ProbeConfig{Prober: fp, Interval: time.Second / 2, Report: count})
	defer p.Probes.Remove(owner2)
	c.Advance(5 * time.Second)
	if n := fp.calls.Load(); n != 1 {
		t.Fatalf("%d probes started while the first hung", n)
	}
	for i := 2; i <= 4; i++ {
		fp.hold <- struct{}{} // let the probe in flight answer
		waitUntil(t, "the probe to end", func() bool { return fp.inFlight.Load() == 0 && !p.probing() })
		// Long overdue: the next starts right away, no more.
		c.Advance(0)
		waitUntil(t, "the next probe to start", func() bool { return fp.calls.Load() == int64(i) })
		c.Advance(3 * time.Second)
	}
	close(fp.hold)
	waitUntil(t, "the last probe to end", func() bool { return reported.Load() == fp.calls.Load() })
	if m := fp.maxIn.Load(); m != 1 {
		t.Fatalf("%d probes in flight at once", m)
	}
}

// TestProbeReloadsKeepOneLoop: registrations of later config loads take
// over the loop without restarting it or adding another: one probe per
// interval, at the same pace, with the newest prober and report; a changed
// interval applies from the last probe; the last removal stops it.
func TestProbeReloadsKeepOneLoop(t *testing.T) {
	r, c := fakeRegistry(t, true)
	p := claimProbed(t, r, "probe-reload", cooldown.Config{}, 0)
	a, b, d := &fakeProber{name: "a"}, &fakeProber{name: "b"}, &fakeProber{name: "d"}
	for _, f := range []*fakeProber{a, b, d} {
		f.set(passing())
	}
	var ra, rb, rd reports
	gen1, gen2, gen3 := new(int), new(int), new(int)
	p.Probes.Add(gen1, ProbeConfig{Prober: a, Interval: 2 * time.Second, Report: ra.add})
	c.Advance(0)
	if a.calls.Load() != 1 {
		t.Fatal("no first probe")
	}
	c.Advance(time.Second)
	// A reload: the new load registers, then the old one goes.
	p.Probes.Add(gen2, ProbeConfig{Prober: b, Interval: 2 * time.Second, Report: rb.add})
	c.Advance(500 * time.Millisecond)
	if a.calls.Load()+b.calls.Load() != 1 {
		t.Fatal("a reload started a probe out of turn (the loop was reset)")
	}
	p.Probes.Remove(gen1)
	if a.closed.Load() == 0 {
		waitUntil(t, "the old prober to be closed", func() bool { return a.closed.Load() == 1 })
	}
	c.Advance(500 * time.Millisecond) // t=2s: the loop's own time
	if b.calls.Load() != 1 || a.calls.Load() != 1 {
		t.Fatalf("at t=2s: old prober %d, new %d probes; want 1 and 1", a.calls.Load(), b.calls.Load())
	}
	if len(ra.list()) != 1 || len(rb.list()) != 1 {
		t.Fatal("the report did not follow the newest registration")
	}
	for range 5 {
		c.Advance(2 * time.Second)
	}
	if b.calls.Load() != 6 {
		t.Fatalf("%d probes over 5 more intervals, want 6 in all: one loop", b.calls.Load())
	}
	// A reload with a longer interval: the next probe is an interval after
	// the last one (t=12s) at the earliest, at a probe time of the new
	// interval (t=20s).
	p.Probes.Add(gen3, ProbeConfig{Prober: d, Interval: 5 * time.Second, Report: rd.add})
	p.Probes.Remove(gen2)
	c.Advance(5 * time.Second)
	if d.calls.Load() != 0 {
		t.Fatal("probed before the new interval's probe time")
	}
	c.Advance(3 * time.Second)
	if d.calls.Load() != 1 {
		t.Fatalf("%d probes at the new interval's probe time", d.calls.Load())
	}
	// The provider leaves the config: the loop stops.
	p.Probes.Remove(gen3)
	for range 5 {
		c.Advance(5 * time.Second)
	}
	if d.calls.Load() != 1 || p.Probes.Running() {
		t.Fatalf("probes after the loop stopped: %d", d.calls.Load())
	}
	if n := c.pending(); n != 0 {
		t.Fatalf("%d timers left after the loop stopped", n)
	}
}

// TestProbeCapacity: a capacity read that says full makes the provider
// full (skipped, no room, no slot); the read that says it has room again
// offers it to the queue; learnt maxConcurrent is its limit when
// max_concurrent is unset; a stopped loop forgets it all.
func TestProbeCapacity(t *testing.T) {
	r, c := fakeRegistry(t, true)
	p := claimProbed(t, r, "probe-capacity", cooldown.Config{}, 0)
	fp := &fakeProber{}
	fp.set(pressure(2, 5, true))
	var rs reports
	owner := new(int)
	p.Probes.Add(owner, ProbeConfig{Prober: fp, Interval: time.Second, Report: rs.add})
	c.Advance(0)
	if p.Slots.Full() || p.Slots.Limit() != 5 || p.Slots.MaxConcurrent() != 0 {
		t.Fatalf("room left: full %v, limit %d, configured %d", p.Slots.Full(), p.Slots.Limit(), p.Slots.MaxConcurrent())
	}
	if cr, ok := p.Probes.Capacity(); !ok || cr != (CapacityRecord{Running: 2, Max: 5}) {
		t.Fatalf("capacity %+v %v", cr, ok)
	}
	fp.set(pressure(1, 5, false))
	c.Advance(time.Second)
	if !p.Slots.Full() || p.HasRoom() || p.Slots.tryReserve() {
		t.Fatal("isAvailable false: the provider is not full")
	}
	if got := rs.list(); !got[1].CapacityFull || got[1].Change != cooldown.NoChange {
		t.Fatalf("report %+v", got[1])
	}
	fp.set(pressure(5, 5, true))
	c.Advance(time.Second)
	if !p.Slots.Full() {
		t.Fatal("running = maxConcurrent: the provider is not full")
	}
	fp.set(pressure(4, 5, true))
	woken, _ := wokenBy(t, r, []string{p.Resource()}, func() { c.Advance(time.Second) })
	if !woken || p.Slots.Full() || !rs.list()[3].CapacityFreed {
		t.Fatalf("a freed slot: woken %v, full %v", woken, p.Slots.Full())
	}
	// The learnt limit counts this gateway's own sessions.
	for range 5 {
		if !p.Slots.tryReserve() {
			t.Fatal("no slot below the learnt limit")
		}
	}
	if p.Slots.tryReserve() || !p.Slots.Full() {
		t.Fatal("more slots than the learnt maxConcurrent")
	}
	for range 5 {
		p.Slots.unreserveFailed()
	}
	// A failing probe forgets the capacity (the cooldown rules decide).
	fp.set(pressure(0, 5, false))
	c.Advance(time.Second)
	fp.set(failing(upstreams.StatusWord(503)))
	c.Advance(time.Second)
	if _, ok := p.Probes.Capacity(); ok || p.Slots.Full() || p.Slots.Limit() != 0 {
		t.Fatal("a failed probe kept the capacity read")
	}
	// A configured max_concurrent wins over the learnt one.
	fp.set(pressure(0, 50, true))
	c.Advance(time.Second)
	p.Slots.max.Store(3)
	if p.Slots.Limit() != 3 {
		t.Fatalf("limit %d, want max_concurrent 3", p.Slots.Limit())
	}
	p.Slots.max.Store(0)
	// The loop stops while the provider reads full: it is full no more.
	fp.set(pressure(9, 9, true))
	c.Advance(time.Second)
	if !p.Slots.Full() {
		t.Fatal("not full")
	}
	woken, _ = wokenBy(t, r, []string{p.Resource()}, func() { p.Probes.Remove(owner) })
	if !woken || p.Slots.Full() || p.Slots.Limit() != 0 {
		t.Fatalf("after the loop stopped: woken %v, full %v, limit %d", woken, p.Slots.Full(), p.Slots.Limit())
	}
}

// TestProbeBy: the end of a cooldown a client caused, sooner than the next
// probe, brings that probe forward: it is the trial.
func TestProbeBy(t *testing.T) {
	r, c := fakeRegistry(t, true)
	p := claimProbed(t, r, "probe-by", cooldown.Config{Duration: caddy.Duration(time.Second), MinRequests: 1, FailureThreshold: 0.4}, 0)
	fp := &fakeProber{}
	fp.set(passing())
	owner := new(int)
	var rs reports
	p.Probes.Add(owner, ProbeConfig{Prober: fp, Interval: 10 * time.Second, Report: rs.add})
	defer p.Probes.Remove(owner)
	c.Advance(0)
	// A client's failure trips a one-second cooldown.
	permit, _ := p.Health.Acquire()
	if p.Health.Done(permit, cooldown.Failure, 0) != cooldown.CooledDown {
		t.Fatal("no cooldown")
	}
	p.Probes.NextBy(p.Health.Until())
	c.Advance(time.Second)
	got := rs.list()
	if fp.calls.Load() != 2 || !got[1].Trial || got[1].Change != cooldown.Recovered {
		t.Fatalf("no trial probe at the cooldown's end: %d probes", fp.calls.Load())
	}
	// Then the loop's own times again: the first an interval or more
	// after the trial (t=20s, not t=10s).
	c.Advance(9 * time.Second)
	c.Advance(9 * time.Second)
	if fp.calls.Load() != 2 {
		t.Fatal("probed less than an interval after the trial")
	}
	c.Advance(time.Second)
	if fp.calls.Load() != 3 {
		t.Fatal("no probe at the loop's time after the trial")
	}
}

// waitUntil polls cond, to meet a probe running on its own goroutine; it
// bounds the wait generously and asserts no timing.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// probing reports whether a probe is in flight (for tests).
func (p *ProviderState) probing() bool {
	p.Probes.mu.Lock()
	defer p.Probes.mu.Unlock()
	return p.Probes.loop.running
}

// TestProbeLoopsTogether: the loops of one interval probe at the same
// times (the process's phase of the interval), whenever they started; a
// loop of another interval has its own; each loop has one timer, and every
// loop gets one probe and one report per interval; a failing probe counts
// for its provider only; a loop brought forward goes back to the common
// times after; stopped loops leave no timer.
func TestProbeLoopsTogether(t *testing.T) {
	r, c := fakeRegistry(t, true)
	r.probeOffset = 300 * time.Millisecond
	t0 := c.Now()
	var ps []*ProviderState
	var fps []*fakeProber
	var rs []*reports
	owner := new(int)
	add := func(name string, interval time.Duration) {
		f := &fakeProber{name: name}
		f.set(passing())
		p := claimProbed(t, r, "probe-together-"+name, cooldown.Config{}, 0)
		r := &reports{}
		p.Probes.Add(owner, ProbeConfig{Prober: f, Interval: interval, Report: r.add})
		ps, fps, rs = append(ps, p), append(fps, f), append(rs, r)
		if n := c.pending(); n != len(ps) {
			t.Fatalf("%d timers for %d loops", n, len(ps))
		}
	}
	calls := func() (n [4]int64) {
		for i, f := range fps {
			n[i] = f.calls.Load()
		}
		return n
	}
	add("a", time.Second)
	c.Advance(100 * time.Millisecond)
	add("b", time.Second)
	c.Advance(300 * time.Millisecond) // t0+0.4s: a and b probed at 0.3s
	add("c", time.Second)
	add("d", 2*time.Second)
	if n := calls(); n != [4]int64{1, 1, 0, 0} {
		t.Fatalf("first probes %v, want a and b's at the process's phase", n)
	}
	c.Advance(900 * time.Millisecond) // 1.3s
	if n := calls(); n != [4]int64{2, 2, 1, 0} {
		t.Fatalf("at 1.3s: %v", n)
	}
	c.Advance(time.Second) // 2.3s: d's first, at its own interval's time
	if n := calls(); n != [4]int64{3, 3, 2, 1} {
		t.Fatalf("at 2.3s: %v", n)
	}
	for i, p := range ps {
		if r, ok := p.Probes.Last(); !ok || !r.At.Equal(t0.Add(2300*time.Millisecond)) {
			t.Fatalf("%s: last probe %+v, want at 2.3s", fps[i].name, r)
		}
	}
	fps[0].set(failing(upstreams.StatusWord(503)))
	c.Advance(time.Second) // 3.3s
	if got := rs[0].list(); len(got) != 4 || got[3].Result.Outcome.Word != "status_503" || ps[0].Stats.LastError() != "status_503" {
		t.Fatalf("a: reports %+v", got)
	}
	if ps[1].Stats.LastError() != "" || len(rs[1].list()) != 4 {
		t.Fatalf("b: last error %q, %d reports", ps[1].Stats.LastError(), len(rs[1].list()))
	}
	fps[0].set(passing()) // (before a cooldown)
	// c brought forward: probed alone, then back to the common times an
	// interval or more later (5.3s, not 4.3s).
	ps[2].Probes.NextBy(c.Now().Add(100 * time.Millisecond))
	c.Advance(100 * time.Millisecond) // 3.4s
	if n := calls(); n != [4]int64{4, 4, 4, 1} {
		t.Fatalf("c brought forward: %v", n)
	}
	c.Advance(900 * time.Millisecond) // 4.3s
	if n := calls(); n != [4]int64{5, 5, 4, 2} {
		t.Fatalf("at 4.3s: %v", n)
	}
	c.Advance(time.Second) // 5.3s
	if n := calls(); n != [4]int64{6, 6, 5, 2} {
		t.Fatalf("at 5.3s: %v", n)
	}
	if n := c.pending(); n != 4 {
		t.Fatalf("%d timers for four loops", n)
	}
	for _, p := range ps {
		p.Probes.Remove(owner)
	}
	if n := c.pending(); n != 0 {
		t.Fatalf("%d timers left after the loops stopped", n)
	}
}
