package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/internal/conf"
)

// TestModeSecretsHidden: the sentinels' password is in no pool key and no
// error, whichever way Redis is reached; changing it changes the key.
func TestModeSecretsHidden(t *testing.T) {
	const pw = "s3ntinel-secret"
	cfg := Config{Sentinel: &Sentinel{Master: "m", Addresses: []string{"127.0.0.1:1"}}, SentinelPassword: pw, Password: "srv-secret"}
	k := poolKey(cfg, "n")
	if strings.Contains(k, pw) {
		t.Fatalf("pool key %q holds the sentinel password", k)
	}
	other := cfg
	other.SentinelPassword = pw + "x"
	if poolKey(other, "n") == k {
		t.Fatal("a changed sentinel password keeps the pool key")
	}
	cl := Config{Cluster: []string{"127.0.0.1:1"}}
	if poolKey(cl, "n") == poolKey(Config{Address: "127.0.0.1:1"}, "n") {
		t.Fatal("a cluster and a single server of the same address share a pool key")
	}
	// A call that fails (no sentinel listens) names no secret.
	cfg.Timeout = caddy.Duration(100 * time.Millisecond)
	s, err := Open(cfg, "n")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Ping(context.Background())
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Ping: %v, want ErrUnavailable", err)
	}
	if strings.Contains(err.Error(), pw) || strings.Contains(err.Error(), "srv-secret") {
		t.Fatalf("error holds a password: %v", err)
	}
	if s.Mode() != ModeSentinel || s.Address() != "" {
		t.Fatalf("mode %q address %q before any connection", s.Mode(), s.Address())
	}
}

// TestValidateModes: exactly one of address, sentinel and cluster; each
// problem names the options at fault.
func TestValidateModes(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		opts []string // the options of the first problem; nil: valid
	}{
		{"address", Config{Address: "h:1"}, nil},
		{"sentinel", Config{Sentinel: &Sentinel{Master: "m", Addresses: []string{"h:26379"}}}, nil},
		{"cluster", Config{Cluster: []string{"h:7000", "h:7001"}}, nil},
		{"none", Config{}, []string{"address", "sentinel", "cluster"}},
		{"address and cluster", Config{Address: "h:1", Cluster: []string{"h:7000"}}, []string{"address", "cluster"}},
		{"sentinel without master", Config{Sentinel: &Sentinel{Addresses: []string{"h:1"}}}, []string{"sentinel"}},
		{"cluster URL", Config{Cluster: []string{"redis://u:p@h:1"}}, []string{"cluster"}},
		{"cluster db", Config{Cluster: []string{"h:1"}, DB: 3}, []string{"db", "cluster"}},
		{"sentinel_password alone", Config{Address: "h:1", SentinelPassword: "x"}, []string{"sentinel_password"}},
	}
	for _, tc := range cases {
		err := tc.cfg.Validate(nil)
		if tc.opts == nil {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		var p *conf.Problem
		if !errors.As(err, &p) || strings.Join(p.Options, ",") != strings.Join(tc.opts, ",") {
			t.Errorf("%s: %v (%+v), want a problem with %v", tc.name, err, p, tc.opts)
		}
		if strings.Contains(err.Error(), "u:p@") {
			t.Errorf("%s: the error repeats the address: %v", tc.name, err)
		}
	}
}
