package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/config"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Providers found at run time (providers blocks). Each block's source is
// one of Caddy's dynamic upstream modules (http.reverse_proxy.upstreams:
// srv, a, multi, or a third party's), loaded and asked as reverse_proxy
// asks it; its own cache and refresh decide when it looks up again. Each
// address it gives is a provider named <block>/<host>:<port> with the
// block's options, a member of the handler like a configured one.
//
// The finder asks every source on the registry's clock, and each time
// reconciles the handler's roster with what they said:
//
//   - a new address becomes a provider at once: its state claimed (a
//     name the running config had keeps its state), its health check,
//     warm sessions and shared state set up, and the queue told, so
//     waiters that can use it want it and are offered it;
//   - an address gone is leaving: it takes no new session, its probes
//     and warm sessions stop, its live sessions go on; once it has none
//     (no slot reserved: no live, parked or warming session, no attempt
//     in flight) it is dropped, and leaves status;
//   - an address back before it was dropped takes sessions again;
//   - a lookup that fails (or gives no address) keeps the last set: it
//     is logged (once until a lookup works again) and counted
//     (provider_lookup_failures_total).
//
// Each change is a new roster swapped in whole (roster.go): a client's
// pass reads one roster, and what it holds of a member stays valid. A
// new config's handler takes over, at Provision, what the running
// config's handler found (leaving ones too), so a reload keeps found
// providers and their state.

// maxLookupEvery is how often a source is asked at most apart; a source
// whose refresh is known (srv, a) is asked every quarter of it when that
// is shorter, so a change is seen within about one refresh.
const maxLookupEvery = time.Second

// lookupTimeout bounds one lookup.
const lookupTimeout = 5 * time.Second

// errNoAddresses is a lookup that answered nothing usable: treated as a
// failed one, so a set is never emptied by it.
var errNoAddresses = errors.New("the source gave no TCP address")

// provisionFound loads the source of each providers block, makes the
// template of its providers (whom they serve, checked at provision), and
// takes over what the running config's handler found: its providers, as
// members or leaving, with their state. The lookups begin with start.
func (h *Gateway) provisionFound(ctx caddy.Context, known func(string) string) error {
	if len(h.DynamicProviders) == 0 {
		return nil
	}
	f := &finder{h: h, known: known, every: maxLookupEvery, configured: len(h.Providers),
		stop: make(chan struct{}), done: make(chan struct{})}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	h.found = f
	r := h.current()
	members := slices.Clone(r.members)
	var leaving []*member
	var templates []*upstreams.Provider
	for _, b := range h.DynamicProviders {
		// LoadModule empties the field it loads: a copy's, so the
		// config keeps its own.
		src := *b
		mod, err := ctx.LoadModule(&src, "SourceRaw")
		if err != nil {
			return fmt.Errorf("providers %q: loading its source: %w", b.Name, err)
		}
		source, ok := mod.(reverseproxy.UpstreamSource)
		if !ok {
			return fmt.Errorf("providers %q: its source %T gives no upstreams", b.Name, mod)
		}
		tmpl, err := upstreams.New(b.At(config.TemplateAddress).Config, upstreams.Defaults{ConnectTimeout: time.Duration(h.ConnectTimeout),
			ForwardHeaders: h.ForwardHeaders, Releaser: h.reg.Releaser(), APITransport: h.reg.APITransport()}, known)
		if err != nil {
			return fmt.Errorf("providers %q: %w", b.Name, err)
		}
		if hc := config.EffectiveHealthCheck(h.HealthCheck, b.HealthCheck); hc != nil {
			o := hc.ProbeOptions
			o.URI = known(o.URI)
			pr, err := tmpl.NewProber(o)
			if err != nil {
				return fmt.Errorf("providers %q: %w", b.Name, err)
			}
			pr.Close()
		}
		h.noteProtocol(tmpl)
		templates = append(templates, tmpl)
		f.sets = append(f.sets, &foundSet{cfg: b, source: source})
		f.every = min(f.every, lookupEvery(source))
		// What the running config found, with its state.
		for _, st := range h.reg.Found(b.Name) {
			addr := strings.TrimPrefix(st.Name(), b.Name+"/")
			m, err := h.newMember(b.At(addr), b.Name, known, false)
			if err != nil {
				h.logger.Warn("found provider not taken over", zap.String("provider", st.Name()), zap.Error(err))
				continue
			}
			if st.Leaving() {
				leaving = append(leaving, m)
			} else {
				members = append(members, m)
			}
			h.roster.Store(newRoster(members, leaving, templates))
		}
	}
	h.roster.Store(newRoster(members, leaving, templates))
	return nil
}

// lookupEvery is how often source is asked: every quarter of its
// refresh when that is known and shorter than maxLookupEvery (the source
// looks up again at the first call after its refresh).
func lookupEvery(source reverseproxy.UpstreamSource) time.Duration {
	var refresh time.Duration
	switch s := source.(type) {
	case *reverseproxy.SRVUpstreams:
		refresh = time.Duration(s.Refresh)
	case *reverseproxy.AUpstreams:
		refresh = time.Duration(s.Refresh)
	}
	if refresh <= 0 {
		return maxLookupEvery
	}
	return min(maxLookupEvery, max(refresh/4, 10*time.Millisecond))
}

// start begins the lookups: one at once, then every f.every on the
// registry's clock, until halt. Nothing without providers blocks.
func (f *finder) start() {
	if f == nil {
		return
	}
	f.started = true
	go f.run()
}

// halt stops the lookups and waits until a refresh under way is done;
// safe when start was never called (a Provision that failed), and more
// than once. Provision and Cleanup call start and halt one after the
// other.
func (f *finder) halt() {
	if f == nil {
		return
	}
	f.once.Do(func() {
		close(f.stop)
		f.cancel()
	})
	if f.started {
		<-f.done
	}
}

// run asks the sources and reconciles, at once and then every f.every.
func (f *finder) run() {
	defer close(f.done)
	clock := f.h.reg.Clock()
	for {
		f.refresh()
		tick := make(chan struct{})
		t := clock.AfterFunc(f.every, func() { close(tick) })
		select {
		case <-f.stop:
			t.Stop()
			return
		case <-tick:
		}
	}
}

// lookup asks set's source for its addresses now: each a host:port whose
// host has no trailing dot, once, in the source's order. No address is an
// error (errNoAddresses).
func (f *finder) lookup(set *foundSet) ([]string, error) {
	ctx, cancel := context.WithTimeout(f.ctx, lookupTimeout)
	defer cancel()
	// Sources read the request's placeholders (reverse_proxy calls them
	// with the client's request); this one has none to give.
	ctx = context.WithValue(ctx, caddy.ReplacerCtxKey, caddy.NewReplacer())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	if err != nil {
		return nil, err
	}
	ups, err := set.source.GetUpstreams(req)
	if err != nil {
		return nil, err
	}
	var addrs []string
	for _, u := range ups {
		a, ok := config.Address(u.Dial)
		if !ok {
			if ce := f.h.logger.Check(zap.DebugLevel, "found address not used"); ce != nil {
				ce.Write(zap.String("providers", set.cfg.Name), zap.String("address", u.Dial), zap.String("why", "not a TCP host:port"))
			}
			continue
		}
		if !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return nil, errNoAddresses
	}
	return addrs, nil
}

// refresh asks every source, and swaps in a new roster when what they
// said changes the handler's providers.
func (f *finder) refresh() {
	h := f.h
	old := h.current()
	members := slices.Clone(old.members[:f.configured])
	var leaving, fresh []*member
	changed := false
	for _, set := range f.sets {
		had := ofSet(old.members[f.configured:], set)
		went := ofSet(old.leaving, set)
		addrs, err := f.lookup(set)
		if err != nil {
			f.failed(set, err, len(had))
			members = append(members, had...)
		} else {
			f.worked(set)
			var now []*member
			for _, a := range addrs {
				name := config.FoundName(set.cfg.Name, a)
				if i := slices.IndexFunc(had, named(name)); i >= 0 {
					now = append(now, had[i])
					had = slices.Delete(had, i, i+1)
					continue
				}
				if i := slices.IndexFunc(went, named(name)); i >= 0 {
					m := f.back(went[i])
					went = slices.Delete(went, i, i+1)
					now, fresh, changed = append(now, m), append(fresh, m), true
					continue
				}
				m, err := h.newMember(set.cfg.At(a), set.cfg.Name, f.known, false)
				if err != nil {
					f.refused(set, name, err)
					continue
				}
				f.join(m)
				now, fresh, changed = append(now, m), append(fresh, m), true
			}
			// What the source no longer gives is leaving.
			for _, m := range had {
				f.leave(m)
				went, changed = append(went, m), true
			}
			slices.SortFunc(now, func(a, b *member) int { return strings.Compare(a.up.Name, b.up.Name) })
			members = append(members, now...)
		}
		// A leaving provider without a session goes.
		for _, m := range went {
			if m.state.Slots.Reserved() == 0 {
				f.drop(m)
				changed = true
				continue
			}
			leaving = append(leaving, m)
		}
	}
	if !changed {
		return
	}
	next := newRoster(members, leaving, old.templates)
	h.roster.Store(next)
	taking, gone := next.states()
	h.reg.Queues.SetProviders(h, taking, gone)
	// Waiters that can use a provider found want it now, and are
	// offered it; those left with nothing learn where they stand.
	h.line.Reshape(next.lineResources(h.DynamicProviders))
	for _, m := range fresh {
		if u := m.state.Health.Until(); !u.IsZero() {
			m.state.WakeAt(u)
		} else if m.state.HasRoom() {
			m.state.Notify()
		}
	}
}

// ofSet are the members of ms that set found.
func ofSet(ms []*member, set *foundSet) []*member {
	var out []*member
	for _, m := range ms {
		if strings.HasPrefix(m.up.Name, set.cfg.Name+"/") {
			out = append(out, m)
		}
	}
	return out
}

// named matches the member called name.
func named(name string) func(*member) bool {
	return func(m *member) bool { return m.up.Name == name }
}

// join sets up a provider just found: its shared state, its ledger's
// adopter, its health check and its warm sessions.
func (f *finder) join(m *member) {
	h := f.h
	m.state.SetLeaving(false)
	h.shareMember(m)
	h.adopter(m, f.known)
	if err := h.addProbe(m, f.known); err != nil {
		h.logger.Warn("found provider not probed", zap.String("provider", m.up.Name), zap.Error(err))
	}
	h.startWarm(m)
	h.logger.Info("provider found", zap.String("provider", m.up.Name), zap.String("providers", m.state.FoundBy()))
}

// leave makes m leaving: no new session (it is out of the members), no
// probe, no warm session; its live sessions go on.
func (f *finder) leave(m *member) {
	h := f.h
	m.state.SetLeaving(true)
	m.state.Probes.Remove(h)
	h.stopWarm(m)
	h.logger.Info("provider leaving", zap.String("provider", m.up.Name), zap.String("providers", m.state.FoundBy()),
		zap.Int64("active", m.state.Slots.Active()))
}

// back takes a leaving provider whose address came back: a new member
// (one in use is never changed) with its probe and warm sessions again.
func (f *finder) back(m *member) *member {
	h := f.h
	nm := *m
	nm.warm = nil
	m.state.SetLeaving(false)
	if err := h.addProbe(&nm, f.known); err != nil {
		h.logger.Warn("found provider not probed", zap.String("provider", m.up.Name), zap.Error(err))
	}
	h.startWarm(&nm)
	h.logger.Info("provider back", zap.String("provider", m.up.Name), zap.String("providers", m.state.FoundBy()))
	return &nm
}

// drop lets go of a leaving provider whose last session ended: its claim
// given back (it leaves status when no other handler holds it).
func (f *finder) drop(m *member) {
	h := f.h
	h.dropMember(m)
	h.unshareMember(m)
	h.logger.Info("provider removed", zap.String("provider", m.up.Name), zap.String("providers", m.state.FoundBy()))
}

// failed notes a lookup that failed: the set is kept.
func (f *finder) failed(set *foundSet, err error, kept int) {
	h := f.h
	h.reg.Metrics().LookupFailed(set.cfg.Name)
	if set.failing || f.ctx.Err() != nil {
		return
	}
	set.failing = true
	h.logger.Warn("providers lookup failed: the providers found before are kept",
		zap.String("providers", set.cfg.Name), zap.Int("kept", kept), zap.Error(err))
}

// worked notes a lookup that answered.
func (f *finder) worked(set *foundSet) {
	if set.failing {
		set.failing = false
		f.h.logger.Info("providers lookup works again", zap.String("providers", set.cfg.Name))
	}
}

// refused notes an address that could not be made a provider (its name
// taken with another URL in the same config): logged once.
func (f *finder) refused(set *foundSet, name string, err error) {
	if set.refused == nil {
		set.refused = map[string]bool{}
	}
	if !set.refused[name] {
		set.refused[name] = true
		f.h.logger.Warn("found address not used", zap.String("provider", name), zap.Error(err))
	}
}
