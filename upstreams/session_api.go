package upstreams

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
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/publicsuffix"

	"github.com/browserfailover/caddy-browser-failover/internal/conf"
)

// Outcome words of a provider session API's create call.
const (
	// WordCreateFailed: create answered a status other than 2xx, 408 or
	// 429.
	WordCreateFailed = "create_failed"
	// WordBadCreate: create answered 2xx with a body that is not JSON, is
	// larger than MaxCreateAnswer, or lacks the connect URL or session ID.
	WordBadCreate = "bad_create"
	// WordBadConnectURL: the connect URL of a create answer points to a
	// host the gateway does not dial with the provider's headers (not the
	// create call's host, not under its registrable domain, not named in
	// ConnectHosts), or is plain (ws://, http://) after a create call over
	// https without InsecureConnect.
	WordBadConnectURL = "bad_connect_url"
	// WordBadSessionID: the session ID of a create answer is refused (see
	// CheckSessionID).
	WordBadSessionID = "bad_session_id"
	// WordLedger: the session created could not be written to the
	// ledger; it was released, not dialed.
	WordLedger = "ledger_failed"
)

// MaxCreateAnswer bounds the create answer the gateway reads. A larger
// answer is a failure (WordBadCreate); the session it names is still
// released when its ID lies within the first MaxCreateAnswer bytes.
const MaxCreateAnswer = 1 << 20

// SessionIDPlaceholder stands for the created session's ID in the release
// URL and body.
const SessionIDPlaceholder = "{session_id}"

// MaxSessionID bounds a provider's session ID, in bytes. Real IDs are
// UUIDs or alike (36 bytes); 1 KiB leaves room for any provider's own
// scheme while keeping a release URL well inside what servers accept
// (8 KiB request lines) and ledger entries and log lines small.
const MaxSessionID = 1024

var (
	errBadCreate     = errors.New("bad create answer")
	errBadConnectURL = errors.New("connect URL refused")
	errBadSessionID  = errors.New("session ID refused")
)

// CheckSessionID refuses a session ID that cannot be trusted to name one
// session in a release call: "." or ".." (a URL path resolves them, so the
// release would go to the sessions collection or the level above it, with
// the API key), one holding a control byte, and one longer than
// MaxSessionID. The error describes the ID without showing it.
func CheckSessionID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: it is empty", errBadSessionID)
	case id == "." || id == "..":
		return fmt.Errorf("%w: it is %q, a URL path's dot segment", errBadSessionID, id)
	case len(id) > MaxSessionID:
		return fmt.Errorf("%w: it is longer than %d bytes", errBadSessionID, MaxSessionID)
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x20 || id[i] == 0x7f {
			return fmt.Errorf("%w: it holds a control byte", errBadSessionID)
		}
	}
	return nil
}

// SessionAPI describes a provider that creates a browser over REST before
// each attempt: create it, dial the WebSocket URL the answer gives, release
// it when the session (or the attempt) ends.
type SessionAPI struct {
	// CreateMethod and CreateURL are the create call, such as POST
	// https://api.example.com/v1/sessions; a URL that is a path is
	// resolved against the provider's URL. Required.
	CreateMethod string `json:"create_method"`
	CreateURL    string `json:"create_url"`
	// Headers go with every create and release call, in order. Values may
	// hold {env.X} (resolved when the config loads) and request
	// placeholders (resolved when the session is created). They are
	// secrets: never shown.
	Headers []Header `json:"headers,omitempty"`
	// Body is the create call's JSON body, as text; placeholders in its
	// strings are replaced (JSON-escaped). Default: no body.
	Body string `json:"body,omitempty"`
	// ConnectURL and SessionID are JSON pointers (RFC 6901) to the
	// WebSocket URL and the session's ID in the create answer, such as
	// /connectUrl and /id. Required.
	ConnectURL string `json:"connect_url"`
	SessionID  string `json:"session_id"`
	// ReleaseMethod and ReleaseURL are the release call; the URL holds
	// {session_id}, replaced by the ID escaped as one path segment, or,
	// after the "?", as one query value. Required.
	ReleaseMethod string `json:"release_method"`
	ReleaseURL    string `json:"release_url"`
	// ReleaseBody is the release call's JSON body, as text; {session_id}
	// in its strings is replaced. Default: no body.
	ReleaseBody string `json:"release_body,omitempty"`
	// ConnectHosts names the hosts, besides the create call's own and
	// those under its registrable domain, that a connect URL may point to
	// (any port): exact names or IP addresses, case-insensitive, or
	// *.example.com for every name under example.com. See
	// ValidateConnectHost. Default: none.
	ConnectHosts []string `json:"connect_hosts,omitempty"`
	// ListMethod and ListURL (list) are a call that lists the provider's
	// live sessions, such as GET /v1/sessions?status=RUNNING, best
	// filtered to those this gateway created (tag them in Body); its
	// headers are Headers. ListIDs (list_ids) is a JSON pointer to the
	// array of sessions in its answer ("": the answer itself); each
	// element is a session ID, or an object holding one at SessionID.
	// Default: no list.
	ListMethod string `json:"list_method,omitempty"`
	ListURL    string `json:"list_url,omitempty"`
	ListIDs    string `json:"list_ids,omitempty"`
	// ReapUntracked (reap_untracked) releases the listed sessions that no
	// ledger entry names, once two reaps in a row found them so. Needs a
	// list. Default: off.
	ReapUntracked bool `json:"reap_untracked,omitempty"`
	// InsecureConnect (insecure_connect) lets a create call made over
	// https answer a plain ws:// or http:// connect URL, which is then
	// dialed with the provider's header_up values (and the URL's user
	// info) in clear text. Default: off (such an answer fails the attempt
	// with bad_connect_url).
	InsecureConnect bool `json:"insecure_connect,omitempty"`
}

// Header is one request header field of a session API call.
type Header struct {
	Field string `json:"field"`
	Value string `json:"value"`
}

// resolved returns the session API with the placeholders known when the
// config loads resolved by known (request placeholders stay).
func (a SessionAPI) resolved(known func(string) string) (SessionAPI, error) {
	a.CreateURL, a.ReleaseURL, a.ListURL = known(a.CreateURL), known(a.ReleaseURL), known(a.ListURL)
	a.Headers = slices.Clone(a.Headers)
	for i := range a.Headers {
		a.Headers[i].Value = known(a.Headers[i].Value)
	}
	var err error
	if a.Body, err = FillJSON(a.Body, known); err != nil {
		return a, fmt.Errorf("body: %w", err)
	}
	if a.ReleaseBody, err = FillJSON(a.ReleaseBody, known); err != nil {
		return a, fmt.Errorf("release_body: %w", err)
	}
	return a, nil
}

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

// Books are a provider's session API counts. They outlive a config load:
// the caller keeps them by provider name (Defaults.Books).
type Books struct {
	// Created: sessions the provider created whose ID the gateway read.
	Created counter
	// Released: sessions whose release the provider accepted (2xx, or 404
	// and 410: already gone).
	Released counter
	// ReleaseFailures: release calls that failed (each retry counts).
	ReleaseFailures counter
	// Orphans: sessions a create answer may have made that the gateway
	// cannot release (a 2xx answer whose session ID could not be read:
	// none at the pointer, not JSON, over MaxCreateAnswer, cut short; or
	// one whose ID CheckSessionID refused while the release URL holds it
	// in its path).
	Orphans counter
	// Reaped: sessions another process created and left behind (their
	// ledger entries adopted) whose release the provider accepted; not in
	// Created nor Released.
	Reaped counter
}

// Unreleased is the number of sessions created and not released yet.
func (b *Books) Unreleased() int64 { return b.Created.Load() - b.Released.Load() }

// ValidateSessionAPI checks a session API's settings (the options create,
// header, body, connect_url, session_id, release, release_body and
// connect_hosts); JSON and the Caddyfile share it. Its error joins
// *conf.Problem values, each message starting with "session_api: ".
func ValidateSessionAPI(a SessionAPI) error {
	var errs []error
	add := func(opt string, missing bool, format string, args ...any) {
		errs = append(errs, &conf.Problem{Options: []string{opt}, Msg: "session_api: " + fmt.Sprintf(format, args...), Whole: missing})
	}
	if a.CreateMethod == "" && a.CreateURL == "" {
		add("create", true, "no create call (create <METHOD> <URL>)")
	} else {
		if err := checkMethod(a.CreateMethod); err != nil {
			add("create", false, "create: %v", err)
		}
		if err := checkCallURL(a.CreateURL); err != nil {
			add("create", false, "create: %v", err)
		}
	}
	if a.ReleaseMethod == "" && a.ReleaseURL == "" {
		add("release", true, "no release call (release <METHOD> <URL with %s>): a created session must be released", SessionIDPlaceholder)
	} else {
		if err := checkMethod(a.ReleaseMethod); err != nil {
			add("release", false, "release: %v", err)
		}
		if err := checkCallURL(a.ReleaseURL); err != nil {
			add("release", false, "release: %v", err)
		} else if !strings.Contains(a.ReleaseURL, SessionIDPlaceholder) {
			add("release", false, "release: the URL must contain %s", SessionIDPlaceholder)
		}
	}
	for _, p := range []struct{ name, v string }{{"connect_url", a.ConnectURL}, {"session_id", a.SessionID}} {
		if p.v == "" {
			add(p.name, true, "no %s (a JSON pointer into the create answer, like /id)", p.name)
		} else if !strings.HasPrefix(p.v, "/") {
			add(p.name, false, "%s: JSON pointer %q must start with /", p.name, p.v)
		}
	}
	for _, b := range []struct{ name, v string }{{"body", a.Body}, {"release_body", a.ReleaseBody}} {
		if b.v != "" && !json.Valid([]byte(b.v)) {
			// Not shown: it may hold a secret.
			add(b.name, false, "%s is not valid JSON", b.name)
		}
	}
	for _, h := range a.Headers {
		if err := CheckFieldName(h.Field); err != nil {
			add("header", false, "header: %v", err)
		}
		if strings.ContainsAny(h.Value, "\r\n") {
			// The value may be a secret: never shown.
			add("header", false, "header %s: the value must not contain a line break", h.Field)
		}
	}
	for _, h := range a.ConnectHosts {
		if err := ValidateConnectHost(h); err != nil {
			add("connect_hosts", false, "connect_hosts: %v", err)
		}
	}
	switch {
	case a.ListMethod == "" && a.ListURL == "":
		if a.ListIDs != "" {
			add("list_ids", true, "list_ids without a list call (list <METHOD> <URL>)")
		}
		if a.ReapUntracked {
			add("reap_untracked", true, "reap_untracked needs a list call (list <METHOD> <URL>)")
		}
	default:
		if err := checkMethod(a.ListMethod); err != nil {
			add("list", false, "list: %v", err)
		}
		if err := checkCallURL(a.ListURL); err != nil {
			add("list", false, "list: %v", err)
		}
		if a.ListIDs != "" && !strings.HasPrefix(a.ListIDs, "/") {
			add("list_ids", false, "list_ids: JSON pointer %q must start with /", a.ListIDs)
		}
	}
	return errors.Join(errs...)
}

func checkMethod(m string) error {
	if m == "" {
		return errors.New("no method")
	}
	for _, r := range m {
		if r < 'A' || r > 'Z' {
			return fmt.Errorf("method %q must be upper-case letters, like POST", m)
		}
	}
	return nil
}

// checkCallURL accepts an http(s) URL or a path starting with "/". A
// placeholder as a whole is accepted (checked once resolved).
func checkCallURL(s string) error {
	switch {
	case s == "":
		return errors.New("no URL")
	case strings.HasPrefix(s, "/"), WholePlaceholder(s):
		return nil
	}
	u, err := url.Parse(strings.ReplaceAll(s, SessionIDPlaceholder, "x"))
	if err != nil {
		return fmt.Errorf("invalid URL (%s)", urlErrorCause(err))
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("the URL must be http:// or https://, or a path starting with /")
	}
	return nil
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

// fill replaces placeholders in every string of a parsed JSON template and
// renders it; values are JSON-escaped by the encoder.
func fill(t any, replace func(string) string) []byte {
	var walk func(any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case string:
			return fillString(x, replace)
		case []any:
			out := make([]any, len(x))
			for i, e := range x {
				out[i] = walk(e)
			}
			return out
		case map[string]any:
			out := make(map[string]any, len(x))
			for k, e := range x {
				out[replace(k)] = walk(e)
			}
			return out
		}
		return v
	}
	b, _ := json.Marshal(walk(t))
	return b
}

// pointer resolves a JSON pointer in doc to a string (a number is given as
// its decimal text).
func pointer(doc any, p string) (string, bool) {
	cur, ok := pointerValue(doc, p)
	if !ok {
		return "", false
	}
	switch x := cur.(type) {
	case string:
		return x, x != ""
	case json.Number:
		return x.String(), true
	}
	return "", false
}

// pointerValue is the value at the JSON pointer p in doc.
func pointerValue(doc any, p string) (any, bool) {
	cur := doc
	for _, tok := range strings.Split(p, "/")[1:] {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch x := cur.(type) {
		case map[string]any:
			v, ok := x[tok]
			if !ok {
				return nil, false
			}
			cur = v
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(x) {
				return nil, false
			}
			cur = x[i]
		default:
			return nil, false
		}
	}
	return cur, true
}

// Remote is one browser session the provider created: released exactly
// once, off the request path.
type Remote struct {
	api     *sessionAPI
	id      string
	headers []Header // resolved at create time
	once    chanOnce
	// recorded: the ledger holds its entry; from is the gone owner an
	// adopted session came from; rounds counts the rounds of release
	// tries that failed.
	recorded bool
	from     string
	rounds   int
}

// ID is the provider's session ID.
func (r *Remote) ID() string { return r.id }

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

// Adopt returns, for release, session id that another process created at
// this provider and left behind (from names that process; its ledger entry
// is now this one's). The release call's headers are resolved with known,
// without a request: a header that needs the request's placeholders is sent
// without their values. A webdriver provider's is released with DELETE
// <base>/session/<id>. Nil when the provider creates no sessions.
func (p *Provider) Adopt(id, from string, known func(string) string) *Remote {
	if p.wd != nil {
		// Its header_up values were resolved when the config loaded.
		return &Remote{api: p.wd.api, id: id, headers: headerList(p.wdHeader(nil)), recorded: true, from: from}
	}
	if p.api == nil {
		return nil
	}
	headers, _ := p.api.prepare(known)
	return &Remote{api: p.api, id: id, headers: headers, recorded: true, from: from}
}

// Release hands the session to the background releaser (at most once; a
// nil Remote is a no-op). It never blocks.
func (r *Remote) Release() {
	if r == nil || !r.once.do() {
		return
	}
	r.api.rel.submit(r)
}

// Confirmed books the session as released without a release call, at
// most once and only if Release was not called (a nil Remote is a no-op):
// the provider already confirmed its end, as when a WebDriver client's own
// DELETE, sent on, was answered 2xx, 404 or 410. Its ledger entry is
// removed off the request path; it never blocks.
func (r *Remote) Confirmed() {
	if r == nil || !r.once.do() {
		return
	}
	rel := r.api.rel
	rel.mu.Lock()
	rel.pending++
	rel.mu.Unlock()
	go func() {
		defer rel.finished()
		r.confirm()
	}()
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

// findPointer finds the string (or number) at the JSON pointer p in raw,
// reading JSON tokens in order, so that it also finds it in a document cut
// short after it, or malformed after it. The first value at p counts.
func findPointer(raw []byte, p string) (string, bool) {
	want := strings.Split(p, "/")[1:]
	for i, tok := range want {
		want[i] = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
	}
	// One frame per open object or array: the key or index of the value
	// read in it now.
	type frame struct {
		obj     bool
		wantKey bool
		key     string
		idx     int
	}
	var stack []frame
	here := func() bool {
		if len(stack) != len(want) {
			return false
		}
		for i, f := range stack {
			if f.obj {
				if f.key != want[i] {
					return false
				}
			} else if n, err := strconv.Atoi(want[i]); err != nil || n != f.idx {
				return false
			}
		}
		return true
	}
	// next moves the innermost frame past the value just read.
	next := func() {
		if n := len(stack); n > 0 {
			if stack[n-1].obj {
				stack[n-1].wantKey = true
			} else {
				stack[n-1].idx++
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		if n := len(stack); n > 0 && stack[n-1].obj && stack[n-1].wantKey {
			if k, isKey := tok.(string); isKey {
				stack[n-1].key, stack[n-1].wantKey = k, false
				continue
			}
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				if here() {
					return "", false // p names an object or an array
				}
				stack = append(stack, frame{obj: v == '{', wantKey: v == '{'})
				continue
			default: // '}' or ']'
				stack = stack[:len(stack)-1]
			}
		case string:
			if here() {
				return v, v != ""
			}
		case json.Number:
			if here() {
				return v.String(), true
			}
		default:
			if here() {
				return "", false
			}
		}
		if len(stack) == 0 {
			return "", false // the whole document was read
		}
		next()
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

// release makes one release call within ctx; ok reports that the provider
// no longer holds the session. An ID refused by CheckSessionID is never
// put in a release path: the error then wraps errBadSessionID.
func (r *Remote) release(ctx context.Context) (ok bool, err error) {
	a := r.api
	if err := CheckSessionID(r.id); err != nil && a.idInPath {
		return false, err
	}
	base := &url.URL{Scheme: a.createURL.Scheme, Host: a.createURL.Host}
	u, err := resolveCall(base, a.releaseURL(r.id))
	if err != nil {
		return false, err
	}
	var body io.Reader
	if a.hasRelBody {
		body = bytes.NewReader(fill(a.relBody, func(s string) string {
			return strings.ReplaceAll(s, SessionIDPlaceholder, r.id)
		}))
	}
	req, err := http.NewRequestWithContext(ctx, a.ReleaseMethod, u.String(), body)
	if err != nil {
		return false, err
	}
	setHeaders(req, r.headers, a.hasRelBody)
	resp, err := a.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return false, err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, MaxRelayedBody))
	resp.Body.Close()
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode <= 299,
		resp.StatusCode == http.StatusNotFound, resp.StatusCode == http.StatusGone:
		return true, nil
	}
	return false, fmt.Errorf("release answered %d", resp.StatusCode)
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

// FillJSON replaces placeholders in every string of the JSON template t
// (values are JSON-escaped); "" stays "".
func FillJSON(t string, replace func(string) string) (string, error) {
	if t == "" {
		return "", nil
	}
	var v any
	if err := json.Unmarshal([]byte(t), &v); err != nil {
		return "", errors.New("not valid JSON")
	}
	return string(fill(v, replace)), nil
}

// hostRule says which hosts a connect URL may point to, the provider's
// header_up values going with the dial: the create call's host, names
// under its registrable domain (public suffix list), and connect_hosts.
type hostRule struct {
	create   string          // the create call's host, normalized
	site     string          // its registrable domain; "" when it has none
	exact    map[string]bool // connect_hosts without a wildcard
	suffixes []string        // ".example.com" for each *.example.com
}

func newHostRule(createHost string, named []string) hostRule {
	h := hostRule{create: normHost(createHost), exact: map[string]bool{}}
	h.site = registrable(h.create)
	for _, n := range named {
		if rest, ok := strings.CutPrefix(n, "*."); ok {
			h.suffixes = append(h.suffixes, "."+normHost(rest))
		} else if n = normHost(n); n != "" {
			h.exact[n] = true
		}
	}
	return h
}

// allows reports whether a connect URL may point to host (any port).
func (h hostRule) allows(host string) bool {
	host = normHost(host)
	switch {
	case host == "":
		return false
	case host == h.create, h.exact[host]:
		return true
	}
	for _, s := range h.suffixes {
		if strings.HasSuffix(host, s) {
			return true
		}
	}
	return h.site != "" && registrable(host) == h.site
}

// normHost is host lower-cased, without a trailing dot or brackets, and an
// IP address in its canonical form.
func normHost(host string) string {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.String()
	}
	return host
}

// registrable is host's registrable domain (its public suffix and one
// label more), or "" for an IP address, a single-label name such as
// localhost, a public suffix itself, or a name that is not ASCII: those
// match only themselves.
func registrable(host string) string {
	if host == "" || !strings.Contains(host, ".") || !isASCII(host) {
		return ""
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return ""
	}
	site, err := publicsuffix.EffectiveTLDPlusOne(host)
	if err != nil {
		return ""
	}
	return site
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// ValidateConnectHost checks one connect_hosts value: a host name (like
// connect.example.com), an IP address, or *.example.com for every name
// under example.com (not example.com itself; not a public suffix, like
// *.com or *.github.io). No scheme, port or path: any port matches. A
// placeholder as a whole is accepted (checked once resolved).
func ValidateConnectHost(h string) error {
	if h == "" {
		return errors.New("empty host")
	}
	if WholePlaceholder(h) {
		return nil
	}
	what := fmt.Sprintf("%q is not a host name, an IP address or *.<domain> (no scheme, port or path: any port matches)", h)
	if _, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")); err == nil {
		return nil
	}
	name, wild := strings.CutPrefix(h, "*.")
	if !isASCII(name) {
		return fmt.Errorf("%q: write a non-ASCII name in its xn-- (punycode) form", h)
	}
	if !hostName(name) {
		return errors.New(what)
	}
	if wild {
		n := normHost(name)
		if ps, icann := publicsuffix.PublicSuffix(n); ps == n && (icann || strings.Contains(n, ".")) {
			return fmt.Errorf("%q would allow every site under the public suffix %s: name the provider's own domain", h, ps)
		}
	}
	return nil
}

// hostName reports whether s is a DNS name: dot-separated labels of
// letters, digits, '-' and '_', each 1 to 63 bytes, a trailing dot allowed.
func hostName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}
