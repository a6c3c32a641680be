package spend

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// clock is a fake clock tests move by hand.
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

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestCostOf(t *testing.T) {
	for _, tc := range []struct {
		cost Cost
		d    time.Duration
		want float64
	}{
		{Cost{Amount: 0.1, Per: PerSession}, 0, 0.1},
		{Cost{Amount: 0.1, Per: PerSession}, 3 * time.Hour, 0.1},
		{Cost{Amount: 0.06, Per: PerMinute}, 90 * time.Second, 0.09},
		{Cost{Amount: 0.06, Per: PerMinute}, 0, 0},
		// Rounded up to the minimum, never down.
		{Cost{Amount: 0.06, Per: PerMinute, Minimum: caddy.Duration(time.Minute)}, 10 * time.Second, 0.06},
		{Cost{Amount: 0.06, Per: PerMinute, Minimum: caddy.Duration(time.Minute)}, 2 * time.Minute, 0.12},
		{Cost{Amount: 1.2, Per: PerHour}, 30 * time.Minute, 0.6},
		{Cost{Amount: 1.2, Per: PerHour, Minimum: caddy.Duration(time.Hour)}, time.Second, 1.2},
		{Cost{Amount: 1.2, Per: PerHour}, -time.Second, 0},
	} {
		if got := tc.cost.Of(tc.d); !near(got, tc.want) {
			t.Errorf("%s for %v: got %v, want %v", tc.cost.String(), tc.d, got, tc.want)
		}
	}
	var none *Cost
	if none.Of(time.Hour) != 0 {
		t.Error("a nil cost costs something")
	}
}

func TestCostAndBudgetValidate(t *testing.T) {
	for _, c := range []Cost{
		{Amount: -1, Per: PerSession},
		{Amount: math.NaN(), Per: PerSession},
		{Amount: math.Inf(1), Per: PerHour},
		{Amount: 1, Per: "day"},
		{Amount: 1, Per: ""},
		{Amount: 1, Per: PerMinute, Minimum: -1},
		{Amount: 1, Per: PerSession, Minimum: caddy.Duration(time.Minute)},
	} {
		if c.Validate() == nil {
			t.Errorf("cost %+v passed", c)
		}
	}
	if err := (&Cost{Amount: 0, Per: PerMinute, Minimum: caddy.Duration(time.Minute)}).Validate(); err != nil {
		t.Errorf("a free provider: %v", err)
	}
	for _, b := range []Budget{{Amount: 0, Per: PerDay}, {Amount: -2, Per: PerDay}, {Amount: math.NaN(), Per: PerDay}, {Amount: 1, Per: "week"}, {Amount: 1, Per: PerMinute}} {
		if b.Validate() == nil {
			t.Errorf("budget %+v passed", b)
		}
	}
	if err := (&Budget{Amount: 5, Per: PerMonth}).Validate(); err != nil {
		t.Error(err)
	}
	for _, s := range []string{"", "x", "1e", "NaN", "Inf", "$5", "5 "} {
		if _, err := ParseAmount(s); err == nil {
			t.Errorf("amount %q parsed", s)
		}
	}
	if v, err := ParseAmount("0.075"); err != nil || v != 0.075 {
		t.Errorf("0.075: %v %v", v, err)
	}
}

func TestWindows(t *testing.T) {
	// A time east of UTC: the windows are UTC's, whatever the zone.
	zone := time.FixedZone("UTC+5", 5*3600)
	at := time.Date(2026, 3, 1, 2, 30, 0, 0, zone) // 2026-02-28 21:30 UTC
	for _, tc := range []struct {
		per        string
		start, end time.Time
	}{
		{PerHour, time.Date(2026, 2, 28, 21, 0, 0, 0, time.UTC), time.Date(2026, 2, 28, 22, 0, 0, 0, time.UTC)},
		{PerDay, time.Date(2026, 2, 28, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)},
		{PerMonth, time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)},
	} {
		s, e := Window(tc.per, at)
		if !s.Equal(tc.start) || !e.Equal(tc.end) {
			t.Errorf("%s: %v–%v, want %v–%v", tc.per, s, e, tc.start, tc.end)
		}
	}
	// December turns into January of the next year.
	s, e := Window(PerMonth, time.Date(2026, 12, 31, 23, 59, 59, 0, time.UTC))
	if !s.Equal(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)) || !e.Equal(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("december: %v–%v", s, e)
	}
	// The last instant of a window belongs to it; its end to the next.
	_, e = Window(PerHour, time.Date(2026, 5, 5, 10, 59, 59, 999999999, time.UTC))
	if s2, _ := Window(PerHour, e); !s2.Equal(e) {
		t.Errorf("hour end %v starts %v", e, s2)
	}
}

func TestBookWindowTurns(t *testing.T) {
	for _, tc := range []struct {
		per  string
		from time.Time
		step time.Duration
	}{
		{PerHour, time.Date(2026, 6, 1, 10, 59, 0, 0, time.UTC), time.Minute},
		{PerDay, time.Date(2026, 6, 1, 23, 59, 0, 0, time.UTC), time.Minute},
		{PerMonth, time.Date(2026, 6, 30, 23, 59, 0, 0, time.UTC), time.Minute},
	} {
		c := &clock{t: tc.from}
		k := NewBook(&Budget{Amount: 1, Per: tc.per}, c.now)
		k.Charge(0.4)
		m := k.Start(&Cost{Amount: 0.5, Per: PerSession}, nil)
		if st := k.Read(); !near(st.Spent, 0.4) || !near(st.Accrued, 0.5) || st.Reached() {
			t.Fatalf("%s: before the turn %+v", tc.per, st)
		}
		c.add(tc.step)
		// The window turned: what ended before is gone, the live
		// session still accrues.
		st := k.Read()
		if st.Spent != 0 || !near(st.Accrued, 0.5) {
			t.Fatalf("%s: after the turn %+v", tc.per, st)
		}
		if ws, _ := Window(tc.per, c.now()); !st.WindowStart.Equal(ws) || !st.WindowStart.After(tc.from) {
			t.Fatalf("%s: window start %v", tc.per, st.WindowStart)
		}
		// A session's cost goes to the window it ends in.
		if cost, first := m.Stop(); !near(cost, 0.5) || !first {
			t.Fatalf("%s: stop %v %v", tc.per, cost, first)
		}
		if st := k.Read(); !near(st.Spent, 0.5) || st.Accrued != 0 || st.Live != 0 {
			t.Fatalf("%s: ended %+v", tc.per, st)
		}
	}
}

func TestBudgetReachedMidSession(t *testing.T) {
	c := &clock{t: time.Date(2026, 6, 1, 9, 0, 0, 0, time.UTC)}
	k := NewBook(&Budget{Amount: 1, Per: PerDay}, c.now)
	client := NewBook(&Budget{Amount: 0.5, Per: PerHour}, c.now)
	// 0.06 a minute, one minute minimum.
	cost := &Cost{Amount: 0.06, Per: PerMinute, Minimum: caddy.Duration(time.Minute)}
	m := k.Start(cost, client)
	if got := m.Accrued(); !near(got, 0.06) {
		t.Fatalf("accrued at once: %v (the minimum)", got)
	}
	c.add(8 * time.Minute)
	if ok, _ := client.Reached(); ok {
		t.Fatal("client budget reached at 0.48")
	}
	c.add(20 * time.Second) // 8m20s: 0.5
	if ok, turn := client.Reached(); !ok || !turn.Equal(time.Date(2026, 6, 1, 10, 0, 0, 0, time.UTC)) {
		t.Fatalf("client budget at 0.5: %v until %v", ok, turn)
	}
	if ok, _ := k.Reached(); ok {
		t.Fatal("provider budget reached at 0.5")
	}
	// Live sessions are never cut: the meter runs on.
	c.add(9 * time.Minute) // 17m20s: 1.04
	if ok, turn := k.Reached(); !ok || !turn.Equal(time.Date(2026, 6, 2, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("provider budget at 1.04: %v until %v", ok, turn)
	}
	cost1, _ := m.Stop()
	if !near(cost1, 0.06*(17+1.0/3)) || !near(m.Accrued(), cost1) {
		t.Fatalf("final %v, accrued after stop %v", cost1, m.Accrued())
	}
	if _, again := m.Stop(); again {
		t.Fatal("second stop counted")
	}
	if st := k.Read(); !near(st.Spent, cost1) || !st.Reached() {
		t.Fatalf("after the end %+v", st)
	}
	// The client's hour turns: its budget is open again; the
	// provider's day has not.
	c.add(time.Hour)
	if ok, _ := client.Reached(); ok {
		t.Fatal("client budget still reached in the next hour")
	}
	if ok, _ := k.Reached(); !ok {
		t.Fatal("provider budget open again within the day")
	}
	if !client.Idle() || k.Idle() {
		t.Fatalf("idle: client %v provider %v", client.Idle(), k.Idle())
	}
}

func TestBookShared(t *testing.T) {
	c := &clock{t: time.Date(2026, 6, 1, 9, 0, 0, 0, time.UTC)}
	k := NewBook(&Budget{Amount: 10, Per: PerDay}, c.now)
	start, _ := Window(PerDay, c.now())
	m := k.Start(&Cost{Amount: 2, Per: PerSession}, nil)
	m.Stop()
	// Another node's sessions are in the shared total; this one's end
	// is not yet.
	k.SetShared(start, 3, 0)
	if st := k.Read(); !near(st.Spent, 5) {
		t.Fatalf("before the write: %v", st.Spent)
	}
	// The write of this end comes back with the total that holds it.
	k.SetShared(start, 5, 2)
	if st := k.Read(); !near(st.Spent, 5) {
		t.Fatalf("after the write: %v", st.Spent)
	}
	// An older read never lowers it; another window's is ignored.
	k.SetShared(start, 4, 0)
	k.SetShared(start.Add(-24*time.Hour), 100, 0)
	if st := k.Read(); !near(st.Spent, 5) {
		t.Fatalf("stale reads: %v", st.Spent)
	}
	c.add(24 * time.Hour)
	if st := k.Read(); st.Spent != 0 {
		t.Fatalf("the next day: %v", st.Spent)
	}
}

// TestBookSharedNoTotal: a shared total that is not a cost total (NaN, an
// infinity, a negative: a foreign or corrupted value in the store) is
// ignored: the book keeps its figure and this process's own costs, and the
// budget is still reached.
func TestBookSharedNoTotal(t *testing.T) {
	c := &clock{t: time.Date(2026, 6, 1, 9, 0, 0, 0, time.UTC)}
	for _, bad := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -50} {
		k := NewBook(&Budget{Amount: 10, Per: PerDay}, c.now)
		start, _ := Window(PerDay, c.now())
		k.SetShared(start, bad, 0)
		k.Start(&Cost{Amount: 4, Per: PerSession}, nil).Stop()
		k.SetShared(start, bad, 4)
		k.SetShared(start, 3, 0)
		k.SetShared(start, bad, 0)
		if st := k.Read(); !near(st.Spent, 7) {
			t.Fatalf("after %v: spent %v, want 7", bad, st.Spent)
		}
		k.Start(&Cost{Amount: 3, Per: PerSession}, nil).Stop()
		if reached, _ := k.Reached(); !reached {
			t.Fatalf("after %v: the budget of 10 is not reached at %v", bad, k.Read().Spent)
		}
	}
}

func TestBookConfigure(t *testing.T) {
	c := &clock{t: time.Date(2026, 6, 1, 9, 0, 0, 0, time.UTC)}
	k := NewBook(nil, c.now)
	k.Charge(3)
	if st := k.Read(); st.Budget != 0 || st.Reached() || !near(st.Spent, 3) {
		t.Fatalf("no budget: %+v", st)
	}
	// A budget of the same window keeps what was counted.
	k.Configure(&Budget{Amount: 3, Per: PerDay})
	if ok, _ := k.Reached(); !ok {
		t.Fatal("budget of 3 after 3 spent")
	}
	// Another period starts counting afresh.
	k.Configure(&Budget{Amount: 3, Per: PerHour})
	if st := k.Read(); st.Spent != 0 || k.Period() != PerHour {
		t.Fatalf("new period: %+v", st)
	}
}
