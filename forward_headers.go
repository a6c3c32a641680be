package browserfailover

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// forward_headers: which of the client's handshake fields, besides the
// WebSocket negotiation ones, User-Agent and x-playwright-*, reach the
// providers. Everything else stays at the gateway.

// validateForwardHeaders checks the handler's forward_headers list.
func validateForwardHeaders(fields []string) error {
	return upstreams.CheckForwardHeaders(fields)
}

// parseForwardHeaders reads `forward_headers <field>...` (a trailing *
// matches a prefix), once per block, with every field on its line.
func parseForwardHeaders(d *caddyfile.Dispenser, h *Handler) error {
	fields := d.RemainingArgs()
	if len(fields) == 0 {
		return d.Errf("forward_headers needs at least one header field name")
	}
	if err := validateForwardHeaders(fields); err != nil {
		return d.Err(err.Error())
	}
	h.ForwardHeaders = fields
	return nil
}
