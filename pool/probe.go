package pool

import (
	"context"
	"sync"
	"time"

	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/queue"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Active health checks. Each provider has at most one probe loop in the
// process, whatever the number of handlers using it and of config reloads:
// handlers register their health check on Provision and remove it on
// Cleanup, and the loop follows the newest registration. It runs while at
// least one registration is left, on the registry's clock, one probe at a
// time.
//
// A probe feeds the provider's health like a client's attempt: a passing
// probe is a success, a failing one a failure in the same window. While a
// loop runs, the trial after a cooldown is the probe's (see
// cooldown.Health.SetProbeTrials): the loop probes as soon as the cooldown
// has run out, and a passing probe makes the provider healthy again before
// any client is sent to it. A probe that reads capacity (browserless's
// /pressure) marks the provider full while it says so.
//
// Each loop has a timer of its own on the clock, and a probe runs on its
// timer's goroutine; the probe times of the loops of one interval are the
// same (see stepUp).

// Prober runs one probe: an HTTP GET that never opens a browser session.
// *upstreams.Prober is one.
type Prober interface {
	Probe(ctx context.Context) upstreams.ProbeResult
	// Close releases what the prober keeps between probes.
	Close()
}

// ProbeConfig is a handler's health check of one provider.
type ProbeConfig struct {
	Prober Prober
	// Interval is the time from one probe's start to the next's.
	Interval time.Duration
	// ReadsCapacity: the prober reads the provider's capacity (status
	// shows it).
	ReadsCapacity bool
	// Report is told what each probe found and changed, so the handler
	// can log it, count it, emit its events and offer the provider to the
	// queue as it does for its clients' attempts. It is called on the
	// probe's goroutine, never under a lock, and only for the newest
	// registration.
	Report func(ProbeReport)
}

// ProbeReport is what one probe found and changed.
type ProbeReport struct {
	Result upstreams.ProbeResult
	// Trial: the probe was the trial after a cooldown.
	Trial bool
	// Change is what the probe's result changed in the provider's health.
	Change cooldown.Change
	// CapacityFull: the capacity read says the provider takes no new
	// session; CapacityFreed: it said so after the previous probe and no
	// longer does.
	CapacityFull, CapacityFreed bool
}

// ProbeRecord is the last probe of a provider, for status.
type ProbeRecord struct {
	At      time.Time
	Outcome string
	MS      float64
}

// CapacityRecord is what the last capacity read said.
type CapacityRecord struct {
	Running, Max, Queued int
	Full                 bool
}

// probeReg is one handler's registration.
type probeReg struct {
	owner any
	cfg   ProbeConfig
}

// probeLoop is the probe loop of one provider. Guarded by Probes.mu.
type probeLoop struct {
	regs   []probeReg // the newest last
	active bool
	ctx    context.Context
	cancel context.CancelFunc
	// timer is the pending probe's (nil: none pending), seq the number
	// it was set with: a timer set before the last scheduling is void.
	timer   queue.Timer
	seq     uint64
	due     time.Time // when the pending probe is due
	running bool      // a probe is in flight
	// lastStart is when the last probe was due (zero: none yet);
	// interval is the one the pending probe was scheduled with.
	lastStart time.Time
	interval  time.Duration
	// epoch changes whenever the loop stops, so a probe in flight then
	// finds out it was the stopped loop's.
	epoch uint64

	last     ProbeRecord // zero At: never probed
	capacity *CapacityRecord
}

func (l *probeLoop) newest() *probeReg {
	if len(l.regs) == 0 {
		return nil
	}
	return &l.regs[len(l.regs)-1]
}

// Probes are a provider's probe loop: the health checks the handlers
// registered, the newest of which it follows, its timer, and what its
// last probe found.
type Probes struct {
	p *ProviderState

	mu   sync.Mutex
	loop probeLoop
}

// Add registers, for owner (a handler), the provider's health check. The
// newest registration sets the loop's prober, interval and report; the
// loop starts with the first registration, its first probe within its
// first interval, and keeps its pace across later ones (a changed interval
// applies from the last probe's start, at the new interval's probe times).
func (q *Probes) Add(owner any, cfg ProbeConfig) {
	q.mu.Lock()
	defer q.mu.Unlock()
	p, l := q.p, &q.loop
	for i, r := range l.regs {
		if r.owner == owner {
			l.regs = append(l.regs[:i], l.regs[i+1:]...)
			break
		}
	}
	l.regs = append(l.regs, probeReg{owner: owner, cfg: cfg})
	if !l.active {
		l.active = true
		l.ctx, l.cancel = context.WithCancel(context.Background())
		p.Health.SetProbeTrials(true)
		l.interval = cfg.Interval
		q.paceLocked(p.reg.Now())
		return
	}
	q.followNewestLocked()
}

// Remove removes owner's registration. With none left the loop stops: a
// probe in flight is called off, the trial after a cooldown goes back to
// clients, and the capacity read is forgotten (the provider is no longer
// full for it).
func (q *Probes) Remove(owner any) {
	q.mu.Lock()
	p, l := q.p, &q.loop
	var removed Prober
	for i, r := range l.regs {
		if r.owner == owner {
			removed = r.cfg.Prober
			l.regs = append(l.regs[:i], l.regs[i+1:]...)
			break
		}
	}
	if removed == nil {
		q.mu.Unlock()
		return
	}
	// Its kept connection closes once a probe it may be running is done.
	go removed.Close()
	if len(l.regs) > 0 {
		q.followNewestLocked()
		q.mu.Unlock()
		return
	}
	l.active = false
	l.epoch++
	q.unscheduleLocked()
	l.cancel()
	wasFull := l.capacity != nil && l.capacity.Full
	l.capacity = nil
	p.Slots.probed(false, 0)
	q.mu.Unlock()
	p.Health.SetProbeTrials(false)
	if wasFull || p.Health.Available() {
		// No longer full for a probe, or its trial left to clients.
		p.Notify()
	}
}

// followNewestLocked applies a change of the newest registration's
// interval to the pending timer.
func (q *Probes) followNewestLocked() {
	l := &q.loop
	n := l.newest()
	if n.cfg.Interval == l.interval {
		return
	}
	l.interval = n.cfg.Interval
	if l.running {
		return // the probe's end schedules the next with it
	}
	t := q.p.reg.Now()
	if l.lastStart.IsZero() {
		// The first probe keeps its time if that comes within the new
		// interval.
		if l.due.Sub(t) > l.interval {
			q.paceLocked(t)
		} else {
			q.scheduleLocked(later(l.due, t))
		}
		return
	}
	q.paceLocked(later(l.lastStart.Add(l.interval), t))
}

// Probe times. A loop probes at the multiples of its interval counted from
// probeOffset, a phase of the interval picked at random for the process:
// the loops of one interval probe at the same times, so their timers fire
// together and the process wakes once for all of them, as it would for one
// ticker, rather than once per provider (a wake-up costs the process more
// than a probe's own work; see docs/benchmarks.md). A loop's first probe is
// the first such time after it starts, within its first interval. The end
// of a cooldown or skip is not rounded: the trial runs as soon as it may,
// and the probes after it go back to the loop's times.

// stepUp is the first probe time at or after t of the loops probing every
// interval, in the phase offset.
func stepUp(t time.Time, interval, offset time.Duration) time.Time {
	step := max(interval, time.Millisecond)
	r := t.Add(-offset).Truncate(step).Add(offset)
	if r.Before(t) {
		r = r.Add(step)
	}
	return r
}

// paceLocked makes the loop's next probe due at the first probe time from
// t.
func (q *Probes) paceLocked(t time.Time) {
	q.scheduleLocked(stepUp(t, q.loop.interval, q.p.reg.probeOffset))
}

// scheduleLocked makes the loop's next probe due at t, on a timer of its
// own.
func (q *Probes) scheduleLocked(t time.Time) {
	l := &q.loop
	q.unscheduleLocked()
	l.due = t
	seq := l.seq
	l.timer = q.p.reg.clock.AfterFunc(max(t.Sub(q.p.reg.Now()), 0), func() { q.fire(seq) })
}

// unscheduleLocked voids the loop's pending probe, if any.
func (q *Probes) unscheduleLocked() {
	l := &q.loop
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	l.seq++ // a timer that could not be stopped finds out it is void
}

// NextBy moves the next probe to t when that is sooner. The failover
// chain calls it with the end of a cooldown or skip it started, so the
// probe that is the trial runs as soon as it may.
func (q *Probes) NextBy(t time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	l := &q.loop
	if !l.active || l.running || !t.Before(l.due) {
		return
	}
	q.scheduleLocked(t)
}

// fire runs the probe the loop's timer seq was set for, on the timer's
// goroutine; nothing when the timer is void, a cooldown or skip still runs
// (the probe then waits for its end), or another trial is in flight.
func (q *Probes) fire(seq uint64) {
	q.mu.Lock()
	p, l := q.p, &q.loop
	if !l.active || l.seq != seq || l.running {
		q.mu.Unlock()
		return
	}
	l.timer = nil
	t := p.reg.Now()
	permit, ok := p.Health.AcquireProbe()
	if !ok {
		if u := p.Health.Until(); u.After(t) {
			q.scheduleLocked(u)
		} else {
			// Another trial is in flight (taken before the loop
			// started): look again after an interval.
			q.paceLocked(t.Add(l.interval))
		}
		q.mu.Unlock()
		return
	}
	l.running = true
	// The pace follows the times the probes were due, not the moments
	// their timers ran: a late timer does not push the next probe back.
	due := l.due
	if due.After(t) {
		due = t
	}
	l.lastStart = due
	j := probeJob{ctx: l.ctx, epoch: l.epoch, reg: *l.newest(), permit: permit, start: t, due: due}
	q.mu.Unlock()
	q.apply(j, j.reg.cfg.Prober.Probe(j.ctx))
}

// probeJob is one probe in flight.
type probeJob struct {
	ctx        context.Context
	epoch      uint64
	reg        probeReg
	permit     cooldown.Permit
	start, due time.Time
}

// apply applies a probe's result, tells the handler, and schedules the
// loop's next probe.
func (q *Probes) apply(j probeJob, res upstreams.ProbeResult) {
	p := q.p
	epoch, permit, start, due := j.epoch, j.permit, j.start, j.due
	o := res.Outcome
	rep := ProbeReport{Result: res, Trial: permit.Trial()}
	switch o.Kind {
	case upstreams.Success:
		rep.Change = p.Health.Done(permit, cooldown.Success, 0)
	case upstreams.ClientGone:
		// Called off: the loop stopped. Nothing is learnt.
		p.Health.Done(permit, cooldown.Neutral, 0)
	default:
		p.Stats.SetLastError(o.Word)
		rep.Change = p.Health.Done(permit, cooldown.Failure, 0)
	}

	q.mu.Lock()
	l := &q.loop
	stopped := !l.active || l.epoch != epoch
	if o.Kind != upstreams.ClientGone && !stopped {
		l.last = ProbeRecord{At: start, Outcome: o.Word, MS: float64(o.Elapsed.Microseconds()) / 1000}
		wasFull := l.capacity != nil && l.capacity.Full
		var probedMax int64
		if pr := res.Pressure; pr != nil && o.Kind == upstreams.Success {
			l.capacity = &CapacityRecord{Running: pr.Running, Max: pr.MaxConcurrent, Queued: pr.Queued, Full: pr.Full()}
			probedMax = int64(pr.MaxConcurrent)
		} else {
			l.capacity = nil
		}
		rep.CapacityFull = l.capacity != nil && l.capacity.Full
		rep.CapacityFreed = wasFull && !rep.CapacityFull
		if rep.CapacityFull {
			// With max_concurrent auto, full while sessions are live
			// teaches the cap: the sessions the provider says it runs
			// (its own count, not skewed by a session that is just
			// starting or ending here), or else this gateway's.
			n := p.Slots.Active()
			if pr := res.Pressure; pr != nil && pr.Running > 0 {
				n = int64(pr.Running)
			}
			p.Slots.Refused(n)
		}
		p.Slots.probed(rep.CapacityFull, probedMax)
	}
	var report func(ProbeReport)
	if n := l.newest(); n != nil && !stopped {
		report = n.cfg.Report
	}
	q.mu.Unlock()

	switch {
	case o.Kind == upstreams.ClientGone || stopped:
		if permit.Trial() {
			// The loop stopped during its trial: the provider recovered
			// (no handler is left to tell), or the trial is the clients'
			// again; either way the next waiter may go.
			p.Notify()
		}
	default:
		if rep.CapacityFreed && p.Health.Available() {
			// A slot the provider freed: the longest waiter may take it.
			p.Notify()
		}
		if report != nil {
			// Still running: the next probe starts only once the handler
			// has heard of this one, so reports never overlap.
			report(rep)
		}
	}

	q.mu.Lock()
	defer q.mu.Unlock()
	l.running = false
	if !l.active || l.newest() == nil {
		return
	}
	if l.epoch != epoch {
		// The loop was started again meanwhile; its first probe, whose
		// timer may have come while this one ran, goes now at the latest.
		q.scheduleLocked(later(l.due, p.reg.Now()))
		return
	}
	// The next probe: at the end of a cooldown or skip that runs now, or
	// an interval after this one started.
	if u := p.Health.Until(); !u.IsZero() {
		q.scheduleLocked(later(u, p.reg.Now()))
		return
	}
	q.paceLocked(later(due.Add(l.interval), p.reg.Now()))
}

// later is the later of two times.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Last is the provider's last probe; false when it was never probed.
func (q *Probes) Last() (ProbeRecord, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.loop.last.At.IsZero() {
		return ProbeRecord{}, false
	}
	return q.loop.last, true
}

// Capacity is what the last capacity read said; false when there is none
// (no capacity check, or its last probe failed).
func (q *Probes) Capacity() (CapacityRecord, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.loop.capacity == nil {
		return CapacityRecord{}, false
	}
	return *q.loop.capacity, true
}

// ReadsCapacity reports whether the provider's running health check reads
// its capacity.
func (q *Probes) ReadsCapacity() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := q.loop.newest()
	return q.loop.active && n != nil && n.cfg.ReadsCapacity
}

// Running reports whether a probe loop runs for the provider.
func (q *Probes) Running() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.loop.active
}
