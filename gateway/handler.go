package gateway

import (
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/config"
	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/queue"
	"github.com/browserfailover/caddy-browser-failover/sessions"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// What Provision builds for a handler (Gateway), the handler's view of one
// provider (member), and what every session of the handler runs with.
// Everything else in the package builds on these.

// Gateway is what a browser_failover handler runs: its configuration
// and what Provision builds from it. Its methods (about 35, more than a
// type should have) are what concerns the handler as a whole, in the
// files of each part: a part's provisioning and cleanup, one pair per
// part (gateway.go, shared.go, healthcheck.go, front_warm.go, warm.go,
// ledger.go, client_keys.go, handler_key.go); the entry of each request
// (ServeHTTP, serveUpgrade); what concerns all its providers together —
// their health as attempts settle (steps.go), their pools and what a
// waiter may use (connect.go), their shared state (shared.go), their
// create_rate (create_rate.go); and what every session runs with
// (handler.go). A client's way is connect's, a WebDriver session's
// webDrivers', so none of theirs is here.
type Gateway struct {
	*config.Handler

	// reg is the gateway's state that outlives config loads: taken on
	// Provision, given back on Cleanup.
	reg     *pool.Registry
	logger  *zap.Logger
	members []*member
	// line is the handler's share of the process's wait queue.
	line      *queue.Line
	discovery bool
	claimed   []string
	gen       any               // the config load this handler belongs to
	obs       *observe.Observer // metrics, events, webhooks
	// routed: some provider declares a protocol, so clients are matched.
	routed bool
	// webdriver: some provider is a WebDriver one, so WebDriver's HTTP
	// requests are served (webdriver.go).
	webdriver bool
	// pools holds, per class of client, the members that can serve it
	// and their own strategy (poolOf).
	pools  *sync.Map
	shared *shared // state redis; nil when state is per node
	// probes are the providers whose probe loop has this handler's
	// health check.
	probes []*pool.ProviderState
	// origins are the web-page origins whose upgrades are served.
	origins config.OriginSet
	// warmers are the warm sessions' keepers of its providers with warm
	// (warm.go); cleaned is set once Cleanup began.
	warmers []pool.Warmer
	cleaned *atomic.Bool
	// rec records its CDP sessions (recording.go); nil: off.
	rec *recording
	// prof keeps its clients' browser profiles (profiles.go); nil: off.
	prof *profileKeeper
	// key tells this handler apart from the other handlers of the
	// gateway, the same across reloads and nodes for the same config
	// (handler_key.go).
	key string
}

// member is one provider of this handler: its dialer (which also tells
// whom it serves) and its process-wide state.
type member struct {
	up    *upstreams.Provider
	state *pool.ProviderState
	// expectedCost is what a session of expected_duration costs there,
	// for the cheapest strategy and for the warm-ups its budget must be
	// able to pay for.
	expectedCost float64
	// warm keeps this handler's warm sessions of the provider (nil:
	// none; warm.go).
	warm pool.Warmer
}

// shared is a handler's use of a store.
type shared struct {
	s      *cluster.Shared
	reject bool // on_unavailable reject
	cancel func()
	stop   chan struct{} // closed on Cleanup
}

// sessionDeps are what the handler's sessions report to and run on.
func (h *Gateway) sessionDeps() sessions.Deps {
	return sessions.Deps{Clock: h.reg.Clock(), Logger: h.logger, Metrics: h.reg.Metrics()}
}

// limits are the handler's session limits (its session block); idle, when
// not 0, is the idle timeout when the block sets none.
func (h *Gateway) limits(idle time.Duration) sessions.Limits {
	l := sessions.Limits{Idle: idle}
	if s := h.Session; s != nil {
		if s.IdleTimeout > 0 {
			l.Idle = time.Duration(s.IdleTimeout)
		}
		l.MaxDuration = time.Duration(s.MaxDuration)
	}
	return l
}
