// Package handoff measures the queue handoff of browser_failover: how long
// after a held session ends the gateway's upstream dial for the next queued
// client reaches the provider. It holds only a benchmark, so `go test ./...`
// runs nothing here; run it with
//
//	go test -run '^$' -bench Handoff -benchtime 200x ./bench/handoff/
//
// Setup: an in-process Caddy (debug logging to a file, as the tests run it)
// with one echo provider at max_concurrent 1, which closes its socket as
// soon as the gateway's side ends, as a browser does; one
// client holds the slot and one waits in the queue. Each iteration closes
// the holder's TCP connection and timestamps:
//
//   - from_client: from just before the holder's TCP close to the moment
//     the provider accepts the waiter's upstream connection;
//   - from_upstream: from the moment the provider sees the holder's
//     upstream connection end (read error) to that same accept.
//
// The waiter then becomes the holder and a new waiter queues.
package handoff

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
)

// tracked is one upstream connection as the provider saw it.
type tracked struct {
	net.Conn
	accepted time.Time
	once     sync.Once
	ended    chan time.Time // the time the peer went away (first read error)
}

func (c *tracked) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	// A deadline error is http.Server interrupting its background read
	// when the handler hijacks the connection, not the peer going away.
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		c.once.Do(func() { c.ended <- time.Now() })
	}
	return n, err
}

// trackingListener hands every accepted connection to accepts.
type trackingListener struct {
	net.Listener
	accepts chan *tracked
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	t := &tracked{Conn: c, accepted: time.Now(), ended: make(chan time.Time, 1)}
	l.accepts <- t
	return t, nil
}

// echoProvider starts an echo WebSocket provider on a tracking listener.
func echoProvider(b *testing.B) (url string, accepts chan *tracked) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	tl := &trackingListener{Listener: ln, accepts: make(chan *tracked, 16)}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: websocket.CompressionDisabled})
		if err != nil {
			return
		}
		fakes.EchoMessages(c)
	})}
	go srv.Serve(tl)
	b.Cleanup(func() { srv.Close() })
	return "ws://" + ln.Addr().String() + "/", tl.accepts
}

func waiting(name string) int {
	for _, q := range pool.Current().Queues.Counts() {
		if slices.Contains(q.Providers, name) {
			return q.Waiting
		}
	}
	return -1
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return s[i]
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func BenchmarkHandoff(b *testing.B) {
	const name = "handoff-echo"
	url, accepts := echoProvider(b)
	g := testgw.Start(b, fmt.Sprintf(`{"handler":"browser_failover","queue":{"size":10,"timeout":"30s"},`+
		`"providers":[{"name":%q,"url":%q,"max_concurrent":1}]}`, name, url))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	dial := func() (*websocket.Conn, error) {
		c, _, err := websocket.Dial(ctx, g.WS("/"), nil)
		return c, err
	}
	held, err := dial()
	if err != nil {
		b.Fatal(err)
	}
	heldUp := <-accepts

	var fromClient, fromUpstream []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		next := make(chan *websocket.Conn, 1)
		go func() {
			c, err := dial()
			if err != nil {
				b.Error(err)
				c = nil
			}
			next <- c
		}()
		for deadline := time.Now().Add(10 * time.Second); waiting(name) != 1; {
			if time.Now().After(deadline) {
				b.Fatal("the waiter never queued")
			}
			time.Sleep(100 * time.Microsecond)
		}
		closed := time.Now()
		held.CloseNow()
		var up *tracked
		select {
		case up = <-accepts:
		case <-time.After(10 * time.Second):
			b.Fatal("the waiter's upstream dial never came")
		}
		upEnded := <-heldUp.ended
		fromClient = append(fromClient, up.accepted.Sub(closed))
		fromUpstream = append(fromUpstream, up.accepted.Sub(upEnded))
		held, heldUp = <-next, up
		if held == nil {
			b.FailNow()
		}
	}
	b.StopTimer()
	held.CloseNow()

	p50c, p99c := percentile(fromClient, 0.50), percentile(fromClient, 0.99)
	p50u, p99u := percentile(fromUpstream, 0.50), percentile(fromUpstream, 0.99)
	b.ReportMetric(us(p50c), "p50-µs")
	b.ReportMetric(us(p99c), "p99-µs")
	b.ReportMetric(us(p50u), "p50-from-upstream-µs")
	b.ReportMetric(us(p99u), "p99-from-upstream-µs")
	b.Logf("%d handoffs: from holder's TCP close p50 %v p99 %v; from upstream end p50 %v p99 %v",
		len(fromClient), p50c, p99c, p50u, p99u)
}
