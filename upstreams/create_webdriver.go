package upstreams

// The WebDriver creator: a webdriver provider's create (POST
// <base>/session) inside the attempt's deadline, its answer classified,
// the session released with DELETE; the credentials and capabilities
// every call to the provider carries.

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

// webDriver is what a webdriver provider has besides the common parts.
type webDriver struct {
	base     string // scheme://host[:port][/base], without user info or a trailing slash
	query    string // the provider URL's raw query ("": none)
	host     string // the configured host name, for loopback socket URLs
	addr     string // the configured host[:port], in lower case
	browsers []string
	caps     any // the capabilities template, load placeholders resolved (nil: none)
	client   *http.Client
	// api releases its sessions: DELETE <base>/session/{session_id},
	// through the releaser and the ledger, counted in its books.
	api   *sessionAPI
	hosts hostRule // where socket URLs may point
}

// newWebDriver readies the webdriver side of p, configured at u (its
// placeholders resolved) with c's options; d gives the books and the
// releaser (nil: its own).
func newWebDriver(p *Provider, u *url.URL, c Config, d Defaults, known func(string) string) (*webDriver, error) {
	basePath := strings.TrimRight(u.EscapedPath(), "/")
	w := &webDriver{
		base:     p.httpScheme + "://" + u.Host + basePath,
		query:    u.RawQuery,
		host:     u.Hostname(),
		addr:     asciiLower(u.Host),
		browsers: c.Browsers,
		hosts:    newHostRule(u.Hostname(), nil),
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
	w.client = client
	books, rel := d.Books, d.Releaser
	if books == nil {
		books = &Books{}
	}
	if rel == nil {
		rel = NewReleaser()
	}
	release := basePath + "/session/" + SessionIDPlaceholder
	if w.query != "" {
		release += "?" + w.query
	}
	base, _ := url.Parse(w.base) // built from a parsed URL
	w.api = &sessionAPI{
		SessionAPI: SessionAPI{ReleaseMethod: http.MethodDelete, ReleaseURL: release},
		createURL:  base, client: client, books: books, rel: rel, provider: p.Name,
		// DELETE names the session in its path: an ID CheckSessionID
		// refuses is never sent.
		idInPath: true,
	}
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
func (p *Provider) wdHeader(replace func(string) string) http.Header {
	h := http.Header{}
	if p.basicAuth != "" {
		h.Set("Authorization", p.basicAuth)
	}
	for _, op := range p.headerOps {
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

// setHeader puts h on req (a Host field sets the request's Host).
func setHeader(req *http.Request, h http.Header) {
	for k, vs := range h {
		if k == "Host" {
			req.Host = vs[len(vs)-1]
			continue
		}
		req.Header[k] = vs
	}
	req.Header.Set("Accept", "application/json")
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
	fail := func(err error) Result {
		word, kind := ClassifyError(err, errors.Is(ctx.Err(), context.Canceled))
		return Result{Outcome: Outcome{Word: word, Kind: kind, Err: err}}
	}
	deadline := start.Add(p.ConnectTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	actx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	rel := w.api.rel
	settled, ok := rel.startCreate()
	if !ok {
		return stoppedResult()
	}
	defer func() {
		if settled != nil {
			settled()
		}
	}()
	header := p.wdHeader(replace)
	caps, secrets := w.capsFor(replace)
	body := r.body(caps)
	cctx, ccancel := context.WithDeadline(context.WithoutCancel(ctx), deadline.Add(rel.CreateGrace))
	answer := make(chan wdCreated, 1)
	go func() {
		defer ccancel()
		answer <- p.wdCreate(cctx, header, body, secrets)
	}()
	var c wdCreated
	select {
	case c = <-answer:
	case <-actx.Done():
		done := settled
		settled = nil
		go func() {
			// Deleted first: the release is pending before the create
			// stops being so.
			if s := (<-answer).session; s != nil {
				s.Remote.Release()
			}
			done()
		}()
		return fail(actx.Err())
	}
	if c.res != nil {
		if c.res.Outcome.Kind == 0 {
			return fail(c.res.Outcome.Err)
		}
		return *c.res
	}
	if rel.CreatesStopped() {
		c.session.Remote.Release()
		return stoppedResult()
	}
	return Result{Outcome: Outcome{Word: WordOK, Kind: Success}, WebDriver: c.session}
}

// wdCreated is the result of a create call: a session, or res.
type wdCreated struct {
	session *WebDriverSession
	res     *Result // Kind 0: a transport error to classify
}

// wdCreate makes the create call within ctx. A session the provider
// created is never lost: when the answer cannot be used but names a
// session ID, the session is deleted at once; when a 2xx answer names none
// the gateway can read, it is counted as an orphan.
func (p *Provider) wdCreate(ctx context.Context, header http.Header, body []byte, secrets []string) wdCreated {
	w, a := p.wd, p.wd.api
	transport := func(err error) wdCreated {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its text names the URL
		}
		return wdCreated{res: &Result{Outcome: Outcome{Err: fmt.Errorf("create: %w", err)}}}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url("/session", ""), bytes.NewReader(body))
	if err != nil {
		return transport(err)
	}
	setHeader(req, header)
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	resp, err := w.client.Do(req)
	if err != nil {
		return transport(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, MaxRelayedBody))
		// What is left, within bounds, so that the connection is kept.
		io.Copy(io.Discard, io.LimitReader(resp.Body, MaxRelayedBody))
		r := classifyWebDriverCreate(resp.StatusCode, resp.Header, b)
		return wdCreated{res: &r}
	}
	// One byte more than the limit tells an answer at the limit from a
	// larger one.
	raw, rerr := io.ReadAll(io.LimitReader(resp.Body, MaxCreateAnswer+1))
	var fault string // why the answer cannot be used ("": it can)
	switch {
	case rerr != nil:
		fault = "the answer was cut short"
	case len(raw) > MaxCreateAnswer:
		fault = fmt.Sprintf("the answer is larger than %d bytes", MaxCreateAnswer)
		raw = raw[:MaxCreateAnswer]
	}
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
	failed := func(why string) wdCreated {
		if rerr != nil {
			return transport(fmt.Errorf("reading the answer: %w", rerr))
		}
		return wdCreated{res: &Result{Outcome: Outcome{Word: WordBadCreate, Kind: Failure, Err: fmt.Errorf("%w: %s", errBadCreate, why)}}}
	}
	if fault != "" {
		// What was read may still name a session: where WebDriver puts
		// its ID, or where the older JSON wire protocol did.
		var ok bool
		if id, ok = findPointer(raw, "/value/sessionId"); !ok {
			id, ok = findPointer(raw, "/sessionId")
		}
		if !ok {
			a.orphan(fault + ", and no session ID could be read")
			return failed(fault)
		}
	}
	if err := CheckSessionID(id); err != nil {
		a.orphan(fmt.Sprintf("%v (value.sessionId), and DELETE names it in its path", err))
		return wdCreated{res: &Result{Outcome: Outcome{Word: WordBadSessionID, Kind: Failure, Err: fmt.Errorf("%w: %w", errBadCreate, err)}}}
	}
	remote := &Remote{api: a, id: id, headers: headerList(header)}
	a.books.Created.Add(1)
	if fault != "" {
		remote.Release()
		return failed(fault)
	}
	if l := a.rel.Ledger; l != nil {
		// Recorded before it is handed on: a session the ledger does not
		// name would outlive a crash of this process.
		if err := l.Record(ctx, p.Name, id); err != nil {
			a.rel.ledgerError(p.Name, err)
			remote.Release()
			return wdCreated{res: &Result{Outcome: Outcome{Word: WordLedger, Kind: Gateway, Err: err}}}
		}
		remote.recorded = true
	}
	s := &WebDriverSession{ID: id, Remote: remote, answer: raw, header: header, own: map[string]bool{}}
	for k := range capsKeys(w.caps) {
		s.own[k] = true
	}
	var caps map[string]json.RawMessage
	json.Unmarshal(ans.Value["capabilities"], &caps)
	var errs []error
	s.socket, s.hosts, errs = w.takeSocket(capString(caps, "webSocketUrl"), "webSocketUrl", s.hosts, errs)
	s.cdp, s.hosts, errs = w.takeSocket(capString(caps, "se:cdp"), "se:cdp", s.hosts, errs)
	s.sockErr = errors.Join(errs...)
	s.hosts = append(s.hosts, w.addr)
	if pw, ok := userPassword(p.basicAuth); ok {
		secrets = append(secrets, pw...)
	}
	for _, vs := range header {
		secrets = append(secrets, vs...)
	}
	for _, v := range secrets {
		if len(v) >= minSecretLen {
			s.secrets = append(s.secrets, v)
		}
	}
	return wdCreated{session: s}
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
