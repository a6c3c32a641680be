package browserfailover_test

import (
	"context"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
)

// The whole chain per upgrade, in one process: a client dials the gateway,
// which picks the one provider, dials it, relays the 101 and the session,
// and the client closes at once. BenchmarkUpgradeDirect dials the same
// fake provider without the gateway: the difference between the two, in
// allocations and bytes per upgrade (-benchmem), is the gateway's.
//
//	go test -run '^$' -bench Upgrade -benchmem .

func BenchmarkUpgradeThroughGateway(b *testing.B) {
	e := fakes.Echo("bench-echo", nil)
	defer e.Close()
	g := testgw.Start(b, handler(`"queue":{"size":0}`, provider("bench-echo", e.URL(), "")))
	benchUpgrades(b, g.WS("/"))
}

func BenchmarkUpgradeDirect(b *testing.B) {
	e := fakes.Echo("bench-direct", nil)
	defer e.Close()
	benchUpgrades(b, e.URL())
}

// benchUpgrades opens and closes b.N sessions at url, one after another.
func benchUpgrades(b *testing.B, url string) {
	b.ReportAllocs()
	opts := &websocket.DialOptions{CompressionMode: websocket.CompressionDisabled}
	b.ResetTimer()
	for range b.N {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, _, err := websocket.Dial(ctx, url, opts)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		c.CloseNow()
	}
}
