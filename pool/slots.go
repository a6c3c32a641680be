package pool

import (
	"sync/atomic"
	"time"

	"github.com/browserfailover/caddy-browser-failover/cooldown"
)

// Slots are a provider's live sessions and the attempts in flight, and
// the limit they are held to: max_concurrent, or with max_concurrent auto
// the cap learnt from the provider's refusals, or the limit its capacity
// probe reported; and whether that probe says it is full. Everything is
// an atomic read on the connect path. A ticket takes a slot (Admit) and
// gives it back (Ticket.Release); no other code does.
type Slots struct {
	p *ProviderState

	used atomic.Int64 // reserved for attempts in flight plus live
	live atomic.Int64
	max  atomic.Int64 // 0: unlimited
	// skippedFull: someone was turned away as full since the last
	// unreserveFailed that woke the queues.
	skippedFull atomic.Bool
	// What the last capacity probe said (probe.go): the provider takes no
	// new session; its own limit, which serves as max_concurrent when
	// none is configured (0: none learnt).
	capFull   atomic.Bool
	probedMax atomic.Int64
	// learnt is the cap learnt from the provider's refusals; nil unless
	// its max_concurrent is auto (Spend.SetPricing).
	learnt atomic.Pointer[cooldown.LearntCap]
}

// tryReserve takes a slot for an attempt if the provider has room: below
// its limit (Limit), and not full by its last capacity probe.
func (s *Slots) tryReserve() bool {
	if s.capFull.Load() {
		return false
	}
	for {
		u := s.used.Load()
		m := s.Limit()
		if m > 0 && u >= m {
			s.reachedLimit(u)
			return false
		}
		if s.used.CompareAndSwap(u, u+1) {
			if m > 0 && u+1 >= m {
				s.reachedLimit(u + 1)
			}
			return true
		}
	}
}

// Full reports whether the provider takes no new session: at its limit
// (Limit), or full by its last capacity probe.
func (s *Slots) Full() bool {
	if s.capFull.Load() {
		return true
	}
	m := s.Limit()
	if u := s.used.Load(); m > 0 && u >= m {
		s.reachedLimit(u)
		return true
	}
	return false
}

// Limit is the most live sessions the provider takes: max_concurrent; or
// with max_concurrent auto the cap learnt from its refusals; or, when
// neither is set, the limit its capacity probe reported (0: unlimited).
func (s *Slots) Limit() int64 {
	if m := s.max.Load(); m > 0 {
		return m
	}
	if l := s.LearntCap(); l != nil {
		return l.Cap()
	}
	return s.probedMax.Load()
}

// giveBack frees one slot; the last one of a provider that left the
// config lets its entry go.
func (s *Slots) giveBack() int64 {
	u := s.used.Add(-1)
	if u == 0 {
		s.p.reg.unretire(s.p)
	}
	return u
}

// unreserve gives back a slot whose attempt did not establish a session.
func (s *Slots) unreserve() {
	s.giveBack()
	s.p.Notify()
}

// unreserveFailed gives back the slot of an attempt the provider failed
// (an error, 408/429, 428) without waking the queues at once: the waiter
// that made the attempt would get the wake-up itself (the queue re-delivers
// a wake-up missed during a pass) and retry the failing provider in a
// tight loop. If the provider was full and turned someone away meanwhile
// (SkippedFull), the queues are woken a second later instead, like the
// once-a-second retry of providers that failed without cooling down.
func (s *Slots) unreserveFailed() {
	u := s.giveBack()
	if m := s.Limit(); m > 0 && u+1 >= m && s.skippedFull.Swap(false) {
		s.p.WakeAt(s.p.reg.Now().Add(time.Second))
	}
}

// SkippedFull notes that a client passed the provider over as full.
func (s *Slots) SkippedFull() { s.skippedFull.Store(true) }

// establish turns a reserved slot into a live session, listed in the
// session registry under info (its Provider is set here).
func (s *Slots) establish(e *LiveSession) {
	s.live.Add(1)
	e.Provider = s.p.name
	s.p.reg.Sessions.add(e)
}

// end frees a live session's slot. The live count drops before the slot
// is given back, so a session that takes the slot at once is never
// counted beside the one that left it (live never exceeds the limit).
func (s *Slots) end(l Live) {
	s.p.reg.Sessions.remove(l)
	s.live.Add(-1)
	s.giveBack()
	s.p.Notify()
}

// park ends a live session whose provider session lives on while it is
// parked for a resume (a session created over a session API, not yet
// released): it leaves the session registry and the live count, but its
// slot stays taken, so the parked session still counts against
// max_concurrent. The slot is given back with unreserve when the window
// ends, or taken over by the resume (establish, as after tryReserve).
func (s *Slots) park(l Live) {
	s.p.reg.Sessions.remove(l)
	s.live.Add(-1)
}

// Active is the number of live sessions.
func (s *Slots) Active() int64 { return s.live.Load() }

// Reserved is live sessions plus attempts in flight.
func (s *Slots) Reserved() int64 { return s.used.Load() }

// MaxConcurrent is the configured limit (0: unlimited).
func (s *Slots) MaxConcurrent() int64 { return s.max.Load() }

// LearntCap is the provider's learnt cap, nil unless its max_concurrent
// is auto.
func (s *Slots) LearntCap() *cooldown.LearntCap { return s.learnt.Load() }

// learn keeps, drops or makes the learnt cap as a config load's pricing
// says (Pricing.Auto, Pricing.Interval): a learnt cap survives a reload
// that keeps auto.
func (s *Slots) learn(pr Pricing) {
	switch l := s.learnt.Load(); {
	case !pr.Auto:
		s.learnt.Store(nil)
	case l == nil:
		s.learnt.Store(cooldown.NewLearntCap(pr.Interval, s.p.reg.Now))
	default:
		l.SetInterval(pr.Interval)
	}
}

// Refused records a refusal for capacity while live sessions were live on
// the provider (over every node under shared state): with a learnt cap,
// the cap becomes live and true is returned, so the caller does not skip
// the provider; false otherwise.
func (s *Slots) Refused(live int64) bool {
	l := s.LearntCap()
	if l == nil || !l.Refused(live) {
		return false
	}
	// Waiters beyond the cap wait for a slot to free.
	return true
}

// reachedLimit notes, for a learnt cap, that the reserved slots reached
// n.
func (s *Slots) reachedLimit(n int64) {
	if l := s.LearntCap(); l != nil {
		l.Reached(n)
		// The cap may rise then: waiters for the provider are offered
		// it at that time, to find the room a rise makes.
		if t := l.NextRise(); !t.IsZero() {
			s.p.WakeAt(t)
		}
	}
}

// probed records what a capacity probe said: full, and the provider's own
// limit (0: none read).
func (s *Slots) probed(full bool, limit int64) {
	s.probedMax.Store(limit)
	s.capFull.Store(full)
}
