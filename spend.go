package browserfailover

import (
	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/spend"
)

// Spend, on a client's way: its client key's budget is checked as it
// joins (a key over it gets 429, overClientBudget), its session's meter
// starts at the 101 (a resume that kept its provider session goes on with
// the meter it kept) and stops with the session's holds (charge, in
// spend_charge.go); a hedge loser's session is charged at once. A
// provider over its budget is skipped in the chain's pick; the shared
// totals are read and learnt caps shared in shared.go.

// joinClientBudget finds the client's book under client_budget and
// answers 429 when its budget is spent: it reports false then.
func (c *connect) joinClientBudget() bool {
	cb := c.h.ClientBudget
	if cb == nil {
		return true
	}
	book := c.clientBookOf(cb)
	c.clientBook = book
	if over, turn := book.Reached(); over {
		c.finish(c.overClientBudget(book, turn))
		return false
	}
	return true
}

// startMeter starts metering the session the client gets at st (a resume
// that kept its provider session goes on with the meter it kept).
func (c *connect) startMeter(st *pool.Provider) *spend.Meter {
	if c.meter != nil {
		m := c.meter
		c.meter = nil
		return m
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

// clientBookOf is the book of the client's key under cb.
func (c *connect) clientBookOf(cb *ClientBudgetConfig) *spend.Book {
	value := ""
	if c.replace != nil {
		value = c.replace(cb.Key)
	}
	return c.h.reg.ClientBook(value, &cb.Budget)
}
