package gateway

import (
	"github.com/browserfailover/caddy-browser-failover/config"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/spend"
)

// Spend, on a client's way: its client key's book is taken by its ticket
// as it joins, and a key over its budget gets 429 (overClientBudget); each
// attempt's admission holds the session's first cost in the provider's
// and the key's books (reserveSpend), so connects admitted together cannot
// overshoot either budget; the hold becomes the session's meter at the
// 101 and its cost is counted when its ticket is released (pool's
// Ticket: a resume that kept its provider session goes on with the meter
// it kept; a hedge loser's session is charged at once). A provider over
// its budget is skipped by admission; the shared totals are read and
// learnt caps shared in shared.go.

// joinClientBudget takes the client's book under client_budget and
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
// client key's (answer 429). A warm-up is refused as well when the
// provider's budget could not pay for a session of expected_duration
// (c.ahead) besides what it spent, accrued and holds.
func (c *connect) reserveSpend(st *pool.ProviderState) (*spend.Hold, *spend.Over) {
	book, amount := c.ticket.ClientBook(), 0.0
	if cb := c.h.ClientBudget; cb != nil && book != nil {
		amount = cb.Amount
	}
	return st.Spend.Reserve(book, amount, c.ahead)
}

// clientBookOf has the client's ticket take the book of its key under cb.
func (c *connect) clientBookOf(cb *config.ClientBudgetConfig) *spend.Book {
	value := ""
	if c.replace != nil {
		value = c.replace(cb.Key)
	}
	return c.ticket.UseClientBook(pool.ClientBookID{Template: cb.Key, Per: cb.Per, Value: value}, cb.Amount)
}
