// Package options reads the session options a client states once for
// every provider (a region in order of preference, a proxy country,
// stealth, captcha solving, recording, a session timeout), says which
// providers can honour them, and renders them in each provider's own
// words through {bf.option.<name>} placeholders. One option is the
// gateway's own, for no provider: profile, the browser profile the
// gateway keeps for the client.
//
// A client states them as query items bf_<name>=<value> on its first
// request, in the Browser-Failover-Options header
// (<name>=<value>[, <name>=<value>]...), or, on a WebDriver create, as the
// capability bf:options (a JSON object of the same names). None of them is
// ever passed on to a provider as the client wrote it.
package options

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The option names.
const (
	Region        = "region"
	ProxyCountry  = "proxy_country"
	Stealth       = "stealth"
	SolveCaptchas = "solve_captchas"
	Record        = "record"
	Timeout       = "timeout"
	// Profile names the browser profile the gateway restores into the
	// session and saves at its end: the gateway's, never a provider's.
	Profile = "profile"
)

// Names are every option, in the order they are shown.
var Names = []string{Region, ProxyCountry, Stealth, SolveCaptchas, Record, Timeout, Profile}

// Header is the request header that carries options.
const Header = "Browser-Failover-Options"

// QueryPrefix starts each query item that carries an option.
const QueryPrefix = "bf_"

// Capability is the WebDriver capability that carries options.
const Capability = "bf:options"

// Bounds of what a client may state.
const (
	// MaxHeader is the longest Browser-Failover-Options a client may send
	// (all its lines together).
	MaxHeader = 1024
	// MaxRegions is the most regions a preference list may name.
	MaxRegions = 8
	// MinTimeout and MaxTimeout bound the timeout option.
	MinTimeout = time.Second
	MaxTimeout = 24 * time.Hour
	// MaxProfileID is the longest profile ID.
	MaxProfileID = 64
)

// Known reports whether name is an option.
func Known(name string) bool { return slices.Contains(Names, name) }

// boolean options, each one bit.
var boolBit = map[string]uint8{Stealth: 1, SolveCaptchas: 2, Record: 4}

// Set is what one client asked for. The zero Set asks for nothing.
type Set struct {
	regions []string
	country string // lowercase ISO 3166-1 alpha-2
	on, set uint8  // boolean options: true, and stated at all
	timeout time.Duration
	profile string
}

// Error is a bad option: its name as the client wrote it and what is wrong.
type Error struct {
	Option string
	Reason string
}

func (e *Error) Error() string {
	if e.Option == "" {
		return "session options: " + e.Reason
	}
	return fmt.Sprintf("session option %q: %s", e.Option, e.Reason)
}

func bad(name, format string, args ...any) error {
	return &Error{Option: name, Reason: fmt.Sprintf(format, args...)}
}

// FromRequest reads the options of a first request: its bf_ query items and
// its Browser-Failover-Options header. rest is the query without the bf_
// items, as written (raw unchanged when it has none); others are bf_
// names that are not options (read by someone else), left in rest. An
// option given twice, in either place or both, is an error.
func FromRequest(rawQuery string, h http.Header, others ...string) (s Set, rest string, err error) {
	rest = rawQuery
	lines := h.Values(Header)
	if len(lines) == 0 && !strings.Contains(rawQuery, QueryPrefix) && !strings.Contains(rawQuery, "%") {
		return Set{}, rawQuery, nil
	}
	seen := map[string]bool{}
	if strings.Contains(rawQuery, QueryPrefix) || strings.Contains(rawQuery, "%") {
		var kept []string
		for _, item := range strings.Split(rawQuery, "&") {
			k, v, _ := strings.Cut(item, "=")
			dk, err1 := url.QueryUnescape(k)
			if err1 != nil && strings.HasPrefix(k, QueryPrefix) {
				return Set{}, "", bad(k, "the name is not query-escaped correctly")
			}
			if err1 != nil || !strings.HasPrefix(dk, QueryPrefix) || slices.Contains(others, dk) {
				kept = append(kept, item)
				continue
			}
			dv, err1 := url.QueryUnescape(v)
			if err1 != nil {
				return Set{}, "", bad(dk, "the value is not query-escaped correctly")
			}
			if err := s.put(seen, dk, strings.TrimPrefix(dk, QueryPrefix), dv, ","); err != nil {
				return Set{}, "", err
			}
		}
		rest = strings.Join(kept, "&")
	}
	if len(lines) > 0 {
		n := 0
		for _, l := range lines {
			n += len(l)
		}
		if n > MaxHeader {
			return Set{}, "", &Error{Reason: fmt.Sprintf("the %s header is over %d bytes", Header, MaxHeader)}
		}
		for _, l := range lines {
			for _, item := range strings.Split(l, ",") {
				item = strings.TrimSpace(item)
				if item == "" {
					continue
				}
				k, v, ok := strings.Cut(item, "=")
				k = strings.TrimSpace(k)
				if !ok {
					return Set{}, "", bad(k, "the %s header wants <option>=<value>", Header)
				}
				if err := s.put(seen, k, k, strings.TrimSpace(v), " "); err != nil {
					return Set{}, "", err
				}
			}
		}
	}
	return s, rest, nil
}

// FromCapability reads the bf:options capability of a WebDriver create: a
// JSON object of option names; region may be a comma list or an array of
// names, the booleans JSON booleans or their words, timeout a duration.
func FromCapability(raw json.RawMessage) (Set, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return Set{}, &Error{Option: Capability, Reason: "want a JSON object of option names"}
	}
	var s Set
	seen := map[string]bool{}
	names := make([]string, 0, len(obj))
	for k := range obj {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		v := obj[k]
		var text string
		var list []string
		switch {
		case json.Unmarshal(v, &text) == nil:
		case k == Region && json.Unmarshal(v, &list) == nil:
			text = strings.Join(list, ",")
		case k == Profile:
			return Set{}, bad(k, "want a string")
		default:
			var b bool
			if json.Unmarshal(v, &b) != nil {
				return Set{}, bad(k, "want a string%s", map[bool]string{true: " or an array of strings", false: " or a boolean"}[k == Region])
			}
			text = strconv.FormatBool(b)
		}
		if err := s.put(seen, k, k, text, ","); err != nil {
			return Set{}, err
		}
	}
	return s, nil
}

// put sets option name (written as shown) to text; sep separates a
// region list.
func (s *Set) put(seen map[string]bool, shown, name, text, sep string) error {
	if !Known(name) {
		return bad(shown, "not a session option (the options: %s)", strings.Join(Names, ", "))
	}
	if seen[name] {
		return bad(shown, "given twice")
	}
	seen[name] = true
	switch name {
	case Region:
		var rs []string
		for _, r := range strings.Split(text, sep) {
			r = strings.TrimSpace(r)
			if r == "" {
				continue
			}
			if !ValidRegion(r) {
				return bad(shown, "%q is not a region name (letters, digits, - and _, up to 64)", clip(r))
			}
			if !slices.Contains(rs, r) {
				rs = append(rs, r)
			}
		}
		if len(rs) == 0 {
			return bad(shown, "want one region name or more, in order of preference")
		}
		if len(rs) > MaxRegions {
			return bad(shown, "at most %d regions", MaxRegions)
		}
		s.regions = rs
	case ProxyCountry:
		c := strings.ToLower(text)
		if !Country(c) {
			return bad(shown, "%q is not an ISO 3166-1 alpha-2 country code", clip(text))
		}
		s.country = c
	case Timeout:
		d, err := time.ParseDuration(text)
		if err != nil || d < MinTimeout || d > MaxTimeout {
			return bad(shown, "want a duration from 1s to 24h, such as 10m")
		}
		s.timeout = d
	case Profile:
		if !ValidProfileID(text) {
			return bad(shown, "want a profile ID of 1 to %d letters, digits, '.', '_' and '-' (not . or ..)", MaxProfileID)
		}
		s.profile = text
	default:
		var on bool
		switch text {
		case "true", "1":
			on = true
		case "false", "0":
		default:
			return bad(shown, "want true, false, 1 or 0")
		}
		bit := boolBit[name]
		s.set |= bit
		if on {
			s.on |= bit
		}
	}
	return nil
}

// clip shortens a bad value for an error message.
func clip(v string) string {
	if len(v) > 32 {
		return v[:32] + "…"
	}
	return v
}

// ValidRegion reports whether r may name a region: 1–64 ASCII letters,
// digits, '-', '_' or '.', starting with a letter or digit.
func ValidRegion(r string) bool {
	if r == "" || len(r) > 64 {
		return false
	}
	for i := 0; i < len(r); i++ {
		c := r[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case (c == '-' || c == '_' || c == '.') && i > 0:
		default:
			return false
		}
	}
	return true
}

// ValidProfileID reports whether id may name a profile: 1–64 ASCII
// letters, digits, '.', '_' or '-', but not "." or ".." (a profile is a
// file's name in a storage).
func ValidProfileID(id string) bool {
	if id == "" || len(id) > MaxProfileID || id == "." || id == ".." {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// Empty reports whether s asks for nothing and states nothing.
func (s Set) Empty() bool {
	return len(s.regions) == 0 && s.country == "" && s.set == 0 && s.timeout == 0 && s.profile == ""
}

// Equal reports whether s and o state the same options with the same
// values (a region list in the same order).
func (s Set) Equal(o Set) bool {
	return slices.Equal(s.regions, o.regions) && s.country == o.country && s.set == o.set && s.on == o.on && s.timeout == o.timeout && s.profile == o.profile
}

// Profile is the profile the client named ("": none).
func (s Set) Profile() string { return s.profile }

// ForProviders is s without what is the gateway's own (the profile): what
// a provider, or a session made ahead of demand, has to do with.
func (s Set) ForProviders() Set {
	s.profile = ""
	return s
}

// WithProfile is s naming profile id.
func (s Set) WithProfile(id string) Set {
	s.profile = id
	return s
}

// Regions is the client's region preference list (nil: any region).
func (s Set) Regions() []string { return s.regions }

// Asked lists the options other than region that a provider must honour
// to serve s: a proxy country, a timeout, and each boolean set to true (one
// set to false asks for nothing).
func (s Set) Asked() []string {
	var out []string
	if s.country != "" {
		out = append(out, ProxyCountry)
	}
	for _, n := range []string{Stealth, SolveCaptchas, Record} {
		if s.on&boolBit[n] != 0 {
			out = append(out, n)
		}
	}
	if s.timeout != 0 {
		out = append(out, Timeout)
	}
	return out
}

// Value is option name's value as stated (ok false: not stated): region
// the whole list, comma-separated.
func (s Set) Value(name string) (string, bool) {
	switch name {
	case Region:
		return strings.Join(s.regions, ","), len(s.regions) > 0
	case ProxyCountry:
		return s.country, s.country != ""
	case Timeout:
		return s.timeout.String(), s.timeout != 0
	case Profile:
		return s.profile, s.profile != ""
	}
	bit := boolBit[name]
	if s.set&bit == 0 {
		return "", false
	}
	return strconv.FormatBool(s.on&bit != 0), true
}

// Map is s as a JSON object for logs and status: each stated option with
// its value (region a list, booleans booleans, timeout its duration text);
// nil when nothing is stated.
func (s Set) Map() map[string]any {
	if s.Empty() {
		return nil
	}
	m := map[string]any{}
	if len(s.regions) > 0 {
		m[Region] = s.regions
	}
	if s.country != "" {
		m[ProxyCountry] = s.country
	}
	for n, bit := range boolBit {
		if s.set&bit != 0 {
			m[n] = s.on&bit != 0
		}
	}
	if s.timeout != 0 {
		m[Timeout] = s.timeout.String()
	}
	if s.profile != "" {
		m[Profile] = s.profile
	}
	return m
}

// Query renders s as bf_ query items (for a URL that hands the options
// on, such as a discovery answer's); empty when nothing is stated.
func (s Set) Query() string {
	q := url.Values{}
	for _, n := range Names {
		if v, ok := s.Value(n); ok {
			q.Set(QueryPrefix+n, v)
		}
	}
	return q.Encode()
}

// Merge is s with what o states added; an option both state is an error
// (shown names it as o's source writes it).
func (s Set) Merge(o Set, shown string) (Set, error) {
	for _, n := range Names {
		_, a := s.Value(n)
		_, b := o.Value(n)
		if a && b {
			return Set{}, bad(shown, "%s given twice", n)
		}
	}
	if len(o.regions) > 0 {
		s.regions = o.regions
	}
	if o.country != "" {
		s.country = o.country
	}
	if o.timeout != 0 {
		s.timeout = o.timeout
	}
	if o.profile != "" {
		s.profile = o.profile
	}
	s.on |= o.on
	s.set |= o.set
	return s, nil
}
