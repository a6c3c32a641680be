package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Browser origins. A browser sends Origin with every WebSocket upgrade a
// web page opens, and lets any page open one to any address, 127.0.0.1
// included. Chrome's own DevTools endpoint therefore refuses origins it
// was not told to allow, so that a page the user happens to open cannot
// drive the browser. The gateway does not forward Origin to a provider,
// so it must make the same decision itself, before any provider is
// contacted: an upgrade that carries Origin is refused with 403 unless
// allowed_origins names that origin. Automation clients (Puppeteer,
// Playwright, chromedp, the usual Go and Python libraries) send no
// Origin and are unaffected.

// OriginAny in allowed_origins lets any page connect, "null" included.
const OriginAny = "*"

// originNull is the Origin of sandboxed frames, file:// pages and
// redirected requests: an origin like any other, allowed only by name.
const originNull = "null"

// OriginSet is allowed_origins made ready for lookups.
type OriginSet struct {
	any   bool
	names map[string]struct{}
}

// NewOriginSet builds the set of an already validated list.
func NewOriginSet(list []string) OriginSet {
	s := OriginSet{names: make(map[string]struct{}, len(list))}
	for _, o := range list {
		if o == OriginAny {
			s.any = true
			continue
		}
		if n, err := normalizeOrigin(o); err == nil {
			s.names[n] = struct{}{}
		}
	}
	return s
}

// allows reports whether an upgrade with these Origin values may go on:
// one without Origin always may; one with Origin only when each value is
// in the set.
func (s OriginSet) Allows(values []string) bool {
	if len(values) == 0 || s.any {
		return true
	}
	for _, v := range values {
		n, err := normalizeOrigin(strings.TrimSpace(v))
		if err != nil {
			return false
		}
		if _, ok := s.names[n]; !ok {
			return false
		}
	}
	return true
}

// normalizeOrigin returns the canonical form of an origin: "null", or
// scheme://host[:port] in lower case, without the scheme's default port.
func normalizeOrigin(s string) (string, error) {
	if strings.EqualFold(s, originNull) {
		return originNull, nil
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return "", errors.New("not a URL")
	case u.Scheme == "" || u.Host == "" || u.Opaque != "":
		return "", errors.New("want scheme://host[:port]")
	case u.User != nil:
		return "", errors.New("an origin has no user info")
	case u.Path != "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return "", errors.New("an origin has no path, query or fragment")
	}
	scheme, host, port := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname()), u.Port()
	if host == "" {
		return "", errors.New("want scheme://host[:port]")
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("port %q is not a port number", port)
		}
		port = strconv.Itoa(n)
	}
	if port == defaultPort(scheme) {
		port = ""
	}
	if port != "" {
		return scheme + "://" + net.JoinHostPort(host, port), nil
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return scheme + "://" + host, nil
}

func defaultPort(scheme string) string {
	switch scheme {
	case "http", "ws":
		return "80"
	case "https", "wss":
		return "443"
	}
	return ""
}

// ValidateOrigins checks allowed_origins: each value is *, null or an
// origin.
func ValidateOrigins(list []string) error {
	var errs []error
	for _, o := range list {
		if o == OriginAny {
			continue
		}
		if _, err := normalizeOrigin(o); err != nil {
			errs = append(errs, fmt.Errorf("allowed_origins: %q is not an origin (%v): want scheme://host[:port] as a browser sends it, null, or *", o, err))
		}
	}
	return errors.Join(errs...)
}
