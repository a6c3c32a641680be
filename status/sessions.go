package status

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Sessions is the document served at SessionsPath: this node's live
// sessions, oldest first.
type Sessions struct {
	Sessions []Session `json:"sessions"`
}

// Session is one live session as the operator sees it.
type Session struct {
	// ID is the session's ID, as on the client's Browser-Failover-Session
	// header and the session_id of its log entries.
	ID       string `json:"id"`
	Provider string `json:"provider"`
	// Protocol is what the client speaks: cdp or playwright.
	Protocol string `json:"protocol"`
	// Started is when the session was established (UTC).
	Started    time.Time `json:"started"`
	DurationMS int64     `json:"duration_ms"`
	// BytesUp went from the client to the provider, BytesDown back.
	BytesUp   int64 `json:"bytes_up"`
	BytesDown int64 `json:"bytes_down"`
	// Client is the session's client_limit key, hashed as in the status's
	// clients list; null without client_limit.
	Client *string `json:"client"`
	// RemoteIP is the client's IP as Caddy saw it.
	RemoteIP string `json:"remote_ip"`
	// Attempts counts the provider attempts its way took, the successful
	// one included.
	Attempts int `json:"attempts"`
}

// sessionOf builds a registry entry's Session object, its duration and
// bytes as of now.
func sessionOf(e pool.LiveSession) Session {
	start := e.Session.Start()
	out := Session{
		ID:         e.ID,
		Provider:   e.Provider,
		Protocol:   e.Protocol,
		Started:    start.UTC(),
		DurationMS: time.Since(start).Milliseconds(),
		BytesUp:    e.Session.BytesUp(),
		BytesDown:  e.Session.BytesDown(),
		RemoteIP:   e.RemoteIP,
		Attempts:   e.Attempts,
	}
	if e.Client != "" {
		c := e.Client
		out.Client = &c
	}
	return out
}

// ListSessions returns this node's live sessions, oldest first (never a
// nil list). It reads the session registry and each session's counters,
// nothing else.
func ListSessions() Sessions {
	live := pool.Sessions()
	out := Sessions{Sessions: make([]Session, 0, len(live))}
	for _, e := range live {
		out.Sessions = append(out.Sessions, sessionOf(e))
	}
	return out
}

// endWait is how long ending a session waits for it to be over before it
// answers: both peers normally answer the close frames at once, and one
// that does not is cut CloseWait later.
const endWait = 2 * upstreams.CloseWait

// EndSession ends the live session id with close 1000 "closed by operator"
// to both sides, at frame boundaries. It waits (a bounded time) for the
// session to end, so that its slot and client_limit share are free when it
// returns, and returns the session's object as of then. An unknown ID is
// an ErrNotFound.
func EndSession(id string) (Session, error) {
	e, found, _ := pool.EndSession(id, endWait)
	if !found {
		return Session{}, fmt.Errorf("%w: no live session %q", ErrNotFound, id)
	}
	return sessionOf(e), nil
}

func (Admin) handleSessions(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return methodNotAllowed(w, "GET, HEAD")
	}
	return writeJSON(w, r, ListSessions())
}

func (Admin) handleSession(w http.ResponseWriter, r *http.Request) error {
	id := strings.TrimPrefix(r.URL.Path, SessionsPath+"/")
	if id == "" || strings.Contains(id, "/") {
		return notFound("want /browser_failover/sessions/<id>")
	}
	if r.Method != http.MethodDelete {
		return methodNotAllowed(w, "DELETE")
	}
	s, err := EndSession(id)
	if err != nil {
		return notFound(err.Error())
	}
	return writeJSON(w, r, s)
}
