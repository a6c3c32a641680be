package cluster

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Store is one node's handle on the shared state. It is safe for
// concurrent use. Open it once per node and Close it when the node stops.
type Store struct {
	cfg  Config
	node string
	rdb  *redis.Client
	log  *zap.Logger
	// ledgerLocks holds the tokens of the ledger locks this store took
	// (ledger.go), by name.
	ledgerLocks sync.Map
	// libLog receives the Redis library's own messages (see liblog.go).
	libLog *zap.Logger

	mu      sync.Mutex
	closed  bool
	leases  map[*Lease]struct{}
	watched map[string]struct{} // providers whose dead leases renewal sweeps
	live    map[string]liveSeen // each watched provider's live leases, as last read
	subs    map[*subscription]struct{}
	// inflight counts the Acquire and Release calls talking to Redis, so
	// that Close does not close the client under them.
	inflight sync.WaitGroup

	renewStop chan struct{}
	renewOnce sync.Once
	renewDone chan struct{}
	renewOK   bool // last renewal succeeded; only the renew goroutine uses it

	subWG sync.WaitGroup

	// spend gathers the costs QueueSpend is given until they are
	// written (spend.go).
	spend spendBatch
}

// Open validates cfg and returns a Store for node, the name this gateway
// node is known by in the cluster (it must be unique among the nodes). It
// does no network I/O: the first call connects. It starts the background
// renewal of the leases the Store will hold.
func Open(cfg Config, node string) (*Store, error) {
	var errs []error
	if node == "" {
		errs = append(errs, errors.New("node name is required"))
	}
	// Checked as given: a zero takes its default.
	if err := cfg.validate(nil, true); err != nil {
		errs = append(errs, err)
	}
	cfg = cfg.withDefaults()
	tc, err := cfg.tlsConfig()
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("shared state config: %w", err)
	}
	s := &Store{
		cfg:       cfg,
		node:      node,
		rdb:       redis.NewClient(cfg.options(tc)),
		log:       cfg.Logger.With(zap.String("node", node)),
		leases:    map[*Lease]struct{}{},
		watched:   map[string]struct{}{},
		live:      map[string]liveSeen{},
		subs:      map[*subscription]struct{}{},
		renewStop: make(chan struct{}),
		renewDone: make(chan struct{}),
		renewOK:   true,
	}
	s.libLog = routeLibraryLog(cfg.Logger)
	go s.renewLoop()
	return s, nil
}

// Node returns the name of this node, as given to Open.
func (s *Store) Node() string { return s.node }

// Close stops the renewals and the subscriptions, releases every lease
// still held (best effort, one round trip bounded by Timeout: if Redis is
// down they simply expire) and closes the connections. Leases released
// later are no-ops. Close is idempotent; it must not be called from a
// Subscribe callback.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	held := make([]*Lease, 0, len(s.leases))
	for l := range s.leases {
		if l.released.CompareAndSwap(false, true) {
			held = append(held, l)
		}
	}
	s.leases = map[*Lease]struct{}{}
	subs := s.subs
	s.subs = map[*subscription]struct{}{}
	s.mu.Unlock()

	s.stopRenewals()
	s.spend.mu.Lock()
	spendDone := s.spend.done
	s.spend.mu.Unlock()
	if spendDone != nil {
		<-spendDone // its last write
	}
	if len(held) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(s.cfg.Timeout))
		if err := s.releaseRemote(ctx, held); err != nil {
			s.log.Warn("shared state: leases not released at close; they expire on their own",
				zap.Int("leases", len(held)), zap.Error(err))
		}
		cancel()
	}
	s.inflight.Wait()
	for sub := range subs {
		sub.stop()
	}
	s.subWG.Wait()
	err := s.rdb.Close()
	unrouteLibraryLog(s.libLog)
	return err
}

// stopRenewals stops the renewal goroutine and waits for it, without
// releasing anything. Tests use it to play a node that died.
func (s *Store) stopRenewals() {
	s.renewOnce.Do(func() { close(s.renewStop) })
	<-s.renewDone
}

// Keys and channel.

func (s *Store) leaseKey(provider string) string    { return s.cfg.KeyPrefix + "lease:" + provider }
func (s *Store) cooldownKey(provider string) string { return s.cfg.KeyPrefix + "cooldown:" + provider }
func (s *Store) capKey(provider string) string      { return s.cfg.KeyPrefix + "cap:" + provider }
func (s *Store) channel() string                    { return s.cfg.KeyPrefix + "events" }

// ctx bounds a call by Timeout.
func (s *Store) ctx(parent context.Context) (context.Context, context.CancelFunc) {
	if parent == nil {
		parent = context.Background()
	}
	return context.WithTimeout(parent, time.Duration(s.cfg.Timeout))
}

// errClosed is the cause of calls made after Close.
var errClosed = errors.New("store closed")

func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// renewLoop renews the held leases about every LeaseTTL/3 until
// stopRenewals.
func (s *Store) renewLoop() {
	defer close(s.renewDone)
	t := time.NewTicker(time.Duration(s.cfg.LeaseTTL) / 3)
	defer t.Stop()
	for {
		select {
		case <-s.renewStop:
			return
		case <-t.C:
			s.renew()
		}
	}
}

// renew runs one renewal: every held lease is extended (or put back when
// missing), and the dead leases of every provider this node has asked for
// or watches are dropped and its live leases counted, in one round trip.
func (s *Store) renew() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	byProvider := map[string][]*Lease{}
	for p := range s.watched {
		byProvider[p] = nil
	}
	for l := range s.leases {
		byProvider[l.provider] = append(byProvider[l.provider], l)
	}
	s.mu.Unlock()
	if len(byProvider) == 0 {
		return
	}
	providers := make([]string, 0, len(byProvider))
	for p := range byProvider {
		providers = append(providers, p)
	}
	sort.Strings(providers)

	keys := make([]string, 0, len(providers))
	args := []any{time.Duration(s.cfg.LeaseTTL).Milliseconds(), s.channel()}
	for _, p := range providers {
		keys = append(keys, s.leaseKey(p))
		ls := byProvider[p]
		args = append(args, s.event(EventReleased, p, 0, 0), len(ls))
		for _, l := range ls {
			args = append(args, l.member)
		}
	}
	ctx, cancel := s.ctx(context.Background())
	defer cancel()
	res, err := renewScript.Run(ctx, s.rdb, keys, args...).Int64Slice()
	if err == nil && len(res) != 1+len(providers) {
		err = fmt.Errorf("unexpected reply %v", res)
	}
	if err != nil {
		if s.renewOK {
			s.log.Warn("shared state: lease renewal failed; retrying",
				zap.Error(s.fail("renew leases", err)))
		}
		s.renewOK = false
		return
	}
	if !s.renewOK {
		s.log.Info("shared state: lease renewal works again")
	}
	s.renewOK = true
	for i, p := range providers {
		s.sawLive(p, int(res[1+i]))
	}
	if restored := res[0]; restored > 0 {
		s.log.Info("shared state: put back leases that went missing", zap.Int64("leases", restored))
	}
	// A lease released while this renewal ran may have been put back by
	// it: release it again.
	var again []*Lease
	for _, ls := range byProvider {
		for _, l := range ls {
			if l.released.Load() {
				again = append(again, l)
			}
		}
	}
	if len(again) > 0 {
		rctx, rcancel := s.ctx(context.Background())
		_ = s.releaseRemote(rctx, again)
		rcancel()
	}
}

// Watch makes the renewals, about every LeaseTTL/3, also drop the dead
// leases of providers (announcing the freed slots) and count their live
// leases (Live), though this node may never take a slot of them.
func (s *Store) Watch(providers ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range providers {
		if p != "" {
			s.watched[p] = struct{}{}
		}
	}
}

// liveSeen is a provider's live leases as read at a time (this node's
// clock).
type liveSeen struct {
	n  int
	at time.Time
}

// sawLive records a provider's live leases as just read.
func (s *Store) sawLive(provider string, n int) {
	now := s.now()
	s.mu.Lock()
	s.live[provider] = liveSeen{n: n, at: now}
	s.mu.Unlock()
}

// Live returns the provider's live leases over every node as last read
// (by a renewal of a watched provider, an Acquire or a Snapshot), and
// whether that reading is recent: within LeaseTTL. A node cut off from
// Redis has no recent reading.
func (s *Store) Live(provider string) (int, bool) {
	s.mu.Lock()
	seen, ok := s.live[provider]
	s.mu.Unlock()
	if !ok || s.now().Sub(seen.at) > time.Duration(s.cfg.LeaseTTL) {
		return 0, false
	}
	return seen.n, true
}

// now reads this node's clock (Config.Clock).
func (s *Store) now() time.Time {
	if s.cfg.Clock != nil {
		return s.cfg.Clock.Now()
	}
	return time.Now()
}

// Ping checks that the Redis server answers. Errors wrap ErrUnavailable.
func (s *Store) Ping(ctx context.Context) error {
	const op = "ping the shared state"
	if s.isClosed() {
		return s.fail(op, errClosed)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return s.fail(op, err)
	}
	return nil
}

// Closed reports whether Close was called.
func (s *Store) Closed() bool { return s.isClosed() }
