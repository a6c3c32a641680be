package cluster

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestSpendUnreadableTotals: spend totals in Redis that hold no cost
// total (text, NaN, a negative: foreign or corrupted values) are read as
// nothing, never as NaN or a negative, and never block the writes of the
// others: a good total gets each cost once however many writes pass.
func TestSpendUnreadableTotals(t *testing.T) {
	r := startRedis(t)
	s := open(t, r, "a", nil)
	ctx := context.Background()
	start := time.Now().Truncate(time.Hour)
	window := func(scope string) SpendWindow {
		return SpendWindow{Scope: scope, Start: start, End: start.Add(time.Hour)}
	}
	windows := []SpendWindow{window(ProviderScope("good")), window(ProviderScope("text")),
		window(ProviderScope("nan")), window(ProviderScope("negative")), window(ClientScope("k"))}
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer c.Close()
	for i, v := range map[int]string{1: "not a number", 2: "nan", 3: "-5"} {
		if err := c.Set(ctx, s.Spend().key(windows[i].Scope, start), v, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	told := map[int][]float64{}
	s.Spend().QueueSpend(windows, 1.5, func(i int, total, added float64) {
		mu.Lock()
		told[i] = append(told[i], total)
		mu.Unlock()
	})
	// Every write there is to make (a put-back one included), in
	// whatever order the keys come.
	for range 20 {
		s.Spend().flush()
	}
	got, err := s.Spend().ReadSpend(ctx, windows)
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{1.5, 0, 0, 0, 1.5}
	for i, v := range got {
		if math.IsNaN(v) || v != want[i] {
			t.Errorf("total of %s: %v, want %v", windows[i].Scope, v, want[i])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i, totals := range told {
		for _, v := range totals {
			if math.IsNaN(v) || v < 0 || (i != 0 && i != 4) {
				t.Errorf("told %s's total %v", windows[i].Scope, v)
			}
		}
	}
	if len(told[0]) != 1 || len(told[4]) != 1 {
		t.Errorf("told the good totals %v, want each once", told)
	}
}
