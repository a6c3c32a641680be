// Package pool owns the gateway's state that outlives a config load, in
// one value, the Registry: the state of every provider, keyed by the
// provider's name (its live-session slots, its health — a cooldown machine
// —, its probe loop, its spend, its create_rate starts, its last error,
// the operator's drain flag), the wait queue, the client quotas, and the
// live and parked sessions, each a part with its own state and lock. The
// process's registry lives in a caddy.UsagePool so a config reload keeps
// live sessions open and counted and keeps cooldowns. Handlers take
// provider entries on Provision and release them on Cleanup; the admin API
// reads the registry, never a handler.
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
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// ProviderState is the process-wide state of one provider name (an
// upstreams.Provider is what a handler dials it with; a handler's member
// pairs the two). Its parts have their own state and locks: its slots,
// its health (a cooldown machine), its probe loop, its spend, its
// create_rate starts and its figures for status. It holds itself the
// claims of the config loads that use the name (Claim, ReleaseClaim), the
// operator's drain flag, who is told of a reset, where its cluster-wide
// state is read, and its warm sessions' counts.
type ProviderState struct {
	reg    *Registry
	name   string
	Health *cooldown.Health
	// Slots are its live sessions and attempts in flight, and their
	// limit (slots.go).
	Slots *Slots
	// Probes are its probe loop (probe.go).
	Probes *Probes
	// Spend is its pricing and its book (spend.go).
	Spend *Spend
	// Starts are the starts counted in its create_rate window (rate.go).
	Starts *Starts
	// Stats are its last error and handshake times (stats.go).
	Stats *Stats

	draining atomic.Bool
	// leaving: found by a providers block whose source no longer gives
	// its address; it takes no new session, and goes once its last one
	// has ended.
	leaving atomic.Bool

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
	prev    *claimed
	cluster ClusterView
	// resetters are told when a Reset makes the provider healthy again;
	// only the newest is told (the handler of the latest config load).
	resetters []resetter
	// warm counts the warm sessions of each handler's set, by handler
	// key (warm.go).
	warm map[string]warmCount
	// foundBy names the providers block that found it ("" for a
	// configured provider).
	foundBy string
}

func newProviderState(r *Registry, name string, cfg cooldown.Config) *ProviderState {
	p := &ProviderState{reg: r, name: name, Health: cooldown.New(cfg, r.clock), Stats: &Stats{}}
	p.Slots = &Slots{p: p}
	p.Probes = &Probes{p: p}
	p.Spend = &Spend{p: p}
	p.Starts = &Starts{p: p}
	return p
}

type resetter struct {
	key any
	fn  func()
}

// Name is the provider's name.
func (p *ProviderState) Name() string { return p.name }

// resourcePrefix starts the queue resource of every provider.
const resourcePrefix = "provider\x00"

// Resource is the name under which waiters of the queue ask for the
// provider called name.
func Resource(name string) string { return resourcePrefix + name }

// Resource is the provider's name in the queue.
func (p *ProviderState) Resource() string { return Resource(p.name) }

// ByResource finds the configured provider of a queue resource.
func (r *Registry) ByResource(res string) (*ProviderState, bool) {
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
func (r *Registry) Claim(name, urlKey, redacted string, gen any, cfg cooldown.Config, single bool, maxConcurrent int) (*ProviderState, error) {
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
		return newProviderState(r, name, cfg), nil
	})
	if err != nil {
		return nil, err
	}
	p := v.(*ProviderState)
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
			p.prev = &claimed{gen: p.gen, urlKey: p.urlKey, url: p.url, cfg: p.cfg, single: p.single, max: p.Slots.max.Load(), pricing: p.Spend.Pricing(), rate: p.Starts.Rate()}
		}
		p.genClaims = 0
	}
	p.genClaims++
	p.gen, p.urlKey, p.url = gen, urlKey, redacted
	p.cfg, p.single = cfg, single
	p.Health.Configure(cfg, single)
	old := p.Slots.max.Swap(int64(maxConcurrent))
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
	p.Slots.max.Store(prev.max)
	p.mu.Unlock()
	p.Spend.SetPricing(prev.pricing)
	p.Starts.SetRate(prev.rate)
	p.Notify() // the limit may have grown back
}

// Destruct implements caddy.Destructor: the provider left the config. Its
// sessions, if any, keep running until they end; until then the entry is
// kept aside, so a config that brings the name back counts them.
func (p *ProviderState) Destruct() error {
	r := p.reg
	r.retiredMu.Lock()
	if p.Slots.used.Load() > 0 {
		r.retired[p.name] = p
	}
	r.retiredMu.Unlock()
	return nil
}

// unretire lets the entry of a provider that left the config go: its
// last slot was given back.
func (r *Registry) unretire(p *ProviderState) {
	r.retiredMu.Lock()
	if r.retired[p.name] == p {
		delete(r.retired, p.name)
	}
	r.retiredMu.Unlock()
}

// Lookup finds the entry of a configured provider.
func (r *Registry) Lookup(name string) (*ProviderState, bool) {
	var found *ProviderState
	r.providers.Range(func(k, v any) bool {
		if k == name {
			found = v.(*ProviderState)
			return false
		}
		return true
	})
	return found, found != nil
}

// All lists every configured provider's entry, sorted by name.
func (r *Registry) All() []*ProviderState {
	var all []*ProviderState
	r.providers.Range(func(_, v any) bool {
		all = append(all, v.(*ProviderState))
		return true
	})
	sort.Slice(all, func(i, j int) bool { return all[i].name < all[j].name })
	return all
}

// FoundBy names the providers block that found the provider at run
// time; "" for a configured one.
func (p *ProviderState) FoundBy() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.foundBy
}

// SetFound records which providers block found the provider ("": none,
// it is configured); a handler sets it as it claims the name.
func (p *ProviderState) SetFound(block string) {
	p.mu.Lock()
	p.foundBy = block
	p.mu.Unlock()
}

// Leaving reports whether the provider's address left the source that
// found it: it takes no new session, and its live ones go on.
func (p *ProviderState) Leaving() bool { return p.leaving.Load() }

// SetLeaving marks a found provider as leaving (its address is gone from
// its source) or back (the address came back before it went).
func (p *ProviderState) SetLeaving(on bool) { p.leaving.Store(on) }

// Found lists the entries of the providers that the providers block
// called block found, as the handlers of the running config claimed
// them, sorted by name: what a new config's handler with that block
// takes over.
func (r *Registry) Found(block string) []*ProviderState {
	var out []*ProviderState
	for _, p := range r.All() {
		if p.FoundBy() == block {
			out = append(out, p)
		}
	}
	return out
}

// Draining reports whether an operator drained the provider.
func (p *ProviderState) Draining() bool { return p.draining.Load() }

// SetDraining drains or undrains the provider. Draining ends the wait of
// clients that could use no other provider; undraining offers the provider
// to the waiters.
func (p *ProviderState) SetDraining(on bool) {
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
func (p *ProviderState) Reset() {
	wasDown := p.Health.Reset()
	p.Stats.clear()
	p.mu.Lock()
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
func (p *ProviderState) OnReset(key any, fn func()) {
	p.mu.Lock()
	p.resetters = append(p.resetters, resetter{key, fn})
	p.mu.Unlock()
}

// RemoveOnReset undoes OnReset for key.
func (p *ProviderState) RemoveOnReset(key any) {
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
func (p *ProviderState) URL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.url
}

// Notify offers the provider to the longest-waiting client that can use
// it: a slot freed, a trial passed, or a limit grew.
func (p *ProviderState) Notify() { p.reg.Waiting.Offer(p.Resource()) }

// WakeAt offers the provider at t (the end of its cooldown or skip).
func (p *ProviderState) WakeAt(t time.Time) { p.reg.Waiting.OfferAt(p.Resource(), t) }

// HasRoom tells whether a client could be given the provider now: not
// drained, below max_concurrent, and healthy (no cooldown, skip or trial in
// flight).
func (p *ProviderState) HasRoom() bool {
	return !p.Draining() && !p.Slots.Full() && p.Health.Available()
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
func (p *ProviderState) SetCluster(v ClusterView) {
	p.mu.Lock()
	p.cluster = v
	p.mu.Unlock()
}

// Cluster returns the provider's ClusterView, nil when its state is not
// shared.
func (p *ProviderState) Cluster() ClusterView {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cluster
}

// Books are the provider's session API counts, when it has a session API.
func (p *ProviderState) Books() (*upstreams.Books, bool) { return p.reg.Books.Lookup(p.name) }

// LedgerPending is the provider's entries in the ledger not confirmed
// released; false while the ledger is not open.
func (p *ProviderState) LedgerPending() (int, bool) { return p.reg.Ledger.Pending(p.name) }

// Interface guard: a ProviderState is a value of the process-wide
// UsagePool (its Destruct runs when no config uses the name any more).
var _ caddy.Destructor = (*ProviderState)(nil)
