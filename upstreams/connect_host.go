package upstreams

// The connect-host policy: which hosts a session API's connect URL (and a
// WebDriver session's socket URL) may point to, the provider's
// credentials going with the dial, and the check of a connect_hosts
// value.

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"golang.org/x/net/publicsuffix"
)

// hostRule says which hosts a connect URL may point to, the provider's
// header_up values going with the dial: the create call's host, names
// under its registrable domain (public suffix list), and connect_hosts.
type hostRule struct {
	create   string          // the create call's host, normalized
	site     string          // its registrable domain; "" when it has none
	exact    map[string]bool // connect_hosts without a wildcard
	suffixes []string        // ".example.com" for each *.example.com
}

func newHostRule(createHost string, named []string) hostRule {
	h := hostRule{create: normHost(createHost), exact: map[string]bool{}}
	h.site = registrable(h.create)
	for _, n := range named {
		if rest, ok := strings.CutPrefix(n, "*."); ok {
			h.suffixes = append(h.suffixes, "."+normHost(rest))
		} else if n = normHost(n); n != "" {
			h.exact[n] = true
		}
	}
	return h
}

// allows reports whether a connect URL may point to host (any port).
func (h hostRule) allows(host string) bool {
	host = normHost(host)
	switch {
	case host == "":
		return false
	case host == h.create, h.exact[host]:
		return true
	}
	for _, s := range h.suffixes {
		if strings.HasSuffix(host, s) {
			return true
		}
	}
	return h.site != "" && registrable(host) == h.site
}

// normHost is host lower-cased, without a trailing dot or brackets, and an
// IP address in its canonical form.
func normHost(host string) string {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.String()
	}
	return host
}

// registrable is host's registrable domain (its public suffix and one
// label more), or "" for an IP address, a single-label name such as
// localhost, a public suffix itself, or a name that is not ASCII: those
// match only themselves.
func registrable(host string) string {
	if host == "" || !strings.Contains(host, ".") || !isASCII(host) {
		return ""
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return ""
	}
	site, err := publicsuffix.EffectiveTLDPlusOne(host)
	if err != nil {
		return ""
	}
	return site
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// ValidateConnectHost checks one connect_hosts value: a host name (like
// connect.example.com), an IP address, or *.example.com for every name
// under example.com (not example.com itself; not a public suffix, like
// *.com or *.github.io). No scheme, port or path: any port matches. A
// placeholder as a whole is accepted (checked once resolved).
func ValidateConnectHost(h string) error {
	if h == "" {
		return errors.New("empty host")
	}
	if WholePlaceholder(h) {
		return nil
	}
	what := fmt.Sprintf("%q is not a host name, an IP address or *.<domain> (no scheme, port or path: any port matches)", h)
	if _, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")); err == nil {
		return nil
	}
	name, wild := strings.CutPrefix(h, "*.")
	if !isASCII(name) {
		return fmt.Errorf("%q: write a non-ASCII name in its xn-- (punycode) form", h)
	}
	if !hostName(name) {
		return errors.New(what)
	}
	if wild {
		n := normHost(name)
		if ps, icann := publicsuffix.PublicSuffix(n); ps == n && (icann || strings.Contains(n, ".")) {
			return fmt.Errorf("%q would allow every site under the public suffix %s: name the provider's own domain", h, ps)
		}
	}
	return nil
}

// hostName reports whether s is a DNS name: dot-separated labels of
// letters, digits, '-' and '_', each 1 to 63 bytes, a trailing dot allowed.
func hostName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}
