// Package browserfailover is a Caddy HTTP handler that gives browser
// automation clients (Puppeteer, Playwright, chromedp) one WebSocket URL in
// front of several remote-browser providers. For each upgrade it picks a
// healthy provider, fails over to the next until a session is established,
// queues clients when all are busy, and relays the session byte for byte.
package browserfailover

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/queue"
	_ "github.com/browserfailover/caddy-browser-failover/status" // the admin API module
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// handlerRuntime is the part of a Handler that Provision builds.
type handlerRuntime struct {
	logger    *zap.Logger
	members   []*member
	names     []string // the members' names, in config order
	strategy  upstreams.Strategy
	queue     *queue.Queue
	discovery bool
	claimed   []string
	gen       any // the config load this handler belongs to
	single    bool
	obs       *observe.Observer // metrics, events, webhooks
	// routed: some provider declares a protocol, so clients are matched.
	routed       bool
	queueSize    int
	queueTimeout time.Duration
	*quotaState
	shared *shared // state redis; nil when state is per node
}

// member is one provider of this handler: its dialer and its process-wide
// state.
type member struct {
	up        *upstreams.Provider
	state     *pool.Provider
	index     int
	proto     upstreams.Protocol
	pwVersion string
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.browser_failover",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision resolves placeholders, builds the providers and claims their
// process-wide state.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	if err := h.check(); err != nil {
		return err
	}
	strategy, err := upstreams.NewStrategy(h.Strategy)
	if err != nil {
		return err
	}
	h.strategy = strategy
	if h.obs, err = observe.New(ctx, h.logger, h.Webhooks); err != nil {
		return err
	}
	closeOnExit(ctx)
	h.discovery = h.Discovery == nil || *h.Discovery
	h.single = len(h.Providers) == 1

	qsize, qtimeout := defaultQueueSize, defaultQueueTimeout
	if h.Queue != nil {
		if h.Queue.Size != nil {
			qsize = *h.Queue.Size
		}
		if h.Queue.Timeout > 0 {
			qtimeout = time.Duration(h.Queue.Timeout)
		}
	}
	if qsize > 0 {
		h.queue = queue.New(qsize, qtimeout, queue.RealClock())
	}
	h.queueSize, h.queueTimeout = qsize, qtimeout
	h.quotaState = &quotaState{keyQueues: map[string]*keyQueue{}}

	// The config load's identity: one metrics registry per load.
	gen := ctx.GetMetricsRegistry()
	h.gen = gen
	repl := caddy.NewReplacer()
	base := h.Cooldown.toConfig()
	for i, pc := range h.Providers {
		opts := upstreams.Options{
			Name:           pc.Name,
			URL:            repl.ReplaceKnown(pc.URL, ""),
			Priority:       defaultPriority,
			Weight:         pc.Weight,
			ConnectTimeout: time.Duration(h.ConnectTimeout),
			PassQuery:      pc.PassQuery,
			Discover:       pc.Discover,
		}
		if pc.Priority != nil {
			opts.Priority = *pc.Priority
		}
		if pc.ConnectTimeout > 0 {
			opts.ConnectTimeout = time.Duration(pc.ConnectTimeout)
		}
		for _, op := range pc.HeadersUp {
			opts.HeaderOps = append(opts.HeaderOps, upstreams.HeaderOp{Op: op.Op, Field: op.Field, Value: repl.ReplaceKnown(op.Value, "")})
		}
		if pc.TLS != nil {
			opts.TLS = upstreams.TLSOptions{
				InsecureSkipVerify: pc.TLS.InsecureSkipVerify,
				ServerName:         pc.TLS.ServerName,
				TrustedCACertFiles: pc.TLS.TrustedCACertFiles,
			}
		}
		up, err := upstreams.New(opts)
		if err != nil {
			return err
		}
		cfg := base.Merge(pc.Cooldown.toConfig())
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("provider %q: cooldown: %w", pc.Name, err)
		}
		state, err := pool.Claim(pc.Name, opts.URL, up.Redacted(), gen, cfg, h.single, pc.MaxConcurrent)
		if err != nil {
			return err
		}
		h.claimed = append(h.claimed, pc.Name)
		if h.queue != nil {
			state.AddWaker(h.queue)
			if until := state.Health.Until(); !until.IsZero() {
				h.queue.WakeAt(until)
			}
		}
		m := &member{up: up, state: state, index: i}
		m.proto, _ = upstreams.ParseProtocol(pc.Protocol)
		if pc.PlaywrightVersion != "" {
			m.pwVersion, _ = upstreams.ParsePlaywrightVersion(pc.PlaywrightVersion)
		}
		if m.proto != upstreams.ProtocolAny {
			h.routed = true
		}
		state.OnReset(h, func() { h.resetRecovered(state) })
		h.members = append(h.members, m)
	}
	h.names = make([]string, len(h.members))
	for i, m := range h.members {
		h.names[i] = m.up.Name
	}
	if err := h.provisionShared(); err != nil {
		return err
	}
	var qi pool.QueueInfo = offQueue{}
	if h.queue != nil {
		qi = h.queue
	}
	pool.RegisterQueue(h, qi, h.names)
	return nil
}

// offQueue is the status of a handler whose queue is off.
type offQueue struct{}

func (offQueue) Len() int               { return 0 }
func (offQueue) Size() int              { return 0 }
func (offQueue) Timeout() time.Duration { return 0 }

// Validate checks the configuration (JSON configs never pass through the
// Caddyfile parser).
func (h *Handler) Validate() error {
	return h.check()
}

// Cleanup gives back the handler's claims. Live sessions go on across a
// reload; when the process is exiting, every session gets close 1001.
func (h *Handler) Cleanup() error {
	for _, m := range h.members {
		m.state.RemoveOnReset(h)
	}
	h.obs.Close()
	h.cleanupShared()
	pool.UnregisterQueue(h)
	if h.queue != nil {
		h.queue.Close()
	}
	for _, m := range h.members {
		if h.queue != nil {
			m.state.RemoveWaker(h.queue)
		}
	}
	for _, name := range h.claimed {
		pool.ReleaseClaim(name, h.gen)
	}
	h.claimed = nil
	if caddy.Exiting() {
		closeAllSessions()
	}
	return nil
}

// ServeHTTP runs the failover chain of SPEC section 3 for one request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if !upstreams.IsUpgrade(r) {
		if h.discovery && isDiscoveryPath(r) {
			return serveDiscovery(w, r)
		}
		return writeJSON(w, http.StatusUpgradeRequired, map[string]string{
			"error": "this endpoint serves WebSocket upgrades for browser automation clients (CDP or Playwright)",
		}, func(hd http.Header) {
			hd.Set("Upgrade", "websocket")
			hd.Set("Connection", "Upgrade")
		})
	}

	// 1. Check the request.
	hs, err := upstreams.Check(r)
	if err != nil {
		var ce *upstreams.CheckError
		errors.As(err, &ce)
		return writeJSON(w, ce.Status, map[string]string{"error": ce.Msg}, func(hd http.Header) {
			if ce.Status == http.StatusUpgradeRequired {
				hd.Set("Sec-WebSocket-Version", "13")
			}
		})
	}

	c := &connect{h: h, w: w, r: r, hs: hs, start: time.Now()}
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		c.replace = func(s string) string { return repl.ReplaceKnown(s, "") }
	}
	c.key = h.affinityKey(r)
	c.proto, c.pwVersion = upstreams.ClientProtocol(r.Header)
	if h.routed && !c.anyServes() {
		c.unservable(c.noProviderServes())
		return nil
	}
	if h.ClientLimit != nil {
		if !c.quotaGate() {
			return nil
		}
		defer c.releaseQuota()
	}
	defer func() {
		// A session that never started gives its slot back.
		releaseLease(c.lease)
		c.lease = nil
	}()
	return c.run()
}

// connect is one client's way through the chain.
type connect struct {
	h       *Handler
	w       http.ResponseWriter
	r       *http.Request
	hs      *upstreams.Handshake
	replace func(string) string
	key     string
	start   time.Time

	attempts []attempt
	waiter   *queue.Waiter
	waited   time.Duration
	order    []int
	later    []int
	cands    []upstreams.Candidate

	// What the client speaks (SPEC 11).
	proto     upstreams.Protocol
	pwVersion string
	// quota is the client_limit session the client holds (nil: none, or
	// handed to its session); quotaWaited is the time it waited for it;
	// deadline is that wait's deadline, which the provider queue keeps.
	quota       *pool.QuotaKey
	quotaWaited time.Duration
	deadline    time.Time
	// allIncompatible: the last pass found every provider it could use
	// answering 428 (a Playwright server of another version).
	allIncompatible bool
	// Hedged attempts started, and attempts given up for another's 101.
	hedgesStarted, hedgesWasted int
	// lease is the winning attempt's cluster-wide slot until its session
	// takes it.
	lease *cluster.Lease
}

// sinceJoined is the client's whole wait: for its quota, then in the queue.
func (c *connect) sinceJoined() time.Duration {
	return c.quotaWaited + time.Since(c.waiter.Joined())
}

// passEnd is how one pass over the candidates ended.
type passEnd int

const (
	passNothing     passEnd = iota // every candidate failed or was skipped
	passEstablished                // a session runs
	passAnswered                   // the client got an answer (relayed 4xx, error)
	passClientGone                 // the client went away
)

// maxLoggedAttempts bounds the attempts kept for the 503 body and logs.
const maxLoggedAttempts = 50

func (c *connect) run() error {
	h := c.h
	ctx := c.r.Context()
	var gen uint64
	var retryAt time.Time
	// While anyone waits, newcomers queue behind them.
	if h.queue != nil && h.queue.Len() > 0 {
		if !c.join(h.queue.Gen()) {
			return nil
		}
	}
	for first := true; ; first = false {
		passCtx := ctx
		var stopDeadline func()
		if c.waiter != nil {
			err := c.waiter.Wait(ctx, retryAt)
			switch {
			case err == nil:
			case errors.Is(err, queue.ErrTimeout), errors.Is(err, queue.ErrClosed):
				c.waited = c.sinceJoined()
				c.reject(http.StatusServiceUnavailable, "queue timeout")
				return nil
			default: // the client went away while waiting
				c.waited = c.sinceJoined()
				c.logGone()
				return nil
			}
			// A waiter past its deadline is never given a provider: the
			// pass stops (as if the client left) at the deadline.
			var cancel context.CancelFunc
			passCtx, cancel = context.WithCancel(ctx)
			t := time.AfterFunc(time.Until(c.waiter.Deadline()), cancel)
			stopDeadline = func() { t.Stop(); cancel() }
		}
		if h.queue != nil {
			gen = h.queue.Gen()
		}
		end, couldWait, retry := c.pass(passCtx, first && c.waiter == nil)
		if stopDeadline != nil {
			stopDeadline()
		}
		switch end {
		case passEstablished, passAnswered:
			if c.waiter != nil {
				c.waited = c.sinceJoined()
				c.waiter.Leave()
			}
			return nil
		case passClientGone:
			if c.waiter != nil {
				c.waited = c.sinceJoined()
				if ctx.Err() == nil {
					// Not the client: the waiter's deadline passed.
					c.waiter.Leave()
					c.reject(http.StatusServiceUnavailable, "queue timeout")
					return nil
				}
				c.waiter.Leave()
			}
			c.logGone()
			return nil
		}
		// A client that every provider it may use turned away with 428
		// can never be served here.
		if c.allIncompatible {
			if c.waiter != nil {
				c.waited = c.sinceJoined()
				c.waiter.Leave()
			}
			c.unservable("no provider here serves " + c.clientKind() + " clients: every provider that may answered 428 (another Playwright version)")
			return nil
		}
		// 7. Nothing available: wait in the queue, or 503.
		if h.queue == nil || !couldWait {
			if c.waiter != nil {
				c.waited = c.sinceJoined()
				c.waiter.Leave()
			}
			c.reject(http.StatusServiceUnavailable, "no provider available")
			return nil
		}
		retryAt = time.Time{}
		if retry {
			retryAt = time.Now().Add(time.Second)
		}
		h.wakeAtNextEnd()
		if c.waiter == nil && !c.join(gen) {
			return nil
		}
	}
}

// wakeAtNextEnd asks the queue to wake at the earliest end of a cooldown
// or skip among the handler's providers. The queue keeps only its earliest
// pending wake-up and drops later ones, so after every pass that found
// nothing the next end is asked for again; otherwise a provider coming
// back after another one would wake nobody.
func (h *Handler) wakeAtNextEnd() {
	var next time.Time
	for _, m := range h.members {
		if u := m.state.Health.Until(); !u.IsZero() && (next.IsZero() || u.Before(next)) {
			next = u
		}
	}
	if !next.IsZero() {
		h.queue.WakeAt(next)
	}
}

// join puts the client in the queue; on a full queue it answers 503.
func (c *connect) join(gen uint64) bool {
	w, err := c.h.queue.JoinBy(gen, c.deadline)
	if err != nil {
		c.reject(http.StatusServiceUnavailable, "queue full")
		return false
	}
	c.waiter = w
	return true
}

// passState is one pass's way through the ordered candidates.
type passState struct {
	order    []int
	next     int // index in order of the next candidate to look at
	deadline time.Time
	tried    int
	// Providers that could serve this client later: not drained, and not
	// a Playwright server of another version (428).
	serveable, incompatible int
	// retry: only providers that failed without cooling down stand in
	// the way.
	retry bool
	// stateDown: providers refused because the shared state is
	// unreachable (on_unavailable reject); they cannot be waited for.
	stateDown int
}

// pass runs steps 2 to 6 once. couldWait tells whether some provider could
// serve the client later (so it may queue); retry tells that only providers
// that failed without cooling down stand in the way (no event will wake the
// waiter, so it retries after a second).
func (c *connect) pass(ctx context.Context, advance bool) (end passEnd, couldWait, retry bool) {
	h := c.h
	// 2. Order the candidates.
	ps := &passState{order: c.orderCandidates(advance)}
	if h.TryDuration > 0 {
		ps.deadline = time.Now().Add(time.Duration(h.TryDuration))
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, ps.deadline)
		defer cancel()
	}
	if h.HedgeAfter > 0 {
		end = c.passHedged(ctx, ps)
	} else {
		end = c.passInTurn(ctx, ps)
	}
	c.allIncompatible = ps.serveable > 0 && ps.serveable == ps.incompatible
	return end, ps.serveable > ps.incompatible+ps.stateDown, ps.retry
}

// passInTurn attempts the candidates one after the other (4.).
func (c *connect) passInTurn(ctx context.Context, ps *passState) passEnd {
	for {
		m, permit, lease := c.pick(ps)
		if m == nil {
			return passNothing
		}
		res := m.up.Connect(ctx, c.hs, c.replace)
		switch end := c.conclude(ps, m, permit, res); end {
		case passEstablished:
			// 6. Relay.
			c.lease = lease
			if c.establish(m, res.Conn) {
				return passEstablished
			}
			return passClientGone
		case passNothing:
			releaseLease(lease)
		default:
			releaseLease(lease)
			return end
		}
		if ctx.Err() != nil && c.r.Context().Err() != nil {
			return passClientGone
		}
	}
}

// pick returns the next candidate to attempt, its health permit taken and
// a slot reserved, skipping (3.) providers drained, at max_concurrent or in
// cooldown; nil when the pass has no candidate left.
func (c *connect) pick(ps *passState) (*member, cooldown.Permit, *cluster.Lease) {
	h := c.h
	for ps.next < len(ps.order) {
		m := h.members[ps.order[ps.next]]
		ps.next++
		st := m.state
		if st.Draining() {
			c.skip(m, upstreams.WordDrained)
			continue
		}
		ps.serveable++
		if st.Full() {
			st.SkippedFull()
			c.skip(m, upstreams.WordFull)
			continue
		}
		if h.MaxAttempts > 0 && ps.tried >= h.MaxAttempts {
			ps.next = len(ps.order)
			break
		}
		if !ps.deadline.IsZero() && !time.Now().Before(ps.deadline) {
			ps.retry = true
			ps.next = len(ps.order)
			break
		}
		permit, ok := st.Health.Acquire()
		if !ok {
			c.skip(m, upstreams.WordCooldown)
			continue
		}
		if !st.TryReserve() {
			st.Health.Done(permit, cooldown.Neutral, 0)
			st.SkippedFull()
			c.skip(m, upstreams.WordFull)
			continue
		}
		// The cluster-wide slot, with shared state.
		lease, ok := c.claimShared(ps, m)
		if !ok {
			st.Health.Done(permit, cooldown.Neutral, 0)
			st.UnreserveFailed()
			continue
		}
		ps.tried++
		return m, permit, lease
	}
	return nil, cooldown.Permit{}, nil
}

// conclude classifies and records one attempt's result (5.): how the pass
// ends, passNothing to go on. On passEstablished the caller relays
// res.Conn.
func (c *connect) conclude(ps *passState, m *member, permit cooldown.Permit, res upstreams.Result) passEnd {
	st := m.state
	c.record(m, res.Outcome)
	switch res.Outcome.Kind {
	case upstreams.Success:
		c.settle(m, permit, cooldown.Success, 0)
		st.ObserveHandshake(res.Outcome.Elapsed)
		return passEstablished
	case upstreams.Failure:
		if res.Outcome.Word == upstreams.WordTimeout && !ps.deadline.IsZero() &&
			!time.Now().Before(ps.deadline) && res.Outcome.Elapsed < m.up.ConnectTimeout {
			// try_duration ran out, not the provider's own
			// connect_timeout: not the provider's failure.
			c.settle(m, permit, cooldown.Neutral, 0)
			ps.retry = true
		} else if c.settle(m, permit, cooldown.Failure, 0) == cooldown.NoChange {
			ps.retry = true
		}
		st.UnreserveFailed()
	case upstreams.Capacity:
		c.settle(m, permit, cooldown.Capacity, res.Outcome.RetryAfter)
		st.UnreserveFailed()
	case upstreams.Incompatible:
		c.settle(m, permit, cooldown.Neutral, 0)
		st.UnreserveFailed()
		ps.incompatible++
	case upstreams.Relay:
		c.settle(m, permit, cooldown.Neutral, 0)
		st.Unreserve()
		c.relayAnswer(res)
		return passAnswered
	case upstreams.ClientGone:
		st.Health.Done(permit, cooldown.Neutral, 0)
		st.Unreserve()
		return passClientGone
	}
	return passNothing
}

// settle records an attempt's result in the provider's health and reacts to
// what changed.
func (c *connect) settle(m *member, p cooldown.Permit, r cooldown.Result, retryAfter time.Duration) cooldown.Change {
	return c.h.settle(m.state, p, r, retryAfter)
}

// settle records an attempt's result in st's health and reacts to what
// changed: logs, events, queue wake-ups.
func (h *Handler) settle(st *pool.Provider, p cooldown.Permit, r cooldown.Result, retryAfter time.Duration) cooldown.Change {
	change := st.Health.Done(p, r, retryAfter)
	switch change {
	case cooldown.CooledDown, cooldown.Skipped:
		until := st.Health.Until()
		st.WakeAt(until)
		h.publishCooldown(st.Name(), until, st.Health.Streak())
		h.logger.Info("provider cooling down",
			zap.String("provider", st.Name()),
			zap.Time("until", until),
			zap.String("reason", st.LastError()))
		h.obs.Cooldown(st.Name(), until, st.LastError())
	case cooldown.Recovered:
		h.logger.Info("provider recovered", zap.String("provider", st.Name()))
		// Waiters that skipped it while its trial was in flight can use it.
		st.Notify()
		h.obs.Recovered(st.Name())
	}
	return change
}

// resetRecovered reports a provider that a reset (an operator's, here or
// on another node) took out of cooldown.
func (h *Handler) resetRecovered(st *pool.Provider) {
	h.logger.Info("provider recovered", zap.String("provider", st.Name()), zap.String("by", "reset"))
	h.obs.Recovered(st.Name())
}

// orderCandidates returns the indices of the handler's providers in the
// order to try them.
func (c *connect) orderCandidates(advance bool) []int {
	h := c.h
	c.order = c.order[:0]
	if c.key != "" {
		c.order = upstreams.AffinityOrder(c.key, h.names, c.order)
		return c.fit(c.order)
	}
	c.cands = c.cands[:0]
	for i, m := range h.members {
		ms, has := m.state.HandshakeMS()
		c.cands = append(c.cands, upstreams.Candidate{
			Index: i, Priority: m.up.Priority, Weight: m.up.Weight,
			Active: m.state.Reserved(), LatencyMS: ms, HasLatency: has,
		})
	}
	c.order = h.strategy.Order(c.cands, advance, c.order)
	return c.fit(c.order)
}

// affinityKey extracts the affinity key of a request ("" when none).
func (h *Handler) affinityKey(r *http.Request) string {
	a := h.Affinity
	if a == nil {
		return ""
	}
	switch a.Source {
	case "header":
		return r.Header.Get(a.Name)
	case "query":
		return r.URL.Query().Get(a.Name)
	case "cookie":
		if ck, err := r.Cookie(a.Name); err == nil {
			return ck.Value
		}
	}
	return ""
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
