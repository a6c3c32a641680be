package upstreams

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/internal/conf"
	"github.com/browserfailover/caddy-browser-failover/options"
)

// Config is one provider as configured: its part of a provider's JSON
// object (the handler adds its own, such as max_concurrent and cooldown),
// and what New builds the provider from. It is checked by one validator,
// Validate, which the JSON config and the Caddyfile parser share.
type Config struct {
	// Name identifies the provider in the handler (unique there), in
	// status, metrics and logs, and keys its state across config reloads.
	// Required.
	Name string `json:"name"`
	// URL is where the provider is: ws://, wss://, http:// or https://
	// (http(s) URLs are discovered, see Discover). It may hold {env.X}
	// placeholders, resolved when the config is loaded; a URL that is a
	// placeholder as a whole is checked once resolved. Required.
	URL string `json:"url"`
	// Priority orders the providers: lower is tried first, any integer;
	// ties keep config order. Default: 1.
	Priority *int `json:"priority,omitempty"`
	// Weight is the provider's share of first picks under the weighted
	// strategy; at least 1. Default: 1.
	Weight int `json:"weight,omitempty"`
	// ConnectTimeout bounds one attempt at this provider; must be
	// positive. Default: the handler's connect_timeout.
	ConnectTimeout caddy.Duration `json:"connect_timeout,omitempty"`
	// HeadersUp change the handshake sent to the provider, in order.
	// Default: none.
	HeadersUp []HeaderOp `json:"headers_up,omitempty"`
	// PassQuery merges the client's query into the provider URL's (the
	// provider's keys win). Default: false.
	PassQuery bool `json:"pass_query,omitempty"`
	// Discover reads <url>/json/version on each connect and dials the
	// webSocketDebuggerUrl it gives; false dials an http(s) URL as ws(s).
	// Only for http:// and https:// URLs. Default: true for http(s) URLs.
	Discover *bool `json:"discover,omitempty"`
	// TLS options for a wss:// or https:// URL, which also apply to the
	// provider's session API calls and health checks. Default: the
	// system's roots, the URL's host as server name.
	TLS *conf.TLS `json:"tls,omitempty"`
	// SessionAPI creates each browser over the provider's REST API before
	// connecting, and releases it when done. Default: none, the URL is
	// dialed as it is.
	SessionAPI *SessionAPI `json:"session_api,omitempty"`
	// Protocol is which clients the provider serves: "cdp", "playwright",
	// "bidi" (WebDriver BiDi, such as Firefox), "webdriver" (WebDriver
	// over HTTP: chromedriver, geckodriver, Selenium Grid, cloud hubs) or
	// "any"; a client is offered only providers that serve what it
	// speaks, and "any" serves every client but WebDriver ones. A bidi
	// provider given as http(s)://host:port[/path] is dialed at
	// ws(s)://host:port[/path]/session, never discovered. A webdriver
	// provider is given as http(s)://host[:port][/base] (such as
	// https://user:key@hub.example.com/wd/hub: the user info becomes
	// Basic auth), never discovered and without a session API. Default:
	// "any".
	Protocol string `json:"protocol,omitempty"`
	// PlaywrightVersion is the <major>.<minor> Playwright version of a
	// "playwright" provider; it then serves only clients of that version.
	// Default: empty, any version.
	PlaywrightVersion string `json:"playwright_version,omitempty"`
	// Browsers are the browserName values a webdriver provider can start
	// (ASCII case ignored): a create that asks for another browser in
	// every one of its alternatives is not sent to it. Only for protocol
	// webdriver. Default: any browser.
	Browsers []string `json:"browsers,omitempty"`
	// Capabilities is a JSON object merged into the alwaysMatch
	// capabilities of every session a webdriver provider creates (its
	// keys win over the client's): where a cloud hub's user name and key
	// go, so that clients never hold them. Placeholders in its strings
	// are resolved ({env.X} when the config loads, request placeholders
	// at each create). It is a secret, like a header value: never shown.
	// Only for protocol webdriver. Default: none.
	Capabilities json.RawMessage `json:"capabilities,omitempty"`
	// Region names where the provider runs, or the regions its session
	// API can create in (the operator's own names, such as eu-central): a
	// client asking for regions is offered it only when one of them is
	// on its list, its first listed first. Default: none.
	Region []string `json:"region,omitempty"`
	// Supports names the other session options the provider honours
	// (proxy_country, stealth, solve_captchas, record, timeout): a client
	// asking for one is offered it only when it is named. Default: none.
	Supports []string `json:"supports,omitempty"`
	// OptionMap translates a session option's value into the provider's
	// own word when it is rendered by a {bf.option.<name>} placeholder:
	// option → ours → theirs, such as region eu-central → eu-central-1. A
	// value without an entry is rendered as it is. Default: none.
	OptionMap map[string]map[string]string `json:"option_map,omitempty"`
}

// Honours is what the provider honours of the clients' session options,
// and how it words them.
func (c *Config) Honours() options.Honours {
	return options.Honours{Regions: c.Region, Supports: c.Supports, Map: c.OptionMap}
}

// HeaderOp is one change to the handshake sent to a provider (the
// Caddyfile's header_up).
type HeaderOp struct {
	// Op is "set" (replace the field's values), "add" (add a value) or
	// "delete" (remove the field). Required.
	Op string `json:"op"`
	// Field is the header field name. Required.
	Field string `json:"field"`
	// Value for set and add; it may hold request placeholders. A delete
	// takes none. Default: empty.
	Value string `json:"value,omitempty"`
}

// Validate checks the configuration's form; stated tells whether an
// option was written at all (a stated 0 can be an error where one left out
// takes its default; nil: none stated). A URL that is a placeholder as a
// whole is checked by New, once resolved. Its error joins *conf.Problem
// values, without the provider's name and never showing a secret.
func (c *Config) Validate(stated func(option string) bool) error {
	if stated == nil {
		stated = func(string) bool { return false }
	}
	_, err := c.validateURL(c.URL, false)
	errs := []error{err}
	if c.Weight < 0 || (c.Weight == 0 && stated("weight")) {
		errs = append(errs, conf.Problemf("weight", "weight must be at least 1, got %d", c.Weight))
	}
	if c.ConnectTimeout < 0 || (c.ConnectTimeout == 0 && stated("connect_timeout")) {
		errs = append(errs, conf.Problemf("connect_timeout", "connect_timeout must be positive, got %v", time.Duration(c.ConnectTimeout)))
	}
	for _, op := range c.HeadersUp {
		errs = append(errs, op.Validate())
	}
	errs = append(errs, c.TLS.Validate())
	proto, protoErr := ParseProtocol(c.Protocol)
	if protoErr != nil {
		errs = append(errs, conf.Problemf("protocol", "%v", protoErr))
	}
	if c.PlaywrightVersion != "" {
		if _, err := ParsePlaywrightVersion(c.PlaywrightVersion); err != nil {
			errs = append(errs, conf.Problemf("playwright_version", "%v", err))
		} else if protoErr == nil && proto != ProtocolPlaywright {
			// A protocol option given after it may still settle it.
			errs = append(errs, &conf.Problem{Options: []string{"playwright_version"}, Whole: true,
				Msg: "playwright_version needs protocol playwright"})
		}
	}
	if proto == ProtocolBiDi && c.Discover != nil && *c.Discover {
		errs = append(errs, &conf.Problem{Options: []string{"discover"}, Whole: true,
			Msg: "discover on does not apply to a bidi provider (WebDriver BiDi has no /json/version: an http(s) URL is dialed at <url>/session)"})
	}
	errs = append(errs, c.validateWebDriver(proto, protoErr == nil))
	errs = append(errs, c.validateOptions())
	if c.SessionAPI != nil {
		errs = append(errs, ValidateSessionAPI(*c.SessionAPI))
		if c.Discover != nil && *c.Discover {
			errs = append(errs, &conf.Problem{Options: []string{"discover"}, Whole: true,
				Msg: "discover on does not apply to a provider with session_api (it dials the URL each create answer gives)"})
		}
	}
	return errors.Join(errs...)
}

// usesOptions reports whether some template of c holds an option
// placeholder.
func (c *Config) usesOptions() bool {
	if options.Has(c.URL) || options.Has(string(c.Capabilities)) {
		return true
	}
	for _, op := range c.HeadersUp {
		if options.Has(op.Value) {
			return true
		}
	}
	if a := c.SessionAPI; a != nil {
		if options.Has(a.CreateURL) || options.Has(a.Body) {
			return true
		}
		for _, h := range a.Headers {
			if options.Has(h.Value) {
				return true
			}
		}
	}
	return false
}

// validateOptions checks region, supports and option_map, and that every
// {bf.option.<name>} placeholder names a session option.
func (c *Config) validateOptions() error {
	var errs []error
	for _, o := range []struct {
		opt string
		err error
	}{
		{"region", options.CheckRegions(c.Region)},
		{"supports", options.CheckSupports(c.Supports)},
		{"option_map", options.CheckMap(c.OptionMap)},
	} {
		if o.err != nil {
			errs = append(errs, conf.Problemf(o.opt, "%v", o.err))
		}
	}
	check := func(opt, text string) {
		if err := options.CheckPlaceholders(text); err != nil {
			errs = append(errs, conf.Problemf(opt, "%s: %v", opt, err))
		}
	}
	check("url", c.URL)
	for _, op := range c.HeadersUp {
		check("header_up", op.Value)
	}
	check("capabilities", string(c.Capabilities))
	if a := c.SessionAPI; a != nil {
		check("session_api", a.CreateURL)
		check("session_api", a.Body)
		for _, h := range a.Headers {
			check("session_api", h.Value)
		}
	}
	return errors.Join(errs...)
}

// validateWebDriver checks the options of protocol webdriver, and that
// they are given for it only (known: the protocol option could be read).
func (c *Config) validateWebDriver(proto Protocol, known bool) error {
	var errs []error
	wd := proto == ProtocolWebDriver
	// A protocol option given after these may still settle it: judged on
	// the whole block.
	only := func(opt string) {
		if known && !wd {
			errs = append(errs, &conf.Problem{Options: []string{opt}, Whole: true, Msg: opt + " needs protocol webdriver"})
		}
	}
	if len(c.Browsers) > 0 {
		only("browsers")
		for _, b := range c.Browsers {
			if b == "" || strings.IndexFunc(b, func(r rune) bool { return r < ' ' || r == 0x7f }) >= 0 {
				errs = append(errs, conf.Problemf("browsers", "browsers: %q is not a browserName", b))
			}
		}
	}
	if hasCapabilities(c.Capabilities) {
		only("capabilities")
		var m map[string]json.RawMessage
		if err := json.Unmarshal(c.Capabilities, &m); err != nil || m == nil {
			// Not shown: it may hold a secret.
			errs = append(errs, conf.Problemf("capabilities", "capabilities must be a JSON object"))
		}
		for k := range m {
			if strings.HasPrefix(k, ExtensionPrefix) {
				errs = append(errs, conf.Problemf("capabilities", "capabilities: names starting with %q are the gateway's own, never sent to a provider", ExtensionPrefix))
				break
			}
		}
	}
	if !wd {
		return errors.Join(errs...)
	}
	if scheme, _, ok := strings.Cut(c.URL, "://"); ok && !WholePlaceholder(c.URL) && !strings.EqualFold(scheme, "http") && !strings.EqualFold(scheme, "https") {
		errs = append(errs, &conf.Problem{Options: []string{"url"}, Whole: true,
			Msg: "protocol webdriver needs an http:// or https:// URL (the WebDriver server's base, such as http://127.0.0.1:9515 or https://hub.example.com/wd/hub)"})
	}
	if c.Discover != nil && *c.Discover {
		errs = append(errs, &conf.Problem{Options: []string{"discover"}, Whole: true,
			Msg: "discover on does not apply to a webdriver provider (sessions are created with POST <url>/session)"})
	}
	if c.SessionAPI != nil {
		errs = append(errs, &conf.Problem{Options: []string{"session_api"}, Whole: true,
			Msg: "session_api does not apply to a webdriver provider (WebDriver creates and ends its sessions itself)"})
	}
	return errors.Join(errs...)
}

// hasCapabilities reports whether a capabilities option was given (JSON
// null is none).
func hasCapabilities(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s != "" && s != "null"
}

// validateURL checks the form of raw as the provider's URL and returns it
// parsed. Before its placeholders are resolved (resolved false), one that
// is a placeholder as a whole is left for New, and one that holds some is
// checked as far as its form is known, and not returned.
func (c *Config) validateURL(raw string, resolved bool) (*url.URL, error) {
	if raw == "" {
		return nil, conf.Problemf("url", "no URL")
	}
	if !resolved && WholePlaceholder(raw) {
		return nil, nil
	}
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok || !isScheme(scheme) {
		return nil, conf.Problemf("url", "URL must start with ws://, wss://, http:// or https://")
	}
	var ws, secure bool
	switch strings.ToLower(scheme) {
	case "ws":
		ws = true
	case "wss":
		ws, secure = true, true
	case "http":
	case "https":
		secure = true
	default:
		return nil, conf.Problemf("url", "URL scheme %q is not one of ws, wss, http, https", scheme)
	}
	var errs []error
	if d := c.Discover; d != nil && *d && ws {
		errs = append(errs, conf.Problemf("discover", "discover on needs an http:// or https:// URL"))
	}
	var u *url.URL
	if resolved || !strings.Contains(raw, "{") {
		var err error
		switch u, err = url.Parse(raw); {
		case err != nil:
			errs = append(errs, conf.Problemf("url", "invalid URL"))
		case u.Hostname() == "":
			errs = append(errs, conf.Problemf("url", "URL has no host"))
		case u.Fragment != "":
			errs = append(errs, conf.Problemf("url", "URL must not have a fragment"))
		}
	}
	if opts := c.TLS.Given(); len(opts) > 0 && !secure {
		errs = append(errs, &conf.Problem{Options: opts, Msg: "TLS options need a wss:// or https:// URL"})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return u, nil
}

// WholePlaceholder reports whether s is one placeholder and nothing else,
// like {env.BROWSER_URL}: a value whose form is known only once it is
// resolved.
func WholePlaceholder(s string) bool {
	return len(s) > 2 && s[0] == '{' && s[len(s)-1] == '}' && !strings.ContainsAny(s[1:len(s)-1], "{}")
}

// isScheme reports whether s has the form of a URL scheme (RFC 3986), so a
// message may show it: anything else could be part of a secret.
func isScheme(s string) bool {
	if s == "" || len(s) > 16 {
		return false
	}
	for i, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case i > 0 && (c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return true
}

// Validate checks one header_up operation.
func (op HeaderOp) Validate() error {
	switch op.Op {
	case "set", "add", "delete":
	default:
		return conf.Problemf("header_up", "header_up op %q: want set, add or delete", op.Op)
	}
	if err := CheckFieldName(op.Field); err != nil {
		return conf.Problemf("header_up", "header_up: %v", err)
	}
	if strings.ContainsAny(op.Value, "\r\n") {
		// The value may be a secret: never shown.
		return conf.Problemf("header_up", "header_up %s: the value must not hold a line break", op.Field)
	}
	if op.Op == "delete" && op.Value != "" {
		return conf.Problemf("header_up", "header_up -%s takes no value", op.Field)
	}
	return nil
}

// CheckFieldName checks the form of a header field name, as header_up and
// a session API's header give it.
func CheckFieldName(f string) error {
	if f == "" || strings.ContainsAny(f, " \t\r\n:") {
		return fmt.Errorf("invalid field name %q", f)
	}
	return nil
}

// urlErrorCause describes a url.Parse failure without echoing the URL.
func urlErrorCause(err error) string {
	if ue, ok := err.(*url.Error); ok {
		err = ue.Err
	}
	msg := err.Error()
	// url errors quote the offending fragment, which may hold a secret.
	if i := strings.IndexByte(msg, '"'); i >= 0 {
		msg = strings.TrimSpace(msg[:i])
	}
	return msg
}
