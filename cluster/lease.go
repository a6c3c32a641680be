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
	released atomic.Bool
}

// Provider is the name of the provider the slot belongs to.
func (l *Lease) Provider() string { return l.provider }

// ID is the lease's member in the provider's lease set: node + "|" + a
// random id.
func (l *Lease) ID() string { return l.member }

// Release gives the slot back and tells the other nodes. It is idempotent,
// safe from any goroutine and on a nil Lease, and bounded by Timeout; if
// Redis is down the lease simply expires within LeaseTTL.
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
	s.inflight.Add(1) // Close marks every lease released first: not closed yet
	s.mu.Unlock()
	defer s.inflight.Done()
	ctx, cancel := s.ctx(context.Background())
	defer cancel()
	if err := s.releaseRemote(ctx, []*Lease{l}); err != nil {
		s.log.Debug("shared state: lease not released; it expires on its own",
			zap.String("provider", l.provider), zap.Error(err))
	}
}

// releaseRemote removes leases from Redis in one round trip (in Cluster
// mode, one per lease).
func (s *Store) releaseRemote(ctx context.Context, ls []*Lease) error {
	groups := [][]*Lease{ls}
	if s.perSlot {
		groups = groups[:0]
		for _, l := range ls {
			groups = append(groups, []*Lease{l})
		}
	}
	var errs []error
	for _, g := range groups {
		keys := make([]string, 0, len(g))
		args := make([]any, 0, 1+2*len(g))
		args = append(args, s.channel())
		for _, l := range g {
			keys = append(keys, s.leaseKey(l.provider))
			args = append(args, l.member, s.event(EventReleased, l.provider, 0, 0))
		}
		if err := releaseScript.Run(ctx, s.rdb, keys, args...).Err(); err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return s.fail("release leases", err)
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
	return s.acquire(ctx, provider, max, 0)
}

// AcquireLearnt is Acquire for a provider whose cap is learnt over every
// node (max_concurrent auto): the cap set by LearnCap, raised by one at
// most once per interval while it is reached. Before any is learnt the
// provider is unlimited. The Grant's Cap is the cap in use.
func (s *Store) AcquireLearnt(ctx context.Context, provider string, interval time.Duration) (Grant, error) {
	return s.acquire(ctx, provider, 0, max(interval.Milliseconds(), 1))
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

func (s *Store) acquire(ctx context.Context, provider string, max int, learnMS int64) (Grant, error) {
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
	s.inflight.Add(1)
	s.mu.Unlock()
	defer s.inflight.Done()

	// After an outage or a failover, this node's live sessions count
	// again before it admits another.
	if err := s.reassert(ctx); err != nil {
		return Grant{}, err
	}
	l := &Lease{s: s, provider: provider, member: s.newMember()}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	res, err := acquireScript.Run(ctx, s.rdb,
		[]string{s.leaseKey(provider), s.cooldownKey(provider), s.capKey(provider)},
		max, l.member, time.Duration(s.cfg.LeaseTTL).Milliseconds(), s.channel(),
		s.event(EventReleased, provider, 0, 0), learnMS,
	).Int64Slice()
	if err != nil {
		// The script may have run and its reply been lost: the lease then
		// expires, unrenewed, within LeaseTTL.
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
