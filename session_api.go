package browserfailover

import (
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/pool"
)

// releaseGrace bounds how long a process exit waits for the releases of
// provider sessions still in flight.
const releaseGrace = 15 * time.Second

// finishReleases waits, at process exit, until the provider sessions whose
// release is under way are released, and the create calls still in flight
// have answered and what they created is released (or releaseGrace has
// passed); the logger hears of any left.
func finishReleases(reg *pool.Registry, logger *zap.Logger) {
	rel := reg.Releaser()
	if rel.Wait(time.Now().Add(releaseGrace)) || logger == nil {
		return
	}
	logger.Error("provider sessions left unreleased at exit", zap.Int("pending", rel.Pending()))
}

// setupRegistry readies a new registry: its releaser tells the log of what
// an operator must hear of.
func setupRegistry(reg *pool.Registry) {
	rel := reg.Releaser()
	// A failed release call is worth a line in the log: the provider may
	// bill a session nobody uses. The cause never holds a URL or a header.
	rel.OnFailure = func(provider string, err error) {
		caddy.Log().Named("http.handlers.browser_failover").Warn("provider session release failed",
			zap.String("provider", provider), zap.String("cause", err.Error()))
	}
	// A session nobody can release bills until the provider ends it: an
	// operator must hear of it. The cause never holds a header, a URL or
	// the answer's body.
	rel.OnOrphan = func(provider, cause string) {
		caddy.Log().Named("http.handlers.browser_failover").Error("provider session cannot be released: the create answer gave no session ID",
			zap.String("provider", provider), zap.String("cause", cause))
	}
}
