package upstreams

// WebDriver's client side: create requests checked and merged with the
// provider's capabilities, which providers take them, WebDriver errors,
// and the configuration of webdriver providers.

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/internal/conf"
)

// wdTestSecret is a cloud hub's key, in the URL's user info and in the
// provider's capabilities: it must never be in an error, a log or an
// answer.
const wdTestSecret = "hub-key-5b2e9d71c0"

// wdProvider is a webdriver provider at url with a releaser of its own
// (no waits between tries) and books of its own; edit changes its
// configuration first.
func wdProvider(t *testing.T, url string, edit ...func(*Config)) (*Provider, *Releaser) {
	t.Helper()
	rel := NewReleaser()
	rel.Sleep = func(time.Duration) {}
	c := Config{Name: "wd", URL: url, Protocol: "webdriver", ConnectTimeout: caddy.Duration(5 * time.Second)}
	for _, e := range edit {
		e(&c)
	}
	p, err := New(c, Defaults{Releaser: rel, Books: &Books{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p, rel
}

func mustCreateRequest(t *testing.T, body string) *CreateRequest {
	t.Helper()
	r, err := ParseCreateRequest([]byte(body))
	if err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	return r
}

func TestParseCreateRequestRefuses(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"not JSON", `{"capabilities":`, "not a JSON object"},
		{"an array", `[{"capabilities":{}}]`, "not a JSON object"},
		{"null", `null`, "not a JSON object"},
		{"trailing data", `{"capabilities":{}} {}`, "not a JSON object"},
		{"no capabilities", `{"desiredCapabilities":{"browserName":"chrome"}}`, `no "capabilities" object`},
		{"capabilities not an object", `{"capabilities":[]}`, `no "capabilities" object`},
		{"capabilities null", `{"capabilities":null}`, `no "capabilities" object`},
		{"alwaysMatch not an object", `{"capabilities":{"alwaysMatch":"chrome"}}`, `"alwaysMatch" is not an object`},
		{"firstMatch not an array", `{"capabilities":{"firstMatch":{}}}`, `"firstMatch" is not a non-empty array`},
		{"firstMatch empty", `{"capabilities":{"firstMatch":[]}}`, `"firstMatch" is not a non-empty array`},
		{"firstMatch of strings", `{"capabilities":{"firstMatch":["chrome"]}}`, `"firstMatch" is not a non-empty array`},
		{"firstMatch null entry", `{"capabilities":{"firstMatch":[{},null]}}`, `entry 1 is not an object`},
		{"a name in both", `{"capabilities":{"alwaysMatch":{"browserName":"chrome"},"firstMatch":[{"browserName":"firefox"}]}}`, `names "browserName", which "alwaysMatch" names too`},
		{"too large", `{"capabilities":{"alwaysMatch":{"x":"` + strings.Repeat("a", MaxWebDriverCreate) + `"}}}`, "larger than 1048576 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseCreateRequest([]byte(tc.body))
			if err == nil || !errors.Is(err, errCreateRequest) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
			if len(err.Error()) > 200 {
				t.Fatalf("the error quotes the body: %.200s…", err)
			}
		})
	}
}

func TestParseCreateRequestExtensions(t *testing.T) {
	r := mustCreateRequest(t, `{"capabilities":{"alwaysMatch":{"bf:options":{"region":"eu"},"acceptInsecureCerts":true},
		"firstMatch":[{"browserName":"firefox","bf:options":{"region":"us"},"bf:other":1},{"browserName":"chrome"}]}}`)
	if got := string(r.Extension("bf:options")); got != `{"region":"eu"}` {
		t.Fatalf("bf:options %s, want alwaysMatch's", got)
	}
	if got := string(r.Extension("bf:other")); got != "1" {
		t.Fatalf("bf:other %s", got)
	}
	if r.Extension("bf:none") != nil {
		t.Fatal("an extension nobody sent")
	}
	if r.Browser() != "firefox" {
		t.Fatalf("browser %q", r.Browser())
	}
	if b := string(r.body(nil)); strings.Contains(b, "bf:") {
		t.Fatalf("forwarded %s", b)
	}
	if mustCreateRequest(t, `{"capabilities":{}}`).Browser() != "" {
		t.Fatal("a browser out of nothing")
	}
}

func TestCreateRequestMerge(t *testing.T) {
	t.Setenv("WD_TEST_KEY", wdTestSecret)
	p, _ := wdProvider(t, "http://127.0.0.1:1/wd/hub", func(c *Config) {
		c.Capabilities = json.RawMessage(`{"platformName":"linux","cloud:options":{"key":"{env.WD_TEST_KEY}","user":"{http.request.header.X-User}","build":7}}`)
	})
	r := mustCreateRequest(t, `{"capabilities":{"alwaysMatch":{"platformName":"windows","bf:options":{},"timeouts":{"script":12345678901234567}},
		"firstMatch":[{"browserName":"chrome","cloud:options":{"mine":true}},{"browserName":"firefox"}]}}`)
	replace := func(s string) string {
		s = strings.ReplaceAll(s, "{env.WD_TEST_KEY}", wdTestSecret) // as Caddy's replacer does at load
		return strings.ReplaceAll(s, "{http.request.header.X-User}", "alice")
	}
	// Load-time placeholders are resolved by New's known; here New had
	// none, so the request's replace does both.
	caps, secrets := p.wd.capsFor(replace)
	var got struct {
		Capabilities struct {
			AlwaysMatch map[string]json.RawMessage   `json:"alwaysMatch"`
			FirstMatch  []map[string]json.RawMessage `json:"firstMatch"`
		} `json:"capabilities"`
	}
	body := r.body(caps)
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	am, fm := got.Capabilities.AlwaysMatch, got.Capabilities.FirstMatch
	if string(am["platformName"]) != `"linux"` {
		t.Fatalf("platformName %s: the provider's must win", am["platformName"])
	}
	if string(am["cloud:options"]) != `{"build":7,"key":"`+wdTestSecret+`","user":"alice"}` {
		t.Fatalf("cloud:options %s", am["cloud:options"])
	}
	if string(am["timeouts"]) != `{"script":12345678901234567}` {
		t.Fatalf("the client's value changed: %s", am["timeouts"])
	}
	if len(fm) != 2 || string(fm[0]["browserName"]) != `"chrome"` || string(fm[1]["browserName"]) != `"firefox"` {
		t.Fatalf("firstMatch %s", body)
	}
	if _, ok := fm[0]["cloud:options"]; ok {
		t.Fatalf("a firstMatch entry keeps a name alwaysMatch now has: %s", body)
	}
	if strings.Contains(string(body), "bf:") {
		t.Fatalf("bf: forwarded: %s", body)
	}
	if !strings.Contains(strings.Join(secrets, " "), wdTestSecret) {
		t.Fatalf("secrets %q lack the key", secrets)
	}
	// Without firstMatch none is sent.
	if b := string(mustCreateRequest(t, `{"capabilities":{"alwaysMatch":{"browserName":"chrome"}}}`).body(nil)); b != `{"capabilities":{"alwaysMatch":{"browserName":"chrome"}}}` {
		t.Fatalf("body %s", b)
	}
}

func TestCapabilitiesLoadPlaceholders(t *testing.T) {
	rel := NewReleaser()
	known := func(s string) string { return strings.ReplaceAll(s, "{env.WD_TEST_KEY}", wdTestSecret) }
	p, err := New(Config{Name: "wd", URL: "https://hub.example.com/wd/hub", Protocol: "webdriver",
		Capabilities: json.RawMessage(`{"cloud:options":{"key":"{env.WD_TEST_KEY}","user":"{http.request.header.X-User}"}}`)},
		Defaults{Releaser: rel}, known)
	if err != nil {
		t.Fatal(err)
	}
	caps, _ := p.wd.capsFor(func(s string) string { return strings.ReplaceAll(s, "{http.request.header.X-User}", "bob") })
	if got := string(caps["cloud:options"]); got != `{"key":"`+wdTestSecret+`","user":"bob"}` {
		t.Fatalf("cloud:options %s", got)
	}
}

func TestAccepts(t *testing.T) {
	any, _ := wdProvider(t, "http://127.0.0.1:1")
	chrome, _ := wdProvider(t, "http://127.0.0.1:1", func(c *Config) { c.Browsers = []string{"Chrome", "MicrosoftEdge"} })
	for _, tc := range []struct {
		body       string
		any, chrom bool
	}{
		{`{"capabilities":{}}`, true, true},
		{`{"capabilities":{"alwaysMatch":{"browserName":"chrome"}}}`, true, true},
		{`{"capabilities":{"alwaysMatch":{"browserName":"CHROME"}}}`, true, true},
		{`{"capabilities":{"alwaysMatch":{"browserName":"microsoftedge"}}}`, true, true},
		{`{"capabilities":{"alwaysMatch":{"browserName":"firefox"}}}`, true, false},
		{`{"capabilities":{"firstMatch":[{"browserName":"firefox"},{"browserName":"chrome"}]}}`, true, true},
		{`{"capabilities":{"firstMatch":[{"browserName":"firefox"},{"browserName":"safari"}]}}`, true, false},
		{`{"capabilities":{"firstMatch":[{"browserName":"firefox"},{}]}}`, true, true},
		{`{"capabilities":{"alwaysMatch":{"acceptInsecureCerts":true},"firstMatch":[{"browserName":"firefox"}]}}`, true, false},
		// ASCII case only: the Kelvin sign is not a k.
		{`{"capabilities":{"alwaysMatch":{"browserName":"\u212Aromium"}}}`, true, true},
	} {
		r := mustCreateRequest(t, tc.body)
		if got := any.Accepts(r); got != tc.any {
			t.Errorf("%s: any provider accepts %v", tc.body, got)
		}
		if got := chrome.Accepts(r); got != tc.chrom && !strings.Contains(tc.body, "212A") {
			t.Errorf("%s: chrome provider accepts %v", tc.body, got)
		}
	}
	kr, _ := wdProvider(t, "http://127.0.0.1:1", func(c *Config) { c.Browsers = []string{"kromium"} })
	if kr.Accepts(mustCreateRequest(t, `{"capabilities":{"alwaysMatch":{"browserName":"\u212Aromium"}}}`)) {
		t.Error("Unicode case folding: the Kelvin sign matched k")
	}
	cdp := mustProvider(t, Config{Name: "c", URL: "ws://127.0.0.1:1/", Protocol: "cdp"}, Defaults{})
	if cdp.Accepts(mustCreateRequest(t, `{"capabilities":{}}`)) {
		t.Error("a cdp provider accepts WebDriver creates")
	}
}

func TestServesWebDriver(t *testing.T) {
	for _, tc := range []struct {
		p, c Protocol
		want bool
	}{
		{ProtocolWebDriver, ProtocolWebDriver, true},
		{ProtocolWebDriver, ProtocolCDP, false},
		{ProtocolWebDriver, ProtocolBiDi, false},
		{ProtocolWebDriver, ProtocolPlaywright, false},
		{ProtocolAny, ProtocolWebDriver, false},
		{"", ProtocolWebDriver, false},
		{ProtocolCDP, ProtocolWebDriver, false},
		{ProtocolBiDi, ProtocolWebDriver, false},
		{ProtocolPlaywright, ProtocolWebDriver, false},
		{ProtocolAny, ProtocolCDP, true},
	} {
		if got := Serves(tc.p, "", tc.c, ""); got != tc.want {
			t.Errorf("Serves(%s, %s) = %v", tc.p, tc.c, got)
		}
	}
	if p, err := ParseProtocol("WebDriver"); err != nil || p != ProtocolWebDriver {
		t.Fatalf("ParseProtocol: %v %v", p, err)
	}
	if ProtocolWebDriver.Resumable() {
		t.Fatal("WebDriver sessions are not resumable")
	}
}

func TestWebDriverConfig(t *testing.T) {
	yes := true
	for _, tc := range []struct {
		name string
		c    Config
		opt  string // the option at fault ("": valid)
		want string
	}{
		{"valid", Config{URL: "https://u:k@hub.example.com/wd/hub", Protocol: "webdriver", Browsers: []string{"chrome", "internet explorer"},
			Capabilities: json.RawMessage(`{"cloud:options":{"key":"x"}}`)}, "", ""},
		{"null capabilities", Config{URL: "http://h:1", Protocol: "cdp", Capabilities: json.RawMessage(`null`)}, "", ""},
		{"browsers without webdriver", Config{URL: "ws://h:1", Protocol: "cdp", Browsers: []string{"chrome"}}, "browsers", "browsers needs protocol webdriver"},
		{"browsers with any", Config{URL: "ws://h:1", Browsers: []string{"chrome"}}, "browsers", "browsers needs protocol webdriver"},
		{"capabilities without webdriver", Config{URL: "ws://h:1", Capabilities: json.RawMessage(`{}`)}, "capabilities", "capabilities needs protocol webdriver"},
		{"empty browser", Config{URL: "http://h:1", Protocol: "webdriver", Browsers: []string{""}}, "browsers", "is not a browserName"},
		{"capabilities not an object", Config{URL: "http://h:1", Protocol: "webdriver", Capabilities: json.RawMessage(`["` + wdTestSecret + `"]`)}, "capabilities", "capabilities must be a JSON object"},
		{"capabilities not JSON", Config{URL: "http://h:1", Protocol: "webdriver", Capabilities: json.RawMessage(`{"k":"` + wdTestSecret)}, "capabilities", "capabilities must be a JSON object"},
		{"bf: capabilities", Config{URL: "http://h:1", Protocol: "webdriver", Capabilities: json.RawMessage(`{"bf:options":{}}`)}, "capabilities", `names starting with "bf:"`},
		{"ws URL", Config{URL: "ws://h:1/", Protocol: "webdriver"}, "url", "protocol webdriver needs an http:// or https:// URL"},
		{"wss URL", Config{URL: "wss://h/", Protocol: "webdriver"}, "url", "protocol webdriver needs an http:// or https:// URL"},
		{"discover on", Config{URL: "http://h:1", Protocol: "webdriver", Discover: &yes}, "discover", "discover on does not apply to a webdriver provider"},
		{"session_api", Config{URL: "http://h:1", Protocol: "webdriver", SessionAPI: &SessionAPI{CreateMethod: "POST", CreateURL: "/s",
			ConnectURL: "/u", SessionID: "/id", ReleaseMethod: "DELETE", ReleaseURL: "/s/{session_id}"}}, "session_api", "session_api does not apply to a webdriver provider"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.c.Name = "p"
			err := tc.c.Validate(nil)
			if tc.opt == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if strings.Contains(err.Error(), wdTestSecret) {
				t.Fatalf("the error shows the capabilities: %v", err)
			}
			if pr := problemSaying(err, tc.want); pr == nil || len(pr.Options) != 1 || pr.Options[0] != tc.opt {
				t.Fatalf("no problem of option %s in %v", tc.opt, err)
			}
			// New refuses it the same way.
			if _, err := New(tc.c, Defaults{}, nil); err == nil {
				t.Fatal("New accepted it")
			}
		})
	}
	// A placeholder URL is judged once resolved.
	c := Config{Name: "p", URL: "{env.WD_URL}", Protocol: "webdriver"}
	if err := c.Validate(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := New(c, Defaults{}, func(string) string { return "ws://h:1/" }); err == nil || !strings.Contains(err.Error(), "http:// or https://") {
		t.Fatalf("resolved ws:// URL: %v", err)
	}
}

// problemSaying is the problem in err whose message holds want.
func problemSaying(err error, want string) *conf.Problem {
	var pr *conf.Problem
	if errors.As(err, &pr) && strings.Contains(pr.Msg, want) {
		return pr
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if pr := problemSaying(e, want); pr != nil {
				return pr
			}
		}
	}
	return nil
}

func TestWriteWebDriverError(t *testing.T) {
	for code, status := range map[string]int{
		ErrCodeSessionNotCreated: 500, ErrCodeInvalidSessionID: 404, ErrCodeInvalidArgument: 400,
		ErrCodeUnknownError: 500, ErrCodeUnknownCommand: 404, ErrCodeUnsupportedOperation: 500,
		"unknown method": 405, "something new": 500,
	} {
		rec := httptest.NewRecorder()
		rec.Header().Set("Retry-After", "3")
		WriteWebDriverError(rec, code, `no "provider" can start it`)
		if rec.Code != status {
			t.Errorf("%s: status %d, want %d", code, rec.Code, status)
		}
		var doc struct {
			Value map[string]string `json:"value"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
			t.Fatalf("%s: %v", code, err)
		}
		if doc.Value["error"] != code || doc.Value["message"] != `no "provider" can start it` {
			t.Errorf("%s: body %s", code, rec.Body)
		}
		if _, ok := doc.Value["stacktrace"]; !ok {
			t.Errorf("%s: no stacktrace in %s", code, rec.Body)
		}
		if rec.Header().Get("Content-Type") != "application/json; charset=utf-8" || rec.Header().Get("Retry-After") != "3" {
			t.Errorf("%s: header %v", code, rec.Header())
		}
	}
}

func TestIsInvalidSessionAnswer(t *testing.T) {
	chromedriver := `{"value":{"error":"invalid session id","message":"invalid session id","stacktrace":"#0 0x55f18c8399be \u003Cunknown>\n"}}`
	for _, tc := range []struct {
		status int
		body   string
		want   bool
	}{
		{404, chromedriver, true},
		{404, chromedriver[:60], true}, // a peeked prefix
		{404, `{"value":{"error":"no such element","message":"x"}}`, false},
		{200, chromedriver, false},
		{500, chromedriver, false},
		{404, `not json`, false},
		{404, `{"value":{"message":"invalid session id"}}`, false},
		{404, `{"error":"invalid session id"}`, false},
		{404, `{"value":{"error":"invalid sess`, false},
	} {
		if got := IsInvalidSessionAnswer(tc.status, []byte(tc.body)); got != tc.want {
			t.Errorf("%d %q: %v", tc.status, tc.body, got)
		}
	}
}
