package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Store is one node's handle on the shared state, made of parts that each
// keep their own state and locks: the connection to Redis (conn.go), this
// node's slot leases (Leases), the news the nodes tell each other and the
// providers' shared holds (News), the spend totals (Spend), the ledger
// storage (LedgerStore), the WebDriver sessions' routes (Routes) and the
// providers' create_rate windows (Rates) and the browser profiles in use
// (Profiles). The
// Store opens and closes them in order and gives access to them; what
// needs nothing but the connection (the resumable sessions, the shared
// secret) is its own. It is safe for concurrent use. Open it once per
// node and Close it when the node stops.
type Store struct {
	c        *conn
	leases   *Leases
	news     *News
	spend    *Spend
	ledger   *LedgerStore
	routes   *Routes
	rates    *Rates
	profiles *Profiles
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
	c := newConn(cfg, node, tc, onFailover)
	watched := &watchList{set: map[string]struct{}{}}
	news := newNews(c, watched)
	leases := newLeases(c, news, watched)
	// Another node waiting for a slot is news that frees the spares.
	news.onWanted = leases.noteWanted
	s := &Store{c: c, leases: leases, news: news, spend: newSpend(c), ledger: &LedgerStore{c: c}, routes: newRoutes(c), rates: &Rates{c: c, news: news},
		profiles: newProfiles(c)}
	go leases.r.loop()
	go s.profiles.loop()
	return s, nil
}

// Leases returns this node's slot leases: acquiring, registering and
// releasing them, and the live counts over every node.
func (s *Store) Leases() *Leases { return s.leases }

// News returns the news of the shared state: the subscriptions to what
// the nodes publish, and the providers' shared cooldowns and skips.
func (s *Store) News() *News { return s.news }

// Spend returns the spend totals kept over every node.
func (s *Store) Spend() *Spend { return s.spend }

// Ledger returns the store's ledger storage.
func (s *Store) Ledger() *LedgerStore { return s.ledger }

// Routes returns the WebDriver sessions' routes and their last activity.
func (s *Store) Routes() *Routes { return s.routes }

// Rates returns the providers' create_rate windows over every node.
func (s *Store) Rates() *Rates { return s.rates }

// Profiles returns the browser profiles in use over every node.
func (s *Store) Profiles() *Profiles { return s.profiles }

// Mode tells how the store reaches Redis: ModeStandalone, ModeSentinel or
// ModeCluster.
func (s *Store) Mode() string { return s.c.mode }

// Address is the server in use: the address of a single server, the
// master a Sentinel named last (empty before the first connection), or a
// cluster's seed addresses joined by commas.
func (s *Store) Address() string { return s.c.address() }

// Failovers counts the changes of master this store followed (not the
// first discovery).
func (s *Store) Failovers() int64 { return s.c.failovers.Load() }

// Node returns the name of this node, as given to Open.
func (s *Store) Node() string { return s.c.node }

// LeaseTTL is how long a lease outlives a node that stopped renewing it.
func (s *Store) LeaseTTL() time.Duration { return time.Duration(s.c.cfg.LeaseTTL) }

// Ping checks that the Redis server answers. Errors wrap ErrUnavailable.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := s.c.ctx(ctx)
	defer cancel()
	if err := s.c.ping(ctx); err != nil {
		return err
	}
	// Back after an outage or a failover: the leases are put back at
	// once, not at the next renewal.
	return s.leases.reassert(ctx)
}

// Closed reports whether Close was called.
func (s *Store) Closed() bool { return s.c.closed.Load() }

// Close stops the renewals and the subscriptions, releases every lease
// still held (best effort, one round trip bounded by Timeout: if Redis is
// down they simply expire) and closes the connections. Leases released
// later are no-ops. Close is idempotent; it must not be called from a
// Subscribe callback.
func (s *Store) Close() error {
	if !s.c.closed.CompareAndSwap(false, true) {
		return nil
	}
	held := s.leases.shut() // nothing taken from now on; no more renewals
	locks := s.profiles.stop()
	s.spend.close()       // its last write
	s.leases.finish(held) // the held leases given back, the calls in flight done
	s.profiles.giveBack(locks)
	s.news.close() // the subscriptions ended
	return s.c.close()
}
