package pool

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/browserfailover/caddy-browser-failover/queue"
	"github.com/browserfailover/caddy-browser-failover/spend"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// The resume registry: sessions that ended from their client's side (its
// close frame, or its connection dropping) and that the client may take
// back within a window, with the resume token only it holds. The registry
// keeps a keyed hash of each token (Hashes.ResumeToken), never the token; an
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
	// Token is the keyed hash of the resume token (Hashes.ResumeToken): what
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
	// Recording is the ID of its recording ("": none): a resume goes on
	// with it.
	Recording string
	// Refuse, when set, is why a resume of it is answered 409 (it cannot
	// be joined).
	Refuse string
	// Meter is the session's cost (so far, while its provider session
	// lives on; nil: none metered).
	Meter *spend.Meter
	// Data is the parker's own, given back with the entry.
	Data any

	set    *ParkedSessions
	timer  queue.Timer
	expire func(*Parked)
}

// ParkedSessions are the parked sessions, by session ID and by token
// hash, each with its window's timer on the registry's clock.
type ParkedSessions struct {
	clock queue.Clock

	mu      sync.Mutex
	byID    map[string]*Parked
	byToken map[string]*Parked
}

func newParkedSessions(clock queue.Clock) *ParkedSessions {
	return &ParkedSessions{clock: clock, byID: map[string]*Parked{}, byToken: map[string]*Parked{}}
}

// Add registers e until e.Until. When the window ends unclaimed, e leaves
// the registry and expire is called with it (in its own goroutine), to
// release what it holds. An entry already parked under the same token (a
// client that used one token for two sessions) is replaced: its window
// ends now.
func (k *ParkedSessions) Add(e *Parked, expire func(*Parked)) {
	k.mu.Lock()
	var ended []*Parked
	for _, old := range []*Parked{k.byID[e.ID], k.byToken[e.Token]} {
		if old != nil && old != e && !slices.Contains(ended, old) {
			old.timer.Stop()
			old.removeLocked()
			ended = append(ended, old)
		}
	}
	e.set, e.expire = k, expire
	e.addLocked()
	e.arm()
	k.mu.Unlock()
	for _, old := range ended {
		if old.expire != nil {
			go old.expire(old)
		}
	}
}

// addLocked and removeLocked keep both indexes (mu held).
func (e *Parked) addLocked() {
	k := e.set
	k.byID[e.ID] = e
	if e.Token != "" {
		k.byToken[e.Token] = e
	}
}

func (e *Parked) removeLocked() {
	k := e.set
	if k.byID[e.ID] == e {
		delete(k.byID, e.ID)
	}
	if k.byToken[e.Token] == e {
		delete(k.byToken, e.Token)
	}
}

// arm starts e's window timer (mu held).
func (e *Parked) arm() {
	k := e.set
	e.timer = k.clock.AfterFunc(e.Until.Sub(k.clock.Now()), func() {
		k.mu.Lock()
		if k.byID[e.ID] != e {
			k.mu.Unlock()
			return
		}
		e.removeLocked()
		k.mu.Unlock()
		if e.expire != nil {
			e.expire(e)
		}
	})
}

// Claim takes the entry parked under the token hash out of the registry
// for a resume: only while its window runs and only with the key it was
// parked under. A wrong key leaves it in place. The caller gives it back
// with Unclaim when the resume cannot go on for a reason that is not the
// client's.
func (k *ParkedSessions) Claim(token, key string) (*Parked, bool) {
	if token == "" {
		return nil, false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.byToken[token]
	if !ok || e.Key != key || !k.clock.Now().Before(e.Until) {
		return nil, false
	}
	e.removeLocked()
	e.timer.Stop()
	return e, true
}

// Unclaim puts back an entry Claim took, for the rest of its window. It
// reports false, and calls its expire, when the window has ended
// meanwhile.
func (k *ParkedSessions) Unclaim(e *Parked) bool {
	k.mu.Lock()
	e.set = k // an entry taken from the shared store comes here first
	if !k.clock.Now().Before(e.Until) {
		k.mu.Unlock()
		if e.expire != nil {
			e.expire(e)
		}
		return false
	}
	e.addLocked()
	e.arm()
	k.mu.Unlock()
	return true
}

// Remove removes the entry id whatever its key (an operator ended it, or
// its held session ended on its own) and returns it; its expire is not
// called.
func (k *ParkedSessions) Remove(id string) (*Parked, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.byID[id]
	if !ok {
		return nil, false
	}
	e.removeLocked()
	e.timer.Stop()
	return e, true
}

// RemoveShared removes the entry parked under the token hash, if it is
// shared (another node took it back through the shared store).
func (k *ParkedSessions) RemoveShared(token string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if e, ok := k.byToken[token]; ok && e.Shared {
		e.removeLocked()
		e.timer.Stop()
	}
}

// ByID finds a parked entry, for the sessions list.
func (k *ParkedSessions) ByID(id string) (Parked, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.byID[id]
	if !ok {
		return Parked{}, false
	}
	return *e, true
}

// List lists the parked entries, oldest first.
func (k *ParkedSessions) List() []Parked {
	k.mu.Lock()
	out := make([]Parked, 0, len(k.byID))
	for _, e := range k.byID {
		out = append(out, *e)
	}
	k.mu.Unlock()
	slices.SortFunc(out, func(a, b Parked) int {
		if c := a.Started.Compare(b.Started); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return out
}

// Count counts the parked entries, and those of them held open.
func (k *ParkedSessions) Count() (all, held int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, e := range k.byID {
		all++
		if e.Held != nil {
			held++
		}
	}
	return all, held
}

// ExpireAll ends every window now (the process is exiting): each entry
// leaves the registry and its expire runs before ExpireAll returns.
func (k *ParkedSessions) ExpireAll() {
	k.mu.Lock()
	all := make([]*Parked, 0, len(k.byID))
	for _, e := range k.byID {
		e.timer.Stop()
		all = append(all, e)
	}
	for _, e := range all {
		e.removeLocked()
	}
	k.mu.Unlock()
	for _, e := range all {
		if e.expire != nil {
			e.expire(e)
		}
	}
}

// Drop ends the entry id now, as an operator asked: it leaves the
// registry and its expire runs (a held session is closed, a created
// provider session released).
func (k *ParkedSessions) Drop(id string) (Parked, bool) {
	e, ok := k.Remove(id)
	if !ok {
		return Parked{}, false
	}
	if e.expire != nil {
		e.expire(e)
	}
	return *e, true
}
