package gateway

import (
	"context"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// releaseGrace bounds how long a process exit waits for the releases of
// provider sessions still in flight.
const releaseGrace = 15 * time.Second

// finishReleases waits, at process exit, until the provider sessions whose
// release is under way are released, and the create calls still in flight
// have answered and what they created is released (or releaseGrace has
// passed); the logger hears of any left.
func finishReleases(reg *pool.Registry, logger *zap.Logger) {
	rel := reg.Releaser()
	if rel.Wait(time.Now().Add(releaseGrace)) || logger == nil {
		return
	}
	logger.Error("provider sessions left unreleased at exit", zap.Int("pending", rel.Pending()))
}

// setupRegistry readies a new registry: its releaser tells the log of what
// an operator must hear of.
func setupRegistry(reg *pool.Registry) {
	rel := reg.Releaser()
	// A failed release call is worth a line in the log: the provider may
	// bill a session nobody uses. The cause never holds a URL or a header.
	rel.OnFailure = func(provider string, err error) {
		caddy.Log().Named("http.handlers.browser_failover").Warn("provider session release failed",
			zap.String("provider", provider), zap.String("cause", err.Error()))
	}
	// A session nobody can release bills until the provider ends it: an
	// operator must hear of it. The message stays the same when the ID was
	// read but refused (the cause says so). The cause never holds a
	// header, a URL or the answer's body.
	rel.OnOrphan = func(provider, cause string) {
		caddy.Log().Named("http.handlers.browser_failover").Error("provider session cannot be released: the create answer gave no session ID",
			zap.String("provider", provider), zap.String("cause", cause))
	}
	// A session a gone process left behind, released: the operator sees
	// which, and from which process.
	rel.OnReaped = func(provider, id, from string) {
		caddy.Log().Named("http.handlers.browser_failover").Info("session reaped",
			zap.String("provider", provider), zap.String("provider_session_id", id), zap.String("owner", from))
	}
	rel.OnLedgerError = func(provider string, err error) {
		caddy.Log().Named("http.handlers.browser_failover").Error("ledger of provider sessions: write failed",
			zap.String("provider", provider), zap.Error(err))
	}
}

// provisionLedger opens the process's ledger of created provider sessions
// (on the config's storage, or in Redis under state redis) when a provider
// of the handler has a session API, and tells the reaper how to release a
// session left at each of them.
func (h *Gateway) provisionLedger(ctx caddy.Context, known func(string) string) {
	r := h.current()
	creates := slices.ContainsFunc(r.templates, (*upstreams.Provider).CreatesSessions)
	for _, m := range slices.Concat(r.members, r.leaving) {
		creates = creates || m.up.CreatesSessions()
	}
	if !creates {
		return
	}
	node := cluster.DefaultNode()
	if h.State != nil {
		if n := known(h.State.Node); n != "" {
			node = n
		}
	}
	logger := h.logger
	o := pool.LedgerOptions{Store: ctx.Storage(), Node: node, ReapEvery: time.Duration(h.ReapInterval),
		OnError: func(op string, err error) {
			logger.Warn("ledger of provider sessions", zap.String("op", op), zap.Error(err))
		}}
	if h.shared != nil {
		// Under state redis every node's entries and heartbeat are in
		// Redis, so the surviving nodes reap a node that died.
		s := h.shared.s
		ttl := s.Store().LeaseTTL()
		o.Store, o.Heartbeat, o.OwnerGone = s.Store().Ledger(), ttl/3, ttl
		// What an older version left in its layout is still reaped.
		o.Legacy = s.Store().Ledger().Legacy()
		s.Retain()
		o.OnClose = s.Release
		if !h.reg.Ledger.Open(o) {
			s.Release()
		}
	} else {
		h.reg.Ledger.Open(o)
	}
	for _, m := range slices.Concat(r.members, r.leaving) {
		h.adopter(m, known)
	}
}

// adopter tells the reaper how to release a session left at m, when m
// creates its sessions over a session API.
func (h *Gateway) adopter(m *member, known func(string) string) {
	up := m.up
	if !up.CreatesSessions() {
		return
	}
	a := pool.Adopter{Adopt: func(id, from string) *upstreams.Remote { return up.Adopt(id, from, known) }}
	if up.ReapsUntracked() {
		a.List = func(ctx context.Context) ([]string, error) { return up.ListSessions(ctx, known) }
	}
	h.reg.Ledger.SetAdopter(up.Name, a)
}
