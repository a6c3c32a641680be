package pool

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// The session registry: every live session of the process, by session and
// by ID, with what the operator sees of it. A session enters it when its
// provider's slot becomes live (Establish) and leaves it when the slot is
// freed (End), so the registry is exactly the sessions that count against
// max_concurrent. Listing it reads only the registry and each session's
// own counters: the relay does no work for it.

// SessionInfo is what the gateway knows of a session when it is
// established.
type SessionInfo struct {
	// ID names the session (URL-safe, unique in the process).
	ID string
	// Provider is the provider's name.
	Provider string
	// Protocol is what the client speaks: cdp or playwright.
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
}

// LiveSession is one entry of the registry.
type LiveSession struct {
	SessionInfo
	// Session is the relay; its Start, byte counters and Done are read
	// live.
	Session *upstreams.Session
	seq     uint64
}

var (
	sessionsMu sync.Mutex
	sessions   = map[*upstreams.Session]*LiveSession{}
	sessionIDs = map[string]*LiveSession{}
	// sessionTokens indexes the resumable ones by resume token hash.
	sessionTokens = map[string]*LiveSession{}
	sessionSeq    uint64
)

func track(s *upstreams.Session, info SessionInfo) {
	sessionsMu.Lock()
	sessionSeq++
	e := &LiveSession{SessionInfo: info, Session: s, seq: sessionSeq}
	sessions[s] = e
	if info.ID != "" {
		sessionIDs[info.ID] = e
	}
	if info.ResumeToken != "" {
		sessionTokens[info.ResumeToken] = e
	}
	sessionsMu.Unlock()
}

func untrack(s *upstreams.Session) {
	sessionsMu.Lock()
	if e, ok := sessions[s]; ok {
		delete(sessions, s)
		if sessionIDs[e.ID] == e {
			delete(sessionIDs, e.ID)
		}
		if sessionTokens[e.ResumeToken] == e {
			delete(sessionTokens, e.ResumeToken)
		}
	}
	sessionsMu.Unlock()
}

// LiveSessions counts the live sessions of the process.
func LiveSessions() int {
	sessionsMu.Lock()
	defer sessionsMu.Unlock()
	return len(sessions)
}

// Sessions lists the live sessions of the process, oldest first.
func Sessions() []LiveSession {
	sessionsMu.Lock()
	out := make([]LiveSession, 0, len(sessions))
	for _, e := range sessions {
		out = append(out, *e)
	}
	sessionsMu.Unlock()
	slices.SortFunc(out, func(a, b LiveSession) int {
		if c := a.Session.Start().Compare(b.Session.Start()); c != 0 {
			return c
		}
		return cmp.Compare(a.seq, b.seq)
	})
	return out
}

// SessionByID finds a live session by its ID.
func SessionByID(id string) (LiveSession, bool) {
	sessionsMu.Lock()
	defer sessionsMu.Unlock()
	e, ok := sessionIDs[id]
	if !ok {
		return LiveSession{}, false
	}
	return *e, true
}

// SessionByResumeToken finds a live session by its resume token's hash.
func SessionByResumeToken(token string) (LiveSession, bool) {
	sessionsMu.Lock()
	defer sessionsMu.Unlock()
	e, ok := sessionTokens[token]
	if !ok || token == "" {
		return LiveSession{}, false
	}
	return *e, true
}

// EndSession ends the live session id as an operator asked: close 1000
// "closed by operator" to both sides at frame boundaries. It waits up to
// wait for the session to end (its slot, client_limit share and
// cluster-wide slot freed, the next waiter offered them) and reports the
// session as found, and whether it has ended.
func EndSession(id string, wait time.Duration) (LiveSession, bool, bool) {
	e, ok := SessionByID(id)
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
func CloseAll(code int, reason string, deadline time.Time) {
	sessionsMu.Lock()
	all := make([]*upstreams.Session, 0, len(sessions))
	for s := range sessions {
		all = append(all, s)
	}
	sessionsMu.Unlock()
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

// RenameSession gives the live session s a new ID and client address (a
// held session joined by a resuming client).
func RenameSession(s *upstreams.Session, id, remoteIP string) {
	sessionsMu.Lock()
	defer sessionsMu.Unlock()
	e, ok := sessions[s]
	if !ok {
		return
	}
	if sessionIDs[e.ID] == e {
		delete(sessionIDs, e.ID)
	}
	e.ID, e.RemoteIP = id, remoteIP
	sessionIDs[id] = e
}
