package cluster

import (
	"testing"

	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
)

// redisServer is a redis-server child process of one test (see package
// testredis): Addr, Stop, Start again on the same port, Pause, Resume.
type redisServer = testredis.Server

// startRedis starts a redis-server on a free local port, with extra
// arguments (e.g. "--requirepass", "x"), and stops it when the test ends.
// Without redis-server the test is skipped, except under CI=true where it
// fails: CI installs it (scripts/redis-setup.sh).
func startRedis(t testing.TB, extra ...string) *redisServer {
	t.Helper()
	return testredis.Start(t, extra...)
}
