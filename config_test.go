package browserfailover

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/browserfailover/caddy-browser-failover/config"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// parityCase is one option value written both ways: as Caddyfile lines and
// as JSON members, placed in the same scope.
type parityCase struct {
	scope string // handler, provider, providers, cooldown, provider_cooldown, queue, session, redis, state or raw
	url   string // the provider's URL (provider scopes); default ws://h:1
	cf    string // Caddyfile lines in the scope ("\n" between options)
	js    string // the same as JSON members in the scope
	ok    bool   // both accept (else both reject)
}

var parityCases = []parityCase{
	// The handler's own options.
	{scope: "handler", cf: "strategy weighted", js: `"strategy":"weighted"`, ok: true},
	{scope: "handler", cf: "strategy fastest", js: `"strategy":"fastest"`},
	{scope: "handler", cf: `strategy ""`, js: `"strategy":""`, ok: true}, // the default in both
	{scope: "handler", cf: "connect_timeout 1s", js: `"connect_timeout":"1s"`, ok: true},
	{scope: "handler", cf: "connect_timeout 0", js: `"connect_timeout":0`},
	{scope: "handler", cf: "connect_timeout 0s", js: `"connect_timeout":"0s"`},
	{scope: "handler", cf: "connect_timeout -1s", js: `"connect_timeout":"-1s"`},
	{scope: "handler", cf: "try_duration 0", js: `"try_duration":0`, ok: true},
	{scope: "handler", cf: "try_duration -1s", js: `"try_duration":"-1s"`},
	{scope: "handler", cf: "max_attempts 0", js: `"max_attempts":0`, ok: true},
	{scope: "handler", cf: "max_attempts 2", js: `"max_attempts":2`, ok: true},
	{scope: "handler", cf: "max_attempts -1", js: `"max_attempts":-1`},
	{scope: "handler", cf: "hedge_after 0", js: `"hedge_after":0`, ok: true},
	{scope: "handler", cf: "hedge_after 250ms", js: `"hedge_after":"250ms"`, ok: true},
	{scope: "handler", cf: "hedge_after -1ms", js: `"hedge_after":"-1ms"`},
	{scope: "handler", cf: "hedge_max 0", js: `"hedge_max":0`},
	{scope: "handler", cf: "hedge_max 1", js: `"hedge_max":1`},
	{scope: "handler", cf: "hedge_max -1", js: `"hedge_max":-1`},
	{scope: "handler", cf: "hedge_max 2", js: `"hedge_max":2`, ok: true},
	{scope: "handler", cf: "discovery off", js: `"discovery":false`, ok: true},
	{scope: "handler", cf: "affinity header X-S", js: `"affinity":{"source":"header","name":"X-S"}`, ok: true},
	{scope: "handler", cf: "affinity body X-S", js: `"affinity":{"source":"body","name":"X-S"}`},
	{scope: "handler", cf: `affinity cookie ""`, js: `"affinity":{"source":"cookie","name":""}`},
	{scope: "handler", cf: "client_limit {http.auth.user.id} 1", js: `"client_limit":{"key":"{http.auth.user.id}","limit":1}`, ok: true},
	{scope: "handler", cf: "client_limit {http.auth.user.id} 0", js: `"client_limit":{"key":"{http.auth.user.id}","limit":0}`},
	{scope: "handler", cf: "client_limit user 1", js: `"client_limit":{"key":"user","limit":1}`},
	{scope: "handler", cf: "webhook http://h/in {\nevents cooldown\n}", js: `"webhooks":[{"url":"http://h/in","events":["cooldown"]}]`, ok: true},
	{scope: "handler", cf: "webhook http://h/in {\nevents exploded\n}", js: `"webhooks":[{"url":"http://h/in","events":["exploded"]}]`},
	{scope: "handler", cf: "allowed_origins https://app.example.com http://127.0.0.1:3000 null", js: `"allowed_origins":["https://app.example.com","http://127.0.0.1:3000","null"]`, ok: true},
	{scope: "handler", cf: "allowed_origins *", js: `"allowed_origins":["*"]`, ok: true},
	{scope: "handler", cf: "allowed_origins HTTPS://[::1]:443", js: `"allowed_origins":["HTTPS://[::1]:443"]`, ok: true},
	{scope: "handler", cf: "allowed_origins app.example.com", js: `"allowed_origins":["app.example.com"]`},
	{scope: "handler", cf: "allowed_origins https://app.example.com/", js: `"allowed_origins":["https://app.example.com/"]`},
	{scope: "handler", cf: "allowed_origins https://app.example.com:99999", js: `"allowed_origins":["https://app.example.com:99999"]`},
	{scope: "handler", cf: "allowed_origins https://u@app.example.com", js: `"allowed_origins":["https://u@app.example.com"]`},
	{scope: "handler", cf: `allowed_origins ""`, js: `"allowed_origins":[""]`},
	// Recording.
	{scope: "handler", cf: "recording", js: `"recording":{}`, ok: true},
	{scope: "handler", cf: "recording {\nsessions all\nformat jpeg\nquality 55\nmax_size 800x600\nevery_nth_frame 2\nmax_bytes 1MiB\nretention 3d\n}",
		js: `"recording":{"sessions":"all","format":"jpeg","quality":55,"max_size":"800x600","every_nth_frame":2,"max_bytes":1048576,"retention":"72h"}`, ok: true},
	{scope: "handler", cf: "recording {\nsessions asked\nformat png\n}", js: `"recording":{"sessions":"asked","format":"png"}`, ok: true},
	{scope: "handler", cf: "recording {\nsessions some\n}", js: `"recording":{"sessions":"some"}`},
	{scope: "handler", cf: "recording {\nformat webp\n}", js: `"recording":{"format":"webp"}`},
	{scope: "handler", cf: "recording {\nquality 0\n}", js: `"recording":{"quality":0}`},
	{scope: "handler", cf: "recording {\nquality 101\n}", js: `"recording":{"quality":101}`},
	{scope: "handler", cf: "recording {\nformat png\nquality 80\n}", js: `"recording":{"format":"png","quality":80}`},
	{scope: "handler", cf: "recording {\nmax_size 1280x800\n}", js: `"recording":{"max_size":"1280x800"}`, ok: true},
	{scope: "handler", cf: "recording {\nmax_size 1280\n}", js: `"recording":{"max_size":"1280"}`},
	{scope: "handler", cf: "recording {\nmax_size 8x8\n}", js: `"recording":{"max_size":"8x8"}`},
	{scope: "handler", cf: "recording {\nevery_nth_frame 0\n}", js: `"recording":{"every_nth_frame":0}`},
	{scope: "handler", cf: "recording {\nmax_bytes 0\n}", js: `"recording":{"max_bytes":0}`},
	{scope: "handler", cf: "recording {\nretention 0\n}", js: `"recording":{"retention":0}`, ok: true},
	{scope: "handler", cf: "recording {\nretention -1h\n}", js: `"recording":{"retention":"-1h"}`},
	{scope: "handler", cf: "recording {\nstorage file_system /var/lib/rec\n}", js: `"recording":{"storage":{"module":"file_system","root":"/var/lib/rec"}}`, ok: true},
	{scope: "handler", cf: "recording {\nstorage file_system {\nroot /var/lib/rec\n}\nsessions all\n}", js: `"recording":{"storage":{"module":"file_system","root":"/var/lib/rec"},"sessions":"all"}`, ok: true},
	{scope: "handler", cf: "recording {\nstorage nowhere\n}", js: `"recording":{"storage":{"root":"/x"}}`},
	// Profiles.
	{scope: "handler", cf: "profiles {\nkey MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n}", js: `"profiles":{"key":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="}`, ok: true},
	{scope: "handler", cf: "profiles {\nkey MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\nscope {http.auth.user.id}\nmax_size 1MiB\nwait 5s\nstorage file_system /var/lib/p\n}",
		js: `"profiles":{"key":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=","scope":"{http.auth.user.id}","max_size":1048576,"wait":"5s","storage":{"module":"file_system","root":"/var/lib/p"}}`, ok: true},
	{scope: "handler", cf: "profiles {\nkey {env.PROFILES_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=}\n}", js: `"profiles":{"key":"{env.PROFILES_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=}"}`, ok: true},
	{scope: "handler", cf: "profiles {\nkey MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY\n}", js: `"profiles":{"key":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY"}`, ok: true},
	{scope: "handler", cf: "profiles", js: `"profiles":{}`},
	{scope: "handler", cf: "profiles {\nscope {http.auth.user.id}\n}", js: `"profiles":{"scope":"{http.auth.user.id}"}`},
	{scope: "handler", cf: `profiles {
key ""
}`, js: `"profiles":{"key":""}`},
	{scope: "handler", cf: "profiles {\nkey c2hvcnQ=\n}", js: `"profiles":{"key":"c2hvcnQ="}`},
	{scope: "handler", cf: "profiles {\nkey not*base64\n}", js: `"profiles":{"key":"not*base64"}`},
	{scope: "handler", cf: "profiles {\nkey MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\nmax_size 0\n}", js: `"profiles":{"key":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=","max_size":0}`},
	{scope: "handler", cf: "profiles {\nkey MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\nwait -1s\n}", js: `"profiles":{"key":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=","wait":"-1s"}`},
	{scope: "handler", cf: "profiles {\nkey MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\nwait 0\n}", js: `"profiles":{"key":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=","wait":0}`, ok: true},
	{scope: "handler", cf: `profiles {
key MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=
scope ""
}`, js: `"profiles":{"key":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=","scope":""}`},
	{scope: "handler", cf: "profiles {\nkey MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\nstorage nowhere\n}", js: `"profiles":{"key":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=","storage":{"root":"/x"}}`},

	// A provider's options.
	{scope: "provider", cf: "weight 1", js: `"weight":1`, ok: true},
	{scope: "provider", cf: "weight 3", js: `"weight":3`, ok: true},
	{scope: "provider", cf: "weight 0", js: `"weight":0`},
	{scope: "provider", cf: "weight -1", js: `"weight":-1`},
	{scope: "provider", cf: "priority 0", js: `"priority":0`, ok: true},
	{scope: "provider", cf: "priority -5", js: `"priority":-5`, ok: true},
	{scope: "provider", cf: "max_concurrent 0", js: `"max_concurrent":0`, ok: true},
	{scope: "provider", cf: "max_concurrent -1", js: `"max_concurrent":-1`},
	{scope: "provider", cf: "connect_timeout 2s", js: `"connect_timeout":"2s"`, ok: true},
	{scope: "provider", cf: "connect_timeout 0", js: `"connect_timeout":0`},
	{scope: "provider", cf: "header_up +X-A b", js: `"headers_up":[{"op":"add","field":"X-A","value":"b"}]`, ok: true},
	{scope: "provider", cf: `header_up X-A ""`, js: `"headers_up":[{"op":"set","field":"X-A","value":""}]`, ok: true},
	{scope: "provider", cf: "header_up -X-A b", js: `"headers_up":[{"op":"delete","field":"X-A","value":"b"}]`},
	{scope: "provider", cf: "header_up X:Y b", js: `"headers_up":[{"op":"set","field":"X:Y","value":"b"}]`},
	{scope: "provider", cf: "pass_query", js: `"pass_query":true`, ok: true},
	{scope: "provider", cf: "discover off", js: `"discover":false`, ok: true},
	{scope: "provider", cf: "discover on", js: `"discover":true`},
	{scope: "provider", url: "http://h:1", cf: "discover on", js: `"discover":true`, ok: true},
	{scope: "provider", cf: "protocol cdp", js: `"protocol":"cdp"`, ok: true},
	{scope: "provider", cf: `protocol ""`, js: `"protocol":""`, ok: true}, // any, in both
	{scope: "provider", cf: "protocol bidi", js: `"protocol":"bidi"`, ok: true},
	{scope: "provider", cf: "protocol BiDi", js: `"protocol":"bidi"`, ok: true},
	{scope: "provider", cf: "protocol webdriver", js: `"protocol":"webdriver"`}, // a ws:// URL
	{scope: "provider", url: "http://h:1/wd/hub", cf: "protocol webdriver", js: `"protocol":"webdriver"`, ok: true},
	{scope: "provider", url: "https://u:k@hub.example.com/wd/hub", cf: "protocol webdriver", js: `"protocol":"webdriver"`, ok: true},
	{scope: "provider", url: "http://h:1", cf: "protocol webdriver\ndiscover on", js: `"protocol":"webdriver","discover":true`},
	{scope: "provider", url: "http://h:1", cf: "protocol webdriver\nbrowsers chrome firefox", js: `"protocol":"webdriver","browsers":["chrome","firefox"]`, ok: true},
	{scope: "provider", url: "http://h:1", cf: "protocol webdriver\nbrowsers \"internet explorer\"", js: `"protocol":"webdriver","browsers":["internet explorer"]`, ok: true},
	{scope: "provider", url: "http://h:1", cf: "protocol webdriver\nbrowsers \"\"", js: `"protocol":"webdriver","browsers":[""]`},
	{scope: "provider", url: "http://h:1", cf: "browsers chrome", js: `"browsers":["chrome"]`}, // not a webdriver provider
	{scope: "provider", url: "http://h:1", cf: "protocol webdriver\ncapabilities `{\"bstack:options\":{\"userName\":\"{env.BS_USER}\"}}`", js: `"protocol":"webdriver","capabilities":{"bstack:options":{"userName":"{env.BS_USER}"}}`, ok: true},
	{scope: "provider", url: "http://h:1", cf: "protocol webdriver\ncapabilities `[1]`", js: `"protocol":"webdriver","capabilities":[1]`},
	{scope: "provider", url: "http://h:1", cf: "protocol webdriver\ncapabilities `{\"bf:options\":{}}`", js: `"protocol":"webdriver","capabilities":{"bf:options":{}}`},
	{scope: "provider", url: "http://h:1", cf: "protocol webdriver\ncapabilities `{`", js: `"protocol":"webdriver","capabilities":"{"`},
	{scope: "provider", url: "http://h:1", cf: "capabilities `{}`", js: `"capabilities":{}`},
	// Session options a provider honours, and how it words them.
	{scope: "provider", cf: "region eu-central us-east", js: `"region":["eu-central","us-east"]`, ok: true},
	{scope: "provider", cf: "region \"eu central\"", js: `"region":["eu central"]`},
	{scope: "provider", cf: "supports stealth proxy_country record solve_captchas timeout", js: `"supports":["stealth","proxy_country","record","solve_captchas","timeout"]`, ok: true},
	{scope: "provider", cf: "supports region", js: `"supports":["region"]`},
	{scope: "provider", cf: "supports colour", js: `"supports":["colour"]`},
	{scope: "provider", cf: "option_map region eu-central=eu-central-1 us-east=us-east-1", js: `"option_map":{"region":{"eu-central":"eu-central-1","us-east":"us-east-1"}}`, ok: true},
	{scope: "provider", cf: "option_map region eu-central=eu-central-1\noption_map proxy_country gb=uk", js: `"option_map":{"region":{"eu-central":"eu-central-1"},"proxy_country":{"gb":"uk"}}`, ok: true},
	{scope: "provider", cf: "option_map colour red=rouge", js: `"option_map":{"colour":{"red":"rouge"}}`},
	{scope: "provider", cf: "option_map region eu={env.X}", js: `"option_map":{"region":{"eu":"{env.X}"}}`},
	{scope: "provider", cf: "option_map region eu=", js: `"option_map":{"region":{"eu":""}}`},
	{scope: "provider", url: "ws://h:1/?stealth={bf.option.stealth}&proxy={bf.option.proxy_country}", cf: "supports stealth proxy_country", js: `"supports":["stealth","proxy_country"]`, ok: true},
	{scope: "provider", url: "ws://h:1/?x={bf.option.colour}", cf: "pass_query", js: `"pass_query":true`},
	{scope: "provider", cf: "header_up X-Region {bf.option.region}", js: `"headers_up":[{"op":"set","field":"X-Region","value":"{bf.option.region}"}]`, ok: true},
	{scope: "provider", cf: "header_up X-Region {bf.option.zone}", js: `"headers_up":[{"op":"set","field":"X-Region","value":"{bf.option.zone}"}]`},
	{scope: "provider", url: "http://h:1", cf: "protocol bidi", js: `"protocol":"bidi"`, ok: true},
	{scope: "provider", url: "http://h:1", cf: "protocol bidi\ndiscover off", js: `"protocol":"bidi","discover":false`, ok: true},
	{scope: "provider", url: "http://h:1", cf: "protocol bidi\ndiscover on", js: `"protocol":"bidi","discover":true`},
	{scope: "provider", url: "http://h:1", cf: "discover on\nprotocol bidi", js: `"discover":true,"protocol":"bidi"`},
	{scope: "provider", url: "{env.BROWSER_URL}", cf: "protocol bidi\ndiscover on", js: `"protocol":"bidi","discover":true`},
	{scope: "provider", cf: "protocol bidi\nmax_concurrent 0", js: `"protocol":"bidi","max_concurrent":0`, ok: true}, // unlimited in both
	{scope: "provider", cf: "protocol bidi\nmax_concurrent 3", js: `"protocol":"bidi","max_concurrent":3`, ok: true},
	{scope: "provider", cf: "protocol bidi\nplaywright_version 1.65", js: `"protocol":"bidi","playwright_version":"1.65"`},
	{scope: "provider", cf: "protocol playwright\nplaywright_version 1.65", js: `"protocol":"playwright","playwright_version":"1.65"`, ok: true},
	{scope: "provider", cf: "playwright_version 1.65", js: `"playwright_version":"1.65"`},
	{scope: "provider", cf: "protocol playwright\nplaywright_version 1.65.1", js: `"protocol":"playwright","playwright_version":"1.65.1"`},
	{scope: "provider", cf: "tls_server_name h", js: `"tls":{"server_name":"h"}`},
	{scope: "provider", url: "wss://h:1", cf: "tls_server_name h", js: `"tls":{"server_name":"h"}`, ok: true},
	{scope: "provider", url: "wss://h:1", cf: `tls_trusted_ca_certs ""`, js: `"tls":{"trusted_ca_certs":[""]}`},
	{scope: "provider", url: "{env.BROWSER_URL}", ok: true},
	{scope: "provider", url: "{env.BROWSER_URL}", cf: "discover on", js: `"discover":true`, ok: true}, // judged once resolved
	{scope: "provider", url: "wss://h/?key={env.KEY}", ok: true},
	{scope: "provider", url: "{env.SCHEME}://h:1"},
	{scope: "provider", url: "ftp://h:1"},
	{scope: "provider", url: "h:1"},

	// Cooldown, the handler's and a provider's.
	{scope: "cooldown", cf: "duration 1s", js: `"duration":"1s"`, ok: true},
	{scope: "cooldown", cf: "duration 0", js: `"duration":0`},
	{scope: "cooldown", cf: "duration -1s", js: `"duration":"-1s"`},
	{scope: "cooldown", cf: "max_duration 0", js: `"max_duration":0`},
	{scope: "cooldown", cf: "window 30s", js: `"window":"30s"`, ok: true},
	{scope: "cooldown", cf: "window 0", js: `"window":0`},
	{scope: "cooldown", cf: "failure_threshold 0.25", js: `"failure_threshold":0.25`, ok: true},
	{scope: "cooldown", cf: "failure_threshold 1", js: `"failure_threshold":1`, ok: true},
	{scope: "cooldown", cf: "failure_threshold 0", js: `"failure_threshold":0`},
	{scope: "cooldown", cf: "failure_threshold 1.5", js: `"failure_threshold":1.5`},
	{scope: "cooldown", cf: "failure_threshold -0.1", js: `"failure_threshold":-0.1`},
	{scope: "cooldown", cf: "min_requests 0", js: `"min_requests":0`, ok: true}, // the default, in both
	{scope: "cooldown", cf: "min_requests 5", js: `"min_requests":5`, ok: true},
	{scope: "cooldown", cf: "min_requests -1", js: `"min_requests":-1`},
	{scope: "cooldown", cf: "duration 1m\nmax_duration 10s", js: `"duration":"1m","max_duration":"10s"`},
	{scope: "provider_cooldown", cf: "duration 1s", js: `"duration":"1s"`, ok: true},
	{scope: "provider_cooldown", cf: "failure_threshold 0", js: `"failure_threshold":0`},
	{scope: "provider_cooldown", cf: "window 0", js: `"window":0`},

	// Queue and session.
	{scope: "queue", cf: "size 0", js: `"size":0`, ok: true}, // no queue, in both
	{scope: "queue", cf: "size 5", js: `"size":5`, ok: true},
	{scope: "queue", cf: "size -1", js: `"size":-1`},
	{scope: "queue", cf: "timeout 5s", js: `"timeout":"5s"`, ok: true},
	{scope: "queue", cf: "timeout 0", js: `"timeout":0`},
	{scope: "queue", cf: "timeout -1s", js: `"timeout":"-1s"`},
	{scope: "session", cf: "idle_timeout 0", js: `"idle_timeout":0`, ok: true},
	{scope: "session", cf: "max_duration 1h", js: `"max_duration":"1h"`, ok: true},
	{scope: "session", cf: "idle_timeout -1s", js: `"idle_timeout":"-1s"`},

	{scope: "handler", cf: "reap_interval 10s", js: `"reap_interval":"10s"`, ok: true},
	{scope: "handler", cf: "reap_interval 0s", js: `"reap_interval":0`},
	{scope: "handler", cf: "reap_interval -1s", js: `"reap_interval":"-1s"`},
	// Spend and learnt caps.
	{scope: "provider", cf: "cost 0.1 per session", js: `"cost":{"amount":0.1,"per":"session"}`, ok: true},
	{scope: "provider", cf: "cost 0.05 per minute minimum 1m", js: `"cost":{"amount":0.05,"per":"minute","minimum":"1m"}`, ok: true},
	{scope: "provider", cf: "cost 1.2 per hour", js: `"cost":{"amount":1.2,"per":"hour"}`, ok: true},
	{scope: "provider", cf: "cost 0 per minute", js: `"cost":{"amount":0,"per":"minute"}`, ok: true},
	{scope: "provider", cf: "cost -1 per minute", js: `"cost":{"amount":-1,"per":"minute"}`},
	{scope: "provider", cf: "cost 1 per day", js: `"cost":{"amount":1,"per":"day"}`},
	{scope: "provider", cf: "cost 1 per session minimum 1m", js: `"cost":{"amount":1,"per":"session","minimum":"1m"}`},
	{scope: "provider", cf: "cost 1 per minute minimum -1m", js: `"cost":{"amount":1,"per":"minute","minimum":"-1m"}`},
	{scope: "provider", cf: "cost 1 per minute\nbudget 20 per day", js: `"cost":{"amount":1,"per":"minute"},"budget":{"amount":20,"per":"day"}`, ok: true},
	{scope: "provider", cf: "budget 20 per month\ncost 1 per minute", js: `"budget":{"amount":20,"per":"month"},"cost":{"amount":1,"per":"minute"}`, ok: true},
	{scope: "provider", cf: "budget 20 per day", js: `"budget":{"amount":20,"per":"day"}`},
	{scope: "provider", cf: "cost 1 per minute\nbudget 0 per day", js: `"cost":{"amount":1,"per":"minute"},"budget":{"amount":0,"per":"day"}`},
	{scope: "provider", cf: "cost 1 per minute\nbudget 5 per week", js: `"cost":{"amount":1,"per":"minute"},"budget":{"amount":5,"per":"week"}`},
	{scope: "provider", cf: "warm 2", js: `"warm":2`, ok: true},
	{scope: "provider", cf: "warm 0", js: `"warm":0`, ok: true},
	{scope: "provider", cf: "warm -1", js: `"warm":-1`},
	{scope: "provider", cf: "warm two", js: `"warm":"two"`},
	{scope: "provider", cf: "warm 1\nwarm_max_age 2m", js: `"warm":1,"warm_max_age":"2m"`, ok: true},
	{scope: "provider", cf: "warm 1\nwarm_max_age 0", js: `"warm":1,"warm_max_age":0`},
	{scope: "provider", cf: "max_concurrent 1\nwarm 2", js: `"max_concurrent":1,"warm":2`},
	{scope: "provider", cf: "warm 1\nregion eu-central\nsupports stealth proxy_country\nwarm_options region=eu-central stealth=true proxy_country=de",
		js: `"warm":1,"region":["eu-central"],"supports":["stealth","proxy_country"],"warm_options":{"proxy_country":"de","region":"eu-central","stealth":"true"}`, ok: true},
	{scope: "provider", cf: "warm 1\nsupports stealth\nwarm_options stealth=yes", js: `"warm":1,"supports":["stealth"],"warm_options":{"stealth":"yes"}`},
	{scope: "provider", cf: "warm 1\nwarm_options stealth=true", js: `"warm":1,"warm_options":{"stealth":"true"}`},
	{scope: "provider", cf: "supports stealth\nwarm_options stealth=true", js: `"supports":["stealth"],"warm_options":{"stealth":"true"}`},
	{scope: "provider", cf: "warm 1\nwarm_options colour=red", js: `"warm":1,"warm_options":{"colour":"red"}`},
	{scope: "provider", cf: "warm 1\nwarm_options profile=alice", js: `"warm":1,"warm_options":{"profile":"alice"}`},
	{scope: "provider", cf: "create_rate 30 per minute", js: `"create_rate":{"n":30,"per":"minute"}`, ok: true},
	{scope: "provider", cf: "create_rate 1 per second", js: `"create_rate":{"n":1,"per":"second"}`, ok: true},
	{scope: "provider", cf: "create_rate 0 per second", js: `"create_rate":{"n":0,"per":"second"}`},
	{scope: "provider", cf: "create_rate -2 per minute", js: `"create_rate":{"n":-2,"per":"minute"}`},
	{scope: "provider", cf: "create_rate 5 per hour", js: `"create_rate":{"n":5,"per":"hour"}`},
	{scope: "provider", cf: "create_rate 5 per Minute", js: `"create_rate":{"n":5,"per":"Minute"}`},
	{scope: "provider", cf: "create_rate 5 per", js: `"create_rate":{"n":5}`},
	{scope: "provider", cf: "create_rate 1.5 per second", js: `"create_rate":{"n":1.5,"per":"second"}`},
	{scope: "provider", cf: "create_rate five per second", js: `"create_rate":{"n":"five","per":"second"}`},
	{scope: "provider", cf: "create_rate 5 a second", js: `"create_rate":{"n":5,"a":"second"}`},
	{scope: "provider", cf: "max_concurrent auto", js: `"max_concurrent":"auto"`, ok: true},
	{scope: "provider", cf: "max_concurrent 3", js: `"max_concurrent":3`, ok: true},
	{scope: "provider", cf: "max_concurrent learn", js: `"max_concurrent":"learn"`},
	{scope: "provider", cf: "max_concurrent 1.5", js: `"max_concurrent":1.5`},
	{scope: "handler", cf: "strategy cheapest", js: `"strategy":"cheapest"`, ok: true},
	{scope: "handler", cf: "strategy cheapest\nexpected_duration 10m", js: `"strategy":"cheapest","expected_duration":"10m"`, ok: true},
	{scope: "handler", cf: "expected_duration 10m\nstrategy cheapest", js: `"expected_duration":"10m","strategy":"cheapest"`, ok: true},
	{scope: "handler", cf: "expected_duration 10m", js: `"expected_duration":"10m"`},
	{scope: "handler", cf: "strategy cheapest\nexpected_duration 0s", js: `"strategy":"cheapest","expected_duration":0`},
	{scope: "handler", cf: "client_budget {http.auth.user.id} 20 per day", js: `"client_budget":{"key":"{http.auth.user.id}","amount":20,"per":"day"}`, ok: true},
	{scope: "handler", cf: "client_budget {http.auth.user.id} 0 per day", js: `"client_budget":{"key":"{http.auth.user.id}","amount":0,"per":"day"}`},
	{scope: "handler", cf: "client_budget user 5 per day", js: `"client_budget":{"key":"user","amount":5,"per":"day"}`},
	{scope: "handler", cf: "client_budget {http.auth.user.id} 5 per minute", js: `"client_budget":{"key":"{http.auth.user.id}","amount":5,"per":"minute"}`},
	// Shared state.
	{scope: "redis", cf: "db 0", js: `"db":0`, ok: true},
	{scope: "redis", cf: "db -1", js: `"db":-1`},
	{scope: "redis", cf: "lease_ttl 1s", js: `"lease_ttl":"1s"`, ok: true},
	{scope: "redis", cf: "lease_ttl 0", js: `"lease_ttl":0`},
	{scope: "redis", cf: "timeout 0", js: `"timeout":0`},
	{scope: "redis", cf: "lease_ttl 1s\ntimeout 2s", js: `"lease_ttl":"1s","timeout":"2s"`},
	{scope: "redis", cf: "password {env.P}\nkey_prefix bf:", js: `"password":"{env.P}","key_prefix":"bf:"`, ok: true},
	{scope: "redis", cf: "tls\ntls_server_name r", js: `"tls":{"server_name":"r"}`, ok: true},
	{scope: "redis", cf: "lease_ttl 10ms", js: `"lease_ttl":"10ms"`},
	{scope: "redis", cf: "tls_trusted_ca_certs \"\"", js: `"tls":{"trusted_ca_certs":[""]}`},
	{scope: "handler", cf: "state redis redis://h:6379", js: `"state":{"redis":{"address":"redis://h:6379"}}`},
	{scope: "handler", cf: "state redis h:0", js: `"state":{"redis":{"address":"h:0"}}`},
	{scope: "handler", cf: "state redis {env.REDIS_ADDR}", js: `"state":{"redis":{"address":"{env.REDIS_ADDR}"}}`, ok: true},
	{scope: "handler", cf: "state redis {\naddress h:6379\n}", js: `"state":{"redis":{"address":"h:6379"}}`, ok: true},
	{scope: "handler", cf: "state redis {\nsentinel mymaster h:26379 h2:26379\nsentinel_username su\nsentinel_password {env.SP}\n}",
		js: `"state":{"redis":{"sentinel":{"master":"mymaster","addresses":["h:26379","h2:26379"]},"sentinel_username":"su","sentinel_password":"{env.SP}"}}`, ok: true},
	{scope: "handler", cf: "state redis {\ncluster h:7000 h:7001\npassword {env.P}\ntls\n}", js: `"state":{"redis":{"cluster":["h:7000","h:7001"],"password":"{env.P}","tls":{}}}`, ok: true},
	{scope: "handler", cf: "state redis {\ncluster {env.SEED}\n}", js: `"state":{"redis":{"cluster":["{env.SEED}"]}}`, ok: true},
	{scope: "handler", cf: "state redis h:6379 {\ncluster h:7000\n}", js: `"state":{"redis":{"address":"h:6379","cluster":["h:7000"]}}`},
	{scope: "handler", cf: "state redis {\nsentinel m h:26379\ncluster h:7000\n}", js: `"state":{"redis":{"sentinel":{"master":"m","addresses":["h:26379"]},"cluster":["h:7000"]}}`},
	{scope: "handler", cf: "state redis {\nsentinel m\n}", js: `"state":{"redis":{"sentinel":{"master":"m"}}}`},
	{scope: "handler", cf: "state redis {\nsentinel m h:0\n}", js: `"state":{"redis":{"sentinel":{"master":"m","addresses":["h:0"]}}}`},
	{scope: "handler", cf: "state redis {\ncluster h:7000\ndb 1\n}", js: `"state":{"redis":{"cluster":["h:7000"],"db":1}}`},
	{scope: "handler", cf: "state redis {\nsentinel m h:26379\ndb 1\n}", js: `"state":{"redis":{"sentinel":{"master":"m","addresses":["h:26379"]},"db":1}}`, ok: true},
	{scope: "handler", cf: "state redis h:6379 {\nsentinel_username u\n}", js: `"state":{"redis":{"address":"h:6379","sentinel_username":"u"}}`},
	{scope: "handler", cf: "state redis {\nnode n1\n}", js: `"state":{"redis":{},"node":"n1"}`},
	{scope: "state", cf: "on_unavailable reject", js: `"on_unavailable":"reject"`, ok: true},
	{scope: "state", cf: "on_unavailable wait", js: `"on_unavailable":"wait"`},

	// Health checks: a default never makes one invalid, a value the user
	// wrote may.
	{scope: "provider", url: "http://h:1", cf: "health_check {\ninterval 100ms\n}", js: `"health_check":{"interval":"100ms"}`, ok: true},
	{scope: "provider", url: "http://h:1", cf: "health_check {\ntimeout 15s\n}", js: `"health_check":{"timeout":"15s"}`, ok: true},
	{scope: "provider", url: "http://h:1", cf: "health_check {\ninterval 1s\ntimeout 2s\n}", js: `"health_check":{"interval":"1s","timeout":"2s"}`},
	{scope: "raw", cf: "health_check {\ninterval 100ms\n}\nprovider a http://h:1",
		js: `{"health_check":{"interval":"100ms"},"providers":[{"name":"a","url":"http://h:1"}]}`, ok: true},
	{scope: "raw", cf: "health_check {\ntimeout 5s\n}\nprovider a http://h:1 {\nhealth_check {\ninterval 1s\n}\n}",
		js: `{"health_check":{"timeout":"5s"},"providers":[{"name":"a","url":"http://h:1","health_check":{"interval":"1s"}}]}`},

	// Every other option, zeros included.
	{scope: "handler", cf: "keepalive 30s", js: `"keepalive":"30s"`, ok: true},
	{scope: "handler", cf: "keepalive off", js: `"keepalive":0`, ok: true},
	{scope: "handler", cf: "keepalive 0s", js: `"keepalive":"0s"`, ok: true}, // off in both
	{scope: "handler", cf: "keepalive -1s", js: `"keepalive":"-1s"`},
	{scope: "handler", cf: "resume 5m", js: `"resume":{"window":"5m"}`, ok: true},
	{scope: "handler", cf: "resume 5m hold", js: `"resume":{"window":"5m","hold":true}`, ok: true},
	{scope: "handler", cf: "resume 0s", js: `"resume":{"window":"0s"}`},
	{scope: "handler", cf: "resume 5m\nresume_key {http.auth.user.id}", js: `"resume":{"window":"5m"},"resume_key":"{http.auth.user.id}"`, ok: true},
	{scope: "handler", cf: "resume 5m\nresume_key user", js: `"resume":{"window":"5m"},"resume_key":"user"`},
	{scope: "handler", cf: "resume_key {http.auth.user.id}", js: `"resume_key":"{http.auth.user.id}"`},
	{scope: "handler", cf: "forward_headers X-Trace-* x-request-id", js: `"forward_headers":["X-Trace-*","x-request-id"]`, ok: true},
	{scope: "handler", cf: "forward_headers Connection", js: `"forward_headers":["Connection"]`},
	{scope: "handler", cf: "forward_headers X-*-Id", js: `"forward_headers":["X-*-Id"]`},
	{scope: "handler", cf: "discovery on", js: `"discovery":true`, ok: true},
	{scope: "handler", cf: "state redis h:6379 {\nnode gw-1\n}", js: `"state":{"redis":{"address":"h:6379"},"node":"gw-1"}`, ok: true},
	{scope: "handler", cf: "webhook http://h/in {\nsecret {env.S}\n}", js: `"webhooks":[{"url":"http://h/in","secret":"{env.S}"}]`, ok: true},
	{scope: "handler", cf: "webhook ftp://h/in", js: `"webhooks":[{"url":"ftp://h/in"}]`},
	{scope: "raw", cf: "health_check {\ninterval 0s\n}\nprovider a http://h:1",
		js: `{"health_check":{"interval":0},"providers":[{"name":"a","url":"http://h:1"}]}`},
	{scope: "raw", cf: "health_check {\ntimeout 0s\n}\nprovider a http://h:1",
		js: `{"health_check":{"timeout":"0s"},"providers":[{"name":"a","url":"http://h:1"}]}`},
	{scope: "raw", cf: "health_check {\nexpect_status 0\n}\nprovider a http://h:1",
		js: `{"health_check":{"expect_status":0},"providers":[{"name":"a","url":"http://h:1"}]}`},
	{scope: "provider", url: "http://h:1", cf: "health_check {\nuri /up\nexpect_status 204\n}", js: `"health_check":{"uri":"/up","expect_status":204}`, ok: true},
	{scope: "provider", url: "http://h:1", cf: "health_check {\nuri up\n}", js: `"health_check":{"uri":"up"}`},
	{scope: "provider", url: "http://h:1", cf: "health_check {\ncapacity browserless\n}", js: `"health_check":{"capacity":"browserless"}`, ok: true},
	{scope: "provider", url: "http://h:1", cf: "health_check {\ncapacity steel\n}", js: `"health_check":{"capacity":"steel"}`},
	{scope: "provider", url: "http://h:1", cf: "health_check off", js: `"health_check":{"off":true}`, ok: true},
	{scope: "provider", url: "wss://h:1", cf: "tls_insecure_skip_verify", js: `"tls":{"insecure_skip_verify":true}`, ok: true},
	{scope: "provider", url: "wss://h:1", cf: "tls_trusted_ca_certs /a.pem /b.pem", js: `"tls":{"trusted_ca_certs":["/a.pem","/b.pem"]}`, ok: true},
	{scope: "provider", url: "ws://h:1", cf: "tls_trusted_ca_certs /a.pem", js: `"tls":{"trusted_ca_certs":["/a.pem"]}`},
	{scope: "provider", url: "https://api.h.example", cf: "session_api {\ncreate POST /v1/sessions\nheader X-K {env.K}\nbody `{\"a\":1}`\nconnect_url /connectUrl\nsession_id /id\nrelease DELETE /v1/sessions/{session_id}\nrelease_body `{\"b\":2}`\nconnect_hosts connect.h.example *.cdn.example\n}",
		js: `"session_api":{"create_method":"POST","create_url":"/v1/sessions","headers":[{"field":"X-K","value":"{env.K}"}],"body":"{\"a\":1}","connect_url":"/connectUrl","session_id":"/id","release_method":"DELETE","release_url":"/v1/sessions/{session_id}","release_body":"{\"b\":2}","connect_hosts":["connect.h.example","*.cdn.example"]}`, ok: true},
	{scope: "provider", url: "https://api.h.example", cf: "session_api {\ncreate POST /v1/sessions\nconnect_url /connectUrl\nsession_id /id\nrelease DELETE /v1/sessions/{session_id}\nlist GET /v1/sessions?status=RUNNING\nlist_ids /sessions\nreap_untracked\n}", js: `"session_api":{"create_method":"POST","create_url":"/v1/sessions","connect_url":"/connectUrl","session_id":"/id","release_method":"DELETE","release_url":"/v1/sessions/{session_id}","list_method":"GET","list_url":"/v1/sessions?status=RUNNING","list_ids":"/sessions","reap_untracked":true}`, ok: true},
	{scope: "provider", url: "https://api.h.example", cf: "session_api {\ncreate POST /v1/sessions\nconnect_url /connectUrl\nsession_id /id\nrelease DELETE /v1/sessions/{session_id}\nlist GET /v1/sessions\n}", js: `"session_api":{"create_method":"POST","create_url":"/v1/sessions","connect_url":"/connectUrl","session_id":"/id","release_method":"DELETE","release_url":"/v1/sessions/{session_id}","list_method":"GET","list_url":"/v1/sessions"}`, ok: true},
	{scope: "provider", url: "https://api.h.example", cf: "session_api {\ncreate POST /v1/sessions\nconnect_url /connectUrl\nsession_id /id\nrelease DELETE /v1/sessions/{session_id}\ninsecure_connect\n}", js: `"session_api":{"create_method":"POST","create_url":"/v1/sessions","connect_url":"/connectUrl","session_id":"/id","release_method":"DELETE","release_url":"/v1/sessions/{session_id}","insecure_connect":true}`, ok: true},
	{scope: "provider", url: "https://api.h.example", cf: "session_api {\ncreate POST /v1/sessions\nconnect_url /connectUrl\nsession_id /id\nrelease DELETE /v1/sessions/{session_id}\ninsecure_connect on\n}", js: `"session_api":{"create_method":"POST","create_url":"/v1/sessions","connect_url":"/connectUrl","session_id":"/id","release_method":"DELETE","release_url":"/v1/sessions/{session_id}","insecure_connect":true}`, ok: true},
	{scope: "provider", url: "https://api.h.example", cf: "session_api {\ncreate POST /v1/sessions\nconnect_url /connectUrl\nsession_id /id\nrelease DELETE /v1/sessions/{session_id}\ninsecure_connect off\n}", js: `"session_api":{"create_method":"POST","create_url":"/v1/sessions","connect_url":"/connectUrl","session_id":"/id","release_method":"DELETE","release_url":"/v1/sessions/{session_id}","insecure_connect":false}`, ok: true},
	{scope: "provider", url: "https://api.h.example", cf: "session_api {\ncreate POST /v1/sessions\nconnect_url /connectUrl\nsession_id /id\nrelease DELETE /v1/sessions/{session_id}\ninsecure_connect yes\n}", js: `"session_api":{"create_method":"POST","create_url":"/v1/sessions","connect_url":"/connectUrl","session_id":"/id","release_method":"DELETE","release_url":"/v1/sessions/{session_id}","insecure_connect":"yes"}`},
	{scope: "provider", url: "https://api.h.example", cf: "session_api {\ncreate POST /v1/sessions\nconnect_url /connectUrl\nsession_id /id\nrelease DELETE /v1/sessions/{session_id}\ninsecure_connect on off\n}", js: `"session_api":{"create_method":"POST","create_url":"/v1/sessions","connect_url":"/connectUrl","session_id":"/id","release_method":"DELETE","release_url":"/v1/sessions/{session_id}","insecure_connect":[true,false]}`},
	{scope: "provider", url: "https://api.h.example", cf: "session_api {\ncreate POST /v1/sessions\nconnect_url /connectUrl\nsession_id /id\nrelease DELETE /v1/sessions/{session_id}\nreap_untracked on\n}", js: `"session_api":{"create_method":"POST","create_url":"/v1/sessions","connect_url":"/connectUrl","session_id":"/id","release_method":"DELETE","release_url":"/v1/sessions/{session_id}","reap_untracked":true}`},
	{scope: "provider", url: "https://api.h.example", cf: "session_api {\ncreate POST /v1/sessions\nconnect_url /connectUrl\nsession_id /id\nrelease DELETE /v1/sessions/{session_id}\nlist_ids /sessions\n}", js: `"session_api":{"create_method":"POST","create_url":"/v1/sessions","connect_url":"/connectUrl","session_id":"/id","release_method":"DELETE","release_url":"/v1/sessions/{session_id}","list_ids":"/sessions"}`},
	{scope: "provider", url: "https://api.h.example", cf: "session_api {\ncreate POST /v1/sessions\nconnect_url /connectUrl\nsession_id /id\nrelease DELETE /v1/sessions/{session_id}\nlist GET /v1/sessions\nlist_ids sessions\n}", js: `"session_api":{"create_method":"POST","create_url":"/v1/sessions","connect_url":"/connectUrl","session_id":"/id","release_method":"DELETE","release_url":"/v1/sessions/{session_id}","list_method":"GET","list_url":"/v1/sessions","list_ids":"sessions"}`},
	{scope: "provider", url: "https://api.h.example", cf: "session_api {\ncreate POST /v1/sessions\nconnect_url /connectUrl\nsession_id /id\nrelease DELETE /v1/sessions/{session_id}\nlist get /v1/sessions\n}", js: `"session_api":{"create_method":"POST","create_url":"/v1/sessions","connect_url":"/connectUrl","session_id":"/id","release_method":"DELETE","release_url":"/v1/sessions/{session_id}","list_method":"get","list_url":"/v1/sessions"}`},
	{scope: "provider", url: "https://api.h.example", cf: "session_api {\ncreate POST /v1/sessions\nconnect_url /connectUrl\nsession_id /id\nrelease DELETE /v1/sessions/{session_id}\nconnect_hosts *.com\n}",
		js: `"session_api":{"create_method":"POST","create_url":"/v1/sessions","connect_url":"/connectUrl","session_id":"/id","release_method":"DELETE","release_url":"/v1/sessions/{session_id}","connect_hosts":["*.com"]}`},
	{scope: "provider", url: "https://api.h.example", cf: "session_api {\ncreate POST /v1/sessions\nconnect_url id\nsession_id /id\nrelease DELETE /v1/sessions/{session_id}\n}",
		js: `"session_api":{"create_method":"POST","create_url":"/v1/sessions","connect_url":"id","session_id":"/id","release_method":"DELETE","release_url":"/v1/sessions/{session_id}"}`},
	{scope: "redis", cf: "username u\nkey_prefix p:\ntls_insecure_skip_verify", js: `"username":"u","key_prefix":"p:","tls":{"insecure_skip_verify":true}`, ok: true},

	// A providers block: its own options, and every provider option.
	{scope: "providers", cf: "max_concurrent 2", js: `"max_concurrent":2`, ok: true},
	{scope: "providers", cf: "max_concurrent auto", js: `"max_concurrent":"auto"`, ok: true},
	{scope: "providers", cf: "weight 0", js: `"weight":0`},
	{scope: "providers", cf: "scheme ws", js: `"scheme":"ws"`, ok: true},
	{scope: "providers", cf: "scheme https\ntls_server_name h", js: `"scheme":"https","tls":{"server_name":"h"}`, ok: true},
	{scope: "providers", cf: "tls_server_name h", js: `"tls":{"server_name":"h"}`}, // http:// by default
	{scope: "providers", cf: "scheme ftp", js: `"scheme":"ftp"`},
	{scope: "providers", cf: "path /devtools/browser?token={env.T}", js: `"path":"/devtools/browser?token={env.T}"`, ok: true},
	{scope: "providers", cf: "path devtools", js: `"path":"devtools"`},
	{scope: "providers", cf: "path /#x", js: `"path":"/#x"`},
	{scope: "providers", cf: "discover off", js: `"discover":false`, ok: true},
	{scope: "providers", cf: "scheme ws\ndiscover on", js: `"scheme":"ws","discover":true`},
	{scope: "providers", cf: "protocol bidi", js: `"protocol":"bidi"`, ok: true},
	{scope: "providers", cf: "cost 0.1 per minute\nbudget 5 per day", js: `"cost":{"amount":0.1,"per":"minute"},"budget":{"amount":5,"per":"day"}`, ok: true},
	{scope: "providers", cf: "warm 1\nmax_concurrent 2", js: `"warm":1,"max_concurrent":2`, ok: true},
	{scope: "providers", cf: "health_check {\ninterval 1s\n}", js: `"health_check":{"interval":"1s"}`, ok: true},
	{scope: "providers", cf: "scheme ws\nhealth_check {\ninterval 1s\n}", js: `"scheme":"ws","health_check":{"interval":"1s"}`},
	{scope: "providers", cf: "cooldown {\nduration 5s\n}", js: `"cooldown":{"duration":"5s"}`, ok: true},
	{scope: "raw", cf: "providers br {\ndynamic srv _b._tcp.h {\nrefresh 5s\nresolvers 127.0.0.1:53\n}\n}",
		js: `{"dynamic_providers":[{"name":"br","dynamic":{"name":"_b._tcp.h","refresh":5000000000,"resolver":{"addresses":["127.0.0.1:53"]},"source":"srv"}}]}`, ok: true},
	{scope: "raw", cf: "providers br {\ndynamic multi {\na h 9222\n}\n}",
		js: `{"dynamic_providers":[{"name":"br","dynamic":{"source":"multi","sources":[{"name":"h","port":"9222","source":"a"}]}}]}`, ok: true},
	{scope: "raw", cf: "providers br {\nmax_concurrent 1\n}", js: `{"dynamic_providers":[{"name":"br","max_concurrent":1}]}`}, // no source
	{scope: "raw", cf: "providers br {\ndynamic a h 9222\n}\nprovider br/h:9222 ws://h:9222",
		js: `{"providers":[{"name":"br/h:9222","url":"ws://h:9222"}],"dynamic_providers":[{"name":"br","dynamic":{"name":"h","port":"9222","source":"a"}}]}`},
	{scope: "raw", cf: "providers br {\ndynamic a h 9222\n}\nproviders br {\ndynamic a g 9222\n}",
		js: `{"dynamic_providers":[{"name":"br","dynamic":{"name":"h","port":"9222","source":"a"}},{"name":"br","dynamic":{"name":"g","port":"9222","source":"a"}}]}`},
	{scope: "raw", cf: "cooldown {\nmax_duration 1m\n}\nproviders br {\ndynamic a h 9222\ncooldown {\nduration 10m\n}\n}",
		js: `{"cooldown":{"max_duration":"1m"},"dynamic_providers":[{"name":"br","dynamic":{"name":"h","port":"9222","source":"a"},"cooldown":{"duration":"10m"}}]}`},

	// Whole configs.
	{scope: "raw", cf: "", js: `{}`}, // no providers
	{scope: "raw", cf: "provider a ws://h:1\nprovider a ws://h:2",
		js: `{"providers":[{"name":"a","url":"ws://h:1"},{"name":"a","url":"ws://h:2"}]}`},
	{scope: "raw", cf: "cooldown {\nmax_duration 1m\n}\nprovider a ws://h:1 {\ncooldown {\nduration 10m\n}\n}",
		js: `{"cooldown":{"max_duration":"1m"},"providers":[{"name":"a","url":"ws://h:1","cooldown":{"duration":"10m"}}]}`},
	{scope: "raw", cf: "cooldown {\nmax_duration 1m\n}\nprovider a ws://h:1 {\ncooldown {\nduration 10m\nmax_duration 20m\n}\n}",
		js: `{"cooldown":{"max_duration":"1m"},"providers":[{"name":"a","url":"ws://h:1","cooldown":{"duration":"10m","max_duration":"20m"}}]}`, ok: true},
}

// build returns the case as a Caddyfile directive and as a handler's JSON.
func (tc parityCase) build() (cf, js string) {
	url := tc.url
	if url == "" {
		url = "ws://h:1"
	}
	members := func(ms ...string) string {
		var out []string
		for _, m := range ms {
			if m != "" {
				out = append(out, m)
			}
		}
		return "{" + strings.Join(out, ",") + "}"
	}
	const provider = `{"name":"a","url":"ws://h:1"}`
	directive := func(lines string) string { return "browser_failover {\n" + lines + "\n}" }
	switch tc.scope {
	case "handler":
		return directive("provider a ws://h:1\n" + tc.cf), members(`"providers":[`+provider+`]`, tc.js)
	case "provider":
		return directive(fmt.Sprintf("provider a %s {\n%s\n}", url, tc.cf)),
			members(`"providers":[` + members(`"name":"a"`, fmt.Sprintf(`"url":%q`, url), tc.js) + `]`)
	case "provider_cooldown":
		return directive("provider a ws://h:1 {\ncooldown {\n" + tc.cf + "\n}\n}"),
			members(`"providers":[` + members(`"name":"a","url":"ws://h:1"`, `"cooldown":`+members(tc.js)) + `]`)
	case "cooldown", "queue", "session":
		return directive("provider a ws://h:1\n" + tc.scope + " {\n" + tc.cf + "\n}"),
			members(`"providers":[`+provider+`]`, fmt.Sprintf("%q:", tc.scope)+members(tc.js))
	case "redis":
		return directive("provider a ws://h:1\nstate redis h:6379 {\n" + tc.cf + "\n}"),
			members(`"providers":[`+provider+`]`, `"state":{"redis":`+members(`"address":"h:6379"`, tc.js)+`}`)
	case "state":
		return directive("provider a ws://h:1\nstate redis h:6379 {\n" + tc.cf + "\n}"),
			members(`"providers":[`+provider+`]`, `"state":`+members(`"redis":{"address":"h:6379"}`, tc.js))
	case "providers":
		return directive("providers br {\ndynamic a h 9222\n" + tc.cf + "\n}"),
			members(`"dynamic_providers":[` + members(`"name":"br","dynamic":{"name":"h","port":"9222","source":"a"}`, tc.js) + `]`)
	case "raw":
		return directive(tc.cf), tc.js
	}
	panic("unknown scope " + tc.scope)
}

// TestParity: every value is accepted by both the Caddyfile and JSON, or
// rejected by both; an accepted value means the same in both; and what the
// Caddyfile parser accepts also passes check() once adapted to JSON (the
// parser misses no rule).
func TestParity(t *testing.T) {
	for _, tc := range parityCases {
		cf, js := tc.build()
		name := tc.scope + ": " + strings.ReplaceAll(tc.cf+tc.url, "\n", "; ")
		t.Run(name, func(t *testing.T) {
			fromCF, adaptErr, cfErr := fromCaddyfile(t, cf)
			fromJS, jsErr := fromJSON([]byte(js))
			if (cfErr == nil) != (jsErr == nil) || (cfErr == nil) != tc.ok {
				t.Fatalf("want ok=%v in both\nCaddyfile: %v\n%s\nJSON: %v\n%s", tc.ok, cfErr, cf, jsErr, js)
			}
			if adaptErr == nil && cfErr != nil {
				t.Fatalf("the Caddyfile parser accepted what check() rejects: %v", cfErr)
			}
			if tc.ok {
				a, _ := json.Marshal(fromCF)
				b, _ := json.Marshal(fromJS)
				if string(a) != string(b) {
					t.Fatalf("the same value means different things:\nCaddyfile: %s\nJSON:      %s", a, b)
				}
			}
		})
	}
}

// fromCaddyfile adapts a browser_failover directive as caddy adapt does
// and loads the handler's JSON as Caddy does; adaptErr is the adapter's
// error, err the first error of the two.
func fromCaddyfile(t *testing.T, directive string) (h *Handler, adaptErr, err error) {
	t.Helper()
	out, _, adaptErr := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(":8080\n"+directive), map[string]any{"filename": "Caddyfile"})
	if adaptErr != nil {
		return nil, adaptErr, adaptErr
	}
	var doc any
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	raw := findHandler(doc)
	if raw == nil {
		t.Fatalf("no browser_failover handler in %s", out)
	}
	// Caddy takes the module name out before decoding the rest.
	delete(raw, "handler")
	b, _ := json.Marshal(raw)
	h, err = fromJSON(b)
	return h, nil, err
}

// fromJSON loads a handler's JSON as Caddy does (strictly) and checks it.
func fromJSON(b []byte) (*Handler, error) {
	h := new(Handler)
	if err := caddy.StrictUnmarshalJSON(b, h); err != nil {
		return nil, err
	}
	return h, h.Validate()
}

// findHandler returns the first browser_failover handler object in doc.
func findHandler(doc any) map[string]any {
	switch v := doc.(type) {
	case map[string]any:
		if v["handler"] == "browser_failover" {
			return v
		}
		for _, c := range v {
			if h := findHandler(c); h != nil {
				return h
			}
		}
	case []any:
		for _, c := range v {
			if h := findHandler(c); h != nil {
				return h
			}
		}
	}
	return nil
}

// TestJSONStatedZero: an explicit 0 is told from a left-out option, however
// JSON spells the key, and null is the same as left out.
func TestJSONStatedZero(t *testing.T) {
	for js, ok := range map[string]bool{
		`{"providers":[{"name":"a","url":"ws://h:1"}]}`:                         true,
		`{"providers":[{"name":"a","url":"ws://h:1","weight":null}]}`:           true,
		`{"providers":[{"name":"a","url":"ws://h:1","weight":0}]}`:              false,
		`{"providers":[{"name":"a","url":"ws://h:1","Weight":0}]}`:              false,
		`{"providers":[{"name":"a","url":"ws://h:1"}],"HEDGE_MAX":0}`:           false,
		`{"providers":[{"name":"a","url":"ws://h:1"}],"queue":{}}`:              true,
		`{"providers":[{"name":"a","url":"ws://h:1"}],"queue":{"timeout":0}}`:   false,
		`{"providers":[{"name":"a","url":"ws://h:1"}],"colour":"blue"}`:         false,
		`{"providers":[{"name":"a","url":"ws://h:1","colour":"blue"}]}`:         false,
		`{"providers":[{"name":"a","url":"ws://h:1","cooldown":{"colour":1}}]}`: false,
	} {
		h := new(Handler)
		err := json.Unmarshal([]byte(js), h)
		if err == nil {
			err = h.Validate()
		}
		if (err == nil) != ok {
			t.Errorf("%s: error %v, want ok=%v", js, err, ok)
		}
	}
}

// TestPlaceholderURLAtProvision: a provider URL that is a placeholder as a
// whole passes the config check and is checked once resolved, when the
// handler is provisioned, with an error naming the provider and never the
// URL's secrets.
func TestPlaceholderURLAtProvision(t *testing.T) {
	const secret = "s3cr3tK3y"
	cases := []struct {
		url, extra, want string
	}{
		{"", "", `provider "a": the URL is empty once its placeholders are resolved (is the environment variable set?)`},
		{"ftp://h:1/?key=" + secret, "", `provider "a": URL scheme "ftp" is not one of ws, wss, http, https`},
		{"user:" + secret + "@h:1", "", `provider "a": URL must start with ws://, wss://, http:// or https://`},
		{"ws:///path?key=" + secret, "", `provider "a": URL has no host`},
		{"ws://h:1/%zz?key=" + secret, "", `provider "a": invalid URL`},
		{"wss://h:1/?key=" + secret, `,"discover":true`, `provider "a": discover on needs an http:// or https:// URL`},
		{"ws://h:1/?key=" + secret, `,"tls":{"server_name":"h"}`, `provider "a": TLS options need a wss:// or https:// URL`},
		{"ws://127.0.0.1:1/?key=" + secret, "", ""},
	}
	for _, tc := range cases {
		t.Setenv("BF_TEST_BROWSER_URL", tc.url)
		handler := `{"handler":"browser_failover","providers":[{"name":"a","url":"{env.BF_TEST_BROWSER_URL}"` + tc.extra + `}]}`
		var h Handler
		if err := json.Unmarshal([]byte(strings.Replace(handler, `"handler":"browser_failover",`, "", 1)), &h); err != nil {
			t.Fatal(err)
		}
		if err := h.Validate(); err != nil {
			t.Fatalf("%q: check() rejects a whole placeholder: %v", tc.url, err)
		}
		cfg := `{"admin":{"disabled":true},"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:0"],"routes":[{"handle":[` + handler + `]}]}}}}}`
		var c caddy.Config
		if err := json.Unmarshal([]byte(cfg), &c); err != nil {
			t.Fatal(err)
		}
		err := caddy.Validate(&c)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.url, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: error %v, want %q", tc.url, err, tc.want)
		case err != nil && strings.Contains(err.Error(), secret):
			t.Errorf("%q: the error shows a secret: %v", tc.url, err)
		}
	}
}

// TestHealthCheckImplicitDefaults: a value left out takes a default that
// fits the values given, so a default alone never makes a health check
// invalid; the merged check of each provider is what its probes run on.
func TestHealthCheckImplicitDefaults(t *testing.T) {
	ms := func(d int) caddy.Duration { return caddy.Duration(time.Duration(d) * time.Millisecond) }
	for _, tc := range []struct {
		name              string
		handler, own      *HealthCheckConfig
		interval, timeout caddy.Duration
	}{
		{"nothing given", &HealthCheckConfig{}, nil, ms(10000), ms(2000)},
		{"short interval", nil, &HealthCheckConfig{ProbeOptions: upstreams.ProbeOptions{Interval: ms(100)}}, ms(100), ms(100)},
		{"short interval at the handler", &HealthCheckConfig{ProbeOptions: upstreams.ProbeOptions{Interval: ms(500)}}, nil, ms(500), ms(500)},
		{"long timeout", nil, &HealthCheckConfig{ProbeOptions: upstreams.ProbeOptions{Timeout: ms(15000)}}, ms(15000), ms(15000)},
		{"both", nil, &HealthCheckConfig{ProbeOptions: upstreams.ProbeOptions{Interval: ms(3000), Timeout: ms(1000)}}, ms(3000), ms(1000)},
		{"merged", &HealthCheckConfig{ProbeOptions: upstreams.ProbeOptions{Timeout: ms(1000)}}, &HealthCheckConfig{ProbeOptions: upstreams.ProbeOptions{Interval: ms(400)}}, ms(400), ms(1000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := config.EffectiveHealthCheck(tc.handler, tc.own)
			if c.Interval != tc.interval || c.Timeout != tc.timeout {
				t.Fatalf("interval %v timeout %v, want %v and %v", time.Duration(c.Interval), time.Duration(c.Timeout),
					time.Duration(tc.interval), time.Duration(tc.timeout))
			}
		})
	}
}
