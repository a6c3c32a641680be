package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Leases are this node's live-session slots of the providers, kept in
// Redis as leases (see the package doc): taking one (Acquire, Register),
// giving it back (Lease.Release), and the live counts over every node
// (Live, Snapshot). Around them run the background writer that gathers
// the writes and releases (writer.go), the slots kept for this node's
// next connects (spares.go), and the renewals that keep every held lease
// alive and put back the lost ones after an outage (renew.go).
type Leases struct {
	c       *conn
	news    *News // the encoded news of a provider, and whether it is heard
	watched *watchList

	// mu guards the book of leases: closed, held, live, and the spares'
	// and the writer's state. Lease.Release and Close both take it, so
	// that exactly one of them gives a lease back.
	mu     sync.Mutex
	closed bool
	held   map[*Lease]struct{}
	live   map[string]liveSeen // each provider's live leases, as last read
	spares spares
	w      writer
	// inflight counts the Acquire calls and the writer talking to
	// Redis, so that Close does not close the client under them.
	inflight sync.WaitGroup
	r        renewer
}

func newLeases(c *conn, news *News, watched *watchList) *Leases {
	ls := &Leases{
		c:       c,
		news:    news,
		watched: watched,
		held:    map[*Lease]struct{}{},
		live:    map[string]liveSeen{},
		spares:  spares{kept: map[string][]spare{}, wanted: map[string]time.Time{}},
	}
	ls.w = writer{ls: ls, kick: make(chan struct{}, 1)}
	ls.r = renewer{ls: ls, stopped: make(chan struct{}), done: make(chan struct{})}
	ls.r.ok.Store(true)
	return ls
}

// Grant is the answer of Acquire.
type Grant struct {
	// Lease is non-nil when a slot was taken; Release it when the session
	// ends.
	Lease *Lease
	// Full is true when the provider is at its max across the cluster
	// (or above it: see Live).
	Full bool
	// Hold is set when the provider is in a shared cooldown or skip; then
	// no lease is taken.
	Hold Hold
	// Live is the provider's live leases over every node, this one's new
	// lease included. After a node was cut off from Redis longer than
	// LeaseTTL, its leases come back when it renews, and Live may exceed
	// max until enough sessions end; no lease is granted meanwhile.
	Live int
	// Cap is the provider's learnt cap over every node (AcquireLearnt; 0:
	// none learnt yet, or not learnt).
	Cap int
}

// Lease is one live-session slot of a provider, held by this node. The
// Store renews it until Release.
type Lease struct {
	ls       *Leases
	provider string
	member   string
	// limited: the provider's slots are capped (a max, or a learnt cap),
	// so its release is news for the nodes' waiters.
	limited bool
	// reusable: taken with a max (not a learnt cap), so kept as a spare
	// once released (see Release).
	reusable bool
	released atomic.Bool
	// written is set once the lease may be in Redis: at once for an
	// acquired one, when the writer sends it for a registered one.
	written atomic.Bool
}

// Provider is the name of the provider the slot belongs to.
func (l *Lease) Provider() string { return l.provider }

// ID is the lease's member in the provider's lease set: node + "|" + a
// random id.
func (l *Lease) ID() string { return l.member }

// Release gives the slot back and tells the other nodes. It is idempotent,
// safe from any goroutine and on a nil Lease, and returns at once: the
// slot is given back in the background, with the other slots released
// meanwhile, in one round trip bounded by Timeout (see writer.run). If
// Redis is down the lease simply expires within LeaseTTL. A slot not yet
// given back still counts as taken, so no node admits more than max
// meanwhile.
//
// A slot of a capped provider (Acquire with a max) is first kept for
// spareKeep as a spare: this node's next Acquire of the provider takes it
// without a round trip, and the slot then stays counted all along, so the
// cap holds. A node that finds the provider full announces it (EventWanted),
// and the other nodes give their spares of it back at once and keep none
// for wantedFor.
func (l *Lease) Release() {
	if l == nil || l.released.Load() {
		return
	}
	l.ls.release(l)
}

// release is Lease.Release of a lease not seen released.
func (ls *Leases) release(l *Lease) {
	// Under mu, so that exactly one of Release and Close releases it.
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if !l.released.CompareAndSwap(false, true) {
		return
	}
	delete(ls.held, l)
	now := time.Now()
	// Kept only where Acquire can take it back: a node that hears the
	// news (see Acquire).
	if l.reusable && ls.news.Hearing() && ls.spares.mayKeep(l.provider, now) {
		// The same member, under a Lease no one holds yet: kept,
		// renewed and given back at Close like the others.
		sp := &Lease{ls: ls, provider: l.provider, member: l.member, limited: true, reusable: true}
		sp.written.Store(l.written.Load())
		ls.held[sp] = struct{}{}
		ls.spares.keep(sp, now)
		ls.w.startLocked() // it gives the spare back once kept long enough
	} else {
		ls.w.queueLocked(l)
	}
}

// Register takes a slot of a provider without a cap (no max, no learnt
// cap) at once, with no round trip: the lease is written in the
// background, with the other leases registered and released meanwhile, in
// one round trip (see writer.run), and renewed like any other. Nothing is
// checked, there being no cap to hold: the provider's shared cooldown or
// skip reaches this node as news (News.Subscribe) and by the other calls.
// The live count over every node (Snapshot, Live) shows the lease once
// written.
func (ls *Leases) Register(provider string) (*Lease, error) {
	if provider == "" {
		return nil, errors.New("register: empty provider name")
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed {
		return nil, ls.c.fail(fmt.Sprintf("register a slot of provider %q", provider), errClosed)
	}
	l := &Lease{ls: ls, provider: provider, member: ls.newMember()}
	ls.watched.add(provider)
	ls.held[l] = struct{}{}
	ls.w.addLocked(l)
	return l, nil
}

// newMember returns a fresh lease member of this node.
func (ls *Leases) newMember() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return ls.c.node + "|" + hex.EncodeToString(b[:])
}

// Acquire atomically, in one round trip, drops the expired leases of
// provider, checks its shared cooldown and skip, and takes one slot when
// fewer than max are live. max 0 means unlimited: the slot is still
// recorded, so counts are cluster-wide. In a cooldown or skip the Grant
// has a Hold and no lease; at (or above) max it is Full. Errors wrap
// ErrUnavailable.
func (ls *Leases) Acquire(ctx context.Context, provider string, max int) (Grant, error) {
	return ls.acquire(ctx, provider, max, 0, true)
}

// AcquireAsking is Acquire that always asks Redis, even when this node
// kept a slot of the provider (see Lease.Release): for a node that must
// refuse sessions while Redis cannot be reached, which only a call tells.
func (ls *Leases) AcquireAsking(ctx context.Context, provider string, max int) (Grant, error) {
	return ls.acquire(ctx, provider, max, 0, false)
}

// AcquireLearnt is Acquire for a provider whose cap is learnt over every
// node (max_concurrent auto): the cap set by LearnCap, raised by one at
// most once per interval while it is reached. Before any is learnt the
// provider is unlimited. The Grant's Cap is the cap in use.
func (ls *Leases) AcquireLearnt(ctx context.Context, provider string, interval time.Duration) (Grant, error) {
	return ls.acquire(ctx, provider, 0, max(interval.Milliseconds(), 1), false)
}

// LearnCap sets the provider's learnt cap to its live leases over every
// node, less one (the refused attempt's own), and returns it; 0 when none
// is live (nothing learnt).
func (ls *Leases) LearnCap(ctx context.Context, provider string) (int, error) {
	c := ls.c
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	n, err := learnCapScript.Run(ctx, c.rdb, []string{c.leaseKey(provider), c.capKey(provider)}).Int()
	if err != nil {
		return 0, c.fail(fmt.Sprintf("learn the cap of provider %q", provider), err)
	}
	return n, nil
}

func (ls *Leases) acquire(ctx context.Context, provider string, max int, learnMS int64, spares bool) (Grant, error) {
	if provider == "" {
		return Grant{}, errors.New("acquire: empty provider name")
	}
	if max < 0 {
		return Grant{}, fmt.Errorf("acquire %q: negative max %d", provider, max)
	}
	c := ls.c
	op := fmt.Sprintf("acquire a slot of provider %q", provider)
	ls.mu.Lock()
	if ls.closed {
		ls.mu.Unlock()
		return Grant{}, c.fail(op, errClosed)
	}
	ls.watched.add(provider)
	if spares && learnMS == 0 && max > 0 && ls.news.Hearing() {
		// A slot this node kept from a session that ended: no round
		// trip.
		if sp := ls.takeSpareLocked(provider, max); sp != nil {
			live := ls.live[provider].n
			ls.mu.Unlock()
			return Grant{Lease: sp, Live: live}, nil
		}
	}
	ls.inflight.Add(1)
	// This node's releases of the provider not yet given back go in the
	// same round trip, before the count: a slot freed here is free for
	// this very acquire.
	freed := ls.w.takeLocked(provider)
	ls.mu.Unlock()
	defer ls.inflight.Done()
	requeue := func() {
		if len(freed) > 0 {
			ls.mu.Lock()
			ls.w.queueLocked(freed...)
			ls.mu.Unlock()
		}
	}

	// After an outage or a failover, this node's live sessions count
	// again before it admits another.
	if err := ls.reassert(ctx); err != nil {
		requeue()
		return Grant{}, err
	}
	l := &Lease{ls: ls, provider: provider, member: ls.newMember(), limited: max > 0 || learnMS > 0, reusable: max > 0 && learnMS == 0}
	l.written.Store(true)
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	news := ls.news.of(provider)
	args := make([]any, 0, 7+len(freed))
	args = append(args, max, l.member, time.Duration(c.cfg.LeaseTTL).Milliseconds(), c.channel(),
		news.released, learnMS, news.wanted)
	for _, f := range freed {
		args = append(args, f.member)
	}
	res, err := acquireScript.Run(ctx, c.rdb,
		[]string{c.leaseKey(provider), c.cooldownKey(provider), c.capKey(provider)}, args...,
	).Int64Slice()
	if err != nil {
		// The script may have run and its reply been lost: the lease then
		// expires, unrenewed, within LeaseTTL. The releases it carried
		// are tried again (a second removal is a no-op).
		requeue()
		return Grant{}, c.fail(op, err)
	}
	if len(res) != 6 {
		return Grant{}, c.fail(op, fmt.Errorf("unexpected reply %v", res))
	}
	ls.sawLive(provider, int(res[3]))
	cp := int(res[5])
	switch res[0] {
	case 0:
		return Grant{Hold: c.hold(res[1], res[2], res[4]), Live: int(res[3]), Cap: cp}, nil
	case 2:
		return Grant{Full: true, Live: int(res[3]), Cap: cp}, nil
	}
	ls.mu.Lock()
	if ls.closed {
		// Closed while acquiring: Close could not release this one.
		ls.mu.Unlock()
		l.released.Store(true)
		rctx, rcancel := c.ctx(context.Background())
		_ = ls.w.remove(rctx, []*Lease{l})
		rcancel()
		return Grant{}, c.fail(op, errClosed)
	}
	ls.held[l] = struct{}{}
	ls.mu.Unlock()
	return Grant{Lease: l, Live: int(res[3]), Cap: cp}, nil
}

// Watch makes the renewals, about every LeaseTTL/3, also drop the dead
// leases of providers (announcing the freed slots) and count their live
// leases (Live), though this node may never take a slot of them; a
// subscription that comes up reads their holds (News.Subscribe).
func (ls *Leases) Watch(providers ...string) { ls.watched.add(providers...) }

// Unwatch undoes Watch for providers this node no longer uses (a provider
// found at run time that went): the renewals no longer read them. Asking
// for a slot of one watches it again.
func (ls *Leases) Unwatch(providers ...string) {
	ls.watched.remove(providers...)
	ls.mu.Lock()
	for _, p := range providers {
		delete(ls.live, p)
	}
	ls.mu.Unlock()
}

// liveSeen is a provider's live leases as read at a time (this node's
// clock).
type liveSeen struct {
	n  int
	at time.Time
}

// sawLive records a provider's live leases as just read.
func (ls *Leases) sawLive(provider string, n int) {
	now := ls.c.now()
	ls.mu.Lock()
	ls.live[provider] = liveSeen{n: n, at: now}
	ls.mu.Unlock()
}

// Live returns the provider's live leases over every node as last read
// (by a renewal of a watched provider, an Acquire or a Snapshot), and
// whether that reading is recent: within LeaseTTL. A node cut off from
// Redis has no recent reading.
func (ls *Leases) Live(provider string) (int, bool) {
	ls.mu.Lock()
	seen, ok := ls.live[provider]
	ls.mu.Unlock()
	if !ok || ls.c.now().Sub(seen.at) > time.Duration(ls.c.cfg.LeaseTTL) {
		return 0, false
	}
	return seen.n, true
}

// reassert puts back the held leases when a call failed or the master
// changed since they were last asserted; Acquire calls it before it takes
// a slot, so no session is admitted through a new master before this
// node's live sessions count there.
func (ls *Leases) reassert(ctx context.Context) error {
	if !ls.c.stale.Load() {
		return nil
	}
	return ls.r.run(ctx)
}

// shut starts Close: no lease is taken from now on, every lease still
// held (the spares among them) is marked released and returned, to be
// given back by finish, the writer waits for no kept slot any more, and
// the renewals stop.
func (ls *Leases) shut() []*Lease {
	ls.mu.Lock()
	ls.closed = true
	held := make([]*Lease, 0, len(ls.held))
	for l := range ls.held {
		if l.released.CompareAndSwap(false, true) {
			held = append(held, l)
		}
	}
	ls.held = map[*Lease]struct{}{}
	ls.spares.clear() // released above, with the held leases
	ls.w.kickLocked()
	ls.mu.Unlock()
	ls.r.stop()
	return held
}

// finish ends Close: it gives back the leases shut returned, in one
// round trip bounded by Timeout (if Redis is down they simply expire),
// and waits for the Acquire calls and the writer still talking to Redis.
func (ls *Leases) finish(held []*Lease) {
	if len(held) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(ls.c.cfg.Timeout))
		if err := ls.w.remove(ctx, held); err != nil {
			ls.c.log.Warn("shared state: leases not released at close; they expire on their own",
				zap.Int("leases", len(held)), zap.Error(err))
		}
		cancel()
	}
	ls.inflight.Wait()
}
