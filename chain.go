package browserfailover

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/queue"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// The failover chain: one client's way through the gateway, top to bottom.
// ServeHTTP has already checked that the request is a WebSocket upgrade.
//
//  0. check      An upgrade a web page opened (it carries Origin) goes on
//                only from an origin allowed_origins names: 403 otherwise.
//  1. join       Name the client (its session ID and resume token) and recognise it: what
//                it speaks (CDP, or Playwright and its version), its
//                affinity key and its client_limit key. Take its
//                client_limit share, waiting in the queue while its key is
//                at the limit.
//  2. order      The strategy orders the providers this client can use,
//                rotating per pool.
//  3. skip       Providers drained, full, in cooldown, left to clients that
//                wait longer, or without a cluster-wide slot are passed over
//                without an attempt.
//  4. attempt    One candidate after the other, or hedged: the next one
//                starts beside a slow one.
//  5. settle     Each attempt's outcome goes to its provider's health the
//                same way on both paths, and says whether the pass goes on.
//  6. establish  The provider's 101, naming the session, goes to the
//                client once the session counts as live and is listed in
//                the session registry.
//  7. relay      Bytes both ways until a side ends (upstreams.Session).
//
// A pass (steps 2–6) that finds nothing puts the client in the queue for a
// provider it can use, and each offer it is woken by runs a pass again.
// Every client that gets no session ends with one answer, through finish
// (respond.go).

// WordQueued is the skip word of a provider left to clients that have been
// waiting for it longer: a newcomer never takes it from them.
const WordQueued = "queued"

// maxLoggedAttempts bounds the attempts kept for the 503 body and logs.
const maxLoggedAttempts = 50

// connect is one client's way through the chain.
type connect struct {
	h       *Handler // the handler serving it; a reload may hand it on
	w       http.ResponseWriter
	r       *http.Request
	hs      *upstreams.Handshake
	replace func(string) string
	repl    *caddy.Replacer // nil outside Caddy
	start   time.Time
	// id names the client's session (session_id.go).
	id string
	// token is the client's resume token (resume.go): the one it brought,
	// or (handOut) one the gateway made for it and puts on its 101; ""
	// when its session cannot be resumed.
	token   string
	handOut bool

	cls  *class
	pool *poolOf // the handler's members that can serve the client

	attempts                    []attempt
	hedgesStarted, hedgesWasted int
	// tries counts the provider attempts made (skips are not attempts).
	tries int

	// Waiting.
	mark    *queue.Mark // taken before the first pass; ended by Join, served or chain's end
	waiter  *queue.Waiter
	joined  time.Time
	waited  time.Duration
	inQuota bool // waiting for its client_limit share, not a provider

	// Held until the session takes them, or released by finish.
	quota *pool.QuotaKey
	lease *cluster.Lease

	// allIncompatible: the last pass found every provider it could use
	// answering 428 (a Playwright server of another version).
	allIncompatible bool
	finished        bool
	// leftHeld is closed when the client of a held session is let go
	// (resume.go); nil otherwise.
	leftHeld <-chan struct{}
}

// class is what the queue knows of a waiting client: enough for the
// handler of a new config to tell what it can use there.
type class struct {
	proto     upstreams.Protocol
	pwVersion string
	affinity  string
	// quota is the resource of its client_limit key, "" without one.
	quota string
	// quotaTemplate is the client_limit key it was counted under.
	quotaTemplate string
}

// chain runs the whole chain for one upgrade.
func (h *Handler) chain(w http.ResponseWriter, r *http.Request, hs *upstreams.Handshake) {
	c := &connect{h: h, w: w, r: r, hs: hs, start: time.Now(), id: newSessionID()}
	if repl := replacerOf(r); repl != nil {
		c.repl = repl
		c.replace = func(s string) string { return repl.ReplaceKnown(s, "") }
		repl.Set(PlaceholderSessionID, c.id)
	}
	// 0. Check: a web page may drive the browsers only from an origin
	// the operator allowed (origins.go); an exiting process serves no
	// one.
	if !h.origins.allows(r.Header.Values("Origin")) {
		c.finish(c.refuseOrigin())
		return
	}
	if caddy.Exiting() {
		c.finish(c.shuttingDown())
		return
	}
	// A client taking back a session it left goes to that session's
	// browser, or nowhere (resume.go).
	presented, token := resumeRequest(r, hs)
	if presented != "" {
		c.resume(presented)
		return
	}
	c.token = token
	// 1. Join. The mark comes before the client's first look for room; a
	// client that never joins the queue gives it back.
	c.mark = h.reg.Waiting.Mark()
	defer h.reg.Waiting.Forget(c.mark)
	if !c.join() {
		return
	}
	defer c.releaseHolds()
	ctx := r.Context()
	var retryAt time.Time
	for first := true; ; first = false {
		if !first && !c.wait(retryAt) {
			return
		}
		if caddy.Exiting() {
			// Woken by a slot that shutdown freed: no new session now.
			c.finish(c.shuttingDown())
			return
		}
		end, couldWait, retry := c.pass(first)
		switch end {
		case passEstablished, passAnswered:
			return
		case passClientGone:
			if caddy.Exiting() && ctx.Err() == nil {
				// The attempt was cut short by the exit (a create in
				// flight is released when it answers), not by the
				// client.
				c.finish(c.shuttingDown())
			} else if c.waiter != nil && ctx.Err() == nil {
				// Not the client: its wait ran out during the pass.
				c.finish(c.unavailable("queue timeout"))
			} else {
				c.finish(nil)
			}
			return
		}
		switch {
		case c.allIncompatible:
			c.finish(c.unservable("no provider here serves " + c.clientKind() + " clients: every provider that may answered 428 (another Playwright version)"))
			return
		case !couldWait:
			c.finish(c.unavailable("no provider available"))
			return
		}
		retryAt = time.Time{}
		if retry {
			retryAt = time.Now().Add(time.Second)
		}
		c.wakeAtCooldownEnds()
	}
}

// join recognises the client and takes its client_limit share. It reports
// false when the client already has its answer.
func (c *connect) join() bool {
	h := c.h
	proto, version := upstreams.ClientProtocol(c.r.Header)
	c.cls = &class{proto: proto, pwVersion: version, affinity: h.affinityKey(c.r)}
	c.pool = h.poolFor(c.cls)
	if len(c.pool.members) == 0 {
		c.finish(c.unservable(h.noProviderServes(c.cls)))
		return false
	}
	if !c.prepareResume() {
		return false
	}
	if h.ClientLimit == nil {
		return true
	}
	k := h.quotaKey(c.replace)
	c.cls.quota, c.cls.quotaTemplate = k.Resource(), k.Template
	if !c.h.reg.Waiting.Contended(k.Resource()) && c.h.reg.TakeQuota(k, h.ClientLimit.Limit) {
		c.quota = &k
		return true
	}
	// Over the limit, or others of its key wait: wait behind them.
	c.inQuota = true
	c.h.reg.AddQuotaWaiting(k, 1)
	defer c.h.reg.AddQuotaWaiting(k, -1)
	if !c.enqueue([]string{k.Resource()}) {
		return false
	}
	for {
		if !c.wait(time.Time{}) {
			return false
		}
		cl := c.h.ClientLimit
		if cl == nil || cl.Key != k.Template {
			// A reload dropped or changed the limit.
			c.inQuota = false
			c.waiter.Want(c.pool.resources)
			return true
		}
		if c.h.reg.TakeQuota(k, cl.Limit) {
			c.quota = &k
			c.inQuota = false
			// Its place in the queue is kept: now it waits for a provider.
			c.waiter.Want(c.pool.resources)
			if c.h.reg.QuotaActive(k) < cl.Limit {
				c.h.reg.Waiting.Offer(k.Resource())
			}
			return true
		}
	}
}

// enqueue puts the client at the back of the queue, waiting for want. On
// a full or closed queue the client is answered.
func (c *connect) enqueue(want []string) bool {
	w, err := c.h.line.Join(c.mark, c.cls, want, time.Time{})
	if err != nil {
		if errors.Is(err, queue.ErrUnavailable) && caddy.Exiting() {
			c.finish(c.shuttingDown())
			return false
		}
		why := "queue full"
		if errors.Is(err, queue.ErrUnavailable) || c.h.line.Size() == 0 {
			why = "no provider available"
		}
		c.finish(c.overOrUnavailable(why))
		return false
	}
	c.waiter, c.joined = w, time.Now()
	return true
}

// wait waits for an offer (or retryAt). The client is answered, and false
// returned, when its wait ends otherwise.
func (c *connect) wait(retryAt time.Time) bool {
	if c.waiter == nil {
		if !c.enqueue(c.pool.resources) {
			return false
		}
	}
	err := c.waiter.Wait(c.r.Context(), retryAt)
	switch {
	case err == nil:
	case errors.Is(err, queue.ErrTimeout):
		c.finish(c.overOrUnavailable("queue timeout"))
		return false
	case errors.Is(err, queue.ErrUnavailable) && caddy.Exiting():
		c.finish(c.shuttingDown())
		return false
	case errors.Is(err, queue.ErrUnavailable):
		c.finish(c.overOrUnavailable("no provider available"))
		return false
	default: // the client went away
		c.finish(nil)
		return false
	}
	// A reload may have handed the client to the new config's handler.
	if h, ok := c.waiter.Line().Owner().(*Handler); ok && h != c.h {
		c.h = h
		c.pool = h.poolFor(c.cls)
	}
	return true
}

// wakeAtCooldownEnds asks the queue to offer each provider the client can
// use at the end of its cooldown or skip. The queue keeps the earliest time
// per provider, so a cooldown that was extended since is asked for again.
func (c *connect) wakeAtCooldownEnds() {
	for _, i := range c.pool.members {
		st := c.h.members[i].state
		if u := st.Health.Until(); !u.IsZero() {
			st.WakeAt(u)
		}
	}
}

// passEnd is how one pass over the candidates ended.
type passEnd int

const (
	passNothing     passEnd = iota // every candidate failed or was skipped
	passEstablished                // a session runs
	passAnswered                   // the client got an answer (relayed 4xx, error)
	passClientGone                 // the client went away (or its wait ran out)
)

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
// that failed without cooling down stand in the way (no offer will come, so
// the waiter retries after a second).
func (c *connect) pass(first bool) (end passEnd, couldWait, retry bool) {
	h := c.h
	ctx := c.r.Context()
	if c.waiter != nil {
		// A waiter is never given a provider past its deadline: the pass
		// stops there as if the client had left.
		// (Cancelled, not a deadline: an attempt cut short so is the
		// client's doing, not the provider's timeout.)
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		t := time.AfterFunc(time.Until(c.waiter.Deadline()), cancel)
		defer func() { t.Stop(); cancel() }()
	}
	// 2. Order the candidates.
	ps := &passState{order: c.order(first && c.waiter == nil)}
	if h.TryDuration > 0 {
		ps.deadline = time.Now().Add(time.Duration(h.TryDuration))
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, ps.deadline)
		defer cancel()
	}
	// 4. Attempt.
	if h.HedgeAfter > 0 {
		end = c.attemptHedged(ctx, ps)
	} else {
		end = c.attemptInTurn(ctx, ps)
	}
	c.allIncompatible = ps.serveable > 0 && ps.serveable == ps.incompatible
	return end, ps.serveable > ps.incompatible+ps.stateDown, ps.retry
}

// order returns the indices of the members to try, in order: the strategy
// (or affinity) over the providers this client can use, those declaring
// its exact Playwright version first. advance is true only on a newcomer's
// first pass: only real upgrades move a strategy's rotation.
func (c *connect) order(advance bool) []int {
	h := c.h
	var order []int
	if c.cls.affinity != "" {
		names := make([]string, len(c.pool.members))
		for j, i := range c.pool.members {
			names[j] = h.members[i].up.Name
		}
		for _, j := range upstreams.AffinityOrder(c.cls.affinity, names, nil) {
			order = append(order, c.pool.members[j])
		}
	} else {
		cands := make([]upstreams.Candidate, 0, len(c.pool.members))
		for _, i := range c.pool.members {
			m := h.members[i]
			ms, has := m.state.HandshakeMS()
			cands = append(cands, upstreams.Candidate{
				Index: i, Priority: m.up.Priority, Weight: m.up.Weight,
				Active: m.state.Reserved(), LatencyMS: ms, HasLatency: has,
			})
		}
		order = c.pool.strategy.Order(cands, advance, make([]int, 0, len(cands)))
	}
	if !h.routed || c.cls.proto != upstreams.ProtocolPlaywright {
		return order
	}
	exact := order[:0:0]
	var rest []int
	for _, i := range order {
		m := h.members[i]
		if upstreams.Prefers(m.proto, m.pwVersion, c.cls.proto, c.cls.pwVersion) {
			exact = append(exact, i)
		} else {
			rest = append(rest, i)
		}
	}
	return append(exact, rest...)
}

// 3. Skip: pick returns the next candidate to attempt, its health permit
// taken and a slot reserved, passing over providers drained, full, in
// cooldown, left to longer waiters, or without a cluster-wide slot; nil
// when the pass has no candidate left.
func (c *connect) pick(ps *passState) (*member, cooldown.Permit, *cluster.Lease) {
	h := c.h
	for ps.next < len(ps.order) {
		if caddy.Exiting() {
			// No new attempt once the process is exiting.
			ps.next = len(ps.order)
			break
		}
		m := h.members[ps.order[ps.next]]
		ps.next++
		st := m.state
		if st.Draining() {
			c.skip(m, upstreams.WordDrained)
			continue
		}
		ps.serveable++
		if c.waiter == nil && c.h.reg.Waiting.Contended(st.Resource()) {
			// No barging: clients waiting for it go first.
			c.skip(m, WordQueued)
			continue
		}
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
		a, ok := c.admit(ps, m, nil)
		if !ok {
			continue
		}
		ps.tried++
		return m, a.permit, a.lease
	}
	return nil, cooldown.Permit{}, nil
}

// admission is what an admitted attempt holds: its provider's health
// permit and its cluster-wide slot (nil without shared state); its slot
// is reserved.
type admission struct {
	permit cooldown.Permit
	lease  *cluster.Lease
}

// admit is the one admission step of an attempt at m, for a new client's
// pass as for a resume: a health permit (not in cooldown, no trial in
// flight), a slot, and the cluster-wide slot under shared state. A parked
// session's kept slot and lease (kept, not nil) stand for the last two.
// On refusal the skip is recorded, what was taken is given back, and ok
// is false; the caller's own checks (drained, full, left to waiters)
// come before.
func (c *connect) admit(ps *passState, m *member, kept *holds) (a admission, ok bool) {
	st := m.state
	if a.permit, ok = st.Health.Acquire(); !ok {
		c.skip(m, upstreams.WordCooldown)
		return admission{}, false
	}
	if kept != nil {
		a.lease, kept.lease = kept.lease, nil
		return a, true
	}
	if !st.TryReserve() {
		c.h.settle(st, a.permit, cooldown.Neutral, 0)
		st.SkippedFull()
		c.skip(m, upstreams.WordFull)
		return admission{}, false
	}
	// The cluster-wide slot, with shared state (claimShared records its
	// own skip).
	if a.lease, ok = c.claimShared(ps, m); !ok {
		c.h.settle(st, a.permit, cooldown.Neutral, 0)
		st.UnreserveFailed()
		return admission{}, false
	}
	return a, true
}

// attemptInTurn attempts the candidates one after the other.
func (c *connect) attemptInTurn(ctx context.Context, ps *passState) passEnd {
	var failed *member // the attempt before, when it failed
	for {
		m, permit, lease := c.pick(ps)
		if m == nil {
			return passNothing
		}
		if failed != nil {
			c.h.reg.Metrics().Failover(failed.up.Name)
		}
		res := m.up.Connect(ctx, c.hs, c.replace)
		c.record(m, res.Outcome)
		switch c.h.conclude(ps, m, permit, res, false) {
		case verdictSuccess:
			c.lease = lease
			return c.establish(m, res.Conn)
		case verdictRelay:
			releaseLease(lease)
			c.finish(c.relayed(res))
			return passAnswered
		case verdictGone:
			releaseLease(lease)
			return passClientGone
		}
		releaseLease(lease)
		if ctx.Err() != nil && c.r.Context().Err() != nil {
			return passClientGone
		}
		failed = m
	}
}

// defaultHedgeMax is hedge_max when not set.
const defaultHedgeMax = 2

// flight is one attempt running beside others.
type flight struct {
	m      *member
	permit cooldown.Permit
	lease  *cluster.Lease
	cancel context.CancelFunc
	start  time.Time
	hedge  bool // started beside another attempt
}

// landing is a flight's result.
type landing struct {
	f   *flight
	res upstreams.Result
}

// attemptHedged attempts the candidates with hedging: when the newest
// attempt has not answered within hedge_after, the next candidate starts
// beside it, up to hedge_max in flight. The first 101 wins; the others are
// abandoned.
func (c *connect) attemptHedged(ctx context.Context, ps *passState) passEnd {
	h := c.h
	most := h.HedgeMax
	if most == 0 {
		most = defaultHedgeMax
	}
	// Each flight sends exactly once and at most most are in flight.
	results := make(chan landing, most)
	live := make(map[*flight]struct{}, most)
	timer := time.NewTimer(time.Duration(h.HedgeAfter))
	defer timer.Stop()

	launch := func(hedge bool) bool {
		m, permit, lease := c.pick(ps)
		if m == nil {
			return false
		}
		actx, cancel := context.WithCancel(ctx)
		f := &flight{m: m, permit: permit, lease: lease, cancel: cancel, start: time.Now(), hedge: hedge}
		live[f] = struct{}{}
		if hedge {
			c.hedgesStarted++
			c.h.reg.Metrics().HedgeStarted(m.up.Name)
		}
		go func() { results <- landing{f: f, res: f.m.up.Connect(actx, c.hs, c.replace)} }()
		// hedge_after counts from the newest attempt.
		timer.Reset(time.Duration(h.HedgeAfter))
		return true
	}

	if !launch(false) {
		return passNothing
	}
	for len(live) > 0 {
		var due <-chan time.Time
		if len(live) < most && ps.next < len(ps.order) {
			due = timer.C
		}
		select {
		case <-due:
			launch(true)
		case l := <-results:
			delete(live, l.f)
			l.f.cancel()
			c.record(l.f.m, l.res.Outcome)
			switch c.h.conclude(ps, l.f.m, l.f.permit, l.res, false) {
			case verdictSuccess:
				if l.f.hedge {
					c.h.reg.Metrics().HedgeWon(l.f.m.up.Name)
				}
				c.abandon(live, results)
				c.lease = l.f.lease
				return c.establish(l.f.m, l.res.Conn)
			case verdictRelay:
				releaseLease(l.f.lease)
				c.abandon(live, results)
				c.finish(c.relayed(l.res))
				return passAnswered
			case verdictGone:
				releaseLease(l.f.lease)
				c.abandon(live, results)
				return passClientGone
			}
			releaseLease(l.f.lease)
			// Failed on its own: with nothing else in flight the next
			// candidate starts at once, as without hedging.
			if len(live) == 0 && !(ctx.Err() != nil && c.r.Context().Err() != nil) && launch(false) {
				c.h.reg.Metrics().Failover(l.f.m.up.Name)
			}
		}
	}
	if ctx.Err() != nil && c.r.Context().Err() != nil {
		return passClientGone
	}
	return passNothing
}

// abandon cancels the attempts still in flight, lists them as hedge_lost,
// and settles each in the background as it returns, through the same
// conclude as every attempt: a cancelled one counts neither as success nor
// as failure, one that answered 101 anyway gets close 1000 "hedge lost",
// one that failed on its own counts as usual. Every slot is given back.
func (c *connect) abandon(live map[*flight]struct{}, results <-chan landing) {
	if len(live) == 0 {
		return
	}
	for f := range live {
		f.cancel()
		c.add(attempt{Provider: f.m.up.Name, Outcome: upstreams.WordHedgeLost, MS: roundMS(time.Since(f.start))})
		c.tries++
		c.hedgesWasted++
		c.h.reg.Metrics().HedgeWasted(f.m.up.Name)
	}
	n := len(live)
	h := c.h
	go func() {
		for range n {
			l := <-results
			releaseLease(l.f.lease)
			h.conclude(nil, l.f.m, l.f.permit, l.res, true)
		}
	}()
}

// verdict is what an attempt's outcome means for the pass.
type verdict int

const (
	verdictNext    verdict = iota // go on with the next candidate
	verdictSuccess                // a session is to be established
	verdictRelay                  // the provider's answer goes to the client
	verdictGone                   // the client went away
)

// 5. Settle: conclude classifies one attempt's outcome and settles it: the
// provider's health, its slot and its last error, the same way for serial
// and hedged attempts. lost marks a hedge loser, whose 101 (if any) nobody will use:
// it is closed and counts as neither success nor failure. ps, when not nil,
// learns what the outcome means for the rest of the pass.
func (h *Handler) conclude(ps *passState, m *member, permit cooldown.Permit, res upstreams.Result, lost bool) verdict {
	st := m.state
	o := res.Outcome
	if lost {
		h.reg.Metrics().Attempt(m.up.Name, o)
	}
	if o.Kind == upstreams.Failure || o.Kind == upstreams.Capacity || o.Kind == upstreams.Incompatible {
		st.SetLastError(o.Word)
	}
	switch o.Kind {
	case upstreams.Success:
		if lost {
			h.settle(st, permit, cooldown.Neutral, 0)
			st.Unreserve()
			res.Conn.CloseLost()
			return verdictNext
		}
		h.settle(st, permit, cooldown.Success, 0)
		st.ObserveHandshake(o.Elapsed)
		return verdictSuccess
	case upstreams.Failure:
		if ps != nil && o.Word == upstreams.WordTimeout && !ps.deadline.IsZero() &&
			!time.Now().Before(ps.deadline) && o.Elapsed < m.up.ConnectTimeout {
			// try_duration ran out, not the provider's own
			// connect_timeout: not the provider's failure.
			h.settle(st, permit, cooldown.Neutral, 0)
			ps.retry = true
		} else if h.settle(st, permit, cooldown.Failure, 0) == cooldown.NoChange && ps != nil {
			ps.retry = true
		}
		st.UnreserveFailed()
	case upstreams.Capacity:
		h.settle(st, permit, cooldown.Capacity, o.RetryAfter)
		st.UnreserveFailed()
	case upstreams.Incompatible:
		h.settle(st, permit, cooldown.Neutral, 0)
		st.UnreserveFailed()
		if ps != nil {
			ps.incompatible++
		}
	case upstreams.Relay:
		h.settle(st, permit, cooldown.Neutral, 0)
		st.Unreserve()
		if !lost {
			return verdictRelay
		}
	default: // the client went away, or a hedge loser was cancelled
		h.settle(st, permit, cooldown.Neutral, 0)
		st.Unreserve()
		if !lost {
			return verdictGone
		}
	}
	return verdictNext
}

// settle records an attempt's result in st's health and reacts to what
// changed: logs, events, shared state and offers to the queue.
func (h *Handler) settle(st *pool.Provider, p cooldown.Permit, r cooldown.Result, retryAfter time.Duration) cooldown.Change {
	change := st.Health.Done(p, r, retryAfter)
	h.healthChanged(st, change, p.Trial() && r == cooldown.Neutral, "")
	return change
}

// healthChanged reacts to a change of st's health, whether a client's
// attempt or a probe (by names it then) caused it: logs, events, shared
// state, offers to the queue, and the probe that will be the trial.
// undecided: a trial ended without a verdict.
func (h *Handler) healthChanged(st *pool.Provider, change cooldown.Change, undecided bool, by string) {
	switch change {
	case cooldown.CooledDown, cooldown.Skipped:
		until := st.Health.Until()
		st.WakeAt(until)
		st.ProbeBy(until)
		h.publishHold(st, change)
		fields := []zap.Field{
			zap.String("provider", st.Name()),
			zap.Time("until", until),
			zap.String("reason", st.LastError()),
		}
		if by != "" {
			fields = append(fields, zap.String("by", by))
		}
		h.logger.Info("provider cooling down", fields...)
		h.obs.Cooldown(st.Name(), until, st.LastError())
	case cooldown.Recovered:
		fields := []zap.Field{zap.String("provider", st.Name())}
		if by != "" {
			fields = append(fields, zap.String("by", by))
		}
		h.logger.Info("provider recovered", fields...)
		// Waiters that skipped it while its trial was in flight can use it.
		st.Notify()
		h.obs.Recovered(st.Name())
	case cooldown.NoChange:
		if undecided {
			// A trial that ended without a verdict (428, a relayed 4xx,
			// try_duration, a cancelled hedge): the next waiter may try.
			st.Notify()
		}
	}
}

// record notes an attempt's outcome in the client's list, the metrics and
// the debug log.
func (c *connect) record(m *member, o upstreams.Outcome) {
	c.add(attempt{Provider: m.up.Name, Outcome: o.Word, MS: roundMS(o.Elapsed)})
	c.tries++
	c.h.reg.Metrics().Attempt(m.up.Name, o)
	if ce := c.h.logger.Check(zap.DebugLevel, "attempt"); ce != nil {
		fields := []zap.Field{
			zap.String("provider", m.up.Name),
			zap.String("outcome", o.Word),
			zap.Float64("ms", roundMS(o.Elapsed)),
		}
		if o.Err != nil {
			fields = append(fields, zap.String("cause", o.Err.Error()))
		}
		ce.Write(fields...)
	}
}

// add keeps the latest maxLoggedAttempts attempts.
func (c *connect) add(a attempt) {
	if len(c.attempts) >= maxLoggedAttempts {
		copy(c.attempts, c.attempts[1:])
		c.attempts = c.attempts[:len(c.attempts)-1]
	}
	c.attempts = append(c.attempts, a)
}

// skip records a provider passed over without an attempt.
func (c *connect) skip(m *member, word string) {
	c.add(attempt{Provider: m.up.Name, Outcome: word})
}

// 6. Establish: the client is handed over to the provider's connection
// (handOver), and its session relayed. It is told of its session — the
// provider's 101, naming the session — only once the session counts as
// live, so a client never holds a session that status and max_concurrent
// do not see yet.
func (c *connect) establish(m *member, up *upstreams.Conn) passEnd {
	if caddy.Exiting() {
		// An attempt that was in flight when the process began to exit:
		// its provider session is ended and released, the client gets
		// 503 rather than a session that shutdown would end at once.
		go up.CloseWith(upstreams.CloseGoingAway, upstreams.EndShutdown)
		m.state.Unreserve()
		c.finish(c.shuttingDown())
		return passAnswered
	}
	fields := c.answerHeaders()
	for _, k := range []string{"Sec-Websocket-Protocol", "Sec-Websocket-Extensions"} {
		for _, v := range up.Answer.Header.Values(k) {
			fields = append(fields, upstreams.HeaderField{Name: k, Value: v})
		}
	}
	ho, err := c.handOver(up.Answer.RawWithHeaders(c.answerHeaders()...), fields)
	if err != nil {
		up.Close()
		m.state.Unreserve()
		c.h.logger.Error("cannot take over the client connection", zap.Error(err))
		return passClientGone
	}
	s := c.relay(m, ho.conn, up, ho.pending, ho.greet)
	ho.await(s, c.leftHeld)
	return passEstablished
}

// handOff is a client connection taken over for a session.
type handOff struct {
	conn netConn
	// pending are the bytes the client pipelined behind its handshake.
	pending []byte
	// greet tells the client its upgrade succeeded.
	greet func() error
	// stream: an HTTP/2 or HTTP/3 stream, which lives only as long as
	// its request.
	stream bool
}

// handOver takes over the client's connection, for a new session as for a
// resumed one: an HTTP/1.1 client is hijacked from the server itself
// (hijack; the bytes it pipelined behind its handshake kept), and its
// greeting is the raw 101 answer; an HTTP/2 or HTTP/3 client (extended
// CONNECT) gets a stream, and its greeting is a 200 with fields. The resume token handed out in fields is
// taken out of the header map once sent: Caddy's access log reads it
// again, and must not show it.
func (c *connect) handOver(answer []byte, fields []upstreams.HeaderField) (handOff, error) {
	if c.hs.ExtendedConnect {
		hd := c.w.Header()
		for _, f := range fields {
			hd.Add(f.Name, f.Value)
		}
		rc := http.NewResponseController(c.w)
		return handOff{conn: newStreamConn(c.r, c.w, rc), stream: true, greet: func() error {
			c.w.WriteHeader(http.StatusOK)
			err := rc.Flush()
			hd.Del(ResumeTokenHeader)
			return err
		}}, nil
	}
	conn, brw, err := hijack(c.w)
	if err != nil {
		return handOff{}, err
	}
	conn.SetDeadline(time.Time{})
	var pending []byte
	if n := brw.Reader.Buffered(); n > 0 {
		pending = make([]byte, n)
		brw.Read(pending)
	}
	return handOff{conn: conn, pending: pending, greet: func() error {
		_, err := conn.Write(answer)
		return err
	}}, nil
}

// await returns, for a stream, only once the relay is done with the
// ResponseWriter: the session has ended, or its client has been let go
// (left, closed when a held session's client leaves; nil otherwise). A
// hijacked connection needs no wait.
func (ho handOff) await(s *upstreams.Session, left <-chan struct{}) {
	if !ho.stream {
		return
	}
	select {
	case <-s.Done():
	case <-left:
	}
}

// answerHeaders are the gateway's own fields on the client's 101 (or
// 200): the session ID, and a resume token the gateway made for it.
func (c *connect) answerHeaders() []upstreams.HeaderField {
	if c.handOut {
		return []upstreams.HeaderField{{Name: SessionHeader, Value: c.id}, {Name: ResumeTokenHeader, Value: c.token}}
	}
	return []upstreams.HeaderField{{Name: SessionHeader, Value: c.id}}
}

// 7. Relay: relay registers the session with its provider and in the
// session registry, hands it what the client held (its quota share, its
// cluster-wide slot), sets the placeholders of what the chain learnt,
// answers the client (greet) and runs the relay. A greeting that fails
// ends the session at once (its slot freed), never resumable.
func (c *connect) relay(m *member, client netConn, up *upstreams.Conn, pending []byte, greet func() error) *upstreams.Session {
	st := m.state
	c.served(m)
	end := &sessionEnd{
		metrics:   c.h.reg.Metrics(),
		logger:    c.h.logger,
		id:        c.id,
		provider:  m.up.Name,
		attempts:  c.attempts,
		waited:    c.waited,
		hedges:    c.hedgesStarted,
		wasted:    c.hedgesWasted,
		keepalive: c.h.Keepalive > 0,
	}
	hd := &holds{reg: c.h.reg, st: st, quota: c.quota, lease: c.lease}
	c.quota, c.lease = nil, nil
	if hd.lease != nil && c.h.shared != nil {
		hd.store = c.h.shared.s
		hd.store.Retain()
	}
	var idle, maxDur time.Duration
	if s := c.h.Session; s != nil {
		idle, maxDur = time.Duration(s.IdleTimeout), time.Duration(s.MaxDuration)
	}
	// A session its client ends may be taken back (resume.go).
	pk := c.newParking(m, up)
	opts := upstreams.SessionOptions{
		ClientPending: pending,
		IdleTimeout:   idle,
		MaxDuration:   maxDur,
		Keepalive:     time.Duration(c.h.Keepalive),
	}
	if pk != nil && pk.hold && !pk.compressed() {
		opts.Hold, opts.OnPark = true, pk.onPark
		c.leftHeld = pk.joined
	}
	opts.OnEnd = func(s *upstreams.Session) {
		if pk != nil {
			// A held session may end while parked; its ID may
			// have changed with resumes.
			pk.left()
			end.id = pk.currentID()
			c.h.reg.Unpark(end.id)
		}
		// The provider session created for it (session_api) is
		// released in the background, and what the session holds
		// given back, unless the session is parked with them: then
		// at the end of its window, or by its resume.
		if !pk.ended(s, hd) {
			up.Release()
			hd.end(s)
		}
		end.log(s)
	}
	s := upstreams.NewSession(client, up, opts)
	info := pool.SessionInfo{ID: c.id, Protocol: string(c.cls.proto), RemoteIP: remoteIP(c.r), Attempts: c.tries}
	if hd.quota != nil {
		info.Client = c.h.reg.Shown(*hd.quota)
	}
	if pk != nil {
		info.ResumeToken = pk.token
	}
	st.Establish(s, info)
	c.learnt(m.up.Name)
	if greet != nil {
		if err := greet(); err != nil {
			s.Close(upstreams.CloseGoingAway, upstreams.EndClientError)
		}
	}
	s.Run()
	return s
}

// holds are what a live session counts against: its provider's slot, its
// client_limit share and its cluster-wide slot (with the shared store it
// keeps open). A session gives them back when it ends; a parked one that
// keeps them (resume.go), when its window ends or its resume takes them.
type holds struct {
	reg   *pool.Registry
	st    *pool.Provider
	quota *pool.QuotaKey
	lease *cluster.Lease
	store *cluster.Shared
}

// end gives them back as the live session s ends.
func (hd *holds) end(s *upstreams.Session) {
	hd.st.End(s)
	hd.release()
}

// free gives back a parked session's: the slot it kept without a live
// session, and the rest.
func (hd *holds) free() {
	hd.st.Unreserve()
	hd.release()
}

// release gives back all but the slot.
func (hd *holds) release() {
	if hd.quota != nil {
		hd.reg.ReleaseQuota(*hd.quota)
		hd.quota = nil
	}
	if hd.lease != nil {
		hd.lease.Release()
		hd.lease = nil
	}
	if hd.store != nil {
		hd.store.Release()
		hd.store = nil
	}
}

// served takes a client that got its session out of the queue, before the
// client hears of it, and passes on what it leaves: every provider it could
// use that still has room is offered to the next waiter.
func (c *connect) served(m *member) {
	c.h.reg.Waiting.Forget(c.mark) // it never joins now; a stream's pass lasts as long as its session
	c.finished = true
	if c.waiter != nil {
		c.waiter.Leave()
		c.waited = time.Since(c.joined)
		for _, i := range c.pool.members {
			if st := c.h.members[i].state; st.HasRoom() {
				st.Notify()
			}
		}
	}
	c.observeWait()
}

// releaseHolds gives back what a client that got no session still holds.
func (c *connect) releaseHolds() {
	if c.quota != nil {
		c.h.reg.ReleaseQuota(*c.quota)
		c.quota = nil
	}
	releaseLease(c.lease)
	c.lease = nil
}

// poolOf is the part of a handler that can serve one class of client
// (its protocol and Playwright version): its members in config order,
// their names in the queue, and the strategy that rotates among them, so
// each pool of a mixed handler keeps its own rotation. The slices are
// shared and never changed.
type poolOf struct {
	members   []int
	resources []string
	strategy  upstreams.Strategy
}

// poolFor returns the pool of clients of class cl, made once per handler
// and class.
func (h *Handler) poolFor(cl *class) *poolOf {
	key := ""
	if h.routed {
		key = string(cl.proto) + " " + cl.pwVersion
	}
	if p, ok := h.pools.Load(key); ok {
		return p.(*poolOf)
	}
	p := &poolOf{}
	for i, m := range h.members {
		if !h.routed || upstreams.Serves(m.proto, m.pwVersion, cl.proto, cl.pwVersion) {
			p.members = append(p.members, i)
		}
	}
	p.resources = h.resources(p.members)
	p.strategy, _ = upstreams.NewStrategy(h.Strategy)
	actual, _ := h.pools.LoadOrStore(key, p)
	return actual.(*poolOf)
}

// resources names members in the queue.
func (h *Handler) resources(members []int) []string {
	out := make([]string, len(members))
	for j, i := range members {
		out[j] = h.members[i].state.Resource()
	}
	return out
}

// wants is the handler's queue.WantsFunc: what a waiter moved here by a
// reload waits for. One that waited for its client_limit share goes on
// waiting for it when this handler has the same limit; otherwise it is
// woken to go on.
func (h *Handler) wants(cls any, before []string) ([]string, bool) {
	cl, ok := cls.(*class)
	if !ok {
		return nil, false
	}
	if cl.quota != "" && slices.Contains(before, cl.quota) {
		if h.ClientLimit != nil && h.ClientLimit.Key == cl.quotaTemplate {
			return before, false
		}
		return h.poolFor(cl).resources, true
	}
	return h.poolFor(cl).resources, false
}

// quotaKey is the client's client_limit key.
func (h *Handler) quotaKey(replace func(string) string) pool.QuotaKey {
	k := pool.QuotaKey{Template: h.ClientLimit.Key}
	if replace != nil {
		k.Value = replace(h.ClientLimit.Key)
	}
	return k
}

// clientKind names what the client speaks, for messages.
func (c *connect) clientKind() string {
	return c.cls.kind()
}

func (cl *class) kind() string {
	if cl.proto != upstreams.ProtocolPlaywright {
		return "CDP"
	}
	if cl.pwVersion == "" {
		return "Playwright"
	}
	return "Playwright " + cl.pwVersion
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
