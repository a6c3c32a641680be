package upstreams

// The REST session API's creator: a create call before each attempt,
// the connect URL of its answer dialed, the session released by its
// release call; and the list call the reaper reads.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// sessionAPI is a SessionAPI checked and ready.
type sessionAPI struct {
	SessionAPI
	createURL  *url.URL
	optQuery   bool     // createURL's query holds option placeholders
	listURL    *url.URL // nil without a list call
	body       any      // parsed template, nil for none
	hasBody    bool
	relBody    any
	hasRelBody bool
	client     *http.Client
	books      *Books
	rel        *Releaser
	provider   string
	hosts      hostRule
	// idInPath: the release URL holds {session_id} before its query, so
	// a refused ID cannot be released safely.
	idInPath bool
}

// newSessionAPI readies a, its placeholders resolved, for provider p (its
// URL resolves relative call URLs; its TLS options apply to the calls),
// counting in d.Books and releasing with d.Releaser (nil: its own).
func newSessionAPI(p *Provider, a SessionAPI, d Defaults) (*sessionAPI, error) {
	// Checked as given by Validate; what the placeholders gave, now.
	if err := ValidateSessionAPI(a); err != nil {
		return nil, err
	}
	books, rel := d.Books, d.Releaser
	if books == nil {
		books = &Books{}
	}
	if rel == nil {
		rel = NewReleaser()
	}
	s := &sessionAPI{SessionAPI: a, books: books, rel: rel, provider: p.Name}
	base := &url.URL{Scheme: p.httpScheme, Host: p.host}
	var err error
	if s.createURL, err = resolveCall(base, a.CreateURL); err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	s.hosts = newHostRule(s.createURL.Hostname(), a.ConnectHosts)
	s.optQuery = queryHasOptions(s.createURL.Query())
	relPath, _, _ := strings.Cut(a.ReleaseURL, "?")
	s.idInPath = strings.Contains(relPath, SessionIDPlaceholder)
	if _, err := resolveCall(base, strings.ReplaceAll(a.ReleaseURL, SessionIDPlaceholder, "x")); err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	if a.ListURL != "" {
		if s.listURL, err = resolveCall(base, a.ListURL); err != nil {
			return nil, fmt.Errorf("list: %w", err)
		}
	}
	if a.Body != "" {
		s.hasBody = true
		json.Unmarshal([]byte(a.Body), &s.body)
	}
	if a.ReleaseBody != "" {
		s.hasRelBody = true
		json.Unmarshal([]byte(a.ReleaseBody), &s.relBody)
	}
	tr := d.APITransport
	if o := p.tls; s.createURL.Scheme == "https" && o != nil && (o.InsecureSkipVerify || len(o.TrustedCACertFiles) > 0) {
		cfg, err := o.Config(s.createURL.Hostname())
		if err != nil {
			return nil, err
		}
		tr = NewAPITransport()
		tr.TLSClientConfig = cfg
	} else if tr == nil {
		tr = NewAPITransport()
	}
	s.client = &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		// A redirect could carry the API key elsewhere.
		return http.ErrUseLastResponse
	}}
	return s, nil
}

// NewAPITransport is a transport for session API calls: no proxy from the
// environment, and idle connections kept only briefly (a create comes per
// attempt, a release per session).
func NewAPITransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.MaxIdleConnsPerHost = 16
	tr.IdleConnTimeout = 5 * time.Second
	return tr
}

func resolveCall(base *url.URL, s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("invalid URL (%s)", urlErrorCause(err))
	}
	u = base.ResolveReference(u)
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("URL must be http:// or https://, or a path starting with /")
	}
	return u, nil
}

// HasSessionAPI reports whether the provider creates its sessions over a
// session API.
func (p *Provider) HasSessionAPI() bool { return p.api != nil }

// ReapsUntracked reports whether the provider's listed sessions that no
// ledger names are to be released (reap_untracked).
func (p *Provider) ReapsUntracked() bool {
	return p.api != nil && p.api.ReapUntracked && p.api.listURL != nil
}

// ListSessions makes the provider's list call (headers resolved with known,
// without a request) and returns the session IDs its answer names. Errors
// never show a header, a URL or the answer's body.
func (p *Provider) ListSessions(ctx context.Context, known func(string) string) ([]string, error) {
	a := p.api
	if a == nil || a.listURL == nil {
		return nil, errors.New("no list call")
	}
	headers, _ := a.prepare(known)
	req, err := http.NewRequestWithContext(ctx, a.ListMethod, a.listURL.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	setHeaders(req, headers, false)
	resp, err := a.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("list: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		io.Copy(io.Discard, io.LimitReader(resp.Body, MaxRelayedBody))
		return nil, fmt.Errorf("list answered %d", resp.StatusCode)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, MaxCreateAnswer+1))
	if err != nil || len(raw) > MaxCreateAnswer {
		return nil, errors.New("list: the answer is cut short or larger than the read limit")
	}
	var doc any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, errors.New("list: the answer is not JSON")
	}
	items := doc
	if a.ListIDs != "" {
		var ok bool
		if items, ok = pointerValue(doc, a.ListIDs); !ok {
			return nil, fmt.Errorf("list: nothing at %s", a.ListIDs)
		}
	}
	arr, ok := items.([]any)
	if !ok {
		return nil, errors.New("list: the sessions are not an array")
	}
	var ids []string
	for _, e := range arr {
		switch v := e.(type) {
		case string:
			ids = append(ids, v)
		case json.Number:
			ids = append(ids, v.String())
		default:
			if id, ok := pointer(e, a.SessionID); ok {
				ids = append(ids, id)
			}
		}
	}
	return ids, nil
}

// created is the result of a create call.
type created struct {
	remote     *Remote
	connectURL string
	res        *Result // set when create did not give a usable session
}

// prepare resolves the create call's headers and body for one attempt
// (request placeholders are read now, on the request's goroutine).
func (a *sessionAPI) prepare(replace func(string) string) ([]Header, []byte) {
	if replace == nil {
		replace = func(s string) string { return s }
	}
	headers := make([]Header, 0, len(a.Headers))
	for _, h := range a.Headers {
		if v, ok := headerValue(h.Value, replace); ok {
			headers = append(headers, Header{Field: h.Field, Value: v})
		}
	}
	var body []byte
	if a.hasBody {
		body = fill(a.body, replace)
	}
	return headers, body
}

// createTarget is the create call's URL for one attempt: session options
// in its query rendered by replace (an item that renders empty is left
// out).
func (a *sessionAPI) createTarget(replace func(string) string) string {
	if !a.optQuery {
		return a.createURL.String()
	}
	u := *a.createURL
	u.RawQuery = renderQuery(u.Query(), replace).Encode()
	return u.String()
}

// create makes the create call within ctx. A session the provider created
// is never lost: when the answer cannot be used but names a session ID, the
// session is released at once; when a 2xx answer names none the gateway
// can read, it is counted as an orphan.
func (a *sessionAPI) create(ctx context.Context, target string, headers []Header, payload []byte) created {
	var body io.Reader
	if a.hasBody {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, a.CreateMethod, target, body)
	if err != nil {
		return created{res: &Result{Outcome: Outcome{Err: fmt.Errorf("create: %w", err)}}}
	}
	setHeaders(req, headers, a.hasBody)
	resp, err := a.client.Do(req)
	if err != nil {
		// url.Error names the URL: keep only its cause.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return created{res: &Result{Outcome: Outcome{Err: fmt.Errorf("create: %w", err)}}}
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		io.Copy(io.Discard, io.LimitReader(resp.Body, MaxRelayedBody))
		word, kind := ClassifyStatus(resp.StatusCode)
		r := Result{Outcome: Outcome{Word: word, Kind: kind, Refused: refusedWith(resp.StatusCode), Err: fmt.Errorf("create answered %d", resp.StatusCode)}}
		if kind == Capacity {
			r.Outcome.RetryAfter = ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
		} else {
			r.Outcome.Word, r.Outcome.Kind = WordCreateFailed, Failure
		}
		return created{res: &r}
	}
	// One byte more than the limit tells an answer at the limit from a
	// larger one.
	raw, rerr := io.ReadAll(io.LimitReader(resp.Body, MaxCreateAnswer+1))
	// fault is why the answer cannot be used ("" when it can).
	var fault string
	switch {
	case rerr != nil:
		fault = "the answer was cut short"
	case len(raw) > MaxCreateAnswer:
		fault = fmt.Sprintf("the answer is larger than %d bytes", MaxCreateAnswer)
		raw = raw[:MaxCreateAnswer]
	}
	var doc any
	if fault == "" {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&doc); err != nil {
			fault = "the answer is not JSON"
		}
	}
	failed := func(why string) created {
		if rerr != nil {
			return created{res: &Result{Outcome: Outcome{Err: fmt.Errorf("create: reading the answer: %w", rerr)}}}
		}
		return created{res: &Result{Outcome: Outcome{Word: WordBadCreate, Kind: Failure, Err: fmt.Errorf("%w: %s", errBadCreate, why)}}}
	}
	var id string
	var ok bool
	if fault == "" {
		id, ok = pointer(doc, a.SessionID)
	} else {
		// What was read may still name the session.
		id, ok = findPointer(raw, a.SessionID)
	}
	if !ok {
		why := fault
		if why == "" {
			why = "no session ID at " + a.SessionID
		} else {
			why += ", and no session ID at " + a.SessionID + " could be read"
		}
		a.orphan(why)
		return failed(why)
	}
	if err := CheckSessionID(id); err != nil {
		// A release call would name something else than the session; it
		// is made only where the ID is escaped whole (a query, a body).
		if a.idInPath {
			a.orphan(fmt.Sprintf("%v (at %s), and the release URL holds it in its path", err, a.SessionID))
		} else {
			a.books.Created.Add(1)
			(&Remote{api: a, id: id, headers: headers}).Release()
		}
		if rerr != nil {
			return failed("")
		}
		return created{res: &Result{Outcome: Outcome{Word: WordBadSessionID, Kind: Failure, Err: fmt.Errorf("%w: %w", errBadCreate, err)}}}
	}
	r := &Remote{api: a, id: id, headers: headers}
	a.books.Created.Add(1)
	if fault != "" {
		r.Release()
		return failed(fault)
	}
	cu, ok := pointer(doc, a.ConnectURL)
	if !ok {
		r.Release()
		return failed("no connect URL at " + a.ConnectURL)
	}
	if l := a.rel.Ledger; l != nil {
		// Never a dial without an entry: a session the ledger does not
		// name would outlive a crash of this process.
		if err := l.Record(ctx, a.provider, id); err != nil {
			a.rel.ledgerError(a.provider, err)
			r.Release()
			return created{res: &Result{Outcome: Outcome{Word: WordLedger, Kind: Gateway, Err: err}}}
		}
		r.recorded = true
	}
	return created{remote: r, connectURL: cu}
}

// orphan books a session a 2xx create answer may have made that cannot be
// released (its ID unknown), and tells its releaser's OnOrphan.
func (a *sessionAPI) orphan(why string) {
	a.books.Orphans.Add(1)
	if f := a.rel.OnOrphan; f != nil {
		f(a.provider, why)
	}
}

func setHeaders(req *http.Request, headers []Header, hasBody bool) {
	req.Header.Set("Accept", "application/json")
	if hasBody {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, h := range headers {
		if strings.EqualFold(h.Field, "Host") {
			req.Host = h.Value
			continue
		}
		req.Header.Set(h.Field, h.Value)
	}
}

// releaseURL is the release call's URL for session id: {session_id} is
// replaced by id escaped as one path segment before the "?", and as one
// query value after it, so that the ID can neither climb the path nor add
// query items.
func (a *sessionAPI) releaseURL(id string) string {
	path, query, hasQuery := strings.Cut(a.ReleaseURL, "?")
	s := strings.ReplaceAll(path, SessionIDPlaceholder, url.PathEscape(id))
	if hasQuery {
		s += "?" + strings.ReplaceAll(query, SessionIDPlaceholder, url.QueryEscape(id))
	}
	return s
}

// connectAPI is one attempt at a provider with a session API: create,
// then dial the connect URL of the answer, all within actx. The created
// session goes with the connection on success and is released on every
// other end. From the create call's start until what it created is
// settled (released, or handed to the connection) the attempt counts as
// pending for WaitReleases; once StopCreates is called no create starts,
// and a session created after it is released, not dialed.
func (p *Provider) connectAPI(ctx, actx context.Context, deadline time.Time, hs *Handshake, replace func(string) string) Result {
	fail := func(err error) Result {
		word, kind := ClassifyError(err, errors.Is(ctx.Err(), context.Canceled))
		return Result{Outcome: Outcome{Word: word, Kind: kind, Err: err}}
	}
	settled, ok := p.api.rel.startCreate()
	if !ok {
		return stoppedResult()
	}
	defer func() {
		if settled != nil {
			settled()
		}
	}()
	headers, body := p.api.prepare(replace)
	target := p.api.createTarget(replace)
	// The call is not cut when the attempt ends: a session created after
	// that is still learnt and released.
	cctx, ccancel := context.WithDeadline(context.WithoutCancel(ctx), deadline.Add(p.api.rel.CreateGrace))
	answer := make(chan created, 1)
	go func() {
		defer ccancel()
		answer <- p.api.create(cctx, target, headers, body)
	}()
	var c created
	select {
	case c = <-answer:
	case <-actx.Done():
		done := settled
		settled = nil
		go func() {
			// Release first: the release is pending before the create
			// stops being so.
			(<-answer).remote.Release()
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
	if p.api.rel.CreatesStopped() {
		c.remote.Release()
		return stoppedResult()
	}
	t, err := p.retarget(c.connectURL)
	if err != nil {
		c.remote.Release()
		word := WordBadCreate
		if errors.Is(err, errBadConnectURL) {
			word = WordBadConnectURL
		}
		return Result{Outcome: Outcome{Word: word, Kind: Failure, Err: fmt.Errorf("%w: %w", errBadCreate, err)}}
	}
	res := t.attempt(ctx, actx, deadline, hs, replace)
	// The session was started, whatever its upgrade is answered.
	res.Outcome.Refused = 0
	if res.Outcome.Kind == Success {
		res.Conn.Remote = c.remote
		res.Conn.Point.ConnectURL = c.connectURL
		if p.api.rel.CreatesStopped() {
			res.Conn.Close() // releases the session
			return stoppedResult()
		}
	} else {
		c.remote.Release()
	}
	return res
}

// retarget returns a copy of p that dials raw, the connect URL a create
// answer gave (ws, wss, http or https; never discovered).
func (p *Provider) retarget(raw string) (*Provider, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Hostname() == "" {
		return nil, errors.New("the connect URL is not an absolute URL")
	}
	if p.api != nil && !p.api.hosts.allows(u.Hostname()) {
		// The host is named (never the URL: its query may hold a token).
		return nil, fmt.Errorf("%w: host %q is neither the create call's host, under its domain, nor in connect_hosts", errBadConnectURL, u.Hostname())
	}
	t := *p
	t.api, t.Discover, t.tlsConfig, t.optQuery = nil, false, nil, false
	switch strings.ToLower(u.Scheme) {
	case "ws", "http":
		t.scheme, t.httpScheme = "ws", "http"
	case "wss", "https":
		t.scheme, t.httpScheme = "wss", "https"
	default:
		return nil, errors.New("the connect URL must be ws://, wss://, http:// or https://")
	}
	if a := p.api; a != nil && t.scheme == "ws" && a.createURL.Scheme == "https" && !a.InsecureConnect {
		// The dial carries header_up values and the URL's user info: a
		// create call over https says they are not meant for clear text.
		return nil, fmt.Errorf("%w: a plain %s:// connect URL after a create call over https (insecure_connect allows it)", errBadConnectURL, strings.ToLower(u.Scheme))
	}
	t.host = u.Host
	port := u.Port()
	if port == "" {
		port = "80"
		if t.scheme == "wss" {
			port = "443"
		}
	}
	t.address = net.JoinHostPort(u.Hostname(), port)
	t.path = u.EscapedPath()
	if t.path == "" {
		t.path = "/"
	}
	t.rawQuery, t.query = u.RawQuery, u.Query()
	t.basicAuth = ""
	if u.User != nil {
		pw, _ := u.User.Password()
		t.basicAuth = "Basic " + base64.StdEncoding.EncodeToString([]byte(u.User.Username()+":"+pw))
	}
	if t.scheme == "wss" {
		if t.tlsConfig, err = p.dialTLS(u.Hostname()); err != nil {
			return nil, err
		}
	}
	return &t, nil
}
