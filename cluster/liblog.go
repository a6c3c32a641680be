package cluster

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// The Redis client library has one logger for the whole process, which
// writes to stderr past Caddy's logging. Opening a Store sends it to that
// Store's zap logger (the latest opened), named "redis", at debug level:
// every failure it reports (a refused dial, a dropped connection) also
// fails a call, which the gateway logs and counts itself.
var (
	libLogOnce sync.Once
	libLogTo   atomic.Pointer[zap.Logger]
)

// routeLibraryLog sends the library's messages to l from now on; it
// returns the logger to give to unrouteLibraryLog when the Store closes.
func routeLibraryLog(l *zap.Logger) *zap.Logger {
	named := l.Named("redis")
	libLogTo.Store(named)
	libLogOnce.Do(func() { redis.SetLogger(libLog{}) })
	return named
}

// unrouteLibraryLog stops sending the library's messages to named, if
// they still go there: a closed Store's logger may be gone (a test's).
func unrouteLibraryLog(named *zap.Logger) {
	libLogTo.CompareAndSwap(named, zap.NewNop())
}

type libLog struct{}

func (libLog) Printf(_ context.Context, format string, v ...any) {
	if ce := libLogTo.Load().Check(zap.DebugLevel, "redis client"); ce != nil {
		ce.Write(zap.String("detail", fmt.Sprintf(format, v...)))
	}
}
