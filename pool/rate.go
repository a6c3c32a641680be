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

// Starts are a provider's record of the sessions this node asked it to
// start, for its create_rate. They live in the provider's entry, so a
// reload keeps them: a reload that changes the cap applies the new cap to
// the starts already counted.
type Starts struct {
	p *ProviderState

	mu   sync.Mutex
	rate CreateRate
	// at are the starts still in the window, oldest first.
	at []time.Time
	// refusedUntil is when the window admits a start again, as the last
	// refusal said (Refused).
	refusedUntil time.Time
}

// SetRate sets the provider's create_rate for the config load that
// claimed it last (a load that fails gives the one before back, see
// ReleaseClaim). A cap that grew or went lets waiters in now.
func (s *Starts) SetRate(r CreateRate) {
	s.mu.Lock()
	before := s.rate
	s.rate = r
	s.mu.Unlock()
	if before.N > 0 && (r.N == 0 || r.N > before.N || r.Window < before.Window) {
		s.p.Notify()
	}
}

// Rate is the provider's create_rate (zero: none).
func (s *Starts) Rate() CreateRate {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rate
}

// Start is one start of a session counted in a provider's create_rate
// window, kept by the attempt it was taken for: when the provider started
// nothing for it (it refused the attempt with a 4xx), it is given back
// (Starts.GiveBack), as if never taken. The zero value counts nothing.
type Start struct {
	// at is this node's record of it (zero: none).
	at time.Time
	// Shared is its member in the window over every node (state redis;
	// "": none), which the caller gives back there.
	Shared string
}

// Take counts one start of a session at the provider if its create_rate
// allows one now (st is that start); else it reports when the window
// admits one again: when enough of the starts in it have left. Without a
// create_rate every start is allowed, and none is counted.
func (s *Starts) Take() (st Start, ok bool, retryAt time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rate.N <= 0 {
		return Start{}, true, time.Time{}
	}
	now := s.p.reg.Now()
	s.pruneLocked(now)
	if n := len(s.at); n >= s.rate.N {
		// Below the cap once the n-N+1 oldest have left.
		return Start{}, false, s.at[n-s.rate.N].Add(s.rate.Window)
	}
	s.at = append(s.at, now)
	return Start{at: now}, true, time.Time{}
}

// Record counts a start the shared state allowed (under state redis the
// window over every node decides; shared is its member there), so that
// this node's own window knows it should the shared state become
// unreachable. It returns the start, for GiveBack.
func (s *Starts) Record(shared string) Start {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rate.N <= 0 {
		return Start{Shared: shared}
	}
	now := s.p.reg.Now()
	s.pruneLocked(now)
	s.at = append(s.at, now)
	return Start{at: now, Shared: shared}
}

// GiveBack takes st out of this node's window: the provider started
// nothing for it. When the window turned a client away since (a refusal
// not over yet), the provider is offered to the queue: a waiter may take
// the start now. A start already out of the window changes nothing.
// (st.Shared is the caller's to give back.)
func (s *Starts) GiveBack(st Start) {
	if st.at.IsZero() {
		return
	}
	s.mu.Lock()
	i := slices.IndexFunc(s.at, func(at time.Time) bool { return at.Equal(st.at) })
	if i < 0 {
		s.mu.Unlock()
		return
	}
	s.at = slices.Delete(s.at, i, i+1)
	refused := s.refusedUntil.After(s.p.reg.Now())
	if refused {
		s.refusedUntil = time.Time{}
	}
	s.mu.Unlock()
	if refused {
		s.p.Notify()
	}
}

// Refused notes that a start was refused until at (by this node's window
// or the shared one): the queue offers the provider then, and clients
// answered meanwhile are told to come back then (RefusedUntil).
func (s *Starts) Refused(at time.Time) {
	s.mu.Lock()
	s.refusedUntil = at
	s.mu.Unlock()
	s.p.WakeAt(at)
}

// RefusedUntil is when the provider's window admits a start again, as its
// last refusal said; a time past (or zero) when none is refused now.
func (s *Starts) RefusedUntil() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refusedUntil
}

// InWindow is the number of starts this node counted in the provider's
// current window.
func (s *Starts) InWindow() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneLocked(s.p.reg.Now())
	return len(s.at)
}

// pruneLocked drops the starts that left the window: those Window or
// longer ago. Without a create_rate none is kept.
func (s *Starts) pruneLocked(now time.Time) {
	if s.rate.N <= 0 {
		s.at = nil
		return
	}
	k := 0
	for k < len(s.at) && !s.at[k].Add(s.rate.Window).After(now) {
		k++
	}
	if k > 0 {
		s.at = append(s.at[:0], s.at[k:]...)
	}
}
