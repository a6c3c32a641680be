package gateway

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/options"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/queue"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// A WebDriver session: a route (provider, provider session) that many
// HTTP commands and at most a few sockets use. It holds its client's
// ticket from the create answer to its end, whichever comes first: the
// client's DELETE, the provider's "invalid session id", idleness (no
// command and no socket open for the idle timeout), its time limit, an
// operator's end or shutdown. When the gateway ends it, the provider gets
// DELETE too (through the ticket's provider session, which the ledger
// covers until the provider confirms it); its sockets get close frames;
// its ticket is released once; later commands get "invalid session id".

// wdSession is one live WebDriver session; it is the session registry's
// pool.Live for it.
type wdSession struct {
	h *Gateway // the handler that created it (its logger, registry, shared state)
	// id is its operator's session ID (the sessions list, logs, the
	// Browser-Failover-Session header); its client names it by another,
	// its path ID, which the session does not keep.
	id       string
	provider string
	browser  string
	m        *member
	ps       *upstreams.WebDriverSession
	// opts are the session options its create stated: its sockets'
	// header_up renders them as its create's did.
	opts    options.Set
	t       *pool.Ticket
	started time.Time
	idleFor time.Duration
	maxAge  time.Duration
	log     *sessionEnd
	// shared: its route is in the shared state, under the key route
	// (pool.Hashes.RouteKey of its path ID) as rt says.
	shared bool
	route  string
	rt     cluster.Route

	commands  atomic.Int64
	last      atomic.Int64 // unix nanoseconds of the last command or socket activity
	lastCmd   atomic.Int64 // unix nanoseconds of the last command
	bytesUp   atomic.Int64
	bytesDown atomic.Int64

	mu      sync.Mutex
	over    bool
	reason  string
	sockets map[*upstreams.Session]struct{}
	timer   queue.Timer
	ageT    queue.Timer
	done    chan struct{}
}

// newWebDriverSession makes the session of a create that ps answered at
// m, which its client is to name by pathID: it takes the client's ticket,
// and is listed, bound to the handler and the client's key.
func (c *connect) newWebDriverSession(m *member, ps *upstreams.WebDriverSession, pathID string) *wdSession {
	h := c.h
	now := time.Now()
	s := &wdSession{
		h: h, id: c.id, provider: m.up.Name, browser: c.wd.req.Browser(), m: m, ps: ps, opts: c.opts,
		started: now, idleFor: h.webDriverIdle(), done: make(chan struct{}),
		log: &sessionEnd{
			metrics:  h.reg.Metrics(),
			logger:   h.logger,
			attempts: c.attempts,
			waited:   c.waited,
			options:  c.opts.Map(),
		},
	}
	if cfg := h.Session; cfg != nil {
		s.maxAge = time.Duration(cfg.MaxDuration)
	}
	s.last.Store(now.UnixNano())
	s.t, c.ticket = c.ticket, nil
	keys := h.clientKeys()
	values := clientValues(keys, c.replace)
	bound := pool.Bound{Path: pool.PathHash(pathID), Handler: h.key, Keys: keys}
	if keys != nil {
		bound.Client = pool.ClientHash(values)
	}
	info := pool.SessionInfo{ID: c.id, Protocol: string(upstreams.ProtocolWebDriver), RemoteIP: remoteIP(c.r), Attempts: c.tries, Options: s.log.options, Bound: bound}
	if h.shared != nil {
		s.route = h.reg.Hashes.RouteKey(pathID)
		s.rt = cluster.Route{Provider: s.provider, ProviderID: ps.ID, SocketURL: ps.SocketURL(), CDPURL: ps.CDPURL(),
			Session: s.id, Handlers: []string{h.key}, Keys: keys}
		if keys != nil {
			s.rt.Client = h.reg.Hashes.SharedClient(values)
		}
	}
	s.t.Establish(s, info, ps.Remote)
	if h.shared != nil {
		// (rebind changes rt only once shared is set.)
		shared := h.shareRoute(s.route, s.rt)
		s.mu.Lock()
		s.shared = shared
		over := s.over
		s.mu.Unlock()
		if shared && over {
			h.dropRoute(s.route) // it ended meanwhile
		}
	}
	return s
}

// rebind puts the session's route again, bound to the handler key key as
// well (a reload replaced the handler it was bound to): the key it had
// stays in the route (a few of them), so that a node still running the
// config before the reload serves it as before.
func (s *wdSession) rebind(key string) {
	s.mu.Lock()
	if s.over || !s.shared {
		s.mu.Unlock()
		return
	}
	keys := append(slices.Clone(s.rt.Handlers), key)
	if len(keys) > maxRouteHandlers {
		keys = keys[len(keys)-maxRouteHandlers:]
	}
	s.rt.Handlers = keys
	rt := s.rt
	s.mu.Unlock()
	if s.h.shareRoute(s.route, rt) {
		s.mu.Lock()
		over := s.over
		s.mu.Unlock()
		if over {
			s.h.dropRoute(s.route) // it ended meanwhile
		}
	}
}

// maxRouteHandlers is how many handler keys a route keeps: the one that
// made its session and the latest that reloads moved it to.
const maxRouteHandlers = 4

// webDriverSessionByRoute is this node's WebDriver session whose route's
// key is key; nil when none.
func (h *Gateway) webDriverSessionByRoute(key string) *wdSession {
	if key == "" {
		return nil
	}
	for _, ls := range h.reg.Sessions.List() {
		if wd, ok := ls.Session.(*wdSession); ok && wd.route == key {
			return wd
		}
	}
	return nil
}

// run starts its timers: idleness and its time limit.
func (s *wdSession) run() {
	clock := s.h.reg.Clock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.over {
		return
	}
	s.timer = clock.AfterFunc(s.idleFor, s.idleCheck)
	if s.maxAge > 0 {
		s.ageT = clock.AfterFunc(s.maxAge, func() { s.endByGateway(upstreams.EndMaxDuration) })
	}
}

// idleCheck ends the session when it has been idle for its timeout: no
// command and no socket here, nor (under shared state) on another node.
func (s *wdSession) idleCheck() {
	s.mu.Lock()
	if s.over {
		s.mu.Unlock()
		return
	}
	busy, shared := len(s.sockets) > 0, s.shared
	s.mu.Unlock()
	idle := time.Since(time.Unix(0, s.last.Load()))
	if !busy && shared {
		if age, ok := s.sharedIdle(); ok && age < idle {
			idle = age
		}
	}
	if busy || idle < s.idleFor {
		wait := s.idleFor - idle
		if busy {
			wait = s.idleFor
		}
		s.mu.Lock()
		if !s.over {
			s.timer = s.h.reg.Clock().AfterFunc(max(wait, time.Second), s.idleCheck)
		}
		s.mu.Unlock()
		return
	}
	s.endByGateway(upstreams.EndIdle)
}

// sharedIdle is how long ago the last activity any node noted was.
func (s *wdSession) sharedIdle() (time.Duration, bool) {
	sh := s.h.shared
	if sh == nil || !sh.s.Usable() {
		return 0, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	age, ok, err := sh.s.Store().Routes().Idle(ctx, s.route)
	if err != nil {
		sh.s.Failed("read route", err)
		return 0, false
	}
	return age, ok
}

// upNow is the provider to send the session's commands to: the one that
// created it (a reload keeps the session where its browser is).
func (s *wdSession) upNow() *upstreams.Provider { return s.m.up }

// touch notes activity.
func (s *wdSession) touch() { s.last.Store(time.Now().UnixNano()) }

// command counts a command.
func (s *wdSession) command(r *http.Request) {
	now := time.Now().UnixNano()
	s.commands.Add(1)
	s.lastCmd.Store(now)
	s.last.Store(now)
}

// counted adds a command's bytes.
func (s *wdSession) counted(up, down int64) {
	if up > 0 {
		s.bytesUp.Add(up)
	}
	s.bytesDown.Add(down)
}

// addSocket counts a socket of the session's, which keeps it from being
// idle; false when the session has ended.
func (s *wdSession) addSocket(ss *upstreams.Session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.over {
		return false
	}
	if s.sockets == nil {
		s.sockets = map[*upstreams.Session]struct{}{}
	}
	s.sockets[ss] = struct{}{}
	return true
}

// socketEnded counts a socket's end as activity.
func (s *wdSession) socketEnded(ss *upstreams.Session) {
	s.mu.Lock()
	delete(s.sockets, ss)
	s.mu.Unlock()
	s.bytesUp.Add(ss.BytesUp())
	s.bytesDown.Add(ss.BytesDown())
	s.touch()
}

// The session as the registry sees it (pool.Live).

// Start is when the session was created.
func (s *wdSession) Start() time.Time { return s.started }

// BytesUp and BytesDown count the commands' and the sockets' bytes (a
// socket's once it has ended).
func (s *wdSession) BytesUp() int64   { return s.bytesUp.Load() }
func (s *wdSession) BytesDown() int64 { return s.bytesDown.Load() }

// Done is closed when the session has ended.
func (s *wdSession) Done() <-chan struct{} { return s.done }

// Close ends the session as the gateway's own end (an operator,
// shutdown): the provider gets DELETE, the sockets close frames with code
// and reason.
func (s *wdSession) Close(code int, reason string) { s.endWith(code, reason, true) }

// Browser is the browser the client asked for ("" when any).
func (s *wdSession) Browser() string { return s.browser }

// Commands counts the commands sent, and tells when the last one was.
func (s *wdSession) Commands() (int64, time.Time) {
	n, at := s.commands.Load(), s.lastCmd.Load()
	if at == 0 {
		return n, time.Time{}
	}
	return n, time.Unix(0, at)
}

// endByGateway ends it for the gateway's own reason (idle, its time
// limit).
func (s *wdSession) endByGateway(reason string) {
	s.endWith(upstreams.CloseNormal, reason, true)
}

// end ends it; byGateway tells whether the provider is to get DELETE (not
// when the client deleted it, nor when the provider ended it itself: its
// provider session is then known gone).
func (s *wdSession) end(reason string, byGateway bool) {
	s.endWith(upstreams.CloseNormal, reason, byGateway)
}

func (s *wdSession) endWith(code int, reason string, byGateway bool) {
	s.mu.Lock()
	if s.over {
		s.mu.Unlock()
		return
	}
	s.over, s.reason = true, reason
	if s.timer != nil {
		s.timer.Stop()
	}
	if s.ageT != nil {
		s.ageT.Stop()
	}
	sockets, shared := s.sockets, s.shared
	s.sockets = nil
	s.mu.Unlock()
	for ss := range sockets {
		ss.Close(code, reason)
	}
	if !byGateway {
		// Its provider session is gone already: no DELETE, and its
		// ledger entry goes.
		s.ps.Remote.Confirmed()
	}
	meter := s.t.Meter()
	s.t.Release()
	if shared {
		s.h.dropRoute(s.route)
	}
	close(s.done)
	n, _ := s.Commands()
	s.log.logWebDriver(s, reason, n, meter.Accrued())
}

// dropRoute takes a session's route (under the key id) out of the shared
// state and tells the other nodes, whose sockets of it close.
func (h *Gateway) dropRoute(id string) {
	sh := h.shared
	if sh == nil || !sh.s.Usable() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := sh.s.Store().Routes().Drop(ctx, id); err != nil {
		sh.s.Failed("drop route", err)
	}
	if err := sh.s.Store().News().AnnounceWebDriverEnded(ctx, id); err != nil {
		sh.s.Failed("announce end", err)
	}
}

// logWebDriver writes a WebDriver session's end entry.
func (e *sessionEnd) logWebDriver(s *wdSession, reason string, commands int64, cost float64) {
	e.metrics.SessionEnded(s.provider, time.Since(s.started))
	var opts []zap.Field
	if e.options != nil {
		opts = append(opts, zap.Any("options", e.options))
	}
	e.logger.Info("session ended", append([]zap.Field{
		zap.String("session_id", s.id),
		zap.String("provider", s.provider),
		zap.String("protocol", string(upstreams.ProtocolWebDriver)),
		zap.Array("attempts", e.attempts),
		zap.Float64("queue_wait_ms", roundMS(e.waited)),
		zap.Float64("duration_ms", roundMS(time.Since(s.started))),
		zap.Int64("bytes_up", s.BytesUp()),
		zap.Int64("bytes_down", s.BytesDown()),
		zap.String("close_reason", reason),
		zap.Int64("commands", commands),
		zap.Float64("cost", roundCost(cost)),
	}, opts...)...)
}
