package pool

import (
	"context"
	"math/rand/v2"
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
// least one registration is left, on Clock, one probe at a time.
//
// A probe feeds the provider's health like a client's attempt: a passing
// probe is a success, a failing one a failure in the same window. While a
// loop runs, the trial after a cooldown is the probe's (see
// cooldown.Health.SetProbeTrials): the loop probes as soon as the cooldown
// has run out, and a passing probe makes the provider healthy again before
// any client is sent to it. A probe that reads capacity (browserless's
// /pressure) marks the provider full while it says so.
//
// What a probe costs the process: probe times are aligned on a grid, and
// the probes of all loops due at one time run together, from one timer
// (see probeBatches and runProbes).

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

// probeJitter picks the first probe's delay in [0, interval), so the
// probes of many providers spread over the interval; tests replace it.
var probeJitter = func(interval time.Duration) time.Duration {
	if interval <= 0 {
		return 0
	}
	return rand.N(interval)
}

// probeReg is one handler's registration.
type probeReg struct {
	owner any
	cfg   ProbeConfig
}

// probeLoop is the probe loop of one provider. Guarded by Provider.pmu.
type probeLoop struct {
	regs   []probeReg // the newest last
	active bool
	ctx    context.Context
	cancel context.CancelFunc
	// at is the batch of probes the loop's next one belongs to (nil:
	// none pending), seq the number of its place there: a place taken
	// before the last scheduling is void.
	at      *probeBatch
	seq     uint64
	due     time.Time // when the batch runs
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
	// job is the probe in flight (while running).
	job probeJob
}

func (l *probeLoop) newest() *probeReg {
	if len(l.regs) == 0 {
		return nil
	}
	return &l.regs[len(l.regs)-1]
}

// Probe registers, for owner (a handler), the provider's health check. The
// newest registration sets the loop's prober, interval and report; the
// loop starts with the first registration, at a random point of its first
// interval, and keeps its pace across later ones (a changed interval
// applies from the last probe's start).
func (p *Provider) Probe(owner any, cfg ProbeConfig) {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	l := &p.probe
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
		p.scheduleLocked(now().Add(probeJitter(cfg.Interval)))
		return
	}
	p.followNewestLocked()
}

// Unprobe removes owner's registration. With none left the loop stops: a
// probe in flight is called off, the trial after a cooldown goes back to
// clients, and the capacity read is forgotten (the provider is no longer
// full for it).
func (p *Provider) Unprobe(owner any) {
	p.pmu.Lock()
	l := &p.probe
	var removed Prober
	for i, r := range l.regs {
		if r.owner == owner {
			removed = r.cfg.Prober
			l.regs = append(l.regs[:i], l.regs[i+1:]...)
			break
		}
	}
	if removed == nil {
		p.pmu.Unlock()
		return
	}
	// Its kept connection closes once a probe it may be running is done.
	go removed.Close()
	if len(l.regs) > 0 {
		p.followNewestLocked()
		p.pmu.Unlock()
		return
	}
	l.active = false
	l.epoch++
	p.unscheduleLocked()
	l.cancel()
	wasFull := l.capacity != nil && l.capacity.Full
	l.capacity = nil
	p.learntMax.Store(0)
	p.capFull.Store(false)
	p.pmu.Unlock()
	p.Health.SetProbeTrials(false)
	if wasFull || p.Health.Available() {
		// No longer full for a probe, or its trial left to clients.
		p.Notify()
	}
}

// followNewestLocked applies a change of the newest registration's
// interval to the pending timer.
func (p *Provider) followNewestLocked() {
	l := &p.probe
	n := l.newest()
	if n.cfg.Interval == l.interval {
		return
	}
	l.interval = n.cfg.Interval
	if l.running {
		return // the probe's end schedules the next with it
	}
	t := now()
	next := l.lastStart.Add(l.interval)
	if l.lastStart.IsZero() {
		// The first probe keeps its time if that comes within the new
		// interval.
		next = l.due
		if next.Sub(t) > l.interval {
			next = t.Add(probeJitter(l.interval))
		}
	}
	if next.Before(t) {
		next = t
	}
	p.scheduleLocked(next)
}

// probeGrid is the most a probe's time is rounded up: probe times are
// aligned on a grid of a tenth of the interval (at most 100ms), so the
// timers of many providers due within one step fire together and the
// process wakes once for all of them instead of once each.
const probeGrid = 100 * time.Millisecond

// gridOf is the alignment step for a loop probing every interval.
func gridOf(interval time.Duration) time.Duration {
	return min(max(interval/10, time.Millisecond), probeGrid)
}

// scheduleLocked makes the loop's next probe due at t (rounded up to the
// grid), in the batch of the probes due then.
func (p *Provider) scheduleLocked(t time.Time) {
	l := &p.probe
	p.unscheduleLocked()
	if g := gridOf(l.interval); !t.Truncate(g).Equal(t) {
		t = t.Truncate(g).Add(g)
	}
	l.due = t
	l.seq++
	l.at = probeBatches.join(t, probeDue{p: p, seq: l.seq})
}

// unscheduleLocked voids the loop's pending probe, if any.
func (p *Provider) unscheduleLocked() {
	l := &p.probe
	if l.at != nil {
		probeBatches.leave(l.at)
		l.at = nil
	}
	l.seq++
}

// ProbeBy moves the next probe to t when that is sooner. The failover
// chain calls it with the end of a cooldown or skip it started, so the
// probe that is the trial runs as soon as it may.
func (p *Provider) ProbeBy(t time.Time) {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	l := &p.probe
	if !l.active || l.running || !t.Before(l.due) {
		return
	}
	p.scheduleLocked(t)
}

// Probe batches: the probes due at one time run together, on the goroutine
// of one timer. The grid makes most probes of many providers due
// together, so the process wakes once for all of them, and the probes of
// kept connections run in the batch without a goroutine or a wake-up each
// (see runProbes).
var probeBatches = batchSet{at: map[int64]*probeBatch{}}

// batchSet is the pending batches, by due time.
type batchSet struct {
	mu sync.Mutex
	at map[int64]*probeBatch
	// last is the batch last joined (most join the one before them
	// did); size, the places the last batch run had (a new one starts
	// with room for as many).
	last *probeBatch
	size int
}

// probeBatch is the probes due at one time.
type probeBatch struct {
	when  int64
	due   []probeDue
	live  int // places not left
	timer queue.Timer
	ran   bool
}

// probeDue is a loop's place in a batch: void unless the loop's seq still
// is the place's.
type probeDue struct {
	p   *Provider
	seq uint64
}

// join adds d to the batch due at t, made (with its timer) if there is
// none.
func (s *batchSet) join(t time.Time, d probeDue) *probeBatch {
	key := t.UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.last
	if b == nil || b.when != key {
		b = s.at[key]
	}
	if b == nil {
		b = &probeBatch{when: key, due: make([]probeDue, 0, s.size)}
		s.at[key] = b
		// The batch runs on the timer's own goroutine: handing it to a
		// probe worker would wake one more thread for each batch.
		b.timer = Clock.AfterFunc(max(t.Sub(now()), 0), b.run)
	}
	b.due = append(b.due, d)
	b.live++
	s.last = b
	return b
}

// leave gives up a place in b; a batch with none left is dropped, its
// timer stopped.
func (s *batchSet) leave(b *probeBatch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b.ran {
		return
	}
	if b.live--; b.live == 0 {
		b.timer.Stop()
		s.drop(b)
	}
}

// drop takes b out of the pending batches.
func (s *batchSet) drop(b *probeBatch) {
	b.ran = true
	if s.at[b.when] == b {
		delete(s.at, b.when)
	}
	if s.last == b {
		s.last = nil
	}
}

// run runs the probes of b that are still due.
func (b *probeBatch) run() {
	s := &probeBatches
	s.mu.Lock()
	if b.ran {
		s.mu.Unlock()
		return
	}
	s.drop(b)
	s.size = len(b.due)
	s.mu.Unlock()
	jobs := make([]*probeJob, 0, len(b.due))
	for _, d := range b.due {
		if j := d.p.fire(d.seq); j != nil {
			jobs = append(jobs, j)
		}
	}
	runProbes(jobs)
}

// probeJob is one probe to run.
type probeJob struct {
	p          *Provider
	ctx        context.Context
	epoch      uint64
	reg        probeReg
	permit     cooldown.Permit
	start, due time.Time
}

// fire takes the loop's place seq in the batch that runs: the probe to
// run, or nil when the place is void, a cooldown or skip still runs (the
// probe then waits for its end), or another trial is in flight.
func (p *Provider) fire(seq uint64) *probeJob {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	l := &p.probe
	if !l.active || l.seq != seq || l.running {
		return nil
	}
	l.at = nil
	t := now()
	permit, ok := p.Health.AcquireProbe()
	if !ok {
		if u := p.Health.Until(); u.After(t) {
			p.scheduleLocked(u)
			return nil
		}
		// Another trial is in flight (taken before the loop started):
		// look again after an interval.
		p.scheduleLocked(t.Add(l.interval))
		return nil
	}
	l.running = true
	// The pace follows the times the probes were due, not the moments
	// their timers ran: a late timer does not push the next probe back.
	due := l.due
	if due.After(t) {
		due = t
	}
	l.lastStart = due
	l.job = probeJob{p: p, ctx: l.ctx, epoch: l.epoch, reg: *l.newest(), permit: permit, start: t, due: due}
	return &l.job
}

// BatchProber is a Prober whose probe may run in two steps: Send writes
// the request and returns at once (false: the probe cannot run so, and
// Probe runs it); Collect ends the probe if its answer is already there
// (false: it is not); Finish ends it, waiting for the answer.
// *upstreams.Prober is one.
type BatchProber interface {
	Prober
	Send(ctx context.Context) bool
	Collect(ctx context.Context) (upstreams.ProbeResult, bool)
	Finish(ctx context.Context) upstreams.ProbeResult
	// Await waits at most d for the answer to begin to come; false when
	// it has not.
	Await(d time.Duration) bool
}

// runProbes runs the probes due together. Those a BatchProber may run in
// two steps are all sent first; then the batch waits, for at most
// probeAwait, for the answers, and reads and applies each in place as it
// is there, with no goroutine and no wake-up per probe: from a provider on
// loopback or a fast network, most answers come while the batch's other
// requests are sent. The rest wait on probe workers, as do the probes that
// dial (the first, or after the provider closed the kept connection),
// which may take their whole timeout.
func runProbes(jobs []*probeJob) {
	sent := jobs[:0]
	for _, j := range jobs {
		if bp, ok := j.reg.cfg.Prober.(BatchProber); ok && bp.Send(j.ctx) {
			sent = append(sent, j)
			continue
		}
		probeGo(j.probe)
	}
	// Wait for the answer to the last request sent (once it has come,
	// most others have), then read the answers in turn, waiting for one
	// not there yet: for at most probeAwait in all.
	end := time.Now().Add(probeAwait)
	if len(sent) > 0 {
		sent[len(sent)-1].reg.cfg.Prober.(BatchProber).Await(time.Until(end))
	}
	waiting := sent[:0]
	for _, j := range sent {
		bp := j.reg.cfg.Prober.(BatchProber)
		if d := time.Until(end); d > 0 {
			bp.Await(d)
		}
		if res, ok := bp.Collect(j.ctx); ok {
			j.p.applyProbe(j, res)
			continue
		}
		waiting = append(waiting, j)
	}
	for _, j := range waiting {
		probeGo(j.finish)
	}
}

// probeAwait is how long a batch waits for the answers not there yet,
// which then wait on probe workers: long enough for a provider on a fast
// network to answer the batch's requests, short enough that a slow one
// does not hold up the others' results (nor their ms in status).
const probeAwait = 5 * time.Millisecond

// probe runs the whole probe.
func (j *probeJob) probe() { j.p.applyProbe(j, j.reg.cfg.Prober.Probe(j.ctx)) }

// finish ends the probe sent, waiting for its answer.
func (j *probeJob) finish() { j.p.applyProbe(j, j.reg.cfg.Prober.(BatchProber).Finish(j.ctx)) }

// probeGo runs a probe on a probe worker; tests with a fake clock may run
// it in place.
var probeGo = onProbeWorker

// Probe workers: probes run on goroutines kept between probes, not on a
// short-lived goroutine each, whose stack would have to grow for every
// probe. A probe goes to an idle worker, or a new one; a worker idle for
// probeWorkerIdle ends.
var probeWork = make(chan func())

const probeWorkerIdle = 30 * time.Second

func onProbeWorker(f func()) {
	select {
	case probeWork <- f:
	default:
		go probeWorker(f)
	}
}

func probeWorker(f func()) {
	f()
	idle := time.NewTimer(probeWorkerIdle)
	defer idle.Stop()
	for {
		select {
		case f := <-probeWork:
			f()
			idle.Reset(probeWorkerIdle)
		case <-idle.C:
			return
		}
	}
}

// applyProbe applies a probe's result, tells the handler, and schedules
// the loop's next probe.
func (p *Provider) applyProbe(j *probeJob, res upstreams.ProbeResult) {
	// (The job is the loop's, reused by its next probe: read it before
	// the loop may go on.)
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
		p.SetLastError(o.Word)
		rep.Change = p.Health.Done(permit, cooldown.Failure, 0)
	}

	p.pmu.Lock()
	l := &p.probe
	stopped := !l.active || l.epoch != epoch
	if o.Kind != upstreams.ClientGone && !stopped {
		l.last = ProbeRecord{At: start, Outcome: o.Word, MS: float64(o.Elapsed.Microseconds()) / 1000}
		wasFull := l.capacity != nil && l.capacity.Full
		if pr := res.Pressure; pr != nil && o.Kind == upstreams.Success {
			l.capacity = &CapacityRecord{Running: pr.Running, Max: pr.MaxConcurrent, Queued: pr.Queued, Full: pr.Full()}
			p.learntMax.Store(int64(pr.MaxConcurrent))
		} else {
			l.capacity = nil
			p.learntMax.Store(0)
		}
		rep.CapacityFull = l.capacity != nil && l.capacity.Full
		rep.CapacityFreed = wasFull && !rep.CapacityFull
		p.capFull.Store(rep.CapacityFull)
	}
	var report func(ProbeReport)
	if n := l.newest(); n != nil && !stopped {
		report = n.cfg.Report
	}
	p.pmu.Unlock()

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

	p.pmu.Lock()
	defer p.pmu.Unlock()
	l.running = false
	if !l.active || l.newest() == nil {
		return
	}
	if l.epoch != epoch {
		// The loop was started again meanwhile; its first probe, whose
		// timer may have come while this one ran, goes now at the latest.
		p.scheduleLocked(later(l.due, now()))
		return
	}
	// The next probe: an interval after this one started, or at the end
	// of a cooldown or skip that runs now.
	next := due.Add(l.interval)
	if u := p.Health.Until(); !u.IsZero() {
		next = u
	}
	p.scheduleLocked(later(next, now()))
}

// later is the later of two times.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// LastProbe is the provider's last probe; false when it was never probed.
func (p *Provider) LastProbe() (ProbeRecord, bool) {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	if p.probe.last.At.IsZero() {
		return ProbeRecord{}, false
	}
	return p.probe.last, true
}

// Capacity is what the last capacity read said; false when there is none
// (no capacity check, or its last probe failed).
func (p *Provider) Capacity() (CapacityRecord, bool) {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	if p.probe.capacity == nil {
		return CapacityRecord{}, false
	}
	return *p.probe.capacity, true
}

// ReadsCapacity reports whether the provider's running health check reads
// its capacity.
func (p *Provider) ReadsCapacity() bool {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	n := p.probe.newest()
	return p.probe.active && n != nil && n.cfg.ReadsCapacity
}

// Probed reports whether a probe loop runs for the provider.
func (p *Provider) Probed() bool {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	return p.probe.active
}

// probeState is embedded in Provider.
type probeState struct {
	pmu   sync.Mutex
	probe probeLoop
}
