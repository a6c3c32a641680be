package status

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/recordings"
)

func init() {
	caddy.RegisterModule(Dashboard{})
}

// Dashboard is the handler module http.handlers.browser_failover_dashboard:
// a page for people, with the status of every provider and queue, the
// client quotas, the live sessions and the stored browser profiles,
// refreshed every 2 s, the live view of recorded sessions and the stored
// recordings with a player, and (with Controls) buttons for the
// operator's actions. Caddy's admin API refuses
// a browser's navigation, so the page is served on a site, behind whatever
// guards the site sets (basic_auth, forward_auth, a localhost-only
// listener).
//
// It answers, at the path it is routed on (any prefix; handle_path too):
//
//	GET  <path>                              the page (one HTML document, nothing external)
//	GET  <path>/status.json                  the status document, as the admin API's
//	GET  <path>/sessions.json                the live sessions, as the admin API's
//	GET  <path>/profiles.json                the stored browser profiles, as the admin API's
//	POST <path>/providers/<name>/<action>    drain, undrain or reset (Controls)
//	POST <path>/sessions/<id>/end            end a session (Controls)
//	GET  <path>/live.json                    the recordings under way on this node
//	GET  <path>/live/<id>/targets/<t>/frame  the newest frame of one of their pages
//	GET  <path>/recordings.json              the stored recordings, as the admin API's
//	GET  <path>/recordings/<id>              a recording's meta, as the admin API's
//	GET  <path>/recordings/<id>/targets/<t>/frames/<n>  a frame's image
//	GET  <path>/recordings/<id>/targets/<t>/video.mp4   a page's video
//	POST <path>/recordings/<id>/delete       delete a recording (Controls)
//
// The JSON and the actions are recognised by the end of the path; every
// other GET is the page. The actions answer 403 while Controls is off, and
// to any request that is not the page's own: it must carry the header
// X-Browser-Failover-Dashboard, which a cross-site form cannot send and a
// cross-site script cannot send without the site's consent, and its Origin
// and Sec-Fetch-Site, when present, must say same origin.
//
// Before anything else, every request's Host (its port aside) must be one
// the dashboard knows: an IP address, localhost, a host name the server's
// sites are addressed by (the host matchers of its top-level routes), or
// one of Hosts. Anything else gets 403: a page of another site whose name
// was made to resolve to this listener (DNS rebinding) reaches it with its
// own name as Host, and must neither read the JSON nor act. A site with a
// host matcher only passes requests that matched it, so it is unchanged;
// a site without one (:8081, http://) answers IP addresses, localhost and
// Hosts.
type Dashboard struct {
	// Controls shows the action buttons and allows the actions; default
	// off (a read-only page).
	Controls bool `json:"controls,omitempty"`

	// Hosts are more names the dashboard answers to, besides IP
	// addresses, localhost and the site's own host names: the names a
	// proxy in front of it, a tunnel or /etc/hosts gives it. They are
	// matched as Caddy's host matcher matches (case does not matter, a
	// wildcard label as in *.example.com); a name has no scheme, path or
	// port (any port is accepted).
	Hosts []string `json:"hosts,omitempty"`

	page  []byte
	names caddyhttp.MatchHost // Hosts and the site's host names
	// reg is the registry it shows; nil: the process's (pool.Current).
	reg *pool.Registry
}

// registry is the registry the dashboard shows now.
func (d *Dashboard) registry() *pool.Registry {
	if d.reg != nil {
		return d.reg
	}
	return pool.Current()
}

// CaddyModule returns the Caddy module information.
func (Dashboard) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.browser_failover_dashboard",
		New: func() caddy.Module { return new(Dashboard) },
	}
}

// DashboardHeader is the header the page's own actions carry.
const DashboardHeader = "X-Browser-Failover-Dashboard"

//go:embed dashboard.html
var dashboardHTML []byte

// dashboardCSP lets the page run only its own inline script and style
// (by their hashes) and talk only to its own origin: no external script,
// style, font or image could load even if one slipped into the page, and
// no other site may frame it.
var dashboardCSP = func() string {
	hash := func(tag string) string {
		m := regexp.MustCompile(`(?s)<` + tag + `>(.*?)</` + tag + `>`).FindSubmatch(dashboardHTML)
		if m == nil {
			panic("dashboard.html has no <" + tag + ">")
		}
		sum := sha256.Sum256(m[1])
		return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
	}
	return "default-src 'none'; script-src " + hash("script") + "; style-src " + hash("style") +
		"; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}()

// Provision renders the page for this handler's Controls setting and
// gathers the host names it answers to.
func (d *Dashboard) Provision(ctx caddy.Context) error {
	on := "off"
	if d.Controls {
		on = "on"
	}
	d.page = bytes.Replace(dashboardHTML, []byte("{{controls}}"), []byte(on), 1)

	// The names of Hosts are normalised (to ASCII, lower case) by a
	// matcher of their own first, so that a site's name given again in
	// Hosts is seen as the same; the site's are normalised already.
	// Names alike are dropped rather than failing the matcher's
	// Provision: validate, which Caddy runs next, says which one it is.
	own := uniqueHosts(d.Hosts)
	if err := own.Provision(ctx); err != nil {
		return fmt.Errorf("hosts: %w", err)
	}
	names := uniqueHosts(append(own, siteHosts(ctx)...))
	if err := names.Provision(ctx); err != nil {
		return fmt.Errorf("hosts: %w", err)
	}
	d.names = names
	return nil
}

// uniqueHosts returns names without the ones equal to an earlier one,
// case aside, as a new host matcher (to be provisioned).
func uniqueHosts(names []string) caddyhttp.MatchHost {
	var out caddyhttp.MatchHost
	seen := make(map[string]bool, len(names))
	for _, name := range names {
		if key := strings.ToLower(name); !seen[key] {
			seen[key] = true
			out = append(out, name)
		}
	}
	return out
}

// siteHosts returns the names in the host matchers of the top-level routes
// of the server the handler is provisioned in: the addresses of its
// Caddyfile sites. Caddy provisions those matchers before any handler.
func siteHosts(ctx caddy.Context) []string {
	if ctx.Context == nil {
		return nil
	}
	srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if !ok {
		return nil
	}
	var out []string
	for _, route := range srv.Routes {
		for _, set := range route.MatcherSets {
			for _, m := range set {
				if hm, ok := m.(*caddyhttp.MatchHost); ok {
					out = append(out, *hm...)
				}
			}
		}
	}
	return out
}

// Validate checks the configuration.
func (d *Dashboard) Validate() error { return d.validate() }

// validate checks the values the Caddyfile parser also checks.
func (d *Dashboard) validate() error {
	seen := make(map[string]bool, len(d.Hosts))
	for _, name := range d.Hosts {
		if err := checkHostName(name); err != nil {
			return fmt.Errorf("hosts: %w", err)
		}
		key := strings.ToLower(name)
		if seen[key] {
			return fmt.Errorf("hosts: %q given twice", name)
		}
		seen[key] = true
	}
	return nil
}

// checkHostName tells what is wrong with a name of Hosts, if anything.
func checkHostName(name string) error {
	switch {
	case name == "":
		return errors.New("an empty name")
	case strings.Contains(name, "://"):
		return fmt.Errorf("%q has a scheme: give the host name alone", name)
	case strings.Contains(name, "/"):
		return fmt.Errorf("%q has a path: give the host name alone", name)
	case strings.ContainsFunc(name, func(c rune) bool { return c <= ' ' || c == 0x7f || strings.ContainsRune(`?#@\`, c) }):
		return fmt.Errorf("%q is not a host name", name)
	}
	if _, _, err := net.SplitHostPort(name); err == nil {
		return fmt.Errorf("%q has a port: give the host name alone (the dashboard answers on any port)", name)
	}
	return nil
}

// hostAllowed tells whether the Host of r, its port aside, is one the
// dashboard answers to: an IP address, localhost or one of d.names. The
// names are matched as Caddy's host matcher matches them (case aside,
// wildcards and placeholders), with the request's placeholders.
func (d *Dashboard) hostAllowed(r *http.Request) bool {
	host := requestHost(r)
	if host == "" {
		return false
	}
	if _, err := netip.ParseAddr(host); err == nil || strings.EqualFold(host, "localhost") {
		return true
	}
	if len(d.names) == 0 {
		return false
	}
	if _, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); !ok {
		// Served outside a Caddy server (which always sets one).
		r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddy.NewReplacer()))
	}
	return d.names.Match(r)
}

// requestHost is the Host of r without its port or an IPv6 address's
// brackets, as Caddy's host matcher reads it.
func requestHost(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.Host); err == nil {
		return host
	}
	return strings.TrimSuffix(strings.TrimPrefix(r.Host, "["), "]")
}

// hostRefused is the answer to a request whose Host the dashboard does
// not answer to.
func hostRefused(r *http.Request) string {
	host := requestHost(r)
	if len(host) > 255 {
		host = host[:255] + "…"
	}
	if host == "" {
		return "refused: the request has no Host; the dashboard answers only its own names " +
			"(an IP address, localhost, the site's host names, or a name of its hosts option)"
	}
	return fmt.Sprintf("refused: the Host %q is not one of the dashboard's names "+
		"(an IP address, localhost, the site's host names, or a name of its hosts option); "+
		"if it is yours, allow it with browser_failover_dashboard { hosts %s }", host, host)
}

// ServeHTTP serves the page, its JSON and its actions; it never calls
// next.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if !d.hostAllowed(r) {
		return dashError(w, http.StatusForbidden, hostRefused(r))
	}
	segs := strings.Split(r.URL.EscapedPath(), "/")
	n := len(segs)
	switch {
	case segs[n-1] == "status.json":
		return d.serveJSON(w, r, func() any { return Snapshot(d.registry()) })
	case segs[n-1] == "sessions.json":
		return d.serveJSON(w, r, func() any { return ListSessions(d.registry()) })
	case segs[n-1] == "live.json":
		return d.serveJSON(w, r, func() any { return map[string]any{"live": LiveRecordings(d.registry())} })
	case segs[n-1] == "recordings.json":
		setPrivate(w.Header())
		return dashAPI(w, ServeRecordings(w, r, d.registry(), ""))
	case n >= 5 && segs[n-5] == "live" && segs[n-3] == "targets" && segs[n-1] == "frame":
		return d.serveNewest(w, r, segs[n-4], segs[n-2])
	case segs[n-1] == "profiles.json":
		return d.serveJSON(w, r, func() any {
			list, err := ListProfiles(r, d.registry())
			if err != nil && len(list.Profiles) == 0 {
				return ProfileList{Profiles: []Profile{}}
			}
			return list
		})
	}
	switch {
	case n >= 3 && segs[n-3] == "providers":
		name, err := url.PathUnescape(segs[n-2])
		if err != nil || name == "" {
			return dashError(w, http.StatusNotFound, "bad provider name in the path")
		}
		action := segs[n-1]
		if !IsAction(action) {
			return dashError(w, http.StatusNotFound, unknownAction(action))
		}
		if !d.allowed(w, r) {
			return nil
		}
		out, err := Act(d.registry(), name, action)
		if err != nil {
			return dashError(w, http.StatusNotFound, strings.TrimPrefix(err.Error(), ErrNotFound.Error()+": "))
		}
		return dashJSON(w, r, http.StatusOK, out)
	case n >= 3 && segs[n-3] == "sessions" && segs[n-1] == "end":
		if !d.allowed(w, r) {
			return nil
		}
		id, err := url.PathUnescape(segs[n-2])
		if err != nil {
			return dashError(w, http.StatusNotFound, "bad session ID in the path")
		}
		out, err := EndSession(d.registry(), id)
		if err != nil {
			return dashError(w, http.StatusNotFound, strings.TrimPrefix(err.Error(), ErrNotFound.Error()+": "))
		}
		return dashJSON(w, r, http.StatusOK, out)
	}
	if sub, del, ok := recordingPath(segs); ok {
		if del {
			if !d.allowed(w, r) {
				return nil
			}
			out, err := DeleteRecording(r.Context(), d.registry(), strings.Trim(sub, "/"))
			if err != nil {
				return dashAPI(w, err)
			}
			return dashJSON(w, r, http.StatusOK, out)
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			return dashError(w, http.StatusMethodNotAllowed, "a recording's documents answer GET (its deletion is a POST to <id>/delete)")
		}
		setPrivate(w.Header())
		return dashAPI(w, ServeRecordings(w, r, d.registry(), sub))
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return dashError(w, http.StatusMethodNotAllowed, "the dashboard page answers GET")
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	hd.Set("Content-Length", strconv.Itoa(len(d.page)))
	hd.Set("Content-Security-Policy", dashboardCSP)
	setPrivate(hd)
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		w.Write(d.page)
	}
	return nil
}

// recordingPath reads a path of a recording under the dashboard:
// …/recordings/<id>, …/recordings/<id>/targets/<t>/frames/<n> and
// …/recordings/<id>/targets/<t>/video.mp4 (sub is what follows
// "recordings", as ServeRecordings takes it), and the action
// …/recordings/<id>/delete (del). A path of no such shape is not one
// (ok false): the page, served under a prefix of its own.
func recordingPath(segs []string) (sub string, del, ok bool) {
	n := len(segs)
	for _, k := range []int{1, 2, 4, 5} {
		if n < k+1 || segs[n-1-k] != "recordings" {
			continue
		}
		rest := segs[n-k:]
		if !recordings.ValidID(rest[0]) {
			continue
		}
		switch {
		case k == 1,
			k == 4 && rest[1] == "targets" && rest[3] == "video.mp4",
			k == 5 && rest[1] == "targets" && rest[3] == "frames":
			return "/" + strings.Join(rest, "/"), false, true
		case k == 2 && rest[1] == "delete":
			return "/" + rest[0], true, true
		}
	}
	return "", false, false
}

// serveNewest serves the newest frame of target t of recording id under
// way on this node (the live view's image), with its number and time in
// headers; 404 when it has none (yet, or any more).
func (d *Dashboard) serveNewest(w http.ResponseWriter, r *http.Request, id, t string) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return dashError(w, http.StatusMethodNotAllowed, "a live frame answers GET")
	}
	ti, err := strconv.Atoi(t)
	if err != nil || !recordings.ValidID(id) {
		return dashError(w, http.StatusNotFound, "want live/<id>/targets/<t>/frame")
	}
	img, ct, at, n, ok := NewestFrame(d.registry(), id, ti)
	if !ok {
		return dashError(w, http.StatusNotFound, fmt.Sprintf("no frame of target %d of a recording %q under way on this node", ti, id))
	}
	hd := w.Header()
	setPrivate(hd)
	hd.Set("Content-Type", ct)
	hd.Set("Content-Length", strconv.Itoa(len(img)))
	hd.Set("X-Frame-Number", strconv.Itoa(n))
	hd.Set("X-Frame-Time", at.UTC().Format(time.RFC3339Nano))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, err = w.Write(img)
	}
	return err
}

// dashAPI renders err, an error of the admin API's functions, as the
// dashboard's JSON error (nil: nothing to render).
func dashAPI(w http.ResponseWriter, err error) error {
	var ae caddy.APIError
	if err == nil || !errors.As(err, &ae) {
		return err
	}
	msg := ae.Message
	if msg == "" && ae.Err != nil {
		msg = ae.Err.Error()
	}
	return dashError(w, ae.HTTPStatus, msg)
}

// serveJSON answers a GET or HEAD of one of the page's JSON documents.
func (d *Dashboard) serveJSON(w http.ResponseWriter, r *http.Request, v func() any) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return dashError(w, http.StatusMethodNotAllowed, "this document answers GET")
	}
	return dashJSON(w, r, http.StatusOK, v())
}

// allowed checks an action request, answering it when it may not act: a
// POST (405 otherwise), with Controls on, from the page itself.
// (A failed write of the refusal has nobody to tell.)
func (d *Dashboard) allowed(w http.ResponseWriter, r *http.Request) bool {
	switch {
	case r.Method != http.MethodPost:
		w.Header().Set("Allow", "POST")
		dashError(w, http.StatusMethodNotAllowed, "actions are POSTs")
	case !d.Controls:
		dashError(w, http.StatusForbidden, "controls are off on this dashboard (browser_failover_dashboard { controls on } turns them on)")
	case !sameOrigin(r):
		dashError(w, http.StatusForbidden, "refused: an action must come from the dashboard page itself")
	default:
		return true
	}
	return false
}

// sameOrigin tells whether an action request comes from the page: it
// carries DashboardHeader, and its Origin and Sec-Fetch-Site, when the
// browser sent them, say same origin.
func sameOrigin(r *http.Request) bool {
	if r.Header.Get(DashboardHeader) == "" {
		return false
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return false
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || !strings.EqualFold(u.Host, r.Host) {
			return false
		}
	}
	return true
}

// setPrivate marks an answer as not to be stored, sniffed or referred.
func setPrivate(hd http.Header) {
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
}

func dashJSON(w http.ResponseWriter, r *http.Request, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	b = append(b, '\n')
	hd := w.Header()
	hd.Set("Content-Type", "application/json")
	hd.Set("Content-Length", strconv.Itoa(len(b)))
	setPrivate(hd)
	w.WriteHeader(status)
	if r.Method == http.MethodHead {
		return nil
	}
	_, err = w.Write(b)
	return err
}

func dashError(w http.ResponseWriter, status int, msg string) error {
	b, _ := json.Marshal(map[string]string{"error": msg})
	b = append(b, '\n')
	hd := w.Header()
	hd.Set("Content-Type", "application/json")
	hd.Set("Content-Length", strconv.Itoa(len(b)))
	setPrivate(hd)
	w.WriteHeader(status)
	_, err := w.Write(b)
	return err
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Dashboard)(nil)
	_ caddy.Validator             = (*Dashboard)(nil)
	_ caddyhttp.MiddlewareHandler = (*Dashboard)(nil)
)
