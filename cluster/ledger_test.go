package cluster

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/ledger"
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
