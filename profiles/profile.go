// Package profiles keeps browser profiles — the cookies and the
// localStorage a client's sessions leave in the browser — encrypted in a
// storage (certmagic.Storage: Caddy's own, or a storage module a handler
// names), so that the gateway can bring a client's profile to whichever
// provider serves it next.
//
// The layout, under browser_failover/profiles/: one blob per profile, at
// <scope>/<id>, where <scope> is the hex of the keyed hash of the
// client's scope value (pool.Hashes.ShownKey without its "hmac:"), or "_"
// for the one namespace of a handler without a scope. A blob is
// "BFP1", a fresh 12-byte nonce, and the profile's JSON sealed with
// AES-256-GCM under the handler's key, with the scope and the ID as
// additional data: a blob moved to another ID or scope does not open.
//
// Nothing of a profile's content leaves this package but sealed, or to
// the caller that restores it into a browser: listings show IDs, hashed
// scopes, sizes and times only.
package profiles

import (
	"encoding/json"
	"net/url"
	"slices"
	"strings"
)

// Profile is what one profile holds: the cookies of the browser's default
// context, every attribute kept, and the localStorage of each origin.
type Profile struct {
	Cookies []Cookie `json:"cookies"`
	Origins []Origin `json:"origins"`
}

// Cookie is one cookie as the browser describes it (CDP's Network.Cookie,
// less what the browser derives: size).
type Cookie struct {
	Name   string `json:"name"`
	Value  string `json:"value"`
	Domain string `json:"domain"`
	Path   string `json:"path"`
	// Expires is when it expires, in Unix seconds; Session marks a
	// session cookie (no expiry), which is kept too.
	Expires  float64 `json:"expires,omitempty"`
	Session  bool    `json:"session,omitempty"`
	HTTPOnly bool    `json:"httpOnly,omitempty"`
	Secure   bool    `json:"secure,omitempty"`
	// SameSite is Strict, Lax or None ("": the browser's default).
	SameSite string `json:"sameSite,omitempty"`
	// Priority is Low, Medium or High.
	Priority string `json:"priority,omitempty"`
	// SourceScheme and SourcePort are the scheme and port that set it.
	SourceScheme string `json:"sourceScheme,omitempty"`
	SourcePort   int    `json:"sourcePort,omitempty"`
	// PartitionKey is the partition of a partitioned (CHIPS) cookie, as
	// the browser gives it (null: not partitioned).
	PartitionKey json.RawMessage `json:"partitionKey,omitempty"`
}

// Origin is the localStorage of one origin: its items in order.
type Origin struct {
	// Origin is scheme://host[:port].
	Origin string `json:"origin"`
	// Items are its key and value pairs.
	Items [][2]string `json:"items"`
}

// Empty reports whether p holds nothing.
func (p *Profile) Empty() bool { return p == nil || len(p.Cookies) == 0 && len(p.Origins) == 0 }

// OriginNames lists the origins p holds localStorage of.
func (p *Profile) OriginNames() []string {
	if p == nil {
		return nil
	}
	out := make([]string, 0, len(p.Origins))
	for _, o := range p.Origins {
		out = append(out, o.Origin)
	}
	return out
}

// OriginOf is the origin of a web page at u (scheme://host[:port], the
// scheme's default port left out): "" for anything but an http or https
// URL (about:blank, data:, chrome:).
func OriginOf(u string) string {
	pu, err := url.Parse(u)
	if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" || pu.User != nil {
		return ""
	}
	host := strings.ToLower(pu.Hostname())
	port := pu.Port()
	if (pu.Scheme == "http" && port == "80") || (pu.Scheme == "https" && port == "443") {
		port = ""
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if port != "" {
		host += ":" + port
	}
	return pu.Scheme + "://" + host
}

// Origins is a set of origins in the order they were first added.
type Origins struct {
	list []string
}

// maxOrigins bounds the origins one session's save reads: past it, later
// ones are not kept.
const maxOrigins = 256

// Add notes the origin of page URL u (nothing for a URL that is not a
// web page's).
func (o *Origins) Add(u string) {
	if or := OriginOf(u); or != "" && len(o.list) < maxOrigins && !slices.Contains(o.list, or) {
		o.list = append(o.list, or)
	}
}

// AddOrigin notes origin or as it is (an origin a profile held).
func (o *Origins) AddOrigin(or string) {
	if or != "" && len(o.list) < maxOrigins && !slices.Contains(o.list, or) {
		o.list = append(o.list, or)
	}
}

// List is the origins noted, in order.
func (o *Origins) List() []string { return slices.Clone(o.list) }
