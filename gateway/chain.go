package gateway

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/queue"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// The failover chain: one client's way through the gateway, top to
// bottom, the same for every kind of client. What differs between a
// WebSocket upgrade, a WebDriver create and a warm-up is the client's
// front (connect.go), which the chain asks.
//
//  0. check      A request a web page sent (it carries Origin) goes on
//                only from an origin allowed_origins names: 403
//                otherwise; an exiting process serves no one; the
//                client's session options are read once (400 for a bad
//                one, or a profile it cannot have here).
//  1. join       Recognise the client: what it speaks (its front says),
//                its affinity key and its client_limit key; 502 when no
//                provider could ever serve it. Take its client_limit
//                share, waiting in the queue while its key is at the
//                limit.
//  2. order      The strategy orders the providers this client can use,
//                rotating per pool; its front may serve it before any
//                attempt (a warm session).
//  3. skip       Providers drained, full, over budget, in cooldown, left
//                to clients that wait longer, without a cluster-wide
//                slot, or at their create_rate are passed over without
//                an attempt (admit, steps.go: one ticket per attempt).
//  4. attempt    One candidate after the other, or hedged: the next one
//                starts beside a slow one. Each attempt is the front's.
//  5. settle     Each attempt's outcome goes to its provider's health the
//                same way on both paths, and says whether the pass goes on
//                (conclude, steps.go).
//  6. establish  The front makes the session live and tells the client.
//
// A pass (steps 2–6) that finds nothing puts the client in the queue for a
// provider it can use, and each offer it is woken by runs a pass again.
// Every client that gets no session ends with one refusal, through finish
// (refusal.go), which its front renders.

// newConnect starts one client's way through front f: its session ID,
// set as a placeholder at once, and its ticket. r is nil for a warm-up.
func (h *Gateway) newConnect(w http.ResponseWriter, r *http.Request, f front) *connect {
	c := &connect{h: h, front: f, w: w, r: r, ctx: context.Background(), start: time.Now(), id: newSessionID(), ticket: h.reg.NewTicket()}
	if r == nil {
		return c
	}
	c.ctx = r.Context()
	if repl := replacerOf(r); repl != nil {
		c.repl = repl
		c.replace = func(s string) string { return repl.ReplaceKnown(s, "") }
		repl.Set(PlaceholderSessionID, c.id)
	}
	return c
}

// 0. Check: a web page may drive the browsers only from an origin the
// operator allowed; an exiting process serves no one; the client's
// session options are read. It reports false when the client got its
// answer.
func (c *connect) check() bool {
	if !c.h.origins.Allows(c.r.Header.Values("Origin")) {
		c.finish(refusedOrigin("request"))
		return false
	}
	if caddy.Exiting() {
		c.finish(c.shuttingDown())
		return false
	}
	opts, err := c.front.options(c)
	if err != nil {
		c.finish(badOptions(err))
		return false
	}
	c.opts = opts
	if rf := c.readProfile(); rf != nil {
		c.finish(rf)
		return false
	}
	return true
}

// run walks the chain from the join to a session or an answer.
func (c *connect) run() {
	h := c.h
	// 1. Join. The mark comes before the client's first look for room; a
	// client that never joins the queue gives it back.
	c.mark = h.reg.Waiting.Mark()
	defer h.reg.Waiting.Forget(c.mark)
	if !c.join() {
		return
	}
	ctx := c.ctx
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
		case !couldWait && c.last != nil:
			// Every provider left declined what the client asked for:
			// the last one's answer, as it is.
			c.finish(relayedFrom(c.last.provider, c.last.res))
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
	proto, version := c.front.protocol()
	c.cls = &class{proto: proto, pwVersion: version, affinity: h.affinityKey(c.r), opts: c.opts, accepts: c.front.accepts}
	c.pool = h.poolFor(c.cls)
	if len(c.pool.members) == 0 && !c.mayFind() {
		c.finish(c.unservable(h.noProviderServes(c.cls)))
		return false
	}
	if !slices.ContainsFunc(c.pool.members, func(i int) bool { return c.front.accepts(c.pool.all[i].up) }) && !c.mayFind() {
		c.finish(c.unservable(c.front.noneAccepts()))
		return false
	}
	if !c.anyHonours() || !c.profileServable() {
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
	err := c.waiter.Wait(c.ctx, retryAt)
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
	// A reload may have handed the client to the new config's handler,
	// and its handler may have found providers or lost some meanwhile.
	if h, ok := c.waiter.Line().Owner().(*Gateway); ok && h != c.h {
		c.h = h
	}
	c.pool = c.h.poolFor(c.cls)
	return true
}

// wakeAtCooldownEnds asks the queue to offer each provider the client can
// use at the end of its cooldown or skip. The queue keeps the earliest time
// per provider, so a cooldown that was extended since is asked for again.
func (c *connect) wakeAtCooldownEnds() {
	for _, i := range c.pool.members {
		st := c.pool.all[i].state
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
	ctx := c.ctx
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
	// The front may serve the client before any attempt (a session
	// opened ahead of demand).
	if end, ok := c.front.shortcut(c, ps.order); ok {
		return end, false, false
	}
	if h.TryDuration > 0 {
		ps.deadline = time.Now().Add(time.Duration(h.TryDuration))
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, ps.deadline)
		defer cancel()
	}
	// 4. Attempt.
	if h.HedgeAfter > 0 && c.front.hedged() {
		end = c.attemptHedged(ctx, ps)
	} else {
		end = c.attemptInTurn(ctx, ps)
	}
	if end == passNothing && ps.refused != nil {
		c.finish(ps.refused)
		return passAnswered, false, false
	}
	if end == passNothing && ps.gone {
		return passClientGone, false, false
	}
	if end == passNothing && ps.clientOver != nil {
		// The client key's budget is spent, with what its other
		// connects hold.
		over := ps.clientOver
		c.finish(c.clientBudgetRefusal(over.Book, over.Book.Read().WindowEnd, over.Held))
		return passAnswered, false, false
	}
	c.allIncompatible = ps.serveable > 0 && ps.serveable == ps.incompatible
	c.noteDeclined(ps)
	// A provider its handler may still find is one it may wait for.
	couldWait = ps.serveable > ps.incompatible+ps.stateDown+ps.overBudget+len(ps.declined) || c.mayFind()
	return end, couldWait, ps.retry
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
			names[j] = c.pool.all[i].up.Name
		}
		for _, j := range upstreams.AffinityOrder(c.cls.affinity, names, nil) {
			order = append(order, c.pool.members[j])
		}
	} else {
		cands := make([]upstreams.Candidate, 0, len(c.pool.members))
		for _, i := range c.pool.members {
			m := c.pool.all[i]
			ms, has := m.state.Stats.HandshakeMS()
			cands = append(cands, upstreams.Candidate{
				Index: i, Priority: m.up.Priority, Weight: m.up.Weight,
				Active: m.state.Slots.Reserved(), LatencyMS: ms, HasLatency: has, Cost: m.expectedCost,
			})
		}
		order = c.pool.strategy.Order(cands, advance, make([]int, 0, len(cands)))
	}
	// Only providers its front accepts, and that did not decline it
	// already.
	order = slices.DeleteFunc(order, func(i int) bool {
		return !c.front.accepts(c.pool.all[i].up) || c.cls.declinedBy(c.pool.all[i].state)
	})
	if !h.routed || c.cls.proto != upstreams.ProtocolPlaywright {
		return c.byOptions(order)
	}
	exact := order[:0:0]
	var rest []int
	for _, i := range order {
		m := c.pool.all[i]
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
		m := c.pool.all[ps.order[ps.next]]
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
		res := c.front.attempt(ctx, c, m)
		c.record(m, res.Outcome)
		switch c.h.conclude(ps, m, t, res, false) {
		case verdictSuccess:
			c.won(t)
			return c.front.establish(c, m, res)
		case verdictRelay:
			c.finish(c.relayed(res))
			return passAnswered
		case verdictGone:
			return passClientGone
		}
		if ctx.Err() != nil && c.ctx.Err() != nil {
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
		go func() { results <- landing{f: f, res: c.front.attempt(actx, c, f.m)} }()
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
				return c.front.establish(c, l.f.m, l.res)
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
			if len(live) == 0 && !(ctx.Err() != nil && c.ctx.Err() != nil) && launch(false) {
				c.h.reg.Metrics().Failover(l.f.m.up.Name)
			}
		}
	}
	if ctx.Err() != nil && c.ctx.Err() != nil {
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

// Declines. A provider may decline what the client asked for (a WebDriver
// "session not created" other than full: its word on those capabilities,
// not a failure). The client's way goes on without it: its later passes
// do not ask it again, and it does not wait in the queue for it (nor hold
// back a newcomer who could use it). The client waits only while some
// provider that has not declined could serve it later (busy: full, in
// cooldown, at its create_rate, left to earlier waiters); when none is
// left, it gets the last decline as the provider sent it. A client that
// waits until its queue timeout gets the timeout's answer.

// noteDeclined takes in the providers that declined the client in pass
// ps: its class names them (declinedBy), so its later passes leave them
// out and it waits in the queue for the others only (usable).
func (c *connect) noteDeclined(ps *passState) {
	if len(ps.declined) == 0 {
		return
	}
	c.last = &ps.declined[len(ps.declined)-1]
	// A new set, never a change to the one a reload may be reading.
	set := map[string]bool{}
	if old := c.cls.declined.Load(); old != nil {
		maps.Copy(set, *old)
	}
	for _, d := range ps.declined {
		set[d.resource] = true
	}
	c.cls.declined.Store(&set)
	if c.waiter != nil {
		c.waiter.Want(c.h.usable(c.cls))
	}
}

// declinedBy reports whether provider p declined the client already.
func (cl *class) declinedBy(p *pool.ProviderState) bool {
	d := cl.declined.Load()
	return d != nil && (*d)[p.Resource()]
}

// one is a way of one attempt at m, admitted on its own (not a pass: no
// order, no queue, no answer to anyone): a warm-up's. Its session is
// established by the front, like any; a refused or failed attempt ends
// here, settled.
func (c *connect) one(m *member) passEnd {
	t, ok := c.admit(&passState{}, m)
	if !ok {
		return passNothing
	}
	res := c.front.attempt(c.ctx, c, m)
	c.record(m, res.Outcome)
	if c.h.conclude(nil, m, t, res, false) != verdictSuccess {
		if res.Conn != nil {
			res.Conn.Close()
		}
		t.Release()
		return passNothing
	}
	c.won(t)
	return c.front.establish(c, m, res)
}
