package browserfailover_test

// A secrets audit: credentials in provider URL user info and query values,
// in header_up values, in a session API's call headers and create and
// release bodies, and a webhook's signing secret and URL token; a
// client's own credentials for the gateway (a cookie, a token header, a
// bearer token, an API key used as its client_limit key); a short chaos
// soak; then every output of the process is searched for each secret in
// raw, URL-encoded and base64 forms: the log file, the status JSON, the
// sessions list, /metrics, the dashboard page and its JSON and action
// answers, the events, the webhook bodies and headers, and every answer
// body clients got. No provider may get the client's credentials; the
// client key shows only as an HMAC keyed with the deployment's secret,
// which shows nowhere either.

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
	"github.com/browserfailover/caddy-browser-failover/pool"
)

func TestSecretsAudit(t *testing.T) {
	const (
		user      = "aUdItUsEr7"
		pass      = "p@ss:wOrd/Z9!" // needs escaping in a URL
		query     = "qS3cr3t+v/al=ue"
		envQuery  = "eNvQuErY-5ecret"
		header    = "hDrS3cr3t-Token"
		bearer    = "bEaReRsEcReT8"
		hookKey   = "wHkS3cr3tKey"
		hookToken = "wHkQuErYtOk"
		hookPass  = "wHkPaSs4"
		redisPass = "rEdIsPaSs6"
		apiKey    = "cLiEnTaPiKeY3"
		// What a client sends for the gateway itself: none of it may reach
		// a provider or show anywhere.
		gwToken  = "gAtEwAyToKeN5"
		gwCookie = "cOoKiElOgIn2"
		gwBearer = "gWbEaReR7x"
		// A session API's key (a header of its create and release calls)
		// and a secret in its create and release bodies.
		restKey  = "rEsTaPiKeY4q"
		restBody = "rEsTbOdYsEcReT"
	)
	t.Setenv("AUDIT_QUERY_SECRET", envQuery)
	t.Setenv("AUDIT_HEADER_SECRET", header)
	t.Setenv("AUDIT_REDIS_PASSWORD", redisPass)
	t.Setenv("AUDIT_REST_KEY", restKey)
	secrets := []string{user, pass, query, envQuery, header, bearer, hookKey, hookToken, hookPass, redisPass, apiKey, gwToken, gwCookie, gwBearer, restKey, restBody}

	// Every form a secret could take on the way out.
	forms := secretForms(append(secrets,
		user+":"+pass, // what Authorization: Basic carries
		"Bearer "+bearer,
		url.UserPassword(user, pass).String(),
		"hook:"+hookPass)...)
	// The unkeyed hash the status used to show of a client key: a likely
	// value could be tried against it.
	apiSum := sha256.Sum256([]byte(apiKey))
	forms = append(forms, hex.EncodeToString(apiSum[:]), hex.EncodeToString(apiSum[:6]))

	rv := newOpReceiver(t, nil)
	defer rv.Close()
	hookURL := strings.Replace(rv.URL, "http://", "http://hook:"+hookPass+"@", 1) + "/in?token=" + hookToken
	hooks := fmt.Sprintf(`"webhooks":[{"url":%q,"secret":%q}]`, hookURL, hookKey)
	// Shared state behind a password, and client quotas keyed by an API
	// key: neither may show anywhere either.
	rs := testredis.Start(t, "--requirepass", redisPass)
	hooks += fmt.Sprintf(`,"state":{"redis":{"address":%q,"password":"{env.AUDIT_REDIS_PASSWORD}","key_prefix":"audit:"},"node":"audit"}`, rs.Addr())
	hooks += `,"client_limit":{"key":"{http.request.header.X-Api-Key}","limit":50}`

	var mu sync.Mutex
	var outputs bytes.Buffer // everything the process said, tagged
	record := func(where string, b []byte) {
		mu.Lock()
		fmt.Fprintf(&outputs, "\n=== %s\n", where)
		outputs.Write(b)
		mu.Unlock()
	}
	bodies := 0
	delivered := map[string]bool{}
	opCapturedMu.Lock()
	opCaptured = nil
	opCapturedMu.Unlock()

	scrape := func(g *testgw.Gateway) {
		if code, b := opAdminQuiet(g, "/browser_failover/status"); code == http.StatusOK {
			record("status", b)
		}
		if code, b := opAdminQuiet(g, "/browser_failover/sessions"); code == http.StatusOK {
			record("sessions", b)
		}
		if code, b := opAdminQuiet(g, "/metrics"); code == http.StatusOK {
			record("metrics", b)
		}
		for _, p := range []string{"/dash/", "/dash/status.json", "/dash/sessions.json"} {
			if resp, err := http.Get(g.HTTP(p)); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				record("dashboard "+p, b)
			}
		}
	}
	// au-2 creates its browsers over a session API.
	var au2Addr atomic.Value
	rest := fakes.NewREST(func(string) string { return "ws://" + au2Addr.Load().(string) + "/session" })
	defer rest.Close()
	rest.OnCreate = func(_ http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("X-Rest-Key") == restKey {
			mu.Lock()
			delivered[restKey] = true
			mu.Unlock()
		}
		return false
	}
	d := soakDuration(t, 4*time.Second, 3*time.Second)
	if d > 10*time.Second {
		d = 10 * time.Second // SOAK_DURATION is for TestSoak
	}
	g, st := runSoak(t, soakOpts{
		prefix:   "au-",
		fdSlack:  16, // the Redis connection pool of the shared state
		duration: d,
		workers:  8,
		providerURL: func(i int, addr string) string {
			u := url.URL{Scheme: "ws", Host: addr, Path: "/session"}
			switch i {
			case 0:
				u.User = url.UserPassword(user, pass)
				u.RawQuery = url.Values{"apiKey": {query}, "region": {"eu"}}.Encode()
			case 1:
				return u.String() + "?token={env.AUDIT_QUERY_SECRET}"
			case 2:
				au2Addr.Store(addr)
				return rest.URL()
			case 3:
				u.User = url.User(user)
				u.RawQuery = "key=" + url.QueryEscape(query)
			}
			return u.String()
		},
		providerExtra: func(i int) string {
			switch i {
			case 1:
				return `"headers_up":[{"op":"set","field":"X-Api-Key","value":"{env.AUDIT_HEADER_SECRET}"}]`
			case 2:
				return `"headers_up":[{"op":"set","field":"Authorization","value":"Bearer ` + bearer + `"},{"op":"add","field":"X-Api-Key","value":"` + header + `"}],` +
					`"session_api":{"create_method":"POST","create_url":"/v1/sessions","headers":[{"field":"X-Rest-Key","value":"{env.AUDIT_REST_KEY}"}],` +
					`"body":"{\"projectId\":\"` + restBody + `\"}","connect_url":"/connectUrl","session_id":"/id",` +
					`"release_method":"POST","release_url":"/v1/sessions/{session_id}/release","release_body":"{\"secret\":\"` + restBody + `\"}"}`
			}
			return ""
		},
		handlerExtra: hooks,
		wrap: func(g *testgw.Gateway, h string) []byte {
			var cfg map[string]any
			if err := json.Unmarshal(g.Config(h), &cfg); err != nil {
				t.Fatal(err)
			}
			// The dashboard beside the gateway, with its controls.
			srv := cfg["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["gw"].(map[string]any)
			srv["routes"] = append([]any{map[string]any{
				"match":  []any{map[string]any{"path": []string{"/dash/*"}}},
				"handle": []any{map[string]any{"handler": "browser_failover_dashboard", "controls": true}},
			}}, srv["routes"].([]any)...)
			cfg["apps"].(map[string]any)["events"] = map[string]any{"subscriptions": []any{map[string]any{
				"events":   []string{"browser_failover.cooldown", "browser_failover.recovered", "browser_failover.rejected"},
				"handlers": []any{map[string]any{"handler": "op_capture"}},
			}}}
			b, _ := json.Marshal(cfg)
			return b
		},
		onBody: func(status int, body []byte) {
			record(fmt.Sprintf("answer %d", status), body)
			mu.Lock()
			bodies++
			mu.Unlock()
		},
		onTick: scrape,
		onProviderRequest: func(r *http.Request) {
			// What the providers got: the secrets were in use, and the
			// client's own credentials for the gateway stayed there.
			for k, vs := range r.Header {
				for _, v := range vs {
					for _, s := range []string{apiKey, gwToken, gwCookie, gwBearer} {
						if strings.Contains(v, s) {
							t.Errorf("a provider got the client's %s: %q", k, v)
						}
					}
				}
			}
			mu.Lock()
			got := r.Header.Get("Authorization") + " " + strings.Join(r.Header.Values("X-Api-Key"), ",") + " " + r.URL.RawQuery
			for _, s := range []string{query, envQuery, header, bearer} {
				if strings.Contains(got, s) || strings.Contains(got, url.QueryEscape(s)) {
					delivered[s] = true
				}
			}
			if u, p, ok := r.BasicAuth(); ok && u == user && p == pass {
				delivered[pass] = true
			}
			mu.Unlock()
		},
	})
	st.log(t, "audit soak", d)

	// One session on each provider for sure (chaos may have skipped
	// some), through the operator actions, whose answers are outputs too.
	names := []string{"au-0", "au-1", "au-2", "au-3"}
	admin := func(name, action string) {
		code, body := opAdmin(t, g, http.MethodPost, "/browser_failover/providers/"+name+"/"+action)
		if code != http.StatusOK {
			t.Fatalf("%s %s: %d %s", action, name, code, body)
		}
		record("admin "+action, body)
	}
	for _, n := range names {
		admin(n, "reset")
	}
	for _, only := range names {
		for _, n := range names {
			if n != only {
				admin(n, "drain")
			}
		}
		c, _, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatalf("session on %s: %v", only, err)
		}
		echoOnce(t, c, []byte(only))
		c.Close(websocket.StatusNormalClosure, "")
		for _, n := range names {
			if n != only {
				admin(n, "undrain")
			}
		}
	}
	// Sessions under a client key, shown in status while they live.
	var keyed []*websocket.Conn
	for range 2 {
		c, _, err := dial(t, g.WS("/"), &websocket.DialOptions{HTTPHeader: http.Header{
			"X-Api-Key":       {apiKey},
			"X-Gateway-Token": {gwToken},
			"Cookie":          {"session=" + gwCookie},
			"Authorization":   {"Bearer " + gwBearer},
		}})
		if err != nil {
			t.Fatalf("keyed session: %v", err)
		}
		keyed = append(keyed, c)
	}
	code, stBody := opAdmin(t, g, http.MethodGet, "/browser_failover/status")
	if code != http.StatusOK || !bytes.Contains(stBody, []byte(pool.Current().Hashes.ShownKey(apiKey))) || !bytes.Contains(stBody, []byte(`"cluster"`)) {
		t.Fatalf("status without the hashed client key or the cluster: %s", stBody)
	}
	// The shown key is keyed with the deployment's secret kept in Caddy's
	// storage, which itself shows nowhere.
	stored, err := os.ReadFile(filepath.Join(g.Storage, "browser_failover", "client_key_secret"))
	if err != nil {
		t.Fatalf("the client key secret is not in the storage: %v", err)
	}
	keySecret, err := hex.DecodeString(string(stored))
	if err != nil || len(keySecret) < 16 {
		t.Fatalf("stored client key secret %q: %v", stored, err)
	}
	m := hmac.New(sha256.New, keySecret)
	m.Write([]byte(apiKey))
	if want := "hmac:" + hex.EncodeToString(m.Sum(nil)[:8]); pool.Current().Hashes.ShownKey(apiKey) != want {
		t.Fatalf("shown key %s, want the HMAC with the stored secret %s", pool.Current().Hashes.ShownKey(apiKey), want)
	}
	forms = append(forms, secretForms(string(stored), string(keySecret))...)
	record("status with client keys", stBody)
	code, ssBody := opAdmin(t, g, http.MethodGet, "/browser_failover/sessions")
	if code != http.StatusOK || !bytes.Contains(ssBody, []byte(pool.Current().Hashes.ShownKey(apiKey))) {
		t.Fatalf("sessions list without the hashed client key: %s", ssBody)
	}
	record("sessions with client keys", ssBody)
	// The ledger of created sessions, in Redis under state redis: node,
	// provider, session IDs and times, never a credential.
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr(), Password: redisPass})
	lkeys, err := rdb.Keys(context.Background(), "audit:{ledger}:*").Result()
	if err != nil || len(lkeys) == 0 {
		t.Fatalf("no ledger key in Redis: %v %v", lkeys, err)
	}
	for _, k := range lkeys {
		v, _ := rdb.Get(context.Background(), k).Result()
		record("ledger key "+k, []byte(k+" = "+v))
	}
	rdb.Close()
	scrape(g)
	// Ending them answers their objects: once from the admin API, once
	// from the dashboard.
	var live struct {
		Sessions []struct {
			ID     string `json:"id"`
			Client string `json:"client"`
		} `json:"sessions"`
	}
	json.Unmarshal(ssBody, &live)
	var ends []string
	for _, s := range live.Sessions {
		if s.Client == pool.Current().Hashes.ShownKey(apiKey) {
			ends = append(ends, s.ID)
		}
	}
	if len(ends) != 2 {
		t.Fatalf("%d keyed sessions listed, want 2: %s", len(ends), ssBody)
	}
	code, endBody := opAdmin(t, g, http.MethodDelete, "/browser_failover/sessions/"+ends[0])
	if code != http.StatusOK {
		t.Fatalf("DELETE: %d %s", code, endBody)
	}
	record("admin end session", endBody)
	req, _ := http.NewRequest(http.MethodPost, g.HTTP("/dash/sessions/"+ends[1]+"/end"), nil)
	req.Header.Set("X-Browser-Failover-Dashboard", "1")
	dresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	endBody, _ = io.ReadAll(dresp.Body)
	dresp.Body.Close()
	if dresp.StatusCode != http.StatusOK {
		t.Fatalf("dashboard end: %d %s", dresp.StatusCode, endBody)
	}
	record("dashboard end session", endBody)
	for _, c := range keyed {
		c.CloseNow()
	}
	// Redis gone: what the gateway says about it is an output too.
	rs.Stop()
	if c, _, err := dial(t, g.WS("/"), nil); err == nil {
		c.CloseNow()
	}
	scrape(g)
	rs.Start()

	// And one rejection for sure: every provider drained.
	for _, n := range names {
		admin(n, "drain")
	}
	resp, err := http.DefaultClient.Do(upgradeRequest(t, g.HTTP("/?token=client-side")))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("all drained: %d %s", resp.StatusCode, body)
	}
	record("answer 503", body)
	for _, n := range names {
		admin(n, "undrain")
	}
	testgw.Eventually(t, 5*time.Second, "sessions to end", func() bool { return pool.Current().Sessions.Count() == 0 })
	testgw.Eventually(t, 5*time.Second, "the rejection's webhook", func() bool {
		bs, _ := rv.got()
		return len(bs) > 0 && bytes.Contains(bs[len(bs)-1], []byte("browser_failover.rejected"))
	})
	scrape(g)

	hooked, hookHeaders := rv.got()
	for i, b := range hooked {
		record("webhook body", b)
		// The gateway's own headers (the receiver's credentials from
		// the webhook URL rightly go to it as Authorization).
		own := http.Header{}
		for k, v := range hookHeaders[i] {
			if strings.HasPrefix(k, "X-Browser-Failover-") {
				own[k] = v
			}
		}
		if own.Get("X-Browser-Failover-Timestamp") == "" || own.Get("X-Browser-Failover-Signature") == "" {
			t.Errorf("webhook delivery without timestamp or signature: %v", own)
		}
		hb, _ := json.Marshal(own)
		record("webhook headers", hb)
	}
	events := opEvents("au-")
	for _, e := range events {
		b, _ := json.Marshal(map[string]any{"name": e.Name(), "data": e.Data})
		record("event", b)
	}
	logs := g.Logs()
	record("logs", []byte(logs))

	// The audit searched something.
	if bodies == 0 || len(hooked) == 0 || len(events) == 0 || len(g.LogEntries("session ended")) == 0 || len(g.LogEntries("rejected")) == 0 {
		t.Fatalf("too little output to audit: %d answer bodies, %d webhook bodies, %d events, logs %d bytes",
			bodies, len(hooked), len(events), len(logs))
	}
	waitReleased(t, rest, "au-2")
	for _, b := range rest.CreateBodies() {
		if !bytes.Contains(b, []byte(restBody)) {
			t.Fatalf("a create body without its secret: %s", b)
		}
	}
	mu.Lock()
	for _, s := range []string{pass, query, envQuery, header, bearer, restKey} {
		if !delivered[s] {
			t.Errorf("no provider ever got the secret %q: the audit would prove nothing", s)
		}
	}
	out := outputs.String()
	mu.Unlock()
	if !strings.Contains(out, "=== dashboard /dash/\n<!DOCTYPE html>") || !strings.Contains(out, "=== dashboard /dash/status.json\n{\"providers\":[{") {
		t.Fatal("the audit did not read the dashboard's page and JSON")
	}
	if !strings.Contains(out, "REDACTED@") || !strings.Contains(out, "apiKey=REDACTED") || !strings.Contains(out, "token=REDACTED") {
		t.Fatal("the status does not show the redacted URLs")
	}
	findSecrets(t, out, forms)
	t.Logf("audited %d bytes of output: %d answer bodies, %d webhook bodies, %d events, %d log bytes, %d secret forms",
		len(out), bodies, len(hooked), len(events), len(logs), len(forms))
}

// secretForms lists every form each secret could take on the way out: as
// it is, URL-escaped (query and path), as URL user info, and in base64.
func secretForms(secrets ...string) []string {
	var forms []string
	for _, s := range secrets {
		for _, f := range []string{s, url.QueryEscape(s), url.PathEscape(s), (&url.URL{User: url.User(s)}).String()[2:]} {
			forms = append(forms, strings.TrimSuffix(f, "@"))
		}
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
			forms = append(forms, enc.EncodeToString([]byte(s)))
		}
	}
	return forms
}

// findSecrets reports each secret form found in out, with the section
// ("=== name" lines) it is in.
func findSecrets(t *testing.T, out string, forms []string) {
	t.Helper()
	for _, f := range forms {
		if len(f) < 6 {
			continue
		}
		if i := strings.Index(out, f); i >= 0 {
			section := out[:i]
			section = section[strings.LastIndex(section, "\n=== ")+5:]
			section = section[:strings.IndexByte(section, '\n')]
			t.Errorf("%s shows a secret (%q): …%s…", section, f, out[max(0, i-150):min(len(out), i+80)])
		}
	}
}

// TestProbeSecretsAudit: health checks carry the providers' credentials
// (URL user info and query, header_up values, a token in a full-URL uri)
// to the providers, and show none of them: not in the logs (debug level:
// the probe targets and the causes of failed probes), the status
// (last_probe, capacity, last_error), /metrics, or the events of the
// cooldowns and recoveries the probes cause.
func TestProbeSecretsAudit(t *testing.T) {
	const (
		user     = "pRoBeUsEr7"
		pass     = "pR0be:pa55/Z!"
		query    = "pRoBeQuErY-9x"
		header   = "pRoBeHeAdEr-4k"
		uriToken = "pRoBeUrItOk-2q"
		blToken  = "pRoBeBlToKeN-8w"
	)
	t.Setenv("PROBE_AUDIT_HEADER", header)
	forms := secretForms(user, pass, query, header, uriToken, blToken, user+":"+pass, url.UserPassword(user, pass).String())

	var mu sync.Mutex
	delivered := map[string]bool{}
	var failing atomic.Bool
	failing.Store(true)
	serve := func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got := r.Header.Get("X-Api-Key") + " " + r.URL.RawQuery
		for _, s := range []string{query, header, uriToken, blToken} {
			if strings.Contains(got, s) {
				delivered[s] = true
			}
		}
		if u, p, ok := r.BasicAuth(); ok && u == user && p == pass {
			delivered[pass] = true
		}
		mu.Unlock()
		if failing.Load() {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if r.URL.Path == "/pressure" {
			fmt.Fprint(w, `{"pressure":{"running":1,"maxConcurrent":2,"queued":0,"isAvailable":true}}`)
			return
		}
		fmt.Fprint(w, `{"Browser":"x"}`)
	}
	srv := httptest.NewServer(http.HandlerFunc(serve))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	status := httptest.NewServer(http.HandlerFunc(serve))
	defer status.Close()

	u1 := (&url.URL{Scheme: "ws", Host: host, Path: "/a", User: url.UserPassword(user, pass), RawQuery: "key=" + url.QueryEscape(query)}).String()
	hjson := handler(`"health_check":{"interval":"100ms"},"cooldown":{"min_requests":2,"duration":"300ms","max_duration":"300ms"}`,
		provider("pa-creds", u1, `"health_check":{"uri":"/health"},"headers_up":[{"op":"set","field":"X-Api-Key","value":"{env.PROBE_AUDIT_HEADER}"}]`),
		provider("pa-uri", "wss://connect.example.invalid/?apiKey=x", `"health_check":{"uri":"`+status.URL+`/up?token=`+uriToken+`"}`),
		provider("pa-bl", "ws://"+host+"/?token="+blToken, `"health_check":{"capacity":"browserless"}`))
	g := testgw.Start(t, handler("", provider("pa-boot", "ws://"+host+"/", "")))
	var cfg map[string]any
	if err := json.Unmarshal(g.Config(hjson), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["apps"].(map[string]any)["events"] = map[string]any{"subscriptions": []any{map[string]any{
		"events":   []string{"browser_failover.cooldown", "browser_failover.recovered"},
		"handlers": []any{map[string]any{"handler": "op_capture"}},
	}}}
	b, _ := json.Marshal(cfg)
	if err := g.Load(b); err != nil {
		t.Fatal(err)
	}
	var outputs bytes.Buffer
	record := func(where string, b []byte) {
		fmt.Fprintf(&outputs, "\n=== %s\n", where)
		outputs.Write(b)
	}
	// Failing probes: cooldowns, last errors, their events.
	testgw.Eventually(t, 10*time.Second, "every provider to cool down", func() bool {
		for _, n := range []string{"pa-creds", "pa-uri", "pa-bl"} {
			if state(t, n).Health.Snapshot().Cooldowns == 0 {
				return false
			}
		}
		return true
	})
	_, body := opAdmin(t, g, http.MethodGet, "/browser_failover/status")
	record("status while failing", body)
	// Passing probes: recoveries, capacity.
	failing.Store(false)
	testgw.Eventually(t, 10*time.Second, "every provider to recover", func() bool {
		for _, n := range []string{"pa-creds", "pa-uri", "pa-bl"} {
			if !state(t, n).Health.Available() {
				return false
			}
		}
		return true
	})
	_, body = opAdmin(t, g, http.MethodGet, "/browser_failover/status")
	record("status", body)
	if !bytes.Contains(body, []byte(`"last_probe":{`)) || !bytes.Contains(body, []byte(`"capacity":{`)) {
		t.Fatalf("the status shows no probe or capacity: %s", body)
	}
	_, body = opAdmin(t, g, http.MethodGet, "/metrics")
	record("metrics", body)
	for _, e := range opEvents("pa-") {
		b, _ := json.Marshal(map[string]any{"name": e.Name(), "data": e.Data})
		record("event", b)
	}
	logs := g.Logs()
	record("logs", []byte(logs))
	if len(g.LogEntries("probe")) == 0 || len(g.LogEntries("health check")) == 0 || len(g.LogEntries("provider cooling down")) == 0 {
		t.Fatal("too little to audit: no probe, health check or cooldown log entries")
	}
	mu.Lock()
	for _, s := range []string{pass, query, header, uriToken, blToken} {
		if !delivered[s] {
			t.Errorf("no probe carried the secret %q: the audit would prove nothing", s)
		}
	}
	mu.Unlock()
	findSecrets(t, outputs.String(), forms)
}

// opAdminQuiet is opAdmin for goroutines other than the test's.
func opAdminQuiet(g *testgw.Gateway, path string) (int, []byte) {
	code, b, err := g.AdminDo(http.MethodGet, path, nil)
	if err != nil {
		return 0, nil
	}
	return code, b
}
