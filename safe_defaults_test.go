package browserfailover_test

// Safe defaults: the client's handshake headers stay at the gateway unless
// forward_headers names them; a provider URL may be a placeholder as a
// whole, checked once resolved; a webhook secret that resolves to nothing
// is refused.

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
)

// handlerOf adapts a Caddyfile site holding one browser_failover block
// and returns that handler's JSON.
func handlerOf(t *testing.T, block string) string {
	t.Helper()
	out, err := adapt(t, ":80 {\n"+block+"\n}")
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	return handlerIn(t, out)
}

// handlerIn is the first browser_failover handler's JSON in an adapted
// config.
func handlerIn(t *testing.T, out []byte) string {
	t.Helper()
	var doc any
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	var found any
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["handler"] == "browser_failover" {
				found = v
				return
			}
			for _, e := range v {
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(doc)
	if found == nil {
		t.Fatalf("no browser_failover handler in %s", out)
	}
	b, _ := json.Marshal(found)
	return string(b)
}

// allowApp lets the page origin of gatewayClientHeaders connect.
const allowApp = `"allowed_origins":["http://app.example"]`

// gatewayClientHeaders is what a client of a protected gateway sends
// besides the handshake: a forward_auth login's cookie, the gateway's own
// token and API key, and custom fields.
func gatewayClientHeaders() http.Header {
	return http.Header{
		"Cookie":          {"session=forward-auth-login"},
		"Authorization":   {"Bearer for-the-gateway"},
		"X-Gateway-Token": {"gateway-token-1"},
		"X-Api-Key":       {"sk-for-the-gateway"},
		"X-Custom":        {"custom-1"},
		"X-Trace-Id":      {"trace-1"},
		"X-Trace-Span":    {"span-1"},
		"User-Agent":      {"puppeteer-test/1"},
		"Origin":          {"http://app.example"},
	}
}

// providerGot opens a session through g with the client headers and
// returns the names of the fields the provider got besides those of the
// handshake itself, sorted, and the fields.
func providerGot(t *testing.T, g *testgw.Gateway, echo *fakes.Server) ([]string, http.Header) {
	t.Helper()
	c, _, err := dial(t, g.WS("/"), &websocket.DialOptions{
		HTTPHeader:      gatewayClientHeaders(),
		Subprotocols:    []string{"cdp"},
		CompressionMode: websocket.CompressionContextTakeover,
	})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	echoOnce(t, c, []byte("hi"))
	c.Close(websocket.StatusNormalClosure, "")
	h := echo.LastHeader()
	var names []string
	for k := range h {
		switch k {
		case "Upgrade", "Connection", "Sec-Websocket-Key", "Sec-Websocket-Version":
			continue
		}
		names = append(names, k)
	}
	slices.Sort(names)
	return names, h
}

// TestClientHeadersStayAtGateway: through a real gateway, a provider gets
// only the negotiation fields and User-Agent of a client that sent a
// cookie, the gateway's token, an API key and custom fields; with
// forward_headers (JSON and Caddyfile) a name and a prefix go too; a
// header_up copying a client field on purpose still works.
func TestClientHeadersStayAtGateway(t *testing.T) {
	echo := fakes.Echo("hdr-echo", nil)
	defer echo.Close()
	base := []string{"Sec-Websocket-Extensions", "Sec-Websocket-Protocol", "User-Agent"}
	with := func(extra ...string) []string {
		out := append(slices.Clone(base), extra...)
		slices.Sort(out)
		return out
	}
	cases := []struct {
		name, handler string
		want          []string
	}{
		{"default", handler(allowApp, provider("hdr-echo", echo.URL(), "")), with()},
		{"forward_headers (JSON)", handler(allowApp+`,"forward_headers":["x-custom","X-Trace-*"]`, provider("hdr-echo", echo.URL(), "")),
			with("X-Custom", "X-Trace-Id", "X-Trace-Span")},
		{"forward_headers (Caddyfile)", handlerOf(t, "browser_failover {\n allowed_origins http://app.example\n forward_headers X-Custom x-trace-*\n provider hdr-echo "+echo.URL()+"\n}"),
			with("X-Custom", "X-Trace-Id", "X-Trace-Span")},
		{"header_up copies on purpose", handlerOf(t, "browser_failover {\n allowed_origins http://app.example\n provider hdr-echo "+echo.URL()+" {\n  header_up X-Team {http.request.header.X-Gateway-Token}\n }\n}"),
			with("X-Team")},
	}
	var g *testgw.Gateway
	for _, tc := range cases {
		if g == nil {
			g = testgw.Start(t, tc.handler)
		} else if err := g.Reload(tc.handler); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		names, h := providerGot(t, g, echo)
		if !slices.Equal(names, tc.want) {
			t.Errorf("%s: the provider got %v, want exactly %v", tc.name, names, tc.want)
		}
		if h.Get("User-Agent") != "puppeteer-test/1" || h.Get("Sec-Websocket-Protocol") != "cdp" {
			t.Errorf("%s: User-Agent %q, subprotocol %q", tc.name, h.Get("User-Agent"), h.Get("Sec-Websocket-Protocol"))
		}
		if slices.Contains(tc.want, "X-Team") && h.Get("X-Team") != "gateway-token-1" {
			t.Errorf("%s: X-Team %q", tc.name, h.Get("X-Team"))
		}
	}
}

// TestForwardHeadersErrors: bad forward_headers lists are refused by the
// Caddyfile (at the option's line) and by JSON alike.
func TestForwardHeadersErrors(t *testing.T) {
	// The site address takes line 1: the block starts on line 2.
	for _, tc := range []struct {
		body, want string
		line       int
	}{
		{"browser_failover {\n provider a ws://h:1\n forward_headers\n}", "forward_headers needs at least one header field name", 4},
		{"browser_failover {\n provider a ws://h:1\n forward_headers Connection\n}", "forward_headers: Connection is never forwarded", 4},
		{"browser_failover {\n provider a ws://h:1\n forward_headers X-A*B\n}", `forward_headers: "X-A*B" is not a header field name`, 4},
		{"browser_failover {\n forward_headers X-A\n provider a ws://h:1\n forward_headers X-B\n}", "forward_headers given twice in the same block", 5},
	} {
		_, err := adapt(t, ":8080\n"+tc.body)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasSuffix(err.Error(), "at Caddyfile:"+strconv.Itoa(tc.line)) {
			t.Errorf("%q: %v, want %q at line %d", tc.body, err, tc.want, tc.line)
		}
	}
	for _, tc := range []struct{ list, want string }{
		{`["Upgrade"]`, "forward_headers: Upgrade is never forwarded"},
		{`["Host"]`, "forward_headers: Host is never forwarded"},
		{`["X Y"]`, `forward_headers: "X Y" is not a header field name`},
		{`[""]`, "forward_headers: empty field name"},
	} {
		err := validateJSON(t, handler(`"forward_headers":`+tc.list, provider("a", "ws://h:1", "")))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.list, err, tc.want)
		}
	}
}

// validateJSON runs caddy.Validate (provision included) on a config whose
// only route is handlerJSON.
func validateJSON(t *testing.T, handlerJSON string) error {
	t.Helper()
	cfg := `{"admin":{"disabled":true},"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:0"],"routes":[{"handle":[` + handlerJSON + `]}]}}}}}`
	var c caddy.Config
	if err := json.Unmarshal([]byte(cfg), &c); err != nil {
		t.Fatal(err)
	}
	return caddy.Validate(&c)
}

// TestProviderURLFromEnv: a provider URL that is an environment
// placeholder as a whole loads when the variable holds a good URL (JSON
// and Caddyfile, and a session goes through), and is refused at load with
// the provider named, and nothing of the URL shown, when it holds a bad
// one.
func TestProviderURLFromEnv(t *testing.T) {
	echo := fakes.Echo("env-echo", nil)
	defer echo.Close()
	const secret = "eNvUrLsEcReT"
	json := handler("", provider("env-echo", "{env.BF_TEST_BROWSER_URL}", ""))
	caddyfile := handlerOf(t, "browser_failover {\n provider env-echo {env.BF_TEST_BROWSER_URL}\n}")

	t.Setenv("BF_TEST_BROWSER_URL", echo.URL()+"?token="+secret)
	g := testgw.Start(t, json)
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatalf("session through a provider URL from the environment (JSON): %v", err)
	}
	echoOnce(t, c, []byte("env"))
	c.Close(websocket.StatusNormalClosure, "")
	st, raw := opStatus(t, g)
	if p := st.provider(t, "env-echo"); !strings.HasSuffix(p.URL, "?token=REDACTED") {
		t.Errorf("status shows the URL as %q", p.URL)
	}
	if strings.Contains(string(raw), secret) {
		t.Errorf("status shows the secret: %s", raw)
	}
	if err := g.Reload(caddyfile); err != nil {
		t.Fatalf("the Caddyfile's handler: %v", err)
	}
	c, _, err = dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatalf("session through a provider URL from the environment (Caddyfile): %v", err)
	}
	echoOnce(t, c, []byte("env"))
	c.Close(websocket.StatusNormalClosure, "")

	// Each load differs in text, so Caddy does not take it as unchanged.
	loads := 0
	distinct := func(h string) string {
		loads++
		return strings.Replace(h, `{"handler":"browser_failover"`, `{"handler":"browser_failover","max_attempts":`+strconv.Itoa(loads), 1)
	}
	for _, tc := range []struct{ value, want string }{
		{"", `provider "env-echo": the URL is empty once its placeholders are resolved`},
		{"127.0.0.1:9/?token=" + secret, `provider "env-echo": URL must start with ws://, wss://, http:// or https://`},
		{"ftp://u:" + secret + "@127.0.0.1/", `provider "env-echo": URL scheme "ftp" is not one of ws, wss, http, https`},
		{"ws:///path?token=" + secret, `provider "env-echo": URL has no host`},
		{"ws://127.0.0.1:9/#" + secret, `provider "env-echo": URL must not have a fragment`},
	} {
		t.Setenv("BF_TEST_BROWSER_URL", tc.value)
		for name, h := range map[string]string{"JSON": json, "Caddyfile": caddyfile} {
			err := g.Reload(distinct(h))
			if msg := adminError(t, err); !strings.Contains(msg, tc.want) {
				t.Errorf("%s with %q: %v, want %q", name, tc.value, err, tc.want)
			} else if strings.Contains(err.Error(), secret) {
				t.Errorf("%s: the error shows the URL's secret: %v", name, err)
			}
			if err := validateJSON(t, h); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("validate %s with %q: %v, want %q", name, tc.value, err, tc.want)
			}
		}
	}
	// The running config still serves.
	t.Setenv("BF_TEST_BROWSER_URL", echo.URL())
	c, _, err = dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatalf("after the refused loads: %v", err)
	}
	c.Close(websocket.StatusNormalClosure, "")
}

// TestWebhookSecretFromEnvUnset: a webhook secret whose variable is unset
// is refused at load, JSON and Caddyfile alike.
func TestWebhookSecretFromEnvUnset(t *testing.T) {
	const want = "webhook 1: webhook secret is empty once its placeholders are resolved"
	j := handler(`"webhooks":[{"url":"http://127.0.0.1:9/hook","secret":"{env.BF_TEST_UNSET_HOOK_SECRET}"}]`, provider("a", "ws://127.0.0.1:9/", ""))
	if err := validateJSON(t, j); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("JSON: %v, want %q", err, want)
	}
	cf := handlerOf(t, "browser_failover {\n provider a ws://127.0.0.1:9/\n webhook http://127.0.0.1:9/hook {\n  secret {env.BF_TEST_UNSET_HOOK_SECRET}\n }\n}")
	if err := validateJSON(t, cf); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Caddyfile: %v, want %q", err, want)
	}
}
