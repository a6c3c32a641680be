package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

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
	s        *Store
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
	// acquired one, when flush sends it for a registered one.
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
// meanwhile, in one round trip bounded by Timeout (see flush). If Redis is
// down the lease simply expires within LeaseTTL. A slot not yet given back
// still counts as taken, so no node admits more than max meanwhile.
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
	s := l.s
	// Under mu, so that exactly one of Release and Close releases it.
	s.mu.Lock()
	if !l.released.CompareAndSwap(false, true) {
		s.mu.Unlock()
		return
	}
	delete(s.leases, l)
	now := time.Now()
	// Kept only where Acquire can take it back: a node that hears the
	// news (see Acquire).
	if l.reusable && s.Hearing() && !now.Before(s.wanted[l.provider]) {
		// The same member, under a Lease no one holds yet: kept,
		// renewed and given back at Close like the others.
		sp := &Lease{s: s, provider: l.provider, member: l.member, limited: true, reusable: true}
		sp.written.Store(l.written.Load())
		s.leases[sp] = struct{}{}
		s.spares[l.provider] = append(s.spares[l.provider], spare{l: sp, at: now})
		s.startFlushLocked() // it gives the spare back once kept long enough
	} else {
		s.queueReleasesLocked(l)
	}
	s.mu.Unlock()
}

// spare is a slot kept after its session ended (see Release), since at.
type spare struct {
	l  *Lease
	at time.Time
}

// spareKeep is how long a released slot of a capped provider is kept for
// this node's next connect; wantedFor is how long none is kept once
// another node said it waits for one.
const (
	spareKeep = 100 * time.Millisecond
	wantedFor = 2 * time.Second
)

// takeSpareLocked hands out a spare slot of provider, the newest, or nil.
// Spares are not used while the provider's live leases, as last read, are
// above max (max lowered by a reload): they are given back instead. Under
// s.mu.
func (s *Store) takeSpareLocked(provider string, max int) *Lease {
	kept := s.spares[provider]
	if len(kept) == 0 {
		return nil
	}
	if seen, ok := s.live[provider]; ok && seen.n > max {
		s.dropSparesLocked(provider)
		return nil
	}
	sp := kept[len(kept)-1].l
	s.spares[provider] = kept[:len(kept)-1]
	if len(kept) == 1 {
		delete(s.spares, provider)
	}
	return sp
}

// giveBackLocked queues a kept slot for release (unless Close took it).
// Under s.mu.
func (s *Store) giveBackLocked(sp spare) {
	if sp.l.released.CompareAndSwap(false, true) {
		delete(s.leases, sp.l)
		s.releasing = append(s.releasing, sp.l)
	}
}

// dropSparesLocked gives back every spare of provider. Under s.mu.
func (s *Store) dropSparesLocked(provider string) {
	for _, sp := range s.spares[provider] {
		s.giveBackLocked(sp)
	}
	delete(s.spares, provider)
	s.startFlushLocked()
}

// expireSparesLocked gives back the spares kept spareKeep. Under s.mu.
func (s *Store) expireSparesLocked(now time.Time) {
	for p, kept := range s.spares {
		n := 0
		for n < len(kept) && now.Sub(kept[n].at) >= spareKeep {
			s.giveBackLocked(kept[n])
			n++
		}
		if n == len(kept) {
			delete(s.spares, p)
		} else {
			s.spares[p] = kept[n:]
		}
	}
}

// noteWanted: another node waits for a slot of provider. Its spares here
// are given back, and none is kept for wantedFor.
func (s *Store) noteWanted(provider string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.wanted[provider] = time.Now().Add(wantedFor)
	if len(s.spares[provider]) > 0 {
		s.dropSparesLocked(provider)
	}
}

// queueReleasesLocked queues released leases for flush. Under s.mu,
// before Close (which marks every held lease released first).
func (s *Store) queueReleasesLocked(ls ...*Lease) {
	s.releasing = append(s.releasing, ls...)
	s.startFlushLocked()
}

// startFlushLocked starts flush unless it runs, and wakes it if it waits
// for a kept slot's end. Under s.mu.
func (s *Store) startFlushLocked() {
	if !s.flushing {
		s.flushing = true
		s.inflight.Add(1)
		go s.flush()
		return
	}
	s.kickFlushLocked()
}

// kickFlushLocked wakes flush if it waits for a kept slot's end. Under
// s.mu.
func (s *Store) kickFlushLocked() {
	if s.flushIdle {
		s.flushIdle = false
		select {
		case s.flushKick <- struct{}{}:
		default:
		}
	}
}

// nextSpareEndLocked is when the oldest kept slot is due to be given
// back; false when none is kept. Under s.mu.
func (s *Store) nextSpareEndLocked() (time.Time, bool) {
	var next time.Time
	for _, kept := range s.spares {
		if len(kept) > 0 && (next.IsZero() || kept[0].at.Before(next)) {
			next = kept[0].at
		}
	}
	return next.Add(spareKeep), !next.IsZero()
}

// takeReleasesLocked takes the queued releases of provider off the queue,
// for an Acquire of it to give back in its own round trip. Under s.mu.
func (s *Store) takeReleasesLocked(provider string) []*Lease {
	var taken []*Lease
	kept := s.releasing[:0]
	for _, l := range s.releasing {
		if l.provider == provider {
			taken = append(taken, l)
		} else {
			kept = append(kept, l)
		}
	}
	s.releasing = kept
	return taken
}

// Register takes a slot of a provider without a cap (no max, no learnt
// cap) at once, with no round trip: the lease is written in the
// background, with the other leases registered and released meanwhile, in
// one round trip (see flush), and renewed like any other. Nothing is
// checked, there being no cap to hold: the provider's shared cooldown or
// skip reaches this node as news (Subscribe) and by the other calls. The
// live count over every node (Snapshot, Live) shows the lease once
// written.
func (s *Store) Register(provider string) (*Lease, error) {
	if provider == "" {
		return nil, errors.New("register: empty provider name")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, s.fail(fmt.Sprintf("register a slot of provider %q", provider), errClosed)
	}
	l := &Lease{s: s, provider: provider, member: s.newMember()}
	s.watched[provider] = struct{}{}
	s.leases[l] = struct{}{}
	s.adding = append(s.adding, l)
	s.startFlushLocked()
	return l, nil
}

// flushDelay is how long flush gathers what is queued before it writes:
// a lease registered and released within it is never written, and the
// node's next acquire of a provider carries the releases queued meanwhile
// in its own round trip. Other nodes see a lease, or a slot freed, that
// much later.
const flushDelay = 5 * time.Millisecond

// flush writes the registered leases and gives back the released ones,
// all those queued in one round trip, until none is queued: a connect or
// a release waits for no round trip, and under load many sessions' share
// one. With nothing queued but slots kept, it sleeps until the oldest is
// due (or something is queued), then gives it back.
func (s *Store) flush() {
	defer s.inflight.Done()
	for {
		time.Sleep(flushDelay)
		s.mu.Lock()
		s.flushIdle = false
		now := time.Now()
		s.expireSparesLocked(now)
		adds, rels := s.adding, s.releasing
		s.adding, s.releasing = nil, nil
		if len(adds) == 0 && len(rels) == 0 {
			if due, ok := s.nextSpareEndLocked(); ok {
				s.flushIdle = true
				s.mu.Unlock()
				// The loop's own gathering delay comes on top.
				t := time.NewTimer(max(due.Sub(now)-flushDelay, 0))
				select {
				case <-t.C:
				case <-s.flushKick:
				}
				t.Stop()
				continue
			}
			s.flushing = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		ops := make([]leaseOp, 0, len(adds)+len(rels))
		for _, l := range adds {
			if !l.released.Load() { // released already: nothing to write
				l.written.Store(true)
				ops = append(ops, leaseOp{l: l, add: true})
			}
		}
		for _, l := range rels {
			if l.written.Load() { // a lease never written has nothing to remove
				ops = append(ops, leaseOp{l: l})
			}
		}
		ctx, cancel := s.ctx(context.Background())
		var err error
		if len(adds) > 0 {
			// After an outage or a failover the held leases are put
			// back first (the ones registered here among them).
			err = s.reassert(ctx)
		}
		if err == nil {
			err = s.leaseOps(ctx, ops)
		}
		if err != nil {
			s.backgroundFailed("write", err)
			// Registered leases missing are put back by the next
			// renewal; released ones expire on their own.
			s.log.Debug("shared state: leases not written; renewals and expiry mend it",
				zap.Int("registered", len(adds)), zap.Int("released", len(rels)), zap.Error(err))
		}
		cancel()
	}
}

// leaseOp is a lease to write (add) or to remove.
type leaseOp struct {
	l   *Lease
	add bool
}

// releaseRemote removes leases from Redis in one round trip (in Cluster
// mode, one per provider).
func (s *Store) releaseRemote(ctx context.Context, ls []*Lease) error {
	ops := make([]leaseOp, len(ls))
	for i, l := range ls {
		ops[i] = leaseOp{l: l}
	}
	return s.leaseOps(ctx, ops)
}

// leaseOps writes and removes leases in one round trip (in Cluster mode,
// one per provider: a script touches one hash slot). The other nodes are
// told once per provider whose slots are capped and were freed, in the
// same script: no node waits for a slot of an unlimited provider.
func (s *Store) leaseOps(ctx context.Context, ops []leaseOp) error {
	if len(ops) == 0 {
		return nil
	}
	groups := [][]leaseOp{ops}
	if s.perSlot {
		byProvider := map[string]int{}
		groups = groups[:0]
		for _, op := range ops {
			i, ok := byProvider[op.l.provider]
			if !ok {
				i = len(groups)
				byProvider[op.l.provider] = i
				groups = append(groups, nil)
			}
			groups[i] = append(groups[i], op)
		}
	}
	ttl := time.Duration(s.cfg.LeaseTTL).Milliseconds()
	var errs []error
	for _, g := range groups {
		keys := make([]string, 0, len(g))
		args := make([]any, 0, 2+3*len(g))
		args = append(args, s.channel(), ttl)
		for _, op := range g {
			keys = append(keys, s.leaseKey(op.l.provider))
			kind, event := "0", ""
			if op.add {
				kind = "1"
			} else if op.l.limited {
				event = s.newsOf(op.l.provider).released
			}
			args = append(args, kind, op.l.member, event)
		}
		if err := leaseOpsScript.Run(ctx, s.rdb, keys, args...).Err(); err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return s.fail("write leases", err)
	}
	return nil
}

// newMember returns a fresh lease member of this node.
func (s *Store) newMember() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return s.node + "|" + hex.EncodeToString(b[:])
}

// Acquire atomically, in one round trip, drops the expired leases of
// provider, checks its shared cooldown and skip, and takes one slot when
// fewer than max are live. max 0 means unlimited: the slot is still
// recorded, so counts are cluster-wide. In a cooldown or skip the Grant
// has a Hold and no lease; at (or above) max it is Full. Errors wrap
// ErrUnavailable.
func (s *Store) Acquire(ctx context.Context, provider string, max int) (Grant, error) {
	return s.acquire(ctx, provider, max, 0, true)
}

// AcquireAsking is Acquire that always asks Redis, even when this node
// kept a slot of the provider (see Lease.Release): for a node that must
// refuse sessions while Redis cannot be reached, which only a call tells.
func (s *Store) AcquireAsking(ctx context.Context, provider string, max int) (Grant, error) {
	return s.acquire(ctx, provider, max, 0, false)
}

// AcquireLearnt is Acquire for a provider whose cap is learnt over every
// node (max_concurrent auto): the cap set by LearnCap, raised by one at
// most once per interval while it is reached. Before any is learnt the
// provider is unlimited. The Grant's Cap is the cap in use.
func (s *Store) AcquireLearnt(ctx context.Context, provider string, interval time.Duration) (Grant, error) {
	return s.acquire(ctx, provider, 0, max(interval.Milliseconds(), 1), false)
}

// LearnCap sets the provider's learnt cap to its live leases over every
// node, less one (the refused attempt's own), and returns it; 0 when none
// is live (nothing learnt).
func (s *Store) LearnCap(ctx context.Context, provider string) (int, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	n, err := learnCapScript.Run(ctx, s.rdb, []string{s.leaseKey(provider), s.capKey(provider)}).Int()
	if err != nil {
		return 0, s.fail(fmt.Sprintf("learn the cap of provider %q", provider), err)
	}
	return n, nil
}

func (s *Store) acquire(ctx context.Context, provider string, max int, learnMS int64, spares bool) (Grant, error) {
	if provider == "" {
		return Grant{}, errors.New("acquire: empty provider name")
	}
	if max < 0 {
		return Grant{}, fmt.Errorf("acquire %q: negative max %d", provider, max)
	}
	op := fmt.Sprintf("acquire a slot of provider %q", provider)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return Grant{}, s.fail(op, errClosed)
	}
	s.watched[provider] = struct{}{}
	if spares && learnMS == 0 && max > 0 && s.Hearing() {
		// A slot this node kept from a session that ended: no round
		// trip.
		if sp := s.takeSpareLocked(provider, max); sp != nil {
			live := s.live[provider].n
			s.mu.Unlock()
			return Grant{Lease: sp, Live: live}, nil
		}
	}
	s.inflight.Add(1)
	// This node's releases of the provider not yet given back go in the
	// same round trip, before the count: a slot freed here is free for
	// this very acquire.
	freed := s.takeReleasesLocked(provider)
	s.mu.Unlock()
	defer s.inflight.Done()
	requeue := func() {
		if len(freed) > 0 {
			s.mu.Lock()
			s.queueReleasesLocked(freed...)
			s.mu.Unlock()
		}
	}

	// After an outage or a failover, this node's live sessions count
	// again before it admits another.
	if err := s.reassert(ctx); err != nil {
		requeue()
		return Grant{}, err
	}
	l := &Lease{s: s, provider: provider, member: s.newMember(), limited: max > 0 || learnMS > 0, reusable: max > 0 && learnMS == 0}
	l.written.Store(true)
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	news := s.newsOf(provider)
	args := make([]any, 0, 7+len(freed))
	args = append(args, max, l.member, time.Duration(s.cfg.LeaseTTL).Milliseconds(), s.channel(),
		news.released, learnMS, news.wanted)
	for _, f := range freed {
		args = append(args, f.member)
	}
	res, err := acquireScript.Run(ctx, s.rdb,
		[]string{s.leaseKey(provider), s.cooldownKey(provider), s.capKey(provider)}, args...,
	).Int64Slice()
	if err != nil {
		// The script may have run and its reply been lost: the lease then
		// expires, unrenewed, within LeaseTTL. The releases it carried
		// are tried again (a second removal is a no-op).
		requeue()
		return Grant{}, s.fail(op, err)
	}
	if len(res) != 6 {
		return Grant{}, s.fail(op, fmt.Errorf("unexpected reply %v", res))
	}
	s.sawLive(provider, int(res[3]))
	cp := int(res[5])
	switch res[0] {
	case 0:
		return Grant{Hold: s.hold(res[1], res[2], res[4]), Live: int(res[3]), Cap: cp}, nil
	case 2:
		return Grant{Full: true, Live: int(res[3]), Cap: cp}, nil
	}
	s.mu.Lock()
	if s.closed {
		// Closed while acquiring: Close could not release this one.
		s.mu.Unlock()
		l.released.Store(true)
		rctx, rcancel := s.ctx(context.Background())
		_ = s.releaseRemote(rctx, []*Lease{l})
		rcancel()
		return Grant{}, s.fail(op, errClosed)
	}
	s.leases[l] = struct{}{}
	s.mu.Unlock()
	return Grant{Lease: l, Live: int(res[3]), Cap: cp}, nil
}
