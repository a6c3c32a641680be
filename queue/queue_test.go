package queue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
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

func mustJoin(t *testing.T, l *Line, want ...string) *Waiter {
	t.Helper()
	w, err := l.Join(l.q.Mark(), nil, want, time.Time{})
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

// asleep starts w's Wait and waits until it sleeps.
func asleep(t *testing.T, w *Waiter) <-chan error {
	t.Helper()
	ch := startWait(w, context.Background(), time.Time{})
	waitFor(t, "waiter asleep", func() bool { return sleeping(w) })
	return ch
}

// noResult checks that a Wait has not returned.
func noResult(t *testing.T, what string, ch <-chan error) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("%s: Wait returned %v, want still waiting", what, err)
	case <-time.After(20 * time.Millisecond):
	}
}

// ---- tests ----

// TestOfferGoesToLongestWaitingThatCanUseIt: an offer of a resource wakes
// the first waiter that wants it; one ahead that wants something else keeps
// its place, asleep.
func TestOfferGoesToLongestWaitingThatCanUseIt(t *testing.T) {
	q := New(newFakeClock())
	l := q.NewLine("h", 10, time.Minute, []string{"cdp", "pw"}, nil)
	cdp1 := mustJoin(t, l, "cdp")
	pw1 := mustJoin(t, l, "pw")
	cdp2 := mustJoin(t, l, "cdp")
	pw2 := mustJoin(t, l, "pw")
	chs := map[*Waiter]<-chan error{}
	for _, w := range []*Waiter{cdp1, pw1, cdp2, pw2} {
		chs[w] = asleep(t, w)
	}
	q.Offer("pw")
	expectNil(t, "first pw waiter", chs[pw1])
	if !sleeping(cdp1) || !sleeping(cdp2) || !sleeping(pw2) {
		t.Fatal("a waiter that cannot use pw, or a later pw waiter, was woken")
	}
	pw1.Leave()
	q.Offer("pw")
	expectNil(t, "second pw waiter", chs[pw2])
	q.Offer("cdp")
	expectNil(t, "first cdp waiter", chs[cdp1])
	if !sleeping(cdp2) {
		t.Fatal("second cdp waiter woken by one offer")
	}
	pw2.Leave()
	cdp1.Leave()
	cdp2.Leave()
	expectErr(t, "left", chs[cdp2], ErrLeft)
	if l.Len() != 0 || q.Len() != 0 {
		t.Fatalf("Len %d/%d after everyone left", l.Len(), q.Len())
	}
}

// TestWaiterWantingSeveral: a waiter that can use either of two resources
// is woken by an offer of either, in its turn.
func TestWaiterWantingSeveral(t *testing.T) {
	q := New(newFakeClock())
	l := q.NewLine("h", 10, time.Minute, []string{"a", "b"}, nil)
	both := mustJoin(t, l, "a", "b")
	onlyB := mustJoin(t, l, "b")
	chBoth, chB := asleep(t, both), asleep(t, onlyB)
	q.Offer("b")
	expectNil(t, "the older waiter, which can use b too", chBoth)
	if !sleeping(onlyB) {
		t.Fatal("the younger waiter was woken too")
	}
	both.Leave()
	q.Offer("b")
	expectNil(t, "b-only waiter", chB)
	onlyB.Leave()
}

// TestMissedOfferWakesJoiner: an offer made between a client's Mark and
// its Join, that nobody took, wakes it as it joins; an offer of something
// it does not want does not.
func TestMissedOfferWakesJoiner(t *testing.T) {
	q := New(newFakeClock())
	l := q.NewLine("h", 10, time.Minute, []string{"a", "b"}, nil)
	markA, markB := q.Mark(), q.Mark()
	q.Offer("b")
	wa, err := l.Join(markA, nil, []string{"a"}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if stateOf(wa).woken {
		t.Fatal("an offer of b woke a waiter that wants only a")
	}
	wb, err := l.Join(markB, nil, []string{"b"}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if !stateOf(wb).woken {
		t.Fatal("the missed offer of b did not wake the joiner")
	}
	// An offer older than the mark is history.
	wb2, _ := l.Join(q.Mark(), nil, []string{"b"}, time.Time{})
	if stateOf(wb2).woken {
		t.Fatal("an offer before the mark woke the joiner")
	}
	wa.Leave()
	wb.Leave()
	wb2.Leave()
}

// TestRunningWaiterDoesNotMissOffer: an offer made while the only waiter
// that wants it is running its pass wakes it again when it goes back to
// sleep.
func TestRunningWaiterDoesNotMissOffer(t *testing.T) {
	q := New(newFakeClock())
	l := q.NewLine("h", 10, time.Minute, []string{"a"}, nil)
	w := mustJoin(t, l, "a")
	ch := asleep(t, w)
	q.Offer("a")
	expectNil(t, "woken", ch)
	q.Offer("a") // while it runs: nobody to take it
	expectNil(t, "woken again at once", startWait(w, context.Background(), time.Time{}))
	ch = startWait(w, context.Background(), time.Time{})
	waitFor(t, "asleep", func() bool { return sleeping(w) })
	w.Leave()
	expectErr(t, "left", ch, ErrLeft)
}

// TestOfferAt: a timed offer fires at its time; only the earliest pending
// time of a resource is kept; a time in the past offers at once.
func TestOfferAt(t *testing.T) {
	clk := newFakeClock()
	q := New(clk)
	l := q.NewLine("h", 10, time.Minute, []string{"a", "b"}, nil)
	wa := mustJoin(t, l, "a")
	wb := mustJoin(t, l, "b")
	cha, chb := asleep(t, wa), asleep(t, wb)
	now := clk.Now()
	q.OfferAt("a", now.Add(10*time.Second))
	q.OfferAt("a", now.Add(5*time.Second))  // earlier: replaces
	q.OfferAt("a", now.Add(20*time.Second)) // later: dropped
	q.OfferAt("b", now.Add(7*time.Second))
	clk.Advance(4 * time.Second)
	noResult(t, "a before 5s", cha)
	clk.Advance(time.Second)
	expectNil(t, "a at 5s", cha)
	if !sleeping(wb) {
		t.Fatal("b woken by a's offer")
	}
	clk.Advance(2 * time.Second)
	expectNil(t, "b at 7s", chb)
	q.OfferAt("a", now) // in the past
	if !stateOf(wa).woken && !stateOf(wa).running {
		t.Fatal("an offer in the past did not count")
	}
	wa.Leave()
	wb.Leave()
	clk.Advance(time.Minute)
	if p := clk.Pending(); p != 0 {
		t.Fatalf("%d timers left", p)
	}
}

// TestWithdrawEndsWaitersWithNothingLeft: draining every resource a waiter
// could use ends its wait at once; a waiter with another resource stays;
// Restore offers the resource again.
func TestWithdrawEndsWaitersWithNothingLeft(t *testing.T) {
	q := New(newFakeClock())
	l := q.NewLine("h", 10, time.Minute, []string{"a", "b"}, nil)
	onlyA := mustJoin(t, l, "a")
	ab := mustJoin(t, l, "a", "b")
	chA, chAB := asleep(t, onlyA), asleep(t, ab)
	q.Withdraw("a")
	expectErr(t, "a-only waiter", chA, ErrUnavailable)
	if !sleeping(ab) {
		t.Fatal("a waiter that can still use b was ended or woken")
	}
	if _, err := l.Join(q.Mark(), nil, []string{"a"}, time.Time{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Join wanting only a drained resource: %v", err)
	}
	q.Withdraw("b")
	expectErr(t, "a+b waiter once b is drained too", chAB, ErrUnavailable)
	w := mustJoin(t, l, "c")
	ch := asleep(t, w)
	q.Restore("a")
	if !sleeping(w) {
		t.Fatal("restoring a woke a waiter for c")
	}
	w.Want([]string{"a"})
	q.Restore("b")
	q.Withdraw("a")
	expectErr(t, "waiter moved to a, which was withdrawn", ch, ErrUnavailable)
	if l.Len() != 0 {
		t.Fatalf("Len %d", l.Len())
	}
}

// TestRetireMovesWaitersInOrder: a reload moves the waiters of a retired
// line to the line sharing most resources, in order, keeping deadlines; the
// new line says what each wants; waiters with nowhere to go end.
func TestRetireMovesWaitersInOrder(t *testing.T) {
	clk := newFakeClock()
	q := New(clk)
	old := q.NewLine("old", 10, time.Minute, []string{"a", "b"}, nil)
	w1 := mustJoin(t, old, "a")
	clk.Advance(time.Second)
	w2 := mustJoin(t, old, "b")
	w3 := mustJoin(t, old, "a")
	ch1, ch2, ch3 := asleep(t, w1), asleep(t, w2), asleep(t, w3)
	deadline := w1.Deadline()

	q.NewLine("other", 10, time.Minute, []string{"z"}, nil)
	wants := func(class any, _ []string) ([]string, bool) {
		if class == "gone" {
			return nil, false
		}
		return []string{"a", "c"}, false
	}
	next := q.NewLine("next", 5, 2*time.Minute, []string{"a", "b", "c"}, wants)
	offered := q.Retire(old)
	if len(offered) != 2 {
		t.Fatalf("offered %v, want a and c", offered)
	}
	if old.Len() != 0 || next.Len() != 3 {
		t.Fatalf("old %d next %d", old.Len(), next.Len())
	}
	if w1.Line() != next || w1.Deadline() != deadline {
		t.Fatal("moved waiter lost its line or deadline")
	}
	// Order is kept: the first offer of a goes to w1, then w2 (which now
	// wants a and c), then w3.
	q.Offer("c")
	expectNil(t, "w1 first", ch1)
	q.Offer("a")
	expectNil(t, "w2 second", ch2)
	if !sleeping(w3) {
		t.Fatal("w3 woken out of turn")
	}
	w1.Leave()
	w2.Leave()
	q.Offer("a")
	expectNil(t, "w3", ch3)
	w3.Leave()
	if _, err := old.Join(q.Mark(), nil, []string{"a"}, time.Time{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Join on a retired line: %v", err)
	}

	// Nowhere to go, or nothing wanted there: ErrUnavailable.
	w4 := mustJoin(t, next, "a")
	w5, _ := next.Join(q.Mark(), "gone", []string{"a"}, time.Time{})
	ch4, ch5 := asleep(t, w4), asleep(t, w5)
	last := q.NewLine("last", 5, time.Minute, []string{"a"}, wants)
	q.Retire(next)
	expectErr(t, "class with nothing in the new line", ch5, ErrUnavailable)
	if w4.Line() != last || !sleeping(w4) {
		t.Fatal("w4 not moved")
	}
	q.Retire(last)
	expectErr(t, "no line left", ch4, ErrUnavailable)
}

// TestRetireOffersOnlyWhatIsNew: a reload whose provider's limit grew has
// offered the room itself, to the first waiter; Retire does not hand the
// resources its waiters already wanted back for a second offer, which
// would wake the second waiter to race the first for the one slot (a
// resource a moved waiter wants for the first time, a provider added, is
// handed back: TestRetireMovesWaitersInOrder).
func TestRetireOffersOnlyWhatIsNew(t *testing.T) {
	q := New(newFakeClock())
	old := q.NewLine("old", 10, time.Minute, []string{"a"}, nil)
	w1 := mustJoin(t, old, "a")
	w2 := mustJoin(t, old, "a")
	ch1, ch2 := asleep(t, w1), asleep(t, w2)
	q.Offer("a") // the limit grew while the new config was provisioned
	expectNil(t, "w1, offered the room", ch1)
	q.NewLine("new", 10, time.Minute, []string{"a"}, func(any, []string) ([]string, bool) { return []string{"a"}, false })
	offered := q.Retire(old)
	if len(offered) != 0 {
		t.Fatalf("Retire handed back %v for another offer, want nothing", offered)
	}
	if !sleeping(w2) {
		t.Fatal("w2 woken while w1 holds the one offer of a")
	}
	noResult(t, "w2", ch2)
	w1.Leave()
	w2.Leave()
}

// TestRetirePrefersNewerLine: of two lines sharing as much with the retired
// one, the newer (the replacing config) takes its waiters; Close moves
// nobody.
func TestRetirePrefersNewerLine(t *testing.T) {
	q := New(newFakeClock())
	keep := func(_ any, before []string) ([]string, bool) { return before, false }
	older := q.NewLine("older", 10, time.Minute, []string{"a"}, keep)
	old := q.NewLine("old", 10, time.Minute, []string{"a"}, keep)
	newer := q.NewLine("newer", 10, time.Minute, []string{"a"}, keep)
	w := mustJoin(t, old, "a")
	ch := asleep(t, w)
	q.Retire(old)
	if w.Line() != newer {
		t.Fatalf("moved to %v, want the newer line", w.Line().Owner())
	}
	_ = older
	newer.Close()
	expectErr(t, "closed line", ch, ErrUnavailable)
}

// TestRetireWake: a moved waiter whose line says wake runs a pass at once.
func TestRetireWake(t *testing.T) {
	q := New(newFakeClock())
	old := q.NewLine("old", 10, time.Minute, []string{"a"}, nil)
	w := mustJoin(t, old, "key")
	ch := asleep(t, w)
	q.NewLine("new", 10, time.Minute, []string{"a"}, func(any, []string) ([]string, bool) { return []string{"a"}, true })
	q.Retire(old)
	expectNil(t, "woken by the move", ch)
	w.Leave()
}

// TestReshape: a line whose owner's resources change asks what each of
// its waiters wants now; each keeps its place, an offer of a new resource
// wakes the first that wants it, a waiter left with nothing it can get is
// woken to find out, one that lost nothing sleeps on, and a waiter
// running a pass runs another.
func TestReshape(t *testing.T) {
	q := New(newFakeClock())
	have := []string{"a"}
	wants := func(class any, before []string) ([]string, bool) {
		if class == "quota" {
			return before, false
		}
		if class == "only-a" {
			if slices.Contains(have, "a") {
				return []string{"a"}, false
			}
			return nil, false
		}
		return slices.Clone(have), false
	}
	l := q.NewLine("h", 10, time.Minute, []string{"a"}, wants)
	join := func(class string, want ...string) *Waiter {
		w, err := l.Join(q.Mark(), class, want, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	w1 := join("any", "a")
	w2 := join("only-a", "a")
	w3 := join("quota", "key")
	w4 := join("any") // came when nothing was there
	ch1, ch2, ch3, ch4 := asleep(t, w1), asleep(t, w2), asleep(t, w3), asleep(t, w4)

	// b appears: those that may use it want it, in their places.
	have = []string{"a", "b"}
	offered := l.Reshape([]string{"a", "b", "found"})
	if !slices.Contains(offered, "a") || !slices.Contains(offered, "b") || !slices.Contains(offered, "key") {
		t.Fatalf("offered %v", offered)
	}
	if !sleeping(w1) || !sleeping(w2) || !sleeping(w3) || !sleeping(w4) {
		t.Fatal("a waiter woken by a resource added")
	}
	q.Offer("b")
	expectNil(t, "w1, first to want b", ch1)
	q.Offer("b")
	expectNil(t, "w4, next to want b (w2 may use a only, w3 waits for its key)", ch4)
	noResult(t, "w2", ch2)
	noResult(t, "w3", ch3)

	// a goes: w1 (running its pass) still wants b, and runs its pass
	// to its end; w2 may use nothing now, and is woken to find out.
	have = []string{"b"}
	l.Reshape([]string{"b", "found"})
	expectNil(t, "w2, left wanting nothing", ch2)
	noResult(t, "w3", ch3)
	if !slices.Equal(w1.want, []string{"b"}) || !slices.Equal(w4.want, []string{"b"}) {
		t.Fatalf("w1 wants %v, w4 %v: want b", w1.want, w4.want)
	}
	ch1 = startWait(w1, context.Background(), time.Time{})
	waitFor(t, "w1 asleep again", func() bool { return sleeping(w1) })

	// b goes too: w4, running its pass, is left with nothing and runs
	// another at once; w1, asleep, is woken; w3 waits for its key.
	have = nil
	l.Reshape([]string{"found"})
	expectNil(t, "w1, left wanting nothing", ch1)
	expectNil(t, "w4, woken during its pass: runs another at once", startWait(w4, context.Background(), time.Time{}))
	noResult(t, "w3", ch3)
	if len(l.resources) != 1 || l.resources[0] != "found" {
		t.Fatalf("the line's resources: %v", l.resources)
	}
	for _, w := range []*Waiter{w1, w2, w3, w4} {
		w.Leave()
	}
}

// TestContended: newcomers leave a resource anyone waits for to them.
func TestContended(t *testing.T) {
	q := New(newFakeClock())
	l := q.NewLine("h", 10, time.Minute, []string{"a", "b"}, nil)
	if q.Contended("a") {
		t.Fatal("contended with nobody waiting")
	}
	w := mustJoin(t, l, "a")
	if !q.Contended("a") || q.Contended("b") {
		t.Fatal("Contended wrong with one waiter for a")
	}
	w.Want([]string{"b"})
	if q.Contended("a") || !q.Contended("b") {
		t.Fatal("Contended wrong after Want")
	}
	w.Leave()
	if q.Contended("b") {
		t.Fatal("contended after the waiter left")
	}
}

// TestTimeout: a waiter ends at its deadline, never served at or after it;
// an offer it held goes to the next waiter that wants it.
func TestTimeout(t *testing.T) {
	clk := newFakeClock()
	q := New(clk)
	l := q.NewLine("h", 10, time.Second, []string{"a"}, nil)
	w1 := mustJoin(t, l, "a")
	clk.Advance(500 * time.Millisecond)
	w2 := mustJoin(t, l, "a")
	ch2 := asleep(t, w2)
	// w1 is woken but does not run before its deadline.
	q.Offer("a")
	clk.Advance(500 * time.Millisecond)
	expectErr(t, "woken but past its deadline", startWait(w1, context.Background(), time.Time{}), ErrTimeout)
	expectNil(t, "its offer passed on", ch2)
	w2.Leave()
	if l.Len() != 0 {
		t.Fatal("Len")
	}
	// JoinBy deadline: an earlier one wins.
	by := clk.Now().Add(100 * time.Millisecond)
	w3, _ := l.Join(q.Mark(), nil, []string{"a"}, by)
	if !w3.Deadline().Equal(by) {
		t.Fatal("deadline by not kept")
	}
	ch3 := startWait(w3, context.Background(), time.Time{})
	waitFor(t, "asleep", func() bool { return sleeping(w3) })
	clk.Advance(100 * time.Millisecond)
	expectErr(t, "deadline by", ch3, ErrTimeout)
}

// TestCancel: a client that goes away leaves at once and passes on an
// offer it held.
func TestCancel(t *testing.T) {
	q := New(newFakeClock())
	l := q.NewLine("h", 10, time.Minute, []string{"a"}, nil)
	w1 := mustJoin(t, l, "a")
	w2 := mustJoin(t, l, "a")
	ctx, cancel := context.WithCancel(context.Background())
	ch1 := startWait(w1, ctx, time.Time{})
	waitFor(t, "asleep", func() bool { return sleeping(w1) })
	ch2 := asleep(t, w2)
	cancel()
	expectErr(t, "cancelled", ch1, context.Canceled)
	if !sleeping(w2) {
		t.Fatal("a sleeping waiter leaving woke the next one")
	}
	// Woken, then cancelled before running: the offer passes on.
	w3 := mustJoin(t, l, "a")
	q.Offer("a")
	if !stateOf(w2).woken && !stateOf(w2).running {
		t.Fatal("w2 not woken")
	}
	<-ch2
	// w2 runs; cancel w3 holding nothing: nobody else is woken.
	ctx3, cancel3 := context.WithCancel(context.Background())
	cancel3()
	expectErr(t, "w3 cancelled", startWait(w3, ctx3, time.Time{}), context.Canceled)
	w2.Leave()
}

// TestSize: a line holds at most its size; size 0 is no queue; sizes are
// per line.
func TestSize(t *testing.T) {
	q := New(newFakeClock())
	l := q.NewLine("h", 2, time.Minute, nil, nil)
	other := q.NewLine("o", 1, time.Minute, nil, nil)
	a := mustJoin(t, l, "a")
	b := mustJoin(t, l, "a")
	if _, err := l.Join(q.Mark(), nil, []string{"a"}, time.Time{}); !errors.Is(err, ErrFull) {
		t.Fatalf("third Join: %v", err)
	}
	c := mustJoin(t, other, "a")
	a.Leave()
	d := mustJoin(t, l, "a")
	off := q.NewLine("off", 0, time.Minute, nil, nil)
	if _, err := off.Join(q.Mark(), nil, []string{"a"}, time.Time{}); !errors.Is(err, ErrFull) {
		t.Fatalf("Join on a line of size 0: %v", err)
	}
	for _, w := range []*Waiter{b, c, d} {
		w.Leave()
	}
	if q.Len() != 0 {
		t.Fatal("Len")
	}
}

// TestRetryAt: retryAt lets a waiter run a pass without an offer, keeping
// its place.
func TestRetryAt(t *testing.T) {
	clk := newFakeClock()
	q := New(clk)
	l := q.NewLine("h", 10, time.Minute, []string{"a"}, nil)
	w := mustJoin(t, l, "a")
	ch := startWait(w, context.Background(), clk.Now().Add(time.Second))
	waitFor(t, "asleep", func() bool { return sleeping(w) })
	clk.Advance(999 * time.Millisecond)
	noResult(t, "before retryAt", ch)
	clk.Advance(time.Millisecond)
	expectNil(t, "at retryAt", ch)
	if !q.Contended("a") {
		t.Fatal("a retrying waiter lost its place")
	}
	w.Leave()
}

// TestWantKeepsPlace: a waiter that moves from waiting on its key to
// waiting on providers keeps its place ahead of later ones.
func TestWantKeepsPlace(t *testing.T) {
	q := New(newFakeClock())
	l := q.NewLine("h", 10, time.Minute, []string{"a"}, nil)
	first := mustJoin(t, l, "key")
	second := mustJoin(t, l, "a")
	ch1, ch2 := asleep(t, first), asleep(t, second)
	q.Offer("key")
	expectNil(t, "key offer", ch1)
	first.Want([]string{"a"})
	ch1 = asleep(t, first)
	q.Offer("a")
	expectNil(t, "first, now waiting on a, goes first", ch1)
	if !sleeping(second) {
		t.Fatal("second woken")
	}
	first.Leave()
	second.Leave()
	expectErr(t, "left", ch2, ErrLeft)
}

func TestRealClockSmoke(t *testing.T) {
	q := New(nil)
	l := q.NewLine("h", 2, 20*time.Millisecond, []string{"a"}, nil)
	w := mustJoin(t, l, "a")
	if err := w.Wait(context.Background(), time.Time{}); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Wait = %v, want ErrTimeout", err)
	}
	l2 := q.NewLine("h2", 2, time.Minute, []string{"a"}, nil)
	w = mustJoin(t, l2, "a")
	q.OfferAt("a", time.Now().Add(5*time.Millisecond))
	if err := w.Wait(context.Background(), time.Time{}); err != nil {
		t.Fatalf("Wait = %v, want nil", err)
	}
	w.Leave()
}

// TestStress runs 1,000 clients of two pools against 3 slots each; a slot
// release offers its pool. Run with -race. Every client is served or ends
// exactly once, and no pool's release ever wakes the other pool.
func TestStress(t *testing.T) {
	t.Run("no timeouts", func(t *testing.T) { stress(t, false) })
	t.Run("timeouts and cancels", func(t *testing.T) { stress(t, true) })
}

func stress(t *testing.T, churn bool) {
	const n, slots = 1000, 3
	before := runtime.NumGoroutine()
	clk := newFakeClock()
	q := New(clk)
	l := q.NewLine("h", n, 2*time.Second, []string{"p0", "p1"}, nil)

	var mu sync.Mutex
	free := [2]int{slots, slots}
	acquire := func(p int) bool {
		mu.Lock()
		defer mu.Unlock()
		if free[p] > 0 {
			free[p]--
			return true
		}
		return false
	}
	names := [2]string{"p0", "p1"}
	release := func(p int) {
		mu.Lock()
		free[p]++
		mu.Unlock()
		q.Offer(names[p])
	}

	served := make([]atomic.Int32, n)
	ended := make([]atomic.Int32, n)
	var nServed, nTimeout, nCancel atomic.Int32
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := i % 2
			use := func() {
				served[i].Add(1)
				nServed.Add(1)
				if !churn {
					runtime.Gosched()
					release(p)
					return
				}
				released := make(chan struct{})
				clk.AfterFunc(10*time.Millisecond, func() { release(p); close(released) })
				<-released
			}
			mark := q.Mark()
			defer q.Forget(mark)
			if !q.Contended(names[p]) && acquire(p) {
				use()
				return
			}
			w, err := l.Join(mark, nil, []string{names[p]}, time.Time{})
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
				if acquire(p) {
					w.Leave()
					// Room left: the next waiter of this pool may use it.
					mu.Lock()
					room := free[p] > 0
					mu.Unlock()
					if room {
						q.Offer(names[p])
					}
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
	if free != [2]int{slots, slots} {
		t.Errorf("free slots = %v", free)
	}
	if p := clk.Pending(); p != 0 {
		t.Errorf("%d timers leaked", p)
	}
	if m, h := remembered(q); m != 0 || h != 0 {
		t.Errorf("%d missed offers and %d marks or passes left at the end", m, h)
	}
	waitFor(t, "goroutines to exit", func() bool { return runtime.NumGoroutine() <= before })
}

// TestRetryHandedOn: a waiter that was retrying (retryAt) and leaves
// unserved wakes the next waiter for what it wanted, which takes over the
// retries; a served one (Leave) does not.
func TestRetryHandedOn(t *testing.T) {
	clk := newFakeClock()
	q := New(clk)
	l := q.NewLine("h", 10, time.Minute, []string{"a"}, nil)
	first := mustJoin(t, l, "a")
	second := mustJoin(t, l, "a")
	ctx, cancel := context.WithCancel(context.Background())
	ch1 := startWait(first, ctx, clk.Now().Add(time.Second))
	waitFor(t, "asleep", func() bool { return sleeping(first) })
	ch2 := asleep(t, second)
	cancel()
	expectErr(t, "first left", ch1, context.Canceled)
	expectNil(t, "second takes over", ch2)
	third := mustJoin(t, l, "a")
	ch3 := asleep(t, third)
	expectNil(t, "second retries", startWait(second, context.Background(), clk.Now()))
	second.Leave()
	if !sleeping(third) {
		t.Fatal("a served waiter's Leave woke the next")
	}
	third.Leave()
	expectErr(t, "left", ch3, ErrLeft)
}

// TestRetryHandedOnWhenGoneInPass: a retrying waiter whose client goes
// away during its pass (Gone, not in Wait) hands its retries on too.
func TestRetryHandedOnWhenGoneInPass(t *testing.T) {
	clk := newFakeClock()
	q := New(clk)
	l := q.NewLine("h", 10, time.Minute, []string{"a"}, nil)
	first := mustJoin(t, l, "a")
	second := mustJoin(t, l, "a")
	ch1 := startWait(first, context.Background(), clk.Now().Add(time.Second))
	waitFor(t, "asleep", func() bool { return sleeping(first) })
	ch2 := asleep(t, second)
	clk.Advance(time.Second)
	expectNil(t, "first retries", ch1)
	// The first's pass is under way when its client goes.
	first.Gone()
	expectNil(t, "second takes over", ch2)
	second.Leave()
}

// remembered is the number of missed offers the queue keeps, and the
// number of marks and running passes that may still look at them.
func remembered(q *Queue) (missed, held int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, n := range q.held {
		held += n
	}
	return len(q.missed), held
}

// resourceN is the i-th of many distinct resources (client_limit keys).
func resourceN(i int) string { return fmt.Sprintf("key-%d", i) }

// churnMarks plays clients that come and go, a few at a time: each takes
// a mark, offers resourceN(i) as it leaves unqueued (its client_limit
// share given back), and forgets its mark once the next few came.
type churnMarks struct {
	q      *Queue
	window []*Mark
	most   int // the most missed offers kept after any offer
}

func (c *churnMarks) run(from, to int) {
	for i := from; i < to; i++ {
		c.window = append(c.window, c.q.Mark())
		c.q.Offer(resourceN(i))
		if len(c.window) > 3 {
			c.q.Forget(c.window[0])
			c.window = c.window[1:]
		}
		m, _ := remembered(c.q)
		c.most = max(c.most, m)
	}
}

func (c *churnMarks) end() {
	for _, m := range c.window {
		c.q.Forget(m)
	}
	c.window = nil
}

// TestMissedOffersBounded: offers of ever new resources that nobody takes
// leave nothing behind when no mark is out and no pass runs, only a few
// entries while clients come and go with marks, however many resources
// were offered, and at most twice maxMissed while a mark or a pass stays
// out all along.
func TestMissedOffersBounded(t *testing.T) {
	const n = 10_000
	q := New(newFakeClock())
	l := q.NewLine("h", 10, time.Minute, []string{"a"}, nil)
	for i := range n {
		q.Offer(resourceN(i))
	}
	if m, h := remembered(q); m != 0 || h != 0 {
		t.Fatalf("no mark, no pass: %d missed offers kept (%d held), want none", m, h)
	}

	// One client at a time.
	for i := range n {
		m := q.Mark()
		q.Offer(resourceN(i))
		q.Forget(m)
	}
	if m, h := remembered(q); m != 0 || h != 0 {
		t.Fatalf("clients one at a time: %d missed offers kept (%d held), want none", m, h)
	}

	// Clients overlapping, a few marks always out.
	c := &churnMarks{q: q}
	c.run(0, n)
	if c.most > minPruneAt+1 {
		t.Errorf("clients overlapping: up to %d missed offers kept over %d resources, want at most %d", c.most, n, minPruneAt+1)
	}

	// A mark out all along, then a pass running all along.
	c.most = 0
	m := q.Mark()
	c.run(n, 2*n)
	w := mustJoin(t, l, "a")
	q.Offer("a")
	expectNil(t, "woken", startWait(w, context.Background(), time.Time{}))
	q.Forget(m)
	c.run(2*n, 3*n)
	if c.most > 2*maxMissed+1 {
		t.Errorf("a mark or a pass out all along: up to %d missed offers kept over %d resources, want at most %d", c.most, 2*n, 2*maxMissed+1)
	}
	w.Leave()
	c.end()
	if m, h := remembered(q); m != 0 || h != 0 {
		t.Fatalf("everyone gone: %d missed offers kept (%d held), want none", m, h)
	}
	t.Logf("at most %d missed offers kept at once with a mark or pass out all along, over %d distinct resources", c.most, 2*n)
}

// TestPruneKeepsWhatAMarkNeeds: while clients come and go and the missed
// offers are pruned, one made after a client's mark that nobody took still
// wakes the client when it joins; one made before its mark does not.
func TestPruneKeepsWhatAMarkNeeds(t *testing.T) {
	q := New(newFakeClock())
	l := q.NewLine("h", 10, time.Minute, []string{"x"}, nil)
	c := &churnMarks{q: q}
	c.run(0, 1000)
	early := q.Mark()
	q.Offer("x")
	late := q.Mark() // after x's offer
	c.run(1000, 1500)
	if m, _ := remembered(q); m < 500 || m > maxMissed {
		t.Errorf("%d missed offers kept for a mark taken 500 offers ago, want 500 to %d", m, maxMissed)
	}
	wl, err := l.Join(late, nil, []string{"x"}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if stateOf(wl).woken {
		t.Fatal("an offer of x before the mark woke the joiner")
	}
	we, err := l.Join(early, nil, []string{"x"}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if !stateOf(we).woken {
		t.Fatal("the offer of x made after the mark did not wake the joiner")
	}
	c.run(1500, 2000)
	if m, _ := remembered(q); m > minPruneAt+1 {
		t.Errorf("%d missed offers kept once the mark joined, want at most %d", m, minPruneAt+1)
	}
	wl.Leave()
	we.Leave()
	c.end()
	if m, h := remembered(q); m != 0 || h != 0 {
		t.Fatalf("everyone gone: %d missed offers kept (%d held), want none", m, h)
	}
}

// TestPruneKeepsWhatARunningPassNeeds: offers made while a waiter runs
// its pass, that nobody took, wake it when it goes back to waiting, also
// for what it wants only since that pass (Want), while clients come and
// go and the missed offers are pruned.
func TestPruneKeepsWhatARunningPassNeeds(t *testing.T) {
	q := New(newFakeClock())
	l := q.NewLine("h", 10, time.Minute, []string{"a", "b"}, nil)
	c := &churnMarks{q: q}
	c.run(0, 1000)
	w := mustJoin(t, l, "a")
	q.Offer("a")
	expectNil(t, "woken", startWait(w, context.Background(), time.Time{}))
	q.Offer("b") // during its pass; it does not want b yet
	c.run(1000, 1500)
	w.Want([]string{"b"}) // its pass got what it waited for; now it waits for b
	expectNil(t, "woken again by the offer of b made during its pass", startWait(w, context.Background(), time.Time{}))

	// Another pass, nothing it wants offered during it: it sleeps.
	c.run(1500, 2000)
	ch := startWait(w, context.Background(), time.Time{})
	waitFor(t, "asleep", func() bool { return sleeping(w) })
	c.end()
	if m, h := remembered(q); m != 0 || h != 0 {
		t.Errorf("only a sleeping waiter: %d missed offers kept (%d held), want none", m, h)
	}
	w.Leave()
	expectErr(t, "left", ch, ErrLeft)
}

// TestTooManyMissedOffersWake: when more offers go untaken during one
// client's wait for its Join, or one waiter's pass, than the queue keeps,
// it lets them go and wakes that client or waiter as though it had been
// offered what it wants: a wake too many, never one missed. A client
// that marked after them is not woken.
func TestTooManyMissedOffersWake(t *testing.T) {
	q := New(newFakeClock())
	l := q.NewLine("h", 10, time.Minute, []string{"a", "x"}, nil)
	c := &churnMarks{q: q}
	w := mustJoin(t, l, "a")
	q.Offer("a")
	expectNil(t, "woken", startWait(w, context.Background(), time.Time{}))
	early := q.Mark()
	c.run(0, 4*maxMissed)
	after := q.Mark()
	we, _ := l.Join(early, nil, []string{"x"}, time.Time{})
	if !stateOf(we).woken {
		t.Fatal("a client marked before the offers that were let go was not woken as it joined")
	}
	wa, _ := l.Join(after, nil, []string{"x"}, time.Time{})
	if stateOf(wa).woken {
		t.Fatal("a client marked after the offers that were let go was woken")
	}
	expectNil(t, "the waiter whose pass ran through them, woken again", startWait(w, context.Background(), time.Time{}))
	if c.most > 2*maxMissed+1 {
		t.Errorf("up to %d missed offers kept, want at most %d", c.most, 2*maxMissed+1)
	}
	w.Leave()
	we.Leave()
	wa.Leave()
	c.end()
	if m, h := remembered(q); m != 0 || h != 0 {
		t.Fatalf("everyone gone: %d missed offers kept (%d held), want none", m, h)
	}
}

// TestMarkEndsOnce: Join ends its mark whatever it returns, Forget after
// it does nothing, a mark ended twice does not end another client's, and
// a Join without a mark counts no offer made before it.
func TestMarkEndsOnce(t *testing.T) {
	q := New(newFakeClock())
	l := q.NewLine("h", 1, time.Minute, []string{"a"}, nil)
	other := q.Mark()
	m := q.Mark()
	w, err := l.Join(m, nil, []string{"a"}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	q.Forget(m)
	q.Forget(m)
	q.Forget(nil)
	if _, h := remembered(q); h != 1 {
		t.Fatalf("%d held, want 1 (the other client's mark)", h)
	}
	if _, err := l.Join(q.Mark(), nil, []string{"a"}, time.Time{}); !errors.Is(err, ErrFull) {
		t.Fatalf("Join: %v, want ErrFull", err)
	}
	if _, h := remembered(q); h != 1 {
		t.Fatalf("after a Join that failed: %d held, want 1", h)
	}
	q.Offer("b")
	wb, err := q.NewLine("h2", 1, time.Minute, []string{"b"}, nil).Join(nil, nil, []string{"b"}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if stateOf(wb).woken {
		t.Fatal("a Join without a mark was woken by an offer made before it")
	}
	if m, h := remembered(q); m != 1 || h != 1 {
		t.Fatalf("%d missed, %d held; want the offer of b kept for the other client's mark", m, h)
	}
	q.Forget(other)
	if m, h := remembered(q); m != 0 || h != 0 {
		t.Fatalf("every mark ended: %d missed offers kept (%d held), want none", m, h)
	}
	w.Leave()
	wb.Leave()
}
