package upstreams

import (
	"errors"
	"strings"
	"testing"

	"github.com/browserfailover/caddy-browser-failover/internal/conf"
)

// TestBiDiProviderURLs: a bidi provider given as http(s)://host:port[/path]
// is dialed at <path>/session, never discovered; a ws(s):// URL is dialed
// as it is. Its health check GETs the base of the endpoint by default.
func TestBiDiProviderURLs(t *testing.T) {
	for _, tc := range []struct {
		url, path, probe string
	}{
		{"http://127.0.0.1:9222", "/session", "http://127.0.0.1:9222/"},
		{"http://127.0.0.1:9222/", "/session", "http://127.0.0.1:9222/"},
		{"https://ff.example:8443/firefox/", "/firefox/session", "https://ff.example:8443/firefox/"},
		{"ws://127.0.0.1:9222/session", "/session", "http://127.0.0.1:9222/"},
		{"wss://ff.example/ff/session?k=v", "/ff/session", "https://ff.example/ff/?k=REDACTED"},
	} {
		p, err := New(Config{Name: "ff", URL: tc.url, Protocol: "bidi"}, Defaults{}, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.url, err)
		}
		if p.path != tc.path || p.Discover || p.Protocol() != ProtocolBiDi {
			t.Errorf("%s: dials %q (discover %v, protocol %s), want %q", tc.url, p.path, p.Discover, p.Protocol(), tc.path)
		}
		pr, err := p.NewProber(ProbeOptions{})
		if err != nil {
			t.Fatalf("%s: health check: %v", tc.url, err)
		}
		if pr.Target() != tc.probe {
			t.Errorf("%s: health check GETs %s, want %s", tc.url, pr.Target(), tc.probe)
		}
	}
	// The same URL for a CDP provider is discovered.
	p, err := New(Config{Name: "c", URL: "http://127.0.0.1:9222", Protocol: "cdp"}, Defaults{}, nil)
	if err != nil || !p.Discover || p.path != "/" {
		t.Fatalf("cdp provider: discover %v, path %q, %v", p.Discover, p.path, err)
	}
}

// TestBiDiConfigProblems: discover on does not go with protocol bidi, in
// either order of the options, and names the discover option; an unknown
// protocol names the protocol option.
func TestBiDiConfigProblems(t *testing.T) {
	on, off := true, false
	for _, tc := range []struct {
		c   Config
		opt string
	}{
		{Config{Name: "ff", URL: "http://h:1", Protocol: "bidi", Discover: &on}, "discover"},
		{Config{Name: "ff", URL: "http://h:1", Protocol: "BIDI", Discover: &on}, "discover"},
		{Config{Name: "ff", URL: "http://h:1", Protocol: "firefox"}, "protocol"},
	} {
		err := tc.c.Validate(nil)
		var pr *conf.Problem
		if !errors.As(err, &pr) || len(pr.Options) != 1 || pr.Options[0] != tc.opt {
			t.Errorf("%+v: %v, want a problem of %s", tc.c, err, tc.opt)
		}
		if _, err := New(tc.c, Defaults{}, nil); err == nil || !strings.Contains(err.Error(), tc.opt) {
			t.Errorf("New(%+v): %v", tc.c, err)
		}
	}
	if err := (&Config{Name: "ff", URL: "http://h:1", Protocol: "bidi", Discover: &off}).Validate(nil); err != nil {
		t.Errorf("discover off with bidi: %v", err)
	}
	if err := CheckProbeTarget("ws://h:1/session", "bidi", ProbeOptions{}); err != nil {
		t.Errorf("a ws:// bidi provider has a default health check: %v", err)
	}
	if err := CheckProbeTarget("ws://h:1/session", "cdp", ProbeOptions{}); err == nil {
		t.Error("a ws:// cdp provider has a default health check")
	}
}
