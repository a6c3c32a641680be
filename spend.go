package browserfailover

import (
	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/spend"
)

// Spend, on a client's way: its client key's budget is checked as it
// joins (a key over it gets 429, overClientBudget); each attempt's
// admission holds the session's first cost in the provider's and the
// key's books (reserveSpend), so connects admitted together cannot
// overshoot either budget; the hold becomes the session's meter at the
// 101 (a resume that kept its provider session goes on with the meter it
// kept) and stops with the session's holds (charge, in spend_charge.go);
// a hedge loser's session is charged at once. A provider over its budget
// is skipped in the chain's pick; the shared totals are read and learnt
// caps shared in shared.go.

// joinClientBudget finds the client's book under client_budget and
// answers 429 when its budget is spent: it reports false then.
func (c *connect) joinClientBudget() bool {
	cb := c.h.ClientBudget
	if cb == nil {
		return true
	}
	book := c.clientBookOf(cb)
	if over, turn := book.ReachedAt(cb.Amount); over {
		c.finish(c.overClientBudget(book, turn))
		return false
	}
	return true
}

// reserveSpend holds, for an attempt at st, what its session will cost
// at its first moment in the provider's book and the client key's. over
// is set when a budget refuses it: the provider's (skip it) or the
// client key's (answer 429).
func (c *connect) reserveSpend(st *pool.Provider) (*spend.Hold, *spend.Over) {
	amount := 0.0
	if cb := c.h.ClientBudget; cb != nil && c.clientBook != nil {
		amount = cb.Amount
	}
	return st.Reserve(c.clientBook, amount)
}

// startMeter starts metering the session the client gets at st: its
// admission's hold becomes the meter (a resume that kept its provider
// session goes on with the meter it kept).
func (c *connect) startMeter(st *pool.Provider) *spend.Meter {
	if c.meter != nil {
		m := c.meter
		c.meter = nil
		return m
	}
	if c.hold != nil {
		h := c.hold
		c.hold = nil
		return h.Start()
	}
	return st.Meter(c.clientBook)
}

// chargeLoser counts what a hedge loser that answered 101 costs: its
// provider created a session for it, which it charges for (a price per
// session in full, a rate for its minimum).
func (h *Handler) chargeLoser(m *member) {
	st := m.state
	cost := st.Pricing().Cost.Of(0)
	if cost <= 0 {
		return
	}
	meter := st.Meter(nil)
	var store *cluster.Shared
	if h.shared != nil {
		store = h.shared.s
	}
	charge(h.reg, m.up.Name, meter, store)
}

// clientBookOf takes the book of the client's key under cb for the rest
// of the client's way (leaveClientBook gives it back).
func (c *connect) clientBookOf(cb *ClientBudgetConfig) *spend.Book {
	value := ""
	if c.replace != nil {
		value = c.replace(cb.Key)
	}
	c.leaveClientBook()
	c.clientBook = c.h.reg.ClientBook(pool.ClientBookID{Template: cb.Key, Per: cb.Per, Value: value}, cb.Amount)
	return c.clientBook
}

// leaveClientBook ends the client's use of its key's book: a session's
// meter, or what it spent, keeps the book from then on.
func (c *connect) leaveClientBook() {
	c.h.reg.LeaveClientBook(c.clientBook)
	c.clientBook = nil
}
