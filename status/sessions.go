package status

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/browserfailover/caddy-browser-failover/options"
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
	// Protocol is what the client speaks: cdp, playwright, bidi or
	// webdriver (a WebDriver session over HTTP).
	Protocol string `json:"protocol"`
	// Browser, Commands and LastCommand are a WebDriver session's: the
	// browser its create asked for ("" when any), the commands it sent,
	// and when the last one came (UTC; null before the first).
	Browser     *string    `json:"browser,omitempty"`
	Commands    *int64     `json:"commands,omitempty"`
	LastCommand *time.Time `json:"last_command,omitempty"`
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
	// Parked is set while the session's client has left it and it may be
	// resumed, until ResumableUntil (UTC). A held parked session keeps its
	// provider connection and slot; one that is not held has no
	// connection: its duration and bytes are those it had when parked.
	Parked         bool       `json:"parked"`
	ResumableUntil *time.Time `json:"resumable_until,omitempty"`
	// Cost is what the session has cost so far (0 when its provider
	// states no cost).
	Cost float64 `json:"cost"`
	// Options are the session options its client stated (absent when
	// none): region a list, booleans booleans, timeout a duration.
	Options map[string]any `json:"options,omitempty"`
	// Recording is, for a session that is to be recorded, its recording
	// ({"id","frames","bytes","dropped"[,"stopped"]}) or why it has none
	// ("unavailable: <why>"); absent otherwise.
	Recording any `json:"recording,omitempty"`
}

// sessionOf builds a registry entry's Session object, its duration and
// bytes as of now.
func sessionOf(reg *pool.Registry, e pool.LiveSession) Session {
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
		Cost:       roundCost(e.Meter.Accrued()),
		Options:    e.Options,
	}
	if e.Client != "" {
		c := e.Client
		out.Client = &c
	}
	if e.Recording != nil {
		out.Recording = e.Recording.Brief()
	} else if e.Unrecorded != "" {
		out.Recording = e.Unrecorded
	}
	if wd, ok := e.Session.(pool.Commanded); ok {
		b := wd.Browser()
		n, at := wd.Commands()
		out.Browser, out.Commands = &b, &n
		if !at.IsZero() {
			at = at.UTC()
			out.LastCommand = &at
		}
	}
	if p, ok := reg.Parked.ByID(e.ID); ok && p.Held == e.Session {
		out.Parked = true
		until := p.Until.UTC()
		out.ResumableUntil = &until
	}
	return out
}

// parkedOf builds the Session object of a parked session that is not
// held (it has no connection).
func parkedOf(p pool.Parked) Session {
	until := p.Until.UTC()
	out := Session{
		ID:             p.ID,
		Provider:       p.Provider,
		Protocol:       p.Protocol,
		Started:        p.Started.UTC(),
		DurationMS:     p.Parked.Sub(p.Started).Milliseconds(),
		BytesUp:        p.BytesUp,
		BytesDown:      p.BytesDown,
		RemoteIP:       p.RemoteIP,
		Parked:         true,
		ResumableUntil: &until,
		Cost:           roundCost(p.Meter.Accrued()),
	}
	if p.Options != "" {
		s, _, _ := options.FromRequest(p.Options, nil)
		out.Options = s.Map()
	}
	if p.Client != "" {
		c := p.Client
		out.Client = &c
	}
	return out
}

// ListSessions returns this node's live sessions and then its parked
// sessions that are not held, each oldest first (never a nil list). It
// reads the session and resume registries and each session's counters,
// nothing else.
func ListSessions(reg *pool.Registry) Sessions {
	if reg == nil {
		return Sessions{Sessions: []Session{}}
	}
	live := reg.Sessions.List()
	parked := reg.Parked.List()
	out := Sessions{Sessions: make([]Session, 0, len(live)+len(parked))}
	for _, e := range live {
		out.Sessions = append(out.Sessions, sessionOf(reg, e))
	}
	for _, p := range parked {
		if p.Held == nil {
			out.Sessions = append(out.Sessions, parkedOf(p))
		}
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
//
// A parked session is ended too: a held one like a live one (its
// provider gets the close frame), one that is not held is no longer
// resumable (and a provider session created for it is released).
func EndSession(reg *pool.Registry, id string) (Session, error) {
	if reg == nil {
		return Session{}, fmt.Errorf("%w: no live or parked session %q", ErrNotFound, id)
	}
	e, found, _ := reg.Sessions.End(id, endWait)
	if found {
		return sessionOf(reg, e), nil
	}
	if p, ok := reg.Parked.Drop(id); ok {
		return parkedOf(p), nil
	}
	return Session{}, fmt.Errorf("%w: no live or parked session %q", ErrNotFound, id)
}

func (a Admin) handleSessions(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return methodNotAllowed(w, "GET, HEAD")
	}
	return writeJSON(w, r, ListSessions(a.registry()))
}

func (a Admin) handleSession(w http.ResponseWriter, r *http.Request) error {
	id := strings.TrimPrefix(r.URL.Path, SessionsPath+"/")
	if id == "" || strings.Contains(id, "/") {
		return notFound("want /browser_failover/sessions/<id>")
	}
	if r.Method != http.MethodDelete {
		return methodNotAllowed(w, "DELETE")
	}
	s, err := EndSession(a.registry(), id)
	if err != nil {
		return notFound(err.Error())
	}
	return writeJSON(w, r, s)
}
