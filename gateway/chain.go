package gateway

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"

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
//                it speaks (CDP, WebDriver BiDi, or Playwright and its version), its
//                affinity key and its client_limit key. Take its
//                client_limit share, waiting in the queue while its key is
//                at the limit.
//  2. order      The strategy orders the providers this client can use,
//                rotating per pool.
//  3. skip       Providers drained, full, over budget, in cooldown, left to clients that
//                wait longer, without a cluster-wide slot, or at their
//                create_rate are passed over without an attempt.
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

// chain runs the whole chain for one upgrade.
func (h *Gateway) chain(w http.ResponseWriter, r *http.Request, hs *upstreams.Handshake) {
	c := h.newConnect(w, r, hs)
	// What the client still holds when its way ends (a session took it
	// otherwise).
	defer func() { c.ticket.Release() }()
	if !c.check() {
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
	c.run()
}

// newConnect starts one client's way: its session ID, set as a
// placeholder at once, and its ticket.
func (h *Gateway) newConnect(w http.ResponseWriter, r *http.Request, hs *upstreams.Handshake) *connect {
	c := &connect{h: h, w: w, r: r, hs: hs, start: time.Now(), id: newSessionID(), ticket: h.reg.NewTicket()}
	if repl := replacerOf(r); repl != nil {
		c.repl = repl
		c.replace = func(s string) string { return repl.ReplaceKnown(s, "") }
		repl.Set(PlaceholderSessionID, c.id)
	}
	return c
}

// 0. Check: a web page may drive the browsers only from an origin the
// operator allowed (origins.go); an exiting process serves no one. It
// reports false when the client got its answer.
func (c *connect) check() bool {
	if !c.h.origins.Allows(c.r.Header.Values("Origin")) {
		c.finish(c.refuseOrigin())
		return false
	}
	if caddy.Exiting() {
		c.finish(c.shuttingDown())
		return false
	}
	return c.readOptions()
}

// run walks the chain from the join to a session or an answer: a new
// upgrade's way, and a WebDriver create's (webdriver.go).
func (c *connect) run() {
	h, r := c.h, c.r
	// 1. Join. The mark comes before the client's first look for room; a
	// client that never joins the queue gives it back.
	c.mark = h.reg.Waiting.Mark()
	defer h.reg.Waiting.Forget(c.mark)
	if !c.join() {
		return
	}
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
		case !couldWait && c.wd != nil && c.wd.last != nil:
			// Every provider left said session not created: the last
			// one's answer, as it is.
			c.finish(c.relayedTo(c.wd.last.provider, c.wd.last.res))
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
	proto, version := upstreams.ClientProtocol(c.r.Header, c.r.URL.Path)
	if c.wd != nil {
		proto, version = upstreams.ProtocolWebDriver, ""
	}
	c.cls = &class{proto: proto, pwVersion: version, affinity: h.affinityKey(c.r), opts: c.opts}
	if c.wd != nil {
		c.cls.wd = c.wd.req
	}
	c.pool = h.poolFor(c.cls)
	if len(c.pool.members) == 0 {
		c.finish(c.unservable(h.noProviderServes(c.cls)))
		return false
	}
	if c.wd != nil && !c.anyAccepts() {
		c.finish(c.unservable(c.noProviderStarts()))
		return false
	}
	if !c.anyHonours() {
		return false
	}
	if !c.prepareResume() {
		return false
	}
	// A key over its client_budget gets 429 before it waits for
	// anything.
	if !c.joinClientBudget() {
		return false
	}
	if h.ClientLimit == nil {
		return true
	}
	k := h.quotaKey(c.replace)
	c.cls.quota, c.cls.quotaTemplate = k.Resource(), k.Template
	if !c.h.reg.Waiting.Contended(k.Resource()) && c.ticket.TakeShare(k, h.ClientLimit.Limit) {
		return true
	}
	// Over the limit, or others of its key wait: wait behind them.
	c.inQuota = true
	c.h.reg.Quotas.AddWaiting(k, 1)
	defer c.h.reg.Quotas.AddWaiting(k, -1)
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
			c.waiter.Want(c.h.usable(c.cls))
			return true
		}
		if c.ticket.TakeShare(k, cl.Limit) {
			c.inQuota = false
			// Its place in the queue is kept: now it waits for a provider.
			c.waiter.Want(c.h.usable(c.cls))
			if c.h.reg.Quotas.Active(k) < cl.Limit {
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
		if !c.enqueue(c.h.usable(c.cls)) {
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
	if h, ok := c.waiter.Line().Owner().(*Gateway); ok && h != c.h {
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
	ps := &passState{order: c.order(first && c.waiter == nil), maxAttempts: h.MaxAttempts}
	// A session opened ahead of demand goes at once (warm.go).
	if end, ok := c.tryWarm(ps.order); ok {
		return end, false, false
	}
	if h.TryDuration > 0 {
		ps.deadline = time.Now().Add(time.Duration(h.TryDuration))
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, ps.deadline)
		defer cancel()
	}
	// 4. Attempt.
	if h.HedgeAfter > 0 && c.wd == nil {
		end = c.attemptHedged(ctx, ps)
	} else {
		end = c.attemptInTurn(ctx, ps)
	}
	if end == passNothing && ps.clientOver != nil {
		// The client key's budget is spent, with what its other
		// connects hold.
		over := ps.clientOver
		c.finish(c.clientBudgetReply(over.Book, over.Book.Read().WindowEnd, over.Held))
		return passAnswered, false, false
	}
	c.allIncompatible = ps.serveable > 0 && ps.serveable == ps.incompatible
	c.noteDeclined(ps)
	return end, ps.serveable > ps.incompatible+ps.stateDown+ps.overBudget+len(ps.declined), ps.retry
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
			ms, has := m.state.Stats.HandshakeMS()
			cands = append(cands, upstreams.Candidate{
				Index: i, Priority: m.up.Priority, Weight: m.up.Weight,
				Active: m.state.Slots.Reserved(), LatencyMS: ms, HasLatency: has, Cost: m.expectedCost,
			})
		}
		order = c.pool.strategy.Order(cands, advance, make([]int, 0, len(cands)))
	}
	if c.wd != nil {
		// Only providers that can start the browser asked for, and that
		// did not decline it already (webdriver.go).
		order = slices.DeleteFunc(order, func(i int) bool { return !h.members[i].up.Accepts(c.wd.req) || c.cls.declinedBy(h.members[i].state) })
	}
	if !h.routed || c.cls.proto != upstreams.ProtocolPlaywright {
		return c.byOptions(order)
	}
	exact := order[:0:0]
	var rest []int
	for _, i := range order {
		m := h.members[i]
		if upstreams.Prefers(m.up.Protocol(), m.up.PlaywrightVersion(), c.cls.proto, c.cls.pwVersion) {
			exact = append(exact, i)
		} else {
			rest = append(rest, i)
		}
	}
	return c.byOptions(append(exact, rest...))
}

// 3. Skip: pick returns the next candidate to attempt, admitted with its
// ticket (admit), passing over those admission refuses; nil when the pass
// has no candidate left, or the client key's budget refused it
// (ps.clientOver).
func (c *connect) pick(ps *passState) (*member, *pool.Ticket) {
	for ps.next < len(ps.order) {
		if caddy.Exiting() {
			// No new attempt once the process is exiting.
			ps.next = len(ps.order)
			break
		}
		m := c.h.members[ps.order[ps.next]]
		ps.next++
		if t, ok := c.admit(ps, m); ok {
			ps.tried++
			return m, t
		}
	}
	return nil, nil
}

// attemptInTurn attempts the candidates one after the other.
func (c *connect) attemptInTurn(ctx context.Context, ps *passState) passEnd {
	var failed *member // the attempt before, when it failed
	for {
		m, t := c.pick(ps)
		if m == nil {
			return passNothing
		}
		if failed != nil {
			c.h.reg.Metrics().Failover(failed.up.Name)
		}
		res := c.attempt(ctx, m)
		c.record(m, res.Outcome)
		switch c.h.conclude(ps, m, t, res, false) {
		case verdictSuccess:
			c.won(t)
			if res.WebDriver != nil {
				return c.establishWebDriver(m, res.WebDriver)
			}
			return c.establish(m, res.Conn)
		case verdictRelay:
			c.finish(c.relayed(res))
			return passAnswered
		case verdictGone:
			return passClientGone
		}
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
	t      *pool.Ticket
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
		m, t := c.pick(ps)
		if m == nil {
			return false
		}
		actx, cancel := context.WithCancel(ctx)
		f := &flight{m: m, t: t, cancel: cancel, start: time.Now(), hedge: hedge}
		live[f] = struct{}{}
		if hedge {
			c.hedgesStarted++
			c.h.reg.Metrics().HedgeStarted(m.up.Name)
		}
		go func() { results <- landing{f: f, res: f.m.up.Connect(actx, c.hs, c.replaceAt(f.m))} }()
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
			switch c.h.conclude(ps, l.f.m, l.f.t, l.res, false) {
			case verdictSuccess:
				if l.f.hedge {
					c.h.reg.Metrics().HedgeWon(l.f.m.up.Name)
				}
				c.abandon(live, results)
				c.won(l.f.t)
				return c.establish(l.f.m, l.res.Conn)
			case verdictRelay:
				c.abandon(live, results)
				c.finish(c.relayed(l.res))
				return passAnswered
			case verdictGone:
				c.abandon(live, results)
				return passClientGone
			}
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
			h.conclude(nil, l.f.m, l.f.t, l.res, true)
		}
	}()
}
