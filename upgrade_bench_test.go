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

// BenchmarkUpgradeOptions: the same chain with session options in play,
// side by side in one run. plain: a provider with no option settings, the
// client states none (the baseline); unstated: the provider declares
// regions and supports and its URL's query holds option placeholders, the
// client states none; stated: the same provider, the client asks for a
// region and stealth (rendered into the provider's URL).
//
//	go test -run '^$' -bench UpgradeOptions -benchmem -benchtime 2000x -count 5 .
func BenchmarkUpgradeOptions(b *testing.B) {
	e := fakes.Echo("bench-opt-echo", nil)
	defer e.Close()
	plain := provider("bench-opt-plain", e.URL(), "")
	configured := provider("bench-opt", e.URL()+"?stealth={bf.option.stealth}&r={bf.option.region}",
		`"region":["eu-central","us-east"],"supports":["stealth","proxy_country"],"option_map":{"region":{"eu-central":"eu-central-1"}}`)
	g := testgw.Start(b, handler(`"queue":{"size":0}`, plain))
	b.Run("plain", func(b *testing.B) { benchUpgrades(b, g.WS("/")) })
	if err := g.Reload(handler(`"queue":{"size":0}`, configured)); err != nil {
		b.Fatal(err)
	}
	b.Run("unstated", func(b *testing.B) { benchUpgrades(b, g.WS("/")) })
	b.Run("stated", func(b *testing.B) { benchUpgrades(b, g.WS("/?bf_region=eu-central&bf_stealth=true")) })
}
