package upstreams

// The REST session API's creator: a create call before each attempt,
// the connect URL of its answer dialed, the session released by its
// release call; and the list call the reaper reads.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// sessionAPI is a SessionAPI checked and ready: the REST session API's
// creator.
type sessionAPI struct {
	SessionAPI
	sessionKeeper
	createURL  *url.URL
	optQuery   bool     // createURL's query holds option placeholders
	listURL    *url.URL // nil without a list call
	body       any      // parsed template, nil for none
	hasBody    bool
	relBody    any
	hasRelBody bool
	hosts      hostRule
}

// newSessionAPI readies a, its placeholders resolved, for provider p (its
// URL resolves relative call URLs; its TLS options apply to the calls),
// counting in d.Books and releasing with d.Releaser (nil: its own).
func newSessionAPI(p *Provider, a SessionAPI, d Defaults) (*sessionAPI, error) {
	// Checked as given by Validate; what the placeholders gave, now.
	if err := ValidateSessionAPI(a); err != nil {
		return nil, err
	}
	s := &sessionAPI{SessionAPI: a}
	base := &url.URL{Scheme: p.httpScheme, Host: p.host}
	var err error
	if s.createURL, err = resolveCall(base, a.CreateURL); err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	s.hosts = newHostRule(s.createURL.Hostname(), a.ConnectHosts)
	s.optQuery = queryHasOptions(s.createURL.Query())
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
	client := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		// A redirect could carry the API key elsewhere.
		return http.ErrUseLastResponse
	}}
	// An ID the release URL holds before its query cannot be released
	// safely once CheckSessionID refused it.
	relPath, _, _ := strings.Cut(a.ReleaseURL, "?")
	s.sessionKeeper = newSessionKeeper(p.Name, client, d, strings.Contains(relPath, SessionIDPlaceholder), "the release URL holds it in its path")
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
	resp, err := call{method: a.ListMethod, url: a.listURL.String(), header: fieldsHeader(headers, false)}.do(ctx, a.client)
	if err != nil {
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

// createCall is the create call of one attempt, its request placeholders
// resolved with replace.
func (a *sessionAPI) createCall(replace func(string) string) createCall {
	headers, body := a.prepare(replace)
	return createCall{
		call:    call{method: a.CreateMethod, url: a.createTarget(replace), header: fieldsHeader(headers, a.hasBody), body: body},
		release: headers,
	}
}

// refused is the outcome of a create answered with a status other than
// 2xx: 408 and 429 are Capacity (with their Retry-After), anything else
// WordCreateFailed.
func (a *sessionAPI) refused(resp *http.Response) Result {
	io.Copy(io.Discard, io.LimitReader(resp.Body, MaxRelayedBody))
	word, kind := ClassifyStatus(resp.StatusCode)
	r := Result{Outcome: Outcome{Word: word, Kind: kind, Refused: refusedWith(resp.StatusCode), Err: fmt.Errorf("create answered %d", resp.StatusCode)}}
	if kind == Capacity {
		r.Outcome.RetryAfter = ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	} else {
		r.Outcome.Word, r.Outcome.Kind = WordCreateFailed, Failure
	}
	return r
}

// read reads a create answer: the session ID at its SessionID pointer,
// and the connect URL at its ConnectURL pointer, which it keeps.
func (a *sessionAPI) read(raw []byte, fault string) answer {
	var doc any
	if fault == "" {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&doc); err != nil {
			fault = "the answer is not JSON"
		}
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
		if fault == "" {
			return answer{noID: "no session ID at " + a.SessionID}
		}
		return answer{noID: fault + ", and no session ID at " + a.SessionID + " could be read"}
	}
	r := answer{id: id, idAt: "at " + a.SessionID, fault: fault}
	if fault == "" {
		if r.kept, ok = pointer(doc, a.ConnectURL); !ok {
			r.fault = "no connect URL at " + a.ConnectURL
		}
	}
	return r
}

// releaseCall is the release call of session id: {session_id} in the
// release URL and body replaced.
func (a *sessionAPI) releaseCall(id string, fields []Header) (call, error) {
	u, err := idURL(a.createURL, a.ReleaseURL, id)
	if err != nil {
		return call{}, err
	}
	c := call{method: a.ReleaseMethod, url: u, header: fieldsHeader(fields, a.hasRelBody)}
	if a.hasRelBody {
		c.body = fill(a.relBody, func(s string) string {
			return strings.ReplaceAll(s, SessionIDPlaceholder, id)
		})
	}
	return c, nil
}

// adoptedFields are the release's headers resolved with known: a header
// that needs a request's placeholders is sent without their values.
func (a *sessionAPI) adoptedFields(known func(string) string) []Header {
	headers, _ := a.prepare(known)
	return headers
}

// idURL is the URL of a call about session id, resolved against base's
// scheme and host: {session_id} in template is replaced by id escaped as
// one path segment before the "?", and as one query value after it, so
// that the ID can neither climb the path nor add query items.
func idURL(base *url.URL, template, id string) (string, error) {
	path, query, hasQuery := strings.Cut(template, "?")
	s := strings.ReplaceAll(path, SessionIDPlaceholder, url.PathEscape(id))
	if hasQuery {
		s += "?" + strings.ReplaceAll(query, SessionIDPlaceholder, url.QueryEscape(id))
	}
	u, err := resolveCall(&url.URL{Scheme: base.Scheme, Host: base.Host}, s)
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

// connect is one attempt at p through its session API, within actx (ctx
// is the client's): a session created, then the connect URL of the
// answer dialed. The session goes with the connection on success and is
// released on every other end.
func (a *sessionAPI) connect(p *Provider, ctx, actx context.Context, deadline time.Time, hs *Handshake, replace func(string) string) Result {
	return createWithin(ctx, actx, deadline, a, a.createCall(replace), func(m made) Result {
		connectURL := m.kept.(string)
		t, err := p.retarget(connectURL)
		if err != nil {
			m.remote.Release()
			word := WordBadCreate
			if errors.Is(err, errBadConnectURL) {
				word = WordBadConnectURL
			}
			return Result{Outcome: Outcome{Word: word, Kind: Failure, Err: fmt.Errorf("%w: %w", errBadCreate, err)}}
		}
		res := t.attempt(ctx, actx, deadline, hs, replace)
		// The session was started, whatever its upgrade is answered.
		res.Outcome.Refused = 0
		if res.Outcome.Kind != Success {
			m.remote.Release()
			return res
		}
		res.Conn.Remote = m.remote
		res.Conn.Point.ConnectURL = connectURL
		if a.rel.CreatesStopped() {
			res.Conn.Close() // releases the session
			return stoppedResult()
		}
		return res
	})
}
