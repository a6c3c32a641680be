package browserfailover_test

// A session outlives its upgrade request: once the handler has handed the
// client's connection to the relay and returned, nothing of the session
// may keep the request's ResponseWriter, which holds the server's buffers
// of the connection (about 9 KiB a session).

import (
	"net/http"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
)

func init() {
	caddy.RegisterModule(writerTracker{})
}

// trackedWriters hands the test a weak pointer to each writer the tracker
// passed on.
var trackedWriters = make(chan weak.Pointer[trackedWriter], 16)

// writerTracker is a middleware placed before browser_failover in the
// test's route: it wraps the ResponseWriter in a writer of its own (which
// the gateway unwraps to hijack, as it does Caddy's) and tells the test.
type writerTracker struct{}

func (writerTracker) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.bf_test_writer_tracker", New: func() caddy.Module { return new(writerTracker) }}
}

func (writerTracker) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	tw := &trackedWriter{ResponseWriter: w}
	trackedWriters <- weak.Make(tw)
	return next.ServeHTTP(tw, r)
}

type trackedWriter struct{ http.ResponseWriter }

func (tw *trackedWriter) Unwrap() http.ResponseWriter { return tw.ResponseWriter }

// TestSessionKeepsNoRequest: while a session relays, the writer of its
// upgrade request is garbage once the handler has returned.
func TestSessionKeepsNoRequest(t *testing.T) {
	echo := fakes.Echo("a", nil)
	defer echo.Close()
	g := testgw.Start(t, `{"handler":"bf_test_writer_tracker"},`+handler("", provider("a", echo.URL(), "")))
	c, _, err := dial(t, "ws://"+g.Addr+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	echoOnce(t, c, []byte("hello"))
	// Every request the tracker saw (a dial tried again makes more than
	// one): none may stay reachable.
	var seen []weak.Pointer[trackedWriter]
	for len(seen) == 0 || len(trackedWriters) > 0 {
		select {
		case wp := <-trackedWriters:
			seen = append(seen, wp)
		case <-time.After(10 * time.Second):
			t.Fatal("the tracker saw no request")
		}
	}
	live := func() bool {
		for _, wp := range seen {
			if wp.Value() != nil {
				return true
			}
		}
		return false
	}
	// The handler returns right after the relay starts; a few collections
	// find the writer unreachable once it has.
	for i := 0; i < 50 && live(); i++ {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	if live() {
		t.Fatal("the live session still holds its upgrade request's ResponseWriter")
	}
	// The session still relays.
	echoOnce(t, c, []byte("still here"))
}
