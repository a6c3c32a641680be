package pool

import (
	mrand "math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/queue"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Registry is the gateway's state that outlives a config load, and the
// clock all of it runs on. It is one value: the process's is kept in a
// caddy.UsagePool entry that every handler takes on Provision and gives
// back on Cleanup (Acquire, Release), so it lives as long as some config
// uses the gateway, reloads included; a test builds a registry of its own
// with NewRegistry.
//
// The registry itself holds every provider's entry (ProviderState, claimed
// by the handlers that use the name), the releaser of provider sessions
// and the transport of session API calls, and the metrics' counters. The
// rest is in parts, each with its own state and lock, made with the
// registry and never replaced: the wait queue, the live and the parked
// sessions, the client_limit counts, the keyed hashes, the session API
// books, the ledger, the client keys' spend, the handlers and their
// successions, the warm sessions' keepers, the handlers' queues as
// status lists them, the recordings and the browser profiles.
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
	// Sessions are the live sessions (sessions.go, bound.go).
	Sessions *LiveSessions
	// Parked are the sessions a client may resume (resume.go).
	Parked *ParkedSessions
	// Quotas are the client_limit counts (quota.go).
	Quotas *Quotas
	// Hashes key what could serve as a credential before it is kept or
	// shown (hashes.go).
	Hashes *Hashes
	// Books are the session API counts of each provider (books.go).
	Books *APIBooks
	// Ledger keeps the created provider sessions until their release is
	// confirmed (ledger.go).
	Ledger *LedgerKeeper
	// ClientBooks are what each client key spent, for client_budget
	// (spend.go).
	ClientBooks *ClientBooks
	// Handlers are the handler keys given per config load and the live
	// handlers with the successors of those a reload replaced
	// (handlers.go, succession.go).
	Handlers *Handlers
	// Warmers are the keepers of each handler's warm sessions (warm.go).
	Warmers *Warmers
	// Queues are the handlers' queues as status lists them (queues.go).
	Queues *Queues
	// Recordings are the stores of recorded sessions and the recordings
	// under way (recordings.go).
	Recordings *Recordings
	// Profiles are the browser profiles in use, the clients waiting for
	// one, and the storages they are kept in (profiles.go).
	Profiles *Profiles

	// providers holds the configured providers' entries, claimed by the
	// handlers that use them (Claim, ReleaseClaim).
	providers *caddy.UsagePool
	// retired holds providers that left the config with sessions still
	// live, by name, until those end.
	retiredMu sync.Mutex
	retired   map[string]*ProviderState

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
}

// NewRegistry returns an empty registry on clock (nil: the real one).
func NewRegistry(clock queue.Clock) *Registry {
	if clock == nil {
		clock = queue.RealClock()
	}
	r := &Registry{
		clock:        clock,
		Waiting:      queue.New(clock),
		providers:    caddy.NewUsagePool(),
		retired:      map[string]*ProviderState{},
		releaser:     upstreams.NewReleaser(),
		apiTransport: upstreams.NewAPITransport(),
		metrics:      observe.NewMetrics(),
		probeOffset:  mrand.N(24 * time.Hour),
	}
	r.Sessions = newLiveSessions()
	r.Parked = newParkedSessions(clock)
	r.Hashes = newHashes()
	r.Quotas = newQuotas(r.Waiting, r.Hashes)
	r.Books = newAPIBooks()
	r.Ledger = newLedgerKeeper(clock, r.releaser)
	r.ClientBooks = newClientBooks(clock, r.Hashes)
	r.Handlers = newHandlers(r.Sessions)
	r.Warmers = newWarmers()
	r.Queues = newQueues()
	r.Recordings = newRecordings(clock)
	r.Profiles = newProfiles(clock)
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

// Destruct implements caddy.Destructor: the last config that used the
// gateway is gone (or the process is exiting). Parked sessions end with
// it: held ones are closed, created provider sessions released.
func (r *Registry) Destruct() error {
	r.Parked.ExpireAll()
	r.Ledger.close()
	r.Recordings.stop()
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
