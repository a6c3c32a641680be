package pool

import (
	"crypto/rand"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/queue"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Registry is the gateway's state that outlives a config load: every
// provider's entry (slots, health, counters, drain flag, probe loop), the
// wait queue, the client_limit counts, the live and the parked sessions,
// the session API books and the transport of their calls, the secret
// client keys and resume tokens are hashed with, the keepers of each
// handler's warm sessions, the metrics' counters, and the clock all of
// it runs on. It is one value: the
// process's is kept in a caddy.UsagePool entry that every handler takes on
// Provision and gives back on Cleanup (Acquire, Release), so it lives as
// long as some config uses the gateway, reloads included; a test builds a
// registry of its own with NewRegistry.
type Registry struct {
	clock queue.Clock

	// Waiting is the wait queue: clients of every handler waiting for a
	// provider or for their client_limit share, in arrival order.
	// Providers offer it their slots, cooldown ends and undrains; quotas
	// offer it their keys.
	Waiting *queue.Queue
	// Sockets are the WebDriver sockets served here for other nodes'
	// sessions.
	Sockets Sockets

	// providers holds the configured providers' entries, claimed by the
	// handlers that use them (Claim, ReleaseClaim).
	providers *caddy.UsagePool
	// retired holds providers that left the config with sessions still
	// live, by name, until those end.
	retiredMu sync.Mutex
	retired   map[string]*Provider

	queuesMu sync.Mutex
	queues   map[any]queueEntry
	queueSeq uint64

	quotaMu sync.Mutex
	quotas  map[string]*quotaEntry
	// keySecret keys the hashes of client keys, resume keys and resume
	// tokens (SetClientKeySecret).
	keySecret atomic.Pointer[[]byte]

	parkedMu sync.Mutex
	parked   map[string]*Parked // by session ID
	byToken  map[string]*Parked // by token hash

	sessionsMu    sync.Mutex
	sessions      map[Live]*LiveSession
	sessionIDs    map[string]*LiveSession
	sessionTokens map[string]*LiveSession
	// sessionPaths: by the hash of the secret their clients name them by
	// (bound.go).
	sessionPaths map[string]*LiveSession
	sessionSeq   uint64

	booksMu sync.Mutex
	books   map[string]*upstreams.Books
	// releaser releases the provider sessions created over session APIs.
	releaser *upstreams.Releaser
	// apiTransport carries the session API calls of every provider
	// without TLS options of its own.
	apiTransport *http.Transport

	// metrics are the counters and histograms the gateway adds to Caddy's
	// metrics.
	metrics *observe.Metrics

	// probeOffset is the registry's phase of the probe times, so that
	// gateways probing one provider do not all probe it at once.
	probeOffset time.Duration

	// ledger keeps the created provider sessions until their release is
	// confirmed (ledger.go).
	ledger ledgerState

	// clientSpend is what each client key spent, for client_budget
	// (spend.go).
	clientSpend clientBooks

	// handlers counts the handler keys given per config load
	// (handlers.go), and holds the live handlers and the successors of
	// those a reload replaced (succession.go).
	handlersMu sync.Mutex
	handlers   handlerKeys
	succession succession

	// warm holds the warmers by handler and provider (warm.go), and
	// warmSecret keys the prints of their settings.
	warmMu     sync.Mutex
	warm       warmers
	warmSecret []byte
}

// NewRegistry returns an empty registry on clock (nil: the real one).
func NewRegistry(clock queue.Clock) *Registry {
	if clock == nil {
		clock = queue.RealClock()
	}
	r := &Registry{
		clock:         clock,
		providers:     caddy.NewUsagePool(),
		retired:       map[string]*Provider{},
		queues:        map[any]queueEntry{},
		quotas:        map[string]*quotaEntry{},
		parked:        map[string]*Parked{},
		byToken:       map[string]*Parked{},
		sessions:      map[Live]*LiveSession{},
		sessionIDs:    map[string]*LiveSession{},
		sessionTokens: map[string]*LiveSession{},
		sessionPaths:  map[string]*LiveSession{},
		books:         map[string]*upstreams.Books{},
		releaser:      upstreams.NewReleaser(),
		apiTransport:  upstreams.NewAPITransport(),
		metrics:       observe.NewMetrics(),
	}
	r.Waiting = queue.New(clock)
	r.probeOffset = mrand.N(24 * time.Hour)
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	r.keySecret.Store(&secret)
	r.warmSecret = make([]byte, 32)
	_, _ = rand.Read(r.warmSecret)
	return r
}

// Clock is the clock the registry runs on.
func (r *Registry) Clock() queue.Clock { return r.clock }

// Now reads the registry's clock.
func (r *Registry) Now() time.Time { return r.clock.Now() }

// Releaser releases the provider sessions created over session APIs; a
// process exit waits for it.
func (r *Registry) Releaser() *upstreams.Releaser { return r.releaser }

// APITransport carries the session API calls of the providers whose TLS
// options ask for no transport of their own (upstreams.Defaults), so that
// they share its connections across config loads.
func (r *Registry) APITransport() *http.Transport { return r.apiTransport }

// Metrics are the registry's counters and histograms.
func (r *Registry) Metrics() *observe.Metrics { return r.metrics }

// Books returns the session API counts of the provider name, made on
// first use; they live as long as the registry.
func (r *Registry) Books(name string) *upstreams.Books {
	r.booksMu.Lock()
	defer r.booksMu.Unlock()
	b, ok := r.books[name]
	if !ok {
		b = &upstreams.Books{}
		r.books[name] = b
	}
	return b
}

// AllBooks returns the names of the providers with session API counts, in
// order, and their counts.
func (r *Registry) AllBooks() ([]string, []*upstreams.Books) {
	r.booksMu.Lock()
	defer r.booksMu.Unlock()
	names := make([]string, 0, len(r.books))
	for n := range r.books {
		names = append(names, n)
	}
	slices.Sort(names)
	out := make([]*upstreams.Books, len(names))
	for i, n := range names {
		out[i] = r.books[n]
	}
	return names, out
}

// LookupBooks returns the counts of provider name, if it has a session
// API.
func (r *Registry) LookupBooks(name string) (*upstreams.Books, bool) {
	r.booksMu.Lock()
	defer r.booksMu.Unlock()
	b, ok := r.books[name]
	return b, ok
}

// Destruct implements caddy.Destructor: the last config that used the
// gateway is gone (or the process is exiting). Parked sessions end with
// it: held ones are closed, created provider sessions released.
func (r *Registry) Destruct() error {
	r.ExpireAll()
	r.closeLedger()
	r.apiTransport.CloseIdleConnections()
	return nil
}

// The process's registry.
var (
	registries = caddy.NewUsagePool()
)

const registryKey = "browser_failover"

// Acquire returns the process's registry, making it on first use (setup,
// when not nil, readies a new one before anyone uses it: hooks of its
// releaser). Each call is paired with one Release: a handler acquires it
// on Provision and releases it on Cleanup, so it outlives config reloads.
func Acquire(setup func(*Registry)) *Registry {
	v, _, _ := registries.LoadOrNew(registryKey, func() (caddy.Destructor, error) {
		r := NewRegistry(nil)
		if setup != nil {
			setup(r)
		}
		return r, nil
	})
	return v.(*Registry)
}

// Release gives back one Acquire.
func Release() {
	_, _ = registries.Delete(registryKey)
}

// Current returns the process's registry without taking it, nil when no
// config uses the gateway (for the admin API, which outlives configs).
func Current() *Registry {
	var found *Registry
	registries.Range(func(_, v any) bool {
		found = v.(*Registry)
		return false
	})
	return found
}

// Interface guard: the process's registry is a UsagePool value.
var _ caddy.Destructor = (*Registry)(nil)
