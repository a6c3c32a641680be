package upstreams

// A provider's session API as configured: the calls that create, release
// and list its sessions, where its answers hold the connect URL and the
// session ID, and the one validator JSON and the Caddyfile share.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/browserfailover/caddy-browser-failover/internal/conf"
)

// SessionIDPlaceholder stands for the created session's ID in the release
// URL and body.
const SessionIDPlaceholder = "{session_id}"

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
