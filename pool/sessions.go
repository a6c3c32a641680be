package pool

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/browserfailover/caddy-browser-failover/recordings"
	"github.com/browserfailover/caddy-browser-failover/spend"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// The session registry (LiveSessions): every live session of the process,
// by session and by ID, with what the operator sees of it. A session
// enters it when its provider's slot becomes live (Ticket.Establish) and
// leaves it when the slot is freed or parked, so the registry is exactly
// the live sessions that count against max_concurrent. Listing it reads only the registry and each session's
// own counters: the relay does no work for it.

// SessionInfo is what the gateway knows of a session when it is
// established.
type SessionInfo struct {
	// ID names the session (URL-safe, unique in the process).
	ID string
	// Provider is the provider's name.
	Provider string
	// Protocol is what the client speaks: cdp, playwright or bidi.
	Protocol string
	// Client is the session's client_limit key as status shows it
	// (QuotaKey.Shown); "" when the handler has no client_limit.
	Client string
	// RemoteIP is the client's address as Caddy saw it (trusted proxies
	// applied).
	RemoteIP string
	// Attempts counts the provider attempts the client's way took, the
	// successful one included.
	Attempts int
	// ResumeToken is the keyed hash of the session's resume token ("" when
	// it cannot be resumed): how a resume finds a session that is still
	// ending. Never shown.
	ResumeToken string
	// Meter is the session's cost so far (nil: none metered).
	Meter *spend.Meter
	// Options are the session options the client stated (nil: none).
	Options map[string]any
	// Bound is whom a session its client names by a secret answers to
	// (a WebDriver session; bound.go); zero for the others. Never
	// shown.
	Bound Bound
	// Recording is the session's recording under way (nil: none), and
	// Unrecorded why a session that was to be recorded is not ("": it
	// is, or was not to be).
	Recording  *recordings.Recording
	Unrecorded string
}

// Live is what the registry knows a live session by: a relayed
// WebSocket session (upstreams.Session), or a WebDriver session whose
// commands come over HTTP. Its Start, byte counters and Done are read
// live; Close ends it with a close code and reason, at frame boundaries
// for a relayed one.
type Live interface {
	Start() time.Time
	BytesUp() int64
	BytesDown() int64
	Done() <-chan struct{}
	Close(code int, reason string)
}

// Commanded is a Live that takes commands over HTTP (a WebDriver
// session): what the sessions list shows of it besides.
type Commanded interface {
	Live
	// Browser is the browser its create asked for ("" when any).
	Browser() string
	// Commands counts its commands, and tells when the last one came
	// (zero before the first).
	Commands() (int64, time.Time)
}

// LiveSession is one entry of the registry.
type LiveSession struct {
	SessionInfo
	// Session is the live session.
	Session Live
	seq     uint64
}

// LiveSessions are the live sessions of the process: by session, by ID,
// by resume token hash and by path hash (bound.go). A provider's slot
// lists a session here when it becomes live and takes it off when it is
// freed (or parked).
type LiveSessions struct {
	mu      sync.Mutex
	all     map[Live]*LiveSession
	byID    map[string]*LiveSession
	byToken map[string]*LiveSession
	// byPath: by the hash of the secret their clients name them by
	// (bound.go).
	byPath map[string]*LiveSession
	seq    uint64
}

func newLiveSessions() *LiveSessions {
	return &LiveSessions{
		all:     map[Live]*LiveSession{},
		byID:    map[string]*LiveSession{},
		byToken: map[string]*LiveSession{},
		byPath:  map[string]*LiveSession{},
	}
}

// add lists e (its Session set); the entry is its ticket's own.
func (l *LiveSessions) add(e *LiveSession) {
	l.mu.Lock()
	l.seq++
	e.seq = l.seq
	l.all[e.Session] = e
	if e.ID != "" {
		l.byID[e.ID] = e
	}
	if e.ResumeToken != "" {
		l.byToken[e.ResumeToken] = e
	}
	if e.Bound.Path != "" {
		l.byPath[e.Bound.Path] = e
	}
	l.mu.Unlock()
}

func (l *LiveSessions) remove(s Live) {
	l.mu.Lock()
	if e, ok := l.all[s]; ok {
		delete(l.all, s)
		if l.byID[e.ID] == e {
			delete(l.byID, e.ID)
		}
		if l.byToken[e.ResumeToken] == e {
			delete(l.byToken, e.ResumeToken)
		}
		if l.byPath[e.Bound.Path] == e {
			delete(l.byPath, e.Bound.Path)
		}
	}
	l.mu.Unlock()
}

// Count counts the live sessions of the process.
func (l *LiveSessions) Count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.all)
}

// List lists the live sessions of the process, oldest first.
func (l *LiveSessions) List() []LiveSession {
	l.mu.Lock()
	out := make([]LiveSession, 0, len(l.all))
	for _, e := range l.all {
		out = append(out, *e)
	}
	l.mu.Unlock()
	slices.SortFunc(out, func(a, b LiveSession) int {
		if c := a.Session.Start().Compare(b.Session.Start()); c != 0 {
			return c
		}
		return cmp.Compare(a.seq, b.seq)
	})
	return out
}

// ByID finds a live session by its ID.
func (l *LiveSessions) ByID(id string) (LiveSession, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.byID[id]
	if !ok {
		return LiveSession{}, false
	}
	return *e, true
}

// ByResumeToken finds a live session by its resume token's hash.
func (l *LiveSessions) ByResumeToken(token string) (LiveSession, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.byToken[token]
	if !ok || token == "" {
		return LiveSession{}, false
	}
	return *e, true
}

// End ends the live session id as an operator asked: close 1000
// "closed by operator" to both sides at frame boundaries. It waits up to
// wait for the session to end (its slot, client_limit share and
// cluster-wide slot freed, the next waiter offered them) and reports the
// session as found, and whether it has ended.
func (l *LiveSessions) End(id string, wait time.Duration) (LiveSession, bool, bool) {
	e, ok := l.ByID(id)
	if !ok {
		return LiveSession{}, false, false
	}
	e.Session.Close(upstreams.CloseNormal, upstreams.EndOperator)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-e.Session.Done():
		return e, true, true
	case <-t.C:
		return e, true, false
	}
}

// CloseAll ends every live session with a close frame (code, reason) and
// waits until they have ended or the deadline passes.
func (l *LiveSessions) CloseAll(code int, reason string, deadline time.Time) {
	l.mu.Lock()
	all := make([]Live, 0, len(l.all))
	for s := range l.all {
		all = append(all, s)
	}
	l.mu.Unlock()
	for _, s := range all {
		s.Close(code, reason)
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for _, s := range all {
		select {
		case <-s.Done():
		case <-timer.C:
			return
		}
	}
}

// Rename gives the live session s a new ID and client address (a held
// session joined by a resuming client).
func (l *LiveSessions) Rename(s Live, id, remoteIP string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.all[s]
	if !ok {
		return
	}
	if l.byID[e.ID] == e {
		delete(l.byID, e.ID)
	}
	e.ID, e.RemoteIP = id, remoteIP
	l.byID[id] = e
}

// Sockets are the relays of WebDriver sockets this node serves for
// sessions another node owns (under shared state): they take no slot,
// and close when their session's owner ends it, or at shutdown.
type Sockets struct {
	mu   sync.Mutex
	byID map[string]map[*upstreams.Session]struct{}
	of   map[*upstreams.Session]string
}

// Add counts relay s as a socket of session id.
func (k *Sockets) Add(id string, s *upstreams.Session) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.byID == nil {
		k.byID, k.of = map[string]map[*upstreams.Session]struct{}{}, map[*upstreams.Session]string{}
	}
	if k.byID[id] == nil {
		k.byID[id] = map[*upstreams.Session]struct{}{}
	}
	k.byID[id][s] = struct{}{}
	k.of[s] = id
}

// Remove forgets relay s (it ended).
func (k *Sockets) Remove(s *upstreams.Session) {
	k.mu.Lock()
	defer k.mu.Unlock()
	id, ok := k.of[s]
	if !ok {
		return
	}
	delete(k.of, s)
	delete(k.byID[id], s)
	if len(k.byID[id]) == 0 {
		delete(k.byID, id)
	}
}

// CloseSession closes the sockets of session id with code and reason.
func (k *Sockets) CloseSession(id string, code int, reason string) {
	k.mu.Lock()
	all := make([]*upstreams.Session, 0, len(k.byID[id]))
	for s := range k.byID[id] {
		all = append(all, s)
	}
	k.mu.Unlock()
	for _, s := range all {
		s.Close(code, reason)
	}
}

// CloseAll closes every one of them.
func (k *Sockets) CloseAll(code int, reason string) {
	k.mu.Lock()
	all := make([]*upstreams.Session, 0, len(k.of))
	for s := range k.of {
		all = append(all, s)
	}
	k.mu.Unlock()
	for _, s := range all {
		s.Close(code, reason)
	}
}
