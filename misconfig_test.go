package browserfailover_test

// Bad configs loaded at runtime through the admin API's /load: each is
// rejected with an error naming the problem, and the running config goes on
// serving as it was (same limits, same shown URL, sessions alive).

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
)

// adminError is the message of the admin API's JSON error answer in err
// ("" for no error).
func adminError(t *testing.T, err error) string {
	t.Helper()
	if err == nil {
		return ""
	}
	_, body, ok := strings.Cut(err.Error(), " {")
	var doc struct {
		Error string `json:"error"`
	}
	if !ok || json.Unmarshal([]byte("{"+body), &doc) != nil || doc.Error == "" {
		t.Fatalf("admin error is not the usual JSON: %v", err)
	}
	return doc.Error
}

func TestMisconfigRuntimeLoadRejected(t *testing.T) {
	echo := fakes.Echo("rt-echo", nil)
	defer echo.Close()
	other := fakes.Echo("rt-other", nil)
	defer other.Close()
	hook := newOpReceiver(t, nil)
	defer hook.Close()

	// The running config: rt-echo takes two sessions at most, no queue.
	const secret = "rTsEcReT9"
	good := handler(`"queue":{"size":0}`, provider("rt-echo", echo.URL(), `"max_concurrent":2`))
	g := testgw.Start(t, good)
	st, _ := opStatus(t, g)
	before := st.provider(t, "rt-echo")

	held, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer held.CloseNow()
	echoOnce(t, held, []byte("before"))

	p := func(name, url, extra string) string { return provider(name, url, extra) }
	one := func(extra string, ps ...string) string { return handler(extra, ps...) }
	missingCA := filepath.Join(t.TempDir(), "missing-ca.pem")
	cases := []struct {
		name, handler, want string
	}{
		{"duplicate names", one("", p("rt-a", echo.URL(), ""), p("rt-a", other.URL(), "")), `duplicate provider name "rt-a"`},
		{"bad scheme", one("", p("rt-a", "tcp://u:"+secret+"@h:1/?k="+secret, "")), `URL scheme "tcp" is not one of ws, wss, http, https`},
		{"no scheme", one("", p("rt-a", "h:1/?k="+secret, "")), `must start with ws://, wss://, http:// or https://`},
		{"no host", one("", p("rt-a", "ws:///path?k="+secret, "")), `provider "rt-a": URL has no host`},
		{"negative max_concurrent", one("", p("rt-echo", echo.URL(), `"max_concurrent":-1`)), `provider "rt-echo": max_concurrent must not be negative`},
		{"negative max_attempts", one(`"max_attempts":-2`, p("rt-a", echo.URL(), "")), `max_attempts must not be negative`},
		{"negative queue size", one(`"queue":{"size":-1}`, p("rt-a", echo.URL(), "")), `queue size must not be negative`},
		{"negative min_requests", one(`"cooldown":{"min_requests":-1}`, p("rt-a", echo.URL(), "")), `min_requests must not be negative`},
		{"ratio above 1", one(`"cooldown":{"failure_threshold":1.5}`, p("rt-a", echo.URL(), "")), `failure_threshold must be in (0,1]`},
		{"negative ratio", one("", p("rt-a", echo.URL(), `"cooldown":{"failure_threshold":-0.5}`)), `provider "rt-a": cooldown: failure_threshold must be in (0,1]`},
		{"weight below 1", one("", p("rt-a", echo.URL(), `"weight":-1`)), `weight must be at least 1`},
		{"unknown field", one(`"colour":"blue"`, p("rt-a", echo.URL(), "")), `unknown field "colour"`},
		{"unknown provider field", one("", p("rt-a", echo.URL(), `"max_concurent":3`)), `unknown field "max_concurent"`},
		{"unknown strategy", one(`"strategy":"fastest"`, p("rt-a", echo.URL(), "")), `unknown strategy "fastest"`},
		{"no providers", `{"handler":"browser_failover"}`, `no providers`},
		{"discover on ws", one("", p("rt-a", "ws://h:1/", `"discover":true`)), `discover on needs an http:// or https:// URL`},
		{"discover on bidi", one("", p("rt-a", "http://h:1/?k="+secret, `"protocol":"bidi","discover":true`)), `provider "rt-a": discover on does not apply to a bidi provider`},
		{"unknown protocol", one("", p("rt-a", echo.URL(), `"protocol":"selenium"`)), `provider "rt-a": protocol "selenium": want cdp, playwright, bidi, webdriver or any`},
		{"bad header_up op", one("", p("rt-a", echo.URL(), `"headers_up":[{"op":"append","field":"X-A","value":"`+secret+`"}]`)), `header_up op "append"`},
		{"bad webhook URL", one(`"webhooks":[{"url":"ftp://hooks.example.com/in?token=`+secret+`"}]`, p("rt-a", echo.URL(), "")), `webhook URL scheme "ftp" is not http or https`},
		{"unknown webhook event", one(fmt.Sprintf(`"webhooks":[{"url":%q,"events":["exploded"]}]`, hook.URL), p("rt-a", echo.URL(), "")), `unknown event "exploded"`},
		{"wrong JSON type", one(`"queue":{"size":"ten"}`, p("rt-a", echo.URL(), "")), `cannot unmarshal string`},
		// One name, two URLs, across two handlers of one config; the first
		// handler redeclares the running provider with other limits.
		{"two URLs for one name", one("", p("rt-echo", echo.URL(), `"max_concurrent":1`)) + "," + one("", p("rt-echo", other.URL(), "")),
			`provider "rt-echo" is declared with two different URLs`},
		// The running provider redeclared with other limits and URL, and
		// a later provider that cannot be built.
		{"missing CA file", one(`"cooldown":{"min_requests":1,"duration":"1h"}`,
			p("rt-echo", "ws://elsewhere.invalid:1/?k="+secret, `"max_concurrent":1`),
			p("rt-tls", "wss://127.0.0.1:1/", fmt.Sprintf(`"tls":{"trusted_ca_certs":[%q]}`, missingCA))), `tls_trusted_ca_certs`},
		{"TLS options on ws", one("", p("rt-a", "ws://h:1/", `"tls":{"insecure_skip_verify":true}`)), `TLS options need a wss:// or https:// URL`},
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			msg := adminError(t, g.Load(g.Config(tc.handler)))
			if msg == "" {
				t.Fatalf("config accepted, want an error naming %q", tc.want)
			}
			if !strings.Contains(msg, tc.want) {
				t.Fatalf("error %q does not name the problem %q", msg, tc.want)
			}
			if strings.Contains(msg, secret) {
				t.Fatalf("error shows a secret: %s", msg)
			}
			t.Logf("rejected: %s", msg[strings.LastIndex(msg, "http.handlers.browser_failover: ")+1:])
			// The running config keeps serving: the old session lives, a
			// new one opens (rt-echo still takes two), and the provider's
			// state is the running config's.
			echoOnce(t, held, []byte("still alive after "+tc.name))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, resp, err := websocket.Dial(ctx, g.WS("/"), nil)
			if err != nil {
				code := 0
				if resp != nil {
					code = resp.StatusCode
				}
				t.Fatalf("a new connect after the rejected load: %d %v", code, err)
			}
			echoOnce(t, c, []byte("new"))
			c.Close(websocket.StatusNormalClosure, "")
			st, body := opStatus(t, g)
			after := st.provider(t, "rt-echo")
			if after.URL != before.URL || after.MaxConcurrent != before.MaxConcurrent || !after.Healthy {
				t.Fatalf("the rejected load changed the running provider: %s", body)
			}
			if strings.Contains(string(body), secret) {
				t.Fatalf("status shows a secret: %s", body)
			}
			testgw.Eventually(t, 5*time.Second, "the new session to end", func() bool { return active("rt-echo") == 1 })
		})
	}
	// A good load still goes through afterwards.
	if err := g.Reload(good); err != nil {
		t.Fatalf("good config after the bad ones: %v", err)
	}
	echoOnce(t, held, []byte("after all"))
	if strings.Contains(g.Logs(), secret) {
		t.Fatal("the logs show a secret of a rejected config")
	}
}
