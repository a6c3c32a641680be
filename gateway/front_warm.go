package gateway

import (
	"context"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/options"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/sessions"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// The front of a warm-up: a session made at one provider before any
// client asks for one (warm.go keeps them). It has no client: no request,
// no queue, no order — one attempt at its provider, admitted and settled
// by the chain's own steps (chain.go's one), so a failed warm-up counts
// like any failed attempt. Its handshake is the gateway's own (a fresh
// key; the client's 101 is made from the provider's at hand-out), its
// session options those the warmer makes sessions with, and what it
// establishes is a warm session, ready for a client of its handler.

// provisionWarm starts, or takes over from the config before, the
// handler's warmer of each provider with warm.
func (h *Gateway) provisionWarm() {
	for _, m := range h.current().members {
		h.startWarm(m)
	}
}

// startWarm starts, or takes over from the config before, the handler's
// warmer of m when m has warm (m.warm then keeps it); m is not in use
// yet.
func (h *Gateway) startWarm(m *member) {
	pc := m.cfg
	if pc.Warm <= 0 {
		return
	}
	key := pool.WarmKey{Handler: h.key, Provider: m.up.Name}
	maxAge := time.Duration(pc.WarmMaxAge)
	if maxAge <= 0 {
		maxAge = defaultWarmMaxAge
	}
	set := newWarmSettings(pc)
	fp := set.print(h.reg)
	if old, _ := h.reg.Warmers.Of(key).(*warmer); old != nil && old.st == m.state && old.adopt(h, m, fp, pc.Warm, maxAge) {
		m.warm = old
		return
	}
	opts, _ := pc.WarmSet() // checked with the config
	w := &warmer{key: key, reg: h.reg, st: m.state, set: set, opts: opts, kick: make(chan struct{}, 1), done: make(chan struct{}),
		h: h, m: m, print: fp, target: pc.Warm, maxAge: maxAge}
	w.makeOne = w.warmUp
	if prev := h.reg.Warmers.Set(key, w); prev != nil {
		prev.Close()
	}
	m.warm = w
	m.state.SetWarm(key.Handler, 0, pc.Warm)
	go w.run()
}

// warmUp is the front of one warm-up at a provider of warmer w, whose
// settings printed as print when it began.
type warmUp struct {
	w     *warmer
	proto upstreams.Protocol
	print string
}

// warmUp makes one warm session at m, as h's, whose provider's settings
// print as fp.
func (w *warmer) warmUp(h *Gateway, m *member, fp string) {
	defer func() {
		w.mu.Lock()
		w.making--
		w.mu.Unlock()
	}()
	if caddy.Exiting() {
		return
	}
	proto := upstreams.ProtocolCDP
	if m.up.Protocol() == upstreams.ProtocolBiDi {
		proto = upstreams.ProtocolBiDi
	}
	c := h.newConnect(nil, nil, warmUp{w: w, proto: proto, print: fp})
	defer func() { c.ticket.Release() }()
	c.hs = &upstreams.Handshake{Key: upstreams.NewKey(), Header: http.Header{}}
	c.cls = &class{proto: proto}
	c.opts = w.opts
	// No request: its placeholders render empty.
	repl := caddy.NewReplacer()
	c.replace = func(s string) string { return repl.ReplaceAll(s, "") }
	// Its provider's budget must be able to pay for a whole session.
	c.ahead = m.expectedCost
	if c.one(m) != passEstablished {
		if ce := h.logger.Check(zap.DebugLevel, "warm-up failed"); ce != nil && len(c.attempts) > 0 {
			ce.Write(zap.String("provider", m.up.Name), zap.String("outcome", c.attempts[len(c.attempts)-1].Outcome))
		}
	}
}

func (f warmUp) protocol() (upstreams.Protocol, string) { return f.proto, "" }
func (warmUp) accepts(*upstreams.Provider) bool         { return true }
func (warmUp) noneAccepts() string                      { return "" }
func (warmUp) hedged() bool                             { return false }
func (warmUp) shortcut(*connect, []int) (passEnd, bool) { return 0, false }
func (f warmUp) options(*connect) (options.Set, error)  { return f.w.opts, nil }
func (warmUp) answer(*connect, *refusal)                {}

// attempt is the warm-up's upgrade at m.
func (warmUp) attempt(ctx context.Context, c *connect, m *member) upstreams.Result {
	return m.up.Connect(ctx, c.hs, c.replaceAt(m))
}

// establish makes the warm session: its ticket's meter starts (a warm
// session is billed whether or not a client takes it), its lifecycle has
// warm_max_age for a time limit, and the warmer takes it in.
func (f warmUp) establish(c *connect, m *member, res upstreams.Result) passEnd {
	t := c.ticket
	c.ticket = nil
	t.Warm()
	ws := &warmSession{up: res.Conn, t: t, made: time.Now(), print: f.print}
	f.w.mu.Lock()
	maxAge := f.w.maxAge
	f.w.mu.Unlock()
	ws.w = f.w
	ws.life = sessions.New(c.h.sessionDeps(), t, warmBody{ws}, sessions.Limits{MaxDuration: maxAge}, sessions.Entry{Provider: m.up.Name})
	f.w.add(ws, m)
	return passEstablished
}
