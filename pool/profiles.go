package pool

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/profiles"
	"github.com/browserfailover/caddy-browser-failover/queue"
)

// The browser profiles as the registry keeps them: which profiles the
// sessions of this process use (one session a profile, and, under shared
// state, one on every node: a lock in Redis beside the local one), the
// clients waiting for one, and the storages the handlers keep profiles in
// (kept while some handler uses one), which the admin API and the
// dashboard list. A profile in use is a ProfileHold, which a client's
// ticket holds (Ticket.TakeProfile) and gives back with everything else.
// The key profiles are sealed with never reaches the registry: listing
// and deleting need none.

// Profile errors.
var (
	// ErrProfileInUse: another session uses the profile, and the wait for
	// it is over.
	ErrProfileInUse = errors.New("the profile is in use by another session")
	// ErrProfileStateDown: the shared state cannot be asked, and the
	// handler rejects what it cannot check there (on_unavailable reject).
	ErrProfileStateDown = errors.New("the shared state cannot be asked whether the profile is in use")
)

// sharedPoll is how often a client waiting for a profile that another
// node's session uses asks again (besides the news of its release).
const sharedPoll = 500 * time.Millisecond

// Profiles is the registry's part for browser profiles.
type Profiles struct {
	clock queue.Clock

	mu   sync.Mutex
	used map[profiles.Name]bool
	// waiting are the channels of the clients waiting for a profile,
	// closed when it may be free (given back here, or on another node).
	waiting map[profiles.Name][]chan struct{}
	// storages are the storages handlers keep profiles in, by key, and
	// the shared stores that know which profiles other nodes use.
	storages map[string]*profileStorage
	order    []string
	shared   map[*cluster.Shared]int
}

// profileStorage is one storage and the handlers that use it.
type profileStorage struct {
	st    certmagic.Storage
	users int
}

func newProfiles(clock queue.Clock) *Profiles {
	return &Profiles{clock: clock, used: map[profiles.Name]bool{}, waiting: map[profiles.Name][]chan struct{}{},
		storages: map[string]*profileStorage{}, shared: map[*cluster.Shared]int{}}
}

// ProfileHold is one profile in use by a session of this process: its
// local lock and, under shared state, its lock in Redis. Release gives
// both back, once.
type ProfileHold struct {
	p    *Profiles
	name profiles.Name
	lock *cluster.ProfileLock
	once sync.Once
}

// Name is the profile held.
func (h *ProfileHold) Name() profiles.Name { return h.name }

// Release gives the profile back: a client waiting for it here may take
// it, and under shared state every node hears of it. Safe on nil and to
// call twice.
func (h *ProfileHold) Release() {
	if h == nil {
		return
	}
	h.once.Do(func() {
		h.lock.Release()
		h.p.mu.Lock()
		delete(h.p.used, h.name)
		h.p.wakeLocked(h.name)
		h.p.mu.Unlock()
	})
}

// lockName is a profile's name in the shared state: its scope's folder
// and its ID.
func lockName(n profiles.Name) string { return n.Scope + "/" + n.ID }

// Take takes profile n for a session, waiting up to wait while another
// session uses it: ErrProfileInUse when the wait is over first, ctx's
// error when the client leaves. shared, when not nil, is the handler's
// shared state: the profile is taken there too, so no session on another
// node uses it; while it cannot be asked, the profile is taken here only,
// unless reject (on_unavailable reject): then ErrProfileStateDown.
func (p *Profiles) Take(ctx context.Context, n profiles.Name, wait time.Duration, shared *cluster.Shared, reject bool) (*ProfileHold, error) {
	var deadline time.Time
	if wait > 0 {
		deadline = p.clock.Now().Add(wait)
	}
	for {
		ch := make(chan struct{})
		p.mu.Lock()
		free := !p.used[n]
		if free {
			p.used[n] = true
		} else {
			p.waiting[n] = append(p.waiting[n], ch)
		}
		p.mu.Unlock()
		remote := false
		if free {
			h := &ProfileHold{p: p, name: n}
			if shared == nil {
				return h, nil
			}
			if !shared.Usable() {
				if reject {
					h.Release()
					return nil, ErrProfileStateDown
				}
				return h, nil
			}
			l, ok, err := shared.Store().Profiles().Take(ctx, lockName(n))
			switch {
			case err != nil && errors.Is(err, cluster.ErrUnavailable):
				shared.Failed("take the lock of a profile", err)
				if reject {
					h.Release()
					return nil, ErrProfileStateDown
				}
				return h, nil
			case err != nil:
				h.Release()
				return nil, err
			case ok:
				shared.Worked()
				h.lock = l
				return h, nil
			}
			// Another node's session uses it.
			shared.Worked()
			p.mu.Lock()
			delete(p.used, n)
			p.wakeLocked(n)
			p.waiting[n] = append(p.waiting[n], ch)
			p.mu.Unlock()
			remote = true
		}
		now := p.clock.Now()
		if deadline.IsZero() || !now.Before(deadline) {
			p.forget(n, ch)
			return nil, ErrProfileInUse
		}
		d := deadline.Sub(now)
		if remote {
			d = min(d, sharedPoll)
		}
		t := p.clock.AfterFunc(d, func() { p.wake(n, ch) })
		select {
		case <-ch:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			p.forget(n, ch)
			return nil, ctx.Err()
		}
	}
}

// Wake tells the clients waiting for profile n that it may be free (the
// news that another node gave it back).
func (p *Profiles) Wake(n profiles.Name) {
	p.mu.Lock()
	p.wakeLocked(n)
	p.mu.Unlock()
}

// wake closes ch, one waiter's channel of n, if it still waits.
func (p *Profiles) wake(n profiles.Name, ch chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.forgetLocked(n, ch) {
		close(ch)
	}
}

// wakeLocked closes the channels of every client waiting for n.
func (p *Profiles) wakeLocked(n profiles.Name) {
	for _, ch := range p.waiting[n] {
		close(ch)
	}
	delete(p.waiting, n)
}

// forget takes ch off n's waiting clients.
func (p *Profiles) forget(n profiles.Name, ch chan struct{}) {
	p.mu.Lock()
	p.forgetLocked(n, ch)
	p.mu.Unlock()
}

func (p *Profiles) forgetLocked(n profiles.Name, ch chan struct{}) bool {
	w := p.waiting[n]
	i := slices.Index(w, ch)
	if i < 0 {
		return false
	}
	w = slices.Delete(w, i, i+1)
	if len(w) == 0 {
		delete(p.waiting, n)
	} else {
		p.waiting[n] = w
	}
	return true
}

// InUseHere reports whether a session of this process uses profile n.
func (p *Profiles) InUseHere(n profiles.Name) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used[n]
}

// Waiting counts the clients waiting for a profile here.
func (p *Profiles) Waiting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, w := range p.waiting {
		n += len(w)
	}
	return n
}

// Open takes a use of storage st, known by key (the same storage
// configured again has the same key), and of shared (nil: none), whose
// locks say which profiles other nodes use; release gives both back.
func (p *Profiles) Open(key string, st certmagic.Storage, shared *cluster.Shared) (release func()) {
	p.mu.Lock()
	u, ok := p.storages[key]
	if !ok {
		u = &profileStorage{st: st}
		p.storages[key] = u
		p.order = append(p.order, key)
	}
	u.users++
	if shared != nil {
		p.shared[shared]++
	}
	p.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if u.users--; u.users == 0 {
				delete(p.storages, key)
				p.order = slices.DeleteFunc(p.order, func(k string) bool { return k == key })
			}
			if shared != nil {
				if p.shared[shared]--; p.shared[shared] <= 0 {
					delete(p.shared, shared)
				}
			}
		})
	}
}

// StoredProfile is a stored profile as the admin API lists it: never its
// content.
type StoredProfile struct {
	profiles.Entry
	// InUse: a session uses it now (here, or on another node under
	// shared state).
	InUse bool
}

// List lists the profiles of every storage in use, the storages in the
// order they were opened (a profile kept in two storages is listed
// twice).
func (p *Profiles) List(ctx context.Context) ([]StoredProfile, error) {
	p.mu.Lock()
	sts := make([]certmagic.Storage, 0, len(p.order))
	for _, k := range p.order {
		sts = append(sts, p.storages[k].st)
	}
	p.mu.Unlock()
	var out []StoredProfile
	for _, st := range sts {
		list, err := profiles.List(ctx, st)
		if err != nil {
			return nil, err
		}
		for _, e := range list {
			out = append(out, StoredProfile{Entry: e})
		}
	}
	names := make([]profiles.Name, len(out))
	for i, e := range out {
		names[i] = e.Name
	}
	in := p.inUse(ctx, names)
	for i := range out {
		out[i].InUse = in[out[i].Name]
	}
	return out, nil
}

// inUse says which of names a session uses: here, or, as the shared
// states say, on another node.
func (p *Profiles) inUse(ctx context.Context, names []profiles.Name) map[profiles.Name]bool {
	out := map[profiles.Name]bool{}
	p.mu.Lock()
	for _, n := range names {
		if p.used[n] {
			out[n] = true
		}
	}
	shared := make([]*cluster.Shared, 0, len(p.shared))
	for s := range p.shared {
		shared = append(shared, s)
	}
	p.mu.Unlock()
	if len(names) == 0 {
		return out
	}
	ln := make([]string, len(names))
	for i, n := range names {
		ln[i] = lockName(n)
	}
	for _, s := range shared {
		if !s.Usable() {
			continue
		}
		in, err := s.Store().Profiles().InUse(ctx, ln)
		if err != nil {
			s.Failed("read the locks of profiles", err)
			continue
		}
		for i, n := range names {
			if in[ln[i]] {
				out[n] = true
			}
		}
	}
	return out
}

// Delete removes the stored profile n from every storage in use:
// ErrProfileInUse while a session uses it, profiles.ErrNotFound when no
// storage holds it.
func (p *Profiles) Delete(ctx context.Context, n profiles.Name) error {
	if p.inUse(ctx, []profiles.Name{n})[n] {
		return ErrProfileInUse
	}
	p.mu.Lock()
	sts := make([]certmagic.Storage, 0, len(p.order))
	for _, k := range p.order {
		sts = append(sts, p.storages[k].st)
	}
	p.mu.Unlock()
	found := false
	for _, st := range sts {
		switch err := profiles.Delete(ctx, st, n); {
		case err == nil:
			found = true
		case !errors.Is(err, profiles.ErrNotFound):
			return err
		}
	}
	if !found {
		return profiles.ErrNotFound
	}
	return nil
}
