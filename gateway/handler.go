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
	reg    *pool.Registry
	logger *zap.Logger
	// roster is the handler's providers now (roster.go): each client's
	// pass reads one; a providers block's refresh swaps in a new one.
	roster *atomic.Pointer[roster]
	// found runs the handler's providers blocks (found.go); nil without
	// any.
	found *finder
	// name names the handler in status and metrics: its providers
	// blocks' and providers' names.
	name string
	// line is the handler's share of the process's wait queue.
	line      *queue.Line
	discovery bool
	gen       any               // the config load this handler belongs to
	obs       *observe.Observer // metrics, events, webhooks
	// routed: some provider declares a protocol, so clients are matched.
	routed bool
	// webdriver: some provider is a WebDriver one, so WebDriver's HTTP
	// requests are served (webdriver.go).
	webdriver bool
	// strategies hold, per class of client, the strategy that orders
	// its pool (poolFor), whatever the roster.
	strategies *sync.Map
	shared     *shared // state redis; nil when state is per node
	// origins are the web-page origins whose upgrades are served.
	origins config.OriginSet
	// cleaned is set once Cleanup began.
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
// whom it serves), its process-wide state and what it was built from.
type member struct {
	up    *upstreams.Provider
	state *pool.ProviderState
	cfg   *config.ProviderConfig
	// expectedCost is what a session of expected_duration costs there,
	// for the cheapest strategy and for the warm-ups its budget must be
	// able to pay for.
	expectedCost float64
	// warm keeps this handler's warm sessions of the provider (nil:
	// none; warm.go).
	warm pool.Warmer
}

// newMember builds the provider of pc and claims its process-wide state
// for the handler (found names the providers block that found it, "" for
// a configured one); single: it is the handler's only provider. What it
// claimed is given back by dropMember.
func (h *Gateway) newMember(pc *config.ProviderConfig, found string, known func(string) string, single bool) (*member, error) {
	d := upstreams.Defaults{ConnectTimeout: time.Duration(h.ConnectTimeout), ForwardHeaders: h.ForwardHeaders,
		Releaser: h.reg.Releaser(), APITransport: h.reg.APITransport()}
	if pc.SessionAPI != nil || pc.Protocol == string(upstreams.ProtocolWebDriver) {
		// Its counts outlive the config load, as its sessions do.
		d.Books = h.reg.Books.Of(pc.Name)
	}
	up, err := upstreams.New(pc.Config, d, known)
	if err != nil {
		return nil, err
	}
	// Each block was checked by its validator, and the two merged by
	// the handler's (clash).
	cfg := h.Cooldown.Settings().Merge(pc.Cooldown.Settings())
	state, err := h.reg.Claim(pc.Name, up.Key(), up.Redacted(), h.gen, cfg, single, pc.EffectiveMaxConcurrent())
	if err != nil {
		return nil, err
	}
	state.SetFound(found)
	state.Spend.SetPricing(pool.Pricing{Cost: pc.Cost, Budget: pc.Budget, Auto: pc.MaxConcurrent.Auto, Interval: time.Duration(cfg.WithDefaults().Duration)})
	var rate pool.CreateRate
	if r := pc.CreateRate; r != nil {
		rate = pool.CreateRate{N: r.N, Window: r.Window()}
	}
	state.Starts.SetRate(rate)
	state.OnReset(h, func() { h.resetRecovered(state) })
	return &member{up: up, state: state, cfg: pc, expectedCost: pc.Cost.Of(h.expectedDuration())}, nil
}

// dropMember gives back what newMember claimed for m.
func (h *Gateway) dropMember(m *member) {
	m.state.RemoveOnReset(h)
	h.reg.ReleaseClaim(m.up.Name, h.gen)
}

// expectedDuration is expected_duration, its default applied.
func (h *Gateway) expectedDuration() time.Duration {
	if h.ExpectedDuration > 0 {
		return time.Duration(h.ExpectedDuration)
	}
	return config.DefaultExpectedDuration
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

// noteProtocol notes what a provider of the handler (or one that a
// providers block may find) speaks: some declare a protocol, so clients
// are matched; some speak WebDriver, so its requests are served.
func (h *Gateway) noteProtocol(up *upstreams.Provider) {
	if up.Protocol() != upstreams.ProtocolAny {
		h.routed = true
	}
	if up.Protocol() == upstreams.ProtocolWebDriver {
		h.webdriver = true
	}
}

// resetRecovered reports a provider that a reset (an operator's, here or
// on another node) took out of cooldown.
func (h *Gateway) resetRecovered(st *pool.ProviderState) {
	h.logger.Info("provider recovered", zap.String("provider", st.Name()), zap.String("by", "reset"))
	h.obs.Recovered(st.Name())
}
