package browserfailover_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/internal/conf"
	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
)

// TestSharedStateTLS: with state redis over TLS (the CA trusted through
// tls.trusted_ca_certs, the certificate verified against the address's
// host), a session's lease is written to the real redis-server, and
// another node reading it over TLS sees it; with on_unavailable reject a
// store the gateway could not reach would refuse the session.
func TestSharedStateTLS(t *testing.T) {
	rs := testredis.StartTLS(t)
	tlsOpts := &conf.TLS{TrustedCACertFiles: []string{rs.CAFile}}
	other, err := cluster.Open(cluster.Config{Address: rs.TLSAddr, TLS: tlsOpts, KeyPrefix: "sh-tls:",
		LeaseTTL: caddy.Duration(5 * time.Second), Timeout: caddy.Duration(2 * time.Second)}, "gw-other")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	echo := fakes.Echo("sht-echo", nil)
	defer echo.Close()
	state := fmt.Sprintf(`"state":{"redis":{"address":%q,"tls":{"trusted_ca_certs":[%q]},"lease_ttl":"5s","timeout":"2s","key_prefix":"sh-tls:"},"node":"gw-here","on_unavailable":"reject"}`,
		rs.TLSAddr, rs.CAFile)
	g := testgw.Start(t, handler(`"queue":{"size":0},`+state, provider("sht-echo", echo.URL(), `"max_concurrent":2`)))
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatalf("a session with the shared state over TLS: %v", err)
	}
	echoOnce(t, c, []byte("x"))
	ctx := context.Background()
	testgw.Eventually(t, 10*time.Second, "the gateway's lease read over TLS", func() bool {
		sh, err := other.Leases().Snapshot(ctx, []string{"sht-echo"})
		return err == nil && sh["sht-echo"].Nodes["gw-here"] == 1
	})
	c.Close(websocket.StatusNormalClosure, "")
	testgw.Eventually(t, 10*time.Second, "the gateway's lease given back", func() bool {
		sh, err := other.Leases().Snapshot(ctx, []string{"sht-echo"})
		return err == nil && sh["sht-echo"].Active == 0
	})
}
