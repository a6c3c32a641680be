// Package upstreams owns what a browser provider is and how the gateway talks
// to one: the provider model and its redacted form, the upstream handshake
// request, one connection attempt inside its deadline (TCP, TLS, discovery,
// upgrade answer), the classification of what came back into an outcome word,
// the strategies that order candidates, and the byte relay after 101.
//
// It knows nothing of cooldowns or queues.
package upstreams

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"
)

// DefaultConnectTimeout bounds one attempt when nothing else is configured.
const DefaultConnectTimeout = 10 * time.Second

// Provider is one configured browser provider, ready to be dialed.
type Provider struct {
	// Name, Priority, Weight and ConnectTimeout are the options it was
	// built from, defaults applied.
	Name           string
	Priority       int
	Weight         int
	ConnectTimeout time.Duration
	// Discover tells whether each connect first reads /json/version.
	Discover bool

	proto     Protocol // what it serves
	headerOps []HeaderOp
	setsAuth  bool
	forward   *forwardRule // nil: the default fields only

	scheme     string // ws or wss after mapping http(s)
	httpURL    bool   // configured as http:// or https://
	httpScheme string // http or https, for discovery
	address    string // host:port to dial
	host       string // Host header value
	path       string // escaped path, never empty
	query      url.Values
	rawQuery   string
	basicAuth  string // "Basic …" from user info, or ""
	tlsConfig  *tls.Config
	tlsOpts    TLSOptions
	key        string // the resolved URL
	redacted   string

	api *sessionAPI // nil without a session API

	// conf is the configuration it was built from: an option that needs
	// no preparing is read from here where it is used.
	conf Config
}

// New checks c (with Validate) and builds the provider: its placeholders
// known when the config loads ({env.X}) are resolved with known (nil:
// none), request placeholders in header values stay for each attempt; d
// gives what the handler sets for all its providers. Errors name the
// provider and the problem, never the URL's secrets.
func New(c Config, d Defaults, known func(string) string) (*Provider, error) {
	if known == nil {
		known = func(s string) string { return s }
	}
	if c.Name == "" {
		return nil, fmt.Errorf("provider without a name")
	}
	if err := c.Validate(nil); err != nil {
		return nil, fmt.Errorf("provider %q: %w", c.Name, err)
	}
	raw := strings.TrimSpace(known(c.URL))
	switch {
	case raw == "":
		// Typically a placeholder whose variable is unset.
		return nil, fmt.Errorf("provider %q: the URL is empty once its placeholders are resolved (is the environment variable set?)", c.Name)
	case WholePlaceholder(raw):
		return nil, fmt.Errorf("provider %q: the URL's placeholder is not known when the config loads (use {env.X})", c.Name)
	}
	if err := c.validateURL(raw); err != nil {
		return nil, fmt.Errorf("provider %q: %w", c.Name, err)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("provider %q: invalid URL (%s)", c.Name, urlErrorCause(err))
	}
	var tlsOpts TLSOptions
	if c.TLS != nil {
		tlsOpts = *c.TLS
	}
	ops := make([]HeaderOp, len(c.HeadersUp))
	for i, op := range c.HeadersUp {
		op.Value = known(op.Value)
		ops[i] = op
	}
	p := &Provider{
		Name:           c.Name,
		Priority:       1,
		Weight:         c.Weight,
		ConnectTimeout: time.Duration(c.ConnectTimeout),
		headerOps:      ops,
		tlsOpts:        tlsOpts,
		key:            raw,
		redacted:       Redact(u),
		conf:           c,
	}
	if c.Priority != nil {
		p.Priority = *c.Priority
	}
	if p.ConnectTimeout <= 0 {
		p.ConnectTimeout = d.ConnectTimeout
	}
	var api *SessionAPI
	if c.SessionAPI != nil {
		a, err := c.SessionAPI.resolved(known)
		if err != nil {
			return nil, fmt.Errorf("provider %q: session_api: %w", c.Name, err)
		}
		api = &a
	}
	if p.forward, err = parseForward(d.ForwardHeaders); err != nil {
		return nil, fmt.Errorf("provider %q: %w", c.Name, err)
	}
	if p.Weight == 0 {
		p.Weight = 1
	}
	if p.ConnectTimeout <= 0 {
		p.ConnectTimeout = DefaultConnectTimeout
	}
	switch strings.ToLower(u.Scheme) {
	case "ws":
		p.scheme, p.httpScheme = "ws", "http"
	case "wss":
		p.scheme, p.httpScheme = "wss", "https"
	case "http":
		p.scheme, p.httpScheme, p.Discover, p.httpURL = "ws", "http", true, true
	case "https":
		p.scheme, p.httpScheme, p.Discover, p.httpURL = "wss", "https", true, true
	default:
		// The "scheme" of a value like user:pass@host is the user name:
		// it is not repeated.
		return nil, fmt.Errorf("provider %q: URL must start with ws://, wss://, http:// or https://", c.Name)
	}
	if c.Discover != nil {
		if *c.Discover && (p.scheme == "ws" || p.scheme == "wss") && (u.Scheme == "ws" || u.Scheme == "wss") {
			return nil, fmt.Errorf("provider %q: discover on needs an http:// or https:// URL", c.Name)
		}
		p.Discover = *c.Discover
	}
	if u.Host == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("provider %q: URL has no host", c.Name)
	}
	if u.Opaque != "" {
		return nil, fmt.Errorf("provider %q: URL must be absolute, like ws://host:port/path", c.Name)
	}
	if u.Fragment != "" {
		return nil, fmt.Errorf("provider %q: URL must not have a fragment", c.Name)
	}
	p.host = u.Host
	port := u.Port()
	if port == "" {
		port = "80"
		if p.scheme == "wss" {
			port = "443"
		}
	}
	p.address = net.JoinHostPort(u.Hostname(), port)
	p.path = u.EscapedPath()
	if p.proto, _ = ParseProtocol(c.Protocol); p.proto == ProtocolBiDi && p.httpURL {
		// WebDriver BiDi's endpoint is <base>/session; there is nothing
		// to discover.
		p.path, p.Discover = strings.TrimSuffix(p.path, "/")+"/session", false
	}
	if p.path == "" {
		p.path = "/"
	}
	p.rawQuery = u.RawQuery
	p.query = u.Query()
	if u.User != nil {
		pw, _ := u.User.Password()
		p.basicAuth = "Basic " + base64.StdEncoding.EncodeToString([]byte(u.User.Username()+":"+pw))
	}
	for _, op := range ops {
		if strings.ContainsAny(op.Value, "\r\n") {
			// A value known only now ({env.X}): never shown.
			return nil, fmt.Errorf("provider %q: header_up %s: the value must not hold a line break", c.Name, op.Field)
		}
		if op.Op != "delete" && strings.EqualFold(op.Field, "Authorization") {
			p.setsAuth = true
		}
	}
	if api != nil {
		// The gateway dials the URL each create answer gives.
		p.Discover = false
		if p.api, err = newSessionAPI(p, *api, tlsOpts, d.Books, d.Releaser); err != nil {
			return nil, fmt.Errorf("provider %q: session_api: %w", c.Name, err)
		}
	}
	if p.scheme == "wss" {
		cfg, err := tlsOpts.build(u.Hostname())
		if err != nil {
			return nil, fmt.Errorf("provider %q: %w", c.Name, err)
		}
		p.tlsConfig = cfg
	}
	return p, nil
}

// Protocol is what the provider serves (ProtocolAny when not set).
func (p *Provider) Protocol() Protocol { return p.proto }

// Books are the provider's session API counts, nil without a session API.
func (p *Provider) Books() *Books {
	if p.api == nil {
		return nil
	}
	return p.api.books
}

// Key is the provider's resolved URL: two providers of one name are the
// same when their keys are. Never shown (it may hold secrets).
func (p *Provider) Key() string { return p.key }

func (t TLSOptions) build(hostname string) (*tls.Config, error) {
	cfg := &tls.Config{
		ServerName:         hostname,
		InsecureSkipVerify: t.InsecureSkipVerify,
		MinVersion:         tls.VersionTLS12,
		// The upstream side always speaks HTTP/1.1 for the upgrade.
		NextProtos: []string{"http/1.1"},
	}
	if t.ServerName != "" {
		cfg.ServerName = t.ServerName
	}
	if len(t.TrustedCACertFiles) > 0 {
		pool := x509.NewCertPool()
		for _, f := range t.TrustedCACertFiles {
			pem, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("tls_trusted_ca_certs: %w", err)
			}
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("tls_trusted_ca_certs: no PEM certificate in %s", f)
			}
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// String returns the provider's URL with its secrets redacted.
func (p *Provider) String() string { return p.redacted }

// Redacted returns the provider's URL with its secrets redacted.
func (p *Provider) Redacted() string { return p.redacted }

// Redact renders u with user info shown as REDACTED@ and every query value as
// REDACTED (keys kept); a query item without "=" is shown as REDACTED whole.
// This is the only place URLs are made safe to show.
func Redact(u *url.URL) string {
	c := *u
	if c.User != nil {
		c.User = url.User("REDACTED")
	}
	if c.RawQuery != "" {
		var b strings.Builder
		for _, part := range strings.Split(c.RawQuery, "&") {
			if part == "" {
				continue
			}
			if b.Len() > 0 {
				b.WriteByte('&')
			}
			k, _, hasValue := strings.Cut(part, "=")
			if !hasValue {
				// An item without "=" may be a secret on its own
				// (?s3cr3t): it is not shown as a key.
				b.WriteString("REDACTED")
				continue
			}
			if ku, err := url.QueryUnescape(k); err == nil {
				k = url.QueryEscape(ku)
			} else {
				k = "REDACTED"
			}
			b.WriteString(k)
			b.WriteString("=REDACTED")
		}
		c.RawQuery = b.String()
	}
	c.Fragment = ""
	c.RawFragment = ""
	return c.String()
}

// RedactString redacts a URL given as text; text that does not parse is
// hidden whole.
func RedactString(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return "REDACTED"
	}
	return Redact(u)
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
