package browserfailover

import (
	"errors"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// SessionAPIConfig is a provider that creates each browser over REST
// (JSON key "session_api" of a provider): every attempt first calls
// create, then dials the WebSocket URL found in its answer; the created
// session is released exactly once, in the background, whatever ends it.
type SessionAPIConfig struct {
	// CreateMethod and CreateURL are the create call, such as POST
	// https://api.example.com/v1/sessions; a URL that is a path is
	// resolved against the provider's URL. Required.
	CreateMethod string `json:"create_method"`
	CreateURL    string `json:"create_url"`
	// Headers go with every create and release call, in order. Values may
	// hold {env.X} (resolved when the config loads) and request
	// placeholders (resolved when the session is created). They are
	// secrets: never shown.
	Headers []HeaderConfig `json:"headers,omitempty"`
	// Body is the create call's JSON body, as text; placeholders in its
	// strings are replaced (JSON-escaped). Default: no body.
	Body string `json:"body,omitempty"`
	// ConnectURL and SessionID are JSON pointers (RFC 6901) to the
	// WebSocket URL and the session's ID in the create answer, such as
	// /connectUrl and /id. Required.
	ConnectURL string `json:"connect_url"`
	SessionID  string `json:"session_id"`
	// ReleaseMethod and ReleaseURL are the release call; the URL holds
	// {session_id}. Required.
	ReleaseMethod string `json:"release_method"`
	ReleaseURL    string `json:"release_url"`
	// ReleaseBody is the release call's JSON body, as text; {session_id}
	// in its strings is replaced. Default: no body.
	ReleaseBody string `json:"release_body,omitempty"`
	// ConnectHosts names the hosts a connect URL may point to besides the
	// create URL's host and the names under its registrable domain (so
	// api.example.com allows connect.example.com, not example.net): exact
	// host names or IP addresses, case-insensitive, or *.example.com for
	// every name under example.com. Any port matches. Any other connect
	// URL is not dialed: the attempt fails with bad_connect_url and the
	// session is released, since the dial carries header_up.
	ConnectHosts []string `json:"connect_hosts,omitempty"`
}

// HeaderConfig is one header field of a session API call.
type HeaderConfig struct {
	Field string `json:"field"`
	Value string `json:"value"`
}

// options is the session API as upstreams takes it, placeholders not
// resolved.
func (c *SessionAPIConfig) options() upstreams.SessionAPI {
	a := upstreams.SessionAPI{
		CreateMethod: c.CreateMethod, CreateURL: c.CreateURL,
		Body: c.Body, ConnectURL: c.ConnectURL, SessionID: c.SessionID,
		ReleaseMethod: c.ReleaseMethod, ReleaseURL: c.ReleaseURL, ReleaseBody: c.ReleaseBody,
		ConnectHosts: append([]string(nil), c.ConnectHosts...),
	}
	for _, h := range c.Headers {
		a.Headers = append(a.Headers, upstreams.Header{Field: h.Field, Value: h.Value})
	}
	return a
}

// validate checks the session API; each problem names its option.
func (c *SessionAPIConfig) validate() error {
	if c == nil {
		return nil
	}
	var out []error
	for _, e := range problems(upstreams.ValidateSessionAPI(c.options())) {
		var ap *upstreams.APIProblem
		if errors.As(e, &ap) {
			oe := badOpt(ap.Option, "%s", ap.Msg)
			oe.whole = ap.Missing
			out = append(out, oe)
		} else {
			out = append(out, e)
		}
	}
	return within("session_api: ", errors.Join(out...))
}

// validateSessionAPI checks a provider's session API and what it rules
// out: the provider's URL is the API's, never discovered.
func (p *ProviderConfig) validateSessionAPI() error {
	if p.SessionAPI == nil {
		return nil
	}
	err := p.SessionAPI.validate()
	if p.Discover != nil && *p.Discover {
		e := badOpt("discover", "discover on does not apply to a provider with session_api (it dials the URL each create answer gives)")
		e.whole = true
		err = errors.Join(err, e)
	}
	return err
}

// resolve returns the session API with {env.X} and other placeholders
// known when the config loads resolved (request placeholders stay).
func (c *SessionAPIConfig) resolve(repl *caddy.Replacer) (*upstreams.SessionAPI, error) {
	if c == nil {
		return nil, nil
	}
	known := func(s string) string { return repl.ReplaceKnown(s, "") }
	a := c.options()
	a.CreateURL, a.ReleaseURL = known(a.CreateURL), known(a.ReleaseURL)
	for i := range a.Headers {
		a.Headers[i].Value = known(a.Headers[i].Value)
	}
	for i := range a.ConnectHosts {
		a.ConnectHosts[i] = known(a.ConnectHosts[i])
	}
	var err error
	if a.Body, err = upstreams.FillJSON(a.Body, known); err != nil {
		return nil, fmt.Errorf("session_api: body: %w", err)
	}
	if a.ReleaseBody, err = upstreams.FillJSON(a.ReleaseBody, known); err != nil {
		return nil, fmt.Errorf("session_api: release_body: %w", err)
	}
	return &a, nil
}

// releaseGrace bounds how long a process exit waits for the releases of
// provider sessions still in flight.
const releaseGrace = 15 * time.Second

// finishReleases waits, at process exit, until the provider sessions whose
// release is under way are released, and the create calls still in flight
// have answered and what they created is released (or releaseGrace has
// passed); the logger hears of any left.
func finishReleases(logger *zap.Logger) {
	if upstreams.WaitReleases(time.Now().Add(releaseGrace)) || logger == nil {
		return
	}
	logger.Error("provider sessions left unreleased at exit",
		zap.Int("pending", upstreams.PendingReleases()))
}

func init() {
	// A failed release call is worth a line in the log: the provider may
	// bill a session nobody uses. The cause never holds a URL or a header.
	upstreams.OnReleaseFailure = func(provider string, err error) {
		caddy.Log().Named("http.handlers.browser_failover").Warn("provider session release failed",
			zap.String("provider", provider), zap.String("cause", err.Error()))
	}
	// A session nobody can release bills until the provider ends it: an
	// operator must hear of it. The cause never holds a header, a URL or
	// the answer's body.
	upstreams.OnOrphan = func(provider, cause string) {
		caddy.Log().Named("http.handlers.browser_failover").Error("provider session cannot be released: the create answer gave no session ID",
			zap.String("provider", provider), zap.String("cause", cause))
	}
}
