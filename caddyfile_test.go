package browserfailover_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	browserfailover "github.com/browserfailover/caddy-browser-failover"
)

func adapt(t *testing.T, body string) ([]byte, error) {
	t.Helper()
	a := caddyconfig.GetAdapter("caddyfile")
	out, _, err := a.Adapt([]byte(body), map[string]any{"filename": "Caddyfile"})
	return out, err
}

// TestCaddyfileErrors: each bad input is rejected with a message naming the
// problem and the line.
func TestCaddyfileErrors(t *testing.T) {
	cases := []struct {
		name, body, want string
	}{
		{"unknown option", "browser_failover {\n provider a ws://h:1\n colour blue\n}", `Caddyfile:3 - Error during parsing: unknown option "colour"`},
		{"no providers", "browser_failover {\n strategy priority\n}", "no providers"},
		{"bad scheme", "browser_failover {\n provider a ftp://h:1\n}", `URL scheme "ftp" is not one of ws, wss, http, https`},
		{"no scheme", "browser_failover {\n provider a h:1\n}", "must start with ws://"},
		{"duplicate name", "browser_failover {\n provider a ws://h:1\n provider b ws://h:2\n provider a ws://h:3 {\n  priority 2\n }\n}", `Caddyfile:4 - Error during parsing: duplicate provider name "a"`},
		{"negative max_concurrent", "browser_failover {\n provider a ws://h:1 {\n  max_concurrent -1\n }\n}", "Caddyfile:3 - Error during parsing: max_concurrent must not be negative"},
		{"negative max_attempts", "browser_failover {\n max_attempts -2\n provider a ws://h:1\n}", "Caddyfile:2 - Error during parsing: max_attempts must not be negative"},
		{"negative min_requests", "browser_failover {\n provider a ws://h:1\n cooldown {\n  min_requests -1\n }\n}", "Caddyfile:4 - Error during parsing: min_requests must not be negative"},
		{"negative queue size", "browser_failover {\n provider a ws://h:1\n queue {\n  size -5\n }\n}", "Caddyfile:4 - Error during parsing: size must not be negative"},
		{"ratio zero", "browser_failover {\n provider a ws://h:1\n cooldown {\n  failure_threshold 0\n }\n}", "Caddyfile:4 - Error during parsing: failure_threshold must be a ratio in (0,1]"},
		{"ratio above one", "browser_failover {\n provider a ws://h:1\n cooldown {\n  failure_threshold 1.5\n }\n}", "failure_threshold must be a ratio in (0,1]"},
		{"weight zero", "browser_failover {\n provider a ws://h:1 {\n  weight 0\n }\n}", "Caddyfile:3 - Error during parsing: weight must be at least 1"},
		{"discover on ws", "browser_failover {\n provider a ws://h:1 {\n  discover on\n }\n}", "discover on needs an http:// or https:// URL"},
		{"bad strategy", "browser_failover {\n strategy fastest\n provider a ws://h:1\n}", `Caddyfile:2 - Error during parsing: unknown strategy "fastest"`},
		{"bad duration", "browser_failover {\n connect_timeout soon\n provider a ws://h:1\n}", `connect_timeout: invalid duration "soon"`},
		{"bad affinity", "browser_failover {\n provider a ws://h:1\n affinity body x\n}", `affinity source "body"`},
		{"provider args", "browser_failover {\n provider a\n}", "provider takes a name and a URL"},
		{"unknown provider option", "browser_failover {\n provider a ws://h:1 {\n  speed 9\n }\n}", `provider "a": unknown option "speed"`},
		{"header_up delete with value", "browser_failover {\n provider a ws://h:1 {\n  header_up -X-A b\n }\n}", "takes no value"},
		{"tls on ws", "browser_failover {\n provider a ws://h:1 {\n  tls_insecure_skip_verify\n }\n}", "TLS options need a wss:// or https:// URL"},
		{"discovery value", "browser_failover {\n provider a ws://h:1\n discovery maybe\n}", `want on or off, got "maybe"`},
		{"bad protocol", "browser_failover {\n provider a ws://h:1 {\n  protocol bidi\n }\n}", `Caddyfile:3 - Error during parsing: provider "a": protocol "bidi": want cdp, playwright or any`},
		{"bad playwright_version", "browser_failover {\n provider a ws://h:1 {\n  protocol playwright\n  playwright_version 1.65.1\n }\n}", `Caddyfile:4 - Error during parsing: provider "a": playwright_version "1.65.1": want <major>.<minor>`},
		{"version without playwright", "browser_failover {\n provider a ws://h:1 {\n  playwright_version 1.65\n }\n}", `provider "a": playwright_version needs protocol playwright`},
		{"client_limit not a placeholder", "browser_failover {\n provider a ws://h:1\n client_limit user 2\n}", `Caddyfile:3 - Error during parsing: client_limit key "user": want a placeholder`},
		{"client_limit zero", "browser_failover {\n provider a ws://h:1\n client_limit {http.auth.user.id} 0\n}", `Caddyfile:3 - Error during parsing: client_limit: "0" is not a number of sessions`},
		{"client_limit args", "browser_failover {\n provider a ws://h:1\n client_limit {http.auth.user.id}\n}", "client_limit takes a key placeholder and a number"},
		{"hedge_max one", "browser_failover {\n provider a ws://h:1\n hedge_max 1\n}", "Caddyfile:3 - Error during parsing: hedge_max must be at least 2"},
		{"hedge_after bad", "browser_failover {\n provider a ws://h:1\n hedge_after later\n}", `hedge_after: invalid duration "later"`},
		{"state backend", "browser_failover {\n provider a ws://h:1\n state etcd h:2379\n}", "Caddyfile:3 - Error during parsing: state takes a backend and its address"},
		{"state option", "browser_failover {\n provider a ws://h:1\n state redis h:6379 {\n  colour red\n }\n}", `Caddyfile:4 - Error during parsing: state: unknown option "colour"`},
		{"state on_unavailable", "browser_failover {\n provider a ws://h:1\n state redis h:6379 {\n  on_unavailable wait\n }\n}", `on_unavailable "wait": want local or reject`},
		{"max below duration", "browser_failover {\n provider a ws://h:1\n cooldown {\n  duration 1m\n  max_duration 10s\n }\n}", "max_duration (10s) is shorter than duration (1m0s)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := adapt(t, ":8080\n"+tc.body)
			if err == nil {
				t.Fatalf("adapted without error, want %q", tc.want)
			}
			// A want of "Caddyfile:N - Error during parsing: msg" checks msg
			// and the line; the site address takes line 1, so the block's
			// lines are shifted by one.
			msg, line := tc.want, ""
			if rest, ok := strings.CutPrefix(tc.want, "Caddyfile:"); ok {
				n, m, _ := strings.Cut(rest, " - Error during parsing: ")
				msg, line = m, shiftLine("Caddyfile:"+n)
			}
			if !strings.Contains(err.Error(), msg) {
				t.Fatalf("error %q does not contain %q", err, msg)
			}
			if line != "" && !strings.HasSuffix(err.Error(), "at "+line) {
				t.Fatalf("error %q does not name %s", err, line)
			}
		})
	}
}

// shiftLine moves a "Caddyfile:N" reference down one line.
func shiftLine(s string) string {
	const p = "Caddyfile:"
	i := strings.Index(s, p)
	if i < 0 {
		return s
	}
	j := i + len(p)
	n := 0
	k := j
	for k < len(s) && s[k] >= '0' && s[k] <= '9' {
		n = n*10 + int(s[k]-'0')
		k++
	}
	return s[:j] + itoa(n+1) + s[k:]
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(b)
}

// TestCaddyfileFull: every option parses into the JSON of SPEC section 2.
func TestCaddyfileFull(t *testing.T) {
	body := `:8080
browser_failover /browser* {
	strategy weighted
	connect_timeout 15s
	try_duration 30s
	max_attempts 3
	provider cloud wss://connect.example.com/?apiKey={env.API_KEY} {
		priority -1
		weight 3
		max_concurrent 5
		connect_timeout 20s
		header_up X-Api-Key {env.API_KEY}
		header_up +X-Trace abc
		header_up -Cookie
		pass_query
		tls_server_name connect.example.com
		cooldown {
			duration 10s
		}
	}
	provider local http://127.0.0.1:9222 {
		discover off
	}
	cooldown {
		duration 20s
		max_duration 2m
		window 30s
		failure_threshold 0.25
		min_requests 4
	}
	queue {
		size 0
		timeout 5s
	}
	session {
		idle_timeout 5m
		max_duration 1h
	}
	affinity header X-Session
	discovery off
	client_limit {http.request.header.X-Api-Key} 3
	hedge_after 250ms
	hedge_max 3
	state redis 127.0.0.1:6379 {
		username gw
		password {env.REDIS_PASSWORD}
		db 2
		key_prefix bf:
		tls_server_name redis.internal
		lease_ttl 10s
		timeout 250ms
		node gw-1
		on_unavailable reject
	}
}
browser_failover /pw* {
	provider pw ws://127.0.0.1:3000/ {
		protocol playwright
		playwright_version 1.65
	}
	provider chrome http://127.0.0.1:9222 {
		protocol CDP
	}
}`
	out, err := adapt(t, body)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Routes []struct {
						Handle []json.RawMessage `json:"handle"`
					} `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	var raw json.RawMessage
	for _, s := range cfg.Apps.HTTP.Servers {
		for _, r := range s.Routes {
			for _, h := range r.Handle {
				if strings.Contains(string(h), `"browser_failover"`) && raw == nil {
					raw = h
				}
			}
		}
	}
	if raw == nil {
		t.Fatalf("no browser_failover handler in %s", out)
	}
	var h browserfailover.Handler
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	if err := dec.Decode(&h); err != nil {
		t.Fatal(err)
	}
	p := h.Providers[0]
	if h.Strategy != "weighted" || h.MaxAttempts != 3 || len(h.Providers) != 2 ||
		*p.Priority != -1 || p.Weight != 3 || p.MaxConcurrent != 5 || !p.PassQuery ||
		len(p.HeadersUp) != 3 || p.HeadersUp[1].Op != "add" || p.HeadersUp[2].Op != "delete" ||
		p.TLS.ServerName != "connect.example.com" || p.Cooldown == nil ||
		h.Cooldown.FailureThreshold != 0.25 || h.Cooldown.MinRequests != 4 ||
		*h.Queue.Size != 0 || h.Affinity.Source != "header" || *h.Discovery ||
		*h.Providers[1].Discover || h.ClientLimit.Key != "{http.request.header.X-Api-Key}" || h.ClientLimit.Limit != 3 ||
		h.HedgeAfter != caddy.Duration(250*time.Millisecond) || h.HedgeMax != 3 ||
		h.State == nil || h.State.Redis.Address != "127.0.0.1:6379" || h.State.Redis.Password != "{env.REDIS_PASSWORD}" ||
		h.State.Redis.DB != 2 || h.State.Redis.TLS.ServerName != "redis.internal" || h.State.Node != "gw-1" ||
		h.State.OnUnavailable != "reject" || h.State.Redis.LeaseTTL != caddy.Duration(10*time.Second) {
		t.Fatalf("parsed %s", raw)
	}
	if !strings.Contains(string(out), `"playwright_version":"1.65","protocol":"playwright"`) || !strings.Contains(string(out), `"protocol":"cdp"`) {
		t.Fatalf("protocol options not in %s", out)
	}
	if !strings.Contains(string(raw), `{env.API_KEY}`) {
		t.Fatal("the env placeholder must stay unresolved in the adapted config")
	}
}

// TestJSONValidation: JSON configs (which never pass the Caddyfile parser)
// are checked again when loaded.
func TestJSONValidation(t *testing.T) {
	cases := []struct{ name, handler, want string }{
		{"no providers", `{"handler":"browser_failover"}`, "no providers"},
		{"duplicate", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"},{"name":"a","url":"ws://h:2"}]}`, `duplicate provider name "a"`},
		{"scheme", `{"handler":"browser_failover","providers":[{"name":"a","url":"tcp://h:1"}]}`, "is not one of ws, wss, http, https"},
		{"ratio", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"cooldown":{"failure_threshold":2}}`, "failure_threshold must be in (0,1]"},
		{"negative", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1","max_concurrent":-3}]}`, "max_concurrent must not be negative"},
		{"queue size", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"queue":{"size":-1}}`, "queue size must not be negative"},
		{"weight", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1","weight":-1}]}`, "weight must be at least 1"},
		{"discover ws", `{"handler":"browser_failover","providers":[{"name":"a","url":"wss://h:1","discover":true}]}`, "discover on needs an http:// or https:// URL"},
		{"strategy", `{"handler":"browser_failover","strategy":"x","providers":[{"name":"a","url":"ws://h:1"}]}`, `unknown strategy "x"`},
		{"protocol", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1","protocol":"webdriver"}]}`, `provider "a": protocol "webdriver"`},
		{"playwright_version", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1","protocol":"playwright","playwright_version":"latest"}]}`, `playwright_version "latest"`},
		{"version on cdp", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1","protocol":"cdp","playwright_version":"1.65"}]}`, "playwright_version needs protocol playwright"},
		{"client_limit", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"client_limit":{"key":"{http.auth.user.id}","limit":0}}`, "client_limit must be at least 1"},
		{"client_limit key", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"client_limit":{"key":"","limit":2}}`, "client_limit key"},
		{"hedge_max", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"hedge_max":1}`, "hedge_max must be at least 2"},
		{"hedge_after", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"hedge_after":-5}`, "hedge_after must not be negative"},
		{"state without backend", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"state":{"node":"x"}}`, "state needs a backend: redis"},
		{"state timeout", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"state":{"redis":{"address":"h:1","lease_ttl":"1s","timeout":"2s"}}}`, "timeout must be shorter than lease_ttl"},
		{"state mode", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"state":{"redis":{"address":"h:1"},"on_unavailable":"maybe"}}`, `on_unavailable "maybe"`},
		{"unknown field", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"colour":"blue"}`, "colour"},
		{"two urls one name", `{"handler":"subroute","routes":[{"handle":[{"handler":"browser_failover","providers":[{"name":"same","url":"ws://h:1"}]},{"handler":"browser_failover","providers":[{"name":"same","url":"ws://h:2"}]}]}]}`, `provider "same" is declared with two different URLs`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := `{"admin":{"disabled":true},"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:0"],"routes":[{"handle":[` + tc.handler + `]}]}}}}}`
			var c caddy.Config
			if err := json.Unmarshal([]byte(cfg), &c); err != nil {
				t.Fatal(err)
			}
			err := caddy.Validate(&c)
			if err == nil {
				t.Fatalf("config accepted, want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

// TestExamplesAdapt: every example Caddyfile adapts.
func TestExamplesAdapt(t *testing.T) {
	files, _ := filepath.Glob("examples/*.Caddyfile")
	if len(files) == 0 {
		t.Fatal("no examples")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := adapt(t, string(b)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}
