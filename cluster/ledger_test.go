package cluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/ledger"
	"github.com/redis/go-redis/v9"
)

// TestLedgerOnRedis: the ledger of created sessions kept in Redis: two
// nodes see each other's entries; once one node's heartbeat is older than
// the gone age, the other two adopt each of its entries exactly once.
func TestLedgerOnRedis(t *testing.T) {
	r := startRedis(t)
	ctx := context.Background()
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	mk := func(node string) *ledger.Ledger {
		l := ledger.New(open(t, r, node, nil).Ledger(), node, clock)
		l.SetTiming(200*time.Millisecond, time.Second)
		if err := l.Beat(ctx); err != nil {
			t.Fatal(err)
		}
		return l
	}
	dead, a, b := mk("dead"), mk("a"), mk("b")
	const n = 12
	for i := range n {
		if err := dead.Record(ctx, "cloud", string(rune('a'+i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Record(ctx, "cloud", "mine"); err != nil {
		t.Fatal(err)
	}
	if orphans, next, err := b.Orphans(ctx); err != nil || len(orphans) != 0 || next.IsZero() {
		t.Fatalf("orphans of live owners: %v %v %v", orphans, next, err)
	}
	advance(1500 * time.Millisecond)
	a.Beat(ctx)
	b.Beat(ctx)
	orphans, _, err := b.Orphans(ctx)
	if err != nil || len(orphans) != n {
		t.Fatalf("orphans %d %v, want %d (the dead node's only)", len(orphans), err, n)
	}
	var got [2]atomic.Int64
	var wg sync.WaitGroup
	for i, l := range []*ledger.Ledger{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, e := range orphans {
				if _, ok, err := l.Adopt(ctx, e); err != nil {
					t.Error(err)
				} else if ok {
					got[i].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if total := got[0].Load() + got[1].Load(); total != n {
		t.Fatalf("adopted %d, want %d (each once)", total, n)
	}
	if p := a.Pending()["cloud"]; int64(p) != got[0].Load()+1 {
		t.Fatalf("a's pending %d", p)
	}
	if left, _, _ := a.Orphans(ctx); len(left) != 0 {
		t.Fatalf("orphans left %v", left)
	}
	if err := a.Remove(ctx, "cloud", "mine"); err != nil {
		t.Fatal(err)
	}
}

// oldLayout is the ledger's store as versions before the hash layout
// kept it (a string key per path, listings by a walk of the keyspace), to
// play an older version: its locks are the LedgerStore's.
type oldLayout struct {
	*LedgerStore
	old LegacyLedger
}

func (o oldLayout) Store(ctx context.Context, key string, value []byte) error {
	return o.c.rdb.Set(ctx, o.old.key(key), value, 0).Err()
}
func (o oldLayout) Load(ctx context.Context, key string) ([]byte, error) {
	return o.old.Load(ctx, key)
}
func (o oldLayout) Delete(ctx context.Context, key string) error {
	under, err := o.old.List(ctx, key, true)
	if err != nil {
		return err
	}
	for _, k := range append(under, key) {
		if err := o.old.Delete(ctx, k); err != nil {
			return err
		}
	}
	return nil
}
func (o oldLayout) List(ctx context.Context, prefix string, recursive bool) ([]string, error) {
	under, err := o.old.List(ctx, prefix, true)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, k := range under {
		rest := strings.TrimPrefix(k, prefix+"/")
		if !recursive {
			rest, _, _ = strings.Cut(rest, "/")
		}
		if !seen[rest] {
			seen[rest] = true
			out = append(out, prefix+"/"+rest)
		}
	}
	return out, nil
}

// TestLedgerMovesOldLayout: on a Redis that also holds other keys, the
// entries an older version left in its layout are moved to the hash
// layout once their owner is gone, each exactly once even while an older
// version adopts the same entries; a live older version keeps its own.
func TestLedgerMovesOldLayout(t *testing.T) {
	r := startRedis(t, "--enable-debug-command", "local")
	fillKeyspace(t, r, 50_000) // several calls of the walk
	ctx := context.Background()
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	s := open(t, r, "n", nil)
	mk := func(st ledger.Store, node string) *ledger.Ledger {
		l := ledger.New(st, node, clock)
		l.SetTiming(200*time.Millisecond, time.Second)
		if err := l.Beat(ctx); err != nil {
			t.Fatal(err)
		}
		return l
	}
	old := oldLayout{LedgerStore: s.Ledger(), old: s.Ledger().Legacy()}
	dead, alive := mk(old, "dead"), mk(old, "alive")
	const n = 10
	for i := range n {
		if err := dead.Record(ctx, "cloud", fmt.Sprintf("d%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := alive.Record(ctx, "cloud", "a1"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(1500 * time.Millisecond)
	mu.Unlock()
	alive.Beat(ctx)
	l := mk(s.Ledger(), "new")

	// The older version reaps the dead owner while the new one moves its
	// entries: each is taken by one of them.
	oldOrphans, _, err := alive.Orphans(ctx)
	if err != nil || len(oldOrphans) != n {
		t.Fatalf("the older version's orphans: %d (%v)", len(oldOrphans), err)
	}
	var adopted atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, e := range oldOrphans {
			if _, ok, err := alive.Adopt(ctx, e); err != nil {
				t.Error(err)
			} else if ok {
				adopted.Add(1)
			}
		}
	}()
	moved, left, err := l.MoveLegacy(ctx, s.Ledger().Legacy())
	wg.Wait()
	if err != nil || !left {
		t.Fatalf("MoveLegacy: left %v, %v (want true: a live older version)", left, err)
	}
	if int64(moved)+adopted.Load() != n {
		t.Fatalf("moved %d, adopted by the older version %d; want %d in all", moved, adopted.Load(), n)
	}
	orphans, _, err := l.Orphans(ctx)
	if err != nil || len(orphans) != moved {
		t.Fatalf("orphans in the hash layout: %d (%v), want %d", len(orphans), err, moved)
	}
	ids := map[string]int{}
	for _, e := range orphans {
		ids[e.ID]++
	}
	oldKnown, err := alive.Known(ctx, "cloud")
	if err != nil {
		t.Fatal(err)
	}
	for id := range oldKnown {
		ids[id]++
	}
	for i := range n {
		if id := fmt.Sprintf("d%d", i); ids[id] != 1 {
			t.Errorf("%s is named %d times", id, ids[id])
		}
	}
	if ids["a1"] != 1 {
		t.Errorf("the live older version's own entry is named %d times", ids["a1"])
	}

	// Once the older version is gone too, the rest moves and the old
	// layout holds nothing more.
	mu.Lock()
	now = now.Add(1500 * time.Millisecond)
	mu.Unlock()
	l.Beat(ctx)
	moved, left, err = l.MoveLegacy(ctx, s.Ledger().Legacy())
	if err != nil || left || int64(moved) != adopted.Load()+1 {
		t.Fatalf("MoveLegacy: moved %d, left %v, %v; want %d, false", moved, left, err, adopted.Load()+1)
	}
	if keys, err := s.Ledger().Legacy().List(ctx, "browser_failover", true); err != nil || len(keys) != 0 {
		t.Fatalf("the old layout holds %v (%v)", keys, err)
	}
	if orphans, _, err := l.Orphans(ctx); err != nil || len(orphans) != n+1 {
		t.Fatalf("orphans %d (%v), want %d", len(orphans), err, n+1)
	}
}

// TestLedgerValueSizes: the ledger store neither writes nor reads back a
// value longer than an entry could be; one found in Redis (not the
// ledger's) is refused without being read, and named.
func TestLedgerValueSizes(t *testing.T) {
	r := startRedis(t)
	ctx := context.Background()
	st := open(t, r, "n", nil).Ledger()
	if err := st.Store(ctx, "d/big", make([]byte, MaxLedgerValue+1)); err == nil {
		t.Fatal("a value over MaxLedgerValue was written")
	}
	if err := st.Store(ctx, "d/ok", []byte("v")); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer c.Close()
	if err := c.HSet(ctx, st.files("d"), "huge", strings.Repeat("x", 8<<20)).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Load(ctx, "d/huge"); err == nil || !strings.Contains(err.Error(), "not the ledger's") {
		t.Fatalf("Load of a huge value: %v", err)
	}
	if v, err := st.Load(ctx, "d/ok"); err != nil || string(v) != "v" {
		t.Fatalf("Load: %q %v", v, err)
	}
	if _, err := st.Load(ctx, "d/none"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Load of nothing: %v", err)
	}
}
