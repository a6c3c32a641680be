// Package ledger keeps the provider sessions a gateway created over a
// session API until their release is confirmed, in a store that outlives
// the process (Caddy's configured storage), and finds the ones whose owner
// is gone so that a surviving or restarted process releases them.
//
// Each process is one owner, with an ID of its own, and keeps a heartbeat
// in the store. An entry is written before the session's connect URL is
// dialed and removed once the provider confirmed its release, so after a
// crash (kill -9, an OOM kill, a lost machine) the store still names every
// session the process had not released. Another process reaps an entry
// once its owner's heartbeat is older than OwnerGone: it adopts it first
// (moves it under its own name, under a lock, so two reapers never both
// take one), then releases it like one of its own. An entry names the
// node, the provider, the provider's session ID and when it was created;
// never a credential, a header or a body.
package ledger

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
	"sync"
	"time"
)

// Store is what the ledger needs of a storage: the part of Caddy's
// certmagic.Storage it uses.
type Store interface {
	Store(ctx context.Context, key string, value []byte) error
	Load(ctx context.Context, key string) ([]byte, error)
	Delete(ctx context.Context, key string) error
	List(ctx context.Context, prefix string, recursive bool) ([]string, error)
	Lock(ctx context.Context, name string) error
	Unlock(ctx context.Context, name string) error
}

// Timing of owners by default: a process refreshes its heartbeat every
// Heartbeat; an owner whose heartbeat is older than OwnerGone (or who has
// none) is gone. A ledger shared by nodes that already agree on a lease
// time sets its own (SetTiming).
const (
	Heartbeat = 5 * time.Second
	OwnerGone = 15 * time.Second
)

// Where the ledger keeps its keys in the store.
const (
	root      = "browser_failover/ledger"
	ownersDir = root + "/owners"
	entryDir  = root + "/entries"
	lockName  = "browser_failover_ledger_"
)

// Entry is one provider session created and not yet known to be released.
type Entry struct {
	// Owner is the ID of the process that holds it.
	Owner string `json:"owner"`
	// Node is the owner's node name, for operators.
	Node string `json:"node"`
	// Provider is the provider's name in the config.
	Provider string `json:"provider"`
	// ID is the provider's session ID.
	ID string `json:"session_id"`
	// Created is when the provider answered the create call.
	Created time.Time `json:"created"`
	// From is the owner the entry was adopted from ("" when its owner
	// created it).
	From string `json:"adopted_from,omitempty"`
}

// heartbeat is an owner's record.
type heartbeat struct {
	Node string    `json:"node"`
	Seen time.Time `json:"seen"`
}

// Ledger is one process's side of the ledger.
type Ledger struct {
	store Store
	owner string
	node  string
	now   func() time.Time

	// beat and gone are the heartbeat's period and the age at which an
	// owner is gone.
	beat, gone time.Duration

	mu sync.Mutex
	// pending counts, per provider, the entries this process holds.
	pending map[string]int
	// mine are those entries, by key, so that they can be written again
	// (Reassert).
	mine map[string]Entry
	// removing are the keys of entries done with (released, or adopted
	// from a gone owner) that the store refused to delete: deleted again
	// by RetryRemovals.
	removing map[string]bool
}

// New returns the ledger of a process named node (for operators) on store;
// now is its clock (nil: the real one). It writes nothing until Beat.
func New(store Store, node string, now func() time.Time) *Ledger {
	if now == nil {
		now = time.Now
	}
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return &Ledger{store: store, owner: hex.EncodeToString(b), node: node, now: now,
		beat: Heartbeat, gone: OwnerGone, pending: map[string]int{}, mine: map[string]Entry{},
		removing: map[string]bool{}}
}

// SetTiming sets the heartbeat's period and the age at which an owner is
// gone (beat must be well under gone); call it before the first Beat.
func (l *Ledger) SetTiming(beat, gone time.Duration) { l.beat, l.gone = beat, gone }

// HeartbeatEvery is how often the owner must Beat.
func (l *Ledger) HeartbeatEvery() time.Duration { return l.beat }

// Owner is this process's owner ID.
func (l *Ledger) Owner() string { return l.owner }

// entryKey is where the entry of provider's session id lives under owner:
// a hash, since names and IDs may hold any character.
func entryKey(owner, provider, id string) string {
	sum := sha256.Sum256([]byte(provider + "\x00" + id))
	return path.Join(entryDir, owner, hex.EncodeToString(sum[:16]))
}

// Beat refreshes this process's heartbeat.
func (l *Ledger) Beat(ctx context.Context) error {
	b, _ := json.Marshal(heartbeat{Node: l.node, Seen: l.now().UTC()})
	return l.store.Store(ctx, path.Join(ownersDir, l.owner), b)
}

// Record writes the entry of a session provider just created, before its
// connect URL is dialed. An error means the entry is not kept: the caller
// releases the session and does not dial it.
func (l *Ledger) Record(ctx context.Context, provider, id string) error {
	e := Entry{Owner: l.owner, Node: l.node, Provider: provider, ID: id, Created: l.now().UTC()}
	if err := l.put(ctx, e); err != nil {
		return err
	}
	l.hold(e)
	return nil
}

func (l *Ledger) put(ctx context.Context, e Entry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if err := l.store.Store(ctx, entryKey(e.Owner, e.Provider, e.ID), b); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	return nil
}

// hold counts e as this process's.
func (l *Ledger) hold(e Entry) {
	k := entryKey(e.Owner, e.Provider, e.ID)
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.mine[k]; ok {
		return
	}
	l.mine[k] = e
	l.pending[e.Provider]++
	delete(l.removing, k)
}

// drop no longer counts the entry of provider's session id.
func (l *Ledger) drop(provider, id string) {
	k := entryKey(l.owner, provider, id)
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.mine[k]; !ok {
		return
	}
	delete(l.mine, k)
	l.pending[provider]--
	if l.pending[provider] <= 0 {
		delete(l.pending, provider)
	}
}

// Reassert writes this process's heartbeat and every entry it holds again:
// after the store lost writes (a Redis failover to a replica that had not
// received them), the ledger names again every session this process must
// release, and this process is not taken for gone.
func (l *Ledger) Reassert(ctx context.Context) error {
	if err := l.Beat(ctx); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	l.mu.Lock()
	entries := make([]Entry, 0, len(l.mine))
	for _, e := range l.mine {
		entries = append(entries, e)
	}
	l.mu.Unlock()
	for _, e := range entries {
		if err := l.put(ctx, e); err != nil {
			return err
		}
	}
	return nil
}

// Remove deletes the entry of a session whose release the provider
// confirmed. A session this process holds no entry of is left alone. The
// session is no longer pending either way; an entry the store refused to
// delete is deleted again by RetryRemovals (and, should the process end
// first, the reaper's second release of it is answered as released).
func (l *Ledger) Remove(ctx context.Context, provider, id string) error {
	k := entryKey(l.owner, provider, id)
	err := l.store.Delete(ctx, k)
	l.mu.Lock()
	_, held := l.mine[k]
	if err != nil && held {
		l.removing[k] = true
	}
	l.mu.Unlock()
	l.drop(provider, id)
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	return nil
}

// RetryRemovals deletes again the entries the store refused to delete
// (see Remove and Adopt); those it refuses again are kept for the next
// call.
func (l *Ledger) RetryRemovals(ctx context.Context) error {
	l.mu.Lock()
	keys := make([]string, 0, len(l.removing))
	for k := range l.removing {
		keys = append(keys, k)
	}
	l.mu.Unlock()
	var errs []error
	for _, k := range keys {
		if err := l.store.Delete(ctx, k); err != nil {
			errs = append(errs, err)
			continue
		}
		l.mu.Lock()
		delete(l.removing, k)
		l.mu.Unlock()
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ledger: %d entries not deleted: %w", len(errs), err)
	}
	return nil
}

// Removing is the number of entries done with that the store has not
// deleted yet (RetryRemovals).
func (l *Ledger) Removing() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.removing)
}

// PendingOf is the number of entries this process holds for provider.
func (l *Ledger) PendingOf(provider string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending[provider]
}

// Pending is the number of entries this process holds, per provider: the
// sessions it created or adopted whose release is not confirmed yet.
func (l *Ledger) Pending() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int, len(l.pending))
	for k, v := range l.pending {
		out[k] = v
	}
	return out
}

// Orphans returns the entries of every owner that is gone (its heartbeat
// older than the gone age), oldest first,
// and, when some other owner is still alive but holds entries, the
// earliest time one of them could be gone (zero when none).
func (l *Ledger) Orphans(ctx context.Context) (orphans []Entry, next time.Time, err error) {
	owners, err := l.list(ctx, entryDir)
	if err != nil {
		return nil, time.Time{}, err
	}
	now := l.now()
	var errs []error
	for _, owner := range owners {
		if owner == l.owner {
			continue
		}
		seen, err := l.lastSeen(ctx, l.store, owner)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if gone := seen.Add(l.gone); now.Before(gone) {
			if next.IsZero() || gone.Before(next) {
				next = gone
			}
			continue
		}
		entries, err := l.entriesOf(ctx, owner)
		if err != nil {
			errs = append(errs, err)
		}
		orphans = append(orphans, entries...)
	}
	sort.Slice(orphans, func(i, j int) bool { return orphans[i].Created.Before(orphans[j].Created) })
	return orphans, next, errors.Join(errs...)
}

// Known returns the session IDs of provider that some entry names, under
// any owner, alive or gone.
func (l *Ledger) Known(ctx context.Context, provider string) (map[string]bool, error) {
	owners, err := l.list(ctx, entryDir)
	if err != nil {
		return nil, err
	}
	known := map[string]bool{}
	for _, owner := range owners {
		entries, err := l.entriesOf(ctx, owner)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if e.Provider == provider {
				known[e.ID] = true
			}
		}
	}
	return known, nil
}

// entriesOf returns the entries the store holds under owner: those it
// can read, with an error naming the others.
func (l *Ledger) entriesOf(ctx context.Context, owner string) ([]Entry, error) {
	keys, err := l.list(ctx, path.Join(entryDir, owner))
	if err != nil {
		return nil, err
	}
	var out []Entry
	var errs []error
	for _, k := range keys {
		e, err := l.load(ctx, l.store, path.Join(entryDir, owner, k))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, e)
	}
	return out, errors.Join(errs...)
}

// lastSeen is when owner last beat (zero when it never did, or its
// record is unreadable: it is then gone).
func (l *Ledger) lastSeen(ctx context.Context, st interface {
	Load(context.Context, string) ([]byte, error)
}, owner string) (time.Time, error) {
	b, err := st.Load(ctx, path.Join(ownersDir, owner))
	if errors.Is(err, fs.ErrNotExist) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("ledger: owner %s: %w", owner, err)
	}
	var hb heartbeat
	if json.Unmarshal(b, &hb) != nil {
		return time.Time{}, nil
	}
	return hb.Seen, nil
}

// list returns the names directly under dir (none when it does not exist).
func (l *Ledger) list(ctx context.Context, dir string) ([]string, error) {
	keys, err := l.store.List(ctx, dir, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	names := make([]string, 0, len(keys))
	for _, k := range keys {
		names = append(names, path.Base(strings.TrimSuffix(k, "/")))
	}
	return names, nil
}

// load reads the entry at key of st. What is not an entry written there
// (unreadable, without a provider or an ID, or naming another owner or
// session than its key does) is refused: the ledger acts on an entry only
// at the key it names, so adopting or deleting one never reaches a key
// the entry's content chose.
func (l *Ledger) load(ctx context.Context, st interface {
	Load(context.Context, string) ([]byte, error)
}, key string) (Entry, error) {
	b, err := st.Load(ctx, key)
	if err != nil {
		return Entry{}, err
	}
	var e Entry
	if err := json.Unmarshal(b, &e); err != nil || e.Provider == "" || e.ID == "" ||
		entryKey(e.Owner, e.Provider, e.ID) != key {
		return Entry{}, fmt.Errorf("ledger: %s: %w", key, errNotEntry)
	}
	return e, nil
}

// errNotEntry is the cause of a value that is not an entry written at
// its key.
var errNotEntry = errors.New("not an entry")

// Adopt takes e over from its gone owner: under a lock of the store, when
// the entry is still there, it is written under this process's name and
// removed from its owner's. Only one process adopts an entry; ok is false
// when another did (or released it) first. The adopted entry is then this
// process's, released and removed like one it created.
func (l *Ledger) Adopt(ctx context.Context, e Entry) (adopted Entry, ok bool, err error) {
	adopted, ok, err = l.adopt(ctx, e)
	if ok && err == nil {
		l.dropIfEmpty(ctx, e.Owner)
	}
	return adopted, ok, err
}

// adopt is Adopt under the entry's lock.
func (l *Ledger) adopt(ctx context.Context, e Entry) (adopted Entry, ok bool, err error) {
	old := entryKey(e.Owner, e.Provider, e.ID)
	lock := lockName + e.Owner + "_" + path.Base(old)
	if err := l.store.Lock(ctx, lock); err != nil {
		return Entry{}, false, fmt.Errorf("ledger: %w", err)
	}
	defer l.store.Unlock(context.WithoutCancel(ctx), lock)
	cur, err := l.load(ctx, l.store, old)
	if errors.Is(err, fs.ErrNotExist) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, err
	}
	adopted = cur
	adopted.From, adopted.Owner, adopted.Node = cur.Owner, l.owner, l.node
	if err := l.put(ctx, adopted); err != nil {
		return Entry{}, false, err
	}
	l.hold(adopted)
	if err := l.store.Delete(ctx, old); err != nil {
		// Both copies stand until RetryRemovals deletes the old one; if
		// it is found again first, its second release is answered as
		// released (404).
		l.mu.Lock()
		l.removing[old] = true
		l.mu.Unlock()
		return adopted, true, fmt.Errorf("ledger: %w", err)
	}
	return adopted, true, nil
}

// dropIfEmpty takes a gone owner whose last entry went out of the store:
// it has nothing left to say. It does so under the owner's lock, which
// MoveLegacy holds while it brings the owner's entries from an older
// layout, so that none it brings is deleted with the owner.
func (l *Ledger) dropIfEmpty(ctx context.Context, owner string) {
	if rest, err := l.list(ctx, path.Join(entryDir, owner)); err != nil || len(rest) > 0 {
		return
	}
	lock := lockName + owner
	if err := l.store.Lock(ctx, lock); err != nil {
		return
	}
	defer l.store.Unlock(context.WithoutCancel(ctx), lock)
	if rest, err := l.list(ctx, path.Join(entryDir, owner)); err == nil && len(rest) == 0 {
		_ = l.store.Delete(ctx, path.Join(entryDir, owner))
		_ = l.store.Delete(ctx, path.Join(ownersDir, owner))
	}
}

// Leave removes this process's heartbeat when it holds no entry, at a
// clean exit, so that the store does not keep an owner that will never
// beat again.
func (l *Ledger) Leave(ctx context.Context) {
	_ = l.RetryRemovals(ctx)
	if keys, err := l.list(ctx, path.Join(entryDir, l.owner)); err == nil && len(keys) == 0 {
		_ = l.store.Delete(ctx, path.Join(entryDir, l.owner))
		_ = l.store.Delete(ctx, path.Join(ownersDir, l.owner))
	}
}

// Legacy is the ledger as an older version kept it, in another layout of
// the same paths (under state redis: a key per path, found by a walk of
// the keyspace), read once the ledger is in its new layout so that what
// an older version left is still released (MoveLegacy).
type Legacy interface {
	Load(ctx context.Context, key string) ([]byte, error)
	Delete(ctx context.Context, key string) error
	// List returns every key under prefix.
	List(ctx context.Context, prefix string, recursive bool) ([]string, error)
}

// MoveLegacy moves the entries that old holds of gone owners into the
// ledger's store, under the same owner, where Orphans finds them; a gone
// owner's heartbeat there goes once its entries moved. Each move takes
// the lock an adoption of that entry takes, in old's version too, so one
// of them takes the entry; the moves of an owner's entries hold the
// owner's lock, so that an adoption here does not take the owner out of
// the store while they come. The entries of owners still alive (an older
// version running beside this one) stay there: left reports that old may
// still hold something to move (those, or what a failed call kept), so
// that the caller runs it again later. What is not an entry stays, named
// in err.
func (l *Ledger) MoveLegacy(ctx context.Context, old Legacy) (moved int, left bool, err error) {
	keys, err := old.List(ctx, root, true)
	if err != nil {
		return 0, true, fmt.Errorf("ledger: the old layout: %w", err)
	}
	entries := map[string]map[string]bool{} // by owner, their keys
	beats := map[string]bool{}
	for _, k := range keys {
		rel, ok := strings.CutPrefix(k, root+"/")
		if !ok {
			continue
		}
		switch parts := strings.Split(rel, "/"); {
		case len(parts) == 2 && parts[0] == "owners":
			beats[parts[1]] = true
		case len(parts) == 3 && parts[0] == "entries":
			if entries[parts[1]] == nil {
				entries[parts[1]] = map[string]bool{}
			}
			entries[parts[1]][k] = true
		}
	}
	now := l.now()
	var errs []error
	for owner := range beats {
		if entries[owner] == nil {
			entries[owner] = map[string]bool{}
		}
	}
	for owner, keys := range entries {
		seen, err := l.lastSeen(ctx, old, owner)
		if err != nil {
			errs, left = append(errs, err), true
			continue
		}
		if now.Before(seen.Add(l.gone)) {
			left = true // an older version's live process
			continue
		}
		lock := lockName + owner // see dropIfEmpty
		if err := l.store.Lock(ctx, lock); err != nil {
			errs, left = append(errs, fmt.Errorf("ledger: %w", err)), true
			continue
		}
		all := true
		for k := range keys {
			ok, err := l.moveLegacy(ctx, old, k)
			switch {
			case errors.Is(err, errNotEntry):
				errs = append(errs, err) // it stays, never moved
			case err != nil:
				errs, left, all = append(errs, err), true, false
			case ok:
				moved++
			}
		}
		if all && beats[owner] {
			if err := old.Delete(ctx, path.Join(ownersDir, owner)); err != nil {
				errs, left = append(errs, err), true
			}
		}
		_ = l.store.Unlock(context.WithoutCancel(ctx), lock)
	}
	return moved, left, errors.Join(errs...)
}

// moveLegacy moves the entry at key from old into the store, under the
// lock of its adoption; moved is false when it was adopted meanwhile, or
// on an error (errNotEntry: it is not an entry).
func (l *Ledger) moveLegacy(ctx context.Context, old Legacy, key string) (moved bool, err error) {
	owner := path.Base(path.Dir(key))
	lock := lockName + owner + "_" + path.Base(key)
	if err := l.store.Lock(ctx, lock); err != nil {
		return false, fmt.Errorf("ledger: %w", err)
	}
	defer l.store.Unlock(context.WithoutCancel(ctx), lock)
	e, err := l.load(ctx, old, key)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil // adopted meanwhile
	case err != nil:
		return false, err
	}
	if err := l.put(ctx, e); err != nil {
		return false, err
	}
	if err := old.Delete(ctx, key); err != nil {
		// Both copies stand: the next call moves it again (the same
		// entry, at the same key), or the older version adopts it and
		// its second release is answered as released.
		return false, fmt.Errorf("ledger: %w", err)
	}
	return true, nil
}
