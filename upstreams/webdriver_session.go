package upstreams

// WebDriver over HTTP, the provider's side after the create: the session
// as the gateway keeps it (its ID, its release, its socket URLs checked),
// and the create answer rewritten for the client.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
)

// WebDriverSession is one session a webdriver provider created.
type WebDriverSession struct {
	// ID is the provider's session ID.
	ID string
	// Remote ends the session at the provider (DELETE
	// <base>/session/<id>, through the releaser, with retries; the
	// ledger's entry, written at the create answer, is removed once the
	// provider confirmed it, a 404 or 410 counting as done). Release it
	// once, or call Confirmed when the client's own DELETE, sent on, was
	// answered 2xx, 404 or 410; neither blocks. Nil for a session rebuilt
	// from another node's route (WebDriverSessionOf): the node that
	// created it ends it.
	Remote *Remote

	answer  []byte      // the provider's create answer (nil: rebuilt)
	socket  string      // the BiDi socket URL, checked ("": none)
	cdp     string      // the CDP socket URL, checked ("": none)
	sockErr error       // why a socket URL the provider gave was refused
	header  http.Header // the provider's credentials, resolved at create
	// hosts are the provider's addresses (lower case), secrets its
	// credentials and capability values, and own the capability names
	// the provider's options set: none of them may reach the client.
	hosts   []string
	secrets []string
	own     map[string]bool
}

// SocketURL is the provider's BiDi socket URL (its webSocketUrl), checked
// (see SocketError); "" when it gave none or it was refused.
func (s *WebDriverSession) SocketURL() string { return s.socket }

// CDPURL is the provider's CDP socket URL (its se:cdp), checked; "" when
// it gave none or it was refused.
func (s *WebDriverSession) CDPURL() string { return s.cdp }

// SocketError tells why a socket URL the provider gave was refused (nil:
// none was). A loopback or unspecified host in one (localhost,
// 127.0.0.0/8, ::1, 0.0.0.0, ::) is the provider's own: it is replaced by
// the configured host, port kept. Any other host must be the configured
// one or under its registrable domain, as a session API's connect URL;
// the scheme must be ws or wss, and wss when the provider is configured
// over https (the credentials go along). The error names the host, never
// the URL.
func (s *WebDriverSession) SocketError() error { return s.sockErr }

// minSecretLen is the length from which a credential or capability value
// is looked for in a create answer: shorter strings ("1", "true") are in
// any answer by chance, and a real key is longer.
const minSecretLen = 8

// takeSocket checks a socket URL the provider gave under capability name,
// adding its host to hosts (the provider's addresses) and a refusal to
// errs.
func (w *webDriver) takeSocket(raw, name string, hosts []string, errs []error) (string, []string, []error) {
	if raw == "" {
		return "", hosts, errs
	}
	if u, err := url.Parse(raw); err == nil && u.Host != "" {
		hosts = append(hosts, asciiLower(u.Host))
	}
	checked, err := w.checkSocket(raw)
	if err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", name, err))
	}
	return checked, hosts, errs
}

// capsKeys is the set of top-level names of a capabilities template.
func capsKeys(caps any) map[string]bool {
	m, _ := caps.(map[string]any)
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

// userPassword is the user name and password of a Basic Authorization
// value.
func userPassword(basic string) ([]string, bool) {
	req := http.Request{Header: http.Header{"Authorization": {basic}}}
	u, pw, ok := req.BasicAuth()
	return []string{u, pw}, ok
}

// errSocketURL marks a socket URL refused.
var errSocketURL = errors.New("socket URL refused")

// checkSocket checks a socket URL a create answer gave (see SocketError)
// and returns it as the gateway dials it: a loopback or unspecified host
// replaced by the configured one, without user info or fragment.
func (w *webDriver) checkSocket(raw string) (string, error) {
	if raw == "" {
		return "", nil
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Hostname() == "" {
		return "", fmt.Errorf("%w: not an absolute URL", errSocketURL)
	}
	scheme := asciiLower(u.Scheme)
	if scheme != "ws" && scheme != "wss" {
		return "", fmt.Errorf("%w: not a ws:// or wss:// URL", errSocketURL)
	}
	if scheme == "ws" && strings.HasPrefix(w.base, "https:") {
		return "", fmt.Errorf("%w: a plain ws:// URL from a provider configured over https (its credentials would go in clear text)", errSocketURL)
	}
	switch host := u.Hostname(); {
	case localHost(host):
		// The provider's own address as it sees itself: reach it where
		// it is configured.
		h := w.host
		if strings.Contains(h, ":") {
			h = "[" + h + "]"
		}
		if port := u.Port(); port != "" {
			h = net.JoinHostPort(w.host, port)
		}
		u.Host = h
	case !w.hosts.allows(host):
		return "", fmt.Errorf("%w: host %q is neither the provider's host nor under its domain", errSocketURL, host)
	}
	u.Scheme, u.User, u.Fragment, u.RawFragment = scheme, nil, "", ""
	return u.String(), nil
}

// localHost reports whether host is a loopback or unspecified address,
// or localhost.
func localHost(host string) bool {
	h := normHost(host)
	if h == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(h)
	if err != nil {
		return false
	}
	ip = ip.Unmap()
	return ip.IsLoopback() || ip.IsUnspecified()
}

// WebDriverSessionOf rebuilds a session of p known from elsewhere (the
// route another node shared: the provider's session ID and socket URLs,
// never a credential), checking what it was given as a create answer is:
// the ID with CheckSessionID, the socket URLs as SocketError says. Its
// calls carry p's credentials (header_up values that need a request's
// placeholders are left out). It has no Remote and no answer: the node
// that created it ends it.
func (p *Provider) WebDriverSessionOf(id, socketURL, cdpURL string) (*WebDriverSession, error) {
	if p.wd == nil {
		return nil, fmt.Errorf("provider %q is not a webdriver provider", p.Name)
	}
	if err := CheckSessionID(id); err != nil {
		return nil, err
	}
	s := &WebDriverSession{ID: id, header: p.wd.header(nil)}
	var err error
	if s.socket, err = p.wd.checkSocket(socketURL); err != nil {
		return nil, fmt.Errorf("webSocketUrl: %w", err)
	}
	if s.cdp, err = p.wd.checkSocket(cdpURL); err != nil {
		return nil, fmt.Errorf("se:cdp: %w", err)
	}
	return s, nil
}

// Answer is the provider's create answer as the client gets it:
// value.sessionId is clientID (the ID the client knows the session by);
// value.capabilities.webSocketUrl, when the provider gave one the gateway
// accepted, is wsBase+"/session/"+clientID (wsBase like
// ws://host:port/wd/hub, the client's view of the gateway) and se:cdp the
// same followed by /se/cdp (a refused one is removed); the capabilities
// that tell where the provider runs are removed (providerInternals:
// debugger addresses, Grid's VNC and node addresses, profile directories,
// process IDs). No trace of the provider stays: the capabilities the
// provider's options set are removed, and so is, at any depth, every
// string naming the provider's session, its host (or a socket URL's), or
// holding one of its credentials or capability values. Everything else is
// as the provider sent it.
func (s *WebDriverSession) Answer(clientID, wsBase string) ([]byte, error) {
	if s.answer == nil {
		return nil, errors.New("no create answer: the session was created by another node")
	}
	var doc map[string]any
	dec := json.NewDecoder(bytes.NewReader(s.answer))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("the create answer is not JSON: %w", err)
	}
	value, _ := doc["value"].(map[string]any)
	if value == nil {
		return nil, errors.New("the create answer has no value object")
	}
	caps, _ := value["capabilities"].(map[string]any)
	for k := range s.own {
		delete(caps, k)
	}
	stripInternals(caps)
	doc["value"] = s.scrub(value)
	value = doc["value"].(map[string]any)
	value["sessionId"] = clientID
	if caps != nil {
		own := strings.TrimRight(wsBase, "/") + "/session/" + clientID
		delete(caps, "webSocketUrl")
		delete(caps, "se:cdp")
		if s.socket != "" {
			caps["webSocketUrl"] = own
		}
		if s.cdp != "" {
			caps["se:cdp"] = own + "/se/cdp"
		}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// scrub removes from v, at any depth, the strings that name the provider
// (see Answer); objects and arrays lose the members holding them.
func (s *WebDriverSession) scrub(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if str, ok := e.(string); ok && s.names(str) {
				delete(x, k)
				continue
			}
			x[k] = s.scrub(e)
		}
	case []any:
		out := x[:0]
		for _, e := range x {
			if str, ok := e.(string); ok && s.names(str) {
				continue
			}
			out = append(out, s.scrub(e))
		}
		return out
	}
	return v
}

// names reports whether str names the provider: its session ID, one of
// its hosts, a credential or capability value of its own.
func (s *WebDriverSession) names(str string) bool {
	if str == s.ID || strings.Contains(str, "/session/"+s.ID) {
		return true
	}
	lower := asciiLower(str)
	for _, h := range s.hosts {
		if h != "" && strings.Contains(lower, h) {
			return true
		}
	}
	for _, v := range s.secrets {
		if strings.Contains(str, v) {
			return true
		}
	}
	return false
}

// session is the session m made, its calls carrying header, and secrets
// (the provider's capability values) kept from its client.
func (w *webDriver) session(m made, header http.Header, secrets []string) *WebDriverSession {
	a := m.kept.(wdAnswer)
	s := &WebDriverSession{ID: m.remote.id, Remote: m.remote, answer: a.raw, header: header, own: map[string]bool{}}
	for k := range capsKeys(w.caps) {
		s.own[k] = true
	}
	var caps map[string]json.RawMessage
	json.Unmarshal(a.value["capabilities"], &caps)
	var errs []error
	s.socket, s.hosts, errs = w.takeSocket(capString(caps, "webSocketUrl"), "webSocketUrl", s.hosts, errs)
	s.cdp, s.hosts, errs = w.takeSocket(capString(caps, "se:cdp"), "se:cdp", s.hosts, errs)
	s.sockErr = errors.Join(errs...)
	s.hosts = append(s.hosts, w.addr)
	if pw, ok := userPassword(w.auth); ok {
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
	return s
}
