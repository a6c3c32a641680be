package pool

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/browserfailover/caddy-browser-failover/queue"
	"github.com/browserfailover/caddy-browser-failover/recordings"
)

// The recordings of CDP sessions (package recordings) as the registry
// keeps them: the stores the handlers record into (one per storage, kept
// while some handler uses it, so a reload keeps it), the recordings under
// way in this process, and one loop per process on the registry's clock
// that touches those (their metas' heartbeat) and tidies every store —
// closing the recordings of processes that died, deleting those past
// their retention —, at once when a store is first opened, then every
// recordings.TouchEvery. The admin API and the dashboard read recordings
// only through here (List, Meta, Frame, Video, Delete, Live, Newest).

// ErrRecordingLive is Delete's error for a recording under way.
var ErrRecordingLive = errors.New("the recording is under way: end its session first")

// Recordings is the registry's part for recordings.
type Recordings struct {
	clock queue.Clock

	mu     sync.Mutex
	stores map[string]*storeUse
	order  []string // store keys in the order they were opened
	live   map[string]*LiveRecording
	timer  queue.Timer
	// tidying: a pass is under way (passes do not overlap).
	tidying bool
}

// storeUse is one store and the handlers that use it.
type storeUse struct {
	s         *recordings.Store
	users     int
	retention time.Duration
}

// LiveRecording is a recording under way in this process.
type LiveRecording struct {
	*recordings.Recording
	// Session is its session's ID now (a resumed session goes on under
	// the first one's recording), Provider its provider.
	Session  string
	Provider string
	// Store is where it is written.
	Store *recordings.Store
}

func newRecordings(clock queue.Clock) *Recordings {
	return &Recordings{clock: clock, stores: map[string]*storeUse{}, live: map[string]*LiveRecording{}}
}

// Open takes a use of the store of storage st, known by key (the same
// storage configured again has the same key), whose recordings are kept
// for retention (0: forever; the newest handler's wins); release gives
// the use back. A store opened for the first time is tidied at once.
func (r *Recordings) Open(key string, st certmagic.Storage, retention time.Duration) (s *recordings.Store, release func()) {
	r.mu.Lock()
	u, ok := r.stores[key]
	if !ok {
		u = &storeUse{s: recordings.NewStore(st, r.clock.Now)}
		r.stores[key] = u
		r.order = append(r.order, key)
	}
	u.users++
	u.retention = retention
	if r.timer == nil {
		r.timer = r.clock.AfterFunc(recordings.TouchEvery, r.tick)
	}
	r.mu.Unlock()
	if !ok {
		go r.tidy(u)
	}
	var once sync.Once
	return u.s, func() {
		once.Do(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if u.users--; u.users == 0 {
				delete(r.stores, key)
				r.order = slices.DeleteFunc(r.order, func(k string) bool { return k == key })
			}
		})
	}
}

// tick is the loop's turn: live recordings touched, stores tidied.
func (r *Recordings) tick() {
	r.mu.Lock()
	live := r.liveLocked()
	uses := r.usesLocked()
	if len(uses) > 0 || len(live) > 0 {
		r.timer = r.clock.AfterFunc(recordings.TouchEvery, r.tick)
	} else {
		r.timer = nil
	}
	busy := r.tidying
	r.tidying = true
	r.mu.Unlock()
	if busy {
		return
	}
	go func() {
		for _, l := range live {
			l.Touch()
		}
		for _, u := range uses {
			r.tidyOne(u)
		}
		r.mu.Lock()
		r.tidying = false
		r.mu.Unlock()
	}()
}

// stop ends the loop (the registry's end).
func (r *Recordings) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
}

// tidy tidies one store (its first opening).
func (r *Recordings) tidy(u *storeUse) { r.tidyOne(u) }

func (r *Recordings) tidyOne(u *storeUse) {
	r.mu.Lock()
	retention := u.retention
	r.mu.Unlock()
	var expire time.Time
	if retention > 0 {
		expire = r.clock.Now().Add(-retention)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	u.s.Tidy(ctx, expire, r.isLive)
}

func (r *Recordings) isLive(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.live[id] != nil
}

func (r *Recordings) usesLocked() []*storeUse {
	out := make([]*storeUse, 0, len(r.order))
	for _, k := range r.order {
		out = append(out, r.stores[k])
	}
	return out
}

func (r *Recordings) liveLocked() []*LiveRecording {
	out := make([]*LiveRecording, 0, len(r.live))
	for _, l := range r.live {
		out = append(out, l)
	}
	return out
}

// Add lists a recording under way; Remove takes it off (its session's
// end).
func (r *Recordings) Add(l *LiveRecording) {
	r.mu.Lock()
	r.live[l.ID()] = l
	r.mu.Unlock()
}

// Remove takes recording l off the live list (when it is still l there).
func (r *Recordings) Remove(l *LiveRecording) {
	r.mu.Lock()
	if r.live[l.ID()] == l {
		delete(r.live, l.ID())
	}
	r.mu.Unlock()
}

// Live lists the recordings under way, oldest first.
func (r *Recordings) Live() []*LiveRecording {
	r.mu.Lock()
	out := r.liveLocked()
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b *LiveRecording) int {
		if c := a.Meta().Start.Compare(b.Meta().Start); c != 0 {
			return c
		}
		return compareStrings(a.ID(), b.ID())
	})
	return out
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// LiveOne is recording id if it is under way here.
func (r *Recordings) LiveOne(id string) (*LiveRecording, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l, ok := r.live[id]
	return l, ok
}

// Newest is the latest frame of target t of recording id under way here:
// its image, MIME type and time.
func (r *Recordings) Newest(id string, t int) (recordings.Newest, string, bool) {
	l, ok := r.LiveOne(id)
	if !ok {
		return recordings.Newest{}, "", false
	}
	n, ok := l.Newest(t)
	return n, recordings.ContentType(l.Meta().Format), ok
}

// stores are the stores open now.
func (r *Recordings) storesNow() []*recordings.Store {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*recordings.Store, 0, len(r.order))
	for _, k := range r.order {
		out = append(out, r.stores[k].s)
	}
	return out
}

// List lists the recordings of every store open, newest first, at most
// limit (0: all); one under way here shows its counts as of now.
func (r *Recordings) List(ctx context.Context, limit int) ([]recordings.Summary, error) {
	var all []recordings.Meta
	seen := map[string]bool{}
	var errs []error
	for _, s := range r.storesNow() {
		ms, err := s.List(ctx, 0)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, m := range ms {
			if !seen[m.ID] {
				seen[m.ID] = true
				if l, ok := r.LiveOne(m.ID); ok {
					m = l.Meta()
				}
				all = append(all, m)
			}
		}
	}
	slices.SortFunc(all, func(a, b recordings.Meta) int {
		if c := b.Start.Compare(a.Start); c != 0 {
			return c
		}
		return compareStrings(a.ID, b.ID)
	})
	if limit > 0 && len(all) > limit {
		all = all[:limit]
	}
	out := make([]recordings.Summary, len(all))
	for i, m := range all {
		out[i] = m.Summary()
	}
	if len(out) == 0 && len(errs) > 0 {
		return out, errors.Join(errs...)
	}
	return out, nil
}

// find is the store that holds recording id.
func (r *Recordings) find(ctx context.Context, id string) (*recordings.Store, recordings.Meta, error) {
	if l, ok := r.LiveOne(id); ok {
		return l.Store, l.Meta(), nil
	}
	for _, s := range r.storesNow() {
		m, err := s.Meta(ctx, id)
		if err == nil {
			return s, m, nil
		}
		if !errors.Is(err, recordings.ErrNotFound) {
			return nil, m, err
		}
	}
	return nil, recordings.Meta{}, recordings.ErrNotFound
}

// Meta is recording id's meta (as of now for one under way here).
func (r *Recordings) Meta(ctx context.Context, id string) (recordings.Meta, error) {
	_, m, err := r.find(ctx, id)
	return m, err
}

// Frame is frame n of target t of recording id: image and MIME type.
func (r *Recordings) Frame(ctx context.Context, id string, t, n int) ([]byte, string, error) {
	s, _, err := r.find(ctx, id)
	if err != nil {
		return nil, "", err
	}
	return s.Frame(ctx, id, t, n)
}

// Video makes target t of recording id into an MP4 file in dir
// (recordings.Store.Video); the caller removes it.
func (r *Recordings) Video(ctx context.Context, id string, t int, dir string) (string, error) {
	s, _, err := r.find(ctx, id)
	if err != nil {
		return "", err
	}
	return s.Video(ctx, id, t, dir)
}

// Delete deletes recording id (not one under way: ErrRecordingLive).
func (r *Recordings) Delete(ctx context.Context, id string) error {
	if _, live := r.LiveOne(id); live {
		return ErrRecordingLive
	}
	s, _, err := r.find(ctx, id)
	if err != nil {
		return err
	}
	return s.Delete(ctx, id)
}
