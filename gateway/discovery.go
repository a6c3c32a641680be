package gateway

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/browserfailover/caddy-browser-failover/options"
)

// discoveryBrowser is the Browser field of the gateway's /json/version.
const discoveryBrowser = "browser_failover"

// originalURL is the request's URL before any uri or handle_path rewrite.
func originalURL(r *http.Request) *url.URL {
	if or, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok && or.URL != nil {
		return or.URL
	}
	return r.URL
}

// isDiscoveryPath reports whether the original request path ends in
// /json/version or /json/version/.
func isDiscoveryPath(r *http.Request) bool {
	p := originalURL(r).Path
	return strings.HasSuffix(p, "/json/version") || strings.HasSuffix(p, "/json/version/")
}

// DiscoveryURL is the webSocketDebuggerUrl the gateway hands out for a
// discovery request: back at the gateway, wss when the client came over TLS,
// the request's host, its path without the /json/version[/] suffix ("/" when
// empty), and its query.
func DiscoveryURL(tls bool, host string, u *url.URL) string {
	scheme := "ws"
	if tls {
		scheme = "wss"
	}
	p := u.EscapedPath()
	p = strings.TrimSuffix(p, "/")
	p = strings.TrimSuffix(p, "/json/version")
	if p == "" {
		p = "/"
	}
	out := url.URL{Scheme: scheme, Host: host, RawQuery: u.RawQuery}
	s := out.String()
	// Keep the path exactly as escaped by the client.
	if i := strings.Index(s, "?"); i >= 0 {
		return s[:i] + p + s[i:]
	}
	return s + p
}

// serveDiscovery answers GET/HEAD …/json/version with a Chrome-shaped object
// pointing back at the gateway. No provider is chosen here.
func serveDiscovery(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "discovery answers GET and HEAD only"}, nil)
	}
	// Session options in the query go on to the upgrade with the URL;
	// bad ones are refused here already.
	if _, _, err := options.FromRequest(r.URL.RawQuery, r.Header, ResumeQuery, ResumeTokenQuery); err != nil {
		writeRefusal(w, r, badOptions(err))
		return nil
	}
	body := map[string]string{
		"Browser":              discoveryBrowser,
		"Protocol-Version":     "1.3",
		"User-Agent":           "",
		"V8-Version":           "",
		"WebKit-Version":       "",
		"webSocketDebuggerUrl": DiscoveryURL(r.TLS != nil, r.Host, originalURL(r)),
	}
	if r.Method == http.MethodHead {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		return nil
	}
	return writeJSON(w, http.StatusOK, body, nil)
}
