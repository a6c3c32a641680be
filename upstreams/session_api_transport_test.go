package upstreams

import (
	"testing"

	"github.com/browserfailover/caddy-browser-failover/internal/conf"
)

// TestSessionAPITransport: a provider's session API calls go over the
// transport its handler gives (Defaults.APITransport, the registry's),
// shared by every provider without TLS options of its own; one whose TLS
// options trust other CAs or skip verification gets one of its own, and
// without one given each provider makes its own: nothing is shared
// through the package.
func TestSessionAPITransport(t *testing.T) {
	api := SessionAPI{CreateMethod: "POST", CreateURL: "/v1/sessions", ConnectURL: "/connectUrl", SessionID: "/id",
		ReleaseMethod: "DELETE", ReleaseURL: "/v1/sessions/{session_id}"}
	build := func(name string, tls *conf.TLS, d Defaults) *Provider {
		t.Helper()
		p, err := New(Config{Name: name, URL: "https://api.example", TLS: tls, SessionAPI: &api}, d, nil)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	shared := NewAPITransport()
	d := Defaults{APITransport: shared}
	a, b := build("a", nil, d), build("b", &conf.TLS{ServerName: "api.example"}, d)
	if a.api.client.Transport != shared || b.api.client.Transport != shared {
		t.Fatal("a provider without TLS options of its own does not use the transport given")
	}
	own := build("own", &conf.TLS{InsecureSkipVerify: true}, d)
	if own.api.client.Transport == shared {
		t.Fatal("a provider with TLS options of its own uses the shared transport")
	}
	x, y := build("x", nil, Defaults{}), build("y", nil, Defaults{})
	if x.api.client.Transport == nil || x.api.client.Transport == y.api.client.Transport || x.api.client.Transport == shared {
		t.Fatal("without a transport given, providers share one")
	}
}
