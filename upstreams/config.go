package upstreams

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
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
	// TLS options for a wss:// or https:// URL. Default: the system's
	// roots, the URL's host as server name.
	TLS *TLSOptions `json:"tls,omitempty"`
	// SessionAPI creates each browser over the provider's REST API before
	// connecting, and releases it when done. Default: none, the URL is
	// dialed as it is.
	SessionAPI *SessionAPI `json:"session_api,omitempty"`
	// Protocol is which clients the provider serves: "cdp", "playwright",
	// "bidi" (WebDriver BiDi, such as Firefox) or "any"; a client is
	// offered only providers that serve what it speaks. A bidi provider
	// given as http(s)://host:port[/path] is dialed at
	// ws(s)://host:port[/path]/session, never discovered. Default: "any".
	Protocol string `json:"protocol,omitempty"`
}

// TLSOptions are the TLS settings of a provider (or of another TLS
// client of the gateway's, such as its Redis connection).
type TLSOptions struct {
	// InsecureSkipVerify accepts any certificate
	// (tls_insecure_skip_verify). Default: false.
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
	// ServerName is sent in SNI and verified against the certificate
	// (tls_server_name). Default: the URL's host.
	ServerName string `json:"server_name,omitempty"`
	// TrustedCACertFiles are PEM files of the CAs to trust
	// (tls_trusted_ca_certs). Default: the system's roots.
	TrustedCACertFiles []string `json:"trusted_ca_certs,omitempty"`
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

// Defaults are what a provider takes from its handler.
type Defaults struct {
	// ConnectTimeout bounds an attempt when the provider sets none (0:
	// DefaultConnectTimeout).
	ConnectTimeout time.Duration
	// ForwardHeaders names client handshake fields the provider gets
	// besides the WebSocket negotiation ones, User-Agent and
	// x-playwright-* (see CheckForwardHeaders); a trailing "*" matches a
	// prefix.
	ForwardHeaders []string
	// Books count the sessions of its session API (nil: counts of its
	// own); the caller keeps them across config loads.
	Books *Books
	// Releaser releases the sessions its session API creates (nil: one
	// of its own); the caller keeps it across config loads, and waits for
	// it at exit.
	Releaser *Releaser
}

// Problem is one problem with a provider's settings and the options at
// fault, named as the Caddyfile names them, so that the parser reports it
// at their line.
type Problem struct {
	Options []string
	Msg     string
	// Whole: the problem is judged on the whole block (an option missing,
	// or two that clash, either of which may come later).
	Whole bool
}

func (e *Problem) Error() string { return e.Msg }

// problemf is a Problem of one option.
func problemf(option string, format string, args ...any) *Problem {
	return &Problem{Options: []string{option}, Msg: fmt.Sprintf(format, args...)}
}

// Validate checks the configuration's form; stated tells whether an
// option was written at all (a stated 0 can be an error where one left out
// takes its default; nil: none stated). A URL that is a placeholder as a
// whole is checked by New, once resolved. Its error joins *Problem values,
// without the provider's name and never showing a secret.
func (c *Config) Validate(stated func(option string) bool) error {
	if stated == nil {
		stated = func(string) bool { return false }
	}
	errs := []error{c.validateURL(c.URL)}
	if c.Weight < 0 || (c.Weight == 0 && stated("weight")) {
		errs = append(errs, problemf("weight", "weight must be at least 1, got %d", c.Weight))
	}
	if c.ConnectTimeout < 0 || (c.ConnectTimeout == 0 && stated("connect_timeout")) {
		errs = append(errs, problemf("connect_timeout", "connect_timeout must be positive, got %v", time.Duration(c.ConnectTimeout)))
	}
	for _, op := range c.HeadersUp {
		errs = append(errs, op.Validate())
	}
	errs = append(errs, c.TLS.Validate())
	proto, err := ParseProtocol(c.Protocol)
	if err != nil {
		errs = append(errs, problemf("protocol", "%v", err))
	}
	if proto == ProtocolBiDi && c.Discover != nil && *c.Discover {
		errs = append(errs, &Problem{Options: []string{"discover"}, Whole: true,
			Msg: "discover on does not apply to a bidi provider (WebDriver BiDi has no /json/version: an http(s) URL is dialed at <url>/session)"})
	}
	if c.SessionAPI != nil {
		errs = append(errs, ValidateSessionAPI(*c.SessionAPI))
		if c.Discover != nil && *c.Discover {
			errs = append(errs, &Problem{Options: []string{"discover"}, Whole: true,
				Msg: "discover on does not apply to a provider with session_api (it dials the URL each create answer gives)"})
		}
	}
	return errors.Join(errs...)
}

// validateURL checks the form of raw as the provider's URL, without
// resolving its placeholders (one that is a placeholder as a whole is
// left for New).
func (c *Config) validateURL(raw string) error {
	if raw == "" {
		return problemf("url", "no URL")
	}
	if WholePlaceholder(raw) {
		return nil
	}
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok || !isScheme(scheme) {
		return problemf("url", "URL must start with ws://, wss://, http:// or https://")
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
		return problemf("url", "URL scheme %q is not one of ws, wss, http, https", scheme)
	}
	var errs []error
	if d := c.Discover; d != nil && *d && ws {
		errs = append(errs, problemf("discover", "discover on needs an http:// or https:// URL"))
	}
	if !strings.Contains(raw, "{") {
		if _, err := url.Parse(raw); err != nil {
			errs = append(errs, problemf("url", "invalid URL"))
		}
	}
	if opts := c.TLS.Options(); len(opts) > 0 && !secure {
		errs = append(errs, &Problem{Options: opts, Msg: "TLS options need a wss:// or https:// URL"})
	}
	return errors.Join(errs...)
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
		return problemf("header_up", "header_up op %q: want set, add or delete", op.Op)
	}
	if err := CheckFieldName(op.Field); err != nil {
		return problemf("header_up", "header_up: %v", err)
	}
	if strings.ContainsAny(op.Value, "\r\n") {
		// The value may be a secret: never shown.
		return problemf("header_up", "header_up %s: the value must not hold a line break", op.Field)
	}
	if op.Op == "delete" && op.Value != "" {
		return problemf("header_up", "header_up -%s takes no value", op.Field)
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

// Validate checks the TLS settings (nil: none).
func (t *TLSOptions) Validate() error {
	if t == nil {
		return nil
	}
	if slices.Contains(t.TrustedCACertFiles, "") {
		return problemf("tls_trusted_ca_certs", "tls_trusted_ca_certs: empty file name")
	}
	return nil
}

// Options names the settings given, as the Caddyfile spells them.
func (t *TLSOptions) Options() []string {
	if t == nil {
		return nil
	}
	var opts []string
	if t.InsecureSkipVerify {
		opts = append(opts, "tls_insecure_skip_verify")
	}
	if t.ServerName != "" {
		opts = append(opts, "tls_server_name")
	}
	if len(t.TrustedCACertFiles) > 0 {
		opts = append(opts, "tls_trusted_ca_certs")
	}
	return opts
}
