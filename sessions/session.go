// Package sessions is the one lifecycle of a live session, whatever it is
// made of: a relayed WebSocket (upstreams.Session), a WebDriver session
// whose commands come over HTTP, or a warm session waiting for its client.
//
// A Session holds what its client holds (its pool.Ticket) from the moment
// the session counts as live to its end. It runs the session's limits on
// the registry's clock — idle_timeout, max_duration, and the ticks its body
// needs for keepalive — with one ticker and one deadline; it ends through
// one path (Ended), whatever ended it; it writes the one `session ended`
// entry; and it gives the ticket back once, unless a keeper (a parking,
// for resume) takes it. A new per-session limit is a field of Limits and
// a few lines here, for every kind of session at once.
package sessions

import (
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/queue"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Limits bound one session's life.
type Limits struct {
	// Idle ends the session once its body has shown no activity for this
	// long (0: never).
	Idle time.Duration
	// MaxDuration ends the session at this age (0: never).
	MaxDuration time.Duration
	// Keepalive is the body's keepalive interval (0: none): a body that is
	// a Ticker is ticked often enough for it.
	Keepalive time.Duration
}

// Body is what a session is made of, as its lifecycle sees it.
type Body interface {
	// Activity is a count that moves whenever the session is used (bytes
	// relayed, a command), and busy tells that the session is not idle
	// whatever the count (a socket whose client is away and may come
	// back, a WebDriver session with a socket open).
	Activity() (n int64, busy bool)
	// Close ends the body from the gateway's side, with a close code and
	// reason (at frame boundaries for a relayed socket); it returns at
	// once, and the body calls its session's Ended when it has ended.
	Close(code int, reason string)
	// BytesUp and BytesDown count what went to the provider and to the
	// client.
	BytesUp() int64
	BytesDown() int64
}

// Ticker is a Body with work of its own at each tick of its session (a
// relay's keepalive pings).
type Ticker interface {
	Tick(now time.Time)
}

// ElsewhereIdler is a Body that may be used through other nodes too (a
// WebDriver session under shared state): before its session ends for
// idleness, it says how long ago any node last saw it used.
type ElsewhereIdler interface {
	IdleElsewhere() (time.Duration, bool)
}

// Fielder is a Body whose end entry says more than the common fields (a
// relay's keepalive pings, a WebDriver session's commands).
type Fielder interface {
	EndFields() []zap.Field
}

// Entry is what a session's end entry says of the client's way to it.
type Entry struct {
	// ID is the session's ID as operators see it; "" for a session no
	// client holds (yet), which writes no end entry.
	ID string
	// Provider is the provider's name.
	Provider string
	// Attempts are the client's attempts, for the log.
	Attempts zapcore.ArrayMarshaler
	// Waited is the client's time in the queue.
	Waited time.Duration
	// Fields are more fields of the entry (hedges, options, warm…).
	Fields []zap.Field
}

// Deps are what a Session reports to and runs on: the registry's clock,
// the handler's logger and the metrics.
type Deps struct {
	Clock   queue.Clock
	Logger  *zap.Logger
	Metrics *observe.Metrics
}

// Session is one live session's lifecycle.
type Session struct {
	deps Deps
	t    *pool.Ticket

	mu     sync.Mutex
	body   Body
	limits Limits
	entry  Entry
	start  time.Time
	// keep, when set, is asked at the end whether it keeps the ticket
	// (a parked session that holds its provider session).
	keep    func() bool
	ticker  queue.Timer
	ageT    queue.Timer
	lastN   int64
	lastAt  time.Time
	over    bool
	reason  string
	done    chan struct{}
	started bool
}

// New is the lifecycle of a session made of body, holding ticket t, within
// limits; entry is what its end entry says of its client. Call Run once
// the session counts as live.
func New(deps Deps, t *pool.Ticket, body Body, limits Limits, entry Entry) *Session {
	return &Session{deps: deps, t: t, body: body, limits: limits, entry: entry, done: make(chan struct{})}
}

// Ticket is what the session holds.
func (s *Session) Ticket() *pool.Ticket { return s.t }

// Body is what the session is made of now.
func (s *Session) Body() Body {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.body
}

// SetKeeper has keep asked, at the session's end, whether it keeps the
// ticket; when it does, the session gives nothing back.
func (s *Session) SetKeeper(keep func() bool) {
	s.mu.Lock()
	s.keep = keep
	s.mu.Unlock()
}

// SetID renames the session in its end entry (a held session joined by a
// resume goes on under the resume's ID).
func (s *Session) SetID(id string) {
	s.mu.Lock()
	s.entry.ID = id
	s.mu.Unlock()
}

// Run starts the session's clock: its age and idleness count from now.
func (s *Session) Run() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.over || s.started {
		return
	}
	s.started = true
	s.armLocked()
}

// armLocked starts the ticker and the age deadline of the current body
// and limits.
func (s *Session) armLocked() {
	now := s.deps.Clock.Now()
	s.start, s.lastAt = now, now
	s.lastN, _ = s.body.Activity()
	if every := s.tickEvery(); every > 0 {
		s.ticker = s.deps.Clock.AfterFunc(every, s.tick)
	}
	if s.limits.MaxDuration > 0 {
		s.ageT = s.deps.Clock.AfterFunc(s.limits.MaxDuration, func() {
			s.Close(upstreams.CloseNormal, upstreams.EndMaxDuration)
		})
	}
}

// stopLocked stops the ticker and the age deadline.
func (s *Session) stopLocked() {
	if s.ticker != nil {
		s.ticker.Stop()
		s.ticker = nil
	}
	if s.ageT != nil {
		s.ageT.Stop()
		s.ageT = nil
	}
}

// tickEvery is how often the session is looked at: a quarter of the idle
// timeout or of the keepalive interval, whichever is shorter (0: never).
// So a session ends for idleness between Idle and Idle*5/4 after its last
// activity.
func (s *Session) tickEvery() time.Duration {
	d := s.limits.Idle
	if _, ok := s.body.(Ticker); ok && s.limits.Keepalive > 0 && (d == 0 || s.limits.Keepalive < d) {
		d = s.limits.Keepalive
	}
	if d == 0 {
		return 0
	}
	return max(d/4, time.Millisecond)
}

// tick looks at the session: its idleness, then its body's own work.
func (s *Session) tick() {
	s.mu.Lock()
	if s.over || s.ticker == nil {
		s.mu.Unlock()
		return
	}
	body, now := s.body, s.deps.Clock.Now()
	idle := s.limits.Idle
	n, busy := body.Activity()
	if n != s.lastN || busy {
		s.lastN, s.lastAt = n, now
	}
	quiet := now.Sub(s.lastAt)
	s.mu.Unlock()

	if idle > 0 && quiet >= idle {
		if e, ok := body.(ElsewhereIdler); ok {
			if age, known := e.IdleElsewhere(); known && age < quiet {
				s.mu.Lock()
				s.lastAt = now.Add(-age)
				s.mu.Unlock()
				quiet = age
			}
		}
		if quiet >= idle {
			body.Close(upstreams.CloseNormal, upstreams.EndIdle)
			return
		}
	}
	if t, ok := body.(Ticker); ok && s.limits.Keepalive > 0 {
		t.Tick(now)
	}
	s.mu.Lock()
	if !s.over && s.ticker != nil {
		s.ticker = s.deps.Clock.AfterFunc(s.tickEvery(), s.tick)
	}
	s.mu.Unlock()
}

// Handover gives the session a new body, limits and entry (a warm session
// handed to its client: from now on it is that client's session); its
// clock starts again.
func (s *Session) Handover(body Body, limits Limits, entry Entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.over {
		return
	}
	s.stopLocked()
	s.body, s.limits, s.entry = body, limits, entry
	if s.started {
		s.armLocked()
	}
}

// Close ends the session from the gateway's side (an operator, shutdown,
// a limit): its body gets the close code and reason, and the session ends
// once the body has.
func (s *Session) Close(code int, reason string) {
	s.Body().Close(code, reason)
}

// Done is closed once the session has ended and given back what it held.
func (s *Session) Done() <-chan struct{} { return s.done }

// Ended is the one way a session ends: its body calls it once it has
// ended, for reason. The timers stop, the ticket is given back (unless
// the keeper keeps it), the end is measured and logged — a session no
// client held (a warm session never handed out: its entry has no ID) is
// neither —, and Done closes. A second call does nothing.
func (s *Session) Ended(reason string) {
	s.mu.Lock()
	if s.over {
		s.mu.Unlock()
		return
	}
	s.over, s.reason = true, reason
	s.stopLocked()
	keep := s.keep
	s.mu.Unlock()

	meter := s.t.Meter()
	if keep == nil || !keep() {
		s.t.Release()
	}
	// (After the keeper, which may rename the session.)
	s.mu.Lock()
	body, entry, start := s.body, s.entry, s.start
	s.mu.Unlock()
	if !start.IsZero() && entry.ID != "" {
		d := s.deps.Clock.Now().Sub(start)
		s.deps.Metrics.SessionEnded(entry.Provider, d)
		s.log(body, entry, reason, d, meter.Accrued())
	}
	close(s.done)
}

// Start is when the session's clock started (zero before Run).
func (s *Session) Start() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.start
}

// BytesUp and BytesDown are its body's counts.
func (s *Session) BytesUp() int64   { return s.Body().BytesUp() }
func (s *Session) BytesDown() int64 { return s.Body().BytesDown() }

// Reason is why the session ended ("" while it lives).
func (s *Session) Reason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reason
}
