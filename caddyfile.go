package browserfailover

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("browser_failover", parseCaddyfile)
	// Like reverse_proxy, it answers the request itself; ordering it just
	// before reverse_proxy lets it work outside route blocks.
	httpcaddyfile.RegisterDirectiveOrder("browser_failover", httpcaddyfile.Before, "reverse_proxy")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var hd Handler
	err := hd.UnmarshalCaddyfile(h.Dispenser)
	return &hd, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens:
//
//	browser_failover [<matcher>] {
//		strategy        priority|round_robin|least_conn|weighted|random|latency
//		connect_timeout <duration>
//		try_duration    <duration>
//		max_attempts    <n>
//
//		provider <name> <url> {
//			priority        <int>
//			weight          <int>
//			max_concurrent  <int>
//			connect_timeout <duration>
//			header_up [+|-]<field> [<value>]
//			pass_query      [on|off]
//			discover        on|off
//			tls_insecure_skip_verify
//			tls_server_name <name>
//			tls_trusted_ca_certs <pem_file...>
//			cooldown { ... }
//			protocol        cdp|playwright|any
//			playwright_version <major.minor>
//			health_check { ... } | health_check off
//		}
//
//		client_limit <placeholder> <n>
//		hedge_after  <duration>
//		hedge_max    <n>
//		keepalive    <interval>|off
//		health_check {            # every provider's; a provider's own
//			uri           <path or full URL>   # block overrides it, or
//			interval      <duration>           # `health_check off` in a
//			timeout       <duration>           # provider turns it off
//			expect_status <code>
//			capacity      browserless
//		}
//		state redis <host:port> {
//			username <name>
//			password <value>
//			db <n>
//			key_prefix <prefix>
//			tls
//			tls_server_name <name>
//			tls_insecure_skip_verify
//			tls_trusted_ca_certs <pem_file...>
//			lease_ttl <duration>
//			timeout <duration>
//			node <name>
//			on_unavailable local|reject
//		}
//
//		cooldown {
//			duration          <duration>
//			max_duration      <duration>
//			window            <duration>
//			failure_threshold <ratio>
//			min_requests      <n>
//		}
//		queue {
//			size    <n>
//			timeout <duration>
//		}
//		session {
//			idle_timeout <duration>
//			max_duration <duration>
//		}
//		affinity header|query|cookie <name>
//		discovery on|off
//		webhook <url> {
//			events <name...>   # cooldown, recovered, rejected; default all
//			secret <value>     # signs each body (HMAC-SHA256)
//		}
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for d.NextBlock(0) {
		opt := d.Val()
		switch opt {
		case "strategy":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			if !contains(strategies, v) {
				return d.Errf("unknown strategy %q (want one of %s)", v, strings.Join(strategies, ", "))
			}
			h.Strategy = v
		case "connect_timeout":
			v, err := durationArg(d, false)
			if err != nil {
				return err
			}
			h.ConnectTimeout = v
		case "try_duration":
			v, err := durationArg(d, true)
			if err != nil {
				return err
			}
			h.TryDuration = v
		case "max_attempts":
			n, err := intArg(d, 0)
			if err != nil {
				return err
			}
			h.MaxAttempts = n
		case "provider":
			p, err := parseProvider(d, seen)
			if err != nil {
				return err
			}
			h.Providers = append(h.Providers, p)
		case "cooldown":
			c, err := parseCooldown(d)
			if err != nil {
				return err
			}
			h.Cooldown = c
		case "queue":
			q, err := parseQueue(d)
			if err != nil {
				return err
			}
			h.Queue = q
		case "session":
			s, err := parseSession(d)
			if err != nil {
				return err
			}
			h.Session = s
		case "affinity":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.Errf("affinity takes a source (header, query or cookie) and a name")
			}
			switch args[0] {
			case "header", "query", "cookie":
			default:
				return d.Errf("affinity source %q: want header, query or cookie", args[0])
			}
			h.Affinity = &AffinityConfig{Source: args[0], Name: args[1]}
		case "discovery":
			on, err := onOff(d, false)
			if err != nil {
				return err
			}
			h.Discovery = &on
		case "client_limit":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.Errf("client_limit takes a key placeholder and a number, like client_limit {http.auth.user.id} 3")
			}
			if !strings.Contains(args[0], "{") {
				return d.Errf("client_limit key %q: want a placeholder such as {http.auth.user.id}", args[0])
			}
			n, err := strconv.Atoi(args[1])
			if err != nil || n < 1 {
				return d.Errf("client_limit: %q is not a number of sessions (at least 1)", args[1])
			}
			h.ClientLimit = &ClientLimitConfig{Key: args[0], Limit: n}
		case "hedge_after":
			v, err := durationArg(d, true)
			if err != nil {
				return err
			}
			h.HedgeAfter = v
		case "hedge_max":
			n, err := intArg(d, 2)
			if err != nil {
				return err
			}
			h.HedgeMax = n
		case "state":
			st, err := parseState(d)
			if err != nil {
				return err
			}
			h.State = st
		case "webhook":
			wh, err := parseWebhook(d)
			if err != nil {
				return err
			}
			h.Webhooks = append(h.Webhooks, wh)
		case "health_check":
			if h.HealthCheck != nil {
				return d.Errf("health_check given twice")
			}
			hc, err := parseHealthCheck(d)
			if err != nil {
				return err
			}
			if hc.Off {
				return d.Errf("health_check off is for a provider: it turns the handler's health check off for that provider")
			}
			h.HealthCheck = hc
		case "keepalive":
			if h.Keepalive != 0 {
				return d.Errf("keepalive given twice")
			}
			v, err := parseKeepalive(d)
			if err != nil {
				return err
			}
			h.Keepalive = v
		default:
			return d.Errf("unknown option %q", opt)
		}
	}
	if len(h.Providers) == 0 {
		return d.Errf("no providers: declare at least one provider")
	}
	// Health checks merge the handler's and the provider's blocks,
	// wherever they are: each provider's must have something to GET.
	return h.checkProbeTargets(d)
}

// parseProvider reads one provider; seen holds the names declared before
// it, so a duplicate is reported at its own line.
func parseProvider(d *caddyfile.Dispenser, seen map[string]bool) (*ProviderConfig, error) {
	args := d.RemainingArgs()
	if len(args) != 2 {
		return nil, d.Errf("provider takes a name and a URL")
	}
	if seen[args[0]] {
		return nil, d.Errf("duplicate provider name %q", args[0])
	}
	seen[args[0]] = true
	p := &ProviderConfig{Name: args[0], URL: args[1]}
	if err := checkURL(p); err != nil {
		return nil, d.Err(err.Error())
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		switch opt {
		case "priority":
			v, err := oneArg(d)
			if err != nil {
				return nil, err
			}
			n, err := strconv.Atoi(v)
			if err != nil {
				return nil, d.Errf("provider %q: priority must be an integer, got %q", p.Name, v)
			}
			p.Priority = &n
		case "weight":
			n, err := intArg(d, 1)
			if err != nil {
				return nil, err
			}
			p.Weight = n
		case "max_concurrent":
			n, err := intArg(d, 0)
			if err != nil {
				return nil, err
			}
			p.MaxConcurrent = n
		case "connect_timeout":
			v, err := durationArg(d, false)
			if err != nil {
				return nil, err
			}
			p.ConnectTimeout = v
		case "header_up":
			op, err := parseHeaderUp(d)
			if err != nil {
				return nil, err
			}
			p.HeadersUp = append(p.HeadersUp, op)
		case "pass_query":
			on, err := onOff(d, true)
			if err != nil {
				return nil, err
			}
			p.PassQuery = on
		case "discover":
			on, err := onOff(d, false)
			if err != nil {
				return nil, err
			}
			p.Discover = &on
		case "tls_insecure_skip_verify":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			tlsOf(p).InsecureSkipVerify = true
		case "tls_server_name":
			v, err := oneArg(d)
			if err != nil {
				return nil, err
			}
			tlsOf(p).ServerName = v
		case "tls_trusted_ca_certs":
			files := d.RemainingArgs()
			if len(files) == 0 {
				return nil, d.ArgErr()
			}
			tlsOf(p).TrustedCACertFiles = append(tlsOf(p).TrustedCACertFiles, files...)
		case "cooldown":
			c, err := parseCooldown(d)
			if err != nil {
				return nil, err
			}
			p.Cooldown = c
		case "protocol":
			v, err := oneArg(d)
			if err != nil {
				return nil, err
			}
			if _, err := upstreams.ParseProtocol(v); err != nil {
				return nil, d.Errf("provider %q: %v", p.Name, err)
			}
			p.Protocol = strings.ToLower(v)
		case "playwright_version":
			v, err := oneArg(d)
			if err != nil {
				return nil, err
			}
			if _, err := upstreams.ParsePlaywrightVersion(v); err != nil {
				return nil, d.Errf("provider %q: %v", p.Name, err)
			}
			p.PlaywrightVersion = v
		case "health_check":
			if p.HealthCheck != nil {
				return nil, d.Errf("provider %q: health_check given twice", p.Name)
			}
			hc, err := parseHealthCheck(d)
			if err != nil {
				return nil, err
			}
			p.HealthCheck = hc
		default:
			return nil, d.Errf("provider %q: unknown option %q", p.Name, opt)
		}
	}
	if p.PlaywrightVersion != "" && p.Protocol != string(upstreams.ProtocolPlaywright) {
		return nil, d.Errf("provider %q: playwright_version needs protocol playwright", p.Name)
	}
	if err := checkURL(p); err != nil {
		return nil, d.Err(err.Error())
	}
	return p, nil
}

func tlsOf(p *ProviderConfig) *TLSConfig {
	if p.TLS == nil {
		p.TLS = &TLSConfig{}
	}
	return p.TLS
}

// parseHeaderUp reads `header_up [+|-]<field> [<value>]`.
func parseHeaderUp(d *caddyfile.Dispenser) (HeaderOpConfig, error) {
	args := d.RemainingArgs()
	if len(args) == 0 || len(args) > 2 {
		return HeaderOpConfig{}, d.Errf("header_up takes a field and a value, +field value, or -field")
	}
	field := args[0]
	op := HeaderOpConfig{Op: "set", Field: field}
	switch {
	case strings.HasPrefix(field, "+"):
		op.Op, op.Field = "add", field[1:]
	case strings.HasPrefix(field, "-"):
		op.Op, op.Field = "delete", field[1:]
	}
	if op.Field == "" || strings.ContainsAny(op.Field, " \t:") {
		return op, d.Errf("header_up: invalid field name %q", field)
	}
	if op.Op == "delete" {
		if len(args) != 1 {
			return op, d.Errf("header_up -%s takes no value", op.Field)
		}
		return op, nil
	}
	if len(args) != 2 {
		return op, d.Errf("header_up %s needs a value", op.Field)
	}
	op.Value = args[1]
	return op, nil
}

func parseCooldown(d *caddyfile.Dispenser) (*CooldownConfig, error) {
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	c := &CooldownConfig{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch opt := d.Val(); opt {
		case "duration":
			v, err := durationArg(d, false)
			if err != nil {
				return nil, err
			}
			c.Duration = v
		case "max_duration":
			v, err := durationArg(d, false)
			if err != nil {
				return nil, err
			}
			c.MaxDuration = v
		case "window":
			v, err := durationArg(d, false)
			if err != nil {
				return nil, err
			}
			c.Window = v
		case "failure_threshold":
			v, err := oneArg(d)
			if err != nil {
				return nil, err
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || math.IsNaN(f) || f <= 0 || f > 1 {
				return nil, d.Errf("failure_threshold must be a ratio in (0,1], got %q", v)
			}
			c.FailureThreshold = f
		case "min_requests":
			n, err := intArg(d, 0)
			if err != nil {
				return nil, err
			}
			c.MinRequests = n
		default:
			return nil, d.Errf("cooldown: unknown option %q", opt)
		}
	}
	if c.MaxDuration > 0 && c.Duration > 0 && c.MaxDuration < c.Duration {
		return nil, d.Errf("cooldown: max_duration (%s) is shorter than duration (%s)",
			time.Duration(c.MaxDuration), time.Duration(c.Duration))
	}
	return c, nil
}

func parseQueue(d *caddyfile.Dispenser) (*QueueConfig, error) {
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	q := &QueueConfig{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch opt := d.Val(); opt {
		case "size":
			n, err := intArg(d, 0)
			if err != nil {
				return nil, err
			}
			q.Size = &n
		case "timeout":
			v, err := durationArg(d, false)
			if err != nil {
				return nil, err
			}
			q.Timeout = v
		default:
			return nil, d.Errf("queue: unknown option %q", opt)
		}
	}
	return q, nil
}

func parseSession(d *caddyfile.Dispenser) (*SessionConfig, error) {
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	s := &SessionConfig{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch opt := d.Val(); opt {
		case "idle_timeout":
			v, err := durationArg(d, true)
			if err != nil {
				return nil, err
			}
			s.IdleTimeout = v
		case "max_duration":
			v, err := durationArg(d, true)
			if err != nil {
				return nil, err
			}
			s.MaxDuration = v
		default:
			return nil, d.Errf("session: unknown option %q", opt)
		}
	}
	return s, nil
}

// parseWebhook reads `webhook <url> { events <names...>; secret <value> }`.
func parseWebhook(d *caddyfile.Dispenser) (*observe.WebhookConfig, error) {
	wh := &observe.WebhookConfig{}
	if !d.NextArg() {
		return nil, d.Errf("webhook needs a URL")
	}
	wh.URL = d.Val()
	if d.NextArg() {
		return nil, d.Errf("webhook takes one URL")
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch opt := d.Val(); opt {
		case "events":
			names := d.RemainingArgs()
			if len(names) == 0 {
				return nil, d.Errf("webhook events needs at least one event name")
			}
			wh.Events = append(wh.Events, names...)
		case "secret":
			v, err := oneArg(d)
			if err != nil {
				return nil, err
			}
			wh.Secret = v
		default:
			return nil, d.Errf("webhook: unknown option %q", opt)
		}
	}
	if err := wh.Validate(); err != nil {
		return nil, d.Err(err.Error())
	}
	return wh, nil
}

// oneArg reads exactly one argument of the current option.
func oneArg(d *caddyfile.Dispenser) (string, error) {
	opt := d.Val()
	if !d.NextArg() {
		return "", d.Errf("%s needs a value", opt)
	}
	v := d.Val()
	if d.NextArg() {
		return "", d.Errf("%s takes one value", opt)
	}
	return v, nil
}

// intArg reads one integer of at least min.
func intArg(d *caddyfile.Dispenser, min int) (int, error) {
	opt := d.Val()
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, d.Errf("%s must be an integer, got %q", opt, v)
	}
	if n < min {
		if min == 0 {
			return 0, d.Errf("%s must not be negative, got %d", opt, n)
		}
		return 0, d.Errf("%s must be at least %d, got %d", opt, min, n)
	}
	return n, nil
}

// durationArg reads one Caddy duration; zero is allowed only when zeroOK.
func durationArg(d *caddyfile.Dispenser, zeroOK bool) (caddy.Duration, error) {
	opt := d.Val()
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return 0, d.Errf("%s: invalid duration %q", opt, v)
	}
	if dur < 0 || (dur == 0 && !zeroOK) {
		return 0, d.Errf("%s must be a positive duration, got %q", opt, v)
	}
	return caddy.Duration(dur), nil
}

// onOff reads on or off; with bareOK the option alone means on.
func onOff(d *caddyfile.Dispenser, bareOK bool) (bool, error) {
	opt := d.Val()
	if !d.NextArg() {
		if bareOK {
			return true, nil
		}
		return false, d.Errf("%s needs on or off", opt)
	}
	v := d.Val()
	if d.NextArg() {
		return false, d.Errf("%s takes one value", opt)
	}
	switch v {
	case "on":
		return true, nil
	case "off":
		return false, nil
	}
	return false, d.Errf("%s: want on or off, got %q", opt, v)
}

// Interface guard.
var _ caddyfile.Unmarshaler = (*Handler)(nil)

// parseState reads "state redis <address> { ... }".
func parseState(d *caddyfile.Dispenser) (*StateConfig, error) {
	args := d.RemainingArgs()
	if len(args) != 2 || args[0] != "redis" {
		return nil, d.Errf("state takes a backend and its address: state redis <host:port>")
	}
	st := &StateConfig{Redis: &RedisConfig{Address: args[1]}}
	r := st.Redis
	tlsOn := func() *TLSConfig {
		if r.TLS == nil {
			r.TLS = &TLSConfig{}
		}
		return r.TLS
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		var err error
		switch opt {
		case "username":
			r.Username, err = oneArg(d)
		case "password":
			r.Password, err = oneArg(d)
		case "db":
			r.DB, err = intArg(d, 0)
		case "key_prefix":
			r.KeyPrefix, err = oneArg(d)
		case "tls":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			tlsOn()
		case "tls_server_name":
			tlsOn().ServerName, err = oneArg(d)
		case "tls_insecure_skip_verify":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			tlsOn().InsecureSkipVerify = true
		case "tls_trusted_ca_certs":
			files := d.RemainingArgs()
			if len(files) == 0 {
				return nil, d.ArgErr()
			}
			tlsOn().TrustedCACertFiles = append(tlsOn().TrustedCACertFiles, files...)
		case "lease_ttl":
			r.LeaseTTL, err = durationArg(d, false)
		case "timeout":
			r.Timeout, err = durationArg(d, false)
		case "node":
			st.Node, err = oneArg(d)
		case "on_unavailable":
			st.OnUnavailable, err = oneArg(d)
			if err == nil && st.OnUnavailable != "local" && st.OnUnavailable != "reject" {
				return nil, d.Errf("on_unavailable %q: want local or reject", st.OnUnavailable)
			}
		default:
			return nil, d.Errf("state: unknown option %q", opt)
		}
		if err != nil {
			return nil, err
		}
	}
	return st, nil
}
