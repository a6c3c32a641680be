package cooldown

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// fakeClock is a manually advanced, goroutine-safe clock.
type fakeClock struct {
	ns atomic.Int64
}

// start is aligned on a second so that 1s window buckets start exactly on it.
var start = time.Unix(1_700_000_000, 0)

func newClock() *fakeClock { return &fakeClock{} }

func (c *fakeClock) now() time.Time          { return start.Add(time.Duration(c.ns.Load())) }
func (c *fakeClock) Now() time.Time          { return c.now() }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

func newHealth(t *testing.T, cfg Config) (*Health, *fakeClock) {
	t.Helper()
	c := newClock()
	return New(cfg, c), c
}

// attempt acquires a permit (which must be granted) and reports r.
func attempt(t *testing.T, h *Health, r Result) Change {
	t.Helper()
	p, ok := h.Acquire()
	if !ok {
		t.Fatalf("Acquire refused, snapshot %+v", h.Snapshot())
	}
	return h.Done(p, r, 0)
}

func results(s string) []Result {
	out := make([]Result, 0, len(s))
	for _, c := range s {
		switch c {
		case 'S':
			out = append(out, Success)
		case 'F':
			out = append(out, Failure)
		case 'C':
			out = append(out, Capacity)
		case 'N':
			out = append(out, Neutral)
		}
	}
	return out
}

// run plays seq and returns the 1-based attempt that tripped the cooldown
// (0 when none). It fails if anything changes after the trip.
func run(t *testing.T, h *Health, seq string) int {
	t.Helper()
	for i, r := range results(seq) {
		ch := attempt(t, h, r)
		switch ch {
		case CooledDown:
			return i + 1
		case NoChange:
		default:
			t.Fatalf("attempt %d (%v): unexpected change %v", i+1, r, ch)
		}
	}
	return 0
}

func TestTripPoint(t *testing.T) {
	tests := []struct {
		name      string
		threshold float64
		min       int
		seq       string
		want      int // attempt that trips, 0 = never
	}{
		{"0.5/3 FFF", 0.5, 3, "FFF", 3},
		{"0.5/3 FF then success: 2/3 > 0.5", 0.5, 3, "FFS", 3},
		{"0.5/3 SFF", 0.5, 3, "SFF", 3},
		{"0.5/3 FSF", 0.5, 3, "FSF", 3},
		{"0.5/3 FF below min", 0.5, 3, "FF", 0},
		{"0.5/3 SSFF is 0.5, not strictly greater", 0.5, 3, "SSFF", 0},
		{"0.5/3 SSFFF", 0.5, 3, "SSFFF", 5},
		{"0.5/3 SFSFSF alternating stays at 0.5", 0.5, 3, "SFSFSFSFSF", 0},
		{"0.5/3 SFSFF", 0.5, 3, "SFSFF", 5},
		{"0 min means default 3", 0.5, 0, "FFF", 3},
		{"0 threshold means default 0.5", 0, 3, "SSFF", 0},
		{"0.5/1 first failure trips", 0.5, 1, "F", 1},
		{"0.5/1 S then F is 0.5", 0.5, 1, "SF", 0},
		{"0.5/1 SFF", 0.5, 1, "SFF", 3},
		{"1.0 never trips: ratio cannot exceed 1", 1, 3, "FFFFFFFFFFFFFFFFFFFF", 0},
		{"1.0/1 never trips", 1, 1, "FFFFFFFFFF", 0},
		{"0.8/5 FFFFF", 0.8, 5, "FFFFF", 5},
		{"0.8/5 SFFFF is 0.8", 0.8, 5, "SFFFF", 0},
		{"0.8/5 SFFFFF", 0.8, 5, "SFFFFF", 6},
		{"0.25/4 SSSF is 0.25", 0.25, 4, "SSSF", 0},
		{"0.25/4 SSSFF", 0.25, 4, "SSSFF", 5},
		{"0.25/4 FFF below min", 0.25, 4, "FFF", 0},
		{"0.25/4 FFFS", 0.25, 4, "FFFS", 4},
		{"neutral results are not attempts", 0.5, 3, "FNNFNF", 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, _ := newHealth(t, Config{FailureThreshold: tt.threshold, MinRequests: tt.min})
			got := run(t, h, tt.seq)
			if got != tt.want {
				t.Fatalf("tripped at attempt %d, want %d", got, tt.want)
			}
			s := h.Snapshot()
			if tt.want == 0 {
				if !s.Healthy || s.Cooldowns != 0 || s.Streak != 0 {
					t.Fatalf("should be healthy: %+v", s)
				}
				return
			}
			if s.Healthy || s.Cooldowns != 1 || s.Streak != 1 || s.WindowAttempts != 0 {
				t.Fatalf("bad snapshot after trip: %+v", s)
			}
			if want := start.Add(DefaultDuration); !s.Until.Equal(want) {
				t.Fatalf("Until = %v, want %v", s.Until, want)
			}
			if _, ok := h.Acquire(); ok {
				t.Fatal("Acquire granted during cooldown")
			}
		})
	}
}

func TestWindowSliding(t *testing.T) {
	t.Run("old failures fall out after window", func(t *testing.T) {
		h, c := newHealth(t, Config{})
		run(t, h, "FF")
		c.advance(DefaultWindow)
		if s := h.Snapshot(); s.WindowAttempts != 0 || s.WindowFailures != 0 {
			t.Fatalf("window not empty after window: %+v", s)
		}
		if got := run(t, h, "FF"); got != 0 {
			t.Fatalf("tripped at %d with only 2 failures in window", got)
		}
		if got := run(t, h, "F"); got != 1 {
			t.Fatal("3 failures in window should trip")
		}
	})
	t.Run("failures just inside the window still count", func(t *testing.T) {
		h, c := newHealth(t, Config{})
		run(t, h, "FF")
		c.advance(DefaultWindow - time.Millisecond)
		if s := h.Snapshot(); s.WindowAttempts != 2 {
			t.Fatalf("window = %+v, want 2 attempts", s)
		}
		if got := run(t, h, "F"); got != 1 {
			t.Fatal("should trip")
		}
	})
	t.Run("partial expiry", func(t *testing.T) {
		h, c := newHealth(t, Config{})
		run(t, h, "F")
		c.advance(30 * time.Second)
		run(t, h, "F")
		c.advance(30 * time.Second) // first failure leaves
		if s := h.Snapshot(); s.WindowAttempts != 1 || s.WindowFailures != 1 {
			t.Fatalf("window = %+v, want 1/1", s)
		}
		if got := run(t, h, "F"); got != 0 {
			t.Fatal("only 2 attempts in window, should not trip")
		}
		if got := run(t, h, "F"); got != 1 {
			t.Fatal("3/3 should trip")
		}
	})
	t.Run("successes slide out too", func(t *testing.T) {
		h, c := newHealth(t, Config{})
		run(t, h, "SSSSSS")
		c.advance(20 * time.Second)
		if got := run(t, h, "FFFF"); got != 0 {
			t.Fatal("4/10 should not trip")
		}
		c.advance(40 * time.Second) // the successes leave, failures stay
		if s := h.Snapshot(); s.WindowAttempts != 4 || s.WindowFailures != 4 {
			t.Fatalf("window = %+v, want 4/4", s)
		}
		if got := run(t, h, "S"); got != 1 {
			t.Fatal("4/5 after the successes left should trip")
		}
	})
	t.Run("bounded memory at high rate", func(t *testing.T) {
		h, c := newHealth(t, Config{FailureThreshold: 1})
		for i := 0; i < 100_000; i++ {
			attempt(t, h, Success)
			attempt(t, h, Failure)
			c.advance(time.Millisecond)
		}
		s := h.Snapshot()
		// 100s elapsed with 1s buckets. At exactly t0+100s the bucket
		// [100s,101s) has just started and is empty, and [40s,41s) has just
		// left: the window holds the 59 buckets [41s,100s), 1000
		// iterations each (expiry is bucket-granular, counts are exact).
		if s.WindowAttempts != 118_000 || s.WindowFailures != 59_000 {
			t.Fatalf("window = %d/%d, want 59000/118000", s.WindowFailures, s.WindowAttempts)
		}
		if s.Attempts != 200_000 || s.Failures != 100_000 {
			t.Fatalf("totals = %d/%d", s.Failures, s.Attempts)
		}
	})
}

func trip(t *testing.T, h *Health) {
	t.Helper()
	for i := 0; i < 100; i++ {
		if attempt(t, h, Failure) == CooledDown {
			return
		}
	}
	t.Fatal("never tripped")
}

func TestExpiryAndTrial(t *testing.T) {
	h, c := newHealth(t, Config{})
	trip(t, h)
	c.advance(DefaultDuration - time.Nanosecond)
	if h.Available() {
		t.Fatal("available before expiry")
	}
	if _, ok := h.Acquire(); ok {
		t.Fatal("Acquire granted before expiry")
	}
	c.advance(time.Nanosecond)

	s := h.Snapshot()
	if !s.Healthy || !s.Until.IsZero() || s.TrialInFlight || s.WindowAttempts != 0 || s.WindowFailures != 0 || s.Streak != 1 {
		t.Fatalf("after expiry: %+v", s)
	}
	if !h.Until().IsZero() {
		t.Fatal("Until should be zero after expiry")
	}
	if !h.Available() {
		t.Fatal("should be available after expiry")
	}

	p1, ok1 := h.Acquire()
	p2, ok2 := h.Acquire()
	if !ok1 || !p1.Trial() {
		t.Fatalf("first Acquire after expiry: ok=%v trial=%v", ok1, p1.Trial())
	}
	if ok2 || p2.Trial() {
		t.Fatal("second Acquire during trial must be refused")
	}
	if h.Available() {
		t.Fatal("not available while trial in flight")
	}
	s = h.Snapshot()
	if s.Healthy || !s.TrialInFlight || !s.Until.IsZero() {
		t.Fatalf("during trial: %+v", s)
	}

	if ch := h.Done(p1, Success, 0); ch != Recovered {
		t.Fatalf("trial success: %v, want Recovered", ch)
	}
	s = h.Snapshot()
	if !s.Healthy || s.TrialInFlight || s.Streak != 0 || s.Cooldowns != 1 {
		t.Fatalf("after trial success: %+v", s)
	}
	p, ok := h.Acquire()
	if !ok || p.Trial() {
		t.Fatal("normal permit expected after recovery")
	}
	h.Done(p, Success, 0)

	// Doubling was reset: the next cooldown lasts duration again.
	trip(t, h)
	if got := h.Until().Sub(c.now()); got != DefaultDuration {
		t.Fatalf("cooldown after recovery = %v, want %v", got, DefaultDuration)
	}
}

func TestDoublingCapped(t *testing.T) {
	h, c := newHealth(t, Config{})
	trip(t, h)
	want := []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute, 5 * time.Minute}
	for i, d := range want {
		if got := h.Until().Sub(c.now()); got != d {
			t.Fatalf("cooldown %d lasts %v, want %v", i+1, got, d)
		}
		if s := h.Snapshot(); s.Streak != i+1 || s.Cooldowns != int64(i+1) {
			t.Fatalf("cooldown %d: %+v", i+1, s)
		}
		c.advance(d)
		p, ok := h.Acquire()
		if !ok || !p.Trial() {
			t.Fatalf("cooldown %d: no trial after expiry", i+1)
		}
		if i == len(want)-1 {
			if ch := h.Done(p, Success, 0); ch != Recovered {
				t.Fatalf("got %v", ch)
			}
			break
		}
		if ch := h.Done(p, Failure, 0); ch != CooledDown {
			t.Fatalf("trial failure: %v, want CooledDown", ch)
		}
	}
	trip(t, h)
	if got := h.Until().Sub(c.now()); got != 30*time.Second {
		t.Fatalf("after recovery cooldown = %v", got)
	}
}

func TestDoublingCustomConfig(t *testing.T) {
	h, c := newHealth(t, Config{Duration: caddy.Duration(10 * time.Second), MaxDuration: caddy.Duration(25 * time.Second)})
	trip(t, h)
	for i, d := range []time.Duration{10 * time.Second, 20 * time.Second, 25 * time.Second, 25 * time.Second} {
		if got := h.Until().Sub(c.now()); got != d {
			t.Fatalf("cooldown %d lasts %v, want %v", i+1, got, d)
		}
		c.advance(d)
		p, _ := h.Acquire()
		h.Done(p, Failure, 0)
	}
}

func TestNeutralTrial(t *testing.T) {
	h, c := newHealth(t, Config{})
	trip(t, h)
	c.advance(DefaultDuration)
	p, ok := h.Acquire()
	if !ok || !p.Trial() {
		t.Fatal("expected trial")
	}
	if ch := h.Done(p, Neutral, 0); ch != NoChange {
		t.Fatalf("neutral trial: %v", ch)
	}
	s := h.Snapshot()
	if !s.Healthy || s.TrialInFlight || s.Streak != 1 || s.Attempts != 3 {
		t.Fatalf("after neutral trial: %+v", s)
	}
	p2, ok := h.Acquire()
	if !ok || !p2.Trial() {
		t.Fatal("next Acquire after neutral trial must get a new trial")
	}
	// Reporting the old trial again must not end the new one.
	if ch := h.Done(p, Failure, 0); ch != NoChange {
		t.Fatalf("duplicate Done on old trial: %v", ch)
	}
	if s := h.Snapshot(); !s.TrialInFlight || s.Cooldowns != 1 {
		t.Fatalf("old trial result disturbed the new trial: %+v", s)
	}
	if ch := h.Done(p2, Failure, 0); ch != CooledDown {
		t.Fatalf("trial failure: %v", ch)
	}
	if got := h.Until().Sub(c.now()); got != time.Minute {
		t.Fatalf("second cooldown %v, want 1m (neutral trial did not reset doubling)", got)
	}
}

func TestWindowEmptyAfterCooldown(t *testing.T) {
	h, c := newHealth(t, Config{})
	run(t, h, "SSSSFFFFF") // 5/9 > 0.5 trips on the last one
	if s := h.Snapshot(); s.Cooldowns != 1 || s.WindowAttempts != 0 {
		t.Fatalf("%+v", s)
	}
	c.advance(DefaultDuration)
	if s := h.Snapshot(); s.WindowAttempts != 0 || s.WindowFailures != 0 {
		t.Fatalf("window not empty after cooldown: %+v", s)
	}
	p, _ := h.Acquire()
	h.Done(p, Success, 0)
	if s := h.Snapshot(); s.WindowAttempts != 1 || s.WindowFailures != 0 {
		t.Fatalf("window after trial success: %+v", s)
	}
	// A fresh window holding the trial success: S,F is 2 attempts (below
	// min_requests), S,F,F is 2/3 > 0.5.
	if got := run(t, h, "F"); got != 0 {
		t.Fatal("should not trip at 1/2")
	}
	if got := run(t, h, "F"); got != 1 {
		t.Fatal("2/3 should trip")
	}
}

func TestSingleProvider(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		seq  string
		want int
	}{
		{"mixes never trip", Config{}, strings.Repeat("SF", 20) + "SFFFFFFFFF", 0},
		{"mix with mostly failures", Config{}, "SFFFFFFFFFFFFFFFFFFF", 0},
		{"4 failures are not enough", Config{}, "FFFF", 0},
		{"5 straight failures with min 3", Config{}, "FFFFF", 5},
		{"5 straight failures with min 1", Config{MinRequests: 1}, "FFFFF", 5},
		{"min 7 needs 7", Config{MinRequests: 7}, "FFFFFFF", 7},
		{"min 7: 6 are not enough", Config{MinRequests: 7}, "FFFFFF", 0},
		{"threshold ignored", Config{FailureThreshold: 1}, "FFFFF", 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			h := New(Config{}, c)
			h.Configure(tt.cfg, true)
			if got := run(t, h, tt.seq); got != tt.want {
				t.Fatalf("tripped at %d, want %d", got, tt.want)
			}
		})
	}

	t.Run("success slides out then failures trip", func(t *testing.T) {
		c := newClock()
		h := New(Config{}, c)
		h.Configure(Config{}, true)
		run(t, h, "S")
		c.advance(30 * time.Second)
		if got := run(t, h, "FFFFFF"); got != 0 {
			t.Fatal("success in window protects")
		}
		c.advance(30 * time.Second)
		if got := run(t, h, "F"); got != 1 {
			t.Fatal("7 straight failures in window should trip")
		}
	})

	t.Run("trial failure cools down again", func(t *testing.T) {
		c := newClock()
		h := New(Config{}, c)
		h.Configure(Config{}, true)
		run(t, h, "FFFFF")
		c.advance(DefaultDuration)
		p, _ := h.Acquire()
		if ch := h.Done(p, Failure, 0); ch != CooledDown {
			t.Fatalf("got %v", ch)
		}
	})

	t.Run("configure keeps state", func(t *testing.T) {
		c := newClock()
		h := New(Config{}, c)
		run(t, h, "FF")
		h.Configure(Config{}, true)
		if s := h.Snapshot(); s.WindowAttempts != 2 {
			t.Fatalf("window lost on Configure: %+v", s)
		}
		if got := run(t, h, "FFF"); got != 3 {
			t.Fatalf("tripped at %d, want 3 (5th failure overall)", got)
		}
		h.Configure(Config{Duration: caddy.Duration(time.Second)}, false)
		if s := h.Snapshot(); s.Healthy || s.Until.Sub(c.now()) != DefaultDuration {
			t.Fatalf("cooldown in progress changed by Configure: %+v", s)
		}
	})
}

func TestCapacity(t *testing.T) {
	tests := []struct {
		name       string
		cfg        Config
		retryAfter time.Duration
		want       time.Duration
	}{
		{"retry-after honoured", Config{}, 10 * time.Second, 10 * time.Second},
		{"retry-after capped at max_duration", Config{}, time.Hour, 5 * time.Minute},
		{"retry-after capped at custom max", Config{MaxDuration: caddy.Duration(time.Minute)}, 2 * time.Minute, time.Minute},
		{"zero means duration", Config{}, 0, 30 * time.Second},
		{"zero means custom duration", Config{Duration: caddy.Duration(7 * time.Second)}, 0, 7 * time.Second},
		{"negative means duration", Config{}, -time.Second, 30 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, c := newHealth(t, tt.cfg)
			run(t, h, "FS")
			p, _ := h.Acquire()
			if ch := h.Done(p, Capacity, tt.retryAfter); ch != Skipped {
				t.Fatalf("got %v, want Skipped", ch)
			}
			s := h.Snapshot()
			if s.Healthy || s.Until.Sub(c.now()) != tt.want || s.Streak != 0 || s.Cooldowns != 0 {
				t.Fatalf("during skip: %+v", s)
			}
			if s.WindowAttempts != 2 || s.WindowFailures != 1 || s.Attempts != 2 || s.Failures != 1 {
				t.Fatalf("capacity must not be counted: %+v", s)
			}
			if h.Available() {
				t.Fatal("available during skip")
			}
			c.advance(tt.want - time.Nanosecond)
			if _, ok := h.Acquire(); ok {
				t.Fatal("Acquire granted during skip")
			}
			c.advance(time.Nanosecond)
			if !h.Until().IsZero() {
				t.Fatal("Until should be zero after the skip")
			}
			p, ok := h.Acquire()
			if !ok || p.Trial() {
				t.Fatalf("after skip: ok=%v trial=%v, want a normal permit", ok, p.Trial())
			}
			p2, ok := h.Acquire()
			if !ok {
				t.Fatal("no trial after a skip: concurrent permits allowed")
			}
			if ch := h.Done(p, Success, 0); ch != Recovered {
				t.Fatalf("first success after skip: %v, want Recovered", ch)
			}
			if ch := h.Done(p2, Success, 0); ch != NoChange {
				t.Fatalf("second success after skip: %v, want NoChange", ch)
			}
		})
	}

	t.Run("many capacity signals never cool down or double", func(t *testing.T) {
		h, c := newHealth(t, Config{})
		for i := 0; i < 10; i++ {
			p, ok := h.Acquire()
			if !ok {
				t.Fatal("refused")
			}
			if ch := h.Done(p, Capacity, 0); ch != Skipped {
				t.Fatalf("got %v", ch)
			}
			if got := h.Until().Sub(c.now()); got != DefaultDuration {
				t.Fatalf("skip %d lasts %v, want %v (no doubling)", i, got, DefaultDuration)
			}
			c.advance(DefaultDuration)
		}
		s := h.Snapshot()
		if s.Cooldowns != 0 || s.Streak != 0 || s.Attempts != 0 || s.WindowAttempts != 0 {
			t.Fatalf("%+v", s)
		}
		// The first failure cooldown afterwards is not doubled.
		trip(t, h)
		if got := h.Until().Sub(c.now()); got != DefaultDuration {
			t.Fatalf("first cooldown after skips = %v", got)
		}
	})

	t.Run("success during skip does not recover early", func(t *testing.T) {
		h, c := newHealth(t, Config{})
		p1, _ := h.Acquire()
		p2, _ := h.Acquire()
		h.Done(p1, Capacity, 10*time.Second)
		if ch := h.Done(p2, Success, 0); ch != NoChange {
			t.Fatalf("got %v", ch)
		}
		if h.Available() {
			t.Fatal("skip must hold")
		}
		c.advance(10 * time.Second)
		if ch := attempt(t, h, Success); ch != Recovered {
			t.Fatalf("got %v", ch)
		}
	})

	t.Run("failures during skip still count", func(t *testing.T) {
		h, _ := newHealth(t, Config{})
		var ps []Permit
		for i := 0; i < 4; i++ {
			p, _ := h.Acquire()
			ps = append(ps, p)
		}
		h.Done(ps[0], Capacity, 0)
		h.Done(ps[1], Failure, 0)
		h.Done(ps[2], Failure, 0)
		if ch := h.Done(ps[3], Failure, 0); ch != CooledDown {
			t.Fatalf("got %v", ch)
		}
	})

	t.Run("capacity during cooldown does not shorten it", func(t *testing.T) {
		h, c := newHealth(t, Config{})
		stale, _ := h.Acquire()
		stale2, _ := h.Acquire()
		trip(t, h)
		end := h.Until()
		if ch := h.Done(stale, Capacity, 5*time.Second); ch != NoChange {
			t.Fatalf("shorter skip: %v, want NoChange", ch)
		}
		if !h.Until().Equal(end) {
			t.Fatalf("Until moved from %v to %v", end, h.Until())
		}
		if ch := h.Done(stale2, Capacity, 2*time.Minute); ch != Skipped {
			t.Fatalf("longer skip: %v, want Skipped", ch)
		}
		if got := h.Until().Sub(c.now()); got != 2*time.Minute {
			t.Fatalf("Until = now+%v, want +2m", got)
		}
		c.advance(DefaultDuration)
		if _, ok := h.Acquire(); ok {
			t.Fatal("skip outlasting the cooldown must hold")
		}
		c.advance(2*time.Minute - DefaultDuration)
		p, ok := h.Acquire()
		if !ok || !p.Trial() {
			t.Fatal("after both end, a trial is still required")
		}
		if ch := h.Done(p, Success, 0); ch != Recovered {
			t.Fatalf("got %v", ch)
		}
	})

	t.Run("capacity on a trial", func(t *testing.T) {
		h, c := newHealth(t, Config{})
		trip(t, h)
		c.advance(DefaultDuration)
		p, _ := h.Acquire()
		if ch := h.Done(p, Capacity, 3*time.Second); ch != Skipped {
			t.Fatalf("got %v", ch)
		}
		s := h.Snapshot()
		if s.Healthy || s.TrialInFlight || s.Streak != 1 || s.Cooldowns != 1 {
			t.Fatalf("%+v", s)
		}
		c.advance(3 * time.Second)
		p, ok := h.Acquire()
		if !ok || !p.Trial() {
			t.Fatal("a new trial is needed after the skip")
		}
		if ch := h.Done(p, Failure, 0); ch != CooledDown {
			t.Fatalf("got %v", ch)
		}
		if got := h.Until().Sub(c.now()); got != time.Minute {
			t.Fatalf("doubled cooldown = %v", got)
		}
	})
}

func TestStaleResults(t *testing.T) {
	h, c := newHealth(t, Config{})
	var stale []Permit
	for i := 0; i < 4; i++ {
		p, _ := h.Acquire()
		stale = append(stale, p)
	}
	trip(t, h)
	end := h.Until()

	if ch := h.Done(stale[0], Success, 0); ch != NoChange {
		t.Fatalf("stale success: %v", ch)
	}
	if ch := h.Done(stale[1], Failure, 0); ch != NoChange {
		t.Fatalf("stale failure: %v", ch)
	}
	s := h.Snapshot()
	if s.Healthy || !s.Until.Equal(end) || s.Cooldowns != 1 || s.Streak != 1 || s.WindowAttempts != 0 {
		t.Fatalf("stale results changed state: %+v", s)
	}
	if s.Attempts != 5 || s.Failures != 4 {
		t.Fatalf("totals should include stale results: %+v", s)
	}

	c.advance(DefaultDuration)
	p, ok := h.Acquire()
	if !ok || !p.Trial() {
		t.Fatal("expected trial")
	}
	if ch := h.Done(stale[2], Success, 0); ch != NoChange {
		t.Fatalf("stale success during trial: %v", ch)
	}
	if s := h.Snapshot(); !s.TrialInFlight || s.Streak != 1 {
		t.Fatalf("stale success ended the trial: %+v", s)
	}
	if ch := h.Done(stale[3], Neutral, 0); ch != NoChange {
		t.Fatalf("stale neutral: %v", ch)
	}
	if !h.Snapshot().TrialInFlight {
		t.Fatal("stale neutral ended the trial")
	}
	if ch := h.Done(p, Success, 0); ch != Recovered {
		t.Fatalf("trial: %v", ch)
	}
	if s := h.Snapshot(); s.WindowAttempts != 1 || s.WindowFailures != 0 {
		t.Fatalf("window after recovery: %+v", s)
	}
	if ch := h.Done(Permit{}, Failure, 0); ch != NoChange {
		t.Fatal("zero permit must be ignored")
	}
	if s := h.Snapshot(); s.Attempts != 7 {
		t.Fatalf("zero permit counted: %+v", s)
	}
}

func TestReset(t *testing.T) {
	h, c := newHealth(t, Config{})
	old, _ := h.Acquire()
	trip(t, h)
	c.advance(DefaultDuration)
	trial, _ := h.Acquire()
	if !trial.Trial() {
		t.Fatal("expected trial")
	}
	if !h.Reset() {
		t.Fatal("Reset during a trial: want wasDown")
	}
	if h.Reset() {
		t.Fatal("Reset of a healthy provider: want !wasDown")
	}
	want := Snapshot{Healthy: true}
	if s := h.Snapshot(); s != want {
		t.Fatalf("after Reset: %+v", s)
	}
	if ch := h.Done(trial, Failure, 0); ch != NoChange {
		t.Fatalf("pre-Reset trial: %v", ch)
	}
	if ch := h.Done(old, Capacity, 0); ch != NoChange {
		t.Fatalf("pre-Reset capacity: %v", ch)
	}
	if s := h.Snapshot(); s != want {
		t.Fatalf("pre-Reset results changed state: %+v", s)
	}
	p, ok := h.Acquire()
	if !ok || p.Trial() {
		t.Fatal("normal permit expected after Reset")
	}
	h.Done(p, Failure, 0)
	// Doubling reset: next cooldown is duration.
	trip(t, h)
	if got := h.Until().Sub(c.now()); got != DefaultDuration {
		t.Fatalf("cooldown after Reset = %v", got)
	}

	// Reset also ends a cooldown and a capacity skip.
	if !h.Reset() {
		t.Fatal("Reset during a cooldown: want wasDown")
	}
	p, _ = h.Acquire()
	h.Done(p, Capacity, time.Minute)
	if !h.Reset() {
		t.Fatal("Reset during a skip: want wasDown")
	}
	if !h.Available() || !h.Until().IsZero() {
		t.Fatal("Reset must end the skip")
	}
	if ch := attempt(t, h, Success); ch != NoChange {
		t.Fatalf("no Recovered after Reset: %v", ch)
	}
}

func TestConfigureWindowChange(t *testing.T) {
	h, c := newHealth(t, Config{})
	run(t, h, "FF")
	h.Configure(Config{Window: caddy.Duration(10 * time.Second)}, false)
	if s := h.Snapshot(); s.WindowAttempts != 0 {
		t.Fatalf("window kept across a window length change: %+v", s)
	}
	run(t, h, "FF")
	c.advance(10 * time.Second)
	if s := h.Snapshot(); s.WindowAttempts != 0 {
		t.Fatalf("10s window did not slide: %+v", s)
	}
	if got := h.Config(); time.Duration(got.Window) != 10*time.Second || time.Duration(got.Duration) != DefaultDuration {
		t.Fatalf("Config() = %+v", got)
	}
}

func TestConfig(t *testing.T) {
	def := DefaultConfig()
	if def != (Config{Duration: caddy.Duration(30 * time.Second), MaxDuration: caddy.Duration(5 * time.Minute), Window: caddy.Duration(time.Minute), FailureThreshold: 0.5, MinRequests: 3}) {
		t.Fatalf("DefaultConfig = %+v", def)
	}

	mergeTests := []struct {
		name           string
		base, override Config
		want           Config
	}{
		{"empty override", def, Config{}, def},
		{"all fields", def, Config{Duration: 1, MaxDuration: 2, Window: 3, FailureThreshold: 0.9, MinRequests: 9}, Config{Duration: 1, MaxDuration: 2, Window: 3, FailureThreshold: 0.9, MinRequests: 9}},
		{"one field", def, Config{MinRequests: 10}, Config{Duration: caddy.Duration(30 * time.Second), MaxDuration: caddy.Duration(5 * time.Minute), Window: caddy.Duration(time.Minute), FailureThreshold: 0.5, MinRequests: 10}},
		{"onto empty", Config{}, Config{Window: caddy.Duration(time.Second)}, Config{Window: caddy.Duration(time.Second)}},
	}
	for _, tt := range mergeTests {
		t.Run("Merge "+tt.name, func(t *testing.T) {
			if got := tt.base.Merge(tt.override); got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}

	defTests := []struct {
		name string
		in   Config
		want Config
	}{
		{"zero", Config{}, def},
		{"partial", Config{Duration: caddy.Duration(time.Second), FailureThreshold: 0.7}, Config{Duration: caddy.Duration(time.Second), MaxDuration: caddy.Duration(5 * time.Minute), Window: caddy.Duration(time.Minute), FailureThreshold: 0.7, MinRequests: 3}},
		{"full", Config{Duration: 1, MaxDuration: 2, Window: 3, FailureThreshold: 1, MinRequests: 4}, Config{Duration: 1, MaxDuration: 2, Window: 3, FailureThreshold: 1, MinRequests: 4}},
	}
	for _, tt := range defTests {
		t.Run("WithDefaults "+tt.name, func(t *testing.T) {
			if got := tt.in.WithDefaults(); got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestDurationAboveDefaultMax(t *testing.T) {
	// Only duration set, above the default max_duration: the cap is raised
	// to duration rather than shortening the cooldown.
	h, c := newHealth(t, Config{Duration: caddy.Duration(10 * time.Minute)})
	trip(t, h)
	if got := h.Until().Sub(c.now()); got != 10*time.Minute {
		t.Fatalf("cooldown = %v", got)
	}
}

func TestStrings(t *testing.T) {
	if Success.String() != "success" || Neutral.String() != "neutral" || Result(42).String() != "Result(42)" {
		t.Fatal("Result.String")
	}
	if Recovered.String() != "recovered" || NoChange.String() != "no change" || Change(9).String() != "Change(9)" {
		t.Fatal("Change.String")
	}
}

func TestConcurrent(t *testing.T) {
	c := newClock()
	h := New(Config{Duration: caddy.Duration(time.Millisecond), MaxDuration: caddy.Duration(4 * time.Millisecond), Window: caddy.Duration(10 * time.Millisecond), MinRequests: 10}, c)
	const workers, iterations = 32, 2000
	var successes, failures, granted, trials atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			held := make([]Permit, 0, 4)
			for i := 0; i < iterations; i++ {
				c.advance(time.Microsecond * time.Duration(1+(w+i)%7))
				if p, ok := h.Acquire(); ok {
					granted.Add(1)
					if p.Trial() {
						trials.Add(1)
					}
					held = append(held, p)
				}
				// Finish permits out of order, sometimes later (stale).
				if len(held) > 0 && (i%3 != 0 || len(held) == cap(held)) {
					p := held[0]
					held = held[1:]
					k := (w*7 + i) % 10
					if (i/100)%3 == 0 {
						k = 0 // bad phase: the provider fails everything
					}
					switch k {
					case 0, 1, 2:
						h.Done(p, Failure, 0)
						failures.Add(1)
					case 4:
						if i%20 == 0 { // rare: a skip blocks everyone
							h.Done(p, Capacity, time.Duration(i%3)*time.Millisecond)
							break
						}
						h.Done(p, Success, 0)
						successes.Add(1)
					case 5:
						h.Done(p, Neutral, 0)
					default:
						h.Done(p, Success, 0)
						successes.Add(1)
					}
				}
				switch i % 50 {
				case 0:
					_ = h.Snapshot()
				case 1:
					_ = h.Available()
				case 2:
					_ = h.Until()
				}
			}
			for _, p := range held {
				h.Done(p, Success, 0)
				successes.Add(1)
			}
		}(w)
	}
	wg.Wait()
	s := h.Snapshot()
	if s.Attempts != successes.Load()+failures.Load() || s.Failures != failures.Load() {
		t.Fatalf("totals %d/%d, want %d/%d", s.Failures, s.Attempts, failures.Load(), successes.Load()+failures.Load())
	}
	if int64(s.WindowAttempts) > s.Attempts || s.WindowFailures > s.WindowAttempts {
		t.Fatalf("inconsistent window: %+v", s)
	}
	if s.TrialInFlight {
		t.Fatalf("trial still in flight after all permits were returned: %+v", s)
	}
	if granted.Load() == 0 || s.Cooldowns == 0 || trials.Load() == 0 {
		t.Fatalf("test did not exercise the state machine: granted=%d trials=%d %+v", granted.Load(), trials.Load(), s)
	}
	t.Logf("granted=%d trials=%d %+v", granted.Load(), trials.Load(), s)
}

// TestAdopt: a cooldown started on another node is honoured here: skipped
// until its end, then a single trial; its streak carries into the next
// local cooldown's doubling; an earlier or past end changes nothing.
func TestAdopt(t *testing.T) {
	h, c := newHealth(t, Config{Duration: caddy.Duration(10 * time.Second), MaxDuration: caddy.Duration(5 * time.Minute), MinRequests: 1})
	p, _ := h.Acquire() // an attempt in flight when the news arrives
	if h.Adopt(start.Add(-time.Second), 1) {
		t.Fatal("adopted a cooldown that already ended")
	}
	if !h.Adopt(c.now().Add(20*time.Second), 2) {
		t.Fatal("cooldown not adopted")
	}
	if h.Adopt(c.now().Add(15*time.Second), 3) {
		t.Fatal("an earlier end replaced a later one")
	}
	if _, ok := h.Acquire(); ok || h.Available() {
		t.Fatal("available during an adopted cooldown")
	}
	if got := h.Until(); !got.Equal(c.now().Add(20 * time.Second)) {
		t.Fatalf("until %v", got)
	}
	// The attempt that was in flight fails: it is counted but does not
	// start another cooldown on top.
	if ch := h.Done(p, Failure, 0); ch != NoChange {
		t.Fatalf("stale failure changed %v", ch)
	}
	c.advance(20 * time.Second)
	trial, ok := h.Acquire()
	if !ok || !trial.Trial() {
		t.Fatal("no trial after the adopted cooldown")
	}
	if _, ok := h.Acquire(); ok {
		t.Fatal("a second attempt beside the trial")
	}
	// The trial fails: the next cooldown doubles from the adopted streak
	// (2 → 3: 10s × 2² = 40s).
	if ch := h.Done(trial, Failure, 0); ch != CooledDown {
		t.Fatalf("trial failure: %v", ch)
	}
	if got := h.Until().Sub(c.now()); got != 40*time.Second {
		t.Fatalf("cooldown %v, want 40s", got)
	}
	if h.Streak() != 3 {
		t.Fatalf("streak %d", h.Streak())
	}
}

// TestAdoptSkip: a 408/429 skip learnt from another node is a skip here
// too: unavailable until its end, then every caller at once (no trial
// gate), the doubling and the failure window untouched, permits out
// before it still counting, and a later single failure no cooldown.
func TestAdoptSkip(t *testing.T) {
	h, c := newHealth(t, Config{Duration: caddy.Duration(10 * time.Second), MaxDuration: caddy.Duration(5 * time.Minute), MinRequests: 3, FailureThreshold: 0.5})
	inFlight, _ := h.Acquire()
	if h.AdoptSkip(c.now().Add(-time.Second)) {
		t.Fatal("adopted a skip that already ended")
	}
	if !h.AdoptSkip(c.now().Add(2 * time.Second)) {
		t.Fatal("skip not adopted")
	}
	if h.AdoptSkip(c.now().Add(time.Second)) {
		t.Fatal("an earlier end replaced a later one")
	}
	if _, ok := h.Acquire(); ok || h.Available() {
		t.Fatal("available during an adopted skip")
	}
	if cd, sk := h.Ends(); !cd.IsZero() || !sk.Equal(c.now().Add(2*time.Second)) {
		t.Fatalf("ends %v %v", cd, sk)
	}
	// The attempt that was in flight still counts (not stale).
	if ch := h.Done(inFlight, Success, 0); ch != NoChange {
		t.Fatalf("success in flight: %v", ch)
	}
	c.advance(2 * time.Second)
	// Several callers at once, none of them a trial.
	var permits []Permit
	for range 5 {
		p, ok := h.Acquire()
		if !ok || p.Trial() {
			t.Fatalf("after the adopted skip: ok %v trial %v", ok, p.Trial())
		}
		permits = append(permits, p)
	}
	// One failure among them: counted in the window, no cooldown.
	if ch := h.Done(permits[0], Failure, 0); ch != NoChange {
		t.Fatalf("a single failure after the adopted skip: %v", ch)
	}
	for _, p := range permits[1:] {
		if ch := h.Done(p, Success, 0); ch != NoChange {
			t.Fatalf("success after the adopted skip: %v (no local skip: nothing to recover from)", ch)
		}
	}
	s := h.Snapshot()
	if s.Streak != 0 || s.Cooldowns != 0 || s.WindowFailures != 1 || s.WindowAttempts != 6 || !s.Healthy {
		t.Fatalf("after the adopted skip: %+v", s)
	}
	// A skip never shortens a cooldown; Ends tells them apart.
	h2, c2 := newHealth(t, Config{Duration: caddy.Duration(10 * time.Second)})
	h2.Adopt(c2.now().Add(10*time.Second), 1)
	if h2.AdoptSkip(c2.now().Add(5 * time.Second)) {
		t.Fatal("a skip inside a cooldown reported a longer block")
	}
	if cd, sk := h2.Ends(); !cd.Equal(c2.now().Add(10*time.Second)) || !sk.Equal(c2.now().Add(5*time.Second)) {
		t.Fatalf("ends %v %v", cd, sk)
	}
	if !h2.Until().Equal(c2.now().Add(10 * time.Second)) {
		t.Fatalf("until %v", h2.Until())
	}
}

// TestProbeTrials: with an active health check, the trial after a cooldown
// is the probe's: clients are refused (and the provider shows unhealthy)
// until a probe passes; a failing probe trial doubles the next cooldown; a
// passing one ends the doubling. Turning probes off hands the trial back to
// clients.
func TestProbeTrials(t *testing.T) {
	h, c := newHealth(t, Config{Duration: caddy.Duration(10 * time.Second), MaxDuration: caddy.Duration(time.Minute), MinRequests: 2})
	h.SetProbeTrials(true)
	// Probes feed the window like client attempts.
	for range 2 {
		p, ok := h.AcquireProbe()
		if !ok || p.Trial() {
			t.Fatalf("probe permit %v %v", p, ok)
		}
		if ch := h.Done(p, Failure, 0); ch == CooledDown {
			break
		}
	}
	if h.Available() {
		t.Fatal("two failed probes did not trip the cooldown")
	}
	if _, ok := h.AcquireProbe(); ok {
		t.Fatal("probe permit during the cooldown")
	}
	c.advance(10 * time.Second)
	// The cooldown ran out: clients still may not take the trial.
	if _, ok := h.Acquire(); ok || h.Available() || h.Snapshot().Healthy {
		t.Fatal("a client got the trial that belongs to the probe")
	}
	p, ok := h.AcquireProbe()
	if !ok || !p.Trial() {
		t.Fatalf("the probe got no trial: %v %v", p, ok)
	}
	if _, ok := h.AcquireProbe(); ok {
		t.Fatal("a second probe permit while the trial is in flight")
	}
	if ch := h.Done(p, Failure, 0); ch != CooledDown {
		t.Fatalf("failed probe trial: %v, want cooled down", ch)
	}
	if u := h.Until(); !u.Equal(c.now().Add(20 * time.Second)) {
		t.Fatalf("second cooldown until %v, want doubled to 20s", u.Sub(c.now()))
	}
	c.advance(20 * time.Second)
	p, ok = h.AcquireProbe()
	if !ok || !p.Trial() {
		t.Fatal("no trial for the probe after the second cooldown")
	}
	if ch := h.Done(p, Success, 0); ch != Recovered {
		t.Fatalf("passing probe trial: %v, want recovered", ch)
	}
	if s := h.Snapshot(); !s.Healthy || s.Streak != 0 {
		t.Fatalf("after the probe trial: %+v", s)
	}
	if _, ok := h.Acquire(); !ok {
		t.Fatal("clients refused after the probe's trial passed")
	}

	// Probes turned off while a trial is due: the next client takes it.
	for range 2 {
		p, _ := h.AcquireProbe()
		h.Done(p, Failure, 0)
	}
	c.advance(10 * time.Second)
	if h.Available() {
		t.Fatal("available while the probe's trial is due")
	}
	h.SetProbeTrials(false)
	if p, ok := h.Acquire(); !ok || !p.Trial() {
		t.Fatal("with probes off a client does not get the trial")
	}
}
