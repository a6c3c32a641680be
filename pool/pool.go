// Package pool owns the gateway's state that outlives a config load, in
// one value, the Registry: the state of every provider, keyed by the
// provider's name (its live-session slots, its health — a cooldown machine
// —, its counters and last error, the operator's drain flag, its probe
// loop), the wait queue, the client quotas, and the live and parked
// sessions. The process's registry lives in a caddy.UsagePool so a config
// reload keeps live sessions open and counted and keeps cooldowns.
// Handlers take provider entries on Provision and release them on
// Cleanup; the admin API reads the registry, never a handler.
package pool

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/queue"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Provider is the process-wide state of one provider name.
type Provider struct {
	reg    *Registry
	name   string
	Health *cooldown.Health

	used     atomic.Int64 // reserved for attempts in flight plus live
	live     atomic.Int64
	max      atomic.Int64 // 0: unlimited
	draining atomic.Bool
	// skippedFull: someone was turned away as full since the last
	// unreserveFailed that woke the queues.
	skippedFull atomic.Bool
	// What the last capacity probe said (probe.go): the provider takes no
	// new session; its own limit, which serves as max_concurrent when
	// none is configured (0: none learnt).
	capFull   atomic.Bool
	learntMax atomic.Int64
	probeState
	providerSpend
	starts

	mu        sync.Mutex
	url       string // redacted, for status
	urlKey    string // the resolved URL: compared, never shown
	gen       any    // the config load that last claimed this name
	genClaims int    // claims of gen not yet released
	cfg       cooldown.Config
	single    bool
	// prev is what the config load before gen had set: a load that fails
	// (or a validation) gives it back when its last claim is released, so
	// it never changes the running config's provider.
	prev       *claimed
	lastError  string
	latencyMS  float64
	hasLatency bool
	cluster    ClusterView
	// resetters are told when a Reset makes the provider healthy again;
	// only the newest is told (the handler of the latest config load).
	resetters []resetter
	// warm counts the warm sessions of each handler's set, by handler
	// key (warm.go).
	warm map[string]warmCount
}

type resetter struct {
	key any
	fn  func()
}

// Name is the provider's name.
func (p *Provider) Name() string { return p.name }

// resourcePrefix starts the queue resource of every provider.
const resourcePrefix = "provider\x00"

// Resource is the name under which waiters of the queue ask for the
// provider called name.
func Resource(name string) string { return resourcePrefix + name }

// Resource is the provider's name in the queue.
func (p *Provider) Resource() string { return Resource(p.name) }

// ByResource finds the configured provider of a queue resource.
func (r *Registry) ByResource(res string) (*Provider, bool) {
	name, ok := strings.CutPrefix(res, resourcePrefix)
	if !ok {
		return nil, false
	}
	return r.Lookup(name)
}

// Claim takes (or creates) the entry for name on behalf of one handler of a
// config load identified by gen. urlKey is the provider's resolved URL and
// redacted its shown form. The same name with two URLs in one config load
// is an error; across loads the newest config wins.
func (r *Registry) Claim(name, urlKey, redacted string, gen any, cfg cooldown.Config, single bool, maxConcurrent int) (*Provider, error) {
	v, _, err := r.providers.LoadOrNew(name, func() (caddy.Destructor, error) {
		// A provider that left the config with sessions still live comes
		// back with them (and its health): they still hold its slots.
		r.retiredMu.Lock()
		defer r.retiredMu.Unlock()
		if p, ok := r.retired[name]; ok {
			delete(r.retired, name)
			return p, nil
		}
		// A name that was drained before it left the config comes back
		// undrained.
		r.Waiting.Restore(Resource(name))
		return &Provider{reg: r, name: name, Health: cooldown.New(cfg, r.clock)}, nil
	})
	if err != nil {
		return nil, err
	}
	p := v.(*Provider)
	p.mu.Lock()
	if p.gen == gen && p.urlKey != urlKey && p.urlKey != "" {
		p.mu.Unlock()
		r.providers.Delete(name)
		return nil, fmt.Errorf("provider %q is declared with two different URLs", name)
	}
	if p.gen != gen {
		// The first claim of a new config load: keep the running
		// config's settings until this load is known to be running.
		p.prev = nil
		if p.gen != nil {
			p.prev = &claimed{gen: p.gen, urlKey: p.urlKey, url: p.url, cfg: p.cfg, single: p.single, max: p.max.Load(), pricing: p.Pricing(), rate: p.CreateRate()}
		}
		p.genClaims = 0
	}
	p.genClaims++
	p.gen, p.urlKey, p.url = gen, urlKey, redacted
	p.cfg, p.single = cfg, single
	p.Health.Configure(cfg, single)
	old := p.max.Swap(int64(maxConcurrent))
	grew := old != 0 && (maxConcurrent == 0 || int64(maxConcurrent) > old)
	p.mu.Unlock()
	if grew {
		// A reload that raised the limit serves waiters at once.
		p.Notify()
	}
	return p, nil
}

// claimed is what one config load set on a provider.
type claimed struct {
	gen         any
	urlKey, url string
	cfg         cooldown.Config
	single      bool
	max         int64
	pricing     Pricing
	rate        CreateRate
}

// ReleaseClaim gives back a claim that the config load gen made on name.
// If another config load still holds the name (the running one, when gen
// failed to load or was only validated) and gen was the last to set it up,
// the settings of the load before gen are put back once gen's last claim
// is released: a config that never ran must not leave its limits, cooldown
// settings or URL on the running config's provider.
func (r *Registry) ReleaseClaim(name string, gen any) {
	p, ok := r.Lookup(name)
	if deleted, _ := r.providers.Delete(name); !ok || deleted {
		return
	}
	p.mu.Lock()
	if p.gen != gen {
		p.mu.Unlock()
		return
	}
	p.genClaims--
	prev := p.prev
	if p.genClaims > 0 || prev == nil {
		p.mu.Unlock()
		return
	}
	p.prev, p.genClaims = nil, 0
	p.gen, p.urlKey, p.url = prev.gen, prev.urlKey, prev.url
	p.cfg, p.single = prev.cfg, prev.single
	p.Health.Configure(prev.cfg, prev.single)
	p.max.Store(prev.max)
	p.mu.Unlock()
	p.SetPricing(prev.pricing)
	p.SetCreateRate(prev.rate)
	p.Notify() // the limit may have grown back
}

// Destruct implements caddy.Destructor: the provider left the config. Its
// sessions, if any, keep running until they end; until then the entry is
// kept aside, so a config that brings the name back counts them.
func (p *Provider) Destruct() error {
	r := p.reg
	r.retiredMu.Lock()
	if p.used.Load() > 0 {
		r.retired[p.name] = p
	}
	r.retiredMu.Unlock()
	return nil
}

// giveBack frees one slot; the last one of a provider that left the
// config lets its entry go.
func (p *Provider) giveBack() int64 {
	u := p.used.Add(-1)
	if u == 0 {
		r := p.reg
		r.retiredMu.Lock()
		if r.retired[p.name] == p {
			delete(r.retired, p.name)
		}
		r.retiredMu.Unlock()
	}
	return u
}

// Lookup finds the entry of a configured provider.
func (r *Registry) Lookup(name string) (*Provider, bool) {
	var found *Provider
	r.providers.Range(func(k, v any) bool {
		if k == name {
			found = v.(*Provider)
			return false
		}
		return true
	})
	return found, found != nil
}

// All lists every configured provider's entry, sorted by name.
func (r *Registry) All() []*Provider {
	var all []*Provider
	r.providers.Range(func(_, v any) bool {
		all = append(all, v.(*Provider))
		return true
	})
	sort.Slice(all, func(i, j int) bool { return all[i].name < all[j].name })
	return all
}

// tryReserve takes a slot for an attempt if the provider has room: below
// its limit (Limit), and not full by its last capacity probe.
func (p *Provider) tryReserve() bool {
	if p.capFull.Load() {
		return false
	}
	for {
		u := p.used.Load()
		m := p.Limit()
		if m > 0 && u >= m {
			p.reachedLimit(u)
			return false
		}
		if p.used.CompareAndSwap(u, u+1) {
			if m > 0 && u+1 >= m {
				p.reachedLimit(u + 1)
			}
			return true
		}
	}
}

// Full reports whether the provider takes no new session: at its limit
// (Limit), or full by its last capacity probe.
func (p *Provider) Full() bool {
	if p.capFull.Load() {
		return true
	}
	m := p.Limit()
	if u := p.used.Load(); m > 0 && u >= m {
		p.reachedLimit(u)
		return true
	}
	return false
}

// Limit is the most live sessions the provider takes: max_concurrent; or
// with max_concurrent auto the cap learnt from its refusals; or, when
// neither is set, the limit its capacity probe reported (0: unlimited).
func (p *Provider) Limit() int64 {
	if m := p.max.Load(); m > 0 {
		return m
	}
	if l := p.LearntCap(); l != nil {
		return l.Cap()
	}
	return p.learntMax.Load()
}

// unreserve gives back a slot whose attempt did not establish a session.
func (p *Provider) unreserve() {
	p.giveBack()
	p.Notify()
}

// unreserveFailed gives back the slot of an attempt the provider failed
// (an error, 408/429, 428) without waking the queues at once: the waiter
// that made the attempt would get the wake-up itself (the queue re-delivers
// a wake-up missed during a pass) and retry the failing provider in a
// tight loop. If the provider was full and turned someone away meanwhile
// (SkippedFull), the queues are woken a second later instead, like the
// once-a-second retry of providers that failed without cooling down.
func (p *Provider) unreserveFailed() {
	u := p.giveBack()
	if m := p.Limit(); m > 0 && u+1 >= m && p.skippedFull.Swap(false) {
		p.WakeAt(p.reg.Now().Add(time.Second))
	}
}

// SkippedFull notes that a client passed the provider over as full.
func (p *Provider) SkippedFull() { p.skippedFull.Store(true) }

// establish turns a reserved slot into a live session, listed in the
// session registry under info (its Provider is set here).
func (p *Provider) establish(e *LiveSession) {
	p.live.Add(1)
	e.Provider = p.name
	p.reg.track(e)
}

// end frees a live session's slot. The live count drops before the slot
// is given back, so a session that takes the slot at once is never
// counted beside the one that left it (live never exceeds the limit).
func (p *Provider) end(s Live) {
	p.reg.untrack(s)
	p.live.Add(-1)
	p.giveBack()
	p.Notify()
}

// park ends a live session whose provider session lives on while it is
// parked for a resume (a session created over a session API, not yet
// released): it leaves the session registry and the live count, but its
// slot stays taken, so the parked session still counts against
// max_concurrent. The slot is given back with unreserve when the window
// ends, or taken over by the resume (establish, as after tryReserve).
func (p *Provider) park(s Live) {
	p.reg.untrack(s)
	p.live.Add(-1)
}

// Active is the number of live sessions.
func (p *Provider) Active() int64 { return p.live.Load() }

// Reserved is live sessions plus attempts in flight.
func (p *Provider) Reserved() int64 { return p.used.Load() }

// MaxConcurrent is the configured limit (0: unlimited).
func (p *Provider) MaxConcurrent() int64 { return p.max.Load() }

// Draining reports whether an operator drained the provider.
func (p *Provider) Draining() bool { return p.draining.Load() }

// SetDraining drains or undrains the provider. Draining ends the wait of
// clients that could use no other provider; undraining offers the provider
// to the waiters.
func (p *Provider) SetDraining(on bool) {
	p.draining.Store(on)
	if on {
		p.reg.Waiting.Withdraw(p.Resource())
	} else {
		p.reg.Waiting.Restore(p.Resource())
	}
}

// Reset ends any cooldown and clears the counters and last error. When
// that makes the provider healthy again, the newest OnReset function is
// called (once, whatever the number of handlers using the provider).
func (p *Provider) Reset() {
	wasDown := p.Health.Reset()
	p.mu.Lock()
	p.lastError = ""
	p.latencyMS, p.hasLatency = 0, false
	var tell func()
	if wasDown && len(p.resetters) > 0 {
		tell = p.resetters[len(p.resetters)-1].fn
	}
	p.mu.Unlock()
	p.Notify()
	if tell != nil {
		tell()
	}
}

// OnReset registers fn, under key, to be called when a Reset makes the
// provider healthy again. A handler registers itself at Provision.
func (p *Provider) OnReset(key any, fn func()) {
	p.mu.Lock()
	p.resetters = append(p.resetters, resetter{key, fn})
	p.mu.Unlock()
}

// RemoveOnReset undoes OnReset for key.
func (p *Provider) RemoveOnReset(key any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, r := range p.resetters {
		if r.key == key {
			p.resetters = append(p.resetters[:i], p.resetters[i+1:]...)
			return
		}
	}
}

// URL is the provider's URL, redacted.
func (p *Provider) URL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.url
}

// SetLastError records the last failure, already free of secrets.
func (p *Provider) SetLastError(s string) {
	p.mu.Lock()
	p.lastError = s
	p.mu.Unlock()
}

// LastError is the last failure recorded.
func (p *Provider) LastError() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastError
}

// latencyWeight is the weight of a new sample in the handshake-time moving
// average.
const latencyWeight = 0.3

// ObserveHandshake adds a successful handshake's duration to the moving
// average.
func (p *Provider) ObserveHandshake(d time.Duration) {
	ms := float64(d) / float64(time.Millisecond)
	p.mu.Lock()
	if !p.hasLatency {
		p.latencyMS, p.hasLatency = ms, true
	} else {
		p.latencyMS += latencyWeight * (ms - p.latencyMS)
	}
	p.mu.Unlock()
}

// HandshakeMS returns the moving average of handshake times and whether
// there is any sample.
func (p *Provider) HandshakeMS() (float64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.latencyMS, p.hasLatency
}

// Notify offers the provider to the longest-waiting client that can use
// it: a slot freed, a trial passed, or a limit grew.
func (p *Provider) Notify() { p.reg.Waiting.Offer(p.Resource()) }

// WakeAt offers the provider at t (the end of its cooldown or skip).
func (p *Provider) WakeAt(t time.Time) { p.reg.Waiting.OfferAt(p.Resource(), t) }

// HasRoom tells whether a client could be given the provider now: not
// drained, below max_concurrent, and healthy (no cooldown, skip or trial in
// flight).
func (p *Provider) HasRoom() bool {
	return !p.Draining() && !p.Full() && p.Health.Available()
}

// QueueInfo is what the status shows of one handler's wait queue.
type QueueInfo interface {
	Len() int
	Size() int
	Timeout() time.Duration
}

// QueueCount is one handler's line in the wait queue: how many wait in it,
// its size and timeout, and the providers of its handler.
type QueueCount struct {
	Waiting   int
	Size      int
	Timeout   time.Duration
	Providers []string
}

type queueEntry struct {
	q         QueueInfo
	providers []string
	order     uint64
}

// RegisterQueue lists a handler's queue (q may report size 0 when the queue
// is off) under owner until UnregisterQueue.
func (r *Registry) RegisterQueue(owner any, q QueueInfo, providers []string) {
	r.queuesMu.Lock()
	r.queueSeq++
	r.queues[owner] = queueEntry{q: q, providers: providers, order: r.queueSeq}
	r.queuesMu.Unlock()
}

// UnregisterQueue removes owner's queue.
func (r *Registry) UnregisterQueue(owner any) {
	r.queuesMu.Lock()
	delete(r.queues, owner)
	r.queuesMu.Unlock()
}

// Queues lists the registered queues in registration order.
func (r *Registry) Queues() []QueueCount {
	r.queuesMu.Lock()
	entries := make([]queueEntry, 0, len(r.queues))
	for _, e := range r.queues {
		entries = append(entries, e)
	}
	r.queuesMu.Unlock()
	sort.Slice(entries, func(i, j int) bool { return entries[i].order < entries[j].order })
	out := make([]QueueCount, 0, len(entries))
	for _, e := range entries {
		out = append(out, QueueCount{
			Waiting:   e.q.Len(),
			Size:      e.q.Size(),
			Timeout:   e.q.Timeout(),
			Providers: append([]string(nil), e.providers...),
		})
	}
	return out
}

// ClusterView reads a provider's cluster-wide state when several gateway
// nodes share it (a *cluster.Shared); the status shows what it returns
// under "cluster".
type ClusterView interface {
	// ClusterStates returns the state of each of providers, read in one
	// call bounded by ctx, and whether the shared state answered. While
	// it is known to be down it answers at once, without asking.
	ClusterStates(ctx context.Context, providers []string) (states map[string]cluster.ProviderState, up bool)
	// ClusterActive is the provider's live sessions over every node as
	// last read, and whether that reading is recent.
	ClusterActive(provider string) (int, bool)
	// ResetShared ends the provider's shared cooldown, so that an
	// operator's reset holds on every node.
	ResetShared(ctx context.Context, provider string)
	// Endpoint is how the shared state is reached now (mode and the
	// master in use).
	Endpoint() cluster.Endpoint
}

// SetCluster sets (nil: clears) where the provider's cluster-wide state is
// read from.
func (p *Provider) SetCluster(v ClusterView) {
	p.mu.Lock()
	p.cluster = v
	p.mu.Unlock()
}

// Cluster returns the provider's ClusterView, nil when its state is not
// shared.
func (p *Provider) Cluster() ClusterView {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cluster
}

// Books are the provider's session API counts, when it has a session API.
func (p *Provider) Books() (*upstreams.Books, bool) { return p.reg.LookupBooks(p.name) }

// LedgerPending is the provider's entries in the ledger not confirmed
// released; false while the ledger is not open.
func (p *Provider) LedgerPending() (int, bool) { return p.reg.LedgerPending(p.name) }

// Interface guard: a Provider is a value of the process-wide UsagePool
// (its Destruct runs when no config uses the name any more).
var _ caddy.Destructor = (*Provider)(nil)

// A line of the queue is what the status shows of a handler's queue.
var _ QueueInfo = (*queue.Line)(nil)
