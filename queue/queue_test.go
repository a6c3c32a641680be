package queue

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ---- fake clock ----

type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c    *fakeClock
	when time.Time
	f    func()
	done bool // fired or stopped
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
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
	c.removeLocked(t)
	return true
}

func (c *fakeClock) removeLocked(t *fakeTimer) {
	for i, x := range c.timers {
		if x == t {
			c.timers = append(c.timers[:i], c.timers[i+1:]...)
			return
		}
	}
}

// Advance moves the clock forward by d, firing due timers in time order
// (ties in creation order), each with the clock set to its due time. The
// callbacks run without the clock's lock held.
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
		c.removeLocked(next)
		if next.when.After(c.now) {
			c.now = next.when
		}
		c.mu.Unlock()
		next.f()
		c.mu.Lock()
	}
	c.now = target
	c.mu.Unlock()
}

// Pending is the number of timers neither fired nor stopped.
func (c *fakeClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// ---- helpers ----

const syncLimit = 5 * time.Second

// waitFor polls cond to synchronise with other goroutines; it never asserts
// timing, only that the state is reached within a generous bound.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(syncLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func recv(t *testing.T, what string, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(syncLimit):
		t.Fatalf("timed out waiting for: %s", what)
		return nil
	}
}

func startWait(w *Waiter, ctx context.Context, retryAt time.Time) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- w.Wait(ctx, retryAt) }()
	return ch
}

type wstate struct{ inQueue, woken, running bool }

func stateOf(w *Waiter) wstate {
	w.q.mu.Lock()
	defer w.q.mu.Unlock()
	return wstate{inQueue: w.elem != nil, woken: w.woken, running: w.running}
}

func sleeping(w *Waiter) bool {
	s := stateOf(w)
	return s.inQueue && !s.woken && !s.running
}

func mustJoin(t *testing.T, q *Queue) *Waiter {
	t.Helper()
	w, err := q.Join(q.Gen())
	if err != nil {
		t.Fatalf("Join: %v", err)
	}
	return w
}

func expectNil(t *testing.T, what string, ch <-chan error) {
	t.Helper()
	if err := recv(t, what, ch); err != nil {
		t.Fatalf("%s: got %v, want nil", what, err)
	}
}

func expectErr(t *testing.T, what string, ch <-chan error, want error) {
	t.Helper()
	if err := recv(t, what, ch); !errors.Is(err, want) {
		t.Fatalf("%s: got %v, want %v", what, err, want)
	}
}

// ---- tests ----

func TestFIFOOrder(t *testing.T) {
	clk := newFakeClock()
	q := New(100, time.Minute, clk)
	const n = 50
	type result struct {
		i   int
		err error
	}
	served := make(chan result, n)
	ws := make([]*Waiter, n)
	for i := range n {
		ws[i] = mustJoin(t, q)
		go func() { served <- result{i, ws[i].Wait(context.Background(), time.Time{})} }()
	}
	for i := range n {
		q.Notify()
		select {
		case r := <-served:
			if r.err != nil || r.i != i {
				t.Fatalf("Notify %d served waiter %d (err %v), want %d", i, r.i, r.err, i)
			}
		case <-time.After(syncLimit):
			t.Fatalf("Notify %d woke nobody", i)
		}
		if got := q.Len(); got != n {
			t.Fatalf("Len = %d while woken waiters run their pass, want %d", got, n)
		}
	}
	for _, w := range ws {
		w.Leave()
	}
	if q.Len() != 0 {
		t.Fatalf("Len = %d after all left", q.Len())
	}
	if p := clk.Pending(); p != 0 {
		t.Fatalf("%d timers leaked", p)
	}
}

func TestNewcomerDoesNotOvertakeWokenWaiter(t *testing.T) {
	clk := newFakeClock()
	q := New(10, time.Minute, clk)
	ctx := context.Background()
	a := mustJoin(t, q)
	chA := startWait(a, ctx, time.Time{})
	q.Notify()
	expectNil(t, "A woken", chA)

	// A runs its pass: it still counts, so a newcomer must queue.
	if q.Len() != 1 {
		t.Fatalf("Len = %d while A runs its pass, want 1", q.Len())
	}
	b := mustJoin(t, q)
	chB := startWait(b, ctx, time.Time{})
	waitFor(t, "B sleeping in Wait", func() bool { return clk.Pending() == 1 })

	// A's pass found nothing: back to sleep, keeping first place.
	chA = startWait(a, ctx, time.Time{})
	waitFor(t, "A back to sleep", func() bool { return sleeping(a) })
	q.Notify()
	expectNil(t, "A woken again before B", chA)
	if !sleeping(b) {
		t.Fatalf("B was woken ahead of A: %+v", stateOf(b))
	}
	a.Leave() // served; cascade wakes B
	expectNil(t, "B woken by A's Leave", chB)
	b.Leave()
	if q.Len() != 0 || clk.Pending() != 0 {
		t.Fatalf("Len %d, pending timers %d", q.Len(), clk.Pending())
	}
}

func TestRunningWaiterDoesNotMissNotify(t *testing.T) {
	q := New(10, time.Minute, newFakeClock())
	ctx := context.Background()
	a := mustJoin(t, q)
	q.Notify()
	if err := a.Wait(ctx, time.Time{}); err != nil {
		t.Fatal(err)
	}
	// While A runs its pass (which finds nothing), a slot frees.
	q.Notify()
	// Going back to sleep, A gets the wake-up re-delivered.
	if err := a.Wait(ctx, time.Time{}); err != nil {
		t.Fatalf("A missed a Notify during its pass: %v", err)
	}
	a.Leave()
}

func TestWakeAt(t *testing.T) {
	clk := newFakeClock()
	q := New(10, time.Minute, clk)
	ctx := context.Background()
	t0 := clk.Now()
	a := mustJoin(t, q)
	b := mustJoin(t, q)
	chA := startWait(a, ctx, time.Time{})
	chB := startWait(b, ctx, time.Time{})
	waitFor(t, "A and B in Wait", func() bool { return clk.Pending() == 2 })

	q.WakeAt(t0.Add(10 * time.Second))
	q.WakeAt(t0.Add(5 * time.Second))
	q.WakeAt(t0.Add(20 * time.Second))
	if clk.Pending() != 3 {
		t.Fatalf("pending timers = %d, want 2 deadlines + 1 WakeAt", clk.Pending())
	}
	q.mu.Lock()
	when := q.wakeWhen
	q.mu.Unlock()
	if !when.Equal(t0.Add(5 * time.Second)) {
		t.Fatalf("kept WakeAt %v, want the earliest (t0+5s)", when.Sub(t0))
	}

	clk.Advance(5*time.Second - 1)
	if !sleeping(a) {
		t.Fatal("A woken before the WakeAt time")
	}
	clk.Advance(1)
	expectNil(t, "A woken at cooldown end", chA)
	clk.Advance(20 * time.Second)
	if !sleeping(b) {
		t.Fatalf("B woken by a dropped (later) WakeAt: %+v", stateOf(b))
	}
	if clk.Pending() != 1 { // B's deadline only
		t.Fatalf("pending timers = %d, want 1", clk.Pending())
	}

	// A time in the past notifies at once; A runs its pass, so B is next.
	q.WakeAt(t0)
	expectNil(t, "B woken by past WakeAt", chB)
	a.Leave()
	b.Leave()

	// With nobody waiting, a WakeAt firing is remembered in Gen.
	g := q.Gen()
	q.WakeAt(clk.Now().Add(time.Second))
	clk.Advance(time.Second)
	if q.Gen() == g {
		t.Fatal("WakeAt with no waiter did not advance Gen")
	}
	if clk.Pending() != 0 {
		t.Fatalf("%d timers leaked", clk.Pending())
	}
}

func TestGenJoin(t *testing.T) {
	clk := newFakeClock()
	q := New(10, time.Minute, clk)
	ctx := context.Background()

	// No Notify in between: the joiner sleeps.
	w, err := q.Join(q.Gen())
	if err != nil {
		t.Fatal(err)
	}
	if !sleeping(w) {
		t.Fatalf("joined woken without a Notify: %+v", stateOf(w))
	}
	w.Leave()

	// A Notify between Gen and Join: the joiner starts woken.
	g := q.Gen()
	q.Notify()
	w, err = q.Join(g)
	if err != nil {
		t.Fatal(err)
	}
	if !stateOf(w).woken {
		t.Fatal("joiner missed the Notify that happened during its pass")
	}
	if err := w.Wait(ctx, time.Time{}); err != nil {
		t.Fatalf("Wait = %v, want nil at once", err)
	}
	w.Leave()

	// FIFO is kept: the missed wake-up goes to an earlier sleeping waiter.
	g = q.Gen()
	q.Notify()
	a := mustJoin(t, q) // read Gen after the Notify
	c, err := q.Join(g) // stale gen
	if err != nil {
		t.Fatal(err)
	}
	if !stateOf(a).woken || stateOf(c).woken {
		t.Fatalf("stale-gen join woke %+v / %+v, want the first waiter", stateOf(a), stateOf(c))
	}
	a.Leave()
	c.Leave()
}

func TestTimeout(t *testing.T) {
	clk := newFakeClock()
	q := New(10, time.Minute, clk)
	a := mustJoin(t, q)
	if !a.Deadline().Equal(a.Joined().Add(time.Minute)) || !a.Joined().Equal(clk.Now()) {
		t.Fatalf("Joined %v Deadline %v", a.Joined(), a.Deadline())
	}
	ch := startWait(a, context.Background(), time.Time{})
	waitFor(t, "A in Wait", func() bool { return clk.Pending() == 1 })
	clk.Advance(time.Minute - 1)
	if !sleeping(a) {
		t.Fatal("A left before its deadline")
	}
	clk.Advance(1)
	expectErr(t, "A at deadline", ch, ErrTimeout)
	if q.Len() != 0 || clk.Pending() != 0 {
		t.Fatalf("Len %d, pending timers %d", q.Len(), clk.Pending())
	}
	if err := a.Wait(context.Background(), time.Time{}); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Wait after removal = %v", err)
	}
}

func TestWokenAtDeadlineTimesOut(t *testing.T) {
	clk := newFakeClock()
	q := New(10, time.Minute, clk)
	ctx := context.Background()

	// A WakeAt due at the very deadline fires before the deadline timer.
	a := mustJoin(t, q)
	q.WakeAt(a.Deadline())
	ch := startWait(a, ctx, time.Time{})
	waitFor(t, "A in Wait", func() bool { return clk.Pending() == 2 })
	clk.Advance(time.Minute)
	expectErr(t, "A woken at its deadline", ch, ErrTimeout)

	// Woken (unconsumed) before the deadline, Wait called after it: still
	// ErrTimeout, and the wake-up passes to the next waiter.
	a = mustJoin(t, q)
	clk.Advance(30 * time.Second)
	b := mustJoin(t, q)
	q.Notify()
	if !stateOf(a).woken {
		t.Fatal("A not woken")
	}
	clk.Advance(30 * time.Second)
	if err := a.Wait(ctx, time.Time{}); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Wait after deadline = %v, want ErrTimeout", err)
	}
	if err := b.Wait(ctx, time.Time{}); err != nil {
		t.Fatalf("B did not inherit A's wake-up: %v", err)
	}
	// Also with a retryAt at/after the deadline.
	clk.Advance(time.Minute)
	if err := b.Wait(ctx, clk.Now()); !errors.Is(err, ErrTimeout) {
		t.Fatalf("retry after deadline = %v, want ErrTimeout", err)
	}
	if q.Len() != 0 || clk.Pending() != 0 {
		t.Fatalf("Len %d, pending timers %d", q.Len(), clk.Pending())
	}
}

func TestSize(t *testing.T) {
	clk := newFakeClock()
	q := New(2, 3*time.Second, clk)
	if q.Size() != 2 || q.Timeout() != 3*time.Second {
		t.Fatalf("Size %d Timeout %v", q.Size(), q.Timeout())
	}
	a := mustJoin(t, q)
	mustJoin(t, q)
	if _, err := q.Join(q.Gen()); !errors.Is(err, ErrFull) {
		t.Fatalf("third Join = %v, want ErrFull", err)
	}
	a.Leave()
	mustJoin(t, q)

	off := New(0, time.Second, clk)
	if _, err := off.Join(off.Gen()); !errors.Is(err, ErrFull) {
		t.Fatalf("size 0 Join = %v, want ErrFull", err)
	}
	if off.Len() != 0 {
		t.Fatal("size 0 queue holds a waiter")
	}
}

func TestCancel(t *testing.T) {
	clk := newFakeClock()
	q := New(10, time.Minute, clk)
	bg := context.Background()
	a, b, c := mustJoin(t, q), mustJoin(t, q), mustJoin(t, q)
	ctxB, cancelB := context.WithCancel(bg)
	chA := startWait(a, bg, time.Time{})
	chB := startWait(b, ctxB, time.Time{})
	chC := startWait(c, bg, time.Time{})
	waitFor(t, "all in Wait", func() bool { return clk.Pending() == 3 })

	cancelB()
	expectErr(t, "B cancelled", chB, context.Canceled)
	if q.Len() != 2 {
		t.Fatalf("Len = %d after cancel, want 2", q.Len())
	}
	if err := b.Wait(bg, time.Time{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter Wait again = %v", err)
	}
	q.Notify()
	expectNil(t, "A", chA)
	q.Notify()
	expectNil(t, "C (B skipped)", chC)
	a.Leave()
	c.Leave()

	// A wake-up consumed by a waiter that is then cancelled passes on.
	a, b = mustJoin(t, q), mustJoin(t, q)
	ctxA, cancelA := context.WithCancel(bg)
	q.Notify() // A woken, has not run its pass
	cancelA()
	if err := a.Wait(ctxA, time.Time{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("woken+cancelled Wait = %v, want Canceled (never served)", err)
	}
	if q.Len() != 1 || !stateOf(b).woken {
		t.Fatalf("wake-up not passed on: Len %d, B %+v", q.Len(), stateOf(b))
	}
	if err := b.Wait(bg, time.Time{}); err != nil {
		t.Fatal(err)
	}
	b.Leave()
	if q.Len() != 0 || clk.Pending() != 0 {
		t.Fatalf("Len %d, pending timers %d", q.Len(), clk.Pending())
	}
}

func TestLeaveCascades(t *testing.T) {
	clk := newFakeClock()
	q := New(10, time.Minute, clk)
	ctx := context.Background()
	ws := []*Waiter{mustJoin(t, q), mustJoin(t, q), mustJoin(t, q)}
	chs := make([]<-chan error, len(ws))
	for i, w := range ws {
		chs[i] = startWait(w, ctx, time.Time{})
	}
	q.Notify()
	for i, w := range ws {
		expectNil(t, "cascade", chs[i])
		for _, later := range ws[i+1:] {
			if !sleeping(later) {
				t.Fatalf("waiter after %d woken too early", i)
			}
		}
		w.Leave()
		if q.Len() != len(ws)-i-1 {
			t.Fatalf("Len = %d", q.Len())
		}
	}
	g := q.Gen()
	ws[0].Leave() // second Leave is a no-op
	if q.Gen() != g {
		t.Fatal("Leave with nobody left changed Gen")
	}
	if clk.Pending() != 0 {
		t.Fatalf("%d timers leaked", clk.Pending())
	}
}

func TestRetryAt(t *testing.T) {
	clk := newFakeClock()
	q := New(10, time.Minute, clk)
	ctx := context.Background()
	a, b := mustJoin(t, q), mustJoin(t, q)
	chA := startWait(a, ctx, time.Time{})
	chB := startWait(b, ctx, clk.Now().Add(time.Second))
	waitFor(t, "A and B in Wait", func() bool { return clk.Pending() == 3 })
	clk.Advance(time.Second)
	// B may retry although A is ahead and nobody was notified.
	expectNil(t, "B retry", chB)
	if !sleeping(a) {
		t.Fatal("retry woke A")
	}
	// B's pass finds nothing; back to sleep in its place (behind A).
	chB = startWait(b, ctx, time.Time{})
	waitFor(t, "B back to sleep", func() bool { return sleeping(b) && clk.Pending() == 2 })
	q.Notify()
	expectNil(t, "A first", chA)
	if !sleeping(b) {
		t.Fatal("B overtook A")
	}
	a.Leave()
	expectNil(t, "B after A", chB)
	b.Leave()

	// A retryAt already past returns at once.
	c := mustJoin(t, q)
	if err := c.Wait(ctx, clk.Now()); err != nil {
		t.Fatal(err)
	}
	c.Leave()
	if clk.Pending() != 0 {
		t.Fatalf("%d timers leaked", clk.Pending())
	}
}

func TestClose(t *testing.T) {
	clk := newFakeClock()
	q := New(10, time.Minute, clk)
	ctx := context.Background()
	a, b := mustJoin(t, q), mustJoin(t, q)
	q.Notify()
	if err := a.Wait(ctx, time.Time{}); err != nil { // A runs its pass
		t.Fatal(err)
	}
	chB := startWait(b, ctx, time.Time{})
	q.WakeAt(clk.Now().Add(time.Second))
	waitFor(t, "B in Wait", func() bool { return clk.Pending() == 2 })

	q.Close()
	expectErr(t, "sleeping waiter", chB, ErrClosed)
	if err := a.Wait(ctx, time.Time{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("running waiter's next Wait = %v", err)
	}
	a.Leave() // no-op
	if q.Len() != 0 {
		t.Fatalf("Len = %d after Close", q.Len())
	}
	if _, err := q.Join(q.Gen()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Join after Close = %v", err)
	}
	q.Notify()
	q.WakeAt(clk.Now().Add(time.Second))
	q.Close()
	if clk.Pending() != 0 {
		t.Fatalf("%d timers leaked", clk.Pending())
	}
}

func TestRealClockSmoke(t *testing.T) {
	q := New(2, 20*time.Millisecond, nil)
	w := mustJoin(t, q)
	if err := w.Wait(context.Background(), time.Time{}); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Wait = %v, want ErrTimeout", err)
	}
	q = New(2, time.Minute, RealClock())
	w = mustJoin(t, q)
	q.WakeAt(time.Now().Add(5 * time.Millisecond))
	if err := w.Wait(context.Background(), time.Time{}); err != nil {
		t.Fatalf("Wait = %v, want nil", err)
	}
	w.Leave()
	q.Close()
}

// TestStress runs 1,000 clients against a provider with 3 slots; a slot
// release calls Notify. Run with -race.
func TestStress(t *testing.T) {
	t.Run("no timeouts", func(t *testing.T) { stress(t, false) })
	t.Run("timeouts and cancels", func(t *testing.T) { stress(t, true) })
}

func stress(t *testing.T, churn bool) {
	const n, slots = 1000, 3
	before := runtime.NumGoroutine()
	clk := newFakeClock()
	q := New(n, 2*time.Second, clk)

	var mu sync.Mutex
	free := slots
	acquire := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if free > 0 {
			free--
			return true
		}
		return false
	}
	release := func() {
		mu.Lock()
		free++
		mu.Unlock()
		q.Notify()
	}

	served := make([]atomic.Int32, n)
	ended := make([]atomic.Int32, n) // timed out or cancelled
	var nServed, nTimeout, nCancel atomic.Int32
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			use := func() {
				served[i].Add(1)
				nServed.Add(1)
				if !churn {
					runtime.Gosched()
					release()
					return
				}
				// Hold the slot for 10ms of fake time: 3 slots serve
				// ~300 clients a second, so many of 1,000 time out.
				released := make(chan struct{})
				clk.AfterFunc(10*time.Millisecond, func() { release(); close(released) })
				<-released
			}
			gen := q.Gen()
			if q.Len() == 0 && acquire() {
				use()
				return
			}
			w, err := q.Join(gen)
			if err != nil {
				t.Errorf("client %d: Join: %v", i, err)
				return
			}
			ctx := context.Background()
			if churn && i%7 == 0 {
				c, cancel := context.WithCancel(ctx)
				defer cancel()
				tm := clk.AfterFunc(time.Duration(rand.IntN(2000))*time.Millisecond, cancel)
				defer tm.Stop()
				ctx = c
			}
			for {
				if err := w.Wait(ctx, time.Time{}); err != nil {
					ended[i].Add(1)
					switch {
					case errors.Is(err, ErrTimeout):
						nTimeout.Add(1)
					case errors.Is(err, context.Canceled):
						nCancel.Add(1)
					default:
						t.Errorf("client %d: Wait: %v", i, err)
					}
					return
				}
				if acquire() {
					w.Leave()
					use()
					return
				}
			}
		}()
	}

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	limit := time.After(60 * time.Second)
loop:
	for {
		select {
		case <-done:
			break loop
		case <-limit:
			t.Fatalf("stress did not finish: Len %d, served %d, timeouts %d", q.Len(), nServed.Load(), nTimeout.Load())
		default:
		}
		if churn {
			clk.Advance(time.Millisecond)
		}
		time.Sleep(50 * time.Microsecond)
	}

	for i := range n {
		if s, e := served[i].Load(), ended[i].Load(); s+e != 1 {
			t.Errorf("client %d: served %d times, ended %d times", i, s, e)
		}
	}
	if !churn && nServed.Load() != n {
		t.Errorf("served %d of %d without timeouts", nServed.Load(), n)
	}
	t.Logf("served %d, timed out %d, cancelled %d", nServed.Load(), nTimeout.Load(), nCancel.Load())
	if q.Len() != 0 {
		t.Errorf("Len = %d at the end", q.Len())
	}
	if free != slots {
		t.Errorf("free slots = %d, want %d", free, slots)
	}
	if p := clk.Pending(); p != 0 {
		t.Errorf("%d timers leaked", p)
	}
	waitFor(t, "goroutines to exit", func() bool { return runtime.NumGoroutine() <= before })
}
