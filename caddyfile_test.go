package browserfailover_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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
// problem, at the line of the option at fault. line is the line in body;
// the test puts a site address before it, so the file's line is line+1.
func TestCaddyfileErrors(t *testing.T) {
	cases := []struct {
		name, body, want string
		line             int
	}{
		{"unknown option", "browser_failover {\n provider a ws://h:1\n colour blue\n}", `unknown option "colour"`, 3},
		{"session_api no release", "browser_failover {\n provider a https://api.h {\n  session_api {\n   create POST /v1/sessions\n   connect_url /connectUrl\n   session_id /id\n  }\n }\n}", `provider "a": session_api: no release call`, 3},
		{"session_api bad method", "browser_failover {\n provider a https://api.h {\n  session_api {\n   create post /v1/sessions\n  }\n }\n}", `session_api: create: method "post" must be upper-case letters`, 4},
		{"session_api release without id", "browser_failover {\n provider a https://api.h {\n  session_api {\n   create POST /v1/sessions\n   release POST /v1/sessions/x\n  }\n }\n}", "session_api: release: the URL must contain {session_id}", 5},
		{"session_api bad pointer", "browser_failover {\n provider a https://api.h {\n  session_api {\n   connect_url connectUrl\n  }\n }\n}", `session_api: connect_url: JSON pointer "connectUrl" must start with /`, 4},
		{"session_api body not JSON", "browser_failover {\n provider a https://api.h {\n  session_api {\n   body `{projectId: 1}`\n  }\n }\n}", "session_api: body is not valid JSON", 4},
		{"session_api create ftp", "browser_failover {\n provider a https://api.h {\n  session_api {\n   create POST ftp://h/x\n  }\n }\n}", "session_api: create: the URL must be http:// or https://", 4},
		{"session_api create twice", "browser_failover {\n provider a https://api.h {\n  session_api {\n   create POST /a\n   create POST /b\n  }\n }\n}", "create given twice", 5},
		{"session_api one arg", "browser_failover {\n provider a https://api.h {\n  session_api {\n   create POST\n  }\n }\n}", "create takes two values, got 1", 4},
		{"session_api with discover", "browser_failover {\n provider a https://api.h {\n  discover on\n  session_api {\n   create POST /v1/sessions\n   connect_url /connectUrl\n   session_id /id\n   release DELETE /v1/sessions/{session_id}\n  }\n }\n}", "discover on does not apply to a provider with session_api", 3},
		{"session_api unknown", "browser_failover {\n provider a https://api.h {\n  session_api {\n   colour blue\n  }\n }\n}", `session_api: unknown option "colour"`, 4},
		{"session_api insecure_connect value", "browser_failover {\n provider a https://api.h {\n  session_api {\n   insecure_connect yes\n  }\n }\n}", `insecure_connect: want on or off, got "yes"`, 4},
		{"session_api header break", "browser_failover {\n provider a https://api.h {\n  session_api {\n   header X-Key \"a\nb\"\n  }\n }\n}", "session_api: header X-Key: the value must not contain a line break", 4},
		{"recording quality", "browser_failover {\n provider a ws://h:1\n recording {\n  sessions all\n  quality 300\n }\n}", "recording quality must be 1 to 100, got 300", 5},
		{"recording max_size", "browser_failover {\n provider a ws://h:1\n recording {\n  max_size big\n }\n}", `recording max_size "big": want <width>x<height>`, 4},
		{"recording max_bytes", "browser_failover {\n provider a ws://h:1\n recording {\n  max_bytes lots\n }\n}", `recording max_bytes "lots": want a size`, 4},
		{"recording png quality", "browser_failover {\n provider a ws://h:1\n recording {\n  quality 80\n  format png\n }\n}", "recording quality is for jpeg frames", 4},
		{"recording storage module", "browser_failover {\n provider a ws://h:1\n recording {\n  storage nowhere\n }\n}", "caddy.storage.nowhere", 4},
		{"recording twice", "browser_failover {\n provider a ws://h:1\n recording\n recording\n}", "recording given twice", 4},
		{"profiles no key", "browser_failover {\n provider a ws://h:1\n profiles {\n  wait 1s\n }\n}", "profiles needs a key", 3},
		{"profiles short key", "browser_failover {\n provider a ws://h:1\n profiles {\n  wait 1s\n  key c2hvcnQ=\n }\n}", "profiles key is 5 bytes: want 32", 5},
		{"profiles bad key", "browser_failover {\n provider a ws://h:1\n profiles {\n  key ***\n }\n}", "profiles key is not base64", 4},
		{"profiles max_size", "browser_failover {\n provider a ws://h:1\n profiles {\n  key {env.K}\n  max_size lots\n }\n}", `profiles max_size "lots": want a size`, 5},
		{"profiles unknown", "browser_failover {\n provider a ws://h:1\n profiles {\n  key {env.K}\n  colour blue\n }\n}", `profiles: unknown option "colour"`, 5},
		{"profiles twice", "browser_failover {\n provider a ws://h:1\n profiles {\n  key {env.K}\n }\n profiles {\n  key {env.K}\n }\n}", "profiles given twice", 6},
		{"allowed_origins empty", "browser_failover {\n provider a ws://h:1\n allowed_origins\n}", "allowed_origins needs at least one origin", 3},
		{"allowed_origins host only", "browser_failover {\n provider a ws://h:1\n allowed_origins https://ok.example app.example\n}", `allowed_origins: "app.example" is not an origin`, 3},
		{"allowed_origins twice", "browser_failover {\n provider a ws://h:1\n allowed_origins https://a.example\n allowed_origins https://b.example\n}", "allowed_origins given twice", 4},
		{"no providers", "browser_failover {\n strategy priority\n}", "no providers", 1},
		{"bad scheme", "browser_failover {\n provider a ftp://h:1\n}", `provider "a": URL scheme "ftp" is not one of ws, wss, http, https`, 2},
		{"no scheme", "browser_failover {\n provider a h:1\n}", `provider "a": URL must start with ws://`, 2},
		{"placeholder scheme", "browser_failover {\n provider a {env.SCHEME}://h:1\n}", `provider "a": URL must start with ws://`, 2},
		{"no host", "browser_failover {\n provider a ws:///path\n}", `provider "a": URL has no host`, 2},
		{"fragment", "browser_failover {\n provider a ws://h:1/#frag\n}", `provider "a": URL must not have a fragment`, 2},
		{"no name", "browser_failover {\n provider \"\" ws://h:1\n}", "provider has no name", 2},
		{"duplicate name", "browser_failover {\n provider a ws://h:1\n provider b ws://h:2\n provider a ws://h:3 {\n  priority 2\n }\n}", `duplicate provider name "a"`, 4},
		{"negative max_concurrent", "browser_failover {\n provider a ws://h:1 {\n  max_concurrent -1\n }\n}", `provider "a": max_concurrent must not be negative`, 3},
		{"negative max_attempts", "browser_failover {\n max_attempts -2\n provider a ws://h:1\n}", "max_attempts must not be negative", 2},
		{"negative min_requests", "browser_failover {\n provider a ws://h:1\n cooldown {\n  min_requests -1\n }\n}", "cooldown: min_requests must not be negative", 4},
		{"negative queue size", "browser_failover {\n provider a ws://h:1\n queue {\n  size -5\n }\n}", "queue size must not be negative", 4},
		{"queue timeout zero", "browser_failover {\n provider a ws://h:1\n queue {\n  size 3\n  timeout 0\n }\n}", "queue timeout must be positive, got 0s", 5},
		{"ratio zero", "browser_failover {\n provider a ws://h:1\n cooldown {\n  failure_threshold 0\n }\n}", "cooldown: failure_threshold must be in (0,1], got 0", 4},
		{"ratio above one", "browser_failover {\n provider a ws://h:1\n cooldown {\n  failure_threshold 1.5\n }\n}", "failure_threshold must be in (0,1]", 4},
		{"ratio NaN", "browser_failover {\n provider a ws://h:1\n cooldown {\n  failure_threshold NaN\n }\n}", "failure_threshold must be in (0,1]", 4},
		{"ratio not a number", "browser_failover {\n provider a ws://h:1\n cooldown {\n  failure_threshold half\n }\n}", `failure_threshold must be a number, got "half"`, 4},
		{"window zero", "browser_failover {\n provider a ws://h:1\n cooldown {\n  duration 1s\n  window 0s\n }\n}", "cooldown: window must be positive, got 0s", 5},
		{"weight zero", "browser_failover {\n provider a ws://h:1 {\n  weight 0\n }\n}", `provider "a": weight must be at least 1, got 0`, 3},
		{"weight not a number", "browser_failover {\n provider a ws://h:1 {\n  weight heavy\n }\n}", `weight must be an integer, got "heavy"`, 3},
		{"priority not a number", "browser_failover {\n provider a ws://h:1 {\n  priority first\n }\n}", `priority must be an integer, got "first"`, 3},
		{"provider connect_timeout zero", "browser_failover {\n provider a ws://h:1 {\n  connect_timeout 0s\n }\n}", `provider "a": connect_timeout must be positive, got 0s`, 3},
		{"connect_timeout zero", "browser_failover {\n provider a ws://h:1\n connect_timeout 0\n}", "connect_timeout must be positive, got 0s", 3},
		{"try_duration negative", "browser_failover {\n try_duration -1s\n provider a ws://h:1\n}", "try_duration must not be negative, got -1s", 2},
		{"discover on ws", "browser_failover {\n provider a ws://h:1 {\n  discover on\n }\n}", `provider "a": discover on needs an http:// or https:// URL`, 3},
		{"discover on ws after other options", "browser_failover {\n provider a wss://h:1 {\n  priority 2\n  weight 3\n  discover on\n  max_concurrent 2\n }\n}", "discover on needs an http:// or https:// URL", 5},
		{"bad strategy", "browser_failover {\n strategy fastest\n provider a ws://h:1\n}", `unknown strategy "fastest" (want one of priority, round_robin, least_conn, weighted, random, latency, cheapest)`, 2},
		{"bad duration", "browser_failover {\n connect_timeout soon\n provider a ws://h:1\n}", `connect_timeout: invalid duration "soon"`, 2},
		{"bad affinity", "browser_failover {\n provider a ws://h:1\n affinity body x\n}", `affinity source "body"`, 3},
		{"provider args", "browser_failover {\n provider a\n}", "provider takes a name and a URL", 2},
		{"unknown provider option", "browser_failover {\n provider a ws://h:1 {\n  speed 9\n }\n}", `provider "a": unknown option "speed"`, 3},
		{"header_up delete with value", "browser_failover {\n provider a ws://h:1 {\n  header_up X-B c\n  header_up -X-A b\n }\n}", `provider "a": header_up -X-A takes no value`, 4},
		{"header_up no field", "browser_failover {\n provider a ws://h:1 {\n  header_up + b\n }\n}", `header_up: invalid field name ""`, 3},
		{"header_up bad field", "browser_failover {\n provider a ws://h:1 {\n  header_up X:Y b\n }\n}", `header_up: invalid field name "X:Y"`, 3},
		{"tls on ws", "browser_failover {\n provider a ws://h:1 {\n  tls_insecure_skip_verify\n }\n}", `provider "a": TLS options need a wss:// or https:// URL`, 3},
		{"tls on http", "browser_failover {\n provider a http://h:1 {\n  discover off\n  tls_server_name h\n }\n}", "TLS options need a wss:// or https:// URL", 4},
		{"empty CA file", "browser_failover {\n provider a wss://h:1 {\n  tls_trusted_ca_certs /a.pem \"\"\n }\n}", "tls_trusted_ca_certs: empty file name", 3},
		{"discovery value", "browser_failover {\n provider a ws://h:1\n discovery maybe\n}", `want on or off, got "maybe"`, 3},
		{"bad protocol", "browser_failover {\n provider a ws://h:1 {\n  protocol selenium\n }\n}", `provider "a": protocol "selenium": want cdp, playwright, bidi, webdriver or any`, 3},
		{"bidi with discover", "browser_failover {\n provider a http://h:1 {\n  discover on\n  weight 2\n  protocol bidi\n }\n}", `provider "a": discover on does not apply to a bidi provider`, 3},
		{"discover after bidi", "browser_failover {\n provider a http://h:1 {\n  protocol bidi\n  discover on\n }\n}", `provider "a": discover on does not apply to a bidi provider`, 4},
		{"bad playwright_version", "browser_failover {\n provider a ws://h:1 {\n  protocol playwright\n  playwright_version 1.65.1\n }\n}", `provider "a": playwright_version "1.65.1": want <major>.<minor>`, 4},
		{"version without playwright", "browser_failover {\n provider a ws://h:1 {\n  playwright_version 1.65\n  weight 2\n }\n}", `provider "a": playwright_version needs protocol playwright`, 3},
		{"version then another protocol", "browser_failover {\n provider a ws://h:1 {\n  playwright_version 1.65\n  protocol cdp\n }\n}", `provider "a": playwright_version needs protocol playwright`, 3},
		{"client_limit not a placeholder", "browser_failover {\n provider a ws://h:1\n client_limit user 2\n}", `client_limit key "user": want a placeholder`, 3},
		{"client_limit zero", "browser_failover {\n provider a ws://h:1\n client_limit {http.auth.user.id} 0\n}", "client_limit must be at least 1, got 0", 3},
		{"client_limit not a number", "browser_failover {\n provider a ws://h:1\n client_limit {http.auth.user.id} many\n}", `client_limit: "many" is not a number of sessions`, 3},
		{"client_limit args", "browser_failover {\n provider a ws://h:1\n client_limit {http.auth.user.id}\n}", "client_limit takes a key placeholder and a number", 3},
		{"hedge_max one", "browser_failover {\n provider a ws://h:1\n hedge_max 1\n}", "hedge_max must be at least 2", 3},
		{"hedge_max zero", "browser_failover {\n provider a ws://h:1\n hedge_max 0\n}", "hedge_max must be at least 2 (attempts in flight at once), got 0", 3},
		{"hedge_after bad", "browser_failover {\n provider a ws://h:1\n hedge_after later\n}", `hedge_after: invalid duration "later"`, 3},
		{"state backend", "browser_failover {\n provider a ws://h:1\n state etcd h:2379\n}", "state takes a backend and, optionally, its address", 3},
		{"state option", "browser_failover {\n provider a ws://h:1\n state redis h:6379 {\n  colour red\n }\n}", `state: unknown option "colour"`, 4},
		{"state on_unavailable", "browser_failover {\n provider a ws://h:1\n state redis h:6379 {\n  on_unavailable wait\n }\n}", `state on_unavailable "wait": want local or reject`, 4},
		{"state no address", "browser_failover {\n provider a ws://h:1\n state redis \"\" {\n  db 1\n }\n}", "state redis address: empty address", 3},
		{"state two modes", "browser_failover {\n provider a ws://h:1\n state redis h:6379 {\n  node n1\n  cluster h:7000 h:7001\n }\n}", "state redis takes exactly one of address, sentinel and cluster, got address and cluster", 5},
		{"state sentinel and cluster", "browser_failover {\n provider a ws://h:1\n state redis {\n  sentinel m h:26379\n  cluster h:7000\n }\n}", "state redis takes exactly one of address, sentinel and cluster, got sentinel and cluster", 5},
		{"state no mode", "browser_failover {\n provider a ws://h:1\n state redis {\n  node n1\n }\n}", "state redis needs one of address (host:port), sentinel <master> <host:port>... or cluster <host:port>...", 3},
		{"state sentinel without sentinels", "browser_failover {\n provider a ws://h:1\n state redis {\n  sentinel mymaster\n }\n}", "state redis sentinel needs at least one sentinel address", 4},
		{"state sentinel bad address", "browser_failover {\n provider a ws://h:1\n state redis {\n  sentinel mymaster h:26379 redis://u:p@h:1\n }\n}", "state redis sentinel address must be host:port, not a URL", 4},
		{"state cluster db", "browser_failover {\n provider a ws://h:1\n state redis {\n  cluster h:7000\n  db 2\n }\n}", "state redis db must be 0 with cluster", 5},
		{"state sentinel_password without sentinel", "browser_failover {\n provider a ws://h:1\n state redis h:6379 {\n  sentinel_password x\n }\n}", "state redis sentinel_password applies to sentinel only", 4},
		{"state db", "browser_failover {\n provider a ws://h:1\n state redis h:6379 {\n  node n1\n  db -1\n }\n}", "state redis db must not be negative, got -1", 5},
		{"state lease_ttl zero", "browser_failover {\n provider a ws://h:1\n state redis h:6379 {\n  lease_ttl 0s\n }\n}", "state redis lease_ttl must be positive, got 0s", 4},
		{"state timeout after lease_ttl", "browser_failover {\n provider a ws://h:1\n state redis h:6379 {\n  lease_ttl 1s\n  timeout 2s\n }\n}", "state redis timeout must be shorter than lease_ttl, got 2s and 1s", 5},
		{"state lease_ttl after timeout", "browser_failover {\n provider a ws://h:1\n state redis h:6379 {\n  timeout 2s\n  node n1\n  lease_ttl 1s\n }\n}", "timeout must be shorter than lease_ttl", 6},
		{"session negative", "browser_failover {\n provider a ws://h:1\n session {\n  max_duration 1h\n  idle_timeout -1s\n }\n}", "session idle_timeout must not be negative, got -1s", 5},
		{"max below duration", "browser_failover {\n provider a ws://h:1\n cooldown {\n  duration 1m\n  max_duration 10s\n }\n}", "cooldown: max_duration (10s) is shorter than duration (1m0s)", 5},
		{"duration above max", "browser_failover {\n provider a ws://h:1\n cooldown {\n  max_duration 10s\n  window 1m\n  duration 1m\n }\n}", "max_duration (10s) is shorter than duration (1m0s)", 6},
		{"provider cooldown", "browser_failover {\n provider a ws://h:1 {\n  cooldown {\n   failure_threshold 2\n  }\n }\n}", `provider "a": cooldown: failure_threshold must be in (0,1], got 2`, 4},
		{"provider duration over the handler's max", "browser_failover {\n cooldown {\n  max_duration 1m\n }\n provider a ws://h:1 {\n  cooldown {\n   duration 10m\n  }\n }\n}", `provider "a": cooldown: duration (10m0s) is longer than the handler's cooldown max_duration (1m0s)`, 7},
		{"handler max under a provider's duration", "browser_failover {\n provider a ws://h:1 {\n  cooldown {\n   duration 10m\n  }\n }\n cooldown {\n  window 1m\n  max_duration 1m\n }\n}", `provider "a": cooldown: duration (10m0s) is longer than the handler's cooldown max_duration (1m0s)`, 9},
		{"provider max under the handler's duration", "browser_failover {\n cooldown {\n  duration 10m\n }\n provider a ws://h:1 {\n  cooldown {\n   window 1m\n   max_duration 1m\n  }\n }\n}", `provider "a": cooldown: max_duration (1m0s) is shorter than the handler's cooldown duration (10m0s)`, 8},
		{"webhook scheme", "browser_failover {\n provider a ws://h:1\n webhook ftp://h/x {\n  secret s\n }\n}", `webhook URL scheme "ftp" is not http or https`, 3},
		{"webhook event", "browser_failover {\n provider a ws://h:1\n webhook http://h/x {\n  events cooldown\n  secret s\n  events exploded\n }\n}", `webhook: unknown event "exploded"`, 6},

		// A single-valued option or block given twice in one block: the
		// second is wrong, and the first is named.
		{"strategy twice", "browser_failover {\n strategy priority\n provider a ws://h:1\n strategy random\n}", "strategy given twice in the same block (first at Caddyfile:3)", 4},
		{"connect_timeout twice", "browser_failover {\n connect_timeout 1s\n connect_timeout 2s\n provider a ws://h:1\n}", "connect_timeout given twice", 3},
		{"cooldown twice", "browser_failover {\n provider a ws://h:1\n cooldown {\n  duration 1s\n }\n cooldown {\n  window 1m\n }\n}", "cooldown given twice in the same block (first at Caddyfile:4)", 6},
		{"queue twice", "browser_failover {\n provider a ws://h:1\n queue {\n }\n queue {\n }\n}", "queue given twice", 5},
		{"session twice", "browser_failover {\n provider a ws://h:1\n session {\n }\n session {\n }\n}", "session given twice", 5},
		{"state twice", "browser_failover {\n provider a ws://h:1\n state redis h:1\n state redis h:2\n}", "state given twice", 4},
		{"affinity twice", "browser_failover {\n provider a ws://h:1\n affinity header X\n affinity cookie Y\n}", "affinity given twice", 4},
		{"client_limit twice", "browser_failover {\n provider a ws://h:1\n client_limit {http.auth.user.id} 1\n client_limit {http.auth.user.id} 2\n}", "client_limit given twice", 4},
		{"discovery twice", "browser_failover {\n provider a ws://h:1\n discovery on\n discovery off\n}", "discovery given twice", 4},
		{"hedge_max twice", "browser_failover {\n provider a ws://h:1\n hedge_max 2\n hedge_max 3\n}", "hedge_max given twice", 4},
		{"priority twice", "browser_failover {\n provider a ws://h:1 {\n  priority 1\n  priority 2\n }\n}", "priority given twice in the same block (first at Caddyfile:4)", 4},
		{"provider cooldown twice", "browser_failover {\n provider a ws://h:1 {\n  cooldown {\n  }\n  cooldown {\n  }\n }\n}", "cooldown given twice", 5},
		{"protocol twice", "browser_failover {\n provider a ws://h:1 {\n  protocol cdp\n  protocol cdp\n }\n}", "protocol given twice", 4},
		{"tls_server_name twice", "browser_failover {\n provider a wss://h:1 {\n  tls_server_name a\n  tls_server_name b\n }\n}", "tls_server_name given twice", 4},
		{"duration twice", "browser_failover {\n provider a ws://h:1\n cooldown {\n  duration 1s\n  duration 2s\n }\n}", "duration given twice", 5},
		{"queue size twice", "browser_failover {\n provider a ws://h:1\n queue {\n  size 1\n  size 2\n }\n}", "size given twice", 5},
		{"state db twice", "browser_failover {\n provider a ws://h:1\n state redis h:1 {\n  db 1\n  db 2\n }\n}", "db given twice", 5},
		{"webhook secret twice", "browser_failover {\n provider a ws://h:1\n webhook http://h/x {\n  secret a\n  secret b\n }\n}", "secret given twice", 5},
		{"resume without window", "browser_failover {\n provider a ws://h:1\n resume\n}", "resume takes a window", 3},
		{"resume zero", "browser_failover {\n provider a ws://h:1\n resume 0s\n}", "resume needs a positive window, got 0s", 3},
		{"resume bad window", "browser_failover {\n provider a ws://h:1\n resume soon\n}", `resume: invalid window "soon"`, 3},
		{"resume unknown word", "browser_failover {\n provider a ws://h:1\n resume 1m keep\n}", `resume: unknown word "keep" after the window (want hold)`, 3},
		{"resume twice", "browser_failover {\n provider a ws://h:1\n resume 1m\n resume 2m hold\n}", "resume given twice", 4},
		{"resume_key alone", "browser_failover {\n provider a ws://h:1\n resume_key {http.auth.user.id}\n}", "resume_key binds resumable sessions to a key: it needs resume", 3},
		{"resume_key constant", "browser_failover {\n provider a ws://h:1\n resume 1m\n resume_key alice\n}", "resume_key must hold a placeholder", 4},
		{"resume_key empty", "browser_failover {\n provider a ws://h:1\n resume 1m\n resume_key\n}", "resume_key needs a value", 4},
		// Providers found at run time.
		{"found name clash, provider after", "browser_failover {\n providers br {\n  dynamic a h 9222\n }\n provider br/10.0.0.1:9222 ws://h:1\n}", `provider "br/10.0.0.1:9222": its name clashes with the providers that providers "br" finds`, 5},
		{"found name clash, block after", "browser_failover {\n provider br/x ws://h:1\n strategy priority\n providers br {\n  dynamic a h 9222\n }\n}", `provider "br/x": its name clashes with the providers that providers "br" finds`, 4},
		{"providers twice", "browser_failover {\n providers br {\n  dynamic a h 9222\n }\n providers br {\n  dynamic a g 9222\n }\n}", `duplicate providers name "br"`, 5},
		{"providers no name", "browser_failover {\n providers {\n  dynamic a h 9222\n }\n}", "providers takes a name", 2},
		{"providers slash", "browser_failover {\n providers a/b {\n  dynamic a h 9222\n }\n}", `providers "a/b": the name must not hold "/"`, 2},
		{"providers no source", "browser_failover {\n providers br {\n  max_concurrent 2\n }\n}", `providers "br": no source: dynamic srv|a|multi|<module>`, 2},
		{"providers source twice", "browser_failover {\n providers br {\n  dynamic a h 9222\n  dynamic srv _b._tcp.h\n }\n}", "dynamic given twice", 4},
		{"providers unknown source", "browser_failover {\n providers br {\n  dynamic consul_catalog\n }\n}", "http.reverse_proxy.upstreams.consul_catalog", 3},
		{"providers source option", "browser_failover {\n providers br {\n  dynamic srv _b._tcp.h {\n   colour blue\n  }\n }\n}", "unrecognized srv option 'colour'", 4},
		{"providers url", "browser_failover {\n providers br {\n  dynamic a h 9222\n  url ws://h:1\n }\n}", `providers "br": unknown option "url"`, 4},
		{"providers scheme", "browser_failover {\n providers br {\n  dynamic a h 9222\n  scheme ftp\n }\n}", `providers "br": scheme "ftp": want ws, wss, http or https`, 4},
		{"providers path", "browser_failover {\n providers br {\n  dynamic a h 9222\n  path devtools\n }\n}", `providers "br": path "devtools" must start with /`, 4},
		{"providers provider option", "browser_failover {\n providers br {\n  dynamic a h 9222\n  weight 0\n }\n}", `providers "br": weight must be at least 1, got 0`, 4},
		{"providers discover on ws", "browser_failover {\n providers br {\n  dynamic a h 9222\n  scheme ws\n  discover on\n }\n}", `providers "br": discover on needs an http:// or https:// URL`, 5},
		{"providers health check ws", "browser_failover {\n providers br {\n  dynamic a h 9222\n  scheme ws\n  health_check {\n   interval 1s\n  }\n }\n}", `providers "br": health_check needs a uri for a ws:// or wss:// provider`, 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := adapt(t, ":8080\n"+tc.body)
			if err == nil {
				t.Fatalf("adapted without error, want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
			if at := ", at Caddyfile:" + strconv.Itoa(tc.line+1); !strings.HasSuffix(err.Error(), at) {
				t.Fatalf("error %q does not end with %q", err, at)
			}
		})
	}
}

// TestCaddyfileAccepts: repeatable options repeat, the order of options in
// a block does not matter, and a URL that is a placeholder as a whole
// waits for provision to be checked.
func TestCaddyfileAccepts(t *testing.T) {
	for _, body := range []string{
		"browser_failover {\n provider a {env.BROWSER_URL}\n}",
		"browser_failover {\n provider a {env.BROWSER_URL} {\n  discover on\n  tls_server_name h\n }\n}",
		"browser_failover {\n provider a wss://h/?key={env.K}\n}",
		"browser_failover {\n provider a ws://h:1 {\n  playwright_version 1.65\n  protocol playwright\n }\n}",
		"browser_failover {\n provider a ws://h:1 {\n  header_up X-A 1\n  header_up +X-A 2\n  header_up -Cookie\n }\n provider b wss://h:2 {\n  tls_trusted_ca_certs /a.pem\n  tls_trusted_ca_certs /b.pem\n }\n}",
		"browser_failover {\n provider a ws://h:1\n webhook http://h/1 {\n  events cooldown\n  events rejected\n }\n webhook http://h/2\n}",
		"browser_failover {\n provider a https://api.h {\n  session_api {\n   create POST /v1/sessions\n   header X-A {env.K}\n   header X-B 2\n   body `{\"projectId\": \"{env.P}\"}`\n   connect_url /connectUrl\n   session_id /id\n   release POST https://api.h/v1/sessions/{session_id}\n   release_body `{\"status\": \"REQUEST_RELEASE\"}`\n  }\n }\n}",
		"browser_failover {\n provider a ws://h:1\n cooldown {\n  max_duration 10m\n  duration 1m\n  min_requests 0\n }\n queue {\n  size 0\n }\n session {\n  idle_timeout 0\n }\n max_attempts 0\n try_duration 0\n hedge_after 0\n}",
		"browser_failover {\n cooldown {\n  max_duration 1m\n }\n provider a ws://h:1 {\n  cooldown {\n   duration 10m\n   max_duration 20m\n  }\n }\n}",
		"browser_failover {\n providers br {\n  dynamic srv _cdp._tcp.browsers.default.svc.cluster.local {\n   refresh 10s\n   resolvers 10.0.0.10:53\n  }\n  max_concurrent 4\n  health_check {\n   interval 5s\n  }\n }\n providers ff {\n  dynamic a firefox.default.svc.cluster.local 4444\n  protocol bidi\n }\n provider cloud wss://cloud.example/?token={env.T} {\n  priority 2\n }\n}",
		"browser_failover {\n providers br {\n  dynamic multi {\n   srv _cdp._tcp.a.example\n   a b.example 9222\n  }\n  scheme ws\n  path /devtools/browser?token={env.T}\n }\n}",
	} {
		if _, err := adapt(t, ":8080\n"+body); err != nil {
			t.Errorf("%q: %v", body, err)
		}
	}
}

// TestCaddyfileFull: every option parses into its JSON field.
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
	resume_key {http.auth.user.id}
	resume 90s hold
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
	// Caddy takes the module name out before decoding the rest strictly.
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		t.Fatal(err)
	}
	delete(fields, "handler")
	config, _ := json.Marshal(fields)
	var h browserfailover.Handler
	if err := json.Unmarshal(config, &h); err != nil {
		t.Fatal(err)
	}
	p := h.Providers[0]
	if h.Strategy != "weighted" || h.MaxAttempts != 3 || len(h.Providers) != 2 ||
		*p.Priority != -1 || p.Weight != 3 || p.MaxConcurrent.Limit != 5 || !p.PassQuery ||
		len(p.HeadersUp) != 3 || p.HeadersUp[1].Op != "add" || p.HeadersUp[2].Op != "delete" ||
		p.TLS.ServerName != "connect.example.com" || p.Cooldown == nil ||
		h.Cooldown.FailureThreshold != 0.25 || h.Cooldown.MinRequests != 4 ||
		*h.Queue.Size != 0 || h.Affinity.Source != "header" || *h.Discovery ||
		*h.Providers[1].Discover || h.ClientLimit.Key != "{http.request.header.X-Api-Key}" || h.ClientLimit.Limit != 3 ||
		h.HedgeAfter != caddy.Duration(250*time.Millisecond) || h.HedgeMax != 3 ||
		h.State == nil || h.State.Redis.Address != "127.0.0.1:6379" || h.State.Redis.Password != "{env.REDIS_PASSWORD}" ||
		h.State.Redis.DB != 2 || h.State.Redis.TLS.ServerName != "redis.internal" || h.State.Node != "gw-1" ||
		h.State.OnUnavailable != "reject" || h.State.Redis.LeaseTTL != caddy.Duration(10*time.Second) ||
		h.Resume == nil || h.Resume.Window != caddy.Duration(90*time.Second) || !h.Resume.Hold || h.ResumeKey != "{http.auth.user.id}" {
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
		{"session_api empty", `{"handler":"browser_failover","providers":[{"name":"a","url":"https://h","session_api":{}}]}`, `provider "a": session_api: no create call`},
		{"session_api release", `{"handler":"browser_failover","providers":[{"name":"a","url":"https://h","session_api":{"create_method":"POST","create_url":"/s","connect_url":"/u","session_id":"/id","release_method":"DELETE","release_url":"/s/x"}}]}`, "session_api: release: the URL must contain {session_id}"},
		{"session_api release body", `{"handler":"browser_failover","providers":[{"name":"a","url":"https://h","session_api":{"create_method":"POST","create_url":"/s","connect_url":"/u","session_id":"/id","release_method":"DELETE","release_url":"/s/{session_id}","release_body":"{nope"}}]}`, "session_api: release_body is not valid JSON"},
		{"duplicate", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"},{"name":"a","url":"ws://h:2"}]}`, `duplicate provider name "a"`},
		{"scheme", `{"handler":"browser_failover","providers":[{"name":"a","url":"tcp://h:1"}]}`, "is not one of ws, wss, http, https"},
		{"ratio", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"cooldown":{"failure_threshold":2}}`, "failure_threshold must be in (0,1]"},
		{"negative", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1","max_concurrent":-3}]}`, "max_concurrent must not be negative"},
		{"queue size", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"queue":{"size":-1}}`, "queue size must not be negative"},
		{"weight", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1","weight":-1}]}`, "weight must be at least 1"},
		{"discover ws", `{"handler":"browser_failover","providers":[{"name":"a","url":"wss://h:1","discover":true}]}`, "discover on needs an http:// or https:// URL"},
		{"strategy", `{"handler":"browser_failover","strategy":"x","providers":[{"name":"a","url":"ws://h:1"}]}`, `unknown strategy "x"`},
		{"protocol", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1","protocol":"selenium"}]}`, `provider "a": protocol "selenium"`},
		{"playwright_version", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1","protocol":"playwright","playwright_version":"latest"}]}`, `playwright_version "latest"`},
		{"version on cdp", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1","protocol":"cdp","playwright_version":"1.65"}]}`, "playwright_version needs protocol playwright"},
		{"client_limit", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"client_limit":{"key":"{http.auth.user.id}","limit":0}}`, "client_limit must be at least 1"},
		{"client_limit key", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"client_limit":{"key":"","limit":2}}`, "client_limit key"},
		{"hedge_max", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"hedge_max":1}`, "hedge_max must be at least 2"},
		{"hedge_after", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"hedge_after":-5}`, "hedge_after must not be negative"},
		{"resume window", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"resume":{"hold":true}}`, "resume needs a positive window"},
		{"resume_key alone", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"resume_key":"{http.auth.user.id}"}`, "resume_key binds resumable sessions to a key: it needs resume"},
		{"state without backend", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"state":{"node":"x"}}`, "state needs a backend: redis"},
		{"state timeout", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"state":{"redis":{"address":"h:1","lease_ttl":"1s","timeout":"2s"}}}`, "timeout must be shorter than lease_ttl"},
		{"state mode", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"state":{"redis":{"address":"h:1"},"on_unavailable":"maybe"}}`, `on_unavailable "maybe"`},
		{"unknown field", `{"handler":"browser_failover","providers":[{"name":"a","url":"ws://h:1"}],"colour":"blue"}`, "colour"},
		{"providers source missing", `{"handler":"browser_failover","dynamic_providers":[{"name":"br"}]}`, `providers "br": no source`},
		{"providers source unknown", `{"handler":"browser_failover","dynamic_providers":[{"name":"br","dynamic":{"source":"nope"}}]}`, `providers "br": dynamic: unknown source module "nope"`},
		{"providers source field", `{"handler":"browser_failover","dynamic_providers":[{"name":"br","dynamic":{"source":"srv","colour":"blue"}}]}`, `providers "br": dynamic: srv:`},
		{"providers url", `{"handler":"browser_failover","dynamic_providers":[{"name":"br","url":"ws://h:1","dynamic":{"source":"a","name":"h"}}]}`, `providers "br": a found provider's URL is made from its address`},
		{"providers clash", `{"handler":"browser_failover","providers":[{"name":"br/h:1","url":"ws://h:1"}],"dynamic_providers":[{"name":"br","dynamic":{"source":"a","name":"h"}}]}`, `its name clashes with the providers that providers "br" finds`},
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

// TestExamplesListenOnLoopback: every example, the quick start's too, has
// Caddy listen on loopback only. A site address such as
// http://127.0.0.1:8080 is a Host matcher, not a bind: without `bind` the
// server listens on every interface, and anyone who reaches the port (with
// that Host header) drives the browsers behind it.
func TestExamplesListenOnLoopback(t *testing.T) {
	files, _ := filepath.Glob("examples/*.Caddyfile")
	if len(files) == 0 {
		t.Fatal("no examples")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out, err := adapt(t, string(b))
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		var cfg struct {
			Admin *struct {
				Listen string `json:"listen"`
			} `json:"admin"`
			Apps struct {
				HTTP struct {
					Servers map[string]struct {
						Listen []string `json:"listen"`
					} `json:"servers"`
				} `json:"http"`
			} `json:"apps"`
		}
		if err := json.Unmarshal(out, &cfg); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if len(cfg.Apps.HTTP.Servers) == 0 {
			t.Errorf("%s: no server", f)
		}
		addrs := []string{}
		for _, srv := range cfg.Apps.HTTP.Servers {
			if len(srv.Listen) == 0 {
				t.Errorf("%s: a server without listen addresses", f)
			}
			addrs = append(addrs, srv.Listen...)
		}
		if cfg.Admin != nil && cfg.Admin.Listen != "" {
			addrs = append(addrs, cfg.Admin.Listen)
		}
		for _, a := range addrs {
			na, err := caddy.ParseNetworkAddress(a)
			if err != nil {
				t.Errorf("%s: listen %q: %v", f, a, err)
				continue
			}
			if ip := net.ParseIP(na.Host); ip == nil || !ip.IsLoopback() {
				t.Errorf("%s: listens on %q, not on loopback only (add bind 127.0.0.1)", f, a)
			}
		}
	}
}

// TestCaddyfileSyntaxDoc: the syntax in UnmarshalCaddyfile's doc comment
// lists, block by block, exactly the options the parser reads.
func TestCaddyfileSyntaxDoc(t *testing.T) {
	fset := token.NewFileSet()
	var decls []ast.Decl
	for _, name := range []string{"caddyfile.go", "caddyfile_health.go"} {
		file, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		decls = append(decls, file.Decls...)
	}
	// The function that reads each block.
	readers := map[string]string{
		"UnmarshalCaddyfile": "browser_failover", "parseProvider": "provider", "parseCooldown": "cooldown",
		"parseQueue": "queue", "parseSession": "session", "parseState": "state", "parseWebhook": "webhook",
		"parseHealthCheck": "health_check", "parseProviders": "providers", "parseRecording": "recording",
		"parseProfiles": "profiles",
	}
	// Options several blocks share, read by one function that their
	// readers call (or that such a function calls).
	shared := map[string]bool{"readTLS": true, "readProviderOption": true}
	cases := map[string][]string{} // function -> the options it reads
	calls := map[string][]string{} // reader -> the shared readers it calls
	var doc string
	for _, decl := range decls {
		fd, ok := decl.(*ast.FuncDecl)
		if !ok || (readers[fd.Name.Name] == "" && !shared[fd.Name.Name]) {
			continue
		}
		if fd.Name.Name == "UnmarshalCaddyfile" {
			doc = fd.Doc.Text()
		}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CaseClause:
				for _, e := range n.List {
					if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						s, _ := strconv.Unquote(lit.Value)
						cases[fd.Name.Name] = append(cases[fd.Name.Name], s)
					}
				}
			case *ast.CallExpr:
				if id, ok := n.Fun.(*ast.Ident); ok && shared[id.Name] {
					calls[fd.Name.Name] = append(calls[fd.Name.Name], id.Name)
				}
			}
			return true
		})
	}
	parsed := map[string][]string{}
	for fn, block := range readers {
		parsed[block] = slices.Clone(cases[fn])
		for todo := slices.Clone(calls[fn]); len(todo) > 0; todo = todo[1:] {
			parsed[block] = append(parsed[block], cases[todo[0]]...)
			todo = append(todo, calls[todo[0]]...)
		}
	}
	documented := map[string][]string{}
	var open []string
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(line, "\t") {
			continue
		}
		words := strings.Fields(line)
		switch {
		case len(words) == 0:
		case words[0] == "}":
			open = open[:len(open)-1]
		default:
			if len(open) > 0 {
				documented[open[len(open)-1]] = append(documented[open[len(open)-1]], words[0])
			}
			if strings.HasSuffix(line, "{") {
				open = append(open, words[0])
			}
		}
	}
	// A providers block takes every option of a provider besides its
	// own: the doc says so in one line.
	if i := slices.Index(documented["providers"], "<provider"); i >= 0 {
		documented["providers"] = slices.Concat(documented["providers"][:i], documented["provider"], documented["providers"][i+1:])
	}
	if len(open) != 0 || len(documented) != len(readers) {
		t.Fatalf("the syntax block does not parse: blocks %v, still open %v", documented, open)
	}
	for block, opts := range parsed {
		slices.Sort(opts)
		want := slices.Clone(documented[block])
		slices.Sort(want)
		if !slices.Equal(opts, want) {
			t.Errorf("%s: the parser reads %v, the doc lists %v", block, opts, want)
		}
	}
}
