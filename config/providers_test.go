package config

import (
	"strings"
	"testing"

	// The sources a block names are Caddy's modules.
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// TestAddress: what a source gives is a provider's host:port, its host's
// trailing dot dropped; what is not a TCP host:port is not used.
func TestAddress(t *testing.T) {
	for _, tc := range []struct {
		dial, want string
		ok         bool
	}{
		{"localhost.:9222", "localhost:9222", true},
		{"browser-0.browsers.default.svc.cluster.local.:9222", "browser-0.browsers.default.svc.cluster.local:9222", true},
		{"10.1.2.3:9222", "10.1.2.3:9222", true},
		{"tcp4/10.1.2.3:9222", "10.1.2.3:9222", true},
		{"[fd00::1]:9222", "[fd00::1]:9222", true},
		{"unix//run/chrome.sock", "", false},
		{"10.1.2.3:9222-9223", "", false},
		{":9222", "", false},
		{".:9222", "", false},
		{"h", "", false},
	} {
		got, ok := Address(tc.dial)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Address(%q) = %q, %v; want %q, %v", tc.dial, got, ok, tc.want, tc.ok)
		}
	}
}

// TestAt: a block's provider at an address is named <block>/<address>,
// reached at <scheme>://<address><path> (http:// and / by default), with
// the block's options.
func TestAt(t *testing.T) {
	b := &ProvidersConfig{}
	b.Name = "br"
	b.MaxConcurrent = Concurrency{Limit: 3}
	p := b.At("localhost:9222")
	if p.Name != "br/localhost:9222" || p.URL != "http://localhost:9222/" || p.EffectiveMaxConcurrent() != 3 {
		t.Fatalf("default: %+v", p)
	}
	b.Scheme, b.Path = "wss", "/devtools/browser?token={env.T}"
	if p := b.At("[fd00::1]:443"); p.URL != "wss://[fd00::1]:443/devtools/browser?token={env.T}" {
		t.Fatalf("wss: %s", p.URL)
	}
	if b.Name != "br" || b.URL != "" {
		t.Fatal("At changed the block")
	}
}

// TestCheckSource: a source is a module of http.reverse_proxy.upstreams
// with its own fields, checked strictly.
func TestCheckSource(t *testing.T) {
	for _, tc := range []struct{ raw, want string }{
		{`{"source":"srv","name":"_cdp._tcp.h","refresh":"5s"}`, ""},
		{`{"source":"a","name":"h","port":"9222"}`, ""},
		{`{"source":"multi","sources":[{"source":"a","name":"h"}]}`, ""},
		{`{"name":"h"}`, "no module named"},
		{`{"source":"consul"}`, `unknown source module "consul"`},
		{`{"source":"srv","colour":"blue"}`, "srv:"},
		{`[1]`, "want a JSON object"},
	} {
		err := CheckSource([]byte(tc.raw))
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckSource(%s) = %v, want %q", tc.raw, err, tc.want)
		}
	}
}
