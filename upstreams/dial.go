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
	"strconv"
	"strings"
	"sync"
	"time"
)

// MaxRelayedBody bounds the body of a relayed 4xx answer and of a discovery
// answer.
const MaxRelayedBody = 64 << 10

// aLongTimeAgo is a deadline that makes blocked I/O return at once.
var aLongTimeAgo = time.Unix(1, 0)

// Conn is an established upstream WebSocket connection.
type Conn struct {
	net.Conn
	// Answer is the provider's 101 answer.
	Answer *Answer
	// Leftover holds bytes the provider sent right behind its 101; they go to
	// the client before anything else.
	Leftover []byte
	// Remote is the provider session created for this connection over its
	// session API (nil without one): Close, CloseLost and Release release
	// it.
	Remote *Remote
	// Point is where the connection was made, to come back to the same
	// browser (resume.go).
	Point ResumePoint
}

// Close closes the connection and releases its provider session, if any.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.Remote.Release()
	return err
}

// Release releases the connection's provider session, if any, once; the
// call does not wait for the provider.
func (c *Conn) Release() { c.Remote.Release() }

// ResumePoint is where an established connection was made: the upgrade's
// Host and request URI as sent (a discovered provider's
// webSocketDebuggerUrl, a provider's query, a merged client query), and,
// for a session created over a session API, the connect URL its create
// answer gave. Dialling it again reaches the same browser, for as long as
// the provider keeps that browser. It may hold the provider's tokens: it
// is never shown.
type ResumePoint struct {
	ConnectURL string `json:"connect_url,omitempty"`
	Host       string `json:"host"`
	URI        string `json:"uri"`
}

// IsZero reports whether the point is unset.
func (rp ResumePoint) IsZero() bool { return rp.URI == "" }

// Result is what one attempt produced.
type Result struct {
	Outcome Outcome
	// Conn is set on Success.
	Conn *Conn
	// Answer and Body are set for Relay: the provider's answer to pass on.
	Answer *Answer
	Body   []byte
	// WebDriver is set on Success of CreateWebDriver (Conn is nil then).
	WebDriver *WebDriverSession
}

var readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4096) }}

// Connect makes one attempt at p for the client handshake hs: TCP, TLS,
// discovery when configured, the upgrade request and its answer, all within
// p.ConnectTimeout (or ctx's earlier deadline); with a session API, a
// session created first and the connect URL its answer gave dialed. ctx is
// the client's: when it is canceled the attempt stops with ClientGone.
// replace expands request placeholders in header_up values.
func (p *Provider) Connect(ctx context.Context, hs *Handshake, replace func(string) string) (res Result) {
	start := time.Now()
	actx, deadline, cancel := within(ctx, start, p.ConnectTimeout)
	defer cancel()
	defer func() { res.Outcome.Elapsed = time.Since(start) }()
	if p.api != nil {
		return p.api.connect(p, ctx, actx, deadline, hs, replace)
	}
	return p.own().attempt(ctx, actx, deadline, hs, replace)
}

// upgrader is the WebSocket way to a provider's browser, the one beside
// the creators: an upgrade at an endpoint, with what the provider sends at
// every one of its endpoints (header_up, the client's fields it forwards,
// pass_query). The endpoint is the provider's own URL (own), discovered
// first when the provider says so; the connect URL a session API's create
// answer gave; a resume point; or a WebDriver session's socket. It
// creates nothing that must be released: the browser's session is the
// connection.
type upgrader struct {
	p *Provider
	endpoint
	// own: the endpoint is the provider's URL, discovered when
	// p.Discover, its query's option placeholders rendered at each
	// attempt.
	own bool
}

// own is the upgrader at p's own URL.
func (p *Provider) own() *upgrader { return &upgrader{p: p, endpoint: p.endpoint, own: true} }

// attempt is one attempt at u's endpoint, discovered first when it is
// the provider's own and the provider says so, within actx (ctx is the
// client's).
func (u *upgrader) attempt(ctx, actx context.Context, deadline time.Time, hs *Handshake, replace func(string) string) Result {
	path, query, rawQuery, host := u.path, u.query, u.rawQuery, u.host
	if u.own && u.p.optQuery {
		query, rawQuery = renderQuery(query, replace), ""
	}
	if u.own && u.p.Discover {
		dpath, dquery, dhost, r := u.discover(actx, deadline, query, rawQuery, replace)
		if r != nil {
			if r.Outcome.Kind == 0 {
				return errResult(ctx, r.Outcome.Err)
			}
			return *r
		}
		path, query, rawQuery, host = dpath, dquery, "", dhost
	}
	return u.upgrade(ctx, actx, deadline, hs, u.wsTarget(hs, path, query, rawQuery, host), replace)
}

// upgrade dials u's endpoint and sends the upgrade to t, within actx (ctx
// is the client's).
func (u *upgrader) upgrade(ctx, actx context.Context, deadline time.Time, hs *Handshake, t target, replace func(string) string) Result {
	fail := func(err error) Result { return errResult(ctx, err) }
	conn, err := u.dial(actx)
	if err != nil {
		return fail(err)
	}
	ok := false
	defer func() {
		if !ok {
			conn.Close()
		}
	}()
	// Unblock reads and writes at once when the client goes away.
	stop := context.AfterFunc(actx, func() { conn.SetDeadline(aLongTimeAgo) })
	conn.SetDeadline(deadline)

	bp := reqBufPool.Get().(*[]byte)
	req := u.appendRequest((*bp)[:0], hs, t, replace)
	_, err = conn.Write(req)
	*bp = req
	reqBufPool.Put(bp)
	if err != nil {
		stop()
		return fail(err)
	}
	br := readerPool.Get().(*bufio.Reader)
	br.Reset(conn)
	defer func() {
		br.Reset(nil)
		readerPool.Put(br)
	}()
	ans, err := ReadAnswer(br, MaxAnswerHeader)
	if !stop() {
		// The context ended while we read: the deadline is in the past.
		if err == nil {
			err = actx.Err()
		}
		return fail(err)
	}
	if err != nil {
		return fail(err)
	}
	if ans.Status == http.StatusSwitchingProtocols {
		if err := validate101(ans, hs.Key); err != nil {
			word, kind := ClassifyStatus(ans.Status)
			return Result{Outcome: Outcome{Word: word, Kind: kind, Err: err}}
		}
		conn.SetDeadline(time.Time{})
		c := &Conn{Conn: conn, Answer: ans, Point: ResumePoint{Host: t.host, URI: t.requestURI}}
		if n := br.Buffered(); n > 0 {
			c.Leftover = make([]byte, n)
			br.Read(c.Leftover)
		}
		ok = true
		return Result{Outcome: Outcome{Word: WordOK, Kind: Success}, Conn: c}
	}
	return answerResult(ans, br, fmt.Errorf("provider answered %d", ans.Status))
}

// answerResult classifies a non-101 answer; for Relay it reads up to
// MaxRelayedBody of the body (the connection's deadline still applies).
func answerResult(ans *Answer, br *bufio.Reader, cause error) Result {
	word, kind := ClassifyStatus(ans.Status)
	r := Result{Outcome: Outcome{Word: word, Kind: kind, Refused: refusedWith(ans.Status), Err: cause}}
	switch kind {
	case Capacity:
		r.Outcome.RetryAfter = ParseRetryAfter(ans.Header.Get("Retry-After"), time.Now())
	case Relay:
		r.Answer = ans
		r.Body, _ = readBody(ans, br)
	}
	return r
}

// readBody reads at most MaxRelayedBody bytes of an answer's body.
func readBody(ans *Answer, br *bufio.Reader) ([]byte, error) {
	var body io.Reader = br
	if te := ans.Header.Get("Transfer-Encoding"); te != "" {
		if !strings.EqualFold(te, "chunked") {
			return nil, nil
		}
		body = httputil.NewChunkedReader(br)
	} else if cl := ans.Header.Get("Content-Length"); cl != "" {
		n, err := strconv.ParseInt(cl, 10, 64)
		if err != nil || n < 0 {
			return nil, nil
		}
		body = io.LimitReader(br, n)
	}
	b, err := io.ReadAll(io.LimitReader(body, MaxRelayedBody))
	return b, err
}

var reqBufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// validate101 checks a 101 answer to a handshake with key.
func validate101(a *Answer, key string) error {
	if !headerHasToken(a.Header, "Upgrade", "websocket") {
		return fmt.Errorf("%w: 101 without Upgrade: websocket", errBadHandshake)
	}
	if !headerHasToken(a.Header, "Connection", "upgrade") {
		return fmt.Errorf("%w: 101 without Connection: upgrade", errBadHandshake)
	}
	if got := a.Header.Values("Sec-Websocket-Accept"); len(got) != 1 || got[0] != AcceptFor(key) {
		return fmt.Errorf("%w: wrong Sec-WebSocket-Accept", errBadHandshake)
	}
	return nil
}

// dial opens TCP (and TLS for wss) to u's endpoint inside ctx.
func (u *upgrader) dial(ctx context.Context) (net.Conn, error) {
	return dialTo(ctx, u.address, u.tlsConfig)
}

// dialTo opens TCP to address inside ctx, and TLS with cfg when it is not
// nil.
func dialTo(ctx context.Context, address string, cfg *tls.Config) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, err
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if cfg == nil {
		return conn, nil
	}
	tconn := tls.Client(conn, cfg)
	if err := tconn.HandshakeContext(ctx); err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(err, io.EOF) || isTimeout(err) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", errTLS, err)
	}
	return tconn, nil
}

// discoveryAnswer is the part of Chrome's /json/version the gateway reads.
type discoveryAnswer struct {
	WebSocketDebuggerURL string `json:"webSocketDebuggerUrl"`
}

// discover GETs the provider's /json/version and returns the path and query
// of its webSocketDebuggerUrl, and the Host header the provider accepted
// (the upgrade must use it too: Chrome applies the same Host check to the
// WebSocket upgrade as to /json/*). A nil *Result means success; a Result
// with a zero Kind carries a transport error to classify.
func (u *upgrader) discover(ctx context.Context, deadline time.Time, query url.Values, rawQuery string, replace func(string) string) (string, url.Values, string, *Result) {
	host := u.host
	for try := 0; try < 2; try++ {
		status, ans, body, remote, err := u.discoveryGET(ctx, deadline, host, query, rawQuery, replace)
		if err != nil {
			return "", nil, "", &Result{Outcome: Outcome{Err: err}}
		}
		if status == http.StatusOK {
			var da discoveryAnswer
			if err := json.Unmarshal(body, &da); err != nil || da.WebSocketDebuggerURL == "" {
				return "", nil, "", &Result{Outcome: Outcome{Word: WordBadDiscovery, Kind: Failure,
					Err: fmt.Errorf("%w: no webSocketDebuggerUrl", errBadDiscovery)}}
			}
			wu, err := url.Parse(da.WebSocketDebuggerURL)
			if err != nil || wu.Path == "" {
				return "", nil, "", &Result{Outcome: Outcome{Word: WordBadDiscovery, Kind: Failure,
					Err: fmt.Errorf("%w: unusable webSocketDebuggerUrl", errBadDiscovery)}}
			}
			q := wu.Query()
			for k, v := range query {
				if _, ok := q[k]; !ok {
					q[k] = v
				}
			}
			return wu.EscapedPath(), q, host, nil
		}
		// Chrome answers /json/* only when Host is an IP or localhost:
		// retry once with the address actually dialed.
		if try == 0 && status == http.StatusInternalServerError && bytes.Contains(body, []byte("Host header")) && remote != "" {
			host = remote
			continue
		}
		if status < 400 {
			return "", nil, "", &Result{Outcome: Outcome{Word: WordBadDiscovery, Kind: Failure,
				Err: fmt.Errorf("%w: status %d", errBadDiscovery, status)}}
		}
		r := answerResult(ans, bufio.NewReader(bytes.NewReader(nil)), fmt.Errorf("discovery answered %d", status))
		if r.Outcome.Kind == Relay {
			r.Body = body
		}
		return "", nil, "", &r
	}
	return "", nil, "", &Result{Outcome: Outcome{Word: WordBadDiscovery, Kind: Failure, Err: errBadDiscovery}}
}

// discoveryGET performs GET <path>/json/version with the given Host header.
// remote is the dialed address, usable as a Host header Chrome accepts.
func (u *upgrader) discoveryGET(ctx context.Context, deadline time.Time, host string, query url.Values, rawQuery string, replace func(string) string) (status int, ans *Answer, body []byte, remote string, err error) {
	conn, err := u.dial(ctx)
	if err != nil {
		return 0, nil, nil, "", err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(aLongTimeAgo) })
	defer stop()
	conn.SetDeadline(deadline)
	if ra, ok := conn.RemoteAddr().(*net.TCPAddr); ok {
		remote = ra.String()
	}
	path := strings.TrimSuffix(u.path, "/") + "/json/version"
	switch {
	case rawQuery != "":
		path += "?" + rawQuery
	case len(query) > 0:
		path += "?" + query.Encode()
	}
	var b bytes.Buffer
	b.WriteString("GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nAccept: application/json\r\nConnection: close\r\n")
	if u.basicAuth != "" && !u.p.setsAuth {
		b.WriteString("Authorization: " + u.basicAuth + "\r\n")
	}
	for _, op := range u.p.headerOps {
		if op.Op == "delete" || strings.EqualFold(op.Field, "Host") {
			continue
		}
		if v, send := headerValue(op.Value, replace); send {
			b.Write(appendField(nil, op.Field, v))
		}
	}
	b.WriteString("\r\n")
	if _, err := conn.Write(b.Bytes()); err != nil {
		return 0, nil, nil, remote, err
	}
	br := bufio.NewReaderSize(conn, 4096)
	ans, err = ReadAnswer(br, MaxAnswerHeader)
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return 0, nil, nil, remote, err
	}
	body, err = readBody(ans, br)
	if err != nil && ans.Status == http.StatusOK {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return 0, nil, nil, remote, err
	}
	return ans.Status, ans, body, remote, nil
}

// retarget is the upgrader at raw, a URL that a create answer, a resume
// point or a WebDriver session gave (ws, wss, http or https; never
// discovered): the URL's user info, not the provider's, is sent as Basic
// auth. A session API's connect URL must point to a host its
// connect-host policy allows, and be secure after a create call over
// https unless insecure_connect says otherwise.
func (p *Provider) retarget(raw string) (*upgrader, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Hostname() == "" {
		return nil, errors.New("the connect URL is not an absolute URL")
	}
	if p.api != nil && !p.api.hosts.allows(u.Hostname()) {
		// The host is named (never the URL: its query may hold a token).
		return nil, fmt.Errorf("%w: host %q is neither the create call's host, under its domain, nor in connect_hosts", errBadConnectURL, u.Hostname())
	}
	var secure bool
	switch strings.ToLower(u.Scheme) {
	case "ws", "http":
	case "wss", "https":
		secure = true
	default:
		return nil, errors.New("the connect URL must be ws://, wss://, http:// or https://")
	}
	if a := p.api; a != nil && !secure && a.createURL.Scheme == "https" && !a.InsecureConnect {
		// The dial carries header_up values and the URL's user info: a
		// create call over https says they are not meant for clear text.
		return nil, fmt.Errorf("%w: a plain %s:// connect URL after a create call over https (insecure_connect allows it)", errBadConnectURL, strings.ToLower(u.Scheme))
	}
	t := &upgrader{p: p, endpoint: endpointOf(u, secure)}
	if t.path == "" {
		t.path = "/"
	}
	if secure {
		if t.tlsConfig, err = dialTLS(p.tls, u.Hostname()); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// endpoint is where an upgrade goes.
type endpoint struct {
	address   string // host:port to dial
	host      string // Host header value
	path      string // escaped path, never empty once ready
	query     url.Values
	rawQuery  string
	basicAuth string      // "Basic …" from user info, or ""
	tlsConfig *tls.Config // nil: plain TCP
}

// endpointOf is the endpoint of u (secure: over TLS, port 443 by
// default), without its TLS configuration.
func endpointOf(u *url.URL, secure bool) endpoint {
	e := endpoint{host: u.Host, path: u.EscapedPath(), query: u.Query(), rawQuery: u.RawQuery}
	port := u.Port()
	if port == "" {
		port = "80"
		if secure {
			port = "443"
		}
	}
	e.address = net.JoinHostPort(u.Hostname(), port)
	if u.User != nil {
		pw, _ := u.User.Password()
		e.basicAuth = "Basic " + base64.StdEncoding.EncodeToString([]byte(u.User.Username()+":"+pw))
	}
	return e
}
