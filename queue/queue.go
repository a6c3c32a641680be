// Package queue owns the waiting policy of browser_failover: who waits, in
// what order, and who is woken when capacity comes back. It is pure logic
// over an injectable Clock and knows nothing of WebSockets or providers.
//
// The model:
//
//   - One Queue per process holds every waiting client in arrival order.
//   - A client waits in a Line: its handler's share of the queue, with the
//     handler's size and timeout. Lines only count and time; order is the
//     queue's.
//   - A waiter wants resources: opaque names the caller gives to whatever
//     can end its wait (a provider it may use, the client_limit key it is
//     held back by). It keeps its place while what it wants changes.
//   - Capacity coming back is an offer of one resource (Offer, OfferAt).
//     An offer wakes the longest-waiting sleeping waiter that wants that
//     resource; waiters that do not want it keep their place and are not
//     woken. An offer nobody takes is remembered, so a client that looked
//     for capacity before the offer and joins after it (Mark, then Join)
//     does not miss it, and neither does a waiter that was busy running its
//     own pass when it came. It is remembered only while such a client or
//     waiter is still there (a client that never joins gives its mark back
//     with Forget), and at most a bounded number of them: past that bound
//     the queue lets them go and wakes every client or waiter that could
//     have missed one, a wake too many rather than one too few. What the
//     queue remembers is so bounded by the clients under way, never by the
//     resources ever offered.
//   - A resource can be withdrawn (an operator drained the provider): a
//     waiter whose every resource is withdrawn is ended at once with
//     ErrUnavailable, since nothing it waits for can come.
//   - When a handler goes away (a config reload), Retire moves its waiters,
//     in place and with their deadlines, to the live line whose resources
//     overlap its own the most, and asks that line what each of them wants
//     now. A waiter with no such line, or which wants nothing there, ends
//     with ErrUnavailable.
//   - Newcomers do not barge: Contended tells whether anyone waits for a
//     resource, and a newcomer leaves such a resource to the waiters. One
//     that no waiter wants is the newcomer's at once.
//
// Life of a client, as the handler drives it:
//
//	mark := q.Mark()             // before its first pass
//	defer q.Forget(mark)         // whatever happens, the mark ends
//	run a pass (skipping contended resources); served? done
//	w, err := line.Join(mark, class, want, by)   // ends the mark; ErrFull, ErrUnavailable: answer
//	for {
//		if err := w.Wait(ctx, retryAt); err != nil { answer; return }
//		run a pass; served? w.Leave(); done
//	}
package queue

import (
	"container/list"
	"context"
	"errors"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

var (
	// ErrFull is returned by Join when the line holds its size of waiters,
	// or always when its size is 0 (queue off).
	ErrFull = errors.New("queue full")
	// ErrTimeout is returned by Wait once the waiter's deadline has passed.
	ErrTimeout = errors.New("queue timeout")
	// ErrUnavailable ends a wait that nothing can end any more: every
	// resource the waiter wants is withdrawn, or its line was retired with
	// no line to take it.
	ErrUnavailable = errors.New("nothing left to wait for")
	// ErrLeft is what Wait returns after Leave.
	ErrLeft = errors.New("left the queue")
)

// Queue is the process-wide line of waiting clients. It is safe for
// concurrent use.
type Queue struct {
	clock Clock

	// total mirrors waiters.Len() for a lock-free look.
	total atomic.Int64

	mu      sync.Mutex
	waiters list.List // of *Waiter, arrival order
	lines   []*Line   // live lines, oldest first
	wanted  map[string]int
	down    map[string]bool
	// seq numbers the offers that found nobody to wake. missed holds, by
	// the hash of a resource (seeded by missedSeed), the seq of its latest
	// such offer while something in held may still look at it: a hash,
	// not the name, so that no client key's text is kept, and two names
	// hashing alike cost a wake too many, never one too few.
	seq        uint64
	missed     map[uint64]uint64
	missedSeed maphash.Seed
	// held counts, by seq, what may still look at missed: marks neither
	// joined nor forgotten, and waiters running a pass (their ranAt).
	// Entries of missed not above its smallest seq are of no use to
	// anyone. nheld is the sum of its counts.
	held  map[uint64]int
	nheld int
	// lost is the seq of the latest missed offer let go of while something
	// held could still look at it: whatever holds an older seq counts it
	// as an offer of everything it wants.
	lost uint64
	// pruneAt is the size of missed at which it is pruned next.
	pruneAt int
	timers  map[string]*offerTimer
}

const (
	// minPruneAt is the smallest size of missed that is pruned: below it,
	// a prune would cost more than the entries it could drop.
	minPruneAt = 64
	// maxMissed is how many missed offers a prune keeps at most, or twice
	// as many as there are marks and running passes when that is more;
	// past it they are let go (lost).
	maxMissed = 1024
)

// offerTimer is a pending OfferAt of one resource.
type offerTimer struct {
	t    Timer
	when time.Time
}

// New returns an empty queue; a nil clock means RealClock().
func New(clock Clock) *Queue {
	if clock == nil {
		clock = RealClock()
	}
	return &Queue{
		clock:      clock,
		wanted:     map[string]int{},
		down:       map[string]bool{},
		missed:     map[uint64]uint64{},
		missedSeed: maphash.MakeSeed(),
		held:       map[uint64]int{},
		pruneAt:    minPruneAt,
		timers:     map[string]*offerTimer{},
	}
}

// Line is one handler's share of the queue: at most size waiters, each for
// at most timeout.
type Line struct {
	q         *Queue
	owner     any
	size      int
	timeout   time.Duration
	resources []string
	wants     WantsFunc

	n       int // guarded by q.mu
	retired bool
}

// WantsFunc tells what a waiter moved to a line wants there, from the class
// it joined with and what it wanted before; wake asks that it be woken at
// once (what it waited for does not exist in this line). The queue calls it, with its lock held, when it
// moves a waiter to this line: it must not call back into the queue.
type WantsFunc func(class any, before []string) (want []string, wake bool)

// NewLine adds a line for owner. resources are every resource its waiters
// may want (they decide where a retired line's waiters go); wants is used
// for waiters moved here from a retired line. size <= 0 turns waiting off.
func (q *Queue) NewLine(owner any, size int, timeout time.Duration, resources []string, wants WantsFunc) *Line {
	l := &Line{q: q, owner: owner, size: max(size, 0), timeout: timeout, resources: slices.Clone(resources), wants: wants}
	q.mu.Lock()
	q.lines = append(q.lines, l)
	q.mu.Unlock()
	return l
}

// Owner is what the line was created for.
func (l *Line) Owner() any { return l.owner }

// Size is the most waiters the line takes.
func (l *Line) Size() int { return l.size }

// Timeout is how long a waiter may wait after it joined.
func (l *Line) Timeout() time.Duration { return l.timeout }

// Len is the number of the line's waiters, including those running a pass.
func (l *Line) Len() int {
	l.q.mu.Lock()
	defer l.q.mu.Unlock()
	return l.n
}

// Mark is a client's place in the offers, taken before its first pass
// (Queue.Mark) and ended by Join or Forget. Until then the queue
// remembers the offers made since that nobody took.
type Mark struct {
	seq  uint64
	done bool // guarded by the queue's lock
}

// Mark returns a new mark. A client takes it before its first pass and
// hands it to Join: an offer of a resource it wants that nobody took in
// between wakes it as it joins. A client that does not join gives it back
// with Forget.
func (q *Queue) Mark() *Mark {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.holdLocked(q.seq)
	return &Mark{seq: q.seq}
}

// Forget ends mark m of this queue without a Join (the client was served
// at once, or answered). Forgetting a mark that Join or Forget already
// ended, or nil, does nothing.
func (q *Queue) Forget(m *Mark) {
	if m == nil {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.forgetLocked(m)
}

func (q *Queue) forgetLocked(m *Mark) {
	if m == nil || m.done {
		return
	}
	m.done = true
	q.releaseLocked(m.seq)
}

// holdLocked records that something may look at offers missed after seq.
func (q *Queue) holdLocked(seq uint64) {
	q.held[seq]++
	q.nheld++
}

// releaseLocked undoes one holdLocked(seq). Once nothing is held, no
// missed offer can matter to anyone.
func (q *Queue) releaseLocked(seq uint64) {
	if q.held[seq]--; q.held[seq] <= 0 {
		delete(q.held, seq)
	}
	q.nheld--
	if q.nheld == 0 && len(q.missed) > 0 {
		if len(q.missed) <= minPruneAt {
			clear(q.missed)
		} else {
			q.missed = map[uint64]uint64{} // a map never gives back its buckets
		}
		q.pruneAt = minPruneAt
	}
}

// pruneLocked drops the missed offers that nothing held can look at any
// more: those not after the smallest held seq. When more are left than
// it keeps, it lets them all go: whatever holds an older seq than the
// latest is then woken as if offered all it wants. The next prune comes
// once missed has doubled, so pruning costs O(1) an offer.
func (q *Queue) pruneLocked() {
	floor := q.seq
	for s := range q.held {
		floor = min(floor, s)
	}
	n := 0
	for _, s := range q.missed {
		if s > floor {
			n++
		}
	}
	var kept map[uint64]uint64
	if n > max(maxMissed, 2*q.nheld) {
		q.lost = q.seq
		kept = map[uint64]uint64{}
	} else {
		kept = make(map[uint64]uint64, n)
		for h, s := range q.missed {
			if s > floor {
				kept[h] = s
			}
		}
	}
	q.missed = kept
	q.pruneAt = max(minPruneAt, 2*len(kept), 2*len(q.held))
}

// Contended reports whether some waiter wants r: a newcomer leaves r to it.
func (q *Queue) Contended(r string) bool {
	if q.total.Load() == 0 {
		return false // nobody waits: no lock on the way of every upgrade
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.wanted[r] > 0
}

// Len is the number of waiters in every line.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waiters.Len()
}

// Join adds a waiter at the back of the queue, in line l. class is the
// caller's description of the client (handed to a line's WantsFunc after a
// reload); want is what it waits for now. mark is the client's Mark(),
// taken before its pass; Join ends it, whatever it returns (nil: no offer
// made before counts). by, when not zero and before the line's own
// timeout, is the waiter's deadline (a client that already waited
// elsewhere).
func (l *Line) Join(mark *Mark, class any, want []string, by time.Time) (*Waiter, error) {
	q := l.q
	q.mu.Lock()
	defer q.mu.Unlock()
	defer q.forgetLocked(mark) // after the look at what it missed
	if l.retired {
		return nil, ErrUnavailable
	}
	if l.size <= 0 || l.n >= l.size {
		return nil, ErrFull
	}
	if q.allDownLocked(want) {
		return nil, ErrUnavailable
	}
	now := q.clock.Now()
	w := &Waiter{q: q, line: l, class: class, joined: now, deadline: now.Add(l.timeout), signal: make(chan struct{}, 1)}
	if !by.IsZero() && by.Before(w.deadline) {
		w.deadline = by
	}
	l.n++
	w.elem = q.waiters.PushBack(w)
	q.total.Add(1)
	w.setWantLocked(want)
	if mark != nil && !mark.done && q.missedSinceLocked(want, mark.seq) {
		w.woken = true
		w.kick()
	}
	return w, nil
}

// Offer hands r to the longest-waiting sleeping waiter that wants it. An
// offer nobody takes is remembered for Join and for waiters busy with a
// pass.
func (q *Queue) Offer(r string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.offerLocked(r)
}

func (q *Queue) offerLocked(r string) {
	for e := q.waiters.Front(); e != nil; e = e.Next() {
		w := e.Value.(*Waiter)
		if w.woken || w.running || !slices.Contains(w.want, r) {
			continue
		}
		w.woken = true
		w.kick()
		return
	}
	q.seq++
	if q.nheld == 0 {
		return // no mark, no running pass: nobody could miss it
	}
	q.missed[maphash.String(q.missedSeed, r)] = q.seq
	if len(q.missed) > q.pruneAt {
		q.pruneLocked()
	}
}

// OfferAt offers r at t (at once when t is not after now). Of several
// pending times for one resource only the earliest is kept: the waiter
// woken then finds out whether the resource is back, and if not the caller
// asks again for the new time.
func (q *Queue) OfferAt(r string, t time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.clock.Now()
	if !t.After(now) {
		q.offerLocked(r)
		return
	}
	if p := q.timers[r]; p != nil {
		if !t.Before(p.when) {
			return
		}
		p.t.Stop()
	}
	p := &offerTimer{when: t}
	p.t = q.clock.AfterFunc(t.Sub(now), func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.timers[r] != p {
			return // superseded by an earlier time
		}
		delete(q.timers, r)
		q.offerLocked(r)
	})
	q.timers[r] = p
}

// Withdraw marks r as gone for now (a drained provider): every waiter that
// wants nothing else ends with ErrUnavailable.
func (q *Queue) Withdraw(r string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.down[r] {
		return
	}
	q.down[r] = true
	for e := q.waiters.Front(); e != nil; {
		next := e.Next()
		w := e.Value.(*Waiter)
		if len(w.want) > 0 && q.allDownLocked(w.want) {
			w.removeLocked(ErrUnavailable)
		}
		e = next
	}
}

// Restore undoes Withdraw and offers r.
func (q *Queue) Restore(r string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.down[r] {
		return
	}
	delete(q.down, r)
	q.offerLocked(r)
}

// Retire ends line l (its handler is going away). Each of its waiters
// keeps its place and deadline and moves to the live line sharing the most
// resources with l (ties: a line newer than l, the config that replaces
// it, then the oldest); that line's WantsFunc says what it wants there.
// Waiters with no line to go to, or that want nothing there, end with
// ErrUnavailable. Retire returns the resources some moved waiter wants
// now and did not want before, for the caller to offer those that have
// room: a reload that added a provider serves them at once. A resource a
// waiter already wanted is not among them: whatever gave it room offered
// it then (a raised limit offers itself when it is set), and a second
// offer of the same room could wake a later waiter to race the first.
func (q *Queue) Retire(l *Line) []string {
	return q.retire(l, true)
}

// Reshape is the line's owner changing what it serves while it runs (its
// handler found providers or lost some): the line's resources become
// resources, and the line's WantsFunc says what each of its waiters wants
// now; each keeps its place and deadline. A waiter that the WantsFunc asks
// to wake, or that wanted something and now wants nothing that can come
// (nothing, or only resources withdrawn), is woken to run a pass and learn
// where it stands (one running a pass now runs another at once). Reshape
// returns every resource the waiters want now, for the caller to offer
// those that have room.
func (l *Line) Reshape(resources []string) []string {
	q := l.q
	q.mu.Lock()
	defer q.mu.Unlock()
	l.resources = slices.Clone(resources)
	if l.retired || l.wants == nil {
		return nil
	}
	var offered []string
	for e := q.waiters.Front(); e != nil; e = e.Next() {
		w := e.Value.(*Waiter)
		if w.line != l {
			continue
		}
		want, wake := l.wants(w.class, w.want)
		lost := len(w.want) > 0 && (len(want) == 0 || q.allDownLocked(want))
		if !slices.Equal(want, w.want) {
			w.setWantLocked(want)
		}
		if wake || lost {
			w.woken = true
			if !w.running {
				w.kick()
			}
		}
		for _, r := range want {
			if !slices.Contains(offered, r) {
				offered = append(offered, r)
			}
		}
	}
	return offered
}

// Close ends line l without moving its waiters: each ends with
// ErrUnavailable (the process is exiting).
func (l *Line) Close() { l.q.retire(l, false) }

func (q *Queue) retire(l *Line, move bool) []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	if l.retired {
		return nil
	}
	l.retired = true
	pos := slices.Index(q.lines, l)
	if pos >= 0 {
		q.lines = slices.Delete(q.lines, pos, pos+1)
	}
	var next *Line
	best := 0
	for i, c := range q.lines {
		if !move {
			break
		}
		n := 0
		for _, r := range c.resources {
			if slices.Contains(l.resources, r) {
				n += 2
			}
		}
		if n > 0 && i >= pos {
			n++ // created after l: the config that replaces it
		}
		if n > best {
			next, best = c, n
		}
	}
	var offered []string
	for e := q.waiters.Front(); e != nil; {
		nextE := e.Next()
		w := e.Value.(*Waiter)
		e = nextE
		if w.line != l {
			continue
		}
		if next == nil || next.wants == nil {
			w.removeLocked(ErrUnavailable)
			continue
		}
		want, wake := next.wants(w.class, w.want)
		if len(want) == 0 || q.allDownLocked(want) {
			w.removeLocked(ErrUnavailable)
			continue
		}
		l.n--
		next.n++
		w.line = next
		before := w.want
		w.setWantLocked(want)
		if wake && !w.running {
			w.woken = true
			w.kick()
		}
		for _, r := range want {
			if !slices.Contains(before, r) && !slices.Contains(offered, r) {
				offered = append(offered, r)
			}
		}
	}
	return offered
}

// Waiter is one client's place in the queue.
type Waiter struct {
	q        *Queue
	class    any
	joined   time.Time
	deadline time.Time
	signal   chan struct{} // buffered 1: "look at your state again"

	// Guarded by q.mu.
	line    *Line
	elem    *list.Element // nil once removed
	err     error         // why it was removed
	want    []string
	woken   bool   // an offer was assigned to it and Wait has not taken it
	running bool   // Wait returned nil; its pass is under way
	ranAt   uint64 // q.seq when its pass began, held while running
	// retrying: it waits with a retryAt, retrying resources that no offer
	// will announce; leaving unserved, it hands that on.
	retrying bool
}

func (w *Waiter) kick() {
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// Line is the line the waiter is in now (a reload may have moved it).
func (w *Waiter) Line() *Line {
	w.q.mu.Lock()
	defer w.q.mu.Unlock()
	return w.line
}

// Want replaces what the waiter waits for, keeping its place (a client
// that got its client_limit share now waits for a provider). An offer of
// one of the new resources that nobody took since its pass began wakes it.
func (w *Waiter) Want(want []string) {
	q := w.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.elem == nil {
		return
	}
	w.setWantLocked(want)
}

func (w *Waiter) setWantLocked(want []string) {
	q := w.q
	for _, r := range w.want {
		if q.wanted[r]--; q.wanted[r] <= 0 {
			delete(q.wanted, r)
		}
	}
	w.want = slices.Clone(want)
	for _, r := range w.want {
		q.wanted[r]++
	}
}

func (q *Queue) allDownLocked(want []string) bool {
	if len(want) == 0 {
		return false
	}
	for _, r := range want {
		if !q.down[r] {
			return false
		}
	}
	return true
}

// missedSinceLocked reports whether an offer of something in want found
// nobody to wake after seq mark (or may have: see lost).
func (q *Queue) missedSinceLocked(want []string, mark uint64) bool {
	if len(want) > 0 && q.lost > mark {
		return true
	}
	for _, r := range want {
		if q.missed[maphash.String(q.missedSeed, r)] > mark {
			return true
		}
	}
	return false
}

// Wait blocks until the waiter may run a pass (nil): an offer woke it, or
// retryAt (zero: none) passed. Otherwise it returns the reason its wait
// ended, having left the queue: ErrTimeout at its deadline, ctx.Err() when
// the client went away, ErrUnavailable, or ErrLeft after Leave.
//
// Calling Wait after a pass that found nothing puts the waiter back to
// sleep in its place; an offer of something it wants that nobody took
// while it ran wakes it again at once.
//
// retryAt lets the waiter run a pass without an offer: the handler's
// once-a-second retry of providers that failed without cooling down, which
// no event announces.
//
// Precedence when several hold at once: removed, then deadline, then ctx,
// then an offer, then retryAt. So Wait never returns nil at or after the
// deadline, and a client that left is never served.
func (w *Waiter) Wait(ctx context.Context, retryAt time.Time) error {
	q := w.q
	q.mu.Lock()
	w.retrying = !retryAt.IsZero()
	if w.running {
		w.running = false
		if w.elem != nil && q.missedSinceLocked(w.want, w.ranAt) {
			w.woken = true
		}
		q.releaseLocked(w.ranAt)
	}
	done, err := w.checkLocked(ctx, retryAt)
	q.mu.Unlock()
	if done {
		return err
	}

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
	now := q.clock.Now()
	if !now.Before(w.deadline) {
		w.removeLocked(ErrTimeout)
		return true, ErrTimeout
	}
	if err := ctx.Err(); err != nil {
		w.removeLocked(err)
		return true, err
	}
	if w.woken || (!retryAt.IsZero() && !now.Before(retryAt)) {
		w.woken = false
		w.running = true
		w.ranAt = q.seq
		q.holdLocked(w.ranAt)
		return true, nil
	}
	return false, nil
}

// removeLocked takes w out of the queue; err is what Wait returns from now
// on. An offer it held and had not taken goes to the next waiter that
// wants one of its resources; so do its retries, when it leaves unserved
// while retrying.
func (w *Waiter) removeLocked(err error) {
	q := w.q
	if w.elem == nil {
		return
	}
	q.waiters.Remove(w.elem)
	q.total.Add(-1)
	w.elem = nil
	w.err = err
	w.line.n--
	want := w.want
	w.setWantLocked(nil)
	if w.woken || (w.retrying && err != ErrLeft) {
		w.woken = false
		for _, r := range want {
			q.offerLocked(r)
		}
	}
	if w.running {
		w.running = false
		q.releaseLocked(w.ranAt)
	}
	w.kick()
}

// Leave removes a waiter that got what it waited for (or an answer). It
// does nothing when the waiter was already removed.
func (w *Waiter) Leave() {
	w.q.mu.Lock()
	defer w.q.mu.Unlock()
	w.removeLocked(ErrLeft)
}

// Gone removes a waiter whose client went away while it was not waiting
// (during a pass): as for one that leaves its Wait for its context, what
// it was retrying goes to the next waiter that wants it. It does nothing
// when the waiter was already removed.
func (w *Waiter) Gone() {
	w.q.mu.Lock()
	defer w.q.mu.Unlock()
	w.removeLocked(context.Canceled)
}

// Deadline is when this waiter times out.
func (w *Waiter) Deadline() time.Time { return w.deadline }

// Joined is when it joined (for the waiting-time log and metric).
func (w *Waiter) Joined() time.Time { return w.joined }
