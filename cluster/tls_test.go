package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/internal/conf"
	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
)

// TestTLSToRedis: a store reaches a real redis-server over TLS with the
// gateway's TLS settings: the server's certificate is verified against
// the trusted CA and the address's host, or the name given; a wrong name,
// the system's roots or plain TCP to the TLS port fail, and
// insecure_skip_verify accepts the certificate.
func TestTLSToRedis(t *testing.T) {
	r := testredis.StartTLS(t)
	ca := []string{r.CAFile}
	for _, tc := range []struct {
		name string
		tls  *conf.TLS
		ok   bool
	}{
		{"trusted CA, the address's host", &conf.TLS{TrustedCACertFiles: ca}, true},
		{"trusted CA, a server name", &conf.TLS{TrustedCACertFiles: ca, ServerName: testredis.ServerName}, true},
		{"trusted CA, a wrong server name", &conf.TLS{TrustedCACertFiles: ca, ServerName: "other.test"}, false},
		{"the system's roots", &conf.TLS{}, false},
		{"insecure_skip_verify", &conf.TLS{InsecureSkipVerify: true}, true},
		{"plain TCP", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open(Config{Address: r.TLSAddr, TLS: tc.tls, KeyPrefix: "tls-test:",
				Timeout: caddy.Duration(2 * time.Second), LeaseTTL: caddy.Duration(10 * time.Second)}, "n")
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			err = s.Ping(ctx)
			if !tc.ok {
				if err == nil {
					t.Fatal("Ping succeeded")
				}
				return
			}
			if err != nil {
				t.Fatalf("Ping: %v", err)
			}
			g, err := s.Leases().Acquire(ctx, "p", 1)
			if err != nil || g.Lease == nil {
				t.Fatalf("Acquire over TLS: %+v, %v", g, err)
			}
			g.Lease.Release()
		})
	}
}
