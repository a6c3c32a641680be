package status

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("browser_failover_dashboard", parseDashboard)
	// It answers the request itself, like Caddy's metrics handler, its
	// twin on the admin side. Ordered just before metrics, it also comes
	// before browser_failover (ordered before reverse_proxy), so a
	// dashboard under a path matcher sits beside the gateway on one site.
	httpcaddyfile.RegisterDirectiveOrder("browser_failover_dashboard", httpcaddyfile.Before, "metrics")
}

func parseDashboard(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var d Dashboard
	err := d.UnmarshalCaddyfile(h.Dispenser)
	return &d, err
}

// UnmarshalCaddyfile sets up the dashboard from Caddyfile tokens:
//
//	browser_failover_dashboard [<matcher>] {
//		controls on|off     # default off
//		hosts <name>...     # more Host names it answers to
//	}
//
// The dashboard answers only a Host (any port) that is an IP address,
// localhost, a host name of the server's site addresses, or a name of
// hosts; any other gets 403. A name of hosts is a bare host name (no
// scheme, path or port), matched as the host matcher matches: case does
// not matter, and *.example.com matches one label in place of the *:
//
//	hosts ops.example.com *.ops.internal
func (d *Dashboard) UnmarshalCaddyfile(disp *caddyfile.Dispenser) error {
	disp.Next() // the directive name
	if disp.NextArg() {
		return disp.Errf("browser_failover_dashboard takes no arguments (options go in its block), got %q", disp.Val())
	}
	first := make(map[string]caddyfile.Token) // each option's first line
	for disp.NextBlock(0) {
		opt := disp.Val()
		if tok, ok := first[opt]; ok {
			return disp.Errf("%s given twice in the same block (first at %s:%d)", opt, tok.File, tok.Line)
		}
		switch opt {
		case "controls":
			first[opt] = disp.Token()
			if !disp.NextArg() {
				return disp.Err("controls needs on or off")
			}
			switch disp.Val() {
			case "on":
				d.Controls = true
			case "off":
				d.Controls = false
			default:
				return disp.Errf("controls %q: want on or off", disp.Val())
			}
			if disp.NextArg() {
				return disp.Errf("controls takes one value, got another: %q", disp.Val())
			}
		case "hosts":
			first[opt] = disp.Token()
			d.Hosts = disp.RemainingArgs()
			if len(d.Hosts) == 0 {
				return disp.Err("hosts needs at least one host name")
			}
			if err := d.validate(); err != nil {
				return disp.WrapErr(err)
			}
		default:
			return disp.Errf("unknown browser_failover_dashboard option %q (want controls or hosts)", opt)
		}
	}
	return nil
}

// Interface guard.
var _ caddyfile.Unmarshaler = (*Dashboard)(nil)
