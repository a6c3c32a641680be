package gateway

import (
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/config"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Active health checks: a provider's health is learnt by probing it (one
// HTTP GET, never a browser session) as well as from clients' attempts, so
// a provider that died is found before a client is sent to it, and the
// trial after a cooldown is a probe instead of a client. The probe loops
// themselves live in package pool (one per provider per process); this
// file registers the handler's checks with them and holds what the handler
// does with a probe's news. The settings are HealthCheckConfig (config.go).

// provisionProbes registers the health check of every probed provider with
// its probe loop. It runs last in Provision.
func (h *Gateway) provisionProbes(known func(string) string) error {
	for _, m := range h.current().members {
		if err := h.addProbe(m, known); err != nil {
			return err
		}
	}
	return nil
}

// addProbe registers m's health check (the handler's, merged with its
// own) with its probe loop; nothing when it has none.
func (h *Gateway) addProbe(m *member, known func(string) string) error {
	hc := config.EffectiveHealthCheck(h.HealthCheck, m.cfg.HealthCheck)
	if hc == nil {
		return nil
	}
	o := hc.ProbeOptions
	o.URI = known(o.URI)
	pr, err := m.up.NewProber(o)
	if err != nil {
		return err
	}
	pw := &probeWatch{h: h, st: m.state, count: h.reg.Metrics().ProbeCounter(m.up.Name)}
	m.state.Probes.Add(h, pool.ProbeConfig{Prober: pr, Interval: time.Duration(hc.Interval),
		ReadsCapacity: pr.ReadsCapacity(), Report: pw.report})
	h.logger.Debug("health check", zap.String("provider", m.up.Name), zap.String("target", pr.Target()),
		zap.Duration("interval", time.Duration(hc.Interval)), zap.String("capacity", hc.Capacity))
	return nil
}

// cleanupProbes removes the handler's health checks; a loop with no other
// handler's left stops.
func (h *Gateway) cleanupProbes() {
	r := h.current()
	for _, m := range slices.Concat(r.members, r.leaving) {
		m.state.Probes.Remove(h)
	}
}

// probeWatch is what the handler does with one provider's probe news.
type probeWatch struct {
	h     *Gateway
	st    *pool.ProviderState
	count func(outcome string) // probes_total
	// capacityBroken: the last passing probe's answer could not be read
	// for capacity (logged once per change).
	capacityBroken bool
}

// report counts and logs a probe and reacts to what it changed, as for a
// client's attempt: cooldown and recovered logs and events, and offers to
// the queue. A provider's probes are serialized, so report is too.
func (w *probeWatch) report(rep pool.ProbeReport) {
	h, st := w.h, w.st
	o := rep.Result.Outcome
	w.count(o.Word)
	if ce := h.logger.Check(zap.DebugLevel, "probe"); ce != nil {
		fields := []zap.Field{
			zap.String("provider", st.Name()),
			zap.String("outcome", o.Word),
			zap.Float64("ms", roundMS(o.Elapsed)),
			zap.Bool("trial", rep.Trial),
		}
		if o.Err != nil {
			fields = append(fields, zap.String("cause", o.Err.Error()))
		}
		if c, ok := st.Probes.Capacity(); ok {
			fields = append(fields, zap.Int("running", c.Running), zap.Int("max", c.Max), zap.Int("queued", c.Queued))
		}
		ce.Write(fields...)
	}
	h.healthChanged(st, rep.Change, false, "health check")
	if rep.CapacityFreed {
		// The pool has offered it to the waiters.
		h.logger.Debug("provider has room again", zap.String("provider", st.Name()), zap.String("by", "health check"))
	}
	broken := rep.Result.CapacityErr != nil
	if broken && !w.capacityBroken {
		h.logger.Warn("health check answer unreadable for capacity",
			zap.String("provider", st.Name()), zap.String("cause", rep.Result.CapacityErr.Error()))
	}
	if o.Kind == upstreams.Success {
		w.capacityBroken = broken
	}
}
