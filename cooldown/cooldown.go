// Package cooldown owns the health of ONE remote-browser provider: a small,
// thread-safe state machine over an injectable clock that decides whether an
// attempt may go to the provider, when the provider must cool down after too
// many failures, when a single trial connection may test it again, and how
// long it must be skipped after a capacity signal (HTTP 408/429).
//
// The package is pure logic: no I/O, no goroutines, no timers. The caller asks
// Until for the end of the current cooldown or skip and schedules its own
// wake-up.
//
// # States
//
//   - normal: every Acquire succeeds; Success and Failure results are counted
//     in a sliding failure-rate window.
//   - failure cooldown: started when, after a counted attempt, the window
//     holds at least min_requests attempts and failures/attempts is strictly
//     greater than failure_threshold. It lasts duration, doubled for each
//     cooldown that follows the previous one without a success in between,
//     capped at max_duration. Every Acquire is refused. The window is cleared
//     when the cooldown starts, so it is empty when the cooldown ends.
//   - trial pending / in flight: once the cooldown has expired the first
//     Acquire gets a trial Permit and every other caller is refused until the
//     trial ends. A trial Success returns the provider to normal and resets
//     the doubling; a trial Failure starts the next (doubled) cooldown; a
//     trial ending Neutral or Capacity changes nothing about the trial state,
//     so a later Acquire may start a new trial (after the capacity skip, if
//     any). While an active health check probes the provider
//     (SetProbeTrials), the trial is the probe's: AcquireProbe gets it and
//     Acquire refuses it, so no client is sent to a provider that may still
//     be down.
//   - capacity skip: a Capacity result skips the provider for the given
//     retry-after (capped at max_duration) or, when it is zero, for duration
//     (never doubled). It is not a failure, does not enter the window and does
//     not count toward the doubling. When it ends the provider is available
//     normally, with no trial. A skip never shortens a failure cooldown: the
//     provider is unavailable until the later of the two ends.
//
// # Shared state
//
// With several gateway nodes sharing state, a node takes on what another
// learnt: Adopt for a failure cooldown (a single trial follows here too,
// and the doubling continues from the larger streak), AdoptSkip for a
// capacity skip (a skip here too: no trial, no doubling, nothing counted).
//
// # Single provider protection
//
// When the handler has exactly one provider (Configure with single=true) a
// cooldown starts only when every attempt in the window failed and there were
// at least max(5, min_requests) of them. A failed trial still starts the next
// cooldown.
//
// # Generations and stale results
//
// Every Permit carries the generation it was issued in. The generation
// changes when a cooldown starts, when a trial permit is issued and on Reset.
// A Success or Failure whose Permit is from an older generation (an attempt
// started before the current cooldown, e.g. a concurrent connect) is ignored
// for the window and for the state machine: it neither trips nor ends a
// cooldown and never ends a trial. It still counts in the Attempts/Failures
// totals unless it predates the last Reset. A stale Capacity result is still
// honoured (the provider said it is full, which is current information), but
// it can only make the provider unavailable for longer, never shorter.
// Results of permits issued before the last Reset, and of the zero Permit, are
// ignored entirely.
//
// # Window granularity
//
// The window is a ring of 60 time buckets, each window/60 wide, so its memory
// is bounded whatever the attempt rate. Counts are exact; only expiry is
// bucket-granular: an attempt leaves the window after at most window and at
// least window - window/60 after it was recorded.
package cooldown

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// Default values used by DefaultConfig and WithDefaults.
const (
	DefaultDuration         = 30 * time.Second
	DefaultMaxDuration      = 5 * time.Minute
	DefaultWindow           = 60 * time.Second
	DefaultFailureThreshold = 0.5
	DefaultMinRequests      = 3

	// SingleProviderMinRequests is the minimum number of attempts (all
	// failed) in the window before a handler's only provider cools down;
	// min_requests applies instead when it is larger.
	SingleProviderMinRequests = 5

	// WindowBuckets is the number of buckets of the failure-rate window; each
	// bucket covers window/WindowBuckets.
	WindowBuckets = 60
)

// Config is when a failing provider is set aside, and for how long: the
// JSON form of a "cooldown" block (at handler level, and per provider to
// override some of the handler's; see Merge), and what the machine runs
// with. A zero field means "unset": WithDefaults fills it from
// DefaultConfig. In particular a MinRequests of 0 means the default (3),
// not "judge from the first attempt"; use 1 for that. Nothing here checks
// the values: the gateway's config does, where it can tell a stated zero
// from a left-out option.
type Config struct {
	// Duration is the first failure cooldown, and the skip after a
	// 408/429 without Retry-After; must be positive. Default: 30s.
	Duration caddy.Duration `json:"duration,omitempty"`
	// MaxDuration caps the cooldown, which doubles for each one that
	// follows the last without a success in between, and the Retry-After
	// of capacity skips; must be positive and not shorter than Duration.
	// Default: 5m.
	MaxDuration caddy.Duration `json:"max_duration,omitempty"`
	// Window is the sliding window over which the failure ratio is taken;
	// must be positive. Default: 60s.
	Window caddy.Duration `json:"window,omitempty"`
	// FailureThreshold: a provider cools down when failures/attempts in
	// the window is strictly greater than this ratio, in (0,1]. With 1
	// the ratio can never exceed it, so failure cooldowns never start
	// (except through single provider protection, which ignores it).
	// Default: 0.5.
	FailureThreshold float64 `json:"failure_threshold,omitempty"`
	// MinRequests is how many attempts the window must hold before the
	// ratio is judged; not negative, and 0 means the default. Default: 3.
	MinRequests int `json:"min_requests,omitempty"`
}

// DefaultConfig returns the documented defaults: duration 30s, max_duration
// 5m, window 60s, failure_threshold 0.5, min_requests 3.
func DefaultConfig() Config {
	return Config{
		Duration:         caddy.Duration(DefaultDuration),
		MaxDuration:      caddy.Duration(DefaultMaxDuration),
		Window:           caddy.Duration(DefaultWindow),
		FailureThreshold: DefaultFailureThreshold,
		MinRequests:      DefaultMinRequests,
	}
}

// Merge returns c with every non-zero field of override replacing c's.
func (c Config) Merge(override Config) Config {
	if override.Duration != 0 {
		c.Duration = override.Duration
	}
	if override.MaxDuration != 0 {
		c.MaxDuration = override.MaxDuration
	}
	if override.Window != 0 {
		c.Window = override.Window
	}
	if override.FailureThreshold != 0 {
		c.FailureThreshold = override.FailureThreshold
	}
	if override.MinRequests != 0 {
		c.MinRequests = override.MinRequests
	}
	return c
}

// WithDefaults fills zero fields from DefaultConfig.
func (c Config) WithDefaults() Config {
	return DefaultConfig().Merge(c)
}

// maxDuration is the effective cap: MaxDuration, but never less than
// Duration (possible when only one of them was set and the other defaulted).
func (c Config) maxDuration() time.Duration {
	return time.Duration(max(c.MaxDuration, c.Duration))
}

// Result is how an attempt ended, as reported to Done.
type Result int

// The possible results of an attempt.
const (
	Success  Result = iota + 1 // upstream answered 101 with a valid accept
	Failure                    // counted failure (refused, timeout, 5xx, 401/403, bad handshake...)
	Capacity                   // 408/429: skip for retryAfter or duration, not a failure
	Neutral                    // neither success nor failure (relayed 4xx, 428, client gone)
)

// String returns the name of the result.
func (r Result) String() string {
	switch r {
	case Success:
		return "success"
	case Failure:
		return "failure"
	case Capacity:
		return "capacity"
	case Neutral:
		return "neutral"
	}
	return fmt.Sprintf("Result(%d)", int(r))
}

// Permit is the right to make one attempt, returned by Acquire. Pass it back
// to Done exactly once. The zero Permit is not valid: Done ignores it.
type Permit struct {
	trial bool
	gen   uint64
}

// Trial reports whether this attempt is the single trial after a cooldown.
func (p Permit) Trial() bool { return p.trial }

// Change is what a call to Done changed.
type Change int

// The possible changes reported by Done.
const (
	NoChange   Change = iota
	CooledDown        // a failure cooldown started (Snapshot().Until tells until when)
	Skipped           // a capacity skip started or was extended (Until moved later)
	Recovered         // a trial succeeded, or the first success after a capacity skip: healthy again
)

// String returns the name of the change.
func (c Change) String() string {
	switch c {
	case NoChange:
		return "no change"
	case CooledDown:
		return "cooled down"
	case Skipped:
		return "skipped"
	case Recovered:
		return "recovered"
	}
	return fmt.Sprintf("Change(%d)", int(c))
}

// bucket counts the attempts of one window/WindowBuckets slice of time.
type bucket struct {
	idx      int64 // absolute bucket number (time / width); valid only if attempts > 0
	attempts int
	failures int
}

// window is the sliding failure-rate window: a ring of time buckets.
type window struct {
	width   time.Duration
	buckets [WindowBuckets]bucket
}

func newWindow(length time.Duration) window {
	w := length / WindowBuckets
	if w <= 0 {
		w = 1
	}
	return window{width: w}
}

func (w *window) index(t time.Time) int64 {
	n := t.UnixNano()
	d := int64(w.width)
	q := n / d
	if n%d != 0 && n < 0 {
		q--
	}
	return q
}

func (w *window) add(now time.Time, failure bool) {
	idx := w.index(now)
	slot := int(((idx % WindowBuckets) + WindowBuckets) % WindowBuckets)
	b := &w.buckets[slot]
	if b.idx != idx || b.attempts == 0 {
		*b = bucket{idx: idx}
	}
	b.attempts++
	if failure {
		b.failures++
	}
}

// counts returns the attempts and failures of the buckets still in the
// window at now: those whose index is within the last WindowBuckets.
func (w *window) counts(now time.Time) (attempts, failures int) {
	cur := w.index(now)
	for i := range w.buckets {
		b := &w.buckets[i]
		if b.attempts == 0 || b.idx > cur || b.idx <= cur-WindowBuckets {
			continue
		}
		attempts += b.attempts
		failures += b.failures
	}
	return attempts, failures
}

func (w *window) clear() {
	w.buckets = [WindowBuckets]bucket{}
}

// Health is the health state machine of one provider. It is safe for
// concurrent use.
type Health struct {
	mu     sync.Mutex
	now    func() time.Time
	cfg    Config // always WithDefaults
	single bool

	win window

	gen      uint64 // current generation; starts at 1 so the zero Permit is stale
	resetGen uint64 // generation of the last Reset (or 1)

	cooldownUntil time.Time // end of the current/last failure cooldown
	skipUntil     time.Time // end of the current/last capacity skip
	needTrial     bool      // a cooldown happened and no trial has succeeded yet
	trialInFlight bool      // the trial permit of generation gen is out
	afterSkip     bool      // a capacity skip happened and no success followed yet
	streak        int       // back-to-back cooldowns
	// probeTrials: an active health check takes the trial after a
	// cooldown (AcquireProbe); clients never do.
	probeTrials bool

	attempts, failures int64
	cooldowns          int64
}

// Clock is the time source of a Health; tests use a fake one. The queue's
// clocks (queue.Clock) are Clocks too, so one clock drives both.
type Clock interface {
	Now() time.Time
}

// New returns the health of a provider in the normal state. cfg is used
// after WithDefaults; a nil clock is the real one. The provider is assumed
// not to be its handler's only one until Configure says so.
func New(cfg Config, clock Clock) *Health {
	now := time.Now
	if clock != nil {
		now = clock.Now
	}
	cfg = cfg.WithDefaults()
	return &Health{
		now:      now,
		cfg:      cfg,
		win:      newWindow(time.Duration(cfg.Window)),
		gen:      1,
		resetGen: 1,
	}
}

// Configure replaces the config (on config reload) and whether the provider
// is its handler's only one; keeps the state. cfg is used after WithDefaults.
// A cooldown or skip in progress keeps its end; the new durations apply from
// the next one. If the window length changes, the window is cleared.
func (h *Health) Configure(cfg Config, single bool) {
	cfg = cfg.WithDefaults()
	h.mu.Lock()
	defer h.mu.Unlock()
	if cfg.Window != h.cfg.Window {
		h.win = newWindow(time.Duration(cfg.Window))
	}
	h.cfg = cfg
	h.single = single
}

// blockedLocked reports whether a cooldown or skip is running at now.
func (h *Health) blockedLocked(now time.Time) bool {
	return now.Before(h.cooldownUntil) || now.Before(h.skipUntil)
}

// untilLocked returns the later of the running cooldown and skip ends, or
// zero when neither is running.
func (h *Health) untilLocked(now time.Time) time.Time {
	var u time.Time
	if now.Before(h.cooldownUntil) {
		u = h.cooldownUntil
	}
	if now.Before(h.skipUntil) && h.skipUntil.After(u) {
		u = h.skipUntil
	}
	return u
}

func (h *Health) availableLocked(now time.Time) bool {
	if h.blockedLocked(now) {
		return false
	}
	if h.needTrial && h.probeTrials {
		return false // the trial is the probe's
	}
	return !(h.needTrial && h.trialInFlight)
}

// SetProbeTrials says whether an active health check probes the provider.
// While it does, the trial after a cooldown is the probe's (AcquireProbe):
// Acquire refuses it, so no client pays for a provider that is still down,
// and the provider stays unavailable until a probe passes. Turning it off
// (the health check left the config) lets the next Acquire take the trial.
func (h *Health) SetProbeTrials(on bool) {
	h.mu.Lock()
	h.probeTrials = on
	h.mu.Unlock()
}

// AcquireProbe is Acquire for an active health check's probe: refused
// while a cooldown or skip runs or a trial is in flight; once a cooldown
// has run out the probe gets the trial permit, whether or not
// SetProbeTrials is on.
func (h *Health) AcquireProbe() (p Permit, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	if h.blockedLocked(now) || (h.needTrial && h.trialInFlight) {
		return Permit{}, false
	}
	return h.permitLocked(), true
}

// permitLocked issues the next permit of an available provider: the trial
// after a cooldown, or an ordinary one.
func (h *Health) permitLocked() Permit {
	if h.needTrial {
		// A fresh generation per trial, so that a result reported twice for
		// an earlier trial cannot end this one.
		h.gen++
		h.trialInFlight = true
		return Permit{trial: true, gen: h.gen}
	}
	return Permit{gen: h.gen}
}

// Acquire asks whether an attempt may go to the provider now. ok is false
// while in cooldown or capacity skip, or while a trial is in flight. When a
// cooldown has expired, the first caller gets a trial permit (p.Trial() is
// true) and every other caller is refused until that trial ends; with
// SetProbeTrials on, that trial is left to AcquireProbe.
func (h *Health) Acquire() (p Permit, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	if !h.availableLocked(now) {
		return Permit{}, false
	}
	return h.permitLocked(), true
}

// Available is like Acquire but takes nothing (no trial is started): it
// reports whether Acquire would currently succeed. It is used e.g. for status
// or to decide whether to queue.
func (h *Health) Available() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.availableLocked(h.now())
}

// Done records how the attempt of p ended. retryAfter is used only with
// Capacity (0 means absent). It returns what changed; see the package
// documentation for how stale permits are handled.
func (h *Health) Done(p Permit, r Result, retryAfter time.Duration) Change {
	h.mu.Lock()
	defer h.mu.Unlock()
	if p.gen == 0 || p.gen < h.resetGen {
		return NoChange // zero Permit, or issued before the last Reset
	}
	now := h.now()
	current := p.gen == h.gen
	isTrial := p.trial && current && h.trialInFlight
	if p.trial && !isTrial {
		current = false // a trial that already ended (or was superseded)
	}

	switch r {
	case Success, Failure:
		failure := r == Failure
		h.attempts++
		if failure {
			h.failures++
		}
		if !current {
			return NoChange
		}
		if isTrial {
			h.trialInFlight = false
			if failure {
				h.startCooldownLocked(now)
				return CooledDown
			}
			h.needTrial = false
			h.streak = 0
			h.afterSkip = false
			h.win.add(now, false)
			return Recovered
		}
		h.win.add(now, failure)
		if h.shouldTripLocked(now) {
			h.startCooldownLocked(now)
			return CooledDown
		}
		if !failure && h.afterSkip && !h.blockedLocked(now) {
			h.afterSkip = false
			return Recovered
		}
		return NoChange

	case Capacity:
		if isTrial {
			h.trialInFlight = false
		}
		d := retryAfter
		if d <= 0 {
			d = time.Duration(h.cfg.Duration)
		}
		if limit := h.cfg.maxDuration(); d > limit {
			d = limit
		}
		before := h.untilLocked(now)
		end := now.Add(d)
		if end.After(h.skipUntil) {
			h.skipUntil = end
		}
		h.afterSkip = true
		if h.untilLocked(now).After(before) {
			return Skipped
		}
		return NoChange

	default: // Neutral, or an unknown result
		if isTrial {
			h.trialInFlight = false
		}
		return NoChange
	}
}

// shouldTripLocked applies the cooldown rule to the current window.
func (h *Health) shouldTripLocked(now time.Time) bool {
	attempts, failures := h.win.counts(now)
	if attempts == 0 {
		return false
	}
	if h.single {
		need := max(SingleProviderMinRequests, h.cfg.MinRequests)
		return attempts >= need && failures == attempts
	}
	if attempts < h.cfg.MinRequests {
		return false
	}
	return float64(failures)/float64(attempts) > h.cfg.FailureThreshold
}

// cooldownLength returns the length of the streak-th back-to-back cooldown
// (streak >= 1): duration doubled streak-1 times, capped.
func (h *Health) cooldownLength(streak int) time.Duration {
	limit := h.cfg.maxDuration()
	d := time.Duration(h.cfg.Duration)
	for i := 1; i < streak && d < limit; i++ {
		if d > math.MaxInt64/2 {
			d = limit
			break
		}
		d *= 2
	}
	if d > limit {
		d = limit
	}
	return d
}

func (h *Health) startCooldownLocked(now time.Time) {
	h.streak++
	h.cooldownUntil = now.Add(h.cooldownLength(h.streak))
	h.needTrial = true
	h.trialInFlight = false
	h.afterSkip = false
	h.gen++
	h.win.clear()
	h.cooldowns++
}

// Until returns the end of the current cooldown or capacity skip (the later
// of the two when both run), or the zero time when none is running: the
// caller schedules a wake-up then. After a cooldown has expired it returns
// zero even though the next attempt will be a trial.
func (h *Health) Until() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.untilLocked(h.now())
}

// Snapshot is a consistent view of a provider's health, for status.
type Snapshot struct {
	// Healthy is false exactly while in a failure cooldown, in a capacity
	// skip, or while the trial after a cooldown is in flight. Once a
	// cooldown has expired and no trial has started yet, Healthy is true
	// (the provider may be tried; the next Acquire gets the trial), unless
	// the trial is left to a probe (SetProbeTrials): then it stays false
	// until a probe passes. Healthy equals Available().
	Healthy bool
	// Until is the end of the running cooldown or skip; zero when none.
	Until time.Time
	// TrialInFlight is true while the trial after a cooldown is out.
	TrialInFlight bool
	// Streak is the number of back-to-back cooldowns so far (0 when normal,
	// i.e. after a successful trial or Reset).
	Streak int
	// Attempts and Failures are totals (Success and Failure results) since
	// start or Reset. Capacity and Neutral results are not attempts.
	Attempts, Failures int64
	// WindowAttempts and WindowFailures are the counts currently in the
	// failure-rate window.
	WindowAttempts, WindowFailures int
	// Cooldowns is the number of failure cooldowns started since start or
	// Reset.
	Cooldowns int64
}

// Snapshot returns the current state.
func (h *Health) Snapshot() Snapshot {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	wa, wf := h.win.counts(now)
	return Snapshot{
		Healthy:        h.availableLocked(now),
		Until:          h.untilLocked(now),
		TrialInFlight:  h.needTrial && h.trialInFlight,
		Streak:         h.streak,
		Attempts:       h.attempts,
		Failures:       h.failures,
		WindowAttempts: wa,
		WindowFailures: wf,
		Cooldowns:      h.cooldowns,
	}
}

// Config returns the effective configuration (after WithDefaults).
func (h *Health) Config() Config {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cfg
}

// Reset ends any cooldown, skip or trial, and clears the window, the totals
// and the doubling. Results of permits issued before Reset are ignored. It
// reports whether the provider was not healthy (in cooldown or skip, or
// waiting for its trial) until then.
func (h *Health) Reset() (wasDown bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	wasDown = h.blockedLocked(h.now()) || h.needTrial
	h.gen++
	h.resetGen = h.gen
	h.win.clear()
	h.cooldownUntil = time.Time{}
	h.skipUntil = time.Time{}
	h.needTrial = false
	h.trialInFlight = false
	h.afterSkip = false
	h.streak = 0
	h.attempts, h.failures, h.cooldowns = 0, 0, 0
	return wasDown
}

// Adopt takes on a cooldown that another gateway node started (shared
// state): until it ends the provider is skipped, then a single trial runs
// here as after a local cooldown. streak is that cooldown's doubling count;
// the next local cooldown doubles from the larger of it and the local one.
// A cooldown that ends no later than the one already running changes
// nothing; Adopt reports whether it took.
func (h *Health) Adopt(until time.Time, streak int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	if !until.After(now) || !until.After(h.cooldownUntil) {
		return false
	}
	h.cooldownUntil = until
	if streak > h.streak {
		h.streak = streak
	}
	h.needTrial = true
	h.trialInFlight = false
	h.afterSkip = false
	h.gen++ // permits out now report into the adopted cooldown's past
	h.win.clear()
	return true
}

// AdoptSkip takes on a 408/429 skip that another gateway node learnt
// (shared state): the provider is skipped until then, exactly as after a
// local Capacity result, and nothing else changes: no trial follows, the
// doubling and the failure window are untouched, and permits out now
// still count. It never shortens a skip already running; it reports
// whether the provider is now skipped for longer than before.
func (h *Health) AdoptSkip(until time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	if !until.After(now) || !until.After(h.skipUntil) {
		return false
	}
	before := h.untilLocked(now)
	h.skipUntil = until
	return h.untilLocked(now).After(before)
}

// Ends returns the end of the running failure cooldown and of the running
// capacity skip, each zero when not running: what another node is told of
// (a cooldown is followed by a trial, a skip is not).
func (h *Health) Ends() (cooldownUntil, skipUntil time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	if now.Before(h.cooldownUntil) {
		cooldownUntil = h.cooldownUntil
	}
	if now.Before(h.skipUntil) {
		skipUntil = h.skipUntil
	}
	return cooldownUntil, skipUntil
}

// Streak is the number of back-to-back cooldowns so far.
func (h *Health) Streak() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.streak
}
