package status

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/pool"
)

func dashboard(t *testing.T, controls bool) *Dashboard {
	t.Helper()
	d := &Dashboard{Controls: controls}
	if err := d.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	return d
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
		d := dashboard(t, controls)
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
	p, err := pool.Claim("dash-unit", "ws://u:pw@h/?k=v", "ws://REDACTED@h/?k=REDACTED", t, cooldown.Config{}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.ReleaseClaim("dash-unit", t)
	slashed, err := pool.Claim("dash/unit", "ws://h2/", "ws://h2/", t, cooldown.Config{}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.ReleaseClaim("dash/unit", t)

	off, on := dashboard(t, false), dashboard(t, true)
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
	r := httptest.NewRequest(http.MethodPost, "/dash/providers/dash-unit/reset", nil)
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
	if p.Active() != 0 {
		t.Fatalf("active %d after the end", p.Active())
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
		{"browser_failover_dashboard {\n refresh 5s\n}", false, `unknown browser_failover_dashboard option "refresh" (want controls), at Testfile:2`},
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
