package pool

import (
	"crypto/sha256"
	"encoding/hex"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/cooldown"
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

// providerSpend is a provider's part of the spend: its pricing, its book
// (what its sessions cost in the current window) and its learnt cap, each
// read without a lock on the connect path.
type providerSpend struct {
	spendMu sync.Mutex // serialises SetPricing
	pricing atomic.Pointer[Pricing]
	book    atomic.Pointer[spend.Book]
	// learnt is the cap learnt from the provider's refusals; nil unless
	// its max_concurrent is auto.
	learnt atomic.Pointer[cooldown.LearntCap]
}

// SetPricing sets the provider's pricing for the config load that claimed
// it last (a load that fails gives the one before back, see ReleaseClaim).
// A learnt cap survives a reload that keeps auto.
func (p *Provider) SetPricing(pr Pricing) {
	p.spendMu.Lock()
	before := p.Pricing()
	p.pricing.Store(&pr)
	if k := p.book.Load(); k == nil {
		p.book.Store(spend.NewBook(pr.Budget, p.reg.Now))
	} else {
		k.Configure(pr.Budget)
	}
	switch l := p.learnt.Load(); {
	case !pr.Auto:
		p.learnt.Store(nil)
	case l == nil:
		p.learnt.Store(cooldown.NewLearntCap(pr.Interval, p.reg.Now))
	default:
		l.SetInterval(pr.Interval)
	}
	p.spendMu.Unlock()
	if opened(before, pr) {
		// Waiters may get in now.
		p.Notify()
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
func (p *Provider) Pricing() Pricing {
	if pr := p.pricing.Load(); pr != nil {
		return *pr
	}
	return Pricing{}
}

// Book is what the provider's sessions cost in the current window.
func (p *Provider) Book() *spend.Book {
	if k := p.book.Load(); k != nil {
		return k
	}
	p.book.CompareAndSwap(nil, spend.NewBook(nil, p.reg.Now))
	return p.book.Load()
}

// LearntCap is the provider's learnt cap, nil unless its max_concurrent
// is auto.
func (p *Provider) LearntCap() *cooldown.LearntCap { return p.learnt.Load() }

// OverBudget reports whether the provider's budget is reached (what its
// ended sessions cost in the window plus its live ones' accrued cost),
// and when its window turns.
func (p *Provider) OverBudget() (bool, time.Time) {
	if pr := p.pricing.Load(); pr == nil || pr.Budget == nil {
		return false, time.Time{}
	}
	return p.Book().Reached()
}

// Meter starts metering a session on the provider at its cost; client,
// when not nil, is the client key's book, which counts it too.
func (p *Provider) Meter(client *spend.Book) *spend.Meter {
	return p.Book().Start(p.Pricing().Cost, client)
}

// Refused records a refusal for capacity while live sessions were live on
// the provider (over every node under shared state): with a learnt cap,
// the cap becomes live and true is returned, so the caller does not skip
// the provider; false otherwise.
func (p *Provider) Refused(live int64) bool {
	l := p.LearntCap()
	if l == nil || !l.Refused(live) {
		return false
	}
	// Waiters beyond the cap wait for a slot to free.
	return true
}

// reachedLimit notes, for a learnt cap, that the reserved slots reached
// n.
func (p *Provider) reachedLimit(n int64) {
	if l := p.LearntCap(); l != nil {
		l.Reached(n)
		// The cap may rise then: waiters for the provider are offered
		// it at that time, to find the room a rise makes.
		if t := l.NextRise(); !t.IsZero() {
			p.WakeAt(t)
		}
	}
}

// Reserve admits a session on the provider against its budget and, when
// client is not nil, the client key's book held to clientBudget: what
// the session will cost at its first moment is held in both until it
// starts (spend.Hold.Start) or fails (Drop). ahead, for a session made
// ahead of demand, is what its budget must still be able to pay (the
// cost of expected_duration; 0 for a client's). See spend.ReserveAhead.
func (p *Provider) Reserve(client *spend.Book, clientBudget, ahead float64) (*spend.Hold, *spend.Over) {
	return spend.ReserveAhead(p.Pricing().Cost, p.Book(), client, clientBudget, ahead)
}

// clientBooks keep what each client key spent, for client_budget: one
// book per key template, budget period and key value, so handlers whose
// client_budget differs never share or reset each other's book (each
// holds the book to its own amount). A book is kept while a connect uses
// it (users), has a session live or being admitted, or has spent
// something in its window.
type clientBooks struct {
	mu      sync.Mutex
	entries map[ClientBookID]*clientEntry
	byBook  map[*spend.Book]*clientEntry
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

// ClientBook returns the book of id, made on first use, for a connect
// that uses it until it calls LeaveClientBook; budget is the amount the
// caller holds it to, shown in status.
func (r *Registry) ClientBook(id ClientBookID, budget float64) *spend.Book {
	r.clientSpend.mu.Lock()
	defer r.clientSpend.mu.Unlock()
	if r.clientSpend.entries == nil {
		r.clientSpend.entries = map[ClientBookID]*clientEntry{}
		r.clientSpend.byBook = map[*spend.Book]*clientEntry{}
	}
	e, ok := r.clientSpend.entries[id]
	if !ok {
		r.sweepClientBooksLocked()
		e = &clientEntry{id: id, book: spend.NewBook(&spend.Budget{Amount: budget, Per: id.Per}, r.Now)}
		r.clientSpend.entries[id] = e
		r.clientSpend.byBook[e.book] = e
	} else {
		e.book.Configure(&spend.Budget{Amount: budget, Per: id.Per})
	}
	e.users++
	return e.book
}

// LeaveClientBook ends a connect's use of a book ClientBook gave it (nil:
// nothing).
func (r *Registry) LeaveClientBook(b *spend.Book) {
	if b == nil {
		return
	}
	r.clientSpend.mu.Lock()
	if e, ok := r.clientSpend.byBook[b]; ok && e.users > 0 {
		e.users--
	}
	r.clientSpend.mu.Unlock()
}

// sweepClientBooksLocked drops the books that hold nothing and no connect
// uses, so a key seen once does not stay forever; called with the lock
// held, at most every hundred new keys.
func (r *Registry) sweepClientBooksLocked() {
	if len(r.clientSpend.entries)%100 != 99 {
		return
	}
	for id, e := range r.clientSpend.entries {
		if e.users == 0 && e.book.Idle() {
			delete(r.clientSpend.entries, id)
			delete(r.clientSpend.byBook, e.book)
		}
	}
}

// ClientSpend is one client key's spend as status shows it: its shown
// key (ShownKey), and its book's state.
type ClientSpend struct {
	Key string
	spend.State
}

// ClientSpends lists the client keys with a book, by shown key.
func (r *Registry) ClientSpends() []ClientSpend {
	r.clientSpend.mu.Lock()
	out := make([]ClientSpend, 0, len(r.clientSpend.entries))
	for _, e := range r.clientSpend.entries {
		out = append(out, ClientSpend{Key: r.ShownKey(e.id.Value), State: e.book.Read()})
	}
	r.clientSpend.mu.Unlock()
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

// ClientBookOf is the entry of a client key's book; ok is false for a
// book that is not one.
func (r *Registry) ClientBookOf(b *spend.Book) (ClientBookEntry, bool) {
	r.clientSpend.mu.Lock()
	e, ok := r.clientSpend.byBook[b]
	r.clientSpend.mu.Unlock()
	if !ok {
		return ClientBookEntry{}, false
	}
	return r.clientBookEntry(e), true
}

func (r *Registry) clientBookEntry(e *clientEntry) ClientBookEntry {
	shown := r.ShownKey(e.id.Value)
	digest := sha256.Sum256([]byte(e.id.Template))
	return ClientBookEntry{Shown: shown, Scope: shown + ":" + e.id.Per + ":" + hex.EncodeToString(digest[:4]), Book: e.book}
}

// ClientBooks lists the client keys' books.
func (r *Registry) ClientBooks() []ClientBookEntry {
	r.clientSpend.mu.Lock()
	entries := make([]*clientEntry, 0, len(r.clientSpend.entries))
	for _, e := range r.clientSpend.entries {
		entries = append(entries, e)
	}
	r.clientSpend.mu.Unlock()
	out := make([]ClientBookEntry, 0, len(entries))
	for _, e := range entries {
		out = append(out, r.clientBookEntry(e))
	}
	return out
}

// ProviderBook is the book of the configured provider name (nil when it
// is not configured).
func (r *Registry) ProviderBook(name string) *spend.Book {
	if p, ok := r.Lookup(name); ok {
		return p.Book()
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
		books := []*spend.Book{r.ProviderBook(provider)}
		scopes := []string{cluster.ProviderScope(provider)}
		if client := m.Client(); client != nil {
			if e, ok := r.ClientBookOf(client); ok {
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
