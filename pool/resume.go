package pool

import (
	"cmp"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"time"

	"github.com/browserfailover/caddy-browser-failover/queue"
	"github.com/browserfailover/caddy-browser-failover/spend"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// The resume registry: sessions that ended from their client's side (its
// close frame, or its connection dropping) and that the client may take
// back within a window, with the resume token only it holds. The registry
// keeps a keyed hash of each token (ResumeTokenHash), never the token; an
// entry is found by that hash for a resume, and by its session ID for the
// operator's listing and actions (an ID never takes a session back). A
// session without hold is
// parked here once its provider connection is closed: only where it was
// is kept (the provider, the URL dialled), to dial the same browser
// again. A held session keeps its provider connection open, and its slot,
// and is parked here as well while no client is joined to it. Each parked
// entry is taken back at most once, and only with the key it was parked
// under.
// Entries live in the registry: reloads keep them. Their windows run on
// the registry's clock.

// Parked is one resumable session.
type Parked struct {
	// ID is the session's ID: what the operator sees and ends it by.
	ID string
	// Token is the keyed hash of the resume token (ResumeTokenHash): what
	// a resume finds it by.
	Token string
	// Provider is the provider's name.
	Provider string
	// Protocol is what the client spoke (only cdp sessions are parked).
	Protocol string
	// Point is where the provider connection was made.
	Point upstreams.ResumePoint
	// Key is the hashed resume key it was parked under ("" when the
	// handler binds resumes to no key).
	Key string
	// Started is when the session was first established; Parked when it
	// was parked; Until the end of its window.
	Started, Parked, Until time.Time
	// Client and RemoteIP are the session's, as the sessions list shows
	// them.
	Client, RemoteIP string
	// BytesUp and BytesDown are what the session relayed before it was
	// parked (a held session's live counters are read from Held).
	BytesUp, BytesDown int64
	// CloseCode is the code of the client's close frame (1001 when its
	// connection dropped).
	CloseCode int
	// Held is the session kept open with its provider (nil without hold).
	Held *upstreams.Session
	// Shared tells that the entry is also in the shared store.
	Shared bool
	// Options are the session options it was made with, as bf_ query
	// items ("" when none): a resume keeps them.
	Options string
	// Refuse, when set, is why a resume of it is answered 409 (it cannot
	// be joined).
	Refuse string
	// Meter is the session's cost (so far, while its provider session
	// lives on; nil: none metered).
	Meter *spend.Meter
	// Data is the parker's own, given back with the entry.
	Data any

	reg    *Registry
	timer  queue.Timer
	expire func(*Parked)
}

// Park registers e until e.Until. When the window ends unclaimed, e leaves
// the registry and expire is called with it (in its own goroutine), to
// release what it holds. An entry already parked under the same token (a
// client that used one token for two sessions) is replaced: its window
// ends now.
func (r *Registry) Park(e *Parked, expire func(*Parked)) {
	r.parkedMu.Lock()
	var ended []*Parked
	for _, old := range []*Parked{r.parked[e.ID], r.byToken[e.Token]} {
		if old != nil && old != e && !slices.Contains(ended, old) {
			old.timer.Stop()
			old.removeLocked()
			ended = append(ended, old)
		}
	}
	e.reg, e.expire = r, expire
	e.addLocked()
	e.arm()
	r.parkedMu.Unlock()
	for _, old := range ended {
		if old.expire != nil {
			go old.expire(old)
		}
	}
}

// addLocked and removeLocked keep both indexes (parkedMu held).
func (e *Parked) addLocked() {
	r := e.reg
	r.parked[e.ID] = e
	if e.Token != "" {
		r.byToken[e.Token] = e
	}
}

func (e *Parked) removeLocked() {
	r := e.reg
	if r.parked[e.ID] == e {
		delete(r.parked, e.ID)
	}
	if r.byToken[e.Token] == e {
		delete(r.byToken, e.Token)
	}
}

// arm starts e's window timer (parkedMu held).
func (e *Parked) arm() {
	r := e.reg
	e.timer = r.clock.AfterFunc(e.Until.Sub(r.Now()), func() {
		r.parkedMu.Lock()
		if r.parked[e.ID] != e {
			r.parkedMu.Unlock()
			return
		}
		e.removeLocked()
		r.parkedMu.Unlock()
		if e.expire != nil {
			e.expire(e)
		}
	})
}

// ClaimParked takes the entry parked under the token hash out of the
// registry for a resume: only while its window runs and only with the key
// it was parked under. A wrong key leaves it in place. The caller gives it
// back with Unclaim when the resume cannot go on for a reason that is not
// the client's.
func (r *Registry) ClaimParked(token, key string) (*Parked, bool) {
	if token == "" {
		return nil, false
	}
	r.parkedMu.Lock()
	defer r.parkedMu.Unlock()
	e, ok := r.byToken[token]
	if !ok || e.Key != key || !r.Now().Before(e.Until) {
		return nil, false
	}
	e.removeLocked()
	e.timer.Stop()
	return e, true
}

// Unclaim puts back an entry ClaimParked took, for the rest of its window. It
// reports false, and calls its expire, when the window has ended
// meanwhile.
func (r *Registry) Unclaim(e *Parked) bool {
	r.parkedMu.Lock()
	e.reg = r // an entry taken from the shared store comes here first
	if !r.Now().Before(e.Until) {
		r.parkedMu.Unlock()
		if e.expire != nil {
			e.expire(e)
		}
		return false
	}
	e.addLocked()
	e.arm()
	r.parkedMu.Unlock()
	return true
}

// Unpark removes the entry id whatever its key (an operator ended it, or
// its held session ended on its own) and returns it; its expire is not
// called.
func (r *Registry) Unpark(id string) (*Parked, bool) {
	r.parkedMu.Lock()
	defer r.parkedMu.Unlock()
	e, ok := r.parked[id]
	if !ok {
		return nil, false
	}
	e.removeLocked()
	e.timer.Stop()
	return e, true
}

// UnparkToken removes the entry parked under the token hash, if it is
// shared (another node took it back through the shared store).
func (r *Registry) UnparkToken(token string) {
	r.parkedMu.Lock()
	defer r.parkedMu.Unlock()
	if e, ok := r.byToken[token]; ok && e.Shared {
		e.removeLocked()
		e.timer.Stop()
	}
}

// ParkedByID finds a parked entry, for the sessions list.
func (r *Registry) ParkedByID(id string) (Parked, bool) {
	r.parkedMu.Lock()
	defer r.parkedMu.Unlock()
	e, ok := r.parked[id]
	if !ok {
		return Parked{}, false
	}
	return *e, true
}

// ParkedSessions lists the parked entries, oldest first.
func (r *Registry) ParkedSessions() []Parked {
	r.parkedMu.Lock()
	out := make([]Parked, 0, len(r.parked))
	for _, e := range r.parked {
		out = append(out, *e)
	}
	r.parkedMu.Unlock()
	slices.SortFunc(out, func(a, b Parked) int {
		if c := a.Started.Compare(b.Started); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return out
}

// ParkedCount counts the parked entries, and those of them held open.
func (r *Registry) ParkedCount() (all, held int) {
	r.parkedMu.Lock()
	defer r.parkedMu.Unlock()
	for _, e := range r.parked {
		all++
		if e.Held != nil {
			held++
		}
	}
	return all, held
}

// ExpireAll ends every window now (the process is exiting): each entry
// leaves the registry and its expire runs before ExpireAll returns.
func (r *Registry) ExpireAll() {
	r.parkedMu.Lock()
	all := make([]*Parked, 0, len(r.parked))
	for _, e := range r.parked {
		e.timer.Stop()
		all = append(all, e)
	}
	for _, e := range all {
		e.removeLocked()
	}
	r.parkedMu.Unlock()
	for _, e := range all {
		if e.expire != nil {
			e.expire(e)
		}
	}
}

// ResumeKeyHash is how a resume key value is kept: the whole HMAC-SHA256
// keyed with the deployment's secret, hex (the same on every node). The
// value itself (a user id, a token) is never kept.
func (r *Registry) ResumeKeyHash(value string) string {
	return r.keyedHash("resume\x00", value)
}

// ResumeTokenHash is how a resume token is kept: like ResumeKeyHash, under
// a label of its own. Knowing the hash does not help to present the token.
func (r *Registry) ResumeTokenHash(token string) string {
	return r.keyedHash("resume token\x00", token)
}

func (r *Registry) keyedHash(label, value string) string {
	m := hmac.New(sha256.New, *r.keySecret.Load())
	m.Write([]byte(label))
	m.Write([]byte(value))
	return hex.EncodeToString(m.Sum(nil))
}

// DropParked ends the entry id now, as an operator asked: it leaves the
// registry and its expire runs (a held session is closed, a created
// provider session released).
func (r *Registry) DropParked(id string) (Parked, bool) {
	e, ok := r.Unpark(id)
	if !ok {
		return Parked{}, false
	}
	if e.expire != nil {
		e.expire(e)
	}
	return *e, true
}
