package pool

import (
	"crypto/sha256"
	"encoding/hex"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/queue"
	"github.com/browserfailover/caddy-browser-failover/spend"
)

// Pricing is what a config load says a provider costs and how its cap is
// set: its cost and budget (nil: none), and whether its max_concurrent is
// learnt (Auto), rising at most once per Interval (its cooldown duration).
type Pricing struct {
	Cost     *spend.Cost
	Budget   *spend.Budget
	Auto     bool
	Interval time.Duration
}

// Spend is a provider's part of the spend: its pricing and its book
// (what its sessions cost in the current window), each read without a
// lock on the connect path.
type Spend struct {
	p *ProviderState

	mu      sync.Mutex // serialises SetPricing
	pricing atomic.Pointer[Pricing]
	book    atomic.Pointer[spend.Book]
}

// SetPricing sets the provider's pricing for the config load that claimed
// it last (a load that fails gives the one before back, see ReleaseClaim).
// A learnt cap survives a reload that keeps auto.
func (s *Spend) SetPricing(pr Pricing) {
	s.mu.Lock()
	before := s.Pricing()
	s.pricing.Store(&pr)
	if k := s.book.Load(); k == nil {
		s.book.Store(spend.NewBook(pr.Budget, s.p.reg.Now))
	} else {
		k.Configure(pr.Budget)
	}
	s.p.Slots.learn(pr)
	s.mu.Unlock()
	if opened(before, pr) {
		// Waiters may get in now.
		s.p.Notify()
	}
}

// opened reports whether going from pricing a to b may let a waiter in: a
// budget raised, changed or removed, or a cap no longer learnt.
func opened(a, b Pricing) bool {
	if a.Auto && !b.Auto {
		return true
	}
	if a.Budget == nil {
		return false
	}
	return b.Budget == nil || *b.Budget != *a.Budget
}

// Pricing is the provider's pricing.
func (s *Spend) Pricing() Pricing {
	if pr := s.pricing.Load(); pr != nil {
		return *pr
	}
	return Pricing{}
}

// Book is what the provider's sessions cost in the current window.
func (s *Spend) Book() *spend.Book {
	if k := s.book.Load(); k != nil {
		return k
	}
	s.book.CompareAndSwap(nil, spend.NewBook(nil, s.p.reg.Now))
	return s.book.Load()
}

// OverBudget reports whether the provider's budget is reached (what its
// ended sessions cost in the window plus its live ones' accrued cost),
// and when its window turns.
func (s *Spend) OverBudget() (bool, time.Time) {
	if pr := s.pricing.Load(); pr == nil || pr.Budget == nil {
		return false, time.Time{}
	}
	return s.Book().Reached()
}

// Meter starts metering a session on the provider at its cost; client,
// when not nil, is the client key's book, which counts it too.
func (s *Spend) Meter(client *spend.Book) *spend.Meter {
	return s.Book().Start(s.Pricing().Cost, client)
}

// Reserve admits a session on the provider against its budget and, when
// client is not nil, the client key's book held to clientBudget: what
// the session will cost at its first moment is held in both until it
// starts (spend.Hold.Start) or fails (Drop). ahead, for a session made
// ahead of demand, is what its budget must still be able to pay (the
// cost of expected_duration; 0 for a client's). See spend.ReserveAhead.
func (s *Spend) Reserve(client *spend.Book, clientBudget, ahead float64) (*spend.Hold, *spend.Over) {
	return spend.ReserveAhead(s.Pricing().Cost, s.Book(), client, clientBudget, ahead)
}

// ClientBooks keep what each client key spent, for client_budget: one
// book per key template, budget period and key value, so handlers whose
// client_budget differs never share or reset each other's book (each
// holds the book to its own amount). A book is kept while a connect uses
// it (users), has a session live or being admitted, or has spent
// something in its window.
type ClientBooks struct {
	clock  queue.Clock
	hashes *Hashes

	mu      sync.Mutex
	entries map[ClientBookID]*clientEntry
	byBook  map[*spend.Book]*clientEntry
}

func newClientBooks(clock queue.Clock, hashes *Hashes) *ClientBooks {
	return &ClientBooks{clock: clock, hashes: hashes}
}

// ClientBookID names a client key's book: the client_budget key
// template, its budget's period and the key's value.
type ClientBookID struct {
	Template, Per, Value string
}

type clientEntry struct {
	id    ClientBookID
	book  *spend.Book
	users int
}

// Use returns the book of id, made on first use, for a connect that uses
// it until it calls Leave; budget is the amount the caller holds it to,
// shown in status.
func (c *ClientBooks) Use(id ClientBookID, budget float64) *spend.Book {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[ClientBookID]*clientEntry{}
		c.byBook = map[*spend.Book]*clientEntry{}
	}
	e, ok := c.entries[id]
	if !ok {
		c.sweepLocked()
		e = &clientEntry{id: id, book: spend.NewBook(&spend.Budget{Amount: budget, Per: id.Per}, c.clock.Now)}
		c.entries[id] = e
		c.byBook[e.book] = e
	} else {
		e.book.Configure(&spend.Budget{Amount: budget, Per: id.Per})
	}
	e.users++
	return e.book
}

// Leave ends a connect's use of a book Use gave it (nil: nothing).
func (c *ClientBooks) Leave(b *spend.Book) {
	if b == nil {
		return
	}
	c.mu.Lock()
	if e, ok := c.byBook[b]; ok && e.users > 0 {
		e.users--
	}
	c.mu.Unlock()
}

// sweepLocked drops the books that hold nothing and no connect uses, so a
// key seen once does not stay forever; called with the lock held, at most
// every hundred new keys.
func (c *ClientBooks) sweepLocked() {
	if len(c.entries)%100 != 99 {
		return
	}
	for id, e := range c.entries {
		if e.users == 0 && e.book.Idle() {
			delete(c.entries, id)
			delete(c.byBook, e.book)
		}
	}
}

// ClientSpend is one client key's spend as status shows it: its shown
// key (Hashes.ShownKey), and its book's state.
type ClientSpend struct {
	Key string
	spend.State
}

// Spends lists the client keys with a book, by shown key.
func (c *ClientBooks) Spends() []ClientSpend {
	c.mu.Lock()
	out := make([]ClientSpend, 0, len(c.entries))
	for _, e := range c.entries {
		out = append(out, ClientSpend{Key: c.hashes.ShownKey(e.id.Value), State: e.book.Read()})
	}
	c.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// ClientBookEntry is a client key's book, its shown key and the name its
// shared total has under shared state.
type ClientBookEntry struct {
	Shown string
	// Scope names the book among every node's: its shown key, its
	// period and a short digest of its key template (never the key's
	// value).
	Scope string
	Book  *spend.Book
}

// Of is the entry of a client key's book; ok is false for a book that is
// not one.
func (c *ClientBooks) Of(b *spend.Book) (ClientBookEntry, bool) {
	c.mu.Lock()
	e, ok := c.byBook[b]
	c.mu.Unlock()
	if !ok {
		return ClientBookEntry{}, false
	}
	return c.entry(e), true
}

func (c *ClientBooks) entry(e *clientEntry) ClientBookEntry {
	shown := c.hashes.ShownKey(e.id.Value)
	digest := sha256.Sum256([]byte(e.id.Template))
	return ClientBookEntry{Shown: shown, Scope: shown + ":" + e.id.Per + ":" + hex.EncodeToString(digest[:4]), Book: e.book}
}

// Entries lists the client keys' books.
func (c *ClientBooks) Entries() []ClientBookEntry {
	c.mu.Lock()
	entries := make([]*clientEntry, 0, len(c.entries))
	for _, e := range c.entries {
		entries = append(entries, e)
	}
	c.mu.Unlock()
	out := make([]ClientBookEntry, 0, len(entries))
	for _, e := range entries {
		out = append(out, c.entry(e))
	}
	return out
}

// providerBook is the book of the configured provider name (nil when it
// is not configured).
func (r *Registry) providerBook(name string) *spend.Book {
	if p, ok := r.Lookup(name); ok {
		return p.Spend.Book()
	}
	return nil
}

// charge stops a session's meter and counts what it cost: in the
// provider's and the client key's books (Stop), the metrics, and the
// shared totals (queued, written in the background with others: a
// session's end waits for nobody). It returns the cost.
func (r *Registry) charge(provider string, m *spend.Meter, store *cluster.Shared) float64 {
	cost, first := m.Stop()
	if !first || cost <= 0 {
		return cost
	}
	r.Metrics().Spent(provider, cost)
	if store != nil {
		books := []*spend.Book{r.providerBook(provider)}
		scopes := []string{cluster.ProviderScope(provider)}
		if client := m.Client(); client != nil {
			if e, ok := r.ClientBooks.Of(client); ok {
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
