// Package upstreams owns what a browser provider is and how the gateway talks
// to one: the provider model and its redacted form, the upstream handshake
// request, one connection attempt inside its deadline (TCP, TLS, discovery,
// upgrade answer), the provider sessions it creates first over a session API
// or with WebDriver's create (one creator each, around one create step) and
// their release, the classification of what came back into an outcome word,
// the strategies that order candidates, the byte relay after 101, and
// WebDriver over HTTP (create, commands, the session's sockets).
//
// It knows nothing of cooldowns or queues.
package upstreams

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/browserfailover/caddy-browser-failover/internal/conf"
	"github.com/browserfailover/caddy-browser-failover/options"
)

// DefaultConnectTimeout bounds one attempt when nothing else is configured.
const DefaultConnectTimeout = 10 * time.Second

// Provider is one configured browser provider, ready to be dialed. Its
// methods are what the gateway asks of a provider: what it is and serves,
// the ways to its browser (Connect, Reconnect, CreateWebDriver,
// WebDriverSocket, WebDriverCommand) and the release of what it created
// (Adopt, ListSessions). How each way works is its own type's: the
// WebSocket upgrade (upgrader, dial.go), the session API's creator
// (sessionAPI, create_rest.go) and WebDriver's (webDriver,
// create_webdriver.go).
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
	pwVersion string   // its Playwright version, canonical; "" for any
	headerOps []HeaderOp
	setsAuth  bool
	forward   *forwardRule // nil: the default fields only

	scheme     string    // ws or wss after mapping http(s)
	httpURL    bool      // configured as http:// or https://
	httpScheme string    // http or https, for discovery
	endpoint             // its URL's: where its own upgrades go
	tls        *conf.TLS // its TLS settings (nil: the defaults)
	key        string    // the resolved URL
	redacted   string

	// honours is what it honours of the session options; optQuery: its
	// URL's query holds {bf.option.<name>} placeholders, rendered at each
	// attempt.
	honours  options.Honours
	optQuery bool
	usesOpts bool // anything it sends holds an option placeholder

	api *sessionAPI // nil without a session API
	wd  *webDriver  // nil but for protocol webdriver
	// creates is its creator, api or wd (nil: neither; it makes its
	// sessions by WebSocket upgrade only).
	creates creator

	// conf is the configuration it was built from: an option that needs
	// no preparing is read from here where it is used.
	conf Config
}

// Honours is what the provider honours of the clients' session options,
// and how it words them.
func (p *Provider) Honours() *options.Honours { return &p.honours }

// UsesOptions reports whether anything the provider sends holds a
// {bf.option.<name>} placeholder.
func (p *Provider) UsesOptions() bool { return p.usesOpts }

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
	// APITransport carries its session API calls when its TLS options do
	// not ask for a transport of its own (nil: a new one, see
	// NewAPITransport); the caller keeps it across config loads, so that
	// every provider's calls share its connections.
	APITransport *http.Transport
}

// New checks c (with Validate) and builds the provider: its placeholders
// known when the config loads ({env.X}) are resolved with known (nil:
// none), and what they gave checked as Validate checks a value given as
// it is; request placeholders in header values stay for each attempt. d
// gives what the handler sets for all its providers. Errors name the
// provider and the problem, never the URL's secrets.
func New(c Config, d Defaults, known func(string) string) (*Provider, error) {
	if known == nil {
		known = func(s string) string { return s }
	}
	if c.Name == "" {
		return nil, fmt.Errorf("provider without a name")
	}
	fail := func(err error) (*Provider, error) { return nil, fmt.Errorf("provider %q: %w", c.Name, err) }
	if err := c.Validate(nil); err != nil {
		return fail(err)
	}
	raw := strings.TrimSpace(known(c.URL))
	switch {
	case raw == "":
		// Typically a placeholder whose variable is unset.
		return fail(errors.New("the URL is empty once its placeholders are resolved (is the environment variable set?)"))
	case WholePlaceholder(raw):
		return fail(errors.New("the URL's placeholder is not known when the config loads (use {env.X})"))
	}
	u, err := c.validateURL(raw, true)
	if err != nil {
		return fail(err)
	}
	var api *SessionAPI
	if c.SessionAPI != nil {
		a, err := c.SessionAPI.resolved(known)
		if err != nil {
			return nil, fmt.Errorf("provider %q: session_api: %w", c.Name, err)
		}
		api = &a
	}
	ops := make([]HeaderOp, len(c.HeadersUp))
	for i, op := range c.HeadersUp {
		if v := known(op.Value); v != op.Value {
			op.Value = v
			if err := op.Validate(); err != nil {
				return fail(err)
			}
		}
		ops[i] = op
	}
	p := &Provider{
		Name:           c.Name,
		Priority:       1,
		Weight:         max(c.Weight, 1),
		ConnectTimeout: time.Duration(c.ConnectTimeout),
		headerOps:      ops,
		tls:            c.TLS,
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
	if p.ConnectTimeout <= 0 {
		p.ConnectTimeout = DefaultConnectTimeout
	}
	if p.forward, err = parseForward(d.ForwardHeaders); err != nil {
		return fail(err)
	}
	p.scheme, p.httpScheme = "ws", "http"
	if strings.EqualFold(u.Scheme, "wss") || strings.EqualFold(u.Scheme, "https") {
		p.scheme, p.httpScheme = "wss", "https"
	}
	p.httpURL = strings.HasPrefix(strings.ToLower(u.Scheme), "http")
	p.Discover = p.httpURL && (c.Discover == nil || *c.Discover)
	p.endpoint = endpointOf(u, p.scheme == "wss")
	// Both checked by Validate.
	p.proto, _ = ParseProtocol(c.Protocol)
	if c.PlaywrightVersion != "" {
		p.pwVersion, _ = ParsePlaywrightVersion(c.PlaywrightVersion)
	}
	if p.proto == ProtocolWebDriver {
		if !p.httpURL {
			// Checked by Validate unless the URL was a placeholder.
			return fail(errors.New("protocol webdriver needs an http:// or https:// URL"))
		}
		p.Discover = false
		if p.wd, err = newWebDriver(p, u, c, d, known); err != nil {
			return fail(err)
		}
		p.creates = p.wd
	}
	if p.proto == ProtocolBiDi && p.httpURL {
		// WebDriver BiDi's endpoint is <base>/session; there is nothing
		// to discover.
		p.path, p.Discover = strings.TrimSuffix(p.path, "/")+"/session", false
	}
	if p.path == "" {
		p.path = "/"
	}
	p.optQuery = queryHasOptions(p.query)
	p.honours = c.Honours()
	p.usesOpts = c.usesOptions()
	for _, op := range ops {
		if op.Op != "delete" && strings.EqualFold(op.Field, "Authorization") {
			p.setsAuth = true
		}
	}
	if api != nil {
		// The gateway dials the URL each create answer gives.
		p.Discover = false
		if p.api, err = newSessionAPI(p, *api, d); err != nil {
			return nil, fmt.Errorf("provider %q: session_api: %w", c.Name, err)
		}
		p.creates = p.api
	}
	if p.scheme == "wss" {
		if p.tlsConfig, err = dialTLS(p.tls, u.Hostname()); err != nil {
			return fail(err)
		}
	}
	return p, nil
}

// Protocol is what the provider serves (ProtocolAny when not set).
func (p *Provider) Protocol() Protocol { return p.proto }

// PlaywrightVersion is the major.minor Playwright version a playwright
// provider serves, in canonical form ("": any version).
func (p *Provider) PlaywrightVersion() string { return p.pwVersion }

// Books are the counts of the sessions the provider creates: over its
// session API, or as a webdriver provider; nil for other providers.
func (p *Provider) Books() *Books {
	if p.creates == nil {
		return nil
	}
	return p.creates.keeper().books
}

// CreatesSessions reports whether the provider creates sessions that the
// gateway must end itself (a session API's, or a webdriver provider's):
// they go through the releaser and its ledger, and Adopt takes back those
// a gone process left.
func (p *Provider) CreatesSessions() bool { return p.creates != nil }

// Key is the provider's resolved URL: two providers of one name are the
// same when their keys are. Never shown (it may hold secrets).
func (p *Provider) Key() string { return p.key }

// PassesQuery reports whether the client's query is merged into the
// provider URL's (pass_query).
func (p *Provider) PassesQuery() bool { return p.conf.PassQuery }

// dialTLS is the TLS configuration of a connection to host with a
// provider's TLS settings o, for an upgrade or a probe: the upstream side
// always speaks HTTP/1.1.
func dialTLS(o *conf.TLS, host string) (*tls.Config, error) {
	cfg, err := o.Config(host)
	if err != nil {
		return nil, err
	}
	cfg.NextProtos = []string{"http/1.1"}
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
