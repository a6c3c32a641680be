package pool

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

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

// clientBooks keep what each client key spent, for client_budget.
type clientBooks struct {
	mu     sync.Mutex
	books  map[string]*spend.Book // by key value
	values map[*spend.Book]string
}

// ClientBook returns the book of the client key value, made on first use
// with budget b (a reload's budget replaces the one before).
func (r *Registry) ClientBook(value string, b *spend.Budget) *spend.Book {
	r.clientSpend.mu.Lock()
	defer r.clientSpend.mu.Unlock()
	if r.clientSpend.books == nil {
		r.clientSpend.books = map[string]*spend.Book{}
		r.clientSpend.values = map[*spend.Book]string{}
	}
	k, ok := r.clientSpend.books[value]
	if !ok {
		r.sweepClientBooksLocked()
		k = spend.NewBook(b, r.Now)
		r.clientSpend.books[value] = k
		r.clientSpend.values[k] = value
		return k
	}
	k.Configure(b)
	return k
}

// sweepClientBooksLocked drops the books that hold nothing, so a key seen
// once does not stay forever; called with the lock held, at most every
// hundred new keys.
func (r *Registry) sweepClientBooksLocked() {
	if len(r.clientSpend.books)%100 != 99 {
		return
	}
	for v, k := range r.clientSpend.books {
		if k.Idle() {
			delete(r.clientSpend.books, v)
			delete(r.clientSpend.values, k)
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
	out := make([]ClientSpend, 0, len(r.clientSpend.books))
	for v, k := range r.clientSpend.books {
		out = append(out, ClientSpend{Key: r.ShownKey(v), State: k.Read()})
	}
	r.clientSpend.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// ShownBook is the shown key (ShownKey) of a client key's book, "" for a
// book that is not one.
func (r *Registry) ShownBook(b *spend.Book) string {
	r.clientSpend.mu.Lock()
	v, ok := r.clientSpend.values[b]
	r.clientSpend.mu.Unlock()
	if !ok {
		return ""
	}
	return r.ShownKey(v)
}

// ClientBookEntry is a client key's book and its shown key.
type ClientBookEntry struct {
	Shown string
	Book  *spend.Book
}

// ClientBooks lists the client keys' books.
func (r *Registry) ClientBooks() []ClientBookEntry {
	r.clientSpend.mu.Lock()
	defer r.clientSpend.mu.Unlock()
	out := make([]ClientBookEntry, 0, len(r.clientSpend.books))
	for v, k := range r.clientSpend.books {
		out = append(out, ClientBookEntry{Shown: r.ShownKey(v), Book: k})
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
