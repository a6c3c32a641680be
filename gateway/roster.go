package gateway

import (
	"context"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/browserfailover/caddy-browser-failover/config"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// The handler's providers at one time (roster), and the part of them that
// can serve one class of client (poolOf). A handler with providers blocks
// finds providers while it runs (found.go): each change is a new roster,
// swapped in whole, so a pass reads one roster from its order to its last
// attempt, and nothing in a roster changes once it is in use.

// roster is the handler's providers at one time.
type roster struct {
	// members take new sessions: the configured providers in config
	// order, then those each providers block found, by block and name.
	members []*member
	// leaving are found providers whose address left their source: no
	// new session goes to them, and they stay (for their live sessions'
	// WebDriver commands, for status) until their last session ended.
	leaving []*member
	// templates are what each providers block's providers will be (one
	// made at an example address, never dialed): whom a provider found
	// later could serve.
	templates []*upstreams.Provider
	// warm: some member keeps warm sessions.
	warm bool
	// pools holds, per class of client, the members that can serve it
	// (poolFor), made on first use.
	pools sync.Map
}

// newRoster is a roster of members, leaving and templates.
func newRoster(members, leaving []*member, templates []*upstreams.Provider) *roster {
	r := &roster{members: members, leaving: leaving, templates: templates}
	for _, m := range members {
		if m.warm != nil || m.cfg.Warm > 0 {
			r.warm = true
		}
	}
	return r
}

// current is the handler's roster now.
func (h *Gateway) current() *roster { return h.roster.Load() }

// named is the provider of the roster called name, leaving ones
// included; nil when none.
func (r *roster) named(name string) *member {
	for _, ms := range [][]*member{r.members, r.leaving} {
		for _, m := range ms {
			if m.up.Name == name {
				return m
			}
		}
	}
	return nil
}

// states are the entries of the roster's providers that take new
// sessions, and of those leaving.
func (r *roster) states() (taking, leaving []*pool.ProviderState) {
	for _, m := range r.members {
		taking = append(taking, m.state)
	}
	for _, m := range r.leaving {
		leaving = append(leaving, m.state)
	}
	return taking, leaving
}

// poolOf is the part of a handler's roster that can serve one class of
// client (its protocol and Playwright version): its members, as indices
// into all (the roster's members) in roster order, their names in the
// queue, the providers blocks that could find one later (awaits: their
// templates), and the strategy that rotates among them, so each pool of
// a mixed handler keeps its own rotation. The slices are shared and never
// changed.
type poolOf struct {
	all       []*member
	members   []int
	resources []string
	awaits    []*upstreams.Provider
	warm      bool
	strategy  upstreams.Strategy
}

// lineResources are what the waiters of a handler with the providers
// blocks blocks may want, for the queue to tell which handler's line takes
// them after a reload: the roster's providers, and a name for each block,
// so that a handler with the same block takes them even before it has
// found anything.
func (r *roster) lineResources(blocks []*config.ProvidersConfig) []string {
	out := make([]string, 0, len(r.members)+len(blocks))
	for _, m := range r.members {
		out = append(out, m.state.Resource())
	}
	for _, b := range blocks {
		out = append(out, "providers\x00"+b.Name)
	}
	return out
}

// names are the names of the roster's providers, and a name for each of
// the providers blocks blocks ("<block>/", which no provider can have): to
// tell which handler succeeds another after a reload.
func (r *roster) names(blocks []*config.ProvidersConfig) []string {
	out := make([]string, 0, len(r.members)+len(blocks))
	for _, m := range r.members {
		out = append(out, m.up.Name)
	}
	for _, b := range blocks {
		out = append(out, b.Name+"/")
	}
	return out
}

// finder runs the handler's providers blocks (found.go).
type finder struct {
	h     *Gateway
	sets  []*foundSet
	known func(string) string
	// every is how often the sources are asked: the shortest of the
	// sets'.
	every time.Duration
	// configured is how many of a roster's members are configured
	// providers (they come first).
	configured int

	ctx    context.Context // ends with halt: cuts a lookup short
	cancel context.CancelFunc
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
	// started: run was started (start), so halt waits for it.
	started bool
}

// foundSet is one providers block at run time.
type foundSet struct {
	cfg    *config.ProvidersConfig
	source reverseproxy.UpstreamSource
	// failing: the last lookup failed (logged once until one works).
	failing bool
	// refused are the addresses that could not be made providers
	// (logged once each).
	refused map[string]bool
}
