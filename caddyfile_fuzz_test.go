package browserfailover

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// FuzzCaddyfile: any input is either rejected with an error that names a
// line, or parses into a handler that passes the config check, as loaded
// directly and after a trip through its JSON (the parser applies every
// rule of the check, and JSON keeps what the Caddyfile meant); never a
// panic.
func FuzzCaddyfile(f *testing.F) {
	f.Add("browser_failover {\n provider a ws://127.0.0.1:1\n}")
	f.Add("browser_failover {\n strategy weighted\n provider a http://h:1 {\n  weight 3\n  header_up +X-A b\n  cooldown {\n   duration 1s\n  }\n }\n queue {\n  size 0\n }\n affinity cookie s\n}")
	f.Add("browser_failover {\n provider a ws://h:1 {\n  max_concurrent -1\n }\n}")
	f.Add("browser_failover {\n session {\n  idle_timeout 1m\n }\n provider b wss://x/?k={env.K} {\n  tls_trusted_ca_certs /nonexistent\n }\n}")
	f.Add("browser_failover {\n client_limit {http.auth.user.id} 2\n hedge_after 1s\n hedge_max 3\n provider a ws://h:1 {\n  protocol playwright\n  playwright_version 1.65\n }\n}")
	f.Add("browser_failover {\n provider a ws://h:1\n state redis h:6379 {\n  password {env.P}\n  tls\n  lease_ttl 2s\n  timeout 1s\n  on_unavailable reject\n }\n}")
	f.Add("browser_failover {\n provider a {env.BROWSER_URL} {\n  discover on\n }\n cooldown {\n  max_duration 1m\n }\n}")
	f.Add("browser_failover {\n provider a ws://h:1 {\n  cooldown {\n   duration 10m\n  }\n }\n cooldown {\n  max_duration 1m\n }\n}")
	f.Fuzz(func(t *testing.T, in string) {
		// Not NewTestDispenser: it exits the process on a lexing error
		// (an unterminated heredoc, say), which Caddy reports as an error.
		tokens, err := caddyfile.Tokenize([]byte(in), "Caddyfile")
		if err != nil || len(tokens) == 0 {
			return
		}
		d := caddyfile.NewDispenser(tokens)
		var h Handler
		if err := h.UnmarshalCaddyfile(d); err != nil {
			if !strings.Contains(err.Error(), ", at Caddyfile:") {
				t.Fatalf("error without a line: %v", err)
			}
			return
		}
		if err := h.Validate(); err != nil {
			t.Fatalf("parsed, but check() rejects it: %v", err)
		}
		b, err := json.Marshal(&h)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		var back Handler
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("its JSON does not load: %v\n%s", err, b)
		}
		if err := back.Validate(); err != nil {
			t.Fatalf("its JSON fails check(): %v\n%s", err, b)
		}
	})
}
