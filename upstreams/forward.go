package upstreams

import (
	"errors"
	"fmt"
	"net/textproto"
	"strings"
)

// Which of the client's handshake headers reach a provider.
//
// By default only what the WebSocket negotiation and the browser tools
// need: Sec-WebSocket-Protocol and Sec-WebSocket-Extensions (the gateway
// writes Sec-WebSocket-Key and -Version itself), User-Agent and every
// x-playwright-* header. Everything else the client sent — cookies, the
// gateway's own auth headers, API keys — stays at the gateway unless the
// handler's forward_headers names it. header_up operations apply after
// this and may still set, add or remove anything.

// alwaysForwarded are the client fields every provider gets.
var alwaysForwarded = map[string]bool{
	"Sec-Websocket-Protocol":   true,
	"Sec-Websocket-Extensions": true,
	"User-Agent":               true,
}

// playwrightPrefix starts the Playwright client's own fields
// (x-playwright-browser, x-playwright-launch-options, …), in canonical
// form.
const playwrightPrefix = "X-Playwright-"

// neverForwarded are the client fields no rule can forward: hop-by-hop
// ones (they belong to the client's connection) and those the gateway
// writes itself.
var neverForwarded = map[string]bool{
	"Connection":          true,
	"Proxy-Connection":    true,
	"Keep-Alive":          true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
	// Written by the gateway itself.
	"Host":                  true,
	"Content-Length":        true,
	"Sec-Websocket-Key":     true,
	"Sec-Websocket-Version": true,
	// Pseudo header of HTTP/2 extended CONNECT.
	":protocol": true,
	// The client's session options, for the gateway only.
	"Browser-Failover-Options": true,
}

// namedOnly are fields a prefix pattern (such as a bare "*") never
// matches: they go only when forward_headers names them in full. The
// client's Authorization is its credential for the gateway, and Chrome
// refuses an Origin it was not told to allow.
var namedOnly = map[string]bool{
	"Authorization": true,
	"Origin":        true,
}

// forwardRule is a parsed forward_headers list.
type forwardRule struct {
	exact    map[string]bool // canonical names
	prefixes []string        // canonical-case prefixes, compared case-insensitively
}

// CheckForwardHeaders checks a forward_headers list: each entry a header
// field name, or a prefix followed by one trailing "*" ("X-Trace-*", or "*"
// alone for every field). Naming a hop-by-hop field or one the gateway
// writes itself is an error, since it would never go.
func CheckForwardHeaders(fields []string) error {
	_, err := parseForward(fields)
	return err
}

func parseForward(fields []string) (*forwardRule, error) {
	if len(fields) == 0 {
		return nil, nil
	}
	r := &forwardRule{exact: map[string]bool{}}
	var errs []error
	for _, f := range fields {
		name, prefix := strings.CutSuffix(f, "*")
		switch {
		case f == "":
			errs = append(errs, errors.New("forward_headers: empty field name"))
			continue
		case strings.Contains(name, "*") || (!validToken(name) && !(prefix && name == "")):
			errs = append(errs, fmt.Errorf("forward_headers: %q is not a header field name (a trailing * matches a prefix)", f))
			continue
		}
		if prefix {
			r.prefixes = append(r.prefixes, name)
			continue
		}
		k := textproto.CanonicalMIMEHeaderKey(name)
		if neverForwarded[k] {
			errs = append(errs, fmt.Errorf("forward_headers: %s is never forwarded (hop-by-hop, written or read by the gateway itself)", k))
			continue
		}
		r.exact[k] = true
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return r, nil
}

// forwards reports whether the client's field k (canonical form) goes to
// the provider.
func (r *forwardRule) forwards(k string) bool {
	if neverForwarded[k] {
		return false
	}
	if alwaysForwarded[k] || hasPrefixFold(k, playwrightPrefix) {
		return true
	}
	if r == nil {
		return false
	}
	if r.exact[k] {
		return true
	}
	if namedOnly[k] {
		return false
	}
	for _, p := range r.prefixes {
		if hasPrefixFold(k, p) {
			return true
		}
	}
	return false
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// validToken reports whether s is an HTTP token (RFC 9110 section 5.6.2),
// the form of a field name.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
