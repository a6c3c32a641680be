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
//		controls on|off   # default off
//	}
func (d *Dashboard) UnmarshalCaddyfile(disp *caddyfile.Dispenser) error {
	disp.Next() // the directive name
	if disp.NextArg() {
		return disp.Errf("browser_failover_dashboard takes no arguments (options go in its block), got %q", disp.Val())
	}
	var first *caddyfile.Token // the first controls line
	for disp.NextBlock(0) {
		switch disp.Val() {
		case "controls":
			if first != nil {
				return disp.Errf("controls given twice in the same block (first at %s:%d)", first.File, first.Line)
			}
			tok := disp.Token()
			first = &tok
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
		default:
			return disp.Errf("unknown browser_failover_dashboard option %q (want controls)", disp.Val())
		}
	}
	return nil
}

// Interface guard.
var _ caddyfile.Unmarshaler = (*Dashboard)(nil)
