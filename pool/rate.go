package pool

import (
	"slices"
	"sync"
	"time"
)

// CreateRate caps the sessions a provider is asked to start: at most N in
// any Window, a sliding window (a start counts until Window after it), not
// a calendar one. The zero value caps nothing.
type CreateRate struct {
	N      int
	Window time.Duration
}

// starts is a provider's record of the sessions this node asked it to
// start, for its create_rate. It lives in the provider's entry, so a
// reload keeps it: a reload that changes the cap applies the new cap to
// the starts already counted.
type starts struct {
	startsMu sync.Mutex
	rate     CreateRate
	// at are the starts still in the window, oldest first.
	at []time.Time
	// refusedUntil is when the window admits a start again, as the last
	// refusal said (RateRefused).
	refusedUntil time.Time
}

// SetCreateRate sets the provider's create_rate for the config load that
// claimed it last (a load that fails gives the one before back, see
// ReleaseClaim). A cap that grew or went lets waiters in now.
func (p *Provider) SetCreateRate(r CreateRate) {
	p.startsMu.Lock()
	before := p.rate
	p.rate = r
	p.startsMu.Unlock()
	if before.N > 0 && (r.N == 0 || r.N > before.N || r.Window < before.Window) {
		p.Notify()
	}
}

// CreateRate is the provider's create_rate (zero: none).
func (p *Provider) CreateRate() CreateRate {
	p.startsMu.Lock()
	defer p.startsMu.Unlock()
	return p.rate
}

// Start is one start of a session counted in a provider's create_rate
// window, kept by the attempt it was taken for: when the provider started
// nothing for it (it refused the attempt with a 4xx), it is given back
// (GiveBackStart), as if never taken. The zero value counts nothing.
type Start struct {
	// at is this node's record of it (zero: none).
	at time.Time
	// Shared is its member in the window over every node (state redis;
	// "": none), which the caller gives back there.
	Shared string
}

// TakeStart counts one start of a session at the provider if its
// create_rate allows one now (s is that start); else it reports when the
// window admits one again: when enough of the starts in it have left.
// Without a create_rate every start is allowed, and none is counted.
func (p *Provider) TakeStart() (s Start, ok bool, retryAt time.Time) {
	p.startsMu.Lock()
	defer p.startsMu.Unlock()
	if p.rate.N <= 0 {
		return Start{}, true, time.Time{}
	}
	now := p.reg.Now()
	p.pruneStartsLocked(now)
	if n := len(p.at); n >= p.rate.N {
		// Below the cap once the n-N+1 oldest have left.
		return Start{}, false, p.at[n-p.rate.N].Add(p.rate.Window)
	}
	p.at = append(p.at, now)
	return Start{at: now}, true, time.Time{}
}

// RecordStart counts a start the shared state allowed (under state redis
// the window over every node decides; shared is its member there), so
// that this node's own window knows it should the shared state become
// unreachable. It returns the start, for GiveBackStart.
func (p *Provider) RecordStart(shared string) Start {
	p.startsMu.Lock()
	defer p.startsMu.Unlock()
	if p.rate.N <= 0 {
		return Start{Shared: shared}
	}
	now := p.reg.Now()
	p.pruneStartsLocked(now)
	p.at = append(p.at, now)
	return Start{at: now, Shared: shared}
}

// GiveBackStart takes s out of this node's window: the provider started
// nothing for it. When the window turned a client away since (a refusal
// not over yet), the provider is offered to the queue: a waiter may take
// the start now. A start already out of the window changes nothing.
// (s.Shared is the caller's to give back.)
func (p *Provider) GiveBackStart(s Start) {
	if s.at.IsZero() {
		return
	}
	p.startsMu.Lock()
	i := slices.IndexFunc(p.at, func(at time.Time) bool { return at.Equal(s.at) })
	if i < 0 {
		p.startsMu.Unlock()
		return
	}
	p.at = slices.Delete(p.at, i, i+1)
	refused := p.refusedUntil.After(p.reg.Now())
	if refused {
		p.refusedUntil = time.Time{}
	}
	p.startsMu.Unlock()
	if refused {
		p.Notify()
	}
}

// RateRefused notes that a start was refused until at (by this node's
// window or the shared one): the queue offers the provider then, and
// clients answered meanwhile are told to come back then (RefusedUntil).
func (p *Provider) RateRefused(at time.Time) {
	p.startsMu.Lock()
	p.refusedUntil = at
	p.startsMu.Unlock()
	p.WakeAt(at)
}

// RefusedUntil is when the provider's window admits a start again, as its
// last refusal said; a time past (or zero) when none is refused now.
func (p *Provider) RefusedUntil() time.Time {
	p.startsMu.Lock()
	defer p.startsMu.Unlock()
	return p.refusedUntil
}

// StartsInWindow is the number of starts this node counted in the
// provider's current window.
func (p *Provider) StartsInWindow() int {
	p.startsMu.Lock()
	defer p.startsMu.Unlock()
	p.pruneStartsLocked(p.reg.Now())
	return len(p.at)
}

// pruneStartsLocked drops the starts that left the window: those Window
// or longer ago. Without a create_rate none is kept.
func (p *Provider) pruneStartsLocked(now time.Time) {
	if p.rate.N <= 0 {
		p.at = nil
		return
	}
	k := 0
	for k < len(p.at) && !p.at[k].Add(p.rate.Window).After(now) {
		k++
	}
	if k > 0 {
		p.at = append(p.at[:0], p.at[k:]...)
	}
}
