package browserfailover

import (
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	// Extended CONNECT on, so HTTP/2 clients can open WebSockets (SPEC 3.1).
	_ "github.com/browserfailover/caddy-browser-failover/internal/xconnect"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// closeOnExit makes the HTTP server the handler is provisioned in close
// every live session with 1001 as soon as it begins to shut down for a
// process exit. Cleanup, which does the same, comes too late for HTTP/2
// and HTTP/3 sessions: their requests are still being served, and Caddy
// stops its servers (waiting for requests to finish, with no end by
// default) before it cleans up modules. On a reload (not exiting) the hook
// does nothing and sessions go on.
func closeOnExit(ctx caddy.Context) {
	srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if !ok {
		return
	}
	srv.RegisterOnShutdown(func() {
		if caddy.Exiting() {
			closeAllSessions()
		}
	})
}

// closeAllSessions ends every live session of the process with 1001 and
// waits (a bounded time) until they have ended.
func closeAllSessions() {
	pool.CloseAll(upstreams.CloseGoingAway, upstreams.EndShutdown, time.Now().Add(2*upstreams.CloseWait))
}
