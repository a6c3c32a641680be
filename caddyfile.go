package browserfailover

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/dustin/go-humanize"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/config"
	"github.com/browserfailover/caddy-browser-failover/internal/conf"
	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/spend"
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
//		strategy        priority|round_robin|least_conn|weighted|random|latency|cheapest
//		expected_duration <duration>
//		connect_timeout <duration>
//		try_duration    <duration>
//		max_attempts    <n>
//
//		provider <name> <url> {
//			priority        <int>
//			weight          <n>
//			max_concurrent  <n>|auto
//			cost            <amount> per session|minute|hour [minimum <duration>]
//			budget          <amount> per hour|day|month
//			create_rate     <n> per second|minute
//			connect_timeout <duration>
//			header_up [+|-]<field> [<value>]
//			pass_query      [on|off]
//			discover        on|off
//			tls_insecure_skip_verify
//			tls_server_name <name>
//			tls_trusted_ca_certs <pem_file...>
//			cooldown { ... }
//			protocol        cdp|playwright|bidi|webdriver|any
//			playwright_version <major.minor>
//			browsers        <browserName...>        # webdriver: what it starts
//			capabilities    <json object>           # webdriver: merged into alwaysMatch
//			region          <name...>               # where it runs (clients' bf_region)
//			supports        <option...>             # session options it honours
//			option_map      <option> <ours>=<theirs>...
//			warm            <n>                     # sessions opened ahead of demand
//			warm_max_age    <duration>
//			warm_options    <option>=<value>...   # the options warm sessions are made with
//			health_check { ... } | health_check off
//			session_api { ... }   # see parseSessionAPI
//		}
//
//		providers <name> {
//			dynamic         srv|a|multi|<module> ...  # one of Caddy's dynamic upstream sources, in its own syntax
//			scheme          ws|wss|http|https         # default http
//			path            </path>                   # default /
//			<provider option> ...                     # any option of provider, for each provider found
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
//		forward_headers <field...>
//		allowed_origins <origin...>
//		client_limit <placeholder> <n>
//		client_budget <placeholder> <amount> per hour|day|month
//		hedge_after  <duration>
//		hedge_max    <n>
//		keepalive    <interval>|off
//		resume       <window> [hold]
//		resume_key   <placeholder>
//		reap_interval <duration>
//		health_check {
//			uri           <path or full URL>
//			interval      <duration>
//			timeout       <duration>
//			expect_status <code>
//			capacity      browserless|webdriver
//		}
//
//		state redis [<host:port>] {
//			address <host:port>
//			sentinel <master_name> <host:port...>
//			sentinel_username <name>
//			sentinel_password <value>
//			cluster <host:port...>
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
//		webhook <url> {
//			events <name...>
//			secret <value>
//		}
//
//		recording {
//			sessions        asked|all
//			format          jpeg|png
//			quality         <1-100>
//			max_size        <width>x<height>
//			every_nth_frame <n>
//			max_bytes       <size>
//			retention       <duration>
//			storage         <module> ...
//		}
//
//		profiles {
//			key      <base64 of 32 bytes>
//			scope    <placeholder>
//			storage  <module> ...
//			max_size <size>
//			wait     <duration>
//		}
//	}
//
// Each option means what the JSON field of the same name means (see the
// Handler's fields for effects and defaults) and accepts the same values;
// the parser checks them with the same validation as a JSON config, and
// an error names the line of the option at fault. The options provider,
// providers, webhook, header_up, tls_trusted_ca_certs and a webhook's
// events may be repeated (a provider's or a block's name must still be
// unique, and no provider's name may start with a block's name and a
// slash); any other option given twice in the same block is an error. A
// bare pass_query means on. The cooldown block inside a provider
// overrides the handler's, option by option.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive name
	r := &reader{d: d}
	top := r.open("provider", "providers", "webhook")
	if d.NextArg() {
		return d.ArgErr()
	}
	var handlerCooldown *block
	providerCooldowns := map[*ProviderConfig]*block{}
	for d.NextBlock(0) {
		opt := d.Val()
		if err := top.option(); err != nil {
			return err
		}
		var err error
		switch opt {
		case "strategy":
			h.Strategy, err = oneArg(d)
		case "connect_timeout":
			h.ConnectTimeout, err = durationArg(d)
		case "try_duration":
			h.TryDuration, err = durationArg(d)
		case "max_attempts":
			h.MaxAttempts, err = intArg(d)
		case "provider":
			var p *ProviderConfig
			var cb *block
			if p, cb, err = r.parseProvider(); err == nil {
				h.Providers = append(h.Providers, p)
				providerCooldowns[p] = cb
			}
		case "providers":
			var b *ProvidersConfig
			var cb *block
			if b, cb, err = r.parseProviders(); err == nil {
				h.DynamicProviders = append(h.DynamicProviders, b)
				providerCooldowns[&b.ProviderConfig] = cb
			}
		case "cooldown":
			h.Cooldown, handlerCooldown, err = r.parseCooldown("cooldown: ")
		case "queue":
			h.Queue, err = r.parseQueue()
		case "session":
			h.Session, err = r.parseSession()
		case "affinity":
			h.Affinity, err = parseAffinity(d)
		case "discovery":
			var on bool
			on, err = onOff(d, false)
			h.Discovery = &on
		case "client_limit":
			h.ClientLimit, err = parseClientLimit(d)
		case "client_budget":
			h.ClientBudget, err = parseClientBudget(d)
		case "expected_duration":
			h.ExpectedDuration, err = durationArg(d)
		case "hedge_after":
			h.HedgeAfter, err = durationArg(d)
		case "hedge_max":
			h.HedgeMax, err = intArg(d)
		case "state":
			h.State, err = r.parseState()
		case "forward_headers":
			h.ForwardHeaders, err = listArg(d, "at least one header field name")
		case "allowed_origins":
			h.AllowedOrigins, err = listArg(d, "at least one origin (scheme://host[:port], null, or *)")
		case "webhook":
			var wh *observe.WebhookConfig
			if wh, err = r.parseWebhook(); err == nil {
				h.Webhooks = append(h.Webhooks, wh)
			}
		case "health_check":
			var hc *HealthCheckConfig
			if hc, err = parseHealthCheck(d); err == nil {
				if hc.Off {
					err = d.Errf("health_check off is for a provider: it turns the handler's health check off for that provider")
				}
				h.HealthCheck = hc
			}
		case "keepalive":
			h.Keepalive, err = parseKeepalive(d)
		case "reap_interval":
			h.ReapInterval, err = durationArg(d)
		case "resume":
			h.Resume, err = parseResume(d)
		case "resume_key":
			h.ResumeKey, err = oneArg(d)
		case "recording":
			h.Recording, err = r.parseRecording()
		case "profiles":
			h.Profiles, err = r.parseProfiles()
		default:
			return d.Errf("unknown option %q", opt)
		}
		if err != nil {
			return err
		}
		h.Stated().Add(opt)
		if err := top.check(errors.Join(h.ValidateOwn(), h.Affinity.Validate(), h.ClientLimit.Validate(), h.ClientBudget.Validate()), opt); err != nil {
			return err
		}
	}
	if err := top.finish(h.ValidateOwn()); err != nil {
		return err
	}
	// A provider's cooldown override against the handler's cooldown,
	// which may come before or after it: the later of the two options.
	withCooldown := slices.Clone(h.Providers)
	for _, b := range h.DynamicProviders {
		withCooldown = append(withCooldown, &b.ProviderConfig)
	}
	for _, p := range withCooldown {
		var clash *config.CooldownClash
		if errors.As(h.Cooldown.Clash(p), &clash) {
			at := providerCooldowns[p].at[clash.OwnOpt()]
			if m := handlerCooldown.at[clash.HandlerOpt()]; m.seq > at.seq {
				at = m
			}
			return errAt(at.tok, clash)
		}
	}
	// Health checks merge the handler's and the provider's blocks,
	// wherever they are: each provider's must have something to GET.
	return h.checkProbeTargets(d)
}

// parseProvider reads `provider <name> <url> { ... }`; it returns the
// provider and the block of its cooldown override (nil when none).
func (r *reader) parseProvider() (*ProviderConfig, *block, error) {
	d := r.d
	b := r.open("header_up", "tls_trusted_ca_certs", "option_map")
	args := d.RemainingArgs()
	if len(args) != 2 {
		return nil, nil, d.Errf("provider takes a name and a URL")
	}
	p := &ProviderConfig{}
	p.Name, p.URL = args[0], args[1]
	b.note("name", "url")
	if err := b.check(p.Validate(), "name", "url"); err != nil {
		return nil, nil, err
	}
	var cooldownBlock *block
	what := fmt.Sprintf("provider %q", p.Name)
	err := b.each(what, p.Stated(), p.Validate, func(opt string) error {
		return readProviderOption(r, p, opt, what, &cooldownBlock)
	})
	if err != nil {
		return nil, nil, err
	}
	return p, cooldownBlock, nil
}

// parseProviders reads `providers <name> { dynamic <source> ...; scheme
// ...; path ...; <provider option>... }`; it returns the block and the
// block of its cooldown override (nil when none). The source is read by
// its own module's Caddyfile syntax, as reverse_proxy's dynamic reads it.
func (r *reader) parseProviders() (*ProvidersConfig, *block, error) {
	d := r.d
	b := r.open("header_up", "tls_trusted_ca_certs", "option_map")
	args := d.RemainingArgs()
	if len(args) != 1 {
		return nil, nil, d.Errf("providers takes a name (each provider found is named <name>/<host>:<port>)")
	}
	pb := &ProvidersConfig{}
	pb.Name = args[0]
	b.note("providers")
	if err := b.check(pb.Validate(), "providers"); err != nil {
		return nil, nil, err
	}
	var cooldownBlock *block
	what := fmt.Sprintf("providers %q", pb.Name)
	err := b.each(what, pb.Stated(), pb.Validate, func(opt string) (err error) {
		switch opt {
		case "dynamic":
			pb.SourceRaw, err = parseSource(d)
		case "scheme":
			pb.Scheme, err = oneArg(d)
		case "path":
			pb.Path, err = oneArg(d)
		default:
			return readProviderOption(r, &pb.ProviderConfig, opt, what, &cooldownBlock)
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return pb, cooldownBlock, nil
}

// parseSource reads `dynamic <module> ...`: the module of namespace
// http.reverse_proxy.upstreams and its own options, as JSON with its name
// under "source".
func parseSource(d *caddyfile.Dispenser) (json.RawMessage, error) {
	if !d.NextArg() {
		return nil, d.Errf("dynamic needs a source module: srv, a, multi or another http.reverse_proxy.upstreams module")
	}
	name := d.Val()
	id := "http.reverse_proxy.upstreams." + name
	unm, err := caddyfile.UnmarshalModule(d, id)
	if err != nil {
		return nil, err
	}
	if _, ok := unm.(reverseproxy.UpstreamSource); !ok {
		return nil, d.Errf("module %s is not a source of upstreams", id)
	}
	return caddyconfig.JSONModuleObject(unm, "source", name, nil), nil
}

// readProviderOption reads the provider option opt into p, for a
// provider or a providers block (what names it in messages); a cooldown
// override's block goes to *cooldownBlock. errUnknownOption when opt is
// none.
func readProviderOption(r *reader, p *ProviderConfig, opt, what string, cooldownBlock **block) (err error) {
	d := r.d
	switch opt {
	case "priority":
		var n int
		if n, err = intArg(d); err == nil {
			p.Priority = &n
		}
	case "weight":
		p.Weight, err = intArg(d)
	case "max_concurrent":
		p.MaxConcurrent, err = parseConcurrency(d)
	case "cost":
		p.Cost, err = parseCost(d)
	case "budget":
		var b spend.Budget
		if b, err = parseBudget(d, "budget", d.RemainingArgs()); err == nil {
			p.Budget = &b
		}
	case "create_rate":
		p.CreateRate, err = parseCreateRate(d)
	case "connect_timeout":
		p.ConnectTimeout, err = durationArg(d)
	case "header_up":
		var op upstreams.HeaderOp
		op, err = parseHeaderUp(d)
		p.HeadersUp = append(p.HeadersUp, op)
	case "pass_query":
		p.PassQuery, err = onOff(d, true)
	case "discover":
		var on bool
		on, err = onOff(d, false)
		p.Discover = &on
	case "cooldown":
		p.Cooldown, *cooldownBlock, err = r.parseCooldown(what + ": cooldown: ")
	case "protocol":
		var v string
		v, err = oneArg(d)
		p.Protocol = strings.ToLower(v)
	case "playwright_version":
		p.PlaywrightVersion, err = oneArg(d)
	case "browsers":
		if p.Browsers = d.RemainingArgs(); len(p.Browsers) == 0 {
			err = d.ArgErr()
		}
	case "capabilities":
		var v string
		v, err = oneArg(d)
		p.Capabilities = json.RawMessage(v)
	case "health_check":
		p.HealthCheck, err = parseHealthCheck(d)
	case "session_api":
		p.SessionAPI, err = r.parseSessionAPI(what + ": ")
	case "warm":
		p.Warm, err = intArg(d)
	case "warm_max_age":
		p.WarmMaxAge, err = durationArg(d)
	case "warm_options":
		p.WarmOptions, err = parseWarmOptions(d)
	case "region":
		if p.Region = d.RemainingArgs(); len(p.Region) == 0 {
			err = d.ArgErr()
		}
	case "supports":
		if p.Supports = d.RemainingArgs(); len(p.Supports) == 0 {
			err = d.ArgErr()
		}
	case "option_map":
		err = parseOptionMap(d, &p.OptionMap)
	default:
		return readTLS(d, opt, &p.TLS)
	}
	return err
}

// readTLS reads the TLS option opt, of a provider or of the Redis store,
// into *t (made when nil); errUnknownOption when opt is none.
func readTLS(d *caddyfile.Dispenser, opt string, t **conf.TLS) (err error) {
	var o conf.TLS
	if *t != nil {
		o = **t
	}
	switch opt {
	case "tls_insecure_skip_verify":
		err = noArgs(d)
		o.InsecureSkipVerify = true
	case "tls_server_name":
		o.ServerName, err = oneArg(d)
	case "tls_trusted_ca_certs":
		var files []string
		files, err = someArgs(d)
		o.TrustedCACertFiles = append(o.TrustedCACertFiles, files...)
	default:
		return errUnknownOption
	}
	*t = &o
	return err
}

// parseHeaderUp reads `header_up [+|-]<field> [<value>]`.
func parseHeaderUp(d *caddyfile.Dispenser) (upstreams.HeaderOp, error) {
	args := d.RemainingArgs()
	if len(args) == 0 || len(args) > 2 {
		return upstreams.HeaderOp{}, d.Errf("header_up takes a field and a value, +field value, or -field")
	}
	field := args[0]
	op := upstreams.HeaderOp{Op: "set", Field: field}
	switch {
	case strings.HasPrefix(field, "+"):
		op.Op, op.Field = "add", field[1:]
	case strings.HasPrefix(field, "-"):
		op.Op, op.Field = "delete", field[1:]
	}
	if len(args) == 2 {
		op.Value = args[1]
	} else if op.Op != "delete" {
		return op, d.Errf("header_up %s needs a value", op.Field)
	}
	return op, nil
}

// parseCooldown reads a cooldown block; prefix starts its messages, to
// say whose block it is. It returns the block's options too.
func (r *reader) parseCooldown(prefix string) (*CooldownConfig, *block, error) {
	d := r.d
	if d.NextArg() {
		return nil, nil, d.ArgErr()
	}
	b := r.open()
	c := &CooldownConfig{}
	validate := func() error { return config.Within(prefix, c.Validate()) }
	err := b.each("cooldown", c.Stated(), validate, func(opt string) (err error) {
		switch opt {
		case "duration":
			c.Duration, err = durationArg(d)
		case "max_duration":
			c.MaxDuration, err = durationArg(d)
		case "window":
			c.Window, err = durationArg(d)
		case "failure_threshold":
			c.FailureThreshold, err = floatArg(d)
		case "min_requests":
			c.MinRequests, err = intArg(d)
		default:
			return errUnknownOption
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return c, b, nil
}

func (r *reader) parseQueue() (*QueueConfig, error) {
	d := r.d
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	q := &QueueConfig{}
	return q, r.open().each("queue", q.Stated(), q.Validate, func(opt string) (err error) {
		switch opt {
		case "size":
			var n int
			if n, err = intArg(d); err == nil {
				q.Size = &n
			}
		case "timeout":
			q.Timeout, err = durationArg(d)
		default:
			return errUnknownOption
		}
		return err
	})
}

func (r *reader) parseSession() (*SessionConfig, error) {
	d := r.d
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	s := &SessionConfig{}
	return s, r.open().each("session", nil, s.Validate, func(opt string) (err error) {
		switch opt {
		case "idle_timeout":
			s.IdleTimeout, err = durationArg(d)
		case "max_duration":
			s.MaxDuration, err = durationArg(d)
		default:
			return errUnknownOption
		}
		return err
	})
}

// parseAffinity reads `affinity header|query|cookie <name>`.
func parseAffinity(d *caddyfile.Dispenser) (*AffinityConfig, error) {
	args := d.RemainingArgs()
	if len(args) != 2 {
		return nil, d.Errf("affinity takes a source (header, query or cookie) and a name")
	}
	return &AffinityConfig{Source: args[0], Name: args[1]}, nil
}

// parseClientLimit reads `client_limit <placeholder> <n>`.
func parseClientLimit(d *caddyfile.Dispenser) (*ClientLimitConfig, error) {
	args := d.RemainingArgs()
	if len(args) != 2 {
		return nil, d.Errf("client_limit takes a key placeholder and a number, like client_limit {http.auth.user.id} 3")
	}
	n, err := strconv.Atoi(args[1])
	if err != nil {
		return nil, d.Errf("client_limit: %q is not a number of sessions", args[1])
	}
	return &ClientLimitConfig{Key: args[0], Limit: n}, nil
}

// parseWebhook reads `webhook <url> { events <names...>; secret <value> }`.
func (r *reader) parseWebhook() (*observe.WebhookConfig, error) {
	d := r.d
	b := r.open("events")
	wh := &observe.WebhookConfig{}
	if !d.NextArg() {
		return nil, d.Errf("webhook needs a URL")
	}
	wh.URL = d.Val()
	if d.NextArg() {
		return nil, d.Errf("webhook takes one URL")
	}
	if err := wh.Validate(); err != nil {
		return nil, errAt(b.start.tok, err)
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if err := b.option(); err != nil {
			return nil, err
		}
		switch opt {
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
		// The URL was checked above: what fails now is this option.
		if err := wh.Validate(); err != nil {
			return nil, errAt(b.at[opt].tok, err)
		}
	}
	return wh, nil
}

// parseState reads `state redis [<address>] { ... }`.
func (r *reader) parseState() (*StateConfig, error) {
	d := r.d
	b := r.open("tls_trusted_ca_certs")
	args := d.RemainingArgs()
	if len(args) < 1 || len(args) > 2 || args[0] != "redis" {
		return nil, d.Errf("state takes a backend and, optionally, its address: state redis [<host:port>]")
	}
	st := &StateConfig{Redis: &RedisConfig{}}
	rc := st.Redis
	if len(args) == 2 {
		rc.Address = args[1]
		rc.Stated().Add("address")
		b.note("state", "address")
		if err := b.check(st.Validate(), "state", "address"); err != nil {
			return nil, err
		}
	}
	return st, b.each("state", rc.Stated(), st.Validate, func(opt string) (err error) {
		switch opt {
		case "address":
			rc.Address, err = oneArg(d)
		case "sentinel":
			var v []string
			if v, err = listArg(d, "the master's name then at least one sentinel address"); err == nil {
				rc.Sentinel = &cluster.Sentinel{Master: v[0], Addresses: v[1:]}
			}
		case "cluster":
			rc.Cluster, err = listArg(d, "at least one seed address (host:port)")
		case "sentinel_username":
			rc.SentinelUsername, err = oneArg(d)
		case "sentinel_password":
			rc.SentinelPassword, err = oneArg(d)
		case "username":
			rc.Username, err = oneArg(d)
		case "password":
			rc.Password, err = oneArg(d)
		case "db":
			rc.DB, err = intArg(d)
		case "key_prefix":
			rc.KeyPrefix, err = oneArg(d)
		case "tls":
			// TLS with the defaults, unless tls_* options say more.
			err = noArgs(d)
			if rc.TLS == nil {
				rc.TLS = &conf.TLS{}
			}
		case "lease_ttl":
			rc.LeaseTTL, err = durationArg(d)
		case "timeout":
			rc.Timeout, err = durationArg(d)
		case "node":
			st.Node, err = oneArg(d)
		case "on_unavailable":
			st.OnUnavailable, err = oneArg(d)
		default:
			return readTLS(d, opt, &rc.TLS)
		}
		return err
	})
}

// Interface guards.
var (
	_ caddyfile.Unmarshaler = (*Handler)(nil)
	_ json.Unmarshaler      = (*Handler)(nil)
)

// parseRecording reads the recording block. Its storage line is a Caddy
// storage module's, read the way Caddy's own storage global option reads
// one: `storage <module>` and what that module's Caddyfile form takes.
func (r *reader) parseRecording() (*RecordingConfig, error) {
	d := r.d
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	rc := &RecordingConfig{}
	return rc, r.open().each("recording", rc.Stated(), rc.Validate, func(opt string) (err error) {
		switch opt {
		case "sessions":
			rc.Sessions, err = oneArg(d)
		case "format":
			rc.Format, err = oneArg(d)
		case "quality":
			rc.Quality, err = intArg(d)
		case "max_size":
			rc.MaxSize, err = oneArg(d)
		case "every_nth_frame":
			rc.EveryNthFrame, err = intArg(d)
		case "max_bytes":
			rc.MaxBytes, err = sizeArg(d, "recording max_bytes", "500MiB")
		case "retention":
			var v caddy.Duration
			if v, err = durationArg(d); err == nil {
				rc.Retention = &v
			}
		case "storage":
			rc.Storage, err = storageArg(d, "recording")
		default:
			return errUnknownOption
		}
		return err
	})
}

// storageArg reads a storage line: `storage <module>` and what that
// Caddy storage module's Caddyfile form takes, as Caddy's own storage
// global option reads one; what names the block in errors.
func storageArg(d *caddyfile.Dispenser, what string) (json.RawMessage, error) {
	if !d.NextArg() {
		return nil, d.ArgErr()
	}
	name := d.Val()
	unm, err := caddyfile.UnmarshalModule(d, "caddy.storage."+name)
	if err != nil {
		return nil, err
	}
	if _, ok := unm.(caddy.StorageConverter); !ok {
		return nil, d.Errf("%s storage: module caddy.storage.%s is not a storage", what, name)
	}
	return caddyconfig.JSONModuleObject(unm, "module", name, nil), nil
}

// sizeArg reads one size, such as 10MiB; what names the option in errors.
func sizeArg(d *caddyfile.Dispenser, what, example string) (int64, error) {
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	n, perr := humanize.ParseBytes(v)
	if perr != nil || n > math.MaxInt64 {
		return 0, d.Errf("%s %q: want a size such as %s", what, v, example)
	}
	return int64(n), nil
}

// parseProfiles reads the profiles block.
func (r *reader) parseProfiles() (*ProfilesConfig, error) {
	d := r.d
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	pc := &ProfilesConfig{}
	return pc, r.open().each("profiles", pc.Stated(), pc.Validate, func(opt string) (err error) {
		switch opt {
		case "key":
			pc.Key, err = oneArg(d)
		case "scope":
			pc.Scope, err = oneArg(d)
		case "storage":
			pc.Storage, err = storageArg(d, "profiles")
		case "max_size":
			pc.MaxSize, err = sizeArg(d, "profiles max_size", "10MiB")
		case "wait":
			pc.Wait, err = durationArg(d)
		default:
			return errUnknownOption
		}
		return err
	})
}

// parseResume reads `resume <window> [hold]`.
func parseResume(d *caddyfile.Dispenser) (*ResumeConfig, error) {
	args := d.RemainingArgs()
	if len(args) == 0 || len(args) > 2 {
		return nil, d.Errf("resume takes a window and, optionally, hold: resume <window> [hold]")
	}
	w, err := caddy.ParseDuration(args[0])
	if err != nil {
		return nil, d.Errf("resume: invalid window %q", args[0])
	}
	rc := &ResumeConfig{Window: caddy.Duration(w)}
	if len(args) == 2 {
		if args[1] != "hold" {
			return nil, d.Errf("resume: unknown word %q after the window (want hold)", args[1])
		}
		rc.Hold = true
	}
	return rc, nil
}

// parseOptionMap reads `option_map <option> <ours>=<theirs>...` into *m;
// an option may be mapped once.
func parseOptionMap(d *caddyfile.Dispenser, m *map[string]map[string]string) error {
	args := d.RemainingArgs()
	if len(args) < 2 {
		return d.Errf("option_map takes a session option and one <ours>=<theirs> pair or more")
	}
	name := args[0]
	if _, dup := (*m)[name]; dup {
		return d.Errf("option_map %s is given twice", name)
	}
	vals := map[string]string{}
	for _, a := range args[1:] {
		ours, theirs, ok := strings.Cut(a, "=")
		if !ok {
			return d.Errf("option_map %s: %q is not <ours>=<theirs>", name, a)
		}
		if _, dup := vals[ours]; dup {
			return d.Errf("option_map %s: %q is mapped twice", name, ours)
		}
		vals[ours] = theirs
	}
	if *m == nil {
		*m = map[string]map[string]string{}
	}
	(*m)[name] = vals
	return nil
}

// parseWarmOptions reads warm_options <option>=<value>...: the JSON object
// of option names the JSON form takes, each value as written (the option
// rules check it).
func parseWarmOptions(d *caddyfile.Dispenser) (json.RawMessage, error) {
	args := d.RemainingArgs()
	if len(args) == 0 {
		return nil, d.ArgErr()
	}
	m := map[string]string{}
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return nil, d.Errf("warm_options: want <option>=<value>, got %q", a)
		}
		if _, dup := m[k]; dup {
			return nil, d.Errf("warm_options: %s given twice", k)
		}
		m[k] = v
	}
	b, err := json.Marshal(m)
	return b, err
}
