package gateway

import (
	"context"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/config"
	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/spend"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Shared state (state redis): live-session slots are leases in Redis, so
// max_concurrent holds across every gateway node, and a cooldown or a
// 408/429 skip started by one node is honoured by all, as what it is.

// sharedHooks count how the shared state fares in the metrics (the
// shared_state_up gauge, shown while a store is open, and
// shared_state_errors_total by operation, shared_state_failovers_total),
// and have the registry write its ledger again once the leases are back.
func sharedHooks(reg *pool.Registry) cluster.Hooks {
	m := reg.Metrics()
	return cluster.Hooks{
		Opened:   m.SharedStateOpened,
		Closed:   m.SharedStateClosed,
		Up:       m.SharedStateUp,
		Failed:   m.SharedStateError,
		Failover: m.SharedStateFailover,
		// Once the leases are back after an outage or a failover, the
		// ledger is written again too.
		Reasserted: reg.Ledger.Reassert,
	}
}

// WordStateUnavailable is the skip word of a provider passed over because
// the shared state could not be reached (on_unavailable reject).
const WordStateUnavailable = "state_unavailable"

// provisionShared opens the handler's shared state, its placeholders
// resolved by known, and subscribes to the other nodes' news; the news of
// WebDriver sessions goes to webdriver.
func (h *Gateway) provisionShared(known func(string) string, webdriver func(cluster.Event)) error {
	st := h.State
	if st == nil {
		for _, m := range h.current().members {
			h.shareMember(m)
		}
		return nil
	}
	cfg := st.Redis.Config.Resolved(known)
	node := known(st.Node)
	if node == "" {
		node = cluster.DefaultNode()
	}
	// The clock the providers' health runs on, for the shared state to
	// give the ends of cooldowns and skips on it.
	cfg.Clock = h.reg.Clock()
	cfg.Hooks = sharedHooks(h.reg)
	s, err := cluster.Use(cfg, node, h.logger)
	if err != nil {
		return fmt.Errorf("state redis: %w", err)
	}
	h.shared = &shared{s: s, reject: st.OnUnavailable == "reject", stop: make(chan struct{})}
	r := h.current()
	for _, m := range slices.Concat(r.members, r.leaving) {
		h.shareMember(m)
	}
	priced := slices.ContainsFunc(h.Providers, func(p *config.ProviderConfig) bool { return p.Cost != nil }) ||
		slices.ContainsFunc(h.DynamicProviders, func(b *config.ProvidersConfig) bool { return b.Cost != nil })
	if h.ClientBudget != nil || priced {
		// Budgets count what the other nodes' sessions cost.
		go h.syncSpend()
	}
	h.shared.cancel = s.Store().News().Subscribe(func(e cluster.Event) {
		switch e.Kind {
		case cluster.EventWebDriverEnd, cluster.EventWebDriverEnded:
			webdriver(e)
			return
		}
		if e.Kind == cluster.EventProfileFree {
			// A profile given back by another node: its waiters here
			// may take it.
			if n, ok := profileNameOf(e.Session); ok {
				h.reg.Profiles.Wake(n)
			}
			return
		}
		if e.Kind == cluster.EventResumed {
			// Taken back through another node: this node's entry of it
			// is stale.
			if e.Node != s.Store().Node() {
				h.reg.Parked.RemoveShared(e.Session)
			}
			return
		}
		m := h.current().named(e.Provider)
		if m == nil {
			return
		}
		switch e.Kind {
		case cluster.EventReleased:
			// A slot freed somewhere: waiters here may take it.
			m.state.Notify()
		case cluster.EventCooldown, cluster.EventSkip:
			if e.Node != s.Store().Node() {
				hold := cluster.Hold{CooldownUntil: e.Until, Streak: e.Streak}
				if e.Kind == cluster.EventSkip {
					hold = cluster.Hold{SkipUntil: e.Until}
				}
				h.adoptHold(m, hold)
			}
		case cluster.EventRecovered:
			// An operator reset the provider through another node.
			if e.Node != s.Store().Node() {
				m.state.Reset()
				h.logger.Info("provider reset through another node", zap.String("provider", m.up.Name), zap.String("node", e.Node))
			}
		}
	})
	return nil
}

// shareMember has m's state read its cluster-wide figures from the
// handler's store, and the renewals count its live sessions over every
// node, so this node's status and metrics show when they are above
// max_concurrent; without state redis its state is its own.
func (h *Gateway) shareMember(m *member) {
	if h.shared == nil {
		m.state.SetCluster(nil)
		return
	}
	m.state.SetCluster(h.shared.s)
	h.shared.s.Store().Leases().Watch(m.up.Name)
}

// unshareMember stops watching a provider the handler let go of, once no
// config uses its name.
func (h *Gateway) unshareMember(m *member) {
	if h.shared == nil {
		return
	}
	if _, ok := h.reg.Lookup(m.up.Name); !ok {
		h.shared.s.Store().Leases().Unwatch(m.up.Name)
	}
}

// cleanupShared undoes provisionShared. h.shared stays set: requests of
// this handler still running (a long queue wait across a reload) go on
// using the store, or fall back to local limits once it is closed.
func (h *Gateway) cleanupShared() {
	if h.shared == nil {
		return
	}
	h.shared.cancel()
	close(h.shared.stop)
	h.shared.s.Release()
}

// adoptHold takes on what another node learnt of a provider: a failure
// cooldown as a cooldown (a single trial here too when it ends, the
// doubling going on from the larger streak), a 408/429 skip as a skip (no
// trial, no doubling, nothing counted).
func (h *Gateway) adoptHold(m *member, hold cluster.Hold) {
	if !hold.CooldownUntil.IsZero() && m.state.Health.Adopt(hold.CooldownUntil, hold.Streak) {
		m.state.WakeAt(hold.CooldownUntil)
		m.state.Probes.NextBy(hold.CooldownUntil)
		h.logger.Info("provider cooling down",
			zap.String("provider", m.up.Name),
			zap.Time("until", hold.CooldownUntil),
			zap.String("reason", "shared"))
	}
	if !hold.SkipUntil.IsZero() && m.state.Health.AdoptSkip(hold.SkipUntil) {
		m.state.WakeAt(hold.SkipUntil)
		m.state.Probes.NextBy(hold.SkipUntil)
		h.logger.Info("provider skipped",
			zap.String("provider", m.up.Name),
			zap.Time("until", hold.SkipUntil),
			zap.String("reason", "shared"))
	}
}

// publishHold tells the other nodes of a cooldown or a 408/429 skip that
// started here (change says which), with its end on this node's clock.
func (h *Gateway) publishHold(st *pool.ProviderState, change cooldown.Change) {
	sh := h.shared
	if sh == nil {
		return
	}
	cooldownUntil, skipUntil := st.Health.Ends()
	streak := st.Health.Streak()
	name := st.Name()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		switch {
		case change == cooldown.CooledDown && !cooldownUntil.IsZero():
			err = sh.s.Store().News().PublishCooldown(ctx, name, cooldownUntil, streak)
		case change == cooldown.Skipped && !skipUntil.IsZero():
			err = sh.s.Store().News().PublishSkip(ctx, name, skipUntil)
		default:
			return
		}
		if err != nil {
			sh.s.Failed("publish", err)
			return
		}
		sh.s.Worked()
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
	if !sh.s.Usable() {
		return c.stateDown(ps, m)
	}
	var g cluster.Grant
	var err error
	if m.state.Slots.LearntCap() == nil && m.state.Slots.Limit() == 0 && !sh.reject && sh.s.Store().News().Hearing() {
		// No cap to hold across the nodes: the slot is only counted,
		// written in the background with others, and the connect waits
		// for no round trip. A shared cooldown or skip reaches this
		// node as news, which it hears (else the acquire below asks).
		// Under on_unavailable reject every connect asks: only a call
		// tells that Redis answers.
		l, err := sh.s.Store().Leases().Register(m.up.Name)
		if err != nil {
			sh.s.Failed("acquire", err)
			return c.stateDown(ps, m)
		}
		return l, true
	}
	if l := m.state.Slots.LearntCap(); l != nil {
		// The cap learnt over every node, in the same round trip.
		g, err = sh.s.Store().Leases().AcquireLearnt(c.r.Context(), m.up.Name, m.state.Spend.Pricing().Interval)
		if err == nil && g.Cap > 0 {
			l.Adopt(int64(g.Cap), c.h.reg.Now())
		}
	} else if sh.reject {
		g, err = sh.s.Store().Leases().AcquireAsking(c.r.Context(), m.up.Name, int(m.state.Slots.Limit()))
	} else {
		g, err = sh.s.Store().Leases().Acquire(c.r.Context(), m.up.Name, int(m.state.Slots.Limit()))
	}
	if err != nil {
		if c.r.Context().Err() != nil {
			return nil, true // the client left; the attempt will see it
		}
		sh.s.Failed("acquire", err)
		return c.stateDown(ps, m)
	}
	sh.s.Worked()
	switch {
	case !g.Hold.IsZero():
		c.h.adoptHold(m, g.Hold)
		c.skip(m, upstreams.WordCooldown)
		return nil, false
	case g.Full:
		m.state.Slots.SkippedFull()
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

// spendSyncInterval is how often a node reads the shared spend totals of
// its providers and client keys, so budgets count what other nodes' ended
// sessions cost.
const spendSyncInterval = time.Second

// syncSpend reads the shared totals of the handler's providers and the
// client keys this node knows, every spendSyncInterval until Cleanup.
func (h *Gateway) syncSpend() {
	sh := h.shared
	t := time.NewTicker(spendSyncInterval)
	defer t.Stop()
	for {
		select {
		case <-sh.stop:
			return
		case <-t.C:
		}
		if !sh.s.Usable() {
			continue
		}
		var windows []cluster.SpendWindow
		var books []*spend.Book
		r := h.current()
		for _, m := range slices.Concat(r.members, r.leaving) {
			b := m.state.Spend.Book()
			windows = append(windows, cluster.SpendWindow{Scope: cluster.ProviderScope(m.up.Name), Start: b.Read().WindowStart})
			books = append(books, b)
		}
		if h.ClientBudget != nil {
			for _, cb := range h.reg.ClientBooks.Entries() {
				windows = append(windows, cluster.SpendWindow{Scope: cluster.ClientScope(cb.Scope), Start: cb.Book.Read().WindowStart})
				books = append(books, cb.Book)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		totals, err := sh.s.Store().Spend().ReadSpend(ctx, windows)
		cancel()
		if err != nil {
			sh.s.Failed("read spend", err)
			continue
		}
		for i, total := range totals {
			books[i].SetShared(windows[i].Start, total, 0)
		}
	}
}

// learnSharedCap learns a provider's cap over every node from its 429:
// its live leases, less the refused attempt's own. It reports the cap (0:
// nothing live) and whether the store answered.
func (h *Gateway) learnSharedCap(st *pool.ProviderState) (int, bool) {
	sh := h.shared
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := sh.s.Store().Leases().LearnCap(ctx, st.Name())
	if err != nil {
		sh.s.Failed("learn cap", err)
		return 0, false
	}
	sh.s.Worked()
	if n > 0 {
		st.Slots.Refused(int64(n))
	}
	return n, true
}

// The status reads a provider's cluster-wide state from its store.
var _ pool.ClusterView = (*cluster.Shared)(nil)
