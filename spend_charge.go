package browserfailover

import (
	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/spend"
)

// What a session cost, counted once when its meter stops: the provider's
// and the client key's books, the metrics, and under shared state the
// totals every node reads.

// charge stops a session's meter and counts what it cost: in the
// provider's and the client key's books (Stop), the metrics, and the
// shared totals (queued, written in the background with others: a
// session's end waits for nobody).
// It returns the cost.
func charge(reg *pool.Registry, provider string, m *spend.Meter, store *cluster.Shared) float64 {
	cost, first := m.Stop()
	if !first || cost <= 0 {
		return cost
	}
	reg.Metrics().Spent(provider, cost)
	if store != nil {
		books := []*spend.Book{reg.ProviderBook(provider)}
		scopes := []string{cluster.ProviderScope(provider)}
		if client := m.Client(); client != nil {
			if e, ok := reg.ClientBookOf(client); ok {
				books, scopes = append(books, client), append(scopes, cluster.ClientScope(e.Scope))
			}
		}
		addShared(store, cost, books, scopes)
	}
	return cost
}

// addShared queues cost for the shared totals of the books' current
// windows (under scopes); each book is told its total once written.
func addShared(store *cluster.Shared, cost float64, books []*spend.Book, scopes []string) {
	if !store.Usable() || books[0] == nil {
		return
	}
	windows := make([]cluster.SpendWindow, len(books))
	for i, b := range books {
		st := b.Read()
		windows[i] = cluster.SpendWindow{Scope: scopes[i], Start: st.WindowStart, End: st.WindowEnd}
	}
	store.Store().Spend().QueueSpend(windows, cost, func(i int, total, added float64) {
		books[i].SetShared(windows[i].Start, total, added)
	})
}
