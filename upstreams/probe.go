package upstreams

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/internal/conf"
)

// Active health checks: a probe is one HTTP GET to the provider (or to a
// URL of the operator's choosing), never a WebSocket and never a browser
// session, so it costs a cloud provider nothing. It is sent with net/http,
// on a kept-alive transport of the provider's own, and its answer is
// classified with the same outcome words as a client's attempt.

// Health check defaults.
const (
	DefaultProbeInterval = 10 * time.Second
	DefaultProbeTimeout  = 2 * time.Second
	DefaultProbeStatus   = http.StatusOK
	// CapacityBrowserless reads browserless's /pressure answer.
	CapacityBrowserless = "browserless"
	// CapacityWebDriver reads a WebDriver /status answer: value.ready
	// false is full. The default of a webdriver provider.
	CapacityWebDriver = "webdriver"
	// probeUserAgent names the gateway's probes in the provider's logs.
	probeUserAgent = "Caddy-browser_failover-health-check"
	// maxProbeBody bounds the part of a probe's answer body that is read;
	// as much again is read past it and dropped, so that the connection
	// serves the next probe, before a larger body closes it.
	maxProbeBody = 64 << 10
	// probeIdleConns is how many idle connections a provider's probe
	// transport keeps: probes are serialized, so one is used at a time.
	probeIdleConns = 2
)

// ProbeOptions are the settings of one provider's active health check:
// the JSON form of a "health_check" block, and what its probes run with.
type ProbeOptions struct {
	// URI is what a probe GETs: a path ("/json/version"), which takes the
	// provider's scheme (ws becomes http, wss https), host and query; or
	// a full http:// or https:// URL, used as it is. Default: the
	// provider's path followed by /json/version for an http(s)://
	// provider, /pressure with capacity browserless, the base of the
	// /session endpoint (/ for Firefox) for a bidi provider, <base>/status
	// for a webdriver provider; another ws(s):// provider needs one. May
	// hold {env.X} placeholders.
	URI string `json:"uri,omitempty"`
	// Interval is the time between two probes' starts. Default: 10s (the
	// timeout, when longer).
	Interval caddy.Duration `json:"interval,omitempty"`
	// Timeout bounds one probe: TCP, TLS, the request and the whole
	// answer. Default: 2s (the interval, when shorter).
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// ExpectStatus is the status of a passing probe. Default: 200.
	ExpectStatus int `json:"expect_status,omitempty"`
	// Capacity "browserless" reads the answer as browserless's /pressure
	// JSON, "webdriver" as a WebDriver /status answer (value.ready): the
	// provider is skipped as full while it says so. Default: "webdriver"
	// for a webdriver provider, none otherwise.
	Capacity string `json:"capacity,omitempty"`
}

// Validate checks the settings' own values; stated tells whether one was
// written at all (a stated zero is no interval, timeout or status, while
// one left out takes its default; nil: none stated). A uri holding a
// placeholder is checked again by NewProber, resolved. Its error joins
// *conf.Problem values.
func (o *ProbeOptions) Validate(stated func(option string) bool) error {
	given := func(opt string) bool { return stated != nil && stated(opt) }
	var errs []error
	for _, d := range []struct {
		opt string
		v   caddy.Duration
	}{{"interval", o.Interval}, {"timeout", o.Timeout}} {
		if d.v < 0 || (d.v == 0 && given(d.opt)) {
			errs = append(errs, conf.Problemf(d.opt, "health_check %s must be positive, got %v", d.opt, time.Duration(d.v)))
		}
	}
	if o.Interval > 0 && o.Timeout > o.Interval {
		errs = append(errs, &conf.Problem{Options: []string{"timeout", "interval"},
			Msg: fmt.Sprintf("health_check timeout (%v) must not exceed its interval (%v)", time.Duration(o.Timeout), time.Duration(o.Interval))})
	}
	if (o.ExpectStatus != 0 || given("expect_status")) && (o.ExpectStatus < 100 || o.ExpectStatus > 599) {
		errs = append(errs, conf.Problemf("expect_status", "health_check expect_status %d is not an HTTP status", o.ExpectStatus))
	}
	switch o.Capacity {
	case "", CapacityBrowserless, CapacityWebDriver:
	default:
		errs = append(errs, conf.Problemf("capacity", "health_check capacity %q: want browserless or webdriver", o.Capacity))
	}
	if err := CheckProbeURI(o.URI); err != nil {
		errs = append(errs, conf.Problemf("uri", "%v", err))
	}
	return errors.Join(errs...)
}

// Merge returns o with every setting over states replacing o's (a
// provider's own health check over the handler's).
func (o ProbeOptions) Merge(over ProbeOptions) ProbeOptions {
	if over.URI != "" {
		o.URI = over.URI
	}
	if over.Interval != 0 {
		o.Interval = over.Interval
	}
	if over.Timeout != 0 {
		o.Timeout = over.Timeout
	}
	if over.ExpectStatus != 0 {
		o.ExpectStatus = over.ExpectStatus
	}
	if over.Capacity != "" {
		o.Capacity = over.Capacity
	}
	return o
}

// WithDefaults returns o with what was left out set: a default never makes
// the check invalid, so one left out fits the other, given, value (a short
// interval shortens the default timeout, a long timeout lengthens the
// default interval).
func (o ProbeOptions) WithDefaults() ProbeOptions {
	if o.Interval == 0 {
		o.Interval = caddy.Duration(max(DefaultProbeInterval, time.Duration(o.Timeout)))
	}
	if o.Timeout == 0 {
		o.Timeout = caddy.Duration(min(DefaultProbeTimeout, time.Duration(o.Interval)))
	}
	if o.ExpectStatus == 0 {
		o.ExpectStatus = DefaultProbeStatus
	}
	return o
}

// CheckProbeTarget tells whether a provider at providerURL serving
// protocol (its option's value) has something for the health check o to
// GET: a ws:// or wss:// provider has no default, but for a bidi one
// (Firefox answers GET / with 200). A URL that is a placeholder is judged
// once resolved.
func CheckProbeTarget(providerURL, protocol string, o ProbeOptions) error {
	if o.URI != "" || o.Capacity != "" {
		return nil
	}
	if p, _ := ParseProtocol(protocol); p == ProtocolBiDi {
		return nil
	}
	scheme, _, _ := strings.Cut(providerURL, "://")
	if strings.EqualFold(scheme, "ws") || strings.EqualFold(scheme, "wss") {
		return conf.Problemf("uri", "health_check needs a uri for a ws:// or wss:// provider (a path on its host, such as /json/version, or a full http(s) URL), or health_check off")
	}
	return nil
}

// CheckProbeURI checks the form of a health check uri: empty, a path
// starting with "/", or an http:// or https:// URL. It does not resolve
// placeholders; a uri holding one is checked again once resolved.
func CheckProbeURI(uri string) error {
	if uri == "" || strings.HasPrefix(uri, "/") {
		return nil
	}
	scheme, _, ok := strings.Cut(uri, "://")
	if ok && (strings.EqualFold(scheme, "http") || strings.EqualFold(scheme, "https")) {
		if strings.Contains(uri, "{") {
			return nil
		}
		u, err := url.Parse(uri)
		if err != nil || u.Host == "" {
			return errors.New("health_check uri: not a valid URL")
		}
		if u.Fragment != "" {
			return errors.New("health_check uri: must not have a fragment")
		}
		return nil
	}
	return errors.New("health_check uri: want a path starting with / or an http:// or https:// URL")
}

// Pressure is what a browserless /pressure answer says of its capacity,
// or a WebDriver /status answer (IsAvailable is its value.ready; the
// counts are zero: it gives none).
type Pressure struct {
	Running       int  `json:"running"`
	MaxConcurrent int  `json:"maxConcurrent"`
	Queued        int  `json:"queued"`
	IsAvailable   bool `json:"isAvailable"`
}

// Full reports whether the provider would queue or refuse a new session:
// it says it is not available, or it runs as many sessions as it may.
func (p Pressure) Full() bool {
	return !p.IsAvailable || (p.MaxConcurrent > 0 && p.Running >= p.MaxConcurrent)
}

// errNoPressure marks a capacity answer that is not browserless's JSON.
var errNoPressure = errors.New(`answer is not browserless pressure JSON ({"pressure":{"running":…,"maxConcurrent":…,"isAvailable":…}})`)

// parsePressure reads a /pressure answer body.
func parsePressure(body []byte) (*Pressure, error) {
	var doc struct {
		Pressure *struct {
			Running       *int  `json:"running"`
			MaxConcurrent *int  `json:"maxConcurrent"`
			Queued        *int  `json:"queued"`
			IsAvailable   *bool `json:"isAvailable"`
		} `json:"pressure"`
	}
	if err := json.Unmarshal(body, &doc); err != nil || doc.Pressure == nil {
		return nil, errNoPressure
	}
	d := doc.Pressure
	if d.Running == nil || d.MaxConcurrent == nil || *d.Running < 0 || *d.MaxConcurrent < 0 {
		return nil, errNoPressure
	}
	p := &Pressure{Running: *d.Running, MaxConcurrent: *d.MaxConcurrent, IsAvailable: true}
	if d.Queued != nil && *d.Queued > 0 {
		p.Queued = *d.Queued
	}
	if d.IsAvailable != nil {
		p.IsAvailable = *d.IsAvailable
	}
	return p, nil
}

// ProbeResult is how one probe went.
type ProbeResult struct {
	// Outcome is Success (WordOK) when the answer had the expected
	// status; Failure with the outcome word otherwise (refused, timeout,
	// status_503 …); ClientGone when the probe was called off (its
	// context ended) and says nothing of the provider.
	Outcome Outcome
	// Pressure is the capacity read from a passing probe's answer, with
	// CapacityBrowserless or CapacityWebDriver; nil otherwise.
	Pressure *Pressure
	// CapacityErr tells why a passing probe's answer could not be read for
	// capacity.
	CapacityErr error
}

// Prober runs the active health check of one provider: one GET per Probe,
// with an http.Client on a transport of its own, which keeps the
// connection open between probes when the provider allows it. The
// transport speaks HTTP/1.1, uses no proxy, follows no redirect and dials
// with the provider's TLS settings. Probes of one Prober are serialized.
type Prober struct {
	opts   ProbeOptions
	target *url.URL // what a probe GETs, without user info
	shown  string   // the target, redacted

	transport *http.Transport
	client    *http.Client
	// remote is the address the last connection reached (the transport
	// dials on goroutines of its own).
	remote atomic.Pointer[string]

	mu sync.Mutex
	// req is the probe's request, without its context. Its Host, once
	// Chrome refused the target's, is the address dialed; Close, once
	// the prober is closed, keeps no connection.
	req  *http.Request
	body bytes.Buffer // the answer's body, kept between probes
}

// NewProber builds the health check of p. Errors name the provider and the
// problem, never a secret.
func (p *Provider) NewProber(o ProbeOptions) (*Prober, error) {
	o = o.WithDefaults()
	err := errors.Join(o.Validate(nil), CheckProbeTarget(p.key, string(p.proto), o))
	if err != nil {
		return nil, fmt.Errorf("provider %q: %w", p.Name, err)
	}
	if o.Capacity == "" && p.proto == ProtocolWebDriver {
		o.Capacity = CapacityWebDriver
	}
	uri := o.URI
	if uri == "" {
		uri = strings.TrimSuffix(p.path, "/") + "/json/version"
		switch {
		case o.Capacity == CapacityBrowserless:
			uri = "/pressure"
		case p.proto == ProtocolWebDriver, o.Capacity == CapacityWebDriver:
			uri = strings.TrimSuffix(p.path, "/") + "/status"
		case p.proto == ProtocolBiDi:
			// WebDriver BiDi has no /json/version: the base of its
			// /session endpoint (Firefox answers / with 200).
			uri = strings.TrimSuffix(strings.TrimSuffix(p.path, "/"), "/session") + "/"
		}
	}
	u, err := url.Parse(uri)
	pr := &Prober{opts: o}
	var tlsConfig *tls.Config
	// own: the target is the provider itself, so its credentials (URL
	// user info, header_up values) go along.
	var own bool
	var userAuth string
	if strings.HasPrefix(uri, "/") {
		if err != nil {
			return nil, fmt.Errorf("provider %q: health_check uri: not a valid path", p.Name)
		}
		q, base := p.rawQuery, p.query
		if p.optQuery {
			// A probe states no session option: their items are left out.
			base = renderQuery(p.query, unstated)
			q = base.Encode()
		}
		if u.RawQuery != "" {
			// The uri's own keys are added to the provider's (its value
			// wins for a key both have).
			merged := url.Values{}
			for k, v := range base {
				merged[k] = v
			}
			for k, v := range u.Query() {
				merged[k] = v
			}
			q = merged.Encode()
		}
		pr.target = &url.URL{Scheme: p.httpScheme, Host: p.host, Path: u.Path, RawPath: u.RawPath, RawQuery: q}
		own, tlsConfig = true, p.tlsConfig
		if p.httpScheme == "https" && tlsConfig == nil {
			if tlsConfig, err = dialTLS(p.tls, hostOnly(p.host)); err != nil {
				return nil, fmt.Errorf("provider %q: %w", p.Name, err)
			}
		}
		shown := *pr.target
		if p.basicAuth != "" {
			shown.User = url.User("REDACTED")
		}
		pr.shown = Redact(&shown)
	} else {
		if err != nil || u.Host == "" || u.Hostname() == "" {
			return nil, fmt.Errorf("provider %q: health_check uri: not a valid URL", p.Name)
		}
		scheme := strings.ToLower(u.Scheme)
		pr.target = &url.URL{Scheme: scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath, RawQuery: u.RawQuery}
		// The provider's credentials go only to the provider's own host.
		own = strings.EqualFold(u.Host, p.host) && scheme == p.httpScheme
		if scheme == "https" {
			if tlsConfig, err = dialTLS(p.tls, u.Hostname()); err != nil {
				return nil, fmt.Errorf("provider %q: %w", p.Name, err)
			}
		}
		pr.shown = Redact(u)
		if u.User != nil {
			pw, _ := u.User.Password()
			userAuth = "Basic " + base64.StdEncoding.EncodeToString([]byte(u.User.Username()+":"+pw))
		}
	}
	pr.req = &http.Request{Method: http.MethodGet, URL: pr.target, Header: probeHeader(p, own, userAuth)}
	pr.transport = &http.Transport{
		Proxy:                  nil, // never one from the environment
		DialContext:            pr.dialer(nil),
		MaxIdleConnsPerHost:    probeIdleConns,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: MaxAnswerHeader,
		DisableCompression:     true,
	}
	if tlsConfig != nil {
		pr.transport.DialTLSContext = pr.dialer(tlsConfig)
	}
	pr.client = &http.Client{
		Transport: pr.transport,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse // a redirect is the answer
		},
	}
	return pr, nil
}

// probeHeader is the header of p's probes; own: the target is p itself.
func probeHeader(p *Provider, own bool, userAuth string) http.Header {
	h := http.Header{"User-Agent": {probeUserAgent}, "Accept": {"application/json"}}
	auth := userAuth
	if own && auth == "" && p.basicAuth != "" && !p.setsAuth {
		auth = p.basicAuth
	}
	if auth != "" {
		h.Set("Authorization", auth)
	}
	if own {
		// header_up values resolved at load time (an API key from
		// {env.X}); those that name a request placeholder have no
		// request to take it from.
		for _, op := range p.headerOps {
			switch {
			case op.Op == "delete" || strings.EqualFold(op.Field, "Host") || strings.Contains(op.Value, "{"):
			case op.Op == "add":
				h.Add(op.Field, op.Value)
			default:
				h.Set(op.Field, op.Value)
			}
		}
	}
	return h
}

// dialer is the transport's dial: TCP, and TLS with cfg when it is not nil,
// as for a client's attempt (so that errors are classified alike). The
// transport dials apart from the request that wants the connection: the
// probe's timeout bounds the dial too.
func (pr *Prober) dialer(cfg *tls.Config) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, _, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, time.Duration(pr.opts.Timeout))
		defer cancel()
		conn, err := dialTo(ctx, addr, cfg)
		if err != nil {
			return nil, err
		}
		remote := conn.RemoteAddr().String()
		pr.remote.Store(&remote)
		return conn, nil
	}
}

// ReadsCapacity reports whether the probes read the provider's capacity
// (its option capacity, or a webdriver provider's default): status shows
// it (pool.ProbeConfig.ReadsCapacity).
func (pr *Prober) ReadsCapacity() bool { return pr.opts.Capacity != "" }

// Target is the URL the probes GET, redacted.
func (pr *Prober) Target() string { return pr.shown }

// hostOnly strips the port of a host[:port].
func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

// Probe runs one probe within the options' timeout (or ctx's end, which
// calls it off).
func (pr *Prober) Probe(ctx context.Context) (res ProbeResult) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	start := time.Now()
	defer func() { res.Outcome.Elapsed = time.Since(start) }()
	pctx, cancel := context.WithTimeout(ctx, time.Duration(pr.opts.Timeout))
	defer cancel()
	status, body, err := pr.get(pctx)
	if err == nil && pr.hostRefused(status, body) {
		// Chrome answers /json/* only when Host is an IP address or
		// localhost: from now on send the address it was dialed at.
		pr.req.Host = *pr.remote.Load()
		status, body, err = pr.get(pctx)
	}
	return pr.result(ctx, pctx, status, body, err)
}

// get sends the probe's request and reads the answer's body, up to
// maxProbeBody (valid until the next probe).
func (pr *Prober) get(ctx context.Context) (status int, body []byte, err error) {
	resp, err := pr.client.Do(pr.req.WithContext(ctx))
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its text names the URL, with any token in it
		}
		return 0, nil, err
	}
	defer resp.Body.Close()
	pr.body.Reset()
	if _, err := pr.body.ReadFrom(io.LimitReader(resp.Body, maxProbeBody)); err != nil {
		return 0, nil, err
	}
	// What is left, within bounds, is read too, so that the connection
	// serves the next probe.
	io.Copy(io.Discard, io.LimitReader(resp.Body, maxProbeBody))
	return resp.StatusCode, pr.body.Bytes(), nil
}

// hostRefused reports whether the answer is Chrome's refusal of the Host
// header, which the probe takes once as a sign to send the dialed address.
func (pr *Prober) hostRefused(status int, body []byte) bool {
	return status == http.StatusInternalServerError && pr.req.Host == "" && pr.remote.Load() != nil &&
		bytes.Contains(body, []byte("Host header")) && net.ParseIP(hostOnly(pr.target.Host)) == nil
}

// result classifies a probe; pctx is ctx with the probe's timeout.
func (pr *Prober) result(ctx, pctx context.Context, status int, body []byte, err error) (res ProbeResult) {
	if err != nil {
		if ctx.Err() != nil {
			return ProbeResult{Outcome: Outcome{Word: WordClientGone, Kind: ClientGone, Err: ctx.Err()}}
		}
		if errors.Is(pctx.Err(), context.DeadlineExceeded) {
			// The probe's timeout, whichever step it ended (a name
			// lookup too).
			return ProbeResult{Outcome: Outcome{Word: WordTimeout, Kind: Failure, Err: err}}
		}
		word, kind := ClassifyError(err, false)
		var netErr *net.OpError
		if word == WordRefused && !errors.As(err, &netErr) {
			// Not the network's: the answer was not HTTP/1.x.
			word, kind, err = WordBadHandshake, Failure, fmt.Errorf("%w: %w", errMalformed, err)
		}
		return ProbeResult{Outcome: Outcome{Word: word, Kind: kind, Err: err}}
	}
	if pr.opts.Capacity == CapacityWebDriver && status != pr.opts.ExpectStatus {
		// Some servers say "not ready" with 503 too: full, not failing.
		if ready, ok := webDriverReady(body); ok && !ready && status == http.StatusServiceUnavailable {
			return ProbeResult{Outcome: Outcome{Word: WordOK, Kind: Success}, Pressure: &Pressure{}}
		}
	}
	if status != pr.opts.ExpectStatus {
		return ProbeResult{Outcome: Outcome{Word: StatusWord(status), Kind: Failure,
			Err: fmt.Errorf("health check answered %d, want %d", status, pr.opts.ExpectStatus)}}
	}
	res = ProbeResult{Outcome: Outcome{Word: WordOK, Kind: Success}}
	switch pr.opts.Capacity {
	case CapacityBrowserless:
		res.Pressure, res.CapacityErr = parsePressure(body)
	case CapacityWebDriver:
		if ready, ok := webDriverReady(body); ok {
			// Only the flag is known: no counts.
			res.Pressure = &Pressure{IsAvailable: ready}
		} else {
			res.CapacityErr = errNoReady
		}
	}
	return res
}

// errNoReady marks a capacity answer that is not a WebDriver status.
var errNoReady = errors.New(`answer is not a WebDriver status ({"value":{"ready":…}})`)

// webDriverReady reads value.ready of a WebDriver /status answer.
func webDriverReady(body []byte) (ready, ok bool) {
	var doc struct {
		Value *struct {
			Ready *bool `json:"ready"`
		} `json:"value"`
	}
	if json.Unmarshal(body, &doc) != nil || doc.Value == nil || doc.Value.Ready == nil {
		return false, false
	}
	return *doc.Value.Ready, true
}

// Close closes the connections kept for the next probe, once a probe in
// flight is over; a probe run after it keeps no connection.
func (pr *Prober) Close() {
	pr.mu.Lock()
	pr.req.Close = true
	pr.mu.Unlock()
	pr.transport.CloseIdleConnections()
}
