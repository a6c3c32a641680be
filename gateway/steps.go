package gateway

import (
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/spend"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// The steps every way through the gateway walks, whatever its front, and
// a resume too: admission (the one step that decides whether an attempt
// may be made at a provider, and makes its ticket), the settling of an
// attempt's outcome, and taking a served client out of the queue. The
// chain (chain.go) and resume (resume.go, resume_hold.go) call them; they
// call only what lies below them.

// WordQueued is the skip word of a provider left to clients that have been
// waiting for it longer: a newcomer never takes it from them.
const WordQueued = "queued"

// 3. Admit: the one admission step of an attempt at m, for a new client's
// pass as for a resume. In order: not drained; not left to clients that
// have waited longer (a newcomer's pass); not full (its slots, a learnt
// cap, its last capacity probe); its budget not spent; the pass's own
// bounds (max_attempts, try_duration); the client's browser profile, at
// its first admission (waiting for it while another session uses it);
// the client's client_limit share (a
// resume's: a new client took it as it joined); what the session will cost
// held in its budgets (a new client's: a resume's session was admitted
// before); a health permit (not in cooldown, no trial in flight); a slot;
// the cluster-wide slot under shared state; and a start of its
// create_rate window (create_rate.go), taken last so that only an attempt
// that is made counts, and kept in the ticket: an attempt the provider
// refuses with a 4xx gives it back (conclude). A resume of a parked
// session that kept its provider session (the client's ticket holds its
// slot, share, lease and meter) takes none of those again, and starts
// nothing: its ticket is the attempt's. Each refusal records its skip
// word and gives back what was taken; ok is false, and ps says why when
// the pass ends here.
func (c *connect) admit(ps *passState, m *member) (t *pool.Ticket, ok bool) {
	st := m.state
	kept := c.ticket.Provider() == st
	resume := c.resuming
	if st.Draining() {
		c.skip(m, upstreams.WordDrained)
		return nil, false
	}
	ps.serveable++
	if !resume && c.waiter == nil && c.h.reg.Waiting.Contended(st.Resource()) {
		// No barging: clients waiting for it go first.
		c.skip(m, WordQueued)
		return nil, false
	}
	if !kept && st.Slots.Full() {
		st.Slots.SkippedFull()
		c.skip(m, upstreams.WordFull)
		return nil, false
	}
	if over, _ := st.Spend.OverBudget(); over && !resume {
		// Its window's budget is spent: nothing until it turns.
		ps.overBudget++
		c.skip(m, upstreams.WordBudget)
		return nil, false
	}
	if !ps.mayAttempt() {
		return nil, false
	}
	// The client's browser profile, at its first admission: one session
	// a profile (profiles.go).
	if rf, ok := c.holdProfile(); !ok {
		ps.refused, ps.gone = rf, rf == nil
		ps.next = len(ps.order)
		return nil, false
	}
	if cl := c.h.ClientLimit; cl != nil && resume && !c.ticket.TakeShare(c.h.quotaKey(c.replace), cl.Limit) {
		ps.quotaOver = true
		return nil, false
	}
	// What the session will cost is held in its budgets from here, so
	// clients admitted together cannot overshoot them.
	var hold *spend.Hold
	if !resume {
		var over *spend.Over
		if hold, over = c.reserveSpend(st); over != nil {
			if over.Book == c.ticket.ClientBook() {
				// The client key's own budget: 429, never the queue.
				ps.clientOver = over
				ps.next = len(ps.order)
				return nil, false
			}
			if over.Held {
				// No offer comes when they fail: waiters retry each
				// second.
				ps.retry = true
			} else {
				ps.overBudget++
			}
			// Reached only with what connects in flight hold: a waiter
			// is offered the provider when one of them fails.
			c.skip(m, upstreams.WordBudget)
			return nil, false
		}
	}
	permit, ok := st.Health.Acquire()
	if !ok {
		hold.Drop()
		c.skip(m, upstreams.WordCooldown)
		return nil, false
	}
	if kept {
		c.ticket.Resume(permit)
		return c.ticket, true
	}
	if t = st.Admit(permit); t == nil {
		hold.Drop()
		c.h.settle(st, permit, cooldown.Neutral, 0)
		st.Slots.SkippedFull()
		c.skip(m, upstreams.WordFull)
		return nil, false
	}
	// The cluster-wide slot, with shared state (claimShared records its
	// own skip).
	lease, ok := c.claimShared(ps, m)
	var store *cluster.Shared
	if sh := c.h.shared; sh != nil && (lease != nil || st.Spend.Pricing().Cost != nil) {
		// Kept open for the lease's release and the cost's write.
		store = sh.s
	}
	t.Keep(lease, store, hold)
	if !ok {
		c.h.settle(st, permit, cooldown.Neutral, 0)
		t.Failed()
		t.Release()
		return nil, false
	}
	// Last, so that only an attempt made from here takes a start.
	start, ok, retryAt := c.h.takeRate(c.ctx, m)
	if !ok {
		// Nothing was asked of the provider: no failure, and no offer
		// now (a trial permit goes back quietly, the slot as a failed
		// one's), since the window admits no one before retryAt, when
		// the queue offers the provider.
		st.Health.Done(permit, cooldown.Neutral, 0)
		t.Failed()
		t.Release()
		if retryAt.IsZero() {
			// The shared state cannot be asked (on_unavailable reject).
			c.skip(m, WordStateUnavailable)
			ps.stateDown++
			return nil, false
		}
		st.Starts.Refused(retryAt)
		c.skip(m, upstreams.WordRate)
		return nil, false
	}
	t.KeepStart(start)
	return t, true
}

// won hands the client to its attempt's ticket t, which took the
// session: t takes what the client's ticket held (its share, its book)
// and is the client's from now on.
func (c *connect) won(t *pool.Ticket) {
	if t == c.ticket {
		return
	}
	t.Join(c.ticket)
	c.ticket.Release() // empty now
	c.ticket = t
}

// mayAttempt reports whether the pass may make another attempt: within
// max_attempts and try_duration. When it may not, the pass ends here.
func (ps *passState) mayAttempt() bool {
	if ps.maxAttempts > 0 && ps.tried >= ps.maxAttempts {
		ps.next = len(ps.order)
		return false
	}
	if !ps.deadline.IsZero() && !time.Now().Before(ps.deadline) {
		ps.retry = true
		ps.next = len(ps.order)
		return false
	}
	return true
}

// 5. Settle: conclude classifies one attempt's outcome and settles it: the
// provider's health and its last error, the same way for serial and
// hedged attempts, and the attempt's ticket t: kept on success, released
// otherwise (a failure's slot goes back without waking the queue at once;
// the create_rate start of an attempt the provider refused with a 4xx
// goes back too, whatever its kind).
// lost marks a hedge loser, whose 101 (if any) nobody will use: it is
// closed and counts as neither success nor failure. ps, when not nil,
// learns what the outcome means for the rest of the pass.
func (h *Gateway) conclude(ps *passState, m *member, t *pool.Ticket, res upstreams.Result, lost bool) verdict {
	st := m.state
	o := res.Outcome
	permit := t.Permit()
	if lost {
		h.reg.Metrics().Attempt(m.up.Name, o)
	}
	if o.Refused != 0 || o.Kind == upstreams.Declined {
		// The provider refused it with a 4xx, or declined the
		// capabilities asked for: it started nothing, so its create_rate
		// start goes back, before the slot does (whose offer to the queue
		// may be taken at once).
		h.giveBackStart(m, t)
	}
	if o.Kind == upstreams.Failure || o.Kind == upstreams.Capacity || o.Kind == upstreams.Incompatible || o.Kind == upstreams.Gateway {
		st.Stats.SetLastError(o.Word)
	}
	v := verdictNext
	switch o.Kind {
	case upstreams.Success:
		if lost {
			h.settle(st, permit, cooldown.Neutral, 0)
			res.Conn.CloseLost()
			// Its provider created a session for it all the same.
			t.ChargeLost()
			break
		}
		h.settle(st, permit, cooldown.Success, 0)
		st.Stats.ObserveHandshake(o.Elapsed)
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
		t.Failed()
	case upstreams.Capacity:
		if h.learnCap(m, o) {
			// The provider holds what it can: its cap is learnt, and
			// it is not skipped for that (clients beyond the cap wait
			// for a slot).
			h.settle(st, permit, cooldown.Neutral, 0)
		} else {
			h.settle(st, permit, cooldown.Capacity, o.RetryAfter)
		}
		t.Failed()
	case upstreams.Incompatible:
		h.settle(st, permit, cooldown.Neutral, 0)
		t.Failed()
		if ps != nil {
			ps.incompatible++
		}
	case upstreams.Gateway:
		// The gateway's own trouble (its ledger): not the provider's;
		// a waiter tries again.
		h.settle(st, permit, cooldown.Neutral, 0)
		t.Failed()
		if ps != nil {
			ps.retry = true
		}
	case upstreams.Declined:
		// The provider's word on what the client asked for, not on its
		// health: nothing counted (a trial ends without a verdict, and
		// the next waiter may try), and the slot goes back as after a
		// relayed answer. The client's pass goes on without it.
		h.settle(st, permit, cooldown.Neutral, 0)
		if ps != nil {
			ps.declined = append(ps.declined, declined{provider: m.up.Name, resource: st.Resource(), res: res})
		}
	case upstreams.Relay:
		h.settle(st, permit, cooldown.Neutral, 0)
		if !lost {
			v = verdictRelay
		}
	default: // the client went away, or a hedge loser was cancelled
		h.settle(st, permit, cooldown.Neutral, 0)
		if !lost {
			v = verdictGone
		}
	}
	t.Release()
	return v
}

// learnCap learns the cap of a provider whose max_concurrent is auto from
// its 429 without Retry-After: the live sessions it holds (over every node
// under shared state). It reports false when there is nothing to learn
// (another answer, a Retry-After, no session live): the provider is then
// skipped as for any capacity answer.
func (h *Gateway) learnCap(m *member, o upstreams.Outcome) bool {
	st := m.state
	if st.Slots.LearntCap() == nil || o.RetryAfter > 0 || o.Word != upstreams.StatusWord(http.StatusTooManyRequests) {
		return false
	}
	if h.shared != nil && h.shared.s.Usable() {
		if n, ok := h.learnSharedCap(st); ok {
			return n > 0
		}
	}
	return st.Slots.Refused(st.Slots.Active())
}

// settle records an attempt's result in st's health and reacts to what
// changed: logs, events, shared state and offers to the queue.
func (h *Gateway) settle(st *pool.ProviderState, p cooldown.Permit, r cooldown.Result, retryAfter time.Duration) cooldown.Change {
	change := st.Health.Done(p, r, retryAfter)
	h.healthChanged(st, change, p.Trial() && r == cooldown.Neutral, "")
	return change
}

// healthChanged reacts to a change of st's health, whether a client's
// attempt or a probe (by names it then) caused it: logs, events, shared
// state, offers to the queue, and the probe that will be the trial.
// undecided: a trial ended without a verdict.
func (h *Gateway) healthChanged(st *pool.ProviderState, change cooldown.Change, undecided bool, by string) {
	switch change {
	case cooldown.CooledDown, cooldown.Skipped:
		until := st.Health.Until()
		st.WakeAt(until)
		st.Probes.NextBy(until)
		h.publishHold(st, change)
		fields := []zap.Field{
			zap.String("provider", st.Name()),
			zap.Time("until", until),
			zap.String("reason", st.Stats.LastError()),
		}
		if by != "" {
			fields = append(fields, zap.String("by", by))
		}
		h.logger.Info("provider cooling down", fields...)
		h.obs.Cooldown(st.Name(), until, st.Stats.LastError())
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
			if st := c.pool.all[i].state; st.HasRoom() {
				st.Notify()
			}
		}
	}
	c.observeWait()
}
