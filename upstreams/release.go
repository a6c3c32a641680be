package upstreams

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Releases of provider sessions run here, off the request path: a
// process-wide releaser with a bounded number of calls in flight, each
// session tried up to ReleaseTries times, each call bounded by
// ReleaseTimeout. Submitting never blocks. Create calls in flight count
// as pending too, until what they created is released or handed to a
// connection, so that a process exit waits for them; StopCreates keeps
// new ones from starting.

// Release settings.
var (
	// ReleaseTries is how many calls one release makes at most.
	ReleaseTries = 3
	// ReleaseTimeout bounds one release call.
	ReleaseTimeout = 10 * time.Second
	// ReleaseBackoff is the wait before retry n (1, 2, …): n times it.
	ReleaseBackoff = time.Second
	// ReleaseConcurrency bounds the release calls in flight.
	ReleaseConcurrency = 8
	// ReleaseSleep waits between tries; tests replace it.
	ReleaseSleep = func(d time.Duration) { time.Sleep(d) }
	// OnReleaseFailure, when set, hears of each failed release call
	// (the provider's name and the cause, which never holds a secret).
	OnReleaseFailure func(provider string, err error)
)

type counter = atomic.Int64

// chanOnce is a sync.Once that reports whether this call was the first.
type chanOnce struct{ done atomic.Bool }

func (o *chanOnce) do() bool { return o.done.CompareAndSwap(false, true) }

type releaser struct {
	slots chan struct{}
	mu    sync.Mutex
	// pending counts releases submitted and not finished, and create
	// calls not settled.
	pending int
	idle    *sync.Cond
	// stopped: StopCreates was called; no create call starts.
	stopped bool
}

// ErrCreatesStopped is the error of an attempt refused, or given up after
// its create call answered, because StopCreates was called. Its Result
// has kind ClientGone (nothing counted against the provider).
var ErrCreatesStopped = errors.New("the gateway is shutting down: no provider session is created")

// StopCreates stops session-API attempts for good, at process exit: from
// now on an attempt at a provider with a session API ends at once, before
// its create call, with kind ClientGone and ErrCreatesStopped; a create
// call already in flight is still waited for by WaitReleases, and the
// session it creates is released, not dialed (its attempt ends the same
// way). Call it when the process begins to exit, before WaitReleases.
func StopCreates() {
	rel.mu.Lock()
	rel.stopped = true
	rel.mu.Unlock()
}

// AllowCreates undoes StopCreates (for tests, and for a process that
// goes on after all).
func AllowCreates() {
	rel.mu.Lock()
	rel.stopped = false
	rel.mu.Unlock()
}

// CreatesStopped reports whether StopCreates is in effect.
func CreatesStopped() bool {
	rel.mu.Lock()
	defer rel.mu.Unlock()
	return rel.stopped
}

func stoppedResult() Result {
	return Result{Outcome: Outcome{Word: WordClientGone, Kind: ClientGone, Err: ErrCreatesStopped}}
}

// startCreate counts a create call about to start as pending; ok is false
// once creates are stopped. settled, called when what the call created is
// released (submitted) or handed on, ends the count; calls after the
// first do nothing.
func (r *releaser) startCreate() (settled func(), ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return nil, false
	}
	r.pending++
	var once sync.Once
	return func() { once.Do(r.finished) }, true
}

// finished ends one pending count.
func (r *releaser) finished() {
	r.mu.Lock()
	r.pending--
	if r.pending == 0 {
		r.idle.Broadcast()
	}
	r.mu.Unlock()
}

var rel = func() *releaser {
	r := &releaser{}
	r.idle = sync.NewCond(&r.mu)
	return r
}()

func (r *releaser) submit(s *Remote) {
	r.mu.Lock()
	if r.slots == nil {
		n := ReleaseConcurrency
		if n < 1 {
			n = 1
		}
		r.slots = make(chan struct{}, n)
	}
	slots := r.slots
	r.pending++
	r.mu.Unlock()
	go func() {
		defer r.finished()
		slots <- struct{}{}
		defer func() { <-slots }()
		s.run()
	}()
}

// run releases s: up to ReleaseTries calls, waiting n×ReleaseBackoff before
// try n+1.
func (s *Remote) run() {
	b := s.api.books
	for try := 1; try <= ReleaseTries; try++ {
		if try > 1 {
			ReleaseSleep(time.Duration(try-1) * ReleaseBackoff)
		}
		ctx, cancel := context.WithTimeout(context.Background(), ReleaseTimeout)
		ok, err := s.release(ctx)
		cancel()
		if ok {
			b.Released.Add(1)
			return
		}
		b.ReleaseFailures.Add(1)
		if f := OnReleaseFailure; f != nil {
			f(s.api.provider, err)
		}
	}
}

// PendingReleases is the number of releases not finished yet, create
// calls in flight included.
func PendingReleases() int {
	rel.mu.Lock()
	defer rel.mu.Unlock()
	return rel.pending
}

// WaitReleases waits until every submitted release has finished, and
// every create call in flight has answered and what it created has been
// released or handed to a connection, or until the deadline passes; it
// reports whether all finished.
func WaitReleases(deadline time.Time) bool {
	t := time.AfterFunc(time.Until(deadline), func() {
		rel.mu.Lock()
		rel.idle.Broadcast()
		rel.mu.Unlock()
	})
	defer t.Stop()
	rel.mu.Lock()
	defer rel.mu.Unlock()
	for rel.pending > 0 && time.Now().Before(deadline) {
		rel.idle.Wait()
	}
	return rel.pending == 0
}
