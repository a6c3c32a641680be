package gateway

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	// Extended CONNECT on, so HTTP/2 clients can open WebSockets.
	"github.com/browserfailover/caddy-browser-failover/config"
	_ "github.com/browserfailover/caddy-browser-failover/internal/xconnect"
	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/pool" // also registers the admin API module
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// New provisions the gateway of configuration cfg: it resolves
// placeholders, builds the providers, claims their process-wide state and
// takes the handler's line in the wait queue; the metrics' gauges read the
// registry through gauges (what operators see is above the gateway). On
// an error, what it took is given back by Cleanup, which is safe on the
// gateway it returns.
func New(ctx caddy.Context, cfg *config.Handler, gauges func(*pool.Registry) prometheus.Collector) (*Gateway, error) {
	h := &Gateway{Handler: cfg}
	return h, h.provision(ctx, gauges)
}

func (h *Gateway) provision(ctx caddy.Context, gauges func(*pool.Registry) prometheus.Collector) error {
	h.logger = ctx.Logger()
	h.cleaned = new(atomic.Bool)
	if err := h.Validate(); err != nil {
		return err
	}
	h.reg = pool.Acquire(setupRegistry)
	var err error
	if err := observe.Register(ctx.GetMetricsRegistry(), h.reg.Metrics(), gauges(h.reg)); err != nil {
		return err
	}
	if h.obs, err = observe.New(ctx, h.logger, h.Webhooks, h.reg.Metrics()); err != nil {
		return err
	}
	closeOnExit(ctx, h)
	h.discovery = h.Discovery == nil || *h.Discovery
	h.origins = config.NewOriginSet(h.AllowedOrigins)
	h.pools = new(sync.Map)
	single := len(h.Providers) == 1

	// The config load's identity: one metrics registry per load.
	h.gen = ctx.GetMetricsRegistry()
	h.provisionKey()
	repl := caddy.NewReplacer()
	known := func(s string) string { return repl.ReplaceKnown(s, "") }
	expected := config.DefaultExpectedDuration
	if h.ExpectedDuration > 0 {
		expected = time.Duration(h.ExpectedDuration)
	}
	defaults := upstreams.Defaults{ConnectTimeout: time.Duration(h.ConnectTimeout), ForwardHeaders: h.ForwardHeaders,
		Releaser: h.reg.Releaser(), APITransport: h.reg.APITransport()}
	for _, pc := range h.Providers {
		d := defaults
		if pc.SessionAPI != nil || pc.Protocol == string(upstreams.ProtocolWebDriver) {
			// Its counts outlive the config load, as its sessions do.
			d.Books = h.reg.Books.Of(pc.Name)
		}
		up, err := upstreams.New(pc.Config, d, known)
		if err != nil {
			return err
		}
		// Each block was checked by its validator, and the two merged by
		// the handler's (clash).
		cfg := h.Cooldown.Settings().Merge(pc.Cooldown.Settings())
		state, err := h.reg.Claim(pc.Name, up.Key(), up.Redacted(), h.gen, cfg, single, pc.EffectiveMaxConcurrent())
		if err != nil {
			return err
		}
		h.claimed = append(h.claimed, pc.Name)
		state.Spend.SetPricing(pool.Pricing{Cost: pc.Cost, Budget: pc.Budget, Auto: pc.MaxConcurrent.Auto, Interval: time.Duration(cfg.WithDefaults().Duration)})
		var rate pool.CreateRate
		if r := pc.CreateRate; r != nil {
			rate = pool.CreateRate{N: r.N, Window: r.Window()}
		}
		state.Starts.SetRate(rate)
		if up.Protocol() != upstreams.ProtocolAny {
			h.routed = true
		}
		if up.Protocol() == upstreams.ProtocolWebDriver {
			h.webdriver = true
		}
		state.OnReset(h, func() { h.resetRecovered(state) })
		h.members = append(h.members, &member{up: up, state: state, expectedCost: pc.Cost.Of(expected)})
	}
	if err := h.provisionShared(known, webDrivers{h}.webDriverNews); err != nil {
		return err
	}
	h.provisionLedger(ctx, known)
	h.provisionClientKeys(ctx)
	if err := h.provisionRecording(ctx); err != nil {
		return err
	}
	if err := h.provisionProfiles(ctx, known); err != nil {
		return err
	}

	size, timeout := config.DefaultQueueSize, config.DefaultQueueTimeout
	if q := h.Queue; q != nil {
		if q.Size != nil {
			size = *q.Size
		}
		if q.Timeout > 0 {
			timeout = time.Duration(q.Timeout)
		}
	}
	if size <= 0 {
		size, timeout = 0, 0
	}
	all := make([]int, len(h.members))
	names := make([]string, len(h.members))
	for i, m := range h.members {
		all[i], names[i] = i, m.up.Name
	}
	h.line = h.reg.Waiting.NewLine(h, size, timeout, h.resources(all), h.wants)
	h.reg.Queues.Register(h, h.line, names)
	// What it makes for its clients serves only its own (and, after a
	// reload that changes its block, its successor's).
	h.reg.Handlers.Register(h, h.gen, h.key, names)
	// A provider still cooling down from before a reload is offered when
	// its cooldown ends.
	for _, m := range h.members {
		if u := m.state.Health.Until(); !u.IsZero() {
			m.state.WakeAt(u)
		}
	}
	if err := h.provisionProbes(known); err != nil {
		return err
	}
	h.provisionWarm()
	return nil
}

// Cleanup gives back the handler's claims. Its waiting clients move, in
// order, to the handler of the new config; live sessions go on across a
// reload. When the process is exiting, waiters are answered and every
// session gets close 1001. Cleanup is safe after a partial Provision.
func (h *Gateway) Cleanup() error {
	if h.reg == nil {
		return nil // Provision stopped before it took anything
	}
	defer pool.Release()
	h.cleaned.Store(true)
	h.reg.Handlers.ForgetLoad(h.gen)
	h.retireKey()
	h.cleanupWarm()
	for _, m := range h.members {
		m.state.RemoveOnReset(h)
	}
	h.cleanupProbes()
	h.cleanupRecording()
	h.cleanupProfiles()
	if h.obs != nil {
		h.obs.Close()
	}
	h.cleanupShared()
	h.reg.Queues.Unregister(h)
	if h.line != nil {
		if caddy.Exiting() {
			h.line.Close()
		} else {
			// A reload: what the moved waiters want and has room now
			// (a provider added, a limit raised) serves them at once.
			for _, r := range h.reg.Waiting.Retire(h.line) {
				if st, ok := h.reg.ByResource(r); ok && st.HasRoom() {
					st.Notify()
				}
			}
		}
	}
	// Cleanup writes no field of h: Caddy's events app copies the handler
	// (its CaddyModule has a value receiver) while a late event is sent.
	for _, name := range h.claimed {
		h.reg.ReleaseClaim(name, h.gen)
	}
	if caddy.Exiting() {
		// Parked sessions end with the process: held ones are closed,
		// created provider sessions waiting for their window released.
		h.reg.Parked.ExpireAll()
		closeAllSessions(h.reg)
		finishReleases(h.reg, h.logger)
	}
	return nil
}

// ServeHTTP serves a request with the front of its kind of client: a
// WebDriver request (a create, a command, a session's socket, the status)
// when the handler has WebDriver providers, a WebSocket upgrade; it
// answers discovery requests itself and anything else with 426.
func (h *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	if h.webdriver {
		if wr, ok := parseWebDriverPath(r.URL.Path); ok {
			wd := webDrivers{h}
			if !upstreams.IsUpgrade(r) {
				wd.serveWebDriver(w, r, wr)
				return nil
			}
			if wd.serveWebDriverSocket(w, r, wr) {
				return nil
			}
		}
	}
	if upstreams.IsUpgrade(r) {
		h.serveUpgrade(w, r)
		return nil
	}
	if h.discovery && isDiscoveryPath(r) {
		return serveDiscovery(w, r)
	}
	return writeJSON(w, http.StatusUpgradeRequired, map[string]string{
		"error": "this endpoint serves WebSocket upgrades for browser automation clients (CDP, WebDriver BiDi or Playwright)",
	}, func(hd http.Header) {
		hd.Set("Upgrade", "websocket")
		hd.Set("Connection", "Upgrade")
	})
}

// resetRecovered reports a provider that a reset (an operator's, here or
// on another node) took out of cooldown.
func (h *Gateway) resetRecovered(st *pool.ProviderState) {
	h.logger.Info("provider recovered", zap.String("provider", st.Name()), zap.String("by", "reset"))
	h.obs.Recovered(st.Name())
}

// closeOnExit makes the HTTP server the handler is provisioned in stop
// serving as soon as it begins to shut down for a process exit: the
// handler's waiters get 503 (before shutdown frees any slot they could
// take), no provider session is created any more, and every live session
// gets 1001. Cleanup, which does the same, comes too late for HTTP/2 and
// HTTP/3 sessions: their requests are still being served, and Caddy stops
// its servers (waiting for requests to finish, with no end by default)
// before it cleans up modules. The chain itself starts no attempt once
// the process is exiting (chain.go). On a reload (not exiting) the hook
// does nothing and sessions go on.
func closeOnExit(ctx caddy.Context, h *Gateway) {
	srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if !ok {
		return
	}
	srv.RegisterOnShutdown(func() {
		if caddy.Exiting() {
			if h.line != nil {
				h.line.Close()
			}
			h.reg.Releaser().StopCreates()
			h.reg.Parked.ExpireAll()
			closeAllSessions(h.reg)
		}
	})
}

// closeAllSessions ends every live session of the process with 1001 and
// waits (a bounded time) until they have ended.
func closeAllSessions(reg *pool.Registry) {
	reg.Sockets.CloseAll(upstreams.CloseGoingAway, upstreams.EndShutdown)
	reg.Sessions.CloseAll(upstreams.CloseGoingAway, upstreams.EndShutdown, time.Now().Add(2*upstreams.CloseWait))
}
