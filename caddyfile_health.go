package browserfailover

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/browserfailover/caddy-browser-failover/config"
)

// parseHealthCheck reads `health_check off` or
//
//	health_check {
//		uri           <path or full URL>
//		interval      <duration>
//		timeout       <duration>
//		expect_status <code>
//		capacity      browserless|webdriver
//	}
//
// Each setting appears at most once; an error names its line.
func parseHealthCheck(d *caddyfile.Dispenser) (*HealthCheckConfig, error) {
	c := &HealthCheckConfig{At: caddyfile.NewDispenser([]caddyfile.Token{d.Token()})}
	c.At.Next()
	if d.NextArg() {
		if d.Val() != "off" || d.NextArg() {
			return nil, d.Errf("health_check takes a block, or off")
		}
		c.Off = true
		c.Stated().Add("off")
		if d.NextBlock(d.Nesting()) {
			return nil, d.Errf("health_check off takes no block")
		}
		return c, nil
	}
	err := (&reader{d: d}).open().each("health_check", c.Stated(), c.Validate, func(opt string) (err error) {
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
			return errUnknownOption
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// checkProbeTargets is the Caddyfile's last check: each provider's merged
// health check has something to GET. The error names the line of the
// provider's health_check, or else of the handler's.
func (h *Handler) checkProbeTargets(d *caddyfile.Dispenser) error {
	type target struct {
		p     *ProviderConfig
		check func(*HealthCheckConfig) error
	}
	var all []target
	for _, p := range h.Providers {
		all = append(all, target{p, func(hc *HealthCheckConfig) error { return config.CheckProbeTarget(p, hc) }})
	}
	for _, b := range h.DynamicProviders {
		all = append(all, target{&b.ProviderConfig, b.CheckProbeTarget})
	}
	for _, t := range all {
		p := t.p
		err := t.check(config.EffectiveHealthCheck(h.HealthCheck, p.HealthCheck))
		if err == nil {
			continue
		}
		at := d
		if p.HealthCheck != nil && p.HealthCheck.At != nil {
			at = p.HealthCheck.At
		} else if h.HealthCheck != nil && h.HealthCheck.At != nil {
			at = h.HealthCheck.At
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
