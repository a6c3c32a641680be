package pool

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/browserfailover/caddy-browser-failover/ledger"
	"github.com/browserfailover/caddy-browser-failover/queue"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// The ledger of created provider sessions (package ledger) is the
// registry's: one per process, opened by the first handler that has a
// provider with a session API, on that config's storage. From then on the
// process beats in it and reaps it: at once, then every reap interval
// (the smallest any handler asked for), and sooner when a gone owner's
// heartbeat is about to be old enough.

// DefaultReapInterval is how often the ledger is reaped when no handler
// says otherwise.
const DefaultReapInterval = time.Minute

// Adopter is how the reaper releases what was left at one provider: Adopt
// builds, for release, a session another process created and left behind
// (upstreams.Provider.Adopt); List, when set (reap_untracked), lists the
// provider's live sessions, so that those no ledger names are released
// too.
type Adopter struct {
	Adopt func(id, from string) *upstreams.Remote
	List  func(ctx context.Context) ([]string, error)
}

// untrackedOwner is the owner named for a released session that the
// provider listed and no ledger named.
const untrackedOwner = "untracked"

// LedgerKeeper is the registry's side of its ledger: it opens it, beats
// in it and reaps it on the registry's clock, and releases what it adopts
// through the newest handler's provider of that name (SetAdopter).
type LedgerKeeper struct {
	clock    queue.Clock
	releaser *upstreams.Releaser

	mu       sync.Mutex
	l        *ledger.Ledger
	every    time.Duration
	adopters map[string]Adopter // by provider name, the newest handler's
	// untracked is when each listed session that no ledger named was
	// first seen so, by provider and session ID.
	untracked map[string]map[string]time.Time
	// waiting counts, per provider, the gone owners' entries the last
	// reap found and could not take (no provider of that name in the
	// config, or a store error).
	waiting   map[string]int
	beatTimer queue.Timer
	reapTimer queue.Timer
	// reapAt is when the scheduled reap runs.
	reapAt time.Time
	// legacy, until what it holds has moved, is the ledger as an older
	// version kept it (LedgerOptions.Legacy).
	legacy  ledger.Legacy
	stopped bool
	// onError hears of what the ledger's store refused; onClose runs
	// when it closes.
	onError func(op string, err error)
	onClose func()
}

func newLedgerKeeper(clock queue.Clock, releaser *upstreams.Releaser) *LedgerKeeper {
	return &LedgerKeeper{clock: clock, releaser: releaser}
}

// LedgerOptions open the registry's ledger (LedgerKeeper.Open).
type LedgerOptions struct {
	// Store keeps the ledger: Caddy's storage, or Redis under state
	// redis (cluster.Store.Ledger).
	Store ledger.Store
	// Node names the process for operators.
	Node string
	// ReapEvery is how often to reap (0: DefaultReapInterval); the
	// smallest any handler asks for wins.
	ReapEvery time.Duration
	// Heartbeat and OwnerGone, when set, replace the ledger's defaults
	// (under state redis: lease_ttl/3 and lease_ttl).
	Heartbeat, OwnerGone time.Duration
	// OnError (nil: none) hears of what the store refused.
	OnError func(op string, err error)
	// OnClose (nil: none) runs when the ledger closes with the registry
	// (the Redis store's use is given back).
	OnClose func()
	// Legacy (nil: none), under state redis, is the ledger as versions
	// before its hash layout kept it: after each reap, until it holds
	// nothing more to move, the entries of gone owners found there are
	// moved to Store and reaped (ledger.Ledger.MoveLegacy).
	Legacy ledger.Legacy
}

// Open opens the registry's ledger the first time it is called, and
// starts its heartbeat and its reaper; it reports whether this call opened
// it. Later calls only lower the reap interval.
func (ls *LedgerKeeper) Open(o LedgerOptions) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	every := o.ReapEvery
	if every <= 0 {
		every = DefaultReapInterval
	}
	if ls.l != nil {
		if every < ls.every {
			ls.every = every
			ls.scheduleLocked(ls.clock.Now().Add(every))
		}
		return false
	}
	ls.l = ledger.New(o.Store, o.Node, ls.clock.Now)
	if o.Heartbeat > 0 && o.OwnerGone > 0 {
		ls.l.SetTiming(o.Heartbeat, o.OwnerGone)
	}
	ls.every, ls.onError, ls.onClose, ls.legacy = every, o.OnError, o.OnClose, o.Legacy
	ls.adopters = map[string]Adopter{}
	ls.waiting = map[string]int{}
	ls.untracked = map[string]map[string]time.Time{}
	ls.releaser.Ledger = ls.l
	// The first heartbeat before any entry: an owner without one is
	// gone to every other process.
	beatOnce(ls.l, ls.onError)
	ls.scheduleBeatLocked()
	ls.scheduleLocked(ls.clock.Now())
	return true
}

// Opened is the registry's ledger, nil until a handler opened it.
func (ls *LedgerKeeper) Opened() *ledger.Ledger {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.l
}

// SetAdopter makes a the way to release the sessions left at provider
// name (the newest handler's provider of that name).
func (ls *LedgerKeeper) SetAdopter(name string, a Adopter) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.adopters == nil {
		return
	}
	ls.adopters[name] = a
	// A provider back in the config: what waited for it goes now.
	if ls.waiting[name] > 0 {
		ls.scheduleLocked(ls.clock.Now())
	}
}

// Pending is the number of entries of provider name not confirmed
// released: this process's own (live sessions included) and the ones of
// gone owners it found and has not taken yet; false while the ledger is
// not open.
func (ls *LedgerKeeper) Pending(name string) (int, bool) {
	ls.mu.Lock()
	l, waiting := ls.l, ls.waiting[name]
	ls.mu.Unlock()
	if l == nil {
		return 0, false
	}
	return l.PendingOf(name) + waiting, true
}

func (ls *LedgerKeeper) beat() {
	ls.mu.Lock()
	l, onError, stopped := ls.l, ls.onError, ls.stopped
	ls.mu.Unlock()
	if stopped {
		return
	}
	// The store's I/O runs without the lock: a status read never waits
	// for a slow storage.
	if beatOnce(l, onError) && l.Removing() > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), l.HeartbeatEvery())
		if err := l.RetryRemovals(ctx); err != nil && onError != nil {
			onError("remove", err)
		}
		cancel()
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.scheduleBeatLocked()
}

// Reassert writes the ledger's heartbeat and this process's entries
// again (the shared store lost writes in a failover, or came back empty),
// telling the ledger's onError of a failure; nothing while no ledger is
// open.
func (ls *LedgerKeeper) Reassert() {
	ls.mu.Lock()
	l, onError, stopped := ls.l, ls.onError, ls.stopped
	ls.mu.Unlock()
	if l == nil || stopped {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*l.HeartbeatEvery())
	defer cancel()
	if err := l.Reassert(ctx); err != nil && onError != nil {
		onError("reassert", err)
	}
}

// beatOnce refreshes l's heartbeat, telling onError of a failure; it
// reports whether the store took it.
func beatOnce(l *ledger.Ledger, onError func(op string, err error)) bool {
	ctx, cancel := context.WithTimeout(context.Background(), l.HeartbeatEvery())
	err := l.Beat(ctx)
	cancel()
	if err != nil && onError != nil {
		onError("heartbeat", err)
	}
	return err == nil
}

// scheduleBeatLocked makes the next heartbeat run a period from now.
func (ls *LedgerKeeper) scheduleBeatLocked() {
	if !ls.stopped {
		ls.beatTimer = ls.clock.AfterFunc(ls.l.HeartbeatEvery(), ls.beat)
	}
}

// scheduleLocked makes the next reap run at t, unless one runs sooner.
func (ls *LedgerKeeper) scheduleLocked(t time.Time) {
	if ls.stopped {
		return
	}
	if ls.reapTimer != nil && !ls.reapAt.IsZero() && !t.Before(ls.reapAt) {
		return
	}
	if ls.reapTimer != nil {
		ls.reapTimer.Stop()
	}
	ls.reapAt = t
	ls.reapTimer = ls.clock.AfterFunc(max(t.Sub(ls.clock.Now()), 0), ls.reap)
}

// reap adopts and releases the entries of gone owners, then schedules
// the next reap.
func (ls *LedgerKeeper) reap() {
	ls.mu.Lock()
	l, stopped := ls.l, ls.stopped
	ls.reapAt = time.Time{}
	ls.mu.Unlock()
	if stopped {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	orphans, next, err := l.Orphans(ctx)
	if err != nil && ls.onError != nil {
		ls.onError("reap", err)
	}
	waiting := map[string]int{}
	for _, e := range orphans {
		if err := upstreams.CheckSessionID(e.ID); err != nil {
			// No create answer gives such an ID (an older version's entry,
			// or one written by hand): its release call could go
			// elsewhere. It stays, for an operator to release.
			waiting[e.Provider]++
			if ls.onError != nil {
				ls.onError("reap", fmt.Errorf("ledger: an entry of provider %q from owner %s is not released: %w", e.Provider, e.Owner, err))
			}
			continue
		}
		ls.mu.Lock()
		adopt := ls.adopters[e.Provider].Adopt
		ls.mu.Unlock()
		if adopt == nil {
			waiting[e.Provider]++
			continue
		}
		a, ok, err := l.Adopt(ctx, e)
		if err != nil {
			if ls.onError != nil {
				ls.onError("adopt", err)
			}
			if !ok {
				waiting[e.Provider]++
				continue
			}
		}
		if !ok {
			continue // another process took it
		}
		if rem := adopt(a.ID, a.From); rem != nil {
			rem.Release()
		}
	}
	ls.reapUntracked(ctx, l)
	moved := ls.moveLegacy(l)
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.waiting = waiting
	at := ls.clock.Now().Add(ls.every)
	if moved {
		at = ls.clock.Now() // what moved is reaped now
	}
	if !next.IsZero() && next.Before(at) {
		// An owner is gone then: reap it right away, not a whole
		// interval later.
		at = next.Add(100 * time.Millisecond)
	}
	ls.scheduleLocked(at)
}

// legacyMoveTimeout bounds one pass over the ledger's old layout (a walk
// of the keyspace, in calls of their own timeout).
const legacyMoveTimeout = 10 * time.Minute

// moveLegacy moves what the ledger's old layout holds of gone owners into
// the ledger, until a pass finds nothing more to move; it reports whether
// it moved an entry (to be reaped now).
func (ls *LedgerKeeper) moveLegacy(l *ledger.Ledger) bool {
	ls.mu.Lock()
	old, stopped := ls.legacy, ls.stopped
	ls.mu.Unlock()
	if old == nil || stopped {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), legacyMoveTimeout)
	moved, left, err := l.MoveLegacy(ctx, old)
	cancel()
	if err != nil && ls.onError != nil {
		ls.onError("move old entries", err)
	}
	if !left {
		ls.mu.Lock()
		ls.legacy = nil
		ls.mu.Unlock()
	}
	return moved > 0
}

// reapUntracked releases, at every provider that lists its sessions
// (reap_untracked), those that no ledger entry names and that were found
// so at least one reap interval before: a session whose create call is
// still under way is not in a ledger yet, and is never taken for one. A
// released one is first written to the ledger as this process's, so that
// its release is followed like any other.
func (ls *LedgerKeeper) reapUntracked(ctx context.Context, l *ledger.Ledger) {
	ls.mu.Lock()
	lists := map[string]Adopter{}
	for name, a := range ls.adopters {
		if a.List != nil {
			lists[name] = a
		}
	}
	every := ls.every
	ls.mu.Unlock()
	for name, a := range lists {
		ids, err := a.List(ctx)
		if err == nil {
			var known map[string]bool
			if known, err = l.Known(ctx, name); err == nil {
				ls.untrackedOf(ctx, l, name, a, ids, known, every)
				continue
			}
		}
		if ls.onError != nil {
			ls.onError("list "+name, err)
		}
	}
}

func (ls *LedgerKeeper) untrackedOf(ctx context.Context, l *ledger.Ledger, name string, a Adopter, ids []string, known map[string]bool, every time.Duration) {
	now := ls.clock.Now()
	ls.mu.Lock()
	first := ls.untracked[name]
	if first == nil {
		first = map[string]time.Time{}
		ls.untracked[name] = first
	}
	var due []string
	listed := map[string]bool{}
	var refused []error
	for _, id := range ids {
		if err := upstreams.CheckSessionID(id); err != nil {
			refused = append(refused, err) // never released: its release call could go elsewhere
			continue
		}
		listed[id] = true
		if known[id] {
			delete(first, id)
			continue
		}
		t0, seen := first[id]
		switch {
		case !seen:
			first[id] = now
		case now.Sub(t0) >= every:
			due = append(due, id)
			delete(first, id)
		}
	}
	for id := range first {
		if !listed[id] {
			delete(first, id) // gone meanwhile
		}
	}
	ls.mu.Unlock()
	if len(refused) > 0 && ls.onError != nil {
		ls.onError("list "+name, fmt.Errorf("%d listed sessions not released, the first: %w", len(refused), refused[0]))
	}
	for _, id := range due {
		if err := l.Record(ctx, name, id); err != nil {
			if ls.onError != nil {
				ls.onError("record untracked", err)
			}
			continue
		}
		if rem := a.Adopt(id, untrackedOwner); rem != nil {
			rem.Release()
		}
	}
}

// close stops the heartbeat and the reaper, and takes this process out
// of the ledger when it holds no entry.
func (ls *LedgerKeeper) close() {
	ls.mu.Lock()
	l := ls.l
	ls.stopped = true
	if ls.beatTimer != nil {
		ls.beatTimer.Stop()
	}
	if ls.reapTimer != nil {
		ls.reapTimer.Stop()
	}
	ls.mu.Unlock()
	if l != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		l.Leave(ctx)
		cancel()
		if ls.onClose != nil {
			ls.onClose()
		}
	}
}
