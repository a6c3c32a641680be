package browserfailover

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Active health checks: a provider's health is learnt by probing it (one
// HTTP GET, never a browser session) as well as from clients' attempts, so
// a provider that died is found before a client is sent to it, and the
// trial after a cooldown is a probe instead of a client. The probe loops
// themselves live in package pool (one per provider per process); this
// file holds the configuration and what the handler does with a probe's
// news.

// Health check defaults.
const (
	defaultProbeInterval = 10 * time.Second
	defaultProbeTimeout  = upstreams.DefaultProbeTimeout
)

// HealthCheckConfig is an active health check (JSON key "health_check"):
// the handler's, for every provider, and a provider's own, whose settings
// override the handler's one by one.
type HealthCheckConfig struct {
	// Off, in a provider, turns the handler's health check off for it.
	Off bool `json:"off,omitempty"`
	// URI is what a probe GETs: a path, which takes the provider's scheme
	// (ws becomes http, wss https), host and query; or a full http(s)
	// URL, used as it is. Default: /json/version under the provider's
	// path for http(s):// providers, /pressure with capacity browserless;
	// ws(s):// providers need one. May hold {env.X} placeholders.
	URI string `json:"uri,omitempty"`
	// Interval is the time between two probes' starts; default 10s.
	Interval caddy.Duration `json:"interval,omitempty"`
	// Timeout bounds one probe; default 2s (the interval, when shorter).
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// ExpectStatus is the status of a passing probe; default 200.
	ExpectStatus int `json:"expect_status,omitempty"`
	// Capacity "browserless" reads the answer as browserless's /pressure
	// JSON: the provider is skipped as full while it says so.
	Capacity string `json:"capacity,omitempty"`

	// at is the Caddyfile's health_check token, for errors found once the
	// whole handler is read (nil for JSON).
	at *caddyfile.Dispenser
	// given holds the settings stated explicitly (see explicit).
	given explicit
}

// UnmarshalJSON decodes a health check, noting which settings it states.
func (c *HealthCheckConfig) UnmarshalJSON(b []byte) error {
	type plain HealthCheckConfig
	given, err := stated(b, (*plain)(c), "HealthCheckConfig")
	c.given = given
	return err
}

// validate checks the block's own values, each problem naming its
// setting (the Caddyfile parser reports it at that setting's line). A
// stated zero is no interval, timeout or status: an error in JSON as in
// the Caddyfile, where a setting left out takes its default.
func (c *HealthCheckConfig) validate() error {
	if c == nil {
		return nil
	}
	if c.Off {
		if c.URI != "" || c.Interval != 0 || c.Timeout != 0 || c.ExpectStatus != 0 || c.Capacity != "" || len(c.given) > 1 {
			return &optionError{msg: "health_check off takes no other setting", whole: true}
		}
		return nil
	}
	errs := []error{
		positive(c.given, "interval", c.Interval, "health_check interval"),
		positive(c.given, "timeout", c.Timeout, "health_check timeout"),
	}
	if c.Interval > 0 && c.Timeout > c.Interval {
		errs = append(errs, bad([]string{"timeout", "interval"}, "health_check timeout (%v) must not exceed its interval (%v)", time.Duration(c.Timeout), time.Duration(c.Interval)))
	}
	if (c.ExpectStatus != 0 || c.given["expect_status"]) && (c.ExpectStatus < 100 || c.ExpectStatus > 599) {
		errs = append(errs, badOpt("expect_status", "health_check expect_status %d is not an HTTP status", c.ExpectStatus))
	}
	switch c.Capacity {
	case "", upstreams.CapacityBrowserless:
	default:
		errs = append(errs, badOpt("capacity", "health_check capacity %q: want browserless", c.Capacity))
	}
	if err := upstreams.CheckProbeURI(c.URI); err != nil {
		errs = append(errs, badOpt("uri", "%v", err))
	}
	return errors.Join(errs...)
}

// effectiveHealthCheck merges a provider's health check over the
// handler's, with defaults; nil when the provider is not probed.
func effectiveHealthCheck(handler, own *HealthCheckConfig) *HealthCheckConfig {
	if own != nil && own.Off {
		return nil
	}
	if handler == nil && own == nil {
		return nil
	}
	var c HealthCheckConfig
	if handler != nil {
		c = *handler
	}
	if own != nil {
		if own.URI != "" {
			c.URI = own.URI
		}
		if own.Interval != 0 {
			c.Interval = own.Interval
		}
		if own.Timeout != 0 {
			c.Timeout = own.Timeout
		}
		if own.ExpectStatus != 0 {
			c.ExpectStatus = own.ExpectStatus
		}
		if own.Capacity != "" {
			c.Capacity = own.Capacity
		}
	}
	// A default never makes the check invalid: one left out fits the
	// other, given, value (a short interval shortens the default timeout,
	// a long timeout lengthens the default interval).
	if c.Interval == 0 {
		c.Interval = caddy.Duration(max(defaultProbeInterval, time.Duration(c.Timeout)))
	}
	if c.Timeout == 0 {
		c.Timeout = caddy.Duration(min(defaultProbeTimeout, time.Duration(c.Interval)))
	}
	if c.ExpectStatus == 0 {
		c.ExpectStatus = http.StatusOK
	}
	return &c
}

// checkHealthChecks is check()'s part for health checks and keepalive:
// each block's values, and each provider's merged check against its URL.
func (h *Handler) checkHealthChecks() error {
	var errs []error
	if h.Keepalive < 0 {
		errs = append(errs, errors.New("keepalive must not be negative"))
	}
	if hc := h.HealthCheck; hc != nil {
		if hc.Off {
			errs = append(errs, errors.New("health_check off is for a provider: it turns the handler's health check off for that provider"))
		} else if err := hc.validate(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range h.Providers {
		if p == nil {
			continue
		}
		if err := p.HealthCheck.validate(); err != nil {
			errs = append(errs, fmt.Errorf("provider %q: %w", p.Name, err))
			continue
		}
		if err := checkProbeTarget(p, effectiveHealthCheck(h.HealthCheck, p.HealthCheck)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkProbeTarget checks that a provider's merged health check has
// something to GET: a ws(s):// provider has no default.
func checkProbeTarget(p *ProviderConfig, hc *HealthCheckConfig) error {
	if hc == nil {
		return nil
	}
	if hc.Timeout > hc.Interval {
		return fmt.Errorf("provider %q: health_check timeout (%v) must not exceed its interval (%v)", p.Name, time.Duration(hc.Timeout), time.Duration(hc.Interval))
	}
	if hc.URI != "" || hc.Capacity != "" {
		return nil
	}
	scheme, _, _ := strings.Cut(p.URL, "://")
	if strings.EqualFold(scheme, "ws") || strings.EqualFold(scheme, "wss") {
		return fmt.Errorf("provider %q: health_check needs a uri for a ws:// or wss:// provider (a path on its host, such as /json/version, or a full http(s) URL), or health_check off", p.Name)
	}
	return nil
}

// parseHealthCheck reads `health_check off` or
//
//	health_check {
//		uri           <path or full URL>
//		interval      <duration>
//		timeout       <duration>
//		expect_status <code>
//		capacity      browserless
//	}
//
// Each setting appears at most once; an error names its line.
func parseHealthCheck(d *caddyfile.Dispenser) (*HealthCheckConfig, error) {
	c := &HealthCheckConfig{at: caddyfile.NewDispenser([]caddyfile.Token{d.Token()})}
	c.at.Next()
	if d.NextArg() {
		if d.Val() != "off" || d.NextArg() {
			return nil, d.Errf("health_check takes a block, or off")
		}
		c.Off = true
		c.given.add("off")
		if d.NextBlock(d.Nesting()) {
			return nil, d.Errf("health_check off takes no block")
		}
		return c, nil
	}
	b := (&reader{d: d}).open()
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if err := b.option(); err != nil {
			return nil, err
		}
		var err error
		switch opt {
		case "uri":
			c.URI, err = oneArg(d)
		case "interval":
			c.Interval, err = durationArg(d)
		case "timeout":
			c.Timeout, err = durationArg(d)
		case "expect_status":
			c.ExpectStatus, err = intArg(d)
		case "capacity":
			c.Capacity, err = oneArg(d)
		default:
			return nil, d.Errf("health_check: unknown option %q", opt)
		}
		if err != nil {
			return nil, err
		}
		c.given.add(opt)
		if err := b.check(c.validate(), opt); err != nil {
			return nil, err
		}
	}
	if err := b.finish(c.validate()); err != nil {
		return nil, err
	}
	return c, nil
}

// checkProbeTargets is the Caddyfile's last check: each provider's merged
// health check has something to GET. The error names the line of the
// provider's health_check, or else of the handler's.
func (h *Handler) checkProbeTargets(d *caddyfile.Dispenser) error {
	for _, p := range h.Providers {
		err := checkProbeTarget(p, effectiveHealthCheck(h.HealthCheck, p.HealthCheck))
		if err == nil {
			continue
		}
		at := d
		if p.HealthCheck != nil && p.HealthCheck.at != nil {
			at = p.HealthCheck.at
		} else if h.HealthCheck != nil && h.HealthCheck.at != nil {
			at = h.HealthCheck.at
		}
		return at.Err(err.Error())
	}
	return nil
}

// parseKeepalive reads `keepalive <interval>` or `keepalive off`.
func parseKeepalive(d *caddyfile.Dispenser) (caddy.Duration, error) {
	if !d.NextArg() {
		return 0, d.Errf("keepalive needs an interval, or off")
	}
	v := d.Val()
	if d.NextArg() {
		return 0, d.Errf("keepalive takes one value")
	}
	if v == "off" {
		return 0, nil
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return 0, d.Errf("keepalive: invalid duration %q", v)
	}
	if dur < 0 {
		return 0, d.Errf("keepalive must not be negative (0 or off turns it off); got %q", v)
	}
	return caddy.Duration(dur), nil
}

// provisionProbes registers the health check of every probed provider with
// its probe loop. It runs last in Provision.
func (h *Handler) provisionProbes() error {
	repl := caddy.NewReplacer()
	for i, pc := range h.Providers {
		hc := effectiveHealthCheck(h.HealthCheck, pc.HealthCheck)
		if hc == nil {
			continue
		}
		m := h.members[i]
		pr, err := m.up.NewProber(upstreams.ProbeOptions{
			URI:          repl.ReplaceKnown(hc.URI, ""),
			Timeout:      time.Duration(hc.Timeout),
			ExpectStatus: hc.ExpectStatus,
			Capacity:     hc.Capacity,
		})
		if err != nil {
			return err
		}
		pw := &probeWatch{h: h, st: m.state, count: h.reg.Metrics().ProbeCounter(pc.Name)}
		m.state.Probe(h, pool.ProbeConfig{Prober: pr, Interval: time.Duration(hc.Interval),
			ReadsCapacity: hc.Capacity != "", Report: pw.report})
		h.probes = append(h.probes, m.state)
		h.logger.Debug("health check", zap.String("provider", pc.Name), zap.String("target", pr.Target()),
			zap.Duration("interval", time.Duration(hc.Interval)), zap.String("capacity", hc.Capacity))
	}
	return nil
}

// cleanupProbes removes the handler's health checks; a loop with no other
// handler's left stops.
func (h *Handler) cleanupProbes() {
	// (h.probes stays: the events app may read the handler meanwhile.)
	for _, st := range h.probes {
		st.Unprobe(h)
	}
}

// probeWatch is what the handler does with one provider's probe news.
type probeWatch struct {
	h     *Handler
	st    *pool.Provider
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
		if c, ok := st.Capacity(); ok {
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
