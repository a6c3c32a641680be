package cluster

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Store is one node's handle on the shared state. It is safe for
// concurrent use. Open it once per node and Close it when the node stops.
type Store struct {
	cfg  Config
	node string
	rdb  redis.UniversalClient
	log  *zap.Logger
	// mode is cfg.Mode(); perSlot is set in Cluster mode, where a script
	// may only touch the keys of one hash slot: calls over several
	// providers go one slot group (one provider) at a time.
	mode    string
	perSlot bool
	// master is the address of the server in use (Sentinel: the master
	// last dialled); failovers counts the changes of it.
	master     atomic.Pointer[string]
	failovers  atomic.Int64
	onFailover func() // set before the first call; may be nil
	// onFailed is told of the failures of the store's own background
	// calls (renewals, lease writes), with a fixed word for the op (see
	// Shared.Failed); nil until set.
	onFailed atomic.Pointer[func(op string, err error)]
	// stale is set when a call failed or the master changed: before the
	// next admission, the held leases are put back (reassert).
	stale atomic.Bool
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
	// inflight counts the Acquire calls and the flush talking to
	// Redis, so that Close does not close the client under them.
	inflight sync.WaitGroup
	// adding are the leases registered (Register) and not yet written in
	// Redis, releasing those released and not yet given back there;
	// flushing while flush runs; flushIdle while it has nothing to
	// write and waits for the end of a kept slot, until a kick (on
	// flushKick) says there is.
	adding    []*Lease
	releasing []*Lease
	flushing  bool
	flushIdle bool
	flushKick chan struct{}
	// spares are the slots of capped providers kept after their
	// sessions ended, for this node's next connects (see Lease.Release),
	// by provider, oldest first; wanted says until when another node
	// waits for a slot of a provider (none is kept meanwhile).
	spares map[string][]spare
	wanted map[string]time.Time

	renewStop chan struct{}
	renewOnce sync.Once
	renewDone chan struct{}
	renewOK   atomic.Bool // the last renewal succeeded
	renewMu   sync.Mutex  // one renewal at a time

	subWG sync.WaitGroup
	// hearing counts the subscriptions up and caught up (Hearing).
	hearing atomic.Int32
	// news holds each provider's encoded news (newsOf), by name.
	news sync.Map

	// spend gathers the costs QueueSpend is given until they are
	// written (spend.go); badSpend names the totals found unreadable
	// (logged once each).
	spend    spendBatch
	badSpend sync.Map
}

// Open validates cfg and returns a Store for node, the name this gateway
// node is known by in the cluster (it must be unique among the nodes). It
// does no network I/O: the first call connects. It starts the background
// renewal of the leases the Store will hold.
func Open(cfg Config, node string) (*Store, error) {
	return openStore(cfg, node, nil)
}

// openStore is Open with a function told of every failover the store follows
// (a change of the master in use).
func openStore(cfg Config, node string, onFailover func()) (*Store, error) {
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
		cfg:        cfg,
		node:       node,
		log:        cfg.Logger.With(zap.String("node", node)),
		mode:       cfg.Mode(),
		onFailover: onFailover,
		leases:     map[*Lease]struct{}{},
		spares:     map[string][]spare{},
		flushKick:  make(chan struct{}, 1),
		wanted:     map[string]time.Time{},
		watched:    map[string]struct{}{},
		live:       map[string]liveSeen{},
		subs:       map[*subscription]struct{}{},
		renewStop:  make(chan struct{}),
		renewDone:  make(chan struct{}),
	}
	s.renewOK.Store(true)
	switch s.mode {
	case ModeSentinel:
		s.rdb = redis.NewFailoverClient(cfg.failoverOptions(tc, s.dialed))
	case ModeCluster:
		s.perSlot = true
		seeds := strings.Join(cfg.Cluster, ",")
		s.master.Store(&seeds)
		s.rdb = redis.NewClusterClient(cfg.clusterOptions(tc))
	default:
		addr := cfg.Address
		s.master.Store(&addr)
		s.rdb = redis.NewClient(cfg.options(tc))
	}
	s.libLog = routeLibraryLog(cfg.Logger)
	go s.renewLoop()
	return s, nil
}

// dialed notes the server a new connection goes to (Sentinel mode: the
// master the sentinels name). A change of it is a failover followed: the
// held leases are put back before the next admission, since the new
// master may lack writes that were never replicated to it.
func (s *Store) dialed(addr string) {
	old := s.master.Swap(&addr)
	if old == nil || *old == addr {
		return
	}
	s.failovers.Add(1)
	s.stale.Store(true)
	s.log.Info("shared state: following a new master", zap.String("mode", s.mode), zap.String("address", addr))
	if s.onFailover != nil {
		s.onFailover()
	}
}

// Mode tells how the store reaches Redis: ModeStandalone, ModeSentinel or
// ModeCluster.
func (s *Store) Mode() string { return s.mode }

// Address is the server in use: the address of a single server, the
// master a Sentinel named last (empty before the first connection), or a
// cluster's seed addresses joined by commas.
func (s *Store) Address() string {
	if p := s.master.Load(); p != nil {
		return *p
	}
	return ""
}

// Failovers counts the changes of master this store followed (not the
// first discovery).
func (s *Store) Failovers() int64 { return s.failovers.Load() }

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
	s.spares = map[string][]spare{} // released above, with the held leases
	s.kickFlushLocked()             // flush waits for no kept slot now
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

// A provider's keys carry its name as a hash tag ({name}), so that the
// scripts touching its lease set, cooldown and learnt cap together run in
// one hash slot of a Redis Cluster. Whatever the name holds, the three
// keys begin with the same prefix + "{" + name + "}", so they share their
// slot.

func (s *Store) providerKey(provider, kind string) string {
	return s.cfg.KeyPrefix + "{" + provider + "}:" + kind
}
func (s *Store) leaseKey(provider string) string    { return s.providerKey(provider, "lease") }
func (s *Store) cooldownKey(provider string) string { return s.providerKey(provider, "cooldown") }
func (s *Store) capKey(provider string) string      { return s.providerKey(provider, "cap") }
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

// renew runs one renewal (see renewNow), logging a failure once per
// outage.
func (s *Store) renew() {
	err := s.renewNow(context.Background())
	if err != nil {
		s.backgroundFailed("renew", err)
		if s.renewOK.Swap(false) {
			s.log.Warn("shared state: lease renewal failed; retrying", zap.Error(err))
		}
		return
	}
	if !s.renewOK.Swap(true) {
		s.log.Info("shared state: lease renewal works again")
	}
}

// backgroundFailed tells onFailed of a background call's failure.
func (s *Store) backgroundFailed(op string, err error) {
	if fn := s.onFailed.Load(); fn != nil {
		(*fn)(op, err)
	}
}

// renewNow extends every held lease (putting back those that went
// missing) and drops the dead leases of every provider this node has
// asked for or watches, counting its live leases: one round trip, or in
// Cluster mode one per provider. On success the leases are asserted: the
// stale mark is cleared.
func (s *Store) renewNow(ctx context.Context) error {
	s.renewMu.Lock()
	defer s.renewMu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	byProvider := map[string][]*Lease{}
	for p := range s.watched {
		byProvider[p] = nil
	}
	for l := range s.leases {
		l.written.Store(true) // this renewal writes it, registered or not
		byProvider[l.provider] = append(byProvider[l.provider], l)
	}
	s.mu.Unlock()
	// Cleared first: a failure from now on marks it again.
	wasStale := s.stale.Swap(false)
	if len(byProvider) == 0 {
		if wasStale {
			s.cfg.Hooks.reasserted()
		}
		return nil
	}
	providers := make([]string, 0, len(byProvider))
	for p := range byProvider {
		providers = append(providers, p)
	}
	sort.Strings(providers)
	var restored int64
	for _, group := range s.slotGroups(providers) {
		n, err := s.renewGroup(ctx, group, byProvider)
		if err != nil {
			s.stale.Store(true)
			return err
		}
		restored += n
	}
	if restored > 0 {
		s.log.Info("shared state: put back leases that went missing", zap.Int64("leases", restored))
	} else if wasStale {
		if ce := s.log.Check(zap.DebugLevel, "shared state: leases re-asserted; none was missing"); ce != nil {
			ce.Write()
		}
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
	if wasStale {
		// The leases are back: what else this node keeps in the store
		// (its ledger) is written again too.
		s.cfg.Hooks.reasserted()
	}
	return nil
}

// slotGroups splits providers into the groups a script may touch
// together: all of them, or in Cluster mode one each.
func (s *Store) slotGroups(providers []string) [][]string {
	if !s.perSlot {
		return [][]string{providers}
	}
	out := make([][]string, len(providers))
	for i, p := range providers {
		out[i] = []string{p}
	}
	return out
}

// renewGroup runs the renewal script over providers (one slot group) and
// returns how many leases it put back.
func (s *Store) renewGroup(ctx context.Context, providers []string, byProvider map[string][]*Lease) (int64, error) {
	keys := make([]string, 0, len(providers))
	args := []any{time.Duration(s.cfg.LeaseTTL).Milliseconds(), s.channel()}
	for _, p := range providers {
		keys = append(keys, s.leaseKey(p))
		ls := byProvider[p]
		args = append(args, s.newsOf(p).released, len(ls))
		for _, l := range ls {
			args = append(args, l.member)
		}
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	res, err := renewScript.Run(ctx, s.rdb, keys, args...).Int64Slice()
	if err == nil && len(res) != 1+len(providers) {
		err = fmt.Errorf("unexpected reply %v", res)
	}
	if err != nil {
		return 0, s.fail("renew leases", err)
	}
	for i, p := range providers {
		s.sawLive(p, int(res[1+i]))
	}
	return res[0], nil
}

// reassert puts back the held leases when a call failed or the master
// changed since they were last asserted; Acquire calls it before it takes
// a slot, so no session is admitted through a new master before this
// node's live sessions count there.
func (s *Store) reassert(ctx context.Context) error {
	if !s.stale.Load() {
		return nil
	}
	return s.renewNow(ctx)
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
	if cc, ok := s.rdb.(*redis.ClusterClient); ok && s.stale.Load() {
		// After a failed call the slot map may be out of date (a master
		// replaced by its replica): read it again, rather than wait for
		// the client's own refresh.
		cc.ReloadState(ctx)
	}
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return s.fail(op, err)
	}
	// Back after an outage or a failover: the leases are put back at
	// once, not at the next renewal.
	return s.reassert(ctx)
}

// Closed reports whether Close was called.
func (s *Store) Closed() bool { return s.isClosed() }
