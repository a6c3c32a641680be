package browserfailover

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/spend"
)

// Spend: each session's cost is metered from its 101 until its provider
// session ends (across a resume that keeps it), added to its provider's
// and its client key's books, counted in spend_total, and, under shared
// state, written to Redis once, where every node reads the window's
// totals. Budgets read the books: a provider over its budget is skipped
// (chain.go), a client key over its budget gets 429 (here).

// clientBudgetRetryHint is the fewest seconds a client_budget 429 asks a
// client to wait.
const clientBudgetRetryHint = 1

// joinClientBudget finds the client's book under client_budget and
// answers 429 when its budget is spent: it reports false then.
func (c *connect) joinClientBudget() bool {
	cb := c.h.ClientBudget
	if cb == nil {
		return true
	}
	value := ""
	if c.replace != nil {
		value = c.replace(cb.Key)
	}
	book := c.h.reg.ClientBook(value, &cb.Budget)
	c.clientBook = book
	if over, turn := book.Reached(); over {
		c.finish(c.overClientBudget(book, turn))
		return false
	}
	return true
}

// overClientBudget is the 429 of a client key whose budget is spent until
// turn.
func (c *connect) overClientBudget(book *spend.Book, turn time.Time) *reply {
	st := book.Read()
	retry := max(int(time.Until(turn).Seconds()+0.999), clientBudgetRetryHint)
	body := map[string]any{
		"error":         "client budget reached: this key's sessions have cost its budget for the current " + book.Period() + " (UTC)",
		"spent":         st.Spent + st.Accrued,
		"budget":        st.Budget,
		"window_end":    turn.UTC().Format(time.RFC3339),
		"retry_after_s": retry,
	}
	return &reply{status: http.StatusTooManyRequests, reason: observe.ReasonClientBudget, write: func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusTooManyRequests, body, func(hd http.Header) {
			hd.Set("Retry-After", strconv.Itoa(retry))
		})
	}}
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

// charge stops a session's meter and counts what it cost: in the
// provider's and the client key's books (Stop), the metrics, and the
// shared totals (in the background: a session's end waits for nobody).
// It returns the cost.
func charge(reg *pool.Registry, provider string, m *spend.Meter, store *cluster.Shared) float64 {
	cost, first := m.Stop()
	if !first || cost <= 0 {
		return cost
	}
	reg.Metrics().Spent(provider, cost)
	if store != nil {
		store.Retain()
		client := m.Client()
		shownClient := ""
		if client != nil {
			shownClient = reg.ShownBook(client)
		}
		go func() {
			defer store.Release()
			addShared(store, provider, cost, reg.ProviderBook(provider), cluster.ProviderScope(provider))
			if client != nil && shownClient != "" {
				addShared(store, provider, cost, client, cluster.ClientScope(shownClient))
			}
		}()
	}
	return cost
}

// addShared adds cost to scope's shared total for the book's current
// window, and tells the book the total.
func addShared(store *cluster.Shared, provider string, cost float64, book *spend.Book, scope string) {
	if book == nil || !store.Usable() {
		return
	}
	st := book.Read()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	total, err := store.Store().AddSpend(ctx, scope, st.WindowStart, st.WindowEnd, cost)
	if err != nil {
		store.Failed("spend", err)
		return
	}
	store.Worked()
	book.SetShared(st.WindowStart, total, cost)
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

// spendSyncInterval is how often a node reads the shared spend totals of
// its providers and client keys, so budgets count what other nodes' ended
// sessions cost.
const spendSyncInterval = time.Second

// syncSpend reads the shared totals of the handler's providers and the
// client keys this node knows, every spendSyncInterval until Cleanup.
func (h *Handler) syncSpend() {
	sh := h.shared
	t := time.NewTicker(spendSyncInterval)
	defer t.Stop()
	for {
		select {
		case <-sh.stop:
			return
		case <-t.C:
		}
		if !sh.s.Usable() {
			continue
		}
		var windows []cluster.SpendWindow
		var books []*spend.Book
		for _, m := range h.members {
			b := m.state.Book()
			windows = append(windows, cluster.SpendWindow{Scope: cluster.ProviderScope(m.up.Name), Start: b.Read().WindowStart})
			books = append(books, b)
		}
		if h.ClientBudget != nil {
			for _, cb := range h.reg.ClientBooks() {
				windows = append(windows, cluster.SpendWindow{Scope: cluster.ClientScope(cb.Shown), Start: cb.Book.Read().WindowStart})
				books = append(books, cb.Book)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		totals, err := sh.s.Store().ReadSpend(ctx, windows)
		cancel()
		if err != nil {
			sh.s.Failed("read spend", err)
			continue
		}
		for i, total := range totals {
			books[i].SetShared(windows[i].Start, total, 0)
		}
	}
}

// learnSharedCap learns a provider's cap over every node from its 429:
// its live leases, less the refused attempt's own. It reports the cap (0:
// nothing live) and whether the store answered.
func (h *Handler) learnSharedCap(st *pool.Provider) (int, bool) {
	sh := h.shared
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := sh.s.Store().LearnCap(ctx, st.Name())
	if err != nil {
		sh.s.Failed("learn cap", err)
		return 0, false
	}
	sh.s.Worked()
	if n > 0 {
		st.Refused(int64(n))
	}
	return n, true
}
