package upstreams

// The WebDriver creator: which webdriver providers may take a create
// request, the create (POST <base>/session) inside the attempt's
// deadline, its answer classified, the session released with DELETE; the
// credentials and capabilities every call to the provider carries.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/browserfailover/caddy-browser-failover/options"
)

// webDriver is what a webdriver provider has besides the common parts: the
// WebDriver creator, whose sessions are made with POST <base>/session and
// released with DELETE <base>/session/<id>, and what every call to the
// provider carries.
type webDriver struct {
	sessionKeeper
	base     string   // scheme://host[:port][/base], without user info or a trailing slash
	origin   *url.URL // scheme://host[:port]
	query    string   // the provider URL's raw query ("": none)
	host     string   // the configured host name, for loopback socket URLs
	addr     string   // the configured host[:port], in lower case
	browsers []string
	caps     any      // the capabilities template, load placeholders resolved (nil: none)
	release  string   // DELETE's URL, {session_id} for the ID
	hosts    hostRule // where socket URLs may point
	// auth and ops are the provider's: its URL's user info as Basic auth
	// ("": none) and its header_up operations.
	auth string
	ops  []HeaderOp
}

// newWebDriver readies the webdriver side of p, configured at u (its
// placeholders resolved) with c's options; d gives the books and the
// releaser (nil: its own).
func newWebDriver(p *Provider, u *url.URL, c Config, d Defaults, known func(string) string) (*webDriver, error) {
	basePath := strings.TrimRight(u.EscapedPath(), "/")
	w := &webDriver{
		base:     p.httpScheme + "://" + u.Host + basePath,
		origin:   &url.URL{Scheme: p.httpScheme, Host: u.Host},
		query:    u.RawQuery,
		host:     u.Hostname(),
		addr:     asciiLower(u.Host),
		browsers: c.Browsers,
		hosts:    newHostRule(u.Hostname(), nil),
		auth:     p.basicAuth,
		ops:      p.headerOps,
	}
	if hasCapabilities(c.Capabilities) {
		var t any
		if err := json.Unmarshal(c.Capabilities, &t); err != nil {
			return nil, errors.New("capabilities must be a JSON object")
		}
		dec := json.NewDecoder(bytes.NewReader(fill(t, known)))
		dec.UseNumber()
		if err := dec.Decode(&w.caps); err != nil {
			return nil, errors.New("capabilities must be a JSON object")
		}
	}
	tr := &http.Transport{
		Proxy:                  nil, // never one from the environment
		DialContext:            (&net.Dialer{Timeout: p.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:    p.ConnectTimeout,
		MaxIdleConnsPerHost:    64,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: MaxAnswerHeader,
		// Bodies go back to the client as the provider sent them.
		DisableCompression: true,
		ForceAttemptHTTP2:  true,
	}
	if p.httpScheme == "https" {
		cfg, err := p.tls.Config(u.Hostname())
		if err != nil {
			return nil, err
		}
		tr.TLSClientConfig = cfg
	}
	client := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		// A redirect could carry the credentials elsewhere.
		return http.ErrUseLastResponse
	}}
	w.release = basePath + "/session/" + SessionIDPlaceholder
	if w.query != "" {
		w.release += "?" + w.query
	}
	// DELETE names the session in its path: an ID CheckSessionID refuses
	// is never sent.
	w.sessionKeeper = newSessionKeeper(p.Name, client, d, true, "DELETE names it in its path")
	return w, nil
}

// url is the provider's URL for path (escaped, after the base), with
// rawQuery and the provider's own query merged (its keys win).
func (w *webDriver) url(path, rawQuery string) string {
	u := w.base + path
	switch {
	case w.query == "" && rawQuery == "":
	case w.query == "":
		u += "?" + rawQuery
	case rawQuery == "":
		u += "?" + w.query
	default:
		q, err := url.ParseQuery(rawQuery)
		pq, _ := url.ParseQuery(w.query)
		if err != nil {
			q = url.Values{}
		}
		for k, v := range pq {
			q[k] = v
		}
		u += "?" + q.Encode()
	}
	return u
}

// header is what every call to the provider carries: the URL's user info
// as Basic auth, then the header_up operations, their values resolved
// with replace; with replace nil (no request to read) an operation whose
// value holds a placeholder is left out. A value with a line break is
// left out too.
func (w *webDriver) header(replace func(string) string) http.Header {
	h := http.Header{}
	if w.auth != "" {
		h.Set("Authorization", w.auth)
	}
	for _, op := range w.ops {
		if replace == nil && strings.Contains(op.Value, "{") {
			continue
		}
		v, send := headerValue(op.Value, replace)
		if (!send && op.Op != "delete") || strings.ContainsAny(v, "\r\n") {
			continue
		}
		switch op.Op {
		case "set":
			h.Set(op.Field, v)
		case "add":
			h.Add(op.Field, v)
		case "delete":
			h.Del(op.Field)
		}
	}
	return h
}

// headerList is h as a release call's fields, the values of one field
// joined.
func headerList(h http.Header) []Header {
	out := make([]Header, 0, len(h))
	for k, vs := range h {
		out = append(out, Header{Field: k, Value: strings.Join(vs, ", ")})
	}
	return out
}

// capsFor is the provider's capabilities for one create, request
// placeholders resolved with replace (nil: none), and their string
// values, which are secrets.
func (w *webDriver) capsFor(replace func(string) string) (map[string]json.RawMessage, []string) {
	if w.caps == nil {
		return nil, nil
	}
	if replace == nil {
		replace = func(s string) string { return s }
	}
	var out map[string]json.RawMessage
	json.Unmarshal(fill(w.caps, replace), &out)
	var secrets []string
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			if _, opt := options.Whole(x); !opt {
				// (A session option is what the client asked for, not
				// a secret.)
				secrets = append(secrets, replace(x))
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(w.caps)
	return out, secrets
}

// CreateWebDriver makes one create attempt at p: POST <base>/session with
// r's capabilities (the provider's capabilities merged into alwaysMatch,
// their request placeholders and header_up's resolved with replace), the
// provider's credentials, within p.ConnectTimeout (or ctx's earlier
// deadline). The answer is classified: 2xx with a string value.sessionId
// is Success (Result.WebDriver); a 5xx "session not created" saying the
// provider is full is Capacity (WordFull, no Retry-After), any other is
// Declined (WordNotCreated, with the answer as for Relay); 408 and 429
// are Capacity with their Retry-After; other 5xx, 401, 403, 1xx, 3xx,
// transport errors and a 2xx without a usable session ID are Failure;
// other 4xx are Relay (Result.Answer with its Content-Type, Result.Body);
// a ctx canceled first is ClientGone. The call goes on after the attempt
// gave up (within the releaser's CreateGrace), so that a session created
// late is still deleted; a session created is written to the releaser's
// ledger before it is handed on.
func (p *Provider) CreateWebDriver(ctx context.Context, r *CreateRequest, replace func(string) string) (res Result) {
	start := time.Now()
	defer func() { res.Outcome.Elapsed = time.Since(start) }()
	w := p.wd
	if w == nil || r == nil {
		return Result{Outcome: Outcome{Word: WordBadCreate, Kind: Gateway, Err: fmt.Errorf("provider %q is not a webdriver provider", p.Name)}}
	}
	actx, deadline, cancel := within(ctx, start, p.ConnectTimeout)
	defer cancel()
	cc, header, secrets := w.createCall(r, replace)
	return createWithin(ctx, actx, deadline, w, cc, func(m made) Result {
		return Result{Outcome: Outcome{Word: WordOK, Kind: Success}, WebDriver: w.session(m, header, secrets)}
	})
}

// createCall is the create call of one attempt: r with the provider's
// capabilities merged in, their request placeholders and header_up's
// resolved with replace. header is what every call of the session
// carries, secrets the provider's capability values.
func (w *webDriver) createCall(r *CreateRequest, replace func(string) string) (cc createCall, header http.Header, secrets []string) {
	header = w.header(replace)
	caps, secrets := w.capsFor(replace)
	h := header.Clone()
	h.Set("Accept", "application/json")
	h.Set("Content-Type", "application/json; charset=utf-8")
	cc = createCall{
		call:    call{method: http.MethodPost, url: w.url("/session", ""), header: h, body: r.body(caps)},
		release: headerList(header),
	}
	return cc, header, secrets
}

// refused is the outcome of a create answered with a status other than
// 2xx (see classifyWebDriverCreate), of which it reads MaxRelayedBody
// bytes.
func (w *webDriver) refused(resp *http.Response) Result {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, MaxRelayedBody))
	// What is left, within bounds, so that the connection is kept.
	io.Copy(io.Discard, io.LimitReader(resp.Body, MaxRelayedBody))
	return classifyWebDriverCreate(resp.StatusCode, resp.Header, b)
}

// wdAnswer is what the WebDriver creator keeps of a create answer: all of
// it, for the client (WebDriverSession.Answer), and its value object.
type wdAnswer struct {
	raw   []byte
	value map[string]json.RawMessage
}

// read reads a create answer: the session ID at value.sessionId, a
// string; or, in an answer that cannot be used, wherever WebDriver puts
// it, or the older JSON wire protocol did.
func (w *webDriver) read(raw []byte, fault string) answer {
	var ans struct {
		Value map[string]json.RawMessage `json:"value"`
	}
	var id string
	if fault == "" {
		if json.Unmarshal(raw, &ans) != nil || ans.Value == nil {
			fault = "the answer is not a JSON object with a value object"
		} else if json.Unmarshal(ans.Value["sessionId"], &id) != nil || id == "" {
			fault = "the answer has no string value.sessionId"
		}
	}
	if fault != "" {
		var ok bool
		if id, ok = findPointer(raw, "/value/sessionId"); !ok {
			id, ok = findPointer(raw, "/sessionId")
		}
		if !ok {
			return answer{noID: fault + ", and no session ID could be read"}
		}
	}
	return answer{id: id, idAt: "value.sessionId", fault: fault, kept: wdAnswer{raw: raw, value: ans.Value}}
}

// releaseCall is DELETE <base>/session/<id>.
func (w *webDriver) releaseCall(id string, fields []Header) (call, error) {
	u, err := idURL(w.origin, w.release, id)
	if err != nil {
		return call{}, err
	}
	return call{method: http.MethodDelete, url: u, header: fieldsHeader(fields, false)}, nil
}

// adoptedFields are the provider's credentials: its header_up values
// were resolved when the config loaded, and one that needs a request's
// placeholders is left out.
func (w *webDriver) adoptedFields(func(string) string) []Header {
	return headerList(w.header(nil))
}

// classifyWebDriverCreate is the outcome of a create answered with a
// status other than 2xx, and body (its first MaxRelayedBody bytes).
func classifyWebDriverCreate(status int, h http.Header, body []byte) Result {
	code, _ := findPointer(body, "/value/error")
	if _, known := webDriverStatus[code]; !known {
		code = "" // not shown: it is the provider's text
	}
	cause := fmt.Errorf("create answered %d", status)
	if code != "" {
		cause = fmt.Errorf("create answered %d (%s)", status, code)
	}
	r := Result{Outcome: Outcome{Word: StatusWord(status), Kind: Failure, Refused: refusedWith(status), Err: cause}}
	switch {
	case status == http.StatusRequestTimeout, status == http.StatusTooManyRequests:
		r.Outcome.Kind = Capacity
		r.Outcome.RetryAfter = ParseRetryAfter(h.Get("Retry-After"), time.Now())
	case status == http.StatusUnauthorized, status == http.StatusForbidden:
	case status >= 500:
		if code != ErrCodeSessionNotCreated {
			break
		}
		if msg, _ := findPointer(body, "/value/message"); saysFull(msg) {
			r.Outcome.Word, r.Outcome.Kind = WordFull, Capacity
			break
		}
		// Not these capabilities, here: the client may get the answer.
		r.Outcome.Word, r.Outcome.Kind = WordNotCreated, Declined
		r.Answer, r.Body = relayedAnswer(status, h), body
	case status >= 400:
		r.Outcome.Kind = Relay
		r.Answer, r.Body = relayedAnswer(status, h), body
	}
	return r
}

// relayedAnswer is a create answer of status with header h as the client
// gets it: its status and Content-Type.
func relayedAnswer(status int, h http.Header) *Answer {
	a := &Answer{Status: status, Header: http.Header{}}
	if ct := h.Get("Content-Type"); ct != "" {
		a.Header.Set("Content-Type", ct)
	}
	return a
}

// fullPhrases are what providers say when a session was not created for
// want of room (Selenium Grid, Selenoid, Moon, cloud hubs), in lower case.
var fullPhrases = []string{"maximum number of active sessions", "max sessions", "no free slots", "capacity", "queue"}

// saysFull reports whether a "session not created" message says the
// provider is full (ASCII case ignored).
func saysFull(msg string) bool {
	msg = asciiLower(msg)
	for _, p := range fullPhrases {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

// Accepts reports whether p may serve the create request r: some
// alternative (a firstMatch entry merged with alwaysMatch; no firstMatch
// is one empty entry) asks for no browserName, or for one of p's
// browsers (ASCII case ignored). A provider that is not a webdriver one
// accepts none.
func (p *Provider) Accepts(r *CreateRequest) bool {
	if p.wd == nil || r == nil {
		return false
	}
	if len(p.wd.browsers) == 0 {
		return true
	}
	first := r.first
	if len(first) == 0 {
		first = []map[string]json.RawMessage{nil}
	}
	for _, m := range first {
		b := capString(r.always, "browserName")
		if b == "" {
			b = capString(m, "browserName")
		}
		if b == "" {
			return true
		}
		for _, want := range p.wd.browsers {
			if asciiEqualFold(b, want) {
				return true
			}
		}
	}
	return false
}
