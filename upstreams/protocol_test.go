package upstreams

import (
	"net/http"
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
		p, v := ClientProtocol(tc.header)
		if p != tc.proto || v != tc.version {
			t.Errorf("%s: got %s %q, want %s %q", tc.name, p, v, tc.proto, tc.version)
		}
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
	for in, want := range map[string]Protocol{"": ProtocolAny, "any": ProtocolAny, "CDP": ProtocolCDP, "playwright": ProtocolPlaywright} {
		if got, err := ParseProtocol(in); err != nil || got != want {
			t.Errorf("ParseProtocol(%q) = %s, %v", in, got, err)
		}
	}
	if _, err := ParseProtocol("bidi"); err == nil {
		t.Error("protocol bidi accepted")
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

// FuzzClientProtocol: any handshake is recognised without panicking, as CDP
// unless it carries x-playwright-browser, and a version is always a
// canonical major.minor.
func FuzzClientProtocol(f *testing.F) {
	f.Add("Playwright/1.65.1 (x64; debian 12) node/20.20", true)
	f.Add("Puppeteer 25.16.0", false)
	f.Add("playwright/01.2-beta", true)
	f.Fuzz(func(t *testing.T, ua string, pwHeader bool) {
		h := http.Header{"User-Agent": {ua}}
		if pwHeader {
			h.Set("X-Playwright-Browser", "chromium")
		}
		p, v := ClientProtocol(h)
		if !pwHeader {
			if p != ProtocolCDP || v != "" {
				t.Fatalf("%q without x-playwright-browser: %s %q", ua, p, v)
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
