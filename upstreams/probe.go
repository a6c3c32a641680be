package upstreams

import (
	"bufio"
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
	"strconv"
	"strings"
	"sync"
	"time"
)

// Active health checks: a probe is one HTTP GET to the provider (or to a
// URL of the operator's choosing), never a WebSocket and never a browser
// session, so it costs a cloud provider nothing. Its answer is classified
// with the same outcome words as a client's attempt.

// Health check defaults.
const (
	DefaultProbeTimeout = 2 * time.Second
	DefaultProbeStatus  = http.StatusOK
	// CapacityBrowserless reads browserless's /pressure answer.
	CapacityBrowserless = "browserless"
	// probeUserAgent names the gateway's probes in the provider's logs.
	probeUserAgent = "Caddy-browser_failover-health-check"
	// maxProbeBody bounds the part of a probe's answer body that is read.
	maxProbeBody = 64 << 10
)

// ProbeOptions configure the active health check of one provider.
type ProbeOptions struct {
	// URI is a path ("/json/version"), which takes the provider's scheme
	// (ws becomes http, wss https), host and query; or a full http:// or
	// https:// URL, used as it is. Empty: the provider's path followed by
	// /json/version for an http(s):// provider, /pressure with
	// CapacityBrowserless; a ws(s):// provider without capacity needs one.
	URI string
	// Timeout bounds one probe: TCP, TLS, the request and the whole
	// answer. Default DefaultProbeTimeout.
	Timeout time.Duration
	// ExpectStatus is the status of a passing probe; default 200.
	ExpectStatus int
	// Capacity is "" or CapacityBrowserless: the answer is then
	// browserless's pressure JSON, read for the provider's capacity.
	Capacity string
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

// Pressure is what a browserless /pressure answer says of its capacity.
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
	// CapacityBrowserless; nil otherwise.
	Pressure *Pressure
	// CapacityErr tells why a passing probe's answer could not be read for
	// capacity.
	CapacityErr error
}

// Prober runs the active health check of one provider: one HTTP/1.1 GET
// per Probe, on a connection kept open between probes when the provider
// allows it. Probes of one Prober are serialized.
type Prober struct {
	opts       ProbeOptions
	address    string // host:port to dial
	host       string // Host header
	requestURI string
	tlsConfig  *tls.Config
	shown      string // the target, redacted
	// own: the target is the provider itself, so its credentials (URL
	// user info, header_up values) go along.
	own bool
	p   *Provider
	// userAuth is the Authorization of user info in a full-URL uri.
	userAuth string

	mu   sync.Mutex
	req  []byte
	conn net.Conn
	br   *bufio.Reader
	// hostRetried: Chrome refused the Host header, and the dialed
	// address is sent instead from now on. remote is the address the
	// last connection reached.
	hostRetried bool
	remote      string
}

// NewProber builds the health check of p. Errors name the provider and the
// problem, never a secret.
func (p *Provider) NewProber(o ProbeOptions) (*Prober, error) {
	if o.Timeout <= 0 {
		o.Timeout = DefaultProbeTimeout
	}
	if o.ExpectStatus == 0 {
		o.ExpectStatus = DefaultProbeStatus
	}
	if o.ExpectStatus < 100 || o.ExpectStatus > 599 {
		return nil, fmt.Errorf("provider %q: health_check expect_status %d is not an HTTP status", p.Name, o.ExpectStatus)
	}
	switch o.Capacity {
	case "", CapacityBrowserless:
	default:
		return nil, fmt.Errorf("provider %q: health_check capacity %q: want browserless", p.Name, o.Capacity)
	}
	if err := CheckProbeURI(o.URI); err != nil {
		return nil, fmt.Errorf("provider %q: %w", p.Name, err)
	}
	pr := &Prober{opts: o, p: p}
	uri := o.URI
	if uri == "" {
		switch {
		case o.Capacity == CapacityBrowserless:
			uri = "/pressure"
		case p.httpURL:
			uri = strings.TrimSuffix(p.path, "/") + "/json/version"
		default:
			return nil, fmt.Errorf("provider %q: health_check needs a uri for a ws:// or wss:// provider (a path on its host, such as /json/version, or a full http(s) URL), or health_check off", p.Name)
		}
	}
	if strings.HasPrefix(uri, "/") {
		u, err := url.Parse(uri)
		if err != nil {
			return nil, fmt.Errorf("provider %q: health_check uri: not a valid path", p.Name)
		}
		q := p.rawQuery
		if u.RawQuery != "" {
			// The uri's own keys are added to the provider's (its value
			// wins for a key both have).
			merged := url.Values{}
			for k, v := range p.query {
				merged[k] = v
			}
			for k, v := range u.Query() {
				merged[k] = v
			}
			q = merged.Encode()
		}
		pr.address, pr.host, pr.tlsConfig, pr.own = p.address, p.host, p.tlsConfig, true
		if p.httpScheme == "https" && pr.tlsConfig == nil {
			cfg, err := p.tlsOpts.build(hostOnly(p.host))
			if err != nil {
				return nil, fmt.Errorf("provider %q: %w", p.Name, err)
			}
			pr.tlsConfig = cfg
		}
		pr.requestURI = u.EscapedPath()
		if q != "" {
			pr.requestURI += "?" + q
		}
		shown := url.URL{Scheme: p.httpScheme, Host: p.host, Path: u.Path, RawPath: u.RawPath, RawQuery: q}
		if p.basicAuth != "" {
			shown.User = url.User("REDACTED")
		}
		pr.shown = Redact(&shown)
	} else {
		u, err := url.Parse(uri)
		if err != nil || u.Host == "" || u.Hostname() == "" {
			return nil, fmt.Errorf("provider %q: health_check uri: not a valid URL", p.Name)
		}
		scheme := strings.ToLower(u.Scheme)
		port := u.Port()
		if port == "" {
			port = "80"
			if scheme == "https" {
				port = "443"
			}
		}
		pr.address = net.JoinHostPort(u.Hostname(), port)
		pr.host = u.Host
		// The provider's credentials go only to the provider's own host.
		pr.own = strings.EqualFold(u.Host, p.host) && scheme == p.httpScheme
		if scheme == "https" {
			cfg, err := p.tlsOpts.build(u.Hostname())
			if err != nil {
				return nil, fmt.Errorf("provider %q: %w", p.Name, err)
			}
			pr.tlsConfig = cfg
		}
		pr.requestURI = u.EscapedPath()
		if pr.requestURI == "" {
			pr.requestURI = "/"
		}
		if u.RawQuery != "" {
			pr.requestURI += "?" + u.RawQuery
		}
		pr.shown = Redact(u)
		if u.User != nil {
			pw, _ := u.User.Password()
			pr.userAuth = "Basic " + base64.StdEncoding.EncodeToString([]byte(u.User.Username()+":"+pw))
		}
	}
	pr.req = pr.request(pr.host)
	return pr, nil
}

// Target is the URL the probes GET, redacted.
func (pr *Prober) Target() string { return pr.shown }

// Capacity is the capacity reader ("" or CapacityBrowserless).
func (pr *Prober) Capacity() string { return pr.opts.Capacity }

// hostOnly strips the port of a host[:port].
func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

// request builds the probe's GET with host as its Host header.
func (pr *Prober) request(host string) []byte {
	b := make([]byte, 0, 256)
	b = append(b, "GET "...)
	b = append(b, pr.requestURI...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\nUser-Agent: "+probeUserAgent+"\r\nAccept: application/json\r\n"...)
	auth := pr.userAuth
	if pr.own {
		if auth == "" && pr.p.basicAuth != "" && !pr.p.setsAuth {
			auth = pr.p.basicAuth
		}
	}
	if auth != "" {
		b = appendField(b, "Authorization", auth)
	}
	if pr.own {
		// header_up values resolved at load time (an API key from
		// {env.X}); those that name a request placeholder have no
		// request to take it from.
		for _, op := range pr.p.headerOps {
			if op.Op == "delete" || strings.EqualFold(op.Field, "Host") || strings.Contains(op.Value, "{") {
				continue
			}
			b = appendField(b, op.Field, op.Value)
		}
	}
	return append(b, "\r\n"...)
}

// Probe runs one probe within the options' timeout (or ctx's end, which
// calls it off).
func (pr *Prober) Probe(ctx context.Context) (res ProbeResult) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	start := time.Now()
	defer func() { res.Outcome.Elapsed = time.Since(start) }()
	deadline := start.Add(pr.opts.Timeout)
	actx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()

	ans, body, err := pr.exchange(actx, deadline)
	if err == nil && ans.Status == http.StatusInternalServerError && !pr.hostRetried && pr.remote != "" &&
		bytes.Contains(body, []byte("Host header")) && net.ParseIP(hostOnly(pr.host)) == nil {
		// Chrome answers /json/* only when Host is an IP address or
		// localhost: from now on send the address it was dialed at.
		pr.hostRetried = true
		pr.req = pr.request(pr.remote)
		ans, body, err = pr.exchange(actx, deadline)
	}
	if err != nil {
		if ctx.Err() != nil {
			return ProbeResult{Outcome: Outcome{Word: WordClientGone, Kind: ClientGone, Err: ctx.Err()}}
		}
		word, kind := ClassifyError(err, false)
		return ProbeResult{Outcome: Outcome{Word: word, Kind: kind, Err: err}}
	}
	if ans.Status != pr.opts.ExpectStatus {
		return ProbeResult{Outcome: Outcome{Word: StatusWord(ans.Status), Kind: Failure,
			Err: fmt.Errorf("health check answered %d, want %d", ans.Status, pr.opts.ExpectStatus)}}
	}
	res = ProbeResult{Outcome: Outcome{Word: WordOK, Kind: Success}}
	if pr.opts.Capacity == CapacityBrowserless {
		res.Pressure, res.CapacityErr = parsePressure(body)
	}
	return res
}

// exchange sends the request and reads the answer and its body (up to
// maxProbeBody), on the kept connection if there is one. A kept connection
// that fails before any answer (the provider closed it while idle) is
// replaced once by a fresh one: a GET may be sent again.
func (pr *Prober) exchange(ctx context.Context, deadline time.Time) (*Answer, []byte, error) {
	for try := 0; ; try++ {
		reused := pr.conn != nil
		if !reused {
			conn, err := dialTo(ctx, pr.address, pr.tlsConfig)
			if err != nil {
				return nil, nil, err
			}
			pr.conn = conn
			if ra, ok := conn.RemoteAddr().(*net.TCPAddr); ok {
				pr.remote = ra.String()
			}
			if pr.br == nil {
				pr.br = bufio.NewReaderSize(conn, 4096)
			} else {
				pr.br.Reset(conn)
			}
		}
		conn := pr.conn
		stop := context.AfterFunc(ctx, func() { conn.SetDeadline(aLongTimeAgo) })
		conn.SetDeadline(deadline)
		ans, body, keep, err := pr.roundTrip(conn)
		if !stop() && err == nil {
			// Called off while the answer came: the deadline is spent.
			keep = false
		}
		if err != nil || !keep {
			pr.drop()
		}
		if err != nil && reused && try == 0 && ctx.Err() == nil && !isTimeout(err) {
			continue
		}
		if err != nil && ctx.Err() != nil {
			err = ctx.Err()
		}
		return ans, body, err
	}
}

// roundTrip writes the request on conn and reads the answer. keep tells
// whether the connection may serve the next probe: HTTP/1.1, no
// "Connection: close", and a body of known length read whole.
func (pr *Prober) roundTrip(conn net.Conn) (ans *Answer, body []byte, keep bool, err error) {
	if _, err = conn.Write(pr.req); err != nil {
		return nil, nil, false, err
	}
	ans, err = ReadAnswer(pr.br, MaxAnswerHeader)
	if err != nil {
		return nil, nil, false, err
	}
	keep = bytes.HasPrefix(ans.Raw, []byte("HTTP/1.1")) && !headerHasToken(ans.Header, "Connection", "close")
	switch {
	case ans.Status < 200 || ans.Status == http.StatusNoContent || ans.Status == http.StatusNotModified:
		return ans, nil, keep, nil
	case ans.Header.Get("Transfer-Encoding") == "" && ans.Header.Get("Content-Length") != "":
		n, perr := strconv.ParseInt(ans.Header.Get("Content-Length"), 10, 64)
		if perr != nil || n < 0 {
			return ans, nil, false, nil
		}
		if n > maxProbeBody {
			keep = false
		}
		body = make([]byte, min(n, maxProbeBody))
		if _, err = io.ReadFull(pr.br, body); err != nil {
			return nil, nil, false, err
		}
		return ans, body, keep, nil
	default:
		// Chunked, or up to the connection's end: read what the limit
		// allows and start afresh next time.
		if body, err = readBody(ans, pr.br); err != nil {
			return nil, nil, false, err
		}
		return ans, body, false, nil
	}
}

// drop closes the kept connection.
func (pr *Prober) drop() {
	if pr.conn != nil {
		pr.conn.Close()
		pr.conn = nil
	}
}

// Close closes the connection kept for the next probe.
func (pr *Prober) Close() {
	pr.mu.Lock()
	pr.drop()
	pr.mu.Unlock()
}
