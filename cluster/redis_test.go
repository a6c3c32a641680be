package cluster

import (
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

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

// testLogger writes to the test's log until the test ends, then drops
// what comes: the Redis library logs from goroutines of its own (a dial
// it queued), which may outlive a closed store and the test.
func testLogger(t *testing.T) *zap.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() { w.done.Store(true) })
	enc := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(w), zapcore.DebugLevel))
}

type testWriter struct {
	t    *testing.T
	done atomic.Bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	if !w.done.Load() {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}
