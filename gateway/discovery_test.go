package gateway

import (
	"net/url"
	"strings"
	"testing"
)

func TestDiscoveryURL(t *testing.T) {
	cases := []struct {
		tls        bool
		host, path string
		want       string
	}{
		{false, "127.0.0.1:8080", "/json/version", "ws://127.0.0.1:8080/"},
		{false, "127.0.0.1:8080", "/json/version/", "ws://127.0.0.1:8080/"},
		{true, "browsers.example.com", "/team-a/json/version?token=abc", "wss://browsers.example.com/team-a?token=abc"},
		{false, "h", "/a%2Fb/json/version/?x=1&y=2", "ws://h/a%2Fb?x=1&y=2"},
		{false, "[::1]:9", "/json/version", "ws://[::1]:9/"},
	}
	for _, tc := range cases {
		u, err := url.Parse(tc.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := DiscoveryURL(tc.tls, tc.host, u); got != tc.want {
			t.Errorf("DiscoveryURL(%v, %q, %q) = %q, want %q", tc.tls, tc.host, tc.path, got, tc.want)
		}
	}
}

// FuzzDiscoveryURL: the rewritten URL parses back, keeps the host and
// query, and never ends in /json/version.
func FuzzDiscoveryURL(f *testing.F) {
	f.Add(true, "example.com", "/json/version")
	f.Add(false, "127.0.0.1:9222", "/x/y/json/version/?a=b")
	f.Add(false, "h", "/%41/json/version?q=%20")
	f.Add(false, "h", "/json/version/json/version/")
	f.Fuzz(func(t *testing.T, tls bool, host, rawPath string) {
		u, err := url.Parse(rawPath)
		if err != nil || u.Host != "" || u.Scheme != "" || u.Opaque != "" || !strings.HasPrefix(u.EscapedPath(), "/") {
			return
		}
		if strings.ContainsAny(host, "/?#@ \x00") || host == "" {
			return
		}
		out := DiscoveryURL(tls, host, u)
		back, err := url.Parse(out)
		if err != nil {
			return // a host that is not a valid authority stays the client's problem
		}
		if back.RawQuery != u.RawQuery {
			t.Fatalf("query %q became %q", u.RawQuery, back.RawQuery)
		}
		// Exactly one /json/version[/] suffix goes; anything before it stays
		// as the client escaped it.
		want := strings.TrimSuffix(u.EscapedPath(), "/")
		want = strings.TrimSuffix(want, "/json/version")
		if want == "" {
			want = "/"
		}
		if got := back.EscapedPath(); got != want {
			t.Fatalf("path %q became %q, want %q", u.EscapedPath(), got, want)
		}
	})
}
