package status

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	_ "github.com/caddyserver/caddy/v2/modules/filestorage"

	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/pool"
)

// dashboard is a provisioned dashboard on the site gw.example.
func dashboard(t *testing.T, reg *pool.Registry, controls bool) *Dashboard {
	t.Helper()
	d := &Dashboard{Controls: controls, reg: reg}
	if err := d.Provision(siteContext("gw.example")); err != nil {
		t.Fatal(err)
	}
	return d
}

// siteContext is the context a handler is provisioned in on a server
// whose sites are addressed by the given host names (one route each, as
// the Caddyfile makes them), and a last site without any (:port).
func siteContext(hosts ...string) caddy.Context {
	srv := new(caddyhttp.Server)
	for _, h := range hosts {
		m := caddyhttp.MatchHost{h}
		srv.Routes = append(srv.Routes, caddyhttp.Route{MatcherSets: caddyhttp.MatcherSets{{&m}}})
	}
	srv.Routes = append(srv.Routes, caddyhttp.Route{})
	return caddy.Context{Context: context.WithValue(context.Background(), caddyhttp.ServerCtxKey, srv)}
}

// do sends one request to d; fromPage adds what the page's own fetch
// carries.
func do(t *testing.T, d *Dashboard, method, target string, fromPage bool, hdr map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, "http://gw.example:8080"+target, nil)
	if fromPage {
		r.Header.Set(DashboardHeader, "1")
		r.Header.Set("Origin", "http://gw.example:8080")
		r.Header.Set("Sec-Fetch-Site", "same-origin")
	}
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	if err := d.ServeHTTP(w, r, nil); err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	return w
}

// TestDashboardPage: the page is one document with nothing external, its
// policy allows exactly its own inline script and style, and it says
// whether controls are on; it is served under any prefix.
func TestDashboardPage(t *testing.T) {
	page := string(dashboardHTML)
	// Nothing loads from elsewhere: no src attribute, no link other than
	// the empty data: icon, no CSS import or url(), no absolute URL.
	for _, re := range []string{`(?i)\ssrc\s*=`, `(?i)@import`, `(?i)url\(`, `(?i)https?://`, `(?i)//[a-z0-9.-]+\.[a-z]{2,}/`} {
		if m := regexp.MustCompile(re).FindString(page); m != "" {
			t.Errorf("the page refers to something external: %q matches %s", m, re)
		}
	}
	if links := regexp.MustCompile(`(?i)<link[^>]*>`).FindAllString(page, -1); len(links) != 1 || !strings.Contains(links[0], `href="data:,"`) {
		t.Errorf("links %q", links)
	}
	if n := strings.Count(page, "<script"); n != 1 {
		t.Errorf("%d scripts, want one inline script", n)
	}

	for _, controls := range []bool{false, true} {
		d := dashboard(t, pool.NewRegistry(nil), controls)
		for _, path := range []string{"/", "/dash", "/dash/", "/ops/dashboard/"} {
			w := do(t, d, http.MethodGet, path, false, nil)
			if w.Code != 200 || w.Header().Get("Content-Type") != "text/html; charset=utf-8" {
				t.Fatalf("GET %s: %d %s", path, w.Code, w.Header().Get("Content-Type"))
			}
			body := w.Body.String()
			want := `data-controls="off"`
			if controls {
				want = `data-controls="on"`
			}
			if !strings.Contains(body, want) || strings.Contains(body, "{{") {
				t.Fatalf("GET %s: page without %s", path, want)
			}
			csp := w.Header().Get("Content-Security-Policy")
			for _, tag := range []string{"script", "style"} {
				m := regexp.MustCompile(`(?s)<` + tag + `>(.*?)</` + tag + `>`).FindStringSubmatch(body)
				sum := sha256.Sum256([]byte(m[1]))
				if !strings.Contains(csp, tag+"-src 'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'") {
					t.Fatalf("the policy does not allow the page's %s: %s", tag, csp)
				}
			}
			for _, dir := range []string{"default-src 'none'", "connect-src 'self'", "frame-ancestors 'none'"} {
				if !strings.Contains(csp, dir) {
					t.Fatalf("policy without %s: %s", dir, csp)
				}
			}
			if w.Header().Get("Cache-Control") != "no-store" {
				t.Fatal("the page may be cached")
			}
		}
		if w := do(t, d, http.MethodHead, "/dash/", false, nil); w.Code != 200 || w.Body.Len() != 0 {
			t.Fatalf("HEAD: %d, %d bytes", w.Code, w.Body.Len())
		}
		if w := do(t, d, http.MethodPost, "/dash/", true, nil); w.Code != 405 {
			t.Fatalf("POST on the page: %d", w.Code)
		}
	}
}

// TestDashboardJSONAndActions: the page's JSON is the admin API's; its
// actions run the admin API's actions, only with controls on and only
// from the page itself.
func TestDashboardJSONAndActions(t *testing.T) {
	reg := pool.NewRegistry(nil)
	p, err := reg.Claim("dash-unit", "ws://u:pw@h/?k=v", "ws://REDACTED@h/?k=REDACTED", t, cooldown.Config{}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.ReleaseClaim("dash-unit", t)
	slashed, err := reg.Claim("dash/unit", "ws://h2/", "ws://h2/", t, cooldown.Config{}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.ReleaseClaim("dash/unit", t)

	off, on := dashboard(t, reg, false), dashboard(t, reg, true)
	for _, d := range []*Dashboard{off, on} {
		w := do(t, d, http.MethodGet, "/dash/status.json", false, nil)
		var st Status
		if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &st) != nil || w.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("status.json: %d %s", w.Code, w.Body)
		}
		found := false
		for _, pr := range st.Providers {
			found = found || pr.Name == "dash-unit" && pr.URL == "ws://REDACTED@h/?k=REDACTED"
		}
		if !found || strings.Contains(w.Body.String(), "pw@") {
			t.Fatalf("status.json: %s", w.Body)
		}
		w = do(t, d, http.MethodGet, "/status.json", false, nil) // under handle_path
		if w.Code != 200 {
			t.Fatalf("status.json at the root: %d", w.Code)
		}
		w = do(t, d, http.MethodGet, "/dash/sessions.json", false, nil)
		var ss Sessions
		if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &ss) != nil || ss.Sessions == nil {
			t.Fatalf("sessions.json: %d %s", w.Code, w.Body)
		}
		if w := do(t, d, http.MethodPost, "/dash/status.json", true, nil); w.Code != 405 {
			t.Fatalf("POST status.json: %d", w.Code)
		}
	}

	// Controls off: every action is refused, even from the page.
	for _, path := range []string{"/dash/providers/dash-unit/drain", "/dash/sessions/any/end"} {
		if w := do(t, off, http.MethodPost, path, true, nil); w.Code != 403 || !strings.Contains(w.Body.String(), "controls are off") {
			t.Fatalf("controls off: POST %s: %d %s", path, w.Code, w.Body)
		}
	}
	if p.Draining() {
		t.Fatal("drained with controls off")
	}

	// Controls on: requests that are not the page's are refused.
	for name, hdr := range map[string]map[string]string{
		"no page header":        {DashboardHeader: ""},
		"another origin":        {"Origin": "http://evil.example"},
		"a cross-site fetch":    {"Sec-Fetch-Site": "cross-site"},
		"a same-site subdomain": {"Sec-Fetch-Site": "same-site"},
		"a bad origin":          {"Origin": "::"},
	} {
		if w := do(t, on, http.MethodPost, "/dash/providers/dash-unit/drain", true, hdr); w.Code != 403 {
			t.Fatalf("%s: %d %s", name, w.Code, w.Body)
		}
	}
	if p.Draining() {
		t.Fatal("drained by a refused request")
	}
	// The page's own: drain, undrain, reset answer the provider's object.
	w := do(t, on, http.MethodPost, "/dash/providers/dash-unit/drain", true, nil)
	var one Provider
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &one) != nil || !one.Draining || !p.Draining() {
		t.Fatalf("drain: %d %s", w.Code, w.Body)
	}
	if w := do(t, on, http.MethodPost, "/providers/dash-unit/undrain", true, nil); w.Code != 200 || p.Draining() {
		t.Fatalf("undrain under handle_path: %d %s", w.Code, w.Body)
	}
	// A header-only fetch (no Origin, no Sec-Fetch-Site: curl, an old
	// browser) is the page's if it carries the header.
	r := httptest.NewRequest(http.MethodPost, "http://gw.example:8080/dash/providers/dash-unit/reset", nil)
	r.Header.Set(DashboardHeader, "1")
	rw := httptest.NewRecorder()
	on.ServeHTTP(rw, r, nil)
	if rw.Code != 200 {
		t.Fatalf("reset: %d %s", rw.Code, rw.Body)
	}
	// A name with a slash travels escaped.
	if w := do(t, on, http.MethodPost, "/dash/providers/dash%2Funit/drain", true, nil); w.Code != 200 || !slashed.Draining() {
		t.Fatalf("escaped name: %d %s", w.Code, w.Body)
	}
	slashed.SetDraining(false)

	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{http.MethodPost, "/dash/providers/nope/drain", 404},
		{http.MethodPost, "/dash/providers/dash-unit/explode", 404},
		{http.MethodGet, "/dash/providers/dash-unit/drain", 405},
		{http.MethodPost, "/dash/sessions/no-such-id/end", 404},
		{http.MethodGet, "/dash/sessions/no-such-id/end", 405},
	} {
		if w := do(t, on, tc.method, tc.path, true, nil); w.Code != tc.status {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, w.Code, w.Body, tc.status)
		}
	}

	// Ending a live session from the page.
	_, client, provider := liveSession(t, p, pool.SessionInfo{ID: "dash-session", Protocol: "cdp"})
	w = do(t, on, http.MethodPost, "/dash/sessions/dash-session/end", true, nil)
	var s Session
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &s) != nil || s.ID != "dash-session" {
		t.Fatalf("end: %d %s", w.Code, w.Body)
	}
	for _, pr := range []*peer{client, provider} {
		if c := <-pr.closes; c != "1000 closed by operator" {
			t.Fatalf("close %q", c)
		}
	}
	if p.Slots.Active() != 0 {
		t.Fatalf("active %d after the end", p.Slots.Active())
	}
}

// TestDashboardCaddyfile: the directive's syntax and its errors, each at
// the offending line.
func TestDashboardCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		in       string
		controls bool
		err      string
	}{
		{"browser_failover_dashboard", false, ""},
		{"browser_failover_dashboard {\n}", false, ""},
		{"browser_failover_dashboard {\n controls on\n}", true, ""},
		{"browser_failover_dashboard {\n controls off\n}", false, ""},
		{"browser_failover_dashboard extra", false, "takes no arguments"},
		{"browser_failover_dashboard {\n controls\n}", false, "controls needs on or off, at Testfile:2"},
		{"browser_failover_dashboard {\n controls yes\n}", false, `controls "yes": want on or off, at Testfile:2`},
		{"browser_failover_dashboard {\n controls on off\n}", false, "controls takes one value"},
		{"browser_failover_dashboard {\n controls on\n controls off\n}", false, "controls given twice in the same block (first at Testfile:2), at Testfile:3"},
		{"browser_failover_dashboard {\n refresh 5s\n}", false, `unknown browser_failover_dashboard option "refresh" (want controls or hosts), at Testfile:2`},
	} {
		var d Dashboard
		err := d.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want %q", tc.in, err, tc.err)
		case tc.err == "" && d.Controls != tc.controls:
			t.Errorf("%q: controls %v", tc.in, d.Controls)
		}
	}
}

// hostsErrors are the names of hosts that are refused, each with its
// error, in JSON and in the Caddyfile alike.
var hostsErrors = []struct{ name, err string }{
	{"", "hosts: an empty name"},
	{"http://x", `hosts: "http://x" has a scheme: give the host name alone`},
	{"https://ops.example/dash", `hosts: "https://ops.example/dash" has a scheme: give the host name alone`},
	{"a/b", `hosts: "a/b" has a path: give the host name alone`},
	{"ops.example:8081", `hosts: "ops.example:8081" has a port: give the host name alone (the dashboard answers on any port)`},
	{"[::1]:8081", `hosts: "[::1]:8081" has a port: give the host name alone (the dashboard answers on any port)`},
	{"ops example", `hosts: "ops example" is not a host name`},
	{"user@ops.example", `hosts: "user@ops.example" is not a host name`},
}

// TestDashboardHostsCaddyfile: the hosts option's syntax and its errors,
// each at the option's line.
func TestDashboardHostsCaddyfile(t *testing.T) {
	type want struct {
		hosts []string
		err   string
	}
	cases := map[string]want{
		"browser_failover_dashboard {\n hosts ops.example\n}":                              {hosts: []string{"ops.example"}},
		"browser_failover_dashboard {\n controls on\n hosts Ops.Example *.ops.internal\n}": {hosts: []string{"Ops.Example", "*.ops.internal"}},
		"browser_failover_dashboard {\n hosts\n}":                                          {err: "hosts needs at least one host name, at Testfile:2"},
		"browser_failover_dashboard {\n hosts a.example\n controls on\n hosts b.example\n}": {
			err: "hosts given twice in the same block (first at Testfile:2), at Testfile:4"},
		"browser_failover_dashboard {\n hosts a.example A.example\n}": {err: `hosts: "A.example" given twice, at Testfile:2`},
	}
	for _, e := range hostsErrors {
		cases[fmt.Sprintf("browser_failover_dashboard {\n controls off\n hosts ok.example %q\n}", e.name)] = want{err: e.err + ", at Testfile:3"}
	}
	for in, tc := range cases {
		var d Dashboard
		err := d.UnmarshalCaddyfile(caddyfile.NewTestDispenser(in))
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", in, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want %q", in, err, tc.err)
		case tc.err == "" && !slices.Equal(d.Hosts, tc.hosts):
			t.Errorf("%q: hosts %q, want %q", in, d.Hosts, tc.hosts)
		}
	}
}

// TestDashboardHostsJSON: a JSON config's hosts is checked as the
// Caddyfile's is.
func TestDashboardHostsJSON(t *testing.T) {
	cases := map[string]string{
		`{}`:            "",
		`{"hosts": []}`: "",
		`{"hosts": ["ops.example", "*.ops.internal", "xn--bcher-kva.example"]}`: "",
		`{"hosts": ["a.example", "A.EXAMPLE"]}`:                                 `hosts: "A.EXAMPLE" given twice`,
	}
	for _, e := range hostsErrors {
		b, _ := json.Marshal(map[string][]string{"hosts": {"ok.example", e.name}})
		cases[string(b)] = e.err
	}
	for in, want := range cases {
		var d Dashboard
		if err := json.Unmarshal([]byte(in), &d); err != nil {
			t.Fatal(err)
		}
		err := d.Validate()
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v", in, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: error %v, want %q", in, err, want)
		}
	}
}

// TestDashboardHost: the page, its JSON and its actions answer only a
// Host that is an IP address, localhost, a name of the site's addresses
// or of hosts (any port, any case); any other Host gets 403 before
// anything is done, so a refused action leaves the provider as it was.
func TestDashboardHost(t *testing.T) {
	reg := pool.NewRegistry(nil)
	p, err := reg.Claim("dash-host", "ws://h/", "ws://h/", t, cooldown.Config{}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.ReleaseClaim("dash-host", t)
	t.Setenv("DASH_TEST_HOST", "env.example")

	// On the site gw.example, with more names of its own.
	d := &Dashboard{Controls: true, Hosts: []string{"Ops.Example", "*.tunnel.example", "{env.DASH_TEST_HOST}"}, reg: reg}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := d.Provision(siteContext("gw.example", "other.example")); err != nil {
		t.Fatal(err)
	}
	// A site's name given again in hosts is the same name, and two names
	// of hosts alike are left to Validate's clearer error.
	for _, hosts := range [][]string{{"GW.Example"}, {"a.example", "A.example"}} {
		if err := (&Dashboard{Hosts: hosts}).Provision(siteContext("gw.example")); err != nil {
			t.Errorf("hosts %q: %v", hosts, err)
		}
	}
	// On a site without a host matcher (:8081), with no hosts option.
	bare := &Dashboard{Controls: true, reg: reg}
	if err := bare.Provision(siteContext()); err != nil {
		t.Fatal(err)
	}

	send := func(d *Dashboard, method, host, path string) *httptest.ResponseRecorder {
		t.Helper()
		r := httptest.NewRequest(method, "http://placeholder"+path, nil)
		r.Host = host
		if method == http.MethodPost {
			// Everything the page's own fetch carries.
			r.Header.Set(DashboardHeader, "1")
			r.Header.Set("Origin", "http://"+host)
			r.Header.Set("Sec-Fetch-Site", "same-origin")
		}
		w := httptest.NewRecorder()
		if err := d.ServeHTTP(w, r, nil); err != nil {
			t.Fatalf("%s %s (Host %q): %v", method, path, host, err)
		}
		return w
	}

	for _, tc := range []struct {
		host    string
		d, bare bool // allowed by d, by bare
	}{
		{"127.0.0.1:8081", true, true},
		{"127.0.0.1", true, true},
		{"[::1]:8081", true, true},
		{"[::1]", true, true},
		{"localhost", true, true},
		{"localhost:9", true, true},
		{"LocalHost:8081", true, true},
		{"ops.example", true, false},     // hosts, in another case
		{"OPS.EXAMPLE:443", true, false}, // any port
		{"a.tunnel.example:8081", true, false},
		{"env.example", true, false}, // a placeholder of hosts
		{"gw.example:8080", true, false},
		{"other.example", true, false},
		{"GW.Example", true, false},

		{"evil.example", false, false},
		{"evil.example:8081", false, false},
		{"localhost.evil.example", false, false},
		{"127.0.0.1.nip.io", false, false},
		{"gw.example.evil.example", false, false},
		{"tunnel.example", false, false},       // the wildcard needs its label
		{"a.b.tunnel.example", false, false},   // one label, not two
		{"{env.DASH_TEST_HOST}", false, false}, // the Host is not expanded
		{"", false, false},
	} {
		for _, dc := range []struct {
			name    string
			d       *Dashboard
			allowed bool
		}{{"site gw.example", d, tc.d}, {"site :8081", bare, tc.bare}} {
			for _, path := range []string{"/dash/", "/dash/status.json", "/dash/sessions.json", "/dash/providers/dash-host/drain"} {
				method := http.MethodGet
				if strings.HasSuffix(path, "/drain") {
					method = http.MethodPost
				}
				w := send(dc.d, method, tc.host, path)
				if dc.allowed {
					if w.Code != http.StatusOK {
						t.Errorf("%s: %s %s with Host %q: %d %s, want 200", dc.name, method, path, tc.host, w.Code, w.Body)
					}
					continue
				}
				var e struct{ Error string }
				if w.Code != http.StatusForbidden || json.Unmarshal(w.Body.Bytes(), &e) != nil ||
					!strings.Contains(e.Error, "is not one of the dashboard's names") && !strings.Contains(e.Error, "has no Host") ||
					!strings.Contains(e.Error, "hosts") {
					t.Errorf("%s: %s %s with Host %q: %d %s, want 403 saying how to allow it", dc.name, method, path, tc.host, w.Code, w.Body)
				}
				if w.Header().Get("Content-Type") != "application/json" || w.Header().Get("Cache-Control") != "no-store" {
					t.Errorf("%s: refusal headers %v", dc.name, w.Header())
				}
			}
			if p.Draining() != dc.allowed {
				t.Errorf("%s: with Host %q the provider is drained: %v", dc.name, tc.host, p.Draining())
			}
			p.SetDraining(false)
		}
	}
	// The refusal names the Host and the option that allows it.
	w := send(bare, http.MethodGet, "evil.example:8081", "/")
	if !strings.Contains(w.Body.String(), `the Host \"evil.example\"`) || !strings.Contains(w.Body.String(), "browser_failover_dashboard { hosts evil.example }") {
		t.Errorf("refusal %s", w.Body)
	}
}

// TestDashboardHostConfig: in a real Caddy config, a site addressed by
// host names answers them (as before) and never hands another Host to the
// dashboard; a :port site without a host matcher answers IP addresses,
// localhost and its hosts, and refuses every other Host, a rebinding
// name among them, with 403, for the page, its JSON and its actions,
// which leave the provider as it was. The names of one server's sites are
// not another's. A JSON config with a bad name of hosts does not load.
func TestDashboardHostConfig(t *testing.T) {
	// The dashboards of a real Caddy show the process's registry.
	reg := pool.Acquire(nil)
	defer pool.Release()
	p, err := reg.Claim("dash-host-cfg", "ws://h/", "ws://h/", t, cooldown.Config{}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.ReleaseClaim("dash-host-cfg", t)
	port := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
	}
	named, bare := port(), port()
	caddyfileText := fmt.Sprintf(`{
	admin off
	persist_config off
	storage file_system %s
	log {
		output discard
	}
}

http://dash.example:%[2]s, http://*.dash.example:%[2]s {
	bind 127.0.0.1
	browser_failover_dashboard {
		controls on
	}
}

:%[3]s {
	bind 127.0.0.1
	handle /ops/* {
		browser_failover_dashboard {
			controls on
			hosts ops.internal
		}
	}
}
`, filepath.Join(t.TempDir(), "storage"), named, bare)
	cfg, warns, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfileText), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapt: %v %v", err, warns)
	}

	// The same config with a URL in hosts, as JSON: refused at load.
	bad := strings.Replace(string(cfg), `"hosts":["ops.internal"]`, `"hosts":["http://ops.internal"]`, 1)
	if bad == string(cfg) {
		t.Fatalf("no hosts in the adapted config: %s", cfg)
	}
	if err := caddy.Load([]byte(bad), true); err == nil || !strings.Contains(err.Error(), `hosts: "http://ops.internal" has a scheme`) {
		t.Fatalf("a JSON config with a URL in hosts: %v", err)
	}

	if err := caddy.Load(cfg, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddy.Stop() })

	client := &http.Client{}
	send := func(method, port, host, path string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, "http://127.0.0.1:"+port+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		if method == http.MethodPost {
			req.Header.Set(DashboardHeader, "1")
			req.Header.Set("Origin", "http://"+host)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	const drain = "/providers/dash-host-cfg/drain"
	for _, tc := range []struct {
		port, prefix, host string
		answer             int // 200: the dashboard; 403: refused; 0: no site (Caddy's empty answer)
	}{
		{named, "/", "dash.example:" + named, 200},
		{named, "/", "DASH.example:" + named, 200},
		{named, "/", "a.dash.example:" + named, 200},
		{named, "/", "evil.example:" + named, 0},
		{named, "/", "127.0.0.1:" + named, 0},

		{bare, "/ops/", "127.0.0.1:" + bare, 200},
		{bare, "/ops/", "localhost:" + bare, 200},
		{bare, "/ops/", "ops.internal:" + bare, 200},
		{bare, "/ops/", "rebind.test:" + bare, 403},
		{bare, "/ops/", "evil.example", 403},
		{bare, "/ops/", "localhost.evil.example:" + bare, 403},
		{bare, "/ops/", "127.0.0.1.nip.io:" + bare, 403},
		{bare, "/ops/", "dash.example:" + bare, 403}, // the other server's site
	} {
		for _, path := range []string{"", "status.json", drain[1:]} {
			method := http.MethodGet
			if path == drain[1:] {
				method = http.MethodPost
			}
			code, body := send(method, tc.port, tc.host, tc.prefix+path)
			var ok bool
			switch tc.answer {
			case 200:
				ok = code == 200 && (strings.Contains(body, "<!DOCTYPE html>") || strings.Contains(body, `"dash-host-cfg"`))
			case 403:
				ok = code == 403 && strings.Contains(body, "is not one of the dashboard's names") && strings.Contains(body, "hosts")
			default:
				ok = code == 200 && body == ""
			}
			if !ok {
				t.Errorf("%s %s%s with Host %q: %d %.200s", method, tc.prefix, path, tc.host, code, body)
			}
		}
		if p.Draining() != (tc.answer == 200) {
			t.Errorf("Host %q: the provider is drained: %v", tc.host, p.Draining())
		}
		p.SetDraining(false)
	}
}
