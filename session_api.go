package browserfailover

import (
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// releaseGrace bounds how long a process exit waits for the releases of
// provider sessions still in flight.
const releaseGrace = 15 * time.Second

// finishReleases waits, at process exit, until the provider sessions whose
// release is under way are released, and the create calls still in flight
// have answered and what they created is released (or releaseGrace has
// passed); the logger hears of any left.
func finishReleases(logger *zap.Logger) {
	if upstreams.WaitReleases(time.Now().Add(releaseGrace)) || logger == nil {
		return
	}
	logger.Error("provider sessions left unreleased at exit",
		zap.Int("pending", upstreams.PendingReleases()))
}

func init() {
	// A failed release call is worth a line in the log: the provider may
	// bill a session nobody uses. The cause never holds a URL or a header.
	upstreams.OnReleaseFailure = func(provider string, err error) {
		caddy.Log().Named("http.handlers.browser_failover").Warn("provider session release failed",
			zap.String("provider", provider), zap.String("cause", err.Error()))
	}
	// A session nobody can release bills until the provider ends it: an
	// operator must hear of it. The cause never holds a header, a URL or
	// the answer's body.
	upstreams.OnOrphan = func(provider, cause string) {
		caddy.Log().Named("http.handlers.browser_failover").Error("provider session cannot be released: the create answer gave no session ID",
			zap.String("provider", provider), zap.String("cause", cause))
	}
}
