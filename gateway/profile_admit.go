package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/options"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/profiles"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// A client's browser profile on its way: named as it is checked, refused
// to any but a CDP client as it joins, taken (and read) at its first
// admission (profiles.go says what profiles are).

// profileRetryAfter is the Retry-After of a client refused because the
// shared state cannot say whether its profile is in use.
const profileRetryAfter = 2

// readProfile reads the profile the client named in its options (step 0,
// check): a refusal when it cannot name one here (no profiles block, a
// scope without a value for it).
func (c *connect) readProfile() *refusal {
	id := c.opts.Profile()
	if id == "" {
		return nil
	}
	pk := c.h.prof
	if pk == nil {
		return badOptions(&options.Error{Option: options.Profile, Reason: "this gateway keeps no browser profiles (its handler has no profiles block)"})
	}
	scope := profiles.NoScope
	if pk.cfg.Scope != "" {
		v := ""
		if c.replace != nil {
			v = c.replace(pk.cfg.Scope)
		}
		if v == "" {
			return badOptions(&options.Error{Option: options.Profile, Reason: "the profiles scope (" + pk.cfg.Scope + ") has no value for this client, so it cannot have a profile"})
		}
		scope = strings.TrimPrefix(c.h.reg.Hashes.ShownKey(v), "hmac:")
	}
	c.profile = &clientProfile{name: profiles.Name{Scope: scope, ID: id}}
	return nil
}

// profileServable reports whether the client may have its profile: CDP
// clients only. Any other is answered 502 naming the option, at once.
func (c *connect) profileServable() bool {
	if c.profile == nil || c.cls.proto == upstreams.ProtocolCDP {
		return true
	}
	rf := c.unservable("session option profile: browser profiles are kept for CDP clients only (Puppeteer, Playwright connectOverCDP, chromedp), not for " + c.clientKind() + " clients")
	rf.more = map[string]any{"option": options.Profile}
	c.finish(rf)
	return false
}

// holdProfile has the client's ticket take its profile, once (admit, and
// a warm session's hand-out), and reads what was stored. When it cannot,
// rf is the client's answer; nil with ok false when the client left while
// it waited.
func (c *connect) holdProfile() (rf *refusal, ok bool) {
	cp := c.profile
	if cp == nil || cp.taken {
		return nil, true
	}
	pk := c.h.prof
	var shared *cluster.Shared
	reject := false
	if sh := c.h.shared; sh != nil {
		shared, reject = sh.s, sh.reject
	}
	id := cp.name.ID
	switch err := c.ticket.TakeProfile(c.ctx, cp.name, pk.wait, shared, reject); {
	case errors.Is(err, pool.ErrProfileInUse):
		msg := fmt.Sprintf("profile %q is in use by another session", id)
		if pk.wait > 0 {
			msg += fmt.Sprintf(" (waited %v)", pk.wait)
		}
		return &refusal{status: http.StatusConflict, reason: observe.ReasonProfile, msg: msg, more: map[string]any{"profile": id}}, false
	case errors.Is(err, pool.ErrProfileStateDown):
		return &refusal{status: http.StatusServiceUnavailable, reason: observe.ReasonProfile, retryAfter: profileRetryAfter,
			msg: fmt.Sprintf("profile %q: the shared state cannot be asked whether another session uses it", id), more: map[string]any{"profile": id}}, false
	case err != nil:
		return nil, false // the client left
	}
	ctx, cancel := context.WithTimeout(context.Background(), profileIOWait)
	data, err := pk.store.Load(ctx, cp.name)
	cancel()
	if err != nil {
		// The stored profile stays as it is; the client's ticket gives
		// the profile back with the rest.
		c.h.logger.Error("profile cannot be read", zap.String("session_id", c.id), zap.String("profile", id), zap.Error(err))
		msg := fmt.Sprintf("profile %q cannot be read: %v", id, err)
		if !errors.Is(err, profiles.ErrCannotOpen) {
			msg = fmt.Sprintf("profile %q cannot be read from its storage", id)
		}
		return &refusal{status: http.StatusInternalServerError, reason: observe.ReasonProfile, msg: msg, more: map[string]any{"profile": id}}, false
	}
	cp.data, cp.taken = data, true
	return nil, true
}
