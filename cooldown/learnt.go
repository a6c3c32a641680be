package cooldown

import (
	"sync"
	"sync/atomic"
	"time"
)

// LearntCap is a provider's concurrency cap as learnt from the provider
// itself (max_concurrent auto), over an injectable clock.
//
// A refusal for capacity (a 429 without Retry-After, or a capacity probe
// that says full) while n ≥ 1 sessions are live sets the cap to n: the
// provider said it takes no more than it holds. The cap then rises by one
// at most once per interval (the provider's cooldown duration), counted
// from the last refusal or the last rise, and only if the live sessions
// reached the cap since then: a cap nobody pressed against is not raised
// (additive increase). Each new refusal sets it back to the live count.
// Before the first refusal there is no cap (0).
type LearntCap struct {
	now func() time.Time

	v atomic.Int64 // the cap, for reads without the lock (0: none)

	mu       sync.Mutex
	interval time.Duration
	since    time.Time // the last refusal or rise
	reached  bool      // the live sessions reached the cap since then
}

// NewLearntCap returns a cap not learnt yet that rises at most once per
// interval.
func NewLearntCap(interval time.Duration, now func() time.Time) *LearntCap {
	if now == nil {
		now = time.Now
	}
	return &LearntCap{now: now, interval: interval}
}

// SetInterval changes how often the cap may rise (a config reload).
func (l *LearntCap) SetInterval(d time.Duration) {
	l.mu.Lock()
	l.interval = d
	l.mu.Unlock()
}

// Refused records a refusal for capacity while live sessions were live.
// It reports whether the cap was learnt from it (live ≥ 1); a refusal
// with nothing live teaches nothing, and the caller skips the provider as
// for any capacity signal.
func (l *LearntCap) Refused(live int64) bool {
	if live < 1 {
		return false
	}
	l.mu.Lock()
	l.v.Store(live)
	l.since, l.reached = l.now(), false
	l.mu.Unlock()
	return true
}

// Adopt takes on a cap another node learnt (the shared state's): the
// cap, and when it was last set there. A cap of 0 is ignored.
func (l *LearntCap) Adopt(capacity int64, since time.Time) {
	if capacity < 1 {
		return
	}
	l.mu.Lock()
	if l.v.Load() != capacity {
		l.v.Store(capacity)
		l.since, l.reached = since, false
	}
	l.mu.Unlock()
}

// Cap is the cap now (0: none learnt), raised by one first if an interval
// has passed since the last refusal or rise and the cap was reached since.
func (l *LearntCap) Cap() int64 {
	c := l.v.Load()
	if c == 0 {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	c = l.v.Load()
	if l.reached && l.interval > 0 {
		if now := l.now(); !now.Before(l.since.Add(l.interval)) {
			c++
			l.v.Store(c)
			l.since, l.reached = now, false
		}
	}
	return c
}

// NextRise is the earliest time the cap may rise (zero while none is
// learnt): a caller with clients waiting looks again then.
func (l *LearntCap) NextRise() time.Time {
	if l.v.Load() == 0 {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.since.Add(l.interval)
}

// Learnt is the cap without raising it (0: none learnt), for status.
func (l *LearntCap) Learnt() int64 { return l.v.Load() }

// Reached notes that the live sessions reached n; it counts toward a rise
// when n is at (or above) the cap.
func (l *LearntCap) Reached(n int64) {
	c := l.v.Load()
	if c == 0 || n < c {
		return
	}
	l.mu.Lock()
	l.reached = true
	l.mu.Unlock()
}
