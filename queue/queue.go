// Package queue owns the per-handler waiting line of clients that found no
// usable provider: a bounded FIFO with a join deadline, wake-ups driven by
// the handler (Notify when a slot frees, WakeAt when a cooldown ends) and an
// injectable Clock. It knows nothing about WebSockets or providers; the
// handler runs the "pass" over providers whenever Wait lets it.
//
// Life of a waiter, as the handler drives it:
//
//	gen := q.Gen()              // before the first pass
//	if q.Len() == 0 { run pass; if ok { done } }
//	w, err := q.Join(gen)       // ErrFull / ErrClosed: answer 503
//	for {
//		if err := w.Wait(ctx, retryAt); err != nil { return err } // removed
//		run pass
//		if ok { w.Leave(); done }
//		// nothing found: loop, Wait puts the waiter back to sleep in place
//	}
//
// Every joined waiter must end either with Wait returning an error or with
// Leave; Wait and Leave of one waiter must not be called concurrently.
//
// Wake-ups: each Notify marks the first waiter that is neither woken nor
// running its pass. A Notify that finds nobody advances a generation counter,
// so a client that read Gen before its pass (or a waiter that was running its
// pass) re-delivers the missed wake-up when it joins (or goes back to sleep).
// Re-delivery wakes the first eligible waiter in line, which keeps FIFO; it
// may cause a spurious wake-up, which only costs one extra pass.
package queue

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"
)

var (
	// ErrFull is returned by Join when the queue holds Size waiters, or
	// always when Size is 0 (queue off).
	ErrFull = errors.New("queue full")
	// ErrTimeout is returned by Wait once the waiter's deadline has passed;
	// the waiter has been removed.
	ErrTimeout = errors.New("queue timeout")
	// ErrClosed is returned by Join and Wait after Close.
	ErrClosed = errors.New("queue closed")
)

// Queue is a FIFO of clients waiting for a provider. It is safe for
// concurrent use.
type Queue struct {
	size    int
	timeout time.Duration
	clock   Clock

	mu      sync.Mutex
	waiters list.List // of *Waiter, join order
	gen     uint64
	closed  bool

	// The single pending WakeAt timer (the earliest requested).
	wakeTimer Timer
	wakeWhen  time.Time
	wakeSeq   uint64
}

// New returns a queue holding at most size waiters, each for at most timeout
// after it joins. size <= 0 turns the queue off (Join always fails with
// ErrFull). A nil clock means RealClock().
func New(size int, timeout time.Duration, clock Clock) *Queue {
	if clock == nil {
		clock = RealClock()
	}
	if size < 0 {
		size = 0
	}
	return &Queue{size: size, timeout: timeout, clock: clock}
}

// Size returns the maximum number of waiters.
func (q *Queue) Size() int { return q.size }

// Timeout returns how long a waiter may wait after joining.
func (q *Queue) Timeout() time.Duration { return q.timeout }

// Len returns the number of waiters, including woken ones still running
// their pass. While it is non-zero, newcomers should join without running a
// pass of their own.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waiters.Len()
}

// Gen returns a counter that Notify advances. A client reads it before its
// pass and hands it to Join: if a Notify happened in between, the new waiter
// starts woken.
//
// Only a Notify that found no waiter to wake advances the counter; when Join
// sees a changed counter it wakes the first waiter in line that is not
// already woken, which is the joiner itself unless an earlier waiter sleeps.
func (q *Queue) Gen() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.gen
}

// Join adds a waiter at the back of the queue. gen is the value of Gen read
// before the client's pass. It fails with ErrClosed after Close and with
// ErrFull when Len() == Size().
func (q *Queue) Join(gen uint64) (*Waiter, error) {
	return q.JoinBy(gen, time.Time{})
}

// JoinBy is Join for a client that has already waited elsewhere: its
// deadline is by when that comes before the queue's own timeout (a zero by
// changes nothing).
func (q *Queue) JoinBy(gen uint64, by time.Time) (*Waiter, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, ErrClosed
	}
	if q.size <= 0 || q.waiters.Len() >= q.size {
		return nil, ErrFull
	}
	now := q.clock.Now()
	w := &Waiter{
		q:        q,
		joined:   now,
		deadline: now.Add(q.timeout),
		signal:   make(chan struct{}, 1),
	}
	if !by.IsZero() && by.Before(w.deadline) {
		w.deadline = by
	}
	w.elem = q.waiters.PushBack(w)
	if gen != q.gen {
		q.wakeFirstLocked()
	}
	return w, nil
}

// Notify wakes the first waiter not yet woken (or records the generation
// bump when none). Waiters running their pass count as woken. It does
// nothing after Close.
func (q *Queue) Notify() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.notifyLocked()
}

func (q *Queue) notifyLocked() {
	if q.closed {
		return
	}
	if !q.wakeFirstLocked() {
		q.gen++
	}
}

// wakeFirstLocked marks the first waiter that is neither woken nor running
// and signals it. It reports whether there was one.
func (q *Queue) wakeFirstLocked() bool {
	for e := q.waiters.Front(); e != nil; e = e.Next() {
		w := e.Value.(*Waiter)
		if w.woken || w.running {
			continue
		}
		w.woken = true
		w.kick()
		return true
	}
	return false
}

// WakeAt schedules a Notify at t; only the earliest pending one is kept; t
// in the past notifies now.
//
// A later t than the pending one is dropped: the waiter woken at the
// earlier time runs a pass and, if that finds nothing, the handler calls
// WakeAt again with the next cooldown end. A t not after Now notifies at
// once and leaves any pending timer alone. Does nothing after Close.
func (q *Queue) WakeAt(t time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	now := q.clock.Now()
	if !t.After(now) {
		q.notifyLocked()
		return
	}
	if q.wakeTimer != nil {
		if !t.Before(q.wakeWhen) {
			return
		}
		q.wakeTimer.Stop()
	}
	q.wakeSeq++
	seq := q.wakeSeq
	q.wakeWhen = t
	q.wakeTimer = q.clock.AfterFunc(t.Sub(now), func() { q.fireWake(seq) })
}

func (q *Queue) fireWake(seq uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if seq != q.wakeSeq || q.wakeTimer == nil {
		return // superseded or stopped after it had already fired
	}
	q.wakeTimer = nil
	q.wakeWhen = time.Time{}
	q.notifyLocked()
}

// Close is the handler's cleanup: every waiter is removed and its Wait (now
// or later) returns ErrClosed; later Joins return ErrClosed; the pending
// WakeAt timer is stopped. Close is idempotent.
func (q *Queue) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	q.closed = true
	if q.wakeTimer != nil {
		q.wakeTimer.Stop()
		q.wakeTimer = nil
		q.wakeSeq++
	}
	for e := q.waiters.Front(); e != nil; {
		next := e.Next()
		w := e.Value.(*Waiter)
		q.removeLocked(w, ErrClosed)
		w.kick()
		e = next
	}
}

// removeLocked takes w out of the line; err is what later Waits return.
func (q *Queue) removeLocked(w *Waiter, err error) {
	if w.elem == nil {
		return
	}
	q.waiters.Remove(w.elem)
	w.elem = nil
	w.err = err
}

// Waiter is one client's place in a Queue.
type Waiter struct {
	q        *Queue
	joined   time.Time
	deadline time.Time
	signal   chan struct{} // buffered 1: "look at your state again"

	// Guarded by q.mu.
	elem    *list.Element // nil once removed
	err     error         // why it was removed
	woken   bool          // a wake-up is assigned and not yet consumed by Wait
	running bool          // Wait returned nil; the pass is in progress
	gen     uint64        // q.gen when Wait last returned nil
}

func (w *Waiter) kick() {
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// Wait blocks until it is this waiter's turn to run a pass (nil), its
// retryAt passes (nil), ctx is done (ctx.Err(), waiter removed), the
// deadline passes (ErrTimeout, removed) or the queue closes (ErrClosed,
// removed).
//
// Calling Wait after a pass that found nothing puts the waiter back to sleep
// in its place (it keeps its position in line). If a Notify went unassigned
// while it ran its pass, the wake-up is re-delivered to the first sleeping
// waiter, usually itself.
//
// Precedence when several conditions hold at once: closed, then deadline,
// then ctx, then wake-up, then retryAt. So Wait never returns nil at or
// after the deadline, and a cancelled waiter is never served. A waiter
// removed while holding an unconsumed wake-up, or while first in line,
// wakes the next waiter.
//
// retryAt (zero means none) lets the waiter run a pass at that time even if
// it is not first in line and has not been woken. This is a deliberate,
// simple FIFO exception for the handler's once-a-second retry of providers
// that failed without cooling down: that pass only meets those providers.
// The retrying waiter does not lose its place and, while it runs, counts as
// woken (Notify skips it, as for any waiter running its pass).
//
// After the waiter has been removed (by an error or by Leave), Wait returns
// the removal error at once (ErrClosed after Leave).
func (w *Waiter) Wait(ctx context.Context, retryAt time.Time) error {
	q := w.q
	q.mu.Lock()
	if w.running {
		w.running = false
		if q.gen != w.gen {
			q.wakeFirstLocked()
		}
	}
	if done, err := w.checkLocked(ctx, retryAt); done {
		q.mu.Unlock()
		return err
	}
	q.mu.Unlock()

	now := q.clock.Now()
	if d := w.deadline.Sub(now); d > 0 {
		t := q.clock.AfterFunc(d, w.kick)
		defer t.Stop()
	}
	if !retryAt.IsZero() {
		if d := retryAt.Sub(now); d > 0 {
			t := q.clock.AfterFunc(d, w.kick)
			defer t.Stop()
		}
	}
	for {
		q.mu.Lock()
		done, err := w.checkLocked(ctx, retryAt)
		q.mu.Unlock()
		if done {
			return err
		}
		select {
		case <-w.signal:
		case <-ctx.Done():
		}
	}
}

// checkLocked decides whether Wait returns, removing the waiter on errors.
func (w *Waiter) checkLocked(ctx context.Context, retryAt time.Time) (bool, error) {
	q := w.q
	if w.elem == nil {
		return true, w.err
	}
	if q.closed { // not reached: Close removes everyone
		q.removeLocked(w, ErrClosed)
		return true, ErrClosed
	}
	now := q.clock.Now()
	if !now.Before(w.deadline) {
		w.leaveLocked(ErrTimeout)
		return true, ErrTimeout
	}
	if err := ctx.Err(); err != nil {
		w.leaveLocked(err)
		return true, err
	}
	if w.woken || (!retryAt.IsZero() && !now.Before(retryAt)) {
		w.woken = false
		w.running = true
		w.gen = q.gen
		return true, nil
	}
	return false, nil
}

// leaveLocked removes w and passes on a wake-up it had not consumed. The
// first in line leaving unserved also wakes the next: waiters that joined
// behind others never ran a pass of their own, so none of them holds the
// once-a-second retry (retryAt) the leaver may have held.
func (w *Waiter) leaveLocked(err error) {
	wasWoken := w.woken
	wasFirst := w.elem != nil && w.q.waiters.Front() == w.elem
	w.woken = false
	w.q.removeLocked(w, err)
	if wasWoken || wasFirst {
		w.q.wakeFirstLocked()
	}
}

// Leave removes a served waiter and wakes the next one.
//
// The cascade is unconditional (a freed cooldown may have made room for
// more than one client); if nobody is left to wake it is dropped, not
// recorded in Gen. Leave on a waiter already removed does nothing.
func (w *Waiter) Leave() {
	q := w.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.elem == nil {
		return
	}
	w.running = false
	w.woken = false
	q.removeLocked(w, ErrClosed)
	if !q.closed {
		q.wakeFirstLocked()
	}
}

// Deadline is when this waiter times out (join time + the queue's timeout).
func (w *Waiter) Deadline() time.Time { return w.deadline }

// Joined is when it joined (for the waiting-time log and metric).
func (w *Waiter) Joined() time.Time { return w.joined }
