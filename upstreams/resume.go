package upstreams

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// errNoPoint is a reconnect without a point to go back to.
var errNoPoint = errors.New("no resume point")

// Reconnect makes one attempt at the browser behind rp: the same
// connection as Connect's, within the same deadline, but to rp's target
// as it is, without discovery and without creating a provider session.
// The client handshake hs is the resuming client's.
func (p *Provider) Reconnect(ctx context.Context, hs *Handshake, rp ResumePoint, replace func(string) string) (res Result) {
	start := time.Now()
	defer func() { res.Outcome.Elapsed = time.Since(start) }()
	if rp.IsZero() {
		return Result{Outcome: Outcome{Word: WordBadHandshake, Kind: Failure, Err: errNoPoint}}
	}
	actx, deadline, cancel := within(ctx, start, p.ConnectTimeout)
	defer cancel()
	via := p.own()
	if rp.ConnectURL != "" {
		t, err := p.retarget(rp.ConnectURL)
		if err != nil {
			return Result{Outcome: Outcome{Word: WordBadCreate, Kind: Failure, Err: err}}
		}
		via = t
	}
	res = via.upgrade(ctx, actx, deadline, hs, target{host: rp.Host, requestURI: rp.URI}, replace)
	if res.Conn != nil {
		res.Conn.Point = rp
	}
	return res
}

// ServerCloseFrame is a close frame from the gateway to a client (not
// masked), with code and reason.
func ServerCloseFrame(code int, reason string) []byte { return closeFrame(code, reason, false) }

// SharedPoint is a resume point as other gateway nodes may see it: the
// Host, the path and the query items that do not come from the provider's
// URL. The provider's own query (where API keys and tokens go), its user
// info and its header_up values are never in it: the node that dials it
// again adds its own (Restore).
type SharedPoint struct {
	Host  string `json:"host"`
	Path  string `json:"path"`
	Query string `json:"query,omitempty"`
}

// Share returns rp without what the provider's URL put into it. ok is
// false for a point that cannot be shared (a session API's connect URL,
// which the create answer may have signed).
func (p *Provider) Share(rp ResumePoint) (sp SharedPoint, ok bool) {
	if rp.IsZero() || rp.ConnectURL != "" {
		return SharedPoint{}, false
	}
	path, raw, _ := strings.Cut(rp.URI, "?")
	q, err := url.ParseQuery(raw)
	if err != nil {
		return SharedPoint{}, false
	}
	for k := range p.query {
		delete(q, k)
	}
	return SharedPoint{Host: rp.Host, Path: path, Query: q.Encode()}, true
}

// Restore turns a shared point back into one this node can dial: the
// provider's own query items are put back (they win over the shared ones,
// as on every connect). A point read from the shared store is checked
// first: anyone who can write there must not be able to inject a header
// or a second request.
func (p *Provider) Restore(sp SharedPoint) (ResumePoint, error) {
	for _, f := range []struct{ name, v string }{{"host", sp.Host}, {"path", sp.Path}, {"query", sp.Query}} {
		if i := strings.IndexFunc(f.v, func(r rune) bool { return r <= ' ' || r == 0x7f }); i >= 0 {
			return ResumePoint{}, fmt.Errorf("shared resume point: the %s holds a control byte or a space", f.name)
		}
	}
	if sp.Host == "" || strings.ContainsAny(sp.Host, "/?#@\\") {
		return ResumePoint{}, errors.New("shared resume point: not a host")
	}
	if !strings.HasPrefix(sp.Path, "/") || strings.ContainsAny(sp.Path, "?#") {
		return ResumePoint{}, errors.New("shared resume point: not a path")
	}
	if strings.Contains(sp.Query, "#") {
		return ResumePoint{}, errors.New("shared resume point: not a query")
	}
	q, err := url.ParseQuery(sp.Query)
	if err != nil {
		return ResumePoint{}, errors.New("shared resume point: not a query")
	}
	for k, v := range p.query {
		q[k] = v
	}
	uri := sp.Path
	if len(q) > 0 {
		uri += "?" + q.Encode()
	}
	return ResumePoint{Host: sp.Host, URI: uri}, nil
}
