package upstreams

import (
	"net/http"
	"strings"
	"testing"
)

func TestClientProtocol(t *testing.T) {
	tests := []struct {
		name    string
		header  http.Header
		proto   Protocol
		version string
	}{
		{"puppeteer", http.Header{"User-Agent": {"Puppeteer/25.16.0"}}, ProtocolCDP, ""},
		{"chromedp (Go)", http.Header{"User-Agent": {"Go-http-client/1.1"}}, ProtocolCDP, ""},
		{"connectOverCDP sends a Playwright UA", http.Header{"User-Agent": {"Playwright/1.65.1 (x64; debian 12) node/20.20"}}, ProtocolCDP, ""},
		{"connect()", http.Header{"User-Agent": {"Playwright/1.65.1 (x64; debian 12) node/20.20"}, "X-Playwright-Browser": {"chromium"}}, ProtocolPlaywright, "1.65"},
		{"connect() with a prerelease", http.Header{"User-Agent": {"Playwright/1.66.0-alpha-2026-11-01 (x64)"}, "X-Playwright-Browser": {"chromium"}}, ProtocolPlaywright, "1.66"},
		{"connect() with an empty browser", http.Header{"User-Agent": {"Playwright/1.9.3"}, "X-Playwright-Browser": {""}}, ProtocolPlaywright, "1.9"},
		{"connect() without a UA", http.Header{"X-Playwright-Browser": {"firefox"}}, ProtocolPlaywright, ""},
		{"connect() with a UA of another product first", http.Header{"User-Agent": {"MyTool/2.0 Playwright/1.64.0"}, "X-Playwright-Browser": {"chromium"}}, ProtocolPlaywright, "1.64"},
		{"garbage version", http.Header{"User-Agent": {"Playwright/x.y"}, "X-Playwright-Browser": {"chromium"}}, ProtocolPlaywright, ""},
	}
	for _, tc := range tests {
		p, v := ClientProtocol(tc.header, "/")
		if p != tc.proto || v != tc.version {
			t.Errorf("%s: got %s %q, want %s %q", tc.name, p, v, tc.proto, tc.version)
		}
	}
}

// TestClientProtocolBiDiPaths: a WebDriver BiDi client is told by its
// upgrade's path: /session, or /session/<id>, behind any prefix, in any
// case, with one trailing slash; the query is not part of the path (the
// handler passes r.URL.Path). A Playwright handshake stays Playwright.
func TestClientProtocolBiDiPaths(t *testing.T) {
	for path, want := range map[string]Protocol{
		"/session":                        ProtocolBiDi,
		"/session/":                       ProtocolBiDi,
		"/SESSION":                        ProtocolBiDi,
		"/Session/4c1b9a0e-0f3e-4f7b":     ProtocolBiDi,
		"/session/abc/":                   ProtocolBiDi,
		"/firefox/session":                ProtocolBiDi,
		"/ff/v1/sessioN/9":                ProtocolBiDi,
		"/":                               ProtocolCDP,
		"":                                ProtocolCDP,
		"session":                         ProtocolCDP,
		"/sessions":                       ProtocolCDP,
		"/mysession":                      ProtocolCDP,
		"/session-x":                      ProtocolCDP,
		"/session/abc/def":                ProtocolCDP,
		"/session//":                      ProtocolCDP,
		"/devtools/browser/3b2f-session":  ProtocolCDP,
		"/devtools/browser/session-3b2f":  ProtocolCDP,
		"/devtools/page/ABC":              ProtocolCDP,
		"/chromium/playwright":            ProtocolCDP,
		"/session%2Fx":                    ProtocolCDP,
		"/ſession":                        ProtocolCDP,
		"/sessİon/x":                      ProtocolCDP,
		"/x/session/y/session/z/sessionx": ProtocolCDP,
	} {
		if got, v := ClientProtocol(http.Header{"User-Agent": {"Puppeteer/25.16.0"}}, path); got != want || v != "" {
			t.Errorf("path %q: %s %q, want %s", path, got, v, want)
		}
	}
	// What r.URL.Path is for a request URI with a query: the query is
	// not part of it, so it never decides.
	for uri, want := range map[string]Protocol{
		"/session?token=abc":                ProtocolBiDi,
		"/SESSION/?x=/devtools":             ProtocolBiDi,
		"/devtools/browser/x?next=/session": ProtocolCDP,
		"/?bf_resume_token=session":         ProtocolCDP,
	} {
		r, err := http.NewRequest(http.MethodGet, "http://gw"+uri, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := ClientProtocol(r.Header, r.URL.Path); got != want {
			t.Errorf("request URI %q: %s, want %s", uri, got, want)
		}
	}
	pw := http.Header{"User-Agent": {"Playwright/1.65.1"}, "X-Playwright-Browser": {"firefox"}}
	if got, v := ClientProtocol(pw, "/session"); got != ProtocolPlaywright || v != "1.65" {
		t.Errorf("a Playwright handshake on /session: %s %q", got, v)
	}
}

func TestServesAndPrefers(t *testing.T) {
	tests := []struct {
		p       Protocol
		pv      string
		cp      Protocol
		cv      string
		serves  bool
		prefers bool
	}{
		{ProtocolAny, "", ProtocolCDP, "", true, false},
		{ProtocolAny, "", ProtocolPlaywright, "1.65", true, false},
		{ProtocolCDP, "", ProtocolCDP, "", true, false},
		{ProtocolCDP, "", ProtocolPlaywright, "1.65", false, false},
		{ProtocolPlaywright, "", ProtocolCDP, "", false, false},
		{ProtocolPlaywright, "", ProtocolPlaywright, "1.65", true, false},
		{ProtocolPlaywright, "1.65", ProtocolPlaywright, "1.65", true, true},
		{ProtocolPlaywright, "1.65", ProtocolPlaywright, "1.64", false, false},
		{ProtocolPlaywright, "1.65", ProtocolPlaywright, "", true, false},
		{ProtocolAny, "", ProtocolBiDi, "", true, false},
		{ProtocolBiDi, "", ProtocolBiDi, "", true, false},
		{ProtocolBiDi, "", ProtocolCDP, "", false, false},
		{ProtocolBiDi, "", ProtocolPlaywright, "1.65", false, false},
		{ProtocolCDP, "", ProtocolBiDi, "", false, false},
		{ProtocolPlaywright, "", ProtocolBiDi, "", false, false},
	}
	for _, tc := range tests {
		if got := Serves(tc.p, tc.pv, tc.cp, tc.cv); got != tc.serves {
			t.Errorf("Serves(%s %q, %s %q) = %v", tc.p, tc.pv, tc.cp, tc.cv, got)
		}
		if got := Prefers(tc.p, tc.pv, tc.cp, tc.cv); got != tc.prefers {
			t.Errorf("Prefers(%s %q, %s %q) = %v", tc.p, tc.pv, tc.cp, tc.cv, got)
		}
	}
}

func TestParseProtocolOptions(t *testing.T) {
	for in, want := range map[string]Protocol{"": ProtocolAny, "any": ProtocolAny, "CDP": ProtocolCDP, "playwright": ProtocolPlaywright, "bidi": ProtocolBiDi, "BiDi": ProtocolBiDi, "webdriver": ProtocolWebDriver} {
		if got, err := ParseProtocol(in); err != nil || got != want {
			t.Errorf("ParseProtocol(%q) = %s, %v", in, got, err)
		}
	}
	for _, bad := range []string{"selenium", "firefox", "webDriverBiDi"} {
		if _, err := ParseProtocol(bad); err == nil {
			t.Errorf("protocol %q accepted", bad)
		}
	}
	for in, want := range map[string]string{"1.65": "1.65", "01.065": "1.65", "2.0": "2.0"} {
		if got, err := ParsePlaywrightVersion(in); err != nil || got != want {
			t.Errorf("ParsePlaywrightVersion(%q) = %q, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "1", "1.65.1", "v1.65", "1.x", "-1.2", "1.-2"} {
		if _, err := ParsePlaywrightVersion(bad); err == nil {
			t.Errorf("playwright_version %q accepted", bad)
		}
	}
}

// FuzzClientProtocol: any handshake is recognised without panicking: as
// Playwright when it carries x-playwright-browser, else as BiDi exactly
// when its path is a BiDi endpoint, else as CDP; and a version is always a
// canonical major.minor.
func FuzzClientProtocol(f *testing.F) {
	f.Add("Playwright/1.65.1 (x64; debian 12) node/20.20", true, "/")
	f.Add("Puppeteer 25.16.0", false, "/session")
	f.Add("playwright/01.2-beta", true, "/session/x")
	f.Fuzz(func(t *testing.T, ua string, pwHeader bool, path string) {
		h := http.Header{"User-Agent": {ua}}
		if pwHeader {
			h.Set("X-Playwright-Browser", "chromium")
		}
		p, v := ClientProtocol(h, path)
		if !pwHeader {
			want := ProtocolCDP
			if IsBiDiPath(path) {
				want = ProtocolBiDi
			}
			if p != want || v != "" {
				t.Fatalf("%q on %q without x-playwright-browser: %s %q, want %s", ua, path, p, v, want)
			}
			if p == ProtocolBiDi && !strings.HasSuffix(strings.ToLower(strings.TrimSuffix(path, "/")), "/session") &&
				!strings.Contains(strings.ToLower(path), "/session/") {
				t.Fatalf("%q taken as a BiDi path", path)
			}
			return
		}
		if p != ProtocolPlaywright {
			t.Fatalf("%q with x-playwright-browser: %s", ua, p)
		}
		if v != "" {
			if canon, err := ParsePlaywrightVersion(v); err != nil || canon != v {
				t.Fatalf("version %q of %q is not a canonical major.minor", v, ua)
			}
		}
	})
}
