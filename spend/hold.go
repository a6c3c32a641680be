package spend

import (
	"sync"
	"time"
)

// Holds: a session's cost counted from the moment it is admitted, not only
// from its start. A connect is admitted when its budgets are not reached,
// but its session starts (and its meter with it) only when the provider
// has answered, hundreds of milliseconds later; without a hold, every
// client admitted in between would see the same budget and all of them
// would get a session. So admission holds what the session will cost at
// its first moment (a price per session in full, a rate's minimum) in its
// books, where it counts toward their budgets like a live session's
// accrued cost; the hold becomes the session's meter when the session
// starts, or is dropped when the attempt fails.

// Hold is the cost of one session being admitted, held in its books until
// the session starts (Start) or the attempt is given up (Drop). A nil Hold
// holds nothing (a provider without a price).
type Hold struct {
	cost   *Cost
	amount float64
	books  [2]*Book

	mu   sync.Mutex
	done bool
}

// Over says why a reservation was refused.
type Over struct {
	// Book is the book whose budget is reached.
	Book *Book
	// Held: the budget is reached only with what other sessions being
	// admitted hold; it has room again if they fail.
	Held bool
}

// Reserve admits a session at cost c against the provider's book, held to
// its own budget, and the client key's book (nil: none), held to
// clientBudget (0: none). A budget admits a session while what was spent in
// the window, what live sessions accrued and what others being admitted
// hold stays below it. On success the session's cost at its first moment
// is held in both books (the Hold is nil when c is nil: nothing to hold);
// otherwise nothing is held and Over names the book that refused, the
// client's checked first.
func Reserve(c *Cost, provider, client *Book, clientBudget float64) (*Hold, *Over) {
	return ReserveAhead(c, provider, client, clientBudget, 0)
}

// ReserveAhead is Reserve for a session made ahead of demand (a warm
// session), which the provider's budget must be able to pay for in full:
// besides the budget not being reached, what was spent, what live
// sessions accrued, what others being admitted hold and ahead (what the
// session costs over its expected duration) must not come to more than
// the budget. The check and the hold are one step, so warm-ups admitted
// together cannot overshoot it either. ahead 0 is Reserve.
func ReserveAhead(c *Cost, provider, client *Book, clientBudget, ahead float64) (*Hold, *Over) {
	amount := c.Of(0)
	if client != nil {
		if over := client.tryHold(amount, clientBudget, 0, c != nil); over != nil {
			return nil, over
		}
	}
	if over := provider.tryHold(amount, provider.budgetAmount(), ahead, c != nil); over != nil {
		if client != nil && c != nil {
			client.unhold(amount)
		}
		return nil, over
	}
	if c == nil {
		return nil, nil
	}
	return &Hold{cost: c, amount: amount, books: [2]*Book{provider, client}}, nil
}

// budgetAmount is the book's own budget (0: none).
func (k *Book) budgetAmount() float64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.budget
}

// tryHold holds amount in the book (when hold is set) unless budget is
// reached, counting what is held already, or cannot pay ahead more.
func (k *Book) tryHold(amount, budget, ahead float64, hold bool) *Over {
	now := k.now()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.turn(now)
	if over := k.overLocked(now, budget, ahead); over != nil {
		return over
	}
	if hold {
		k.held += amount
		k.holds++
	}
	return nil
}

// overLocked says why budget (0: none) admits no other session now,
// counting what is held, or (ahead > 0) cannot pay ahead more (nil: it
// admits one); with mu held and the window turned.
func (k *Book) overLocked(now time.Time, budget, ahead float64) *Over {
	if budget <= 0 {
		return nil
	}
	st := k.readLocked(now)
	used := st.Spent + st.Accrued
	if used >= budget || used+ahead > budget {
		return &Over{Book: k}
	}
	if used+k.held >= budget || used+k.held+ahead > budget {
		return &Over{Book: k, Held: true}
	}
	return nil
}

// unhold gives back one hold of amount; called with mu not held.
func (k *Book) unhold(amount float64) {
	k.mu.Lock()
	k.unholdLocked(amount)
	k.mu.Unlock()
}

func (k *Book) unholdLocked(amount float64) {
	k.holds--
	k.held -= amount
	if k.holds <= 0 || k.held < 0 {
		// No rounding left behind once nothing is held.
		k.holds, k.held = max(k.holds, 0), 0
	}
}

// Start ends the hold as its session starts: the session's meter, from
// now, takes the held cost's place in each book in one step, so the cost
// is never counted twice nor missing. A nil or ended Hold starts nothing.
func (h *Hold) Start() *Meter {
	if h == nil || !h.end() {
		return nil
	}
	m := &Meter{cost: h.cost, start: h.books[0].now(), books: h.books}
	for _, b := range h.books {
		if b != nil {
			b.mu.Lock()
			b.unholdLocked(h.amount)
			b.live[m] = struct{}{}
			b.mu.Unlock()
		}
	}
	return m
}

// Drop gives the hold back: the attempt failed. Safe to call twice, and
// after Start.
func (h *Hold) Drop() {
	if h == nil || !h.end() {
		return
	}
	for _, b := range h.books {
		if b != nil {
			b.unhold(h.amount)
		}
	}
}

// end marks the hold ended, reporting whether it was not already.
func (h *Hold) end() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done {
		return false
	}
	h.done = true
	return true
}

// Join has a running meter count in a client key's book as well, held to
// budget (0: none), as a session admitted for the client would: it is
// refused (Over) when the budget is reached, with or without what other
// sessions being admitted hold, and nothing changes then. From then on
// the book counts the meter's whole cost, from the meter's start: a
// session made before a client took it (a warm session) costs the client
// what it cost the provider's book. A nil meter (no price) weighs nothing
// and is never refused; a meter that counts in a second book already, or
// has stopped, is refused with a nil Book.
func (m *Meter) Join(client *Book, budget float64) *Over {
	if m == nil || client == nil {
		return nil
	}
	now := client.now()
	client.mu.Lock()
	defer client.mu.Unlock()
	client.turn(now)
	if over := client.overLocked(now, budget, 0); over != nil {
		return over
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done || m.books[1] != nil {
		return &Over{}
	}
	m.books[1] = client
	client.live[m] = struct{}{}
	return nil
}
