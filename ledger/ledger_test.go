package ledger

import (
	"context"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// clock is a fake clock the test moves.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newStore(t *testing.T) *certmagic.FileStorage {
	return &certmagic.FileStorage{Path: t.TempDir()}
}

func TestRecordRemovePending(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	l := New(st, "n1", nil)
	if err := l.Beat(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"s1", "s2"} {
		if err := l.Record(ctx, "bb", id); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Record(ctx, "steel", "x/y?z"); err != nil {
		t.Fatal(err)
	}
	if got := l.Pending(); got["bb"] != 2 || got["steel"] != 1 {
		t.Fatalf("pending %v", got)
	}
	if err := l.Remove(ctx, "bb", "s1"); err != nil {
		t.Fatal(err)
	}
	if err := l.Remove(ctx, "steel", "x/y?z"); err != nil {
		t.Fatal(err)
	}
	if got := l.Pending(); got["bb"] != 1 || len(got) != 1 {
		t.Fatalf("pending %v", got)
	}
	keys, err := st.List(ctx, entryDir+"/"+l.Owner(), false)
	if err != nil || len(keys) != 1 {
		t.Fatalf("entries left %v %v", keys, err)
	}
}

// TestOrphansAfterOwnerGone: another process's entries are orphans only once
// its heartbeat is older than OwnerGone; each is adopted by exactly one of
// two reapers.
func TestOrphansAfterOwnerGone(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	clk := &clock{t: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
	dead := New(st, "dead", clk.now)
	dead.Beat(ctx)
	const n = 20
	for i := range n {
		if err := dead.Record(ctx, "bb", string(rune('a'+i))); err != nil {
			t.Fatal(err)
		}
		clk.add(time.Millisecond)
	}
	r1, r2 := New(st, "r1", clk.now), New(st, "r2", clk.now)
	clk.add(OwnerGone - time.Second)
	orphans, next, err := r1.Orphans(ctx)
	if err != nil || len(orphans) != 0 {
		t.Fatalf("orphans of a live owner: %v %v", orphans, err)
	}
	if want := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC).Add(OwnerGone); !next.Equal(want) {
		t.Fatalf("next %v, want %v", next, want)
	}
	clk.add(time.Second)
	orphans, next, err = r1.Orphans(ctx)
	if err != nil || len(orphans) != n || !next.IsZero() {
		t.Fatalf("orphans %d %v %v", len(orphans), next, err)
	}
	if orphans[0].ID != "a" || orphans[0].Node != "dead" || orphans[0].Owner != dead.Owner() {
		t.Fatalf("first orphan %+v", orphans[0])
	}
	var adopted [2]atomic.Int64
	var wg sync.WaitGroup
	for i, r := range []*Ledger{r1, r2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, e := range orphans {
				a, ok, err := r.Adopt(ctx, e)
				if err != nil {
					t.Error(err)
				}
				if ok {
					if a.Owner != r.Owner() || a.From != dead.Owner() || a.ID != e.ID {
						t.Errorf("adopted %+v", a)
					}
					adopted[i].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got := adopted[0].Load() + adopted[1].Load(); got != n {
		t.Fatalf("adopted %d entries, want %d (each once)", got, n)
	}
	if p1, p2 := r1.Pending()["bb"], r2.Pending()["bb"]; int64(p1) != adopted[0].Load() || int64(p2) != adopted[1].Load() {
		t.Fatalf("pending %d %d", p1, p2)
	}
	// The gone owner left nothing behind; the adopters' own entries are
	// not orphans to each other while they beat.
	r1.Beat(ctx)
	r2.Beat(ctx)
	if orphans, _, err := r1.Orphans(ctx); err != nil || len(orphans) != 0 {
		t.Fatalf("orphans after adoption: %v %v", orphans, err)
	}
	if keys, _ := st.List(ctx, ownersDir, false); len(keys) != 2 {
		t.Fatalf("owners %v", keys)
	}
}

// TestNoHeartbeatIsGone: entries whose owner never beat (a crash before its
// first heartbeat reached the store) are orphans at once.
func TestNoHeartbeatIsGone(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	a := New(st, "a", nil)
	a.Record(ctx, "bb", "s1")
	orphans, _, err := New(st, "b", nil).Orphans(ctx)
	if err != nil || len(orphans) != 1 {
		t.Fatalf("orphans %v %v", orphans, err)
	}
}

func TestLeave(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	l := New(st, "a", nil)
	l.Beat(ctx)
	l.Record(ctx, "bb", "s1")
	l.Leave(ctx)
	if keys, _ := st.List(ctx, ownersDir, false); len(keys) != 1 {
		t.Fatalf("an owner holding entries left: %v", keys)
	}
	l.Remove(ctx, "bb", "s1")
	l.Leave(ctx)
	if keys, _ := st.List(ctx, ownersDir, false); len(keys) != 0 {
		t.Fatalf("owners after leaving: %v", keys)
	}
}

// TestReassertWritesAgain: after the store lost every write (a failover
// to a replica that had not received them), Reassert writes the heartbeat
// and each entry this process holds again; a removed entry is not
// brought back.
func TestReassertWritesAgain(t *testing.T) {
	st := newStore(t)
	l := New(st, "n1", nil)
	ctx := context.Background()
	if err := l.Beat(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"s1", "s2", "s3"} {
		if err := l.Record(ctx, "cloud", id); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Remove(ctx, "cloud", "s2"); err != nil {
		t.Fatal(err)
	}
	held := func() []string {
		keys, _ := st.List(ctx, entryDir+"/"+l.Owner(), false)
		sort.Strings(keys)
		return keys
	}
	before := held()
	if len(before) != 2 {
		t.Fatalf("entries %v", before)
	}
	if err := os.RemoveAll(st.Path); err != nil {
		t.Fatal(err)
	}
	if len(held()) != 0 || st.Exists(ctx, ownersDir+"/"+l.Owner()) {
		t.Fatal("the store kept something")
	}
	if err := l.Reassert(ctx); err != nil {
		t.Fatal(err)
	}
	if after := held(); strings.Join(after, " ") != strings.Join(before, " ") {
		t.Fatalf("after Reassert: %v, want %v", after, before)
	}
	if !st.Exists(ctx, ownersDir+"/"+l.Owner()) {
		t.Fatal("the heartbeat was not written again")
	}
	if l.PendingOf("cloud") != 2 {
		t.Fatalf("pending %d, want 2", l.PendingOf("cloud"))
	}
}

// flaky is a store whose deletes fail while failing is set.
type flaky struct {
	*certmagic.FileStorage
	failing atomic.Bool
}

func (f *flaky) Delete(ctx context.Context, key string) error {
	if f.failing.Load() {
		return os.ErrDeadlineExceeded
	}
	return f.FileStorage.Delete(ctx, key)
}

// TestRemoveRefusedIsRetried: a removal the store refuses no longer counts
// the session as pending, is not written again by Reassert, and is
// deleted by a later RetryRemovals once the store takes it.
func TestRemoveRefusedIsRetried(t *testing.T) {
	ctx := context.Background()
	st := &flaky{FileStorage: newStore(t)}
	l := New(st, "n1", nil)
	l.Beat(ctx)
	for _, id := range []string{"s1", "s2"} {
		if err := l.Record(ctx, "cloud", id); err != nil {
			t.Fatal(err)
		}
	}
	st.failing.Store(true)
	if err := l.Remove(ctx, "cloud", "s1"); err == nil {
		t.Fatal("Remove reported no error from a store that refused")
	}
	if p, r := l.PendingOf("cloud"), l.Removing(); p != 1 || r != 1 {
		t.Fatalf("pending %d, removing %d; want 1 and 1", p, r)
	}
	if err := l.RetryRemovals(ctx); err == nil || l.Removing() != 1 {
		t.Fatalf("a retry the store refused: %v, removing %d", err, l.Removing())
	}
	st.failing.Store(false)
	if err := l.Reassert(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.RetryRemovals(ctx); err != nil || l.Removing() != 0 {
		t.Fatalf("RetryRemovals: %v, removing %d", err, l.Removing())
	}
	known, err := l.Known(ctx, "cloud")
	if err != nil || len(known) != 1 || !known["s2"] {
		t.Fatalf("the ledger names %v (%v), want s2 only", known, err)
	}
}

// TestForeignEntryRefused: a value under a gone owner that names another
// owner's session (a corrupted or foreign one) is not an orphan: adopting
// it would take the live owner's entry and release its session.
func TestForeignEntryRefused(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	clk := &clock{t: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
	live, reaper := New(st, "live", clk.now), New(st, "reaper", clk.now)
	live.Beat(ctx)
	if err := live.Record(ctx, "cloud", "live-session"); err != nil {
		t.Fatal(err)
	}
	b := []byte(`{"owner":"` + live.Owner() + `","provider":"cloud","session_id":"live-session"}`)
	if err := st.Store(ctx, entryKey("gone0000", "cloud", "other"), b); err != nil {
		t.Fatal(err)
	}
	orphans, _, err := reaper.Orphans(ctx)
	if len(orphans) != 0 || err == nil || !strings.Contains(err.Error(), "not an entry") {
		t.Fatalf("orphans %+v (%v), want none and the foreign value named", orphans, err)
	}
	if live.PendingOf("cloud") != 1 {
		t.Fatal("the live owner lost its entry")
	}
}

// TestMoveLegacy: entries an older version left in its own layout are
// moved, under their owner, into the ledger's store once their owner is
// gone, and found there as orphans; an owner still alive keeps its
// entries where they are until it is gone too.
func TestMoveLegacy(t *testing.T) {
	ctx := context.Background()
	old, st := newStore(t), newStore(t)
	clk := &clock{t: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
	dead, alive := New(old, "dead", clk.now), New(old, "alive", clk.now)
	dead.Beat(ctx)
	for _, id := range []string{"d1", "d2"} {
		if err := dead.Record(ctx, "cloud", id); err != nil {
			t.Fatal(err)
		}
	}
	if err := alive.Record(ctx, "cloud", "a1"); err != nil {
		t.Fatal(err)
	}
	idle := New(old, "idle", clk.now) // a heartbeat and no entry
	idle.Beat(ctx)
	clk.add(OwnerGone)
	alive.Beat(ctx)
	l := New(st, "new", clk.now)
	l.Beat(ctx)
	moved, left, err := l.MoveLegacy(ctx, old)
	if err != nil || moved != 2 || !left {
		t.Fatalf("MoveLegacy: moved %d, left %v, %v; want 2, true", moved, left, err)
	}
	orphans, _, err := l.Orphans(ctx)
	if err != nil || len(orphans) != 2 || orphans[0].Owner != dead.Owner() || orphans[0].ID != "d1" {
		t.Fatalf("orphans %+v (%v), want dead's two", orphans, err)
	}
	keeps := func(what string, key string, want bool) {
		t.Helper()
		if got := old.Exists(ctx, key); got != want {
			t.Fatalf("the old layout keeps %s: %v, want %v", what, got, want)
		}
	}
	keeps("a gone owner's entry", entryKey(dead.Owner(), "cloud", "d1"), false)
	keeps("a gone owner's heartbeat", ownersDir+"/"+dead.Owner(), false)
	keeps("a gone owner's heartbeat without entries", ownersDir+"/"+idle.Owner(), false)
	keeps("a live owner's entry", entryKey(alive.Owner(), "cloud", "a1"), true)
	keeps("a live owner's heartbeat", ownersDir+"/"+alive.Owner(), true)
	clk.add(OwnerGone)
	// What is not an entry stays where it is, named once.
	junk := entryKey(dead.Owner(), "cloud", "junk")
	if err := old.Store(ctx, junk, []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	moved, left, err = l.MoveLegacy(ctx, old)
	if err == nil || !strings.Contains(err.Error(), "not an entry") || moved != 1 || left {
		t.Fatalf("MoveLegacy: moved %d, left %v, %v; want 1, false and the junk named", moved, left, err)
	}
	keeps("what is not an entry", junk, true)
	keeps("a gone owner's entry", entryKey(alive.Owner(), "cloud", "a1"), false)
	keeps("a gone owner's heartbeat", ownersDir+"/"+alive.Owner(), false)
	for _, e := range orphans {
		if _, ok, err := l.Adopt(ctx, e); !ok || err != nil {
			t.Fatalf("Adopt(%s): %v %v", e.ID, ok, err)
		}
	}
	if orphans, _, _ := l.Orphans(ctx); len(orphans) != 1 || orphans[0].ID != "a1" {
		t.Fatalf("orphans %+v, want a1", orphans)
	}
}

// heldLegacy is an old layout whose second Load of an entry waits for
// release (first names the entry loaded first).
type heldLegacy struct {
	Legacy
	mu      sync.Mutex
	loads   int
	first   string
	at      chan struct{} // closed when the second Load began
	release chan struct{}
}

func (h *heldLegacy) Load(ctx context.Context, key string) ([]byte, error) {
	if strings.HasPrefix(key, entryDir+"/") {
		h.mu.Lock()
		h.loads++
		n := h.loads
		if n == 1 {
			h.first = key
		}
		h.mu.Unlock()
		if n == 2 {
			close(h.at)
			<-h.release
		}
	}
	return h.Legacy.Load(ctx, key)
}

// watched is a store that tells of the locks taken and the deletes made.
type watched struct {
	*certmagic.FileStorage
	onLock, onDelete func(name string)
}

func (w *watched) Lock(ctx context.Context, name string) error {
	w.onLock(name)
	return w.FileStorage.Lock(ctx, name)
}

func (w *watched) Delete(ctx context.Context, key string) error {
	w.onDelete(key)
	return w.FileStorage.Delete(ctx, key)
}

// TestMoveLegacyRacesAdoption: a reaper that adopts the last entry moved
// so far of a gone owner does not take the owner out of the store while
// MoveLegacy brings it more: the entry moved next is still found.
func TestMoveLegacyRacesAdoption(t *testing.T) {
	ctx := context.Background()
	old, st := newStore(t), newStore(t)
	clk := &clock{t: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
	dead := New(old, "dead", clk.now)
	for _, id := range []string{"e1", "e2"} {
		if err := dead.Record(ctx, "cloud", id); err != nil {
			t.Fatal(err)
		}
	}
	clk.add(OwnerGone)
	h := &heldLegacy{Legacy: old, at: make(chan struct{}), release: make(chan struct{})}
	moved := make(chan error, 1)
	moverDone := make(chan struct{})
	go func() {
		defer close(moverDone)
		_, _, err := New(st, "mover", clk.now).MoveLegacy(ctx, h)
		moved <- err
	}()
	<-h.at // one entry moved, the other on its way

	// The reaper adopts the one moved; as the owner then looks empty, it
	// goes on to take the owner out, locking it first: only then does the
	// move go on. (A reaper that deleted the owner without the lock would
	// do so once the other entry had come, losing it.)
	var decide sync.Once
	decided := make(chan struct{})
	reaper := New(&watched{FileStorage: st,
		onLock: func(name string) {
			if name == lockName+dead.Owner() {
				decide.Do(func() { close(decided) })
			}
		},
		onDelete: func(key string) {
			if key == entryDir+"/"+dead.Owner() {
				decide.Do(func() { close(decided) })
				<-moverDone
			}
		}}, "reaper", clk.now)
	orphans, _, err := reaper.Orphans(ctx)
	if err != nil || len(orphans) != 1 || entryKey(dead.Owner(), "cloud", orphans[0].ID) != h.first {
		t.Fatalf("orphans while moving: %+v (%v), want the one moved", orphans, err)
	}
	adopted := make(chan error, 1)
	go func() {
		_, _, err := reaper.Adopt(ctx, orphans[0])
		adopted <- err
	}()
	<-decided
	close(h.release)
	if err := <-moved; err != nil {
		t.Fatal(err)
	}
	if err := <-adopted; err != nil {
		t.Fatal(err)
	}
	orphans, _, err = reaper.Orphans(ctx)
	if err != nil || len(orphans) != 1 || entryKey(dead.Owner(), "cloud", orphans[0].ID) == h.first {
		t.Fatalf("orphans after the move: %+v (%v), want the entry moved last", orphans, err)
	}
}
