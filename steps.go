package browserfailover

import (
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/spend"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// The steps a new connect and a resume both walk: admission (health
// permit, slot, cluster-wide slot), the settling of an attempt's outcome,
// establishing the session, the hand-over to the client (hijack or stream,
// 101 or 200) and the relay. The chain (chain.go) and resume (resume.go,
// resume_hold.go) call them; they call only what lies below them.

// admission is what an admitted attempt holds: its provider's health
// permit, its cluster-wide slot (nil without shared state) and its spend
// hold (nil without a price); its slot is reserved.
type admission struct {
	permit cooldown.Permit
	lease  *cluster.Lease
	spend  *spend.Hold
}

// won hands a successful attempt's lease and spend hold to the client,
// whose session takes them.
func (a admission) won(c *connect) {
	c.lease, c.hold = a.lease, a.spend
}

// lost gives back a failed attempt's lease and spend hold, off the
// caller's way; the room its hold took in st's budget may let a waiter in.
func (a admission) lost(st *pool.Provider) {
	releaseLease(a.lease)
	if a.spend != nil {
		a.spend.Drop()
		st.Notify()
	}
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
	if o.Kind == upstreams.Failure || o.Kind == upstreams.Capacity || o.Kind == upstreams.Incompatible || o.Kind == upstreams.Gateway {
		st.SetLastError(o.Word)
	}
	switch o.Kind {
	case upstreams.Success:
		if lost {
			h.settle(st, permit, cooldown.Neutral, 0)
			st.Unreserve()
			res.Conn.CloseLost()
			// Its provider created a session for it all the same.
			h.chargeLoser(m)
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
		if h.learnCap(m, o) {
			// The provider holds what it can: its cap is learnt, and
			// it is not skipped for that (clients beyond the cap wait
			// for a slot).
			h.settle(st, permit, cooldown.Neutral, 0)
			st.UnreserveFailed()
			break
		}
		h.settle(st, permit, cooldown.Capacity, o.RetryAfter)
		st.UnreserveFailed()
	case upstreams.Incompatible:
		h.settle(st, permit, cooldown.Neutral, 0)
		st.UnreserveFailed()
		if ps != nil {
			ps.incompatible++
		}
	case upstreams.Gateway:
		// The gateway's own trouble (its ledger): not the provider's;
		// a waiter tries again.
		h.settle(st, permit, cooldown.Neutral, 0)
		st.UnreserveFailed()
		if ps != nil {
			ps.retry = true
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

// learnCap learns the cap of a provider whose max_concurrent is auto from
// its 429 without Retry-After: the live sessions it holds (over every node
// under shared state). It reports false when there is nothing to learn
// (another answer, a Retry-After, no session live): the provider is then
// skipped as for any capacity answer.
func (h *Handler) learnCap(m *member, o upstreams.Outcome) bool {
	st := m.state
	if st.LearntCap() == nil || o.RetryAfter > 0 || o.Word != upstreams.StatusWord(http.StatusTooManyRequests) {
		return false
	}
	if h.shared != nil && h.shared.s.Usable() {
		if n, ok := h.learnSharedCap(st); ok {
			return n > 0
		}
	}
	return st.Refused(st.Active())
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
	hd := &holds{reg: c.h.reg, st: st, quota: c.quota, lease: c.lease, meter: c.startMeter(st)}
	c.quota, c.lease = nil, nil
	if c.h.shared != nil && (hd.lease != nil || hd.meter.Cost() != nil) {
		// Kept open for the lease's release and the cost's write.
		hd.store = c.h.shared.s
		hd.store.Retain()
	}
	var idle, maxDur time.Duration
	if s := c.h.Session; s != nil {
		idle, maxDur = time.Duration(s.IdleTimeout), time.Duration(s.MaxDuration)
	}
	// A session its client ends may be taken back (resume.go).
	pk := c.newParking(m, up)
	if pk != nil {
		pk.meter = hd.meter
	}
	// The provider's 101 is relayed (a parking keeps what it needs of
	// it): a live session does not carry its header block.
	up.Answer = nil
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
	if c.cls.proto == upstreams.ProtocolBiDi {
		// Firefox keeps a BiDi session its client dropped until
		// session.end: the gateway ends it when the client leaves.
		opts.Farewell = upstreams.BiDiFarewell()
	}
	// The closure outlives the request: it must not hold c, whose
	// request and writer keep the server's buffers of the connection.
	reg := c.h.reg
	remote := up.Remote // nor up: the session relays its connection
	opts.OnEnd = func(s *upstreams.Session) {
		if pk != nil {
			// A held session may end while parked; its ID may
			// have changed with resumes.
			pk.left()
			end.id = pk.currentID()
			reg.Unpark(end.id)
		}
		// The provider session created for it (session_api) is
		// released in the background, and what the session holds
		// given back, unless the session is parked with them: then
		// at the end of its window, or by its resume.
		meter := hd.meter
		if !pk.ended(s, hd) {
			remote.Release()
			hd.end(s)
		}
		end.log(s, meter.Accrued())
	}
	s := upstreams.NewSession(client, up, opts)
	info := pool.SessionInfo{ID: c.id, Protocol: string(c.cls.proto), RemoteIP: remoteIP(c.r), Attempts: c.tries, Meter: hd.meter}
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
