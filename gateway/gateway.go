// Package gateway is what a browser_failover handler runs: the providers
// it builds and claims at provision (gateway.go), and for each request the
// front of its kind of client — a WebSocket upgrade (front_upgrade.go), a
// WebDriver create (front_webdriver.go) — which walks the failover chain
// (chain.go: check, join, order, admit, attempt, settle, establish, or the
// queue, or one refusal); warm-ups are a front without a client
// (front_warm.go). Its providers are one roster (roster.go), which the
// providers its `providers` blocks find at run time change (found.go).
// The sessions its fronts establish (a relayed socket,
// a WebDriver session, a warm session) each live one lifecycle (package
// sessions). Its files refer only to files on their floor or below, in
// the order docs/design.md gives.
package gateway

import (
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"

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
	h.roster = new(atomic.Pointer[roster])
	h.roster.Store(newRoster(nil, nil, nil))
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
	h.strategies = new(sync.Map)
	single := len(h.Providers) == 1 && len(h.DynamicProviders) == 0

	// The config load's identity: one metrics registry per load.
	h.gen = ctx.GetMetricsRegistry()
	h.provisionKey()
	repl := caddy.NewReplacer()
	known := func(s string) string { return repl.ReplaceKnown(s, "") }
	var members []*member
	for _, pc := range h.Providers {
		m, err := h.newMember(pc, "", known, single)
		if err != nil {
			return err
		}
		h.noteProtocol(m.up)
		members = append(members, m)
		// In the roster at once, so a Cleanup after a failure gives
		// back what was claimed.
		h.roster.Store(newRoster(members, nil, nil))
	}
	// The providers found by the handler's providers blocks, and what
	// they may find.
	if err := h.provisionFound(ctx, known); err != nil {
		return err
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
	r := h.current()
	h.name = h.handlerName()
	h.line = h.reg.Waiting.NewLine(h, size, timeout, r.lineResources(h.DynamicProviders), h.wants)
	h.reg.Queues.Register(h, h.line, h.name)
	taking, leaving := r.states()
	h.reg.Queues.SetProviders(h, taking, leaving)
	// What it makes for its clients serves only its own (and, after a
	// reload that changes its block, its successor's).
	h.reg.Handlers.Register(h, h.gen, h.key, r.names(h.DynamicProviders))
	// A provider still cooling down from before a reload is offered when
	// its cooldown ends.
	for _, m := range r.members {
		if u := m.state.Health.Until(); !u.IsZero() {
			m.state.WakeAt(u)
		}
	}
	if err := h.provisionProbes(known); err != nil {
		return err
	}
	h.provisionWarm()
	h.found.start()
	return nil
}

// handlerName names the handler in status and metrics: its providers
// blocks' names, then its providers', joined by commas.
func (h *Gateway) handlerName() string {
	var names []string
	for _, b := range h.DynamicProviders {
		names = append(names, b.Name)
	}
	for _, pc := range h.Providers {
		names = append(names, pc.Name)
	}
	return strings.Join(names, ",")
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
	// No roster changes from here.
	h.found.halt()
	r := h.current()
	all := slices.Concat(r.members, r.leaving)
	h.reg.Handlers.ForgetLoad(h.gen)
	h.retireKey()
	h.cleanupWarm()
	for _, m := range all {
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
			// A reload: a provider the moved waiters want for the first
			// time and that has room serves them at once (a limit raised
			// offered itself when the new config set it).
			for _, r := range h.reg.Waiting.Retire(h.line) {
				if st, ok := h.reg.ByResource(r); ok && st.HasRoom() {
					st.Notify()
				}
			}
		}
	}
	// Cleanup writes no field of h: Caddy's events app copies the handler
	// (its CaddyModule has a value receiver) while a late event is sent.
	for _, m := range all {
		h.reg.ReleaseClaim(m.up.Name, h.gen)
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
