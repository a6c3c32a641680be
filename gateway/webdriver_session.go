package gateway

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/options"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/sessions"
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

// webDrivers is the handler's WebDriver side: the sessions its creates
// made, their routes (here and, under shared state, in Redis), and the
// requests that reach them beside the chain (webdriver_routes.go,
// front_webdriver.go).
type webDrivers struct {
	*Gateway
}

// wdSession is one live WebDriver session: the session registry's
// pool.Live for it, and its lifecycle's body (package sessions), which
// runs its idle timeout (no command and no socket open, here nor on
// another node), its time limit, its end entry and the ticket's give-back.
type wdSession struct {
	h webDrivers // the handler that created it (its logger, registry, shared state)
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
	life    *sessions.Session
	started time.Time
	// shared: its route is in the shared state, under the key route
	// (pool.Hashes.RouteKey of its path ID) as rt says.
	shared bool
	route  string
	rt     cluster.Route

	commands  atomic.Int64
	activity  atomic.Int64 // moves with each command and socket's activity
	lastCmd   atomic.Int64 // unix nanoseconds of the last command
	bytesUp   atomic.Int64
	bytesDown atomic.Int64

	mu      sync.Mutex
	over    bool
	sockets map[*upstreams.Session]struct{}
	done    chan struct{}
}

// newWebDriverSession makes the session of a create that ps answered at
// m, which its client is to name by pathID: it takes the client's ticket,
// and is listed, bound to the handler and the client's key.
func (c *connect) newWebDriverSession(m *member, ps *upstreams.WebDriverSession, pathID, browser string) *wdSession {
	h := webDrivers{c.h}
	s := &wdSession{
		h: h, id: c.id, provider: m.up.Name, browser: browser, m: m, ps: ps, opts: c.opts,
		started: time.Now(), done: make(chan struct{}),
	}
	t := c.ticket
	c.ticket = nil
	entry := sessions.Entry{ID: c.id, Provider: m.up.Name, Attempts: attempts(c.attempts), Waited: c.waited,
		Fields: []zap.Field{zap.String("protocol", string(upstreams.ProtocolWebDriver))}}
	if opts := c.opts.Map(); opts != nil {
		entry.Fields = append(entry.Fields, zap.Any("options", opts))
	}
	s.life = sessions.New(h.sessionDeps(), t, s, h.limits(defaultWebDriverIdle), entry)
	keys := h.clientKeys()
	values := clientValues(keys, c.replace)
	bound := pool.Bound{Path: pool.PathHash(pathID), Handler: h.key, Keys: keys}
	if keys != nil {
		bound.Client = pool.ClientHash(values)
	}
	info := pool.SessionInfo{ID: c.id, Protocol: string(upstreams.ProtocolWebDriver), RemoteIP: remoteIP(c.r), Attempts: c.tries, Options: c.opts.Map(), Bound: bound}
	if h.shared != nil {
		s.route = h.reg.Hashes.RouteKey(pathID)
		s.rt = cluster.Route{Provider: s.provider, ProviderID: ps.ID, SocketURL: ps.SocketURL(), CDPURL: ps.CDPURL(),
			Session: s.id, Handlers: []string{h.key}, Keys: keys}
		if keys != nil {
			s.rt.Client = h.reg.Hashes.SharedClient(values)
		}
	}
	t.Establish(s, info, ps.Remote)
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
func (h webDrivers) webDriverSessionByRoute(key string) *wdSession {
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

// The session as its lifecycle sees it (sessions.Body).

// Activity moves with each command and each socket's activity; a session
// with a socket open is busy, never idle.
func (s *wdSession) Activity() (int64, bool) {
	s.mu.Lock()
	busy := len(s.sockets) > 0
	s.mu.Unlock()
	return s.activity.Load(), busy
}

// IdleElsewhere is, under shared state, how long ago any node last noted
// the session's activity.
func (s *wdSession) IdleElsewhere() (time.Duration, bool) {
	s.mu.Lock()
	shared := s.shared
	s.mu.Unlock()
	if !shared {
		return 0, false
	}
	return s.sharedIdle()
}

// EndFields are what its end entry says besides every session's.
func (s *wdSession) EndFields() []zap.Field {
	n, _ := s.Commands()
	return []zap.Field{zap.Int64("commands", n)}
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
func (s *wdSession) touch() { s.activity.Add(1) }

// command counts a command.
func (s *wdSession) command() {
	s.commands.Add(1)
	s.lastCmd.Store(time.Now().UnixNano())
	s.activity.Add(1)
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

// end ends it; byGateway tells whether the provider is to get DELETE (not
// when the client deleted it, nor when the provider ended it itself: its
// provider session is then known gone).
func (s *wdSession) end(reason string, byGateway bool) {
	s.endWith(upstreams.CloseNormal, reason, byGateway)
}

// endWith is the session's end, whatever ended it: its sockets get close
// frames with code and reason, its provider session is ended (DELETE,
// through its ticket) unless byGateway is false, its lifecycle ends
// (the ticket given back, the end entry), and its route leaves the
// shared state.
func (s *wdSession) endWith(code int, reason string, byGateway bool) {
	s.mu.Lock()
	if s.over {
		s.mu.Unlock()
		return
	}
	s.over = true
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
	s.life.Ended(reason)
	if shared {
		s.h.dropRoute(s.route)
	}
	close(s.done)
}

// dropRoute takes a session's route (under the key id) out of the shared
// state and tells the other nodes, whose sockets of it close.
func (h webDrivers) dropRoute(id string) {
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

// The default idle timeout of a WebDriver session: its client sends
// commands, so one that sent none for this long (with no socket open) has
// gone.
const defaultWebDriverIdle = 5 * time.Minute

// clientKeys are the client key placeholders the handler's WebDriver
// sessions are bound to: client_limit's, then client_budget's when it is
// another; nil without either.
func (h webDrivers) clientKeys() []string {
	var keys []string
	if cl := h.ClientLimit; cl != nil {
		keys = append(keys, cl.Key)
	}
	if cb := h.ClientBudget; cb != nil && !slices.Contains(keys, cb.Key) {
		keys = append(keys, cb.Key)
	}
	return keys
}

// clientValues resolves keys with replace (nil: every value empty).
func clientValues(keys []string, replace func(string) string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		if replace != nil {
			out[i] = replace(k)
		}
	}
	return out
}

// webDriverRouteTTL is how long a session's route stays in the shared
// state without activity: past its idle timeout, the owner has ended it.
func (h webDrivers) webDriverRouteTTL() time.Duration {
	return 2*h.webDriverIdle() + time.Minute
}

// webDriverIdle is the idle timeout of the handler's WebDriver sessions.
func (h webDrivers) webDriverIdle() time.Duration {
	if s := h.Session; s != nil && s.IdleTimeout > 0 {
		return time.Duration(s.IdleTimeout)
	}
	return defaultWebDriverIdle
}

// shareRoute puts a session's route rt in the shared state under key (its
// owner this node).
func (h webDrivers) shareRoute(key string, rt cluster.Route) bool {
	sh := h.shared
	if sh == nil || !sh.s.Usable() {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rt.Node = sh.s.Store().Node()
	if err := sh.s.Store().Routes().Put(ctx, key, rt, h.webDriverRouteTTL()); err != nil {
		sh.s.Failed("put route", err)
		return false
	}
	sh.s.Worked()
	return true
}

// End reasons of WebDriver sessions that are their own.
const (
	EndClientDelete = "client deleted the session"
	EndProviderGone = "provider ended the session"
	// EndElsewhere: another node served its end (the client's DELETE,
	// the provider's invalid session id).
	EndElsewhere = "ended through another node"
)
