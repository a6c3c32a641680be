package cluster

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/ledger"
	"github.com/redis/go-redis/v9"
)

// fillKeyspace puts n keys that are not the gateway's in r, as a Redis
// shared with other data holds: DEBUG POPULATE when the server allows it,
// else pipelined MSETs.
func fillKeyspace(t *testing.T, r *redisServer, n int) {
	t.Helper()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), ReadTimeout: time.Minute})
	defer c.Close()
	if err := c.Do(ctx, "DEBUG", "POPULATE", n, "other").Err(); err != nil {
		t.Logf("DEBUG POPULATE refused (%v): filling with MSET", err)
		const batch = 1000
		for i := 0; i < n; {
			pipe := c.Pipeline()
			for j := 0; j < 50 && i < n; j++ {
				args := make([]any, 0, 2*batch)
				for k := 0; k < batch && i < n; k, i = k+1, i+1 {
					args = append(args, fmt.Sprintf("other:%d", i), "v")
				}
				pipe.MSet(ctx, args...)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := c.DBSize(ctx).Val(); got < int64(n) {
		t.Fatalf("the keyspace holds %d keys, want %d", got, n)
	}
}

// TestLedgerAmongManyKeys: on a Redis that holds 1.5 million keys of
// other uses, a removal takes the entry out of Redis and out of the
// process's count, and a reap finds a gone owner's entries, each within
// the normal call timeout: no ledger operation walks the keyspace.
func TestLedgerAmongManyKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a Redis with 1.5 million keys")
	}
	r := startRedis(t, "--enable-debug-command", "local")
	fillKeyspace(t, r, 1_500_000)
	ctx := context.Background()
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	mk := func(node string) *ledger.Ledger {
		l := ledger.New(open(t, r, node, nil).Ledger(), node, clock)
		l.SetTiming(200*time.Millisecond, time.Second)
		if err := l.Beat(ctx); err != nil {
			t.Fatal(err)
		}
		return l
	}
	dead, a := mk("dead"), mk("a")
	for _, id := range []string{"d1", "d2", "d3"} {
		if err := dead.Record(ctx, "cloud", id); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"mine", "kept"} {
		if err := a.Record(ctx, "cloud", id); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Remove(ctx, "cloud", "mine"); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if p := a.PendingOf("cloud"); p != 1 {
		t.Fatalf("pending after the removal: %d, want 1", p)
	}
	known, err := a.Known(ctx, "cloud")
	if err != nil {
		t.Fatalf("Known: %v", err)
	}
	if known["mine"] || !known["kept"] || !known["d1"] {
		t.Fatalf("the ledger names %v, want kept and d1..d3, not the removed one", known)
	}

	mu.Lock()
	now = now.Add(1500 * time.Millisecond)
	mu.Unlock()
	if err := a.Beat(ctx); err != nil {
		t.Fatal(err)
	}
	orphans, _, err := a.Orphans(ctx)
	if err != nil || len(orphans) != 3 {
		t.Fatalf("orphans %v (%v), want the gone owner's 3", orphans, err)
	}
	for _, e := range orphans {
		got, ok, err := a.Adopt(ctx, e)
		if err != nil || !ok || got.From != dead.Owner() {
			t.Fatalf("Adopt(%s): %+v %v %v", e.ID, got, ok, err)
		}
		if err := a.Remove(ctx, "cloud", e.ID); err != nil {
			t.Fatalf("Remove(%s) after its release: %v", e.ID, err)
		}
	}
	if orphans, _, err := a.Orphans(ctx); err != nil || len(orphans) != 0 {
		t.Fatalf("orphans left %v (%v)", orphans, err)
	}
	if known, err := a.Known(ctx, "cloud"); err != nil || len(known) != 1 || !known["kept"] {
		t.Fatalf("the ledger names %v (%v), want kept only", known, err)
	}
}
