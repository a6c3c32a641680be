package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// stores holds the process's open stores, one *Shared per distinct settings
// and node name. Every handler using those settings is a user of the entry,
// and so is every live session holding a lease of it: a config reload that
// keeps the settings keeps the store, its leases and their renewals.
var stores = caddy.NewUsagePool()

// stateRetry is how long a Shared goes without asking an unreachable store
// again: meanwhile connects do not each wait for its timeout.
const stateRetry = time.Second

// Shared is one open Store shared by the users of its settings, with the
// gateway's view of whether the shared state answers: after a failed call
// it is left alone for stateRetry (Usable reports false) while a watcher
// pings it until it answers again. It is closed when its last user lets go.
// Its methods are safe for concurrent use.
type Shared struct {
	key    string
	store  *Store
	logger *zap.Logger
	hooks  Hooks

	// mu orders Retain and Release of this Shared with its leaving the
	// pool; gone is set when it has left it (its store closing).
	mu   sync.Mutex
	gone atomic.Bool

	downUntil atomic.Int64 // unix ns: don't ask before then
	down      atomic.Bool
}

// DefaultNode is this process's node name when none is configured:
// <hostname>-<pid>.
func DefaultNode() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "gateway"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// poolKey identifies cfg and node in the pool without holding the
// password in clear: it is a SHA-256 of every setting.
func poolKey(cfg Config, node string) string {
	tlsKey := "plain"
	if cfg.TLS != nil {
		tlsKey = fmt.Sprintf("tls|%s|%v|%q", cfg.TLS.ServerName, cfg.TLS.InsecureSkipVerify, cfg.TLS.TrustedCACertFiles)
	}
	sentinelKey := "-"
	if cfg.Sentinel != nil {
		sentinelKey = fmt.Sprintf("%q|%q|%q|%q", cfg.Sentinel.Master, cfg.Sentinel.Addresses, cfg.SentinelUsername, cfg.SentinelPassword)
	}
	sum := sha256.Sum256([]byte(fmt.Sprintf("%q|%s|%q|%q|%q|%d|%q|%s|%v|%v|%q",
		cfg.Address, sentinelKey, cfg.Cluster, cfg.Username, cfg.Password, cfg.DB, cfg.KeyPrefix, tlsKey, cfg.LeaseTTL, cfg.Timeout, node)))
	return hex.EncodeToString(sum[:])
}

// Use adds a user to the process's store for cfg and node, opening it (as
// Open does, with logger as cfg.Logger) on first use; the store's users
// share the first one's cfg.Hooks. The caller gives its use back with
// Release exactly once; on error there is nothing to give back.
func Use(cfg Config, node string, logger *zap.Logger) (*Shared, error) {
	if logger == nil {
		logger = zap.NewNop()
	}
	key := poolKey(cfg, node)
	v, _, err := stores.LoadOrNew(key, func() (caddy.Destructor, error) {
		cfg.Logger = logger
		st, err := openStore(cfg, node, cfg.Hooks.failover)
		if err != nil {
			return nil, err
		}
		s := &Shared{key: key, store: st, logger: logger, hooks: cfg.Hooks}
		// A failed renewal or lease write says Redis is away as a
		// failed call does: an idle node notices too.
		failed := s.Failed
		st.c.onFailed.Store(&failed)
		s.hooks.opened()
		// Up until a call says otherwise; a first check tells soon.
		s.hooks.up(true)
		go func() {
			if err := st.Ping(context.Background()); err != nil {
				s.Failed("ping", err)
			}
		}()
		return s, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*Shared), nil
}

// Retain adds a user to s, such as a live session whose lease s renews; it
// gives it back with Release. Once s is closed Retain does nothing, and
// neither does the matching Release.
func (s *Shared) Retain() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone.Load() {
		return
	}
	// s is in the pool under its key until the Release that leaves it
	// without users, which holds mu: this only counts one more user.
	stores.LoadOrStore(s.key, s)
}

// Release gives back a use taken with Use or Retain. The last one closes
// the store, on another goroutine: Close waits for the calls in flight and
// gives back the leases still held.
func (s *Shared) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone.Load() {
		return
	}
	_, _ = stores.Delete(s.key)
}

// Destruct implements caddy.Destructor: the pool calls it when the last
// user of s has let go.
func (s *Shared) Destruct() error {
	s.gone.Store(true)
	s.hooks.closed()
	go s.store.Close()
	return nil
}

// Store returns the open store.
func (s *Shared) Store() *Store { return s.store }

// Usable tells whether to ask the store now (false during the back-off
// after it could not be reached).
func (s *Shared) Usable() bool {
	return time.Now().UnixNano() >= s.downUntil.Load()
}

// Failed notes that the store could not be reached for op, a fixed word
// (acquire, publish, status, ping, reset, and the store's own renew and
// write), and tells the Hooks. While it
// is down a watcher pings it every stateRetry, so its coming back shows (in
// the log and the Hooks) even on a node that serves nobody.
func (s *Shared) Failed(op string, err error) {
	s.hooks.failed(op)
	s.downUntil.Store(time.Now().Add(stateRetry).UnixNano())
	if s.down.CompareAndSwap(false, true) {
		s.hooks.up(false)
		s.logger.Warn("shared state unavailable", zap.String("op", op), zap.Error(err))
		go s.watch()
	}
}

// watch pings the store until it answers again or is closed.
func (s *Shared) watch() {
	t := time.NewTicker(stateRetry)
	defer t.Stop()
	for range t.C {
		if !s.down.Load() {
			return
		}
		err := s.store.Ping(context.Background())
		if err == nil {
			s.Worked()
			return
		}
		if s.store.Closed() {
			return
		}
	}
}

// Worked notes a successful call, and tells the Hooks.
func (s *Shared) Worked() {
	if s.down.CompareAndSwap(true, false) {
		s.downUntil.Store(0)
		s.logger.Info("shared state available again")
	}
	s.hooks.up(true)
}

// ClusterStates returns the state of each of providers, all read in one
// round trip, and whether the store answered; when it did not, each
// state holds only this node's name (Up false). While the store is known
// to be down (Usable is false) nothing is asked: the status answers at
// once with the local figures.
func (s *Shared) ClusterStates(ctx context.Context, providers []string) (map[string]ProviderState, bool) {
	node := s.store.Node()
	out := make(map[string]ProviderState, len(providers))
	down := func() (map[string]ProviderState, bool) {
		for _, p := range providers {
			out[p] = ProviderState{Node: node}
		}
		return out, false
	}
	if !s.Usable() {
		return down()
	}
	shares, err := s.store.Leases().Snapshot(ctx, providers)
	if err != nil {
		if errors.Is(err, ErrUnavailable) {
			s.Failed("status", err)
		}
		return down()
	}
	s.Worked()
	for _, p := range providers {
		out[p] = ProviderState{Node: node, Up: true, Share: shares[p]}
	}
	return out, true
}

// Endpoint is how a node reaches the shared state, as its status shows
// it: the mode, and the master in use (for a cluster, its seed
// addresses). It holds no credential.
type Endpoint struct {
	Mode    string `json:"mode"`
	Address string `json:"address"`
}

// Endpoint returns how the store reaches Redis now.
func (s *Shared) Endpoint() Endpoint {
	return Endpoint{Mode: s.store.Mode(), Address: s.store.Address()}
}

// ClusterActive is the provider's live sessions over every node as last
// read, and whether that reading is recent (see Leases.Live).
func (s *Shared) ClusterActive(provider string) (int, bool) {
	return s.store.Leases().Live(provider)
}

// ResetShared ends provider's shared cooldown (an operator's reset); the
// other nodes reset it too when they hear of it.
func (s *Shared) ResetShared(ctx context.Context, provider string) {
	if !s.Usable() {
		return
	}
	if err := s.store.News().ClearCooldown(ctx, provider); err != nil {
		s.Failed("reset", err)
		return
	}
	s.Worked()
}

// Interface guard.
var _ caddy.Destructor = (*Shared)(nil)
