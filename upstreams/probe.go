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
	"net/http/httputil"
	"net/url"
	"os"
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
	// rd is what br reads: the connection, after any bytes read ahead
	// by Collect.
	rd probeReader
	// sent: Send wrote the request, at start, and the probe is not over
	// (mu stays locked until Collect or Finish ends it).
	sent  bool
	start time.Time
	// deadlineSet: the connection has a read deadline, which must go
	// before Collect reads without waiting.
	deadlineSet bool
	// closed: Close was called; no connection is kept from then on.
	closed bool
	// hostRetried: Chrome refused the Host header, and the dialed
	// address is sent instead from now on. remote is the address the
	// last connection reached.
	hostRetried bool
	remote      string
	// Buffers kept between probes: the answer's head and body.
	scratch, body []byte
	// The context whose end interrupts the kept connection, and how to
	// stop watching it.
	watching context.Context
	unwatch  func() bool
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
func (pr *Prober) Probe(ctx context.Context) ProbeResult {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.probe(ctx, time.Now(), false)
}

// probe runs one probe that started at start; sent: Send has written its
// request on the kept connection.
func (pr *Prober) probe(ctx context.Context, start time.Time, sent bool) (res ProbeResult) {
	defer func() { res.Outcome.Elapsed = time.Since(start) }()
	// The timeout is the connection's deadline (a context deadline would
	// arm one more timer per probe); ctx only calls the probe off.
	deadline := start.Add(pr.opts.Timeout)

	ans, body, err := pr.exchange(ctx, deadline, sent)
	if err == nil && pr.hostRefused(ans, body) {
		// Chrome answers /json/* only when Host is an IP address or
		// localhost: from now on send the address it was dialed at.
		pr.hostRetried = true
		pr.req = pr.request(pr.remote)
		ans, body, err = pr.exchange(ctx, deadline, false)
	}
	return pr.result(ctx, ans, body, err)
}

// hostRefused reports whether the answer is Chrome's refusal of the Host
// header, which the probe takes once as a sign to send the dialed address.
func (pr *Prober) hostRefused(ans probeAnswer, body []byte) bool {
	return ans.status == http.StatusInternalServerError && !pr.hostRetried && pr.remote != "" &&
		bytes.Contains(body, []byte("Host header")) && net.ParseIP(hostOnly(pr.host)) == nil
}

// result classifies an exchange.
func (pr *Prober) result(ctx context.Context, ans probeAnswer, body []byte, err error) (res ProbeResult) {
	if err != nil {
		if ctx.Err() != nil {
			return ProbeResult{Outcome: Outcome{Word: WordClientGone, Kind: ClientGone, Err: ctx.Err()}}
		}
		word, kind := ClassifyError(err, false)
		return ProbeResult{Outcome: Outcome{Word: word, Kind: kind, Err: err}}
	}
	if ans.status != pr.opts.ExpectStatus {
		return ProbeResult{Outcome: Outcome{Word: StatusWord(ans.status), Kind: Failure,
			Err: fmt.Errorf("health check answered %d, want %d", ans.status, pr.opts.ExpectStatus)}}
	}
	res = ProbeResult{Outcome: Outcome{Word: WordOK, Kind: Success}}
	if pr.opts.Capacity == CapacityBrowserless {
		res.Pressure, res.CapacityErr = parsePressure(body)
	}
	return res
}

// exchange sends the request and reads the answer and its body (up to
// maxProbeBody), on the kept connection if there is one; sent: Send has
// already written the request there. A kept connection that fails before
// any answer (the provider closed it while idle) is replaced once by a
// fresh one: a GET may be sent again.
func (pr *Prober) exchange(ctx context.Context, deadline time.Time, sent bool) (probeAnswer, []byte, error) {
	for try := 0; ; try++ {
		reused := pr.conn != nil
		if !reused {
			sent = false
			dctx, cancel := context.WithDeadline(ctx, deadline)
			conn, err := dialTo(dctx, pr.address, pr.tlsConfig)
			if err != nil && ctx.Err() == nil && errors.Is(dctx.Err(), context.DeadlineExceeded) {
				err = os.ErrDeadlineExceeded // the probe's timeout
			}
			cancel()
			if err != nil {
				return probeAnswer{}, nil, err
			}
			pr.conn = conn
			if ra, ok := conn.RemoteAddr().(*net.TCPAddr); ok {
				pr.remote = ra.String()
			}
			pr.rd.reset(conn)
			if pr.br == nil {
				pr.br = bufio.NewReaderSize(&pr.rd, 4096)
			} else {
				pr.br.Reset(&pr.rd)
			}
		}
		conn := pr.conn
		pr.watch(ctx)
		// (A probe that waits sets the read deadline; Send, which
		// does not, takes it away.)
		// Only the answer may keep the probe waiting: the request is
		// small, and a connection never holds more than one unanswered
		// (one that timed out is dropped), so its write cannot block.
		pr.setReadDeadline(ctx, deadline)
		pr.deadlineSet = true
		if pr.rd.raw != nil {
			pr.rd.raw.quiet(false) // this read may wait
		}
		var ans probeAnswer
		var body []byte
		var keep bool
		var err error
		if !sent {
			_, err = conn.Write(pr.req)
		}
		sent = false
		if err == nil {
			ans, body, keep, err = pr.readExchange()
		}
		if ctx.Err() != nil {
			keep = false // called off: the connection's deadline is spent
		}
		if err != nil || !keep || pr.closed {
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

// watch makes ctx's end (calling the probes off) interrupt the kept
// connection; watched once per connection and context, not once per probe.
func (pr *Prober) watch(ctx context.Context) {
	if pr.watching == ctx {
		return
	}
	if pr.unwatch != nil {
		pr.unwatch()
	}
	conn := pr.conn
	pr.watching = ctx
	pr.unwatch = context.AfterFunc(ctx, func() { conn.SetDeadline(aLongTimeAgo) })
}

// setReadDeadline sets the kept connection's read deadline, unless ctx has
// ended: calling the probes off wins over any deadline.
func (pr *Prober) setReadDeadline(ctx context.Context, t time.Time) {
	pr.conn.SetReadDeadline(t)
	if ctx.Err() != nil {
		pr.conn.SetDeadline(aLongTimeAgo)
	}
}

// readExchange reads the answer to the request sent. keep tells whether
// the connection may serve the next probe: HTTP/1.1, no "Connection:
// close", and a body of known length read whole. The body is the prober's
// buffer, valid until the next probe.
func (pr *Prober) readExchange() (ans probeAnswer, body []byte, keep bool, err error) {
	if ans, err = pr.readAnswer(); err != nil {
		return ans, nil, false, err
	}
	keep = ans.http11 && !ans.close
	switch {
	case ans.status < 200 || ans.status == http.StatusNoContent || ans.status == http.StatusNotModified:
		return ans, nil, keep, nil
	case !ans.chunked && ans.length >= 0:
		if ans.length > maxProbeBody {
			keep = false
		}
		n := int(min(ans.length, maxProbeBody))
		if cap(pr.body) < n {
			pr.body = make([]byte, n)
		}
		body = pr.body[:n]
		if _, err = io.ReadFull(pr.br, body); err != nil {
			return ans, nil, false, err
		}
		return ans, body, keep, nil
	default:
		// Chunked, or up to the connection's end: read what the limit
		// allows and start afresh next time.
		var r io.Reader = pr.br
		if ans.chunked {
			r = httputil.NewChunkedReader(pr.br)
		}
		if body, err = io.ReadAll(io.LimitReader(r, maxProbeBody)); err != nil {
			return ans, nil, false, err
		}
		return ans, body, false, nil
	}
}

// probeAnswer is what a probe reads of an answer's head.
type probeAnswer struct {
	status  int
	http11  bool
	close   bool  // Connection: close
	chunked bool  // Transfer-Encoding: chunked
	other   bool  // another Transfer-Encoding: the body's end is the connection's
	length  int64 // Content-Length; -1 when absent
}

// readAnswer reads an answer's status line and headers, keeping only what
// a probe needs, into the prober's scratch buffer (no allocation per
// probe).
func (pr *Prober) readAnswer() (probeAnswer, error) {
	a := probeAnswer{length: -1}
	raw := pr.scratch[:0]
	defer func() { pr.scratch = raw[:0] }()
	line, err := readLine(pr.br, &raw, MaxAnswerHeader)
	if err != nil {
		return a, err
	}
	if err := a.statusLine(line); err != nil {
		return a, err
	}
	for n := 0; ; n++ {
		line, err := readLine(pr.br, &raw, MaxAnswerHeader)
		if err != nil {
			return a, err
		}
		if len(line) == 0 {
			break
		}
		if err := a.field(n, line); err != nil {
			return a, err
		}
	}
	a.headDone()
	return a, nil
}

// statusLine reads an answer's status line ("HTTP/1.1 200 OK").
func (a *probeAnswer) statusLine(line []byte) error {
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return fmt.Errorf("%w: bad status line", errMalformed)
	}
	a.http11 = line[7] == '1'
	code := line[9:12]
	if len(line) > 12 && line[12] != ' ' {
		return fmt.Errorf("%w: bad status code", errMalformed)
	}
	for _, c := range code {
		if c < '0' || c > '9' {
			return fmt.Errorf("%w: bad status code", errMalformed)
		}
		a.status = a.status*10 + int(c-'0')
	}
	if a.status < 100 {
		return fmt.Errorf("%w: bad status code", errMalformed)
	}
	return nil
}

// field reads the n-th header line of an answer, keeping only what a probe
// needs.
func (a *probeAnswer) field(n int, line []byte) error {
	if n >= maxAnswerFields {
		return fmt.Errorf("%w: too many header fields", errMalformed)
	}
	k, v, ok := bytes.Cut(line, []byte{':'})
	if !ok || len(k) == 0 || bytes.ContainsAny(k, " \t") {
		return fmt.Errorf("%w: bad header line", errMalformed)
	}
	v = bytes.TrimSpace(v)
	switch {
	case bytes.EqualFold(k, []byte("Content-Length")):
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil || n < 0 || (a.length >= 0 && a.length != n) {
			return fmt.Errorf("%w: bad Content-Length", errMalformed)
		}
		a.length = n
	case bytes.EqualFold(k, []byte("Transfer-Encoding")):
		if bytes.EqualFold(v, []byte("chunked")) {
			a.chunked = true
		} else {
			a.other = true
		}
	case bytes.EqualFold(k, []byte("Connection")):
		for tok := range bytes.SplitSeq(v, []byte{','}) {
			if bytes.EqualFold(bytes.TrimSpace(tok), []byte("close")) {
				a.close = true
			}
		}
	}
	return nil
}

// headDone settles what the header lines said of the body.
func (a *probeAnswer) headDone() {
	if a.other {
		a.chunked, a.length = false, -1
	}
}

// drop closes the kept connection.
func (pr *Prober) drop() {
	if pr.unwatch != nil {
		pr.unwatch()
		pr.unwatch, pr.watching = nil, nil
	}
	if pr.conn != nil {
		pr.conn.Close()
		pr.conn = nil
	}
}

// Close closes the connection kept for the next probe, once a probe in
// flight is over; a probe run after it keeps no connection.
func (pr *Prober) Close() {
	pr.mu.Lock()
	pr.closed = true
	pr.drop()
	pr.mu.Unlock()
}
