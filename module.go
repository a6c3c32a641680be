// Package browserfailover is a Caddy HTTP handler that gives browser
// automation clients (Puppeteer, Playwright, chromedp, Selenium,
// WebdriverIO) one URL in front of several remote-browser providers. For
// each client it picks a healthy provider, fails over to the next until a
// session is established, queues clients when all are busy, and relays
// the session byte for byte.
//
// This package is the Caddy surface only: the module and its lifecycle
// (this file), and the Caddyfile (caddyfile*.go). The configuration types
// and their validators are package config; what a handler runs — the
// failover chain, the kinds of client it serves, their sessions — is
// package gateway.
package browserfailover

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/browserfailover/caddy-browser-failover/config"
	"github.com/browserfailover/caddy-browser-failover/gateway"
	"github.com/browserfailover/caddy-browser-failover/status" // also registers the admin API module
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler is the browser_failover HTTP handler. Its configuration (the
// same in JSON and in the Caddyfile; UnmarshalCaddyfile documents the
// Caddyfile syntax) is config.Handler; Provision builds the gateway that
// serves it.
type Handler struct {
	config.Handler

	gw *gateway.Gateway
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.browser_failover",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision builds the handler's gateway.
func (h *Handler) Provision(ctx caddy.Context) error {
	var err error
	h.gw, err = gateway.New(ctx, &h.Handler, status.Gauges)
	return err
}

// Validate checks the configuration (JSON configs never pass through the
// Caddyfile parser).
func (h *Handler) Validate() error {
	return h.Handler.Validate()
}

// Cleanup gives back what Provision took; it is safe after a partial
// Provision.
func (h *Handler) Cleanup() error {
	if h.gw == nil {
		return nil
	}
	return h.gw.Cleanup()
}

// ServeHTTP serves a client of the gateway.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	return h.gw.ServeHTTP(w, r)
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
