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

// Options describe one provider as configured, with secrets already resolved.
type Options struct {
	// Name keys the provider's state; it appears in logs and status.
	Name string
	// URL is ws://, wss://, http:// or https://, placeholders resolved.
	URL string
	// Priority orders candidates: lower first.
	Priority int
	// Weight is the share under the weighted strategy (0 means 1).
	Weight int
	// ConnectTimeout bounds one attempt (0: DefaultConnectTimeout).
	ConnectTimeout time.Duration
	// HeaderOps are the header_up operations, applied in order.
	HeaderOps []HeaderOp
	// PassQuery merges the client's query into the provider URL's.
	PassQuery bool
	// ForwardHeaders names client handshake fields the provider gets
	// besides the WebSocket negotiation ones, User-Agent and
	// x-playwright-* (see CheckForwardHeaders); a trailing "*" matches a
	// prefix.
	ForwardHeaders []string
	// Discover is nil for the default (on for http(s) URLs, off for ws(s)).
	Discover *bool
	TLS      TLSOptions
	// SessionAPI, when set, creates a browser over REST before each
	// attempt and releases it when the session or the attempt ends.
	SessionAPI *SessionAPI
}

// TLSOptions are the provider's TLS settings.
type TLSOptions struct {
	// InsecureSkipVerify accepts any certificate.
	InsecureSkipVerify bool
	// ServerName overrides the name sent in SNI and verified.
	ServerName string
	// TrustedCACertFiles are PEM files of the CAs to trust instead of the
	// system's.
	TrustedCACertFiles []string
}

// HeaderOp is one header_up operation.
type HeaderOp struct {
	// Op is "set", "add" or "delete".
	Op string
	// Field is the header's name.
	Field string
	// Value may hold request placeholders; unused by delete.
	Value string
}

// Provider is one configured browser provider, ready to be dialed.
type Provider struct {
	// Name, Priority, Weight, ConnectTimeout and PassQuery are the
	// options it was built from (defaults applied).
	Name           string
	Priority       int
	Weight         int
	ConnectTimeout time.Duration
	PassQuery      bool
	// Discover tells whether each connect first reads /json/version.
	Discover bool

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
	redacted   string

	api *sessionAPI // nil without a session API
}

// New checks o and builds a Provider. Errors name the provider and the
// problem, never the URL's secrets.
func New(o Options) (*Provider, error) {
	if o.Name == "" {
		return nil, fmt.Errorf("provider without a name")
	}
	if strings.TrimSpace(o.URL) == "" {
		// Typically a placeholder whose variable is unset.
		return nil, fmt.Errorf("provider %q: the URL is empty (is its environment variable set?)", o.Name)
	}
	u, err := url.Parse(o.URL)
	if err != nil {
		return nil, fmt.Errorf("provider %q: invalid URL (%s)", o.Name, urlErrorCause(err))
	}
	p := &Provider{
		Name:           o.Name,
		Priority:       o.Priority,
		Weight:         o.Weight,
		ConnectTimeout: o.ConnectTimeout,
		PassQuery:      o.PassQuery,
		headerOps:      o.HeaderOps,
		tlsOpts:        o.TLS,
		redacted:       Redact(u),
	}
	if p.forward, err = parseForward(o.ForwardHeaders); err != nil {
		return nil, fmt.Errorf("provider %q: %w", o.Name, err)
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
		return nil, fmt.Errorf("provider %q: URL must start with ws://, wss://, http:// or https://", o.Name)
	}
	if o.Discover != nil {
		if *o.Discover && (p.scheme == "ws" || p.scheme == "wss") && (u.Scheme == "ws" || u.Scheme == "wss") {
			return nil, fmt.Errorf("provider %q: discover on needs an http:// or https:// URL", o.Name)
		}
		p.Discover = *o.Discover
	}
	if u.Host == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("provider %q: URL has no host", o.Name)
	}
	if u.Opaque != "" {
		return nil, fmt.Errorf("provider %q: URL must be absolute, like ws://host:port/path", o.Name)
	}
	if u.Fragment != "" {
		return nil, fmt.Errorf("provider %q: URL must not have a fragment", o.Name)
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
	if p.path == "" {
		p.path = "/"
	}
	p.rawQuery = u.RawQuery
	p.query = u.Query()
	if u.User != nil {
		pw, _ := u.User.Password()
		p.basicAuth = "Basic " + base64.StdEncoding.EncodeToString([]byte(u.User.Username()+":"+pw))
	}
	for i, op := range o.HeaderOps {
		switch op.Op {
		case "set", "add", "delete":
		default:
			return nil, fmt.Errorf("provider %q: header_up operation %d: unknown op %q", o.Name, i, op.Op)
		}
		if op.Field == "" || strings.ContainsAny(op.Field, " \t\r\n:") {
			return nil, fmt.Errorf("provider %q: header_up: invalid field name %q", o.Name, op.Field)
		}
		if strings.ContainsAny(op.Value, "\r\n") {
			return nil, fmt.Errorf("provider %q: header_up %s: value must not contain a line break", o.Name, op.Field)
		}
		if op.Op != "delete" && strings.EqualFold(op.Field, "Authorization") {
			p.setsAuth = true
		}
	}
	if o.SessionAPI != nil {
		// The gateway dials the URL each create answer gives.
		p.Discover = false
		if p.api, err = newSessionAPI(p, *o.SessionAPI, o.TLS); err != nil {
			return nil, fmt.Errorf("provider %q: session_api: %w", o.Name, err)
		}
	}
	if p.scheme == "wss" {
		cfg, err := o.TLS.build(u.Hostname())
		if err != nil {
			return nil, fmt.Errorf("provider %q: %w", o.Name, err)
		}
		p.tlsConfig = cfg
	} else if o.TLS.InsecureSkipVerify || o.TLS.ServerName != "" || len(o.TLS.TrustedCACertFiles) > 0 {
		return nil, fmt.Errorf("provider %q: TLS options need a wss:// or https:// URL", o.Name)
	}
	return p, nil
}

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
