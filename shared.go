package browserfailover

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

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Shared state (state redis): live-session slots are leases in Redis, so
// max_concurrent holds across every gateway node, and a cooldown started by
// one node is honoured by all.

// WordStateUnavailable is the skip word of a provider passed over because
// the shared state could not be reached (on_unavailable reject).
const WordStateUnavailable = "state_unavailable"

// stateRetry is how long the gateway goes without asking an unreachable
// store again: meanwhile connects do not each wait for its timeout.
const stateRetry = time.Second

// sharedStore is one open cluster.Store, shared by every handler with the
// same state settings and kept open while any handler or live session uses
// it (a reload keeps its leases renewed).
type sharedStore struct {
	key   string
	store *cluster.Store
	refs  int

	downUntil atomic.Int64 // unix ns: don't ask before then
	down      atomic.Bool
	logger    *zap.Logger
}

var (
	storesMu sync.Mutex
	stores   = map[string]*sharedStore{}
)

// defaultNode is this process's node name: <hostname>-<pid>.
func defaultNode() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "gateway"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// openStore returns the process's store for cfg, opening it on first use.
func openStore(cfg cluster.Config, node string, logger *zap.Logger) (*sharedStore, error) {
	// The key identifies the settings without holding the password.
	tlsKey := "plain"
	if cfg.TLS != nil {
		tlsKey = fmt.Sprintf("tls|%s|%v|%q", cfg.TLS.ServerName, cfg.TLS.InsecureSkipVerify, cfg.TLS.CAFiles)
	}
	sum := sha256.Sum256([]byte(fmt.Sprintf("%q|%q|%q|%d|%q|%s|%v|%v|%q",
		cfg.Address, cfg.Username, cfg.Password, cfg.DB, cfg.KeyPrefix, tlsKey, cfg.LeaseTTL, cfg.Timeout, node)))
	key := hex.EncodeToString(sum[:])
	storesMu.Lock()
	defer storesMu.Unlock()
	if s := stores[key]; s != nil {
		s.refs++
		return s, nil
	}
	cfg.Logger = logger
	st, err := cluster.Open(cfg, node)
	if err != nil {
		return nil, err
	}
	s := &sharedStore{key: key, store: st, refs: 1, logger: logger}
	stores[key] = s
	observe.SharedStateOpened()
	// Up until a call says otherwise; a first check tells soon.
	observe.SharedStateUp(true)
	go func() {
		if err := st.Ping(context.Background()); err != nil {
			s.failed("ping", err)
		}
	}()
	return s, nil
}

// retain adds a user (a live session holding a lease).
func (s *sharedStore) retain() {
	storesMu.Lock()
	s.refs++
	storesMu.Unlock()
}

// release drops a user; the last one closes the store.
func (s *sharedStore) release() {
	storesMu.Lock()
	s.refs--
	last := s.refs == 0
	if last {
		delete(stores, s.key)
	}
	storesMu.Unlock()
	if last {
		observe.SharedStateClosed()
		go s.store.Close()
	}
}

// usable tells whether to ask the store now (false during the back-off
// after it could not be reached).
func (s *sharedStore) usable() bool {
	return time.Now().UnixNano() >= s.downUntil.Load()
}

// failed notes that the store could not be reached for op. While it is
// down a watcher pings it every stateRetry, so its coming back shows (in
// the log and shared_state_up) even on a node that serves nobody.
func (s *sharedStore) failed(op string, err error) {
	observe.SharedStateError(op)
	s.downUntil.Store(time.Now().Add(stateRetry).UnixNano())
	if s.down.CompareAndSwap(false, true) {
		observe.SharedStateUp(false)
		s.logger.Warn("shared state unavailable", zap.String("op", op), zap.Error(err))
		go s.watch()
	}
}

// watch pings the store until it answers again or is closed.
func (s *sharedStore) watch() {
	t := time.NewTicker(stateRetry)
	defer t.Stop()
	for range t.C {
		if !s.down.Load() {
			return
		}
		err := s.store.Ping(context.Background())
		if err == nil {
			s.worked()
			return
		}
		if s.store.Closed() {
			return
		}
	}
}

// worked notes a successful call.
func (s *sharedStore) worked() {
	if s.down.CompareAndSwap(true, false) {
		s.downUntil.Store(0)
		s.logger.Info("shared state available again")
	}
	observe.SharedStateUp(true)
}

// shared is a handler's use of a store.
type shared struct {
	s      *sharedStore
	reject bool // on_unavailable reject
	cancel func()
}

// provisionShared opens the handler's shared state and subscribes to the
// other nodes' news.
func (h *Handler) provisionShared() error {
	st := h.State
	if st == nil {
		for _, m := range h.members {
			m.state.SetCluster(nil)
		}
		return nil
	}
	repl := caddy.NewReplacer()
	r := st.Redis
	cfg := cluster.Config{
		Address:   repl.ReplaceKnown(r.Address, ""),
		Username:  repl.ReplaceKnown(r.Username, ""),
		Password:  repl.ReplaceKnown(r.Password, ""),
		DB:        r.DB,
		KeyPrefix: r.KeyPrefix,
		LeaseTTL:  time.Duration(r.LeaseTTL),
		Timeout:   time.Duration(r.Timeout),
	}
	if r.TLS != nil {
		cfg.TLS = &cluster.TLS{ServerName: r.TLS.ServerName, InsecureSkipVerify: r.TLS.InsecureSkipVerify, CAFiles: r.TLS.TrustedCACertFiles}
	}
	node := repl.ReplaceKnown(st.Node, "")
	if node == "" {
		node = defaultNode()
	}
	s, err := openStore(cfg, node, h.logger)
	if err != nil {
		return fmt.Errorf("state redis: %w", err)
	}
	h.shared = &shared{s: s, reject: st.OnUnavailable == "reject"}
	for _, m := range h.members {
		m.state.SetCluster(s)
	}
	byName := make(map[string]*member, len(h.members))
	for _, m := range h.members {
		byName[m.up.Name] = m
	}
	h.shared.cancel = s.store.Subscribe(func(e cluster.Event) {
		m := byName[e.Provider]
		if m == nil {
			return
		}
		switch e.Kind {
		case cluster.EventReleased:
			// A slot freed somewhere: waiters here may take it.
			m.state.Notify()
		case cluster.EventCooldown:
			if e.Node != s.store.Node() {
				h.adoptCooldown(s.store, m, e.Until, -1)
			}
		case cluster.EventRecovered:
			// An operator reset the provider through another node.
			if e.Node != s.store.Node() {
				m.state.Reset()
				h.logger.Info("provider reset through another node", zap.String("provider", m.up.Name), zap.String("node", e.Node))
			}
		}
	})
	return nil
}

// cleanupShared undoes provisionShared. h.shared stays set: requests of
// this handler still running (a long queue wait across a reload) go on
// using the store, or fall back to local limits once it is closed.
func (h *Handler) cleanupShared() {
	if h.shared == nil {
		return
	}
	h.shared.cancel()
	h.shared.s.release()
}

// adoptCooldown takes on a cooldown another node started; streak -1 asks
// the store for it.
func (h *Handler) adoptCooldown(store *cluster.Store, m *member, until time.Time, streak int) {
	if streak < 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var err error
		_, streak, err = store.Cooldown(ctx, m.up.Name)
		cancel()
		if err != nil {
			streak = 0
		}
	}
	if m.state.Health.Adopt(until, streak) {
		m.state.WakeAt(until)
		h.logger.Info("provider cooling down",
			zap.String("provider", m.up.Name),
			zap.Time("until", until),
			zap.String("reason", "shared"))
	}
}

// publishCooldown tells the other nodes of a cooldown started here.
func (h *Handler) publishCooldown(name string, until time.Time, streak int) {
	sh := h.shared
	if sh == nil {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := sh.s.store.PublishCooldown(ctx, name, until, streak); err != nil {
			sh.s.failed("publish", err)
			return
		}
		sh.s.worked()
	}()
}

// claimShared takes m's cluster-wide slot for an attempt. It reports false
// when m is to be skipped (full across the cluster, in a shared cooldown,
// or the store unreachable under on_unavailable reject); the skip is
// recorded. A nil lease with true: no shared state, or the store is down
// and this node's own limits apply.
func (c *connect) claimShared(ps *passState, m *member) (*cluster.Lease, bool) {
	sh := c.h.shared
	if sh == nil {
		return nil, true
	}
	if !sh.s.usable() {
		return c.stateDown(ps, m)
	}
	g, err := sh.s.store.Acquire(c.r.Context(), m.up.Name, int(m.state.MaxConcurrent()))
	if err != nil {
		if c.r.Context().Err() != nil {
			return nil, true // the client left; the attempt will see it
		}
		sh.s.failed("acquire", err)
		return c.stateDown(ps, m)
	}
	sh.s.worked()
	switch {
	case !g.CooldownUntil.IsZero():
		c.h.adoptCooldown(sh.s.store, m, g.CooldownUntil, g.Streak)
		c.skip(m, upstreams.WordCooldown)
		return nil, false
	case g.Full:
		m.state.SkippedFull()
		c.skip(m, upstreams.WordFull)
		// A slot freed on another node wakes waiters through pub/sub;
		// should that news be lost, they retry every second.
		ps.retry = true
		return nil, false
	}
	return g.Lease, true
}

// stateDown applies on_unavailable while the store cannot be reached.
func (c *connect) stateDown(ps *passState, m *member) (*cluster.Lease, bool) {
	if c.h.shared.reject {
		// Refused now, and not worth waiting for: the client gets 503.
		c.skip(m, WordStateUnavailable)
		ps.stateDown++
		return nil, false
	}
	return nil, true
}

// releaseLease gives a lease back without holding up the caller.
func releaseLease(l *cluster.Lease) {
	if l != nil {
		go l.Release()
	}
}

// ClusterStatus is the "cluster" object of a provider's status.
func (s *sharedStore) ClusterStatus(ctx context.Context, provider string) any {
	type share struct {
		Node          string         `json:"node"`
		Active        int            `json:"active"`
		Nodes         map[string]int `json:"nodes"`
		CooldownUntil *time.Time     `json:"cooldown_until"`
	}
	shares, err := s.store.Snapshot(ctx, []string{provider})
	if err != nil {
		if errors.Is(err, cluster.ErrUnavailable) {
			s.failed("status", err)
		}
		return map[string]string{"node": s.store.Node(), "error": "shared state unavailable"}
	}
	s.worked()
	sh := shares[provider]
	out := share{Node: s.store.Node(), Active: sh.Active, Nodes: sh.Nodes}
	if out.Nodes == nil {
		out.Nodes = map[string]int{}
	}
	if !sh.CooldownUntil.IsZero() {
		u := sh.CooldownUntil.UTC()
		out.CooldownUntil = &u
	}
	return out
}

// ResetShared ends provider's shared cooldown (an operator's reset); the
// other nodes reset it too when they hear of it.
func (s *sharedStore) ResetShared(ctx context.Context, provider string) {
	if err := s.store.ClearCooldown(ctx, provider); err != nil {
		s.failed("reset", err)
		return
	}
	s.worked()
}
