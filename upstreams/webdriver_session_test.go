package upstreams

// WebDriver's provider side against a fake server: how each create
// answer is classified, what the create carries, the answer rewritten for
// the client, socket URL rules, and the end of sessions (DELETE once,
// ledger).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/ledger"
)

const chromeCreate = `{"capabilities":{"alwaysMatch":{"browserName":"chrome","webSocketUrl":true}}}`

// withSecrets gives the provider a hub's user and key in its URL, a
// header_up API key and a capability holding the key.
func withSecrets(c *Config) {
	u, _ := url.Parse(c.URL)
	u.User = url.UserPassword("hubuser", wdTestSecret)
	c.URL = u.String()
	c.HeadersUp = []HeaderOp{{Op: "set", Field: "X-Api-Key", Value: "api-" + wdTestSecret}}
	c.Capabilities = json.RawMessage(`{"cloud:options":{"accessKey":"` + wdTestSecret + `"}}`)
}

// noSecret fails when text holds any of the provider's secrets.
func noSecret(t *testing.T, what, text string) {
	t.Helper()
	for _, s := range []string{wdTestSecret, "hubuser:", base64Basic("hubuser", wdTestSecret)} {
		if strings.Contains(text, s) {
			t.Fatalf("%s shows a secret: %s", what, text)
		}
	}
}

func base64Basic(u, p string) string {
	r := http.Request{Header: http.Header{}}
	r.SetBasicAuth(u, p)
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Basic ")
}

func TestCreateWebDriverClassification(t *testing.T) {
	type answer struct {
		status int
		header http.Header
		body   string
	}
	wdErr := func(code, msg string) string {
		b, _ := json.Marshal(map[string]any{"value": map[string]string{"error": code, "message": msg, "stacktrace": ""}})
		return string(b)
	}
	notCreated := func(msg string) answer { return answer{500, nil, wdErr("session not created", msg)} }
	for _, tc := range []struct {
		name       string
		ans        answer
		word       string
		kind       Kind
		retryAfter time.Duration
	}{
		{"grid max sessions", notCreated("Could not start a new session. Max sessions reached"), WordFull, Capacity, 0},
		{"maximum number of active sessions", notCreated("Maximum number of active sessions reached (4)"), WordFull, Capacity, 0},
		{"no free slots", notCreated("NO FREE SLOTS on any node"), WordFull, Capacity, 0},
		{"capacity", notCreated("Out of Capacity, try later"), WordFull, Capacity, 0},
		{"queue", notCreated("New session request timed out in the Queue"), WordFull, Capacity, 0},
		{"other session not created", notCreated("Chrome failed to start: exited abnormally"), WordNotCreated, Declined, 0},
		{"no matching capabilities", notCreated("session not created: No matching capabilities found"), WordNotCreated, Declined, 0},
		{"unknown error", answer{500, nil, wdErr("unknown error", "max sessions")}, StatusWord(500), Failure, 0},
		{"502", answer{502, nil, "bad gateway"}, StatusWord(502), Failure, 0},
		{"503 not created full", answer{503, nil, wdErr("session not created", "no free slots")}, WordFull, Capacity, 0},
		{"401", answer{401, nil, wdErr("unknown error", "bad key")}, StatusWord(401), Failure, 0},
		{"403", answer{403, nil, ""}, StatusWord(403), Failure, 0},
		{"429 Retry-After", answer{429, http.Header{"Retry-After": {"7"}}, ""}, StatusWord(429), Capacity, 7 * time.Second},
		{"408", answer{408, nil, ""}, StatusWord(408), Capacity, 0},
		{"302", answer{302, http.Header{"Location": {"http://elsewhere.example/session"}}, ""}, StatusWord(302), Failure, 0},
		{"invalid argument", answer{400, http.Header{"Content-Type": {"application/json; charset=utf-8"}}, wdErr("invalid argument", "unknown capability foo")}, StatusWord(400), Relay, 0},
		{"404", answer{404, http.Header{"Content-Type": {"text/plain"}}, "no such route"}, StatusWord(404), Relay, 0},
		{"428 relayed", answer{428, nil, "x"}, StatusWord(428), Relay, 0},
		{"200 without an ID", answer{200, nil, `{"value":{"capabilities":{}}}`}, WordBadCreate, Failure, 0},
		{"200 with a numeric ID", answer{200, nil, `{"value":{"sessionId":12}}`}, WordBadCreate, Failure, 0},
		{"200 not JSON", answer{200, nil, `<html>`}, WordBadCreate, Failure, 0},
		{"200 dot-dot ID", answer{200, nil, `{"value":{"sessionId":".."}}`}, WordBadSessionID, Failure, 0},
		{"200 legacy answer", answer{200, nil, `{"sessionId":"legacy-1","status":0,"value":{"browserName":"chrome"}}`}, WordBadCreate, Failure, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := fakes.NewWebDriver("/wd/hub")
			defer f.Close()
			f.OnCreate = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
				for k, v := range tc.ans.header {
					w.Header()[k] = v
				}
				w.WriteHeader(tc.ans.status)
				fmt.Fprint(w, tc.ans.body)
				return true
			}
			p, rel := wdProvider(t, f.URL(), withSecrets)
			res := p.CreateWebDriver(context.Background(), mustCreateRequest(t, chromeCreate), nil)
			o := res.Outcome
			if o.Word != tc.word || o.Kind != tc.kind || o.RetryAfter != tc.retryAfter {
				t.Fatalf("outcome %s %s %v (%v), want %s %s %v", o.Word, o.Kind, o.RetryAfter, o.Err, tc.word, tc.kind, tc.retryAfter)
			}
			wantRefused := 0 // a 4xx started nothing
			if tc.ans.status/100 == 4 {
				wantRefused = tc.ans.status
			}
			if o.Refused != wantRefused {
				t.Fatalf("refused %d after a %d, want %d", o.Refused, tc.ans.status, wantRefused)
			}
			if o.Err == nil {
				t.Fatal("no cause")
			}
			noSecret(t, "the cause", o.Err.Error())
			if strings.Contains(o.Err.Error(), f.Addr) {
				t.Fatalf("the cause names the URL: %v", o.Err)
			}
			if res.WebDriver != nil {
				t.Fatal("a session")
			}
			if tc.kind == Relay || tc.kind == Declined {
				if res.Answer == nil || res.Answer.Status != tc.ans.status || string(res.Body) != tc.ans.body {
					t.Fatalf("relayed %+v %q", res.Answer, res.Body)
				}
				if ct := tc.ans.header.Get("Content-Type"); ct != "" && res.Answer.Header.Get("Content-Type") != ct {
					t.Fatalf("Content-Type %q, want %q", res.Answer.Header.Get("Content-Type"), ct)
				}
			}
			if !rel.Wait(time.Now().Add(10 * time.Second)) {
				t.Fatal("releases pending")
			}
			b := p.Books()
			switch tc.name {
			case "200 legacy answer":
				// The session it names is deleted all the same.
				if f.Deleted("legacy-1") != 1 || b.Created.Load() != 1 || b.Unreleased() != 0 {
					t.Fatalf("legacy session: deleted %d, books %d/%d", f.Deleted("legacy-1"), b.Created.Load(), b.Released.Load())
				}
			case "200 with a numeric ID":
				if f.Deleted("12") != 1 {
					t.Fatal("the numeric ID was not deleted")
				}
			case "200 without an ID", "200 not JSON", "200 dot-dot ID":
				if b.Orphans.Load() != 1 || b.Created.Load() != 0 {
					t.Fatalf("orphans %d created %d", b.Orphans.Load(), b.Created.Load())
				}
				for _, r := range f.Requests() {
					if r.Method == http.MethodDelete {
						t.Fatalf("a DELETE %s", r.URI)
					}
				}
			default:
				if b.Created.Load() != 0 || b.Orphans.Load() != 0 {
					t.Fatalf("books %d created, %d orphans", b.Created.Load(), b.Orphans.Load())
				}
			}
		})
	}
}

func TestCreateWebDriverTransportErrors(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		dead := fakes.Refused("dead")
		p, _ := wdProvider(t, "http://"+dead.Addr, withSecrets)
		o := p.CreateWebDriver(context.Background(), mustCreateRequest(t, chromeCreate), nil).Outcome
		if o.Word != WordRefused || o.Kind != Failure {
			t.Fatalf("outcome %s %s %v", o.Word, o.Kind, o.Err)
		}
		noSecret(t, "the cause", o.Err.Error())
	})
	t.Run("timeout", func(t *testing.T) {
		f := fakes.NewWebDriver("")
		defer f.Close()
		release := make(chan struct{})
		defer close(release)
		f.OnCreate = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
			<-release
			return false
		}
		p, _ := wdProvider(t, f.URL(), func(c *Config) { c.ConnectTimeout = caddy.Duration(200 * time.Millisecond) })
		o := p.CreateWebDriver(context.Background(), mustCreateRequest(t, chromeCreate), nil).Outcome
		if o.Word != WordTimeout || o.Kind != Failure {
			t.Fatalf("outcome %s %s %v", o.Word, o.Kind, o.Err)
		}
	})
	t.Run("reset", func(t *testing.T) {
		f := fakes.NewWebDriver("")
		defer f.Close()
		f.OnCreate = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
			c, _, _ := w.(http.Hijacker).Hijack()
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0)
			}
			c.Close()
			return true
		}
		p, _ := wdProvider(t, f.URL())
		o := p.CreateWebDriver(context.Background(), mustCreateRequest(t, chromeCreate), nil).Outcome
		if o.Word != WordReset || o.Kind != Failure {
			t.Fatalf("outcome %s %s %v", o.Word, o.Kind, o.Err)
		}
	})
	t.Run("tls", func(t *testing.T) {
		rest := fakes.NewRESTTLS(func(string) string { return "" }) // a certificate nobody trusts
		defer rest.Close()
		p, _ := wdProvider(t, rest.URL(), withSecrets)
		o := p.CreateWebDriver(context.Background(), mustCreateRequest(t, chromeCreate), nil).Outcome
		if o.Word != WordTLS || o.Kind != Failure {
			t.Fatalf("outcome %s %s %v", o.Word, o.Kind, o.Err)
		}
		noSecret(t, "the cause", o.Err.Error())
	})
}

// TestCreateWebDriverClientGone: a client that leaves mid-create ends the
// attempt at once as ClientGone; the session the provider creates later
// is still deleted, and a process exit waits for that.
func TestCreateWebDriverClientGone(t *testing.T) {
	f := fakes.NewWebDriver("")
	defer f.Close()
	entered, release := make(chan struct{}), make(chan struct{})
	f.OnCreate = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		close(entered)
		<-release
		return false // the fake creates it now
	}
	p, rel := wdProvider(t, f.URL())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan Result, 1)
	go func() { done <- p.CreateWebDriver(ctx, mustCreateRequest(t, chromeCreate), nil) }()
	<-entered
	cancel()
	res := <-done
	if res.Outcome.Kind != ClientGone || res.Outcome.Word != WordClientGone {
		t.Fatalf("outcome %+v", res.Outcome)
	}
	if rel.Pending() != 1 {
		t.Fatalf("pending %d: the create in flight must count", rel.Pending())
	}
	close(release)
	if !rel.Wait(time.Now().Add(10 * time.Second)) {
		t.Fatal("still pending")
	}
	if live := f.Live(); len(live) != 0 {
		t.Fatalf("sessions left at the provider: %v", live)
	}
	if b := p.Books(); b.Created.Load() != 1 || b.Unreleased() != 0 {
		t.Fatalf("books %d/%d", b.Created.Load(), b.Released.Load())
	}
}

func TestCreateWebDriverStopped(t *testing.T) {
	f := fakes.NewWebDriver("")
	defer f.Close()
	p, rel := wdProvider(t, f.URL())
	rel.StopCreates()
	res := p.CreateWebDriver(context.Background(), mustCreateRequest(t, chromeCreate), nil)
	if res.Outcome.Kind != ClientGone || !errors.Is(res.Outcome.Err, ErrCreatesStopped) || len(f.Requests()) != 0 {
		t.Fatalf("outcome %+v, %d requests", res.Outcome, len(f.Requests()))
	}
}

// TestCreateWebDriverSends: the create carries the client's
// capabilities with the provider's merged in, the provider's
// credentials, JSON; the session's commands and its DELETE carry the
// credentials too, header_up resolved at the create.
func TestCreateWebDriverSends(t *testing.T) {
	f := fakes.NewWebDriver("/wd/hub")
	defer f.Close()
	p, rel := wdProvider(t, f.URL()+"/", withSecrets, func(c *Config) {
		c.HeadersUp = append(c.HeadersUp, HeaderOp{Op: "set", Field: "X-Client", Value: "{http.request.header.X-Who}"})
		c.Capabilities = json.RawMessage(`{"cloud:options":{"accessKey":"` + wdTestSecret + `","user":"{http.request.header.X-Who}"}}`)
	})
	replace := func(s string) string { return strings.ReplaceAll(s, "{http.request.header.X-Who}", "carol") }
	r := mustCreateRequest(t, `{"capabilities":{"alwaysMatch":{"browserName":"chrome","bf:options":{"x":1}}}}`)
	res := p.CreateWebDriver(context.Background(), r, replace)
	if res.Outcome.Kind != Success || res.WebDriver == nil || res.Conn != nil {
		t.Fatalf("outcome %+v", res.Outcome)
	}
	s := res.WebDriver
	reqs := f.Requests()
	if len(reqs) != 1 {
		t.Fatalf("requests %v", reqs)
	}
	c := reqs[0]
	if c.Method != "POST" || c.URI != "/wd/hub/session" {
		t.Fatalf("create %s %s", c.Method, c.URI)
	}
	if ct := c.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("Content-Type %q", ct)
	}
	if got := c.Header.Get("Authorization"); got != "Basic "+base64Basic("hubuser", wdTestSecret) {
		t.Fatalf("Authorization %q", got)
	}
	if c.Header.Get("X-Api-Key") != "api-"+wdTestSecret || c.Header.Get("X-Client") != "carol" {
		t.Fatalf("header_up not applied: %v", c.Header)
	}
	want := `{"capabilities":{"alwaysMatch":{"browserName":"chrome","cloud:options":{"accessKey":"` + wdTestSecret + `","user":"carol"}}}}`
	if string(c.Body) != want {
		t.Fatalf("body %s\nwant %s", c.Body, want)
	}
	// A command, later, with no request at hand: the create's values.
	resp, err := p.WebDriverCommand(context.Background(), s, "GET", "/url", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cmd := f.Requests()[1]
	if cmd.Header.Get("Authorization") == "" || cmd.Header.Get("X-Client") != "carol" || cmd.Header.Get("X-Api-Key") == "" {
		t.Fatalf("command header %v", cmd.Header)
	}
	s.Remote.Release()
	s.Remote.Release()
	if !rel.Wait(time.Now().Add(10 * time.Second)) {
		t.Fatal("pending")
	}
	if f.Deleted(s.ID) != 1 {
		t.Fatalf("DELETE sent %d times", f.Deleted(s.ID))
	}
	del := f.Requests()[2]
	if del.Method != "DELETE" || del.URI != "/wd/hub/session/"+s.ID || del.Header.Get("Authorization") == "" || del.Header.Get("X-Client") != "carol" {
		t.Fatalf("DELETE %s %s %v", del.Method, del.URI, del.Header)
	}
	if b := p.Books(); b.Created.Load() != 1 || b.Released.Load() != 1 {
		t.Fatalf("books %d/%d", b.Created.Load(), b.Released.Load())
	}
}

// TestWebDriverAnswerRewrite: the client sees the gateway's ID and
// sockets, none of the provider's addresses, IDs or secrets.
func TestWebDriverAnswerRewrite(t *testing.T) {
	f := fakes.NewWebDriver("/wd/hub")
	defer f.Close()
	f.CDP = true
	f.OnCreate = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		// A Grid-like answer, echoing the key as some hubs do.
		id := "grid-3f6c2a90"
		f.Plant(id)
		host := "localhost:" + strings.Split(f.Addr, ":")[1]
		fmt.Fprintf(w, `{"value":{"sessionId":%q,"capabilities":{"browserName":"chrome","browserVersion":"120.0",
			"webSocketUrl":"ws://%s/session/%s","se:cdp":"ws://%s/session/%s/se/cdp","se:cdpVersion":"120.0",
			"se:vnc":"ws://%s/session/%s/se/vnc","goog:chromeOptions":{"debuggerAddress":"localhost:40123","x":1},
			"ms:edgeOptions":{"debuggerAddress":"localhost:40124"},"moz:debuggerAddress":"127.0.0.1:9222",
			"cloud:options":{"accessKey":%q},"echo":"key=%s","nodes":["http://%s/node",%q,"fine"],
			"timeouts":{"script":30000}}}}`,
			id, host, id, host, id, host, id, wdTestSecret, wdTestSecret, f.Addr, id)
		return true
	}
	p, _ := wdProvider(t, f.URL(), withSecrets)
	res := p.CreateWebDriver(context.Background(), mustCreateRequest(t, chromeCreate), nil)
	if res.Outcome.Kind != Success {
		t.Fatalf("outcome %+v", res.Outcome)
	}
	s := res.WebDriver
	defer s.Remote.Release()
	b, err := s.Answer("gw-42", "wss://gw.example.net:8443/wd/hub/")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Value struct {
			SessionID    string         `json:"sessionId"`
			Capabilities map[string]any `json:"capabilities"`
		} `json:"value"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	caps := doc.Value.Capabilities
	if doc.Value.SessionID != "gw-42" {
		t.Fatalf("sessionId %q", doc.Value.SessionID)
	}
	if caps["webSocketUrl"] != "wss://gw.example.net:8443/wd/hub/session/gw-42" || caps["se:cdp"] != "wss://gw.example.net:8443/wd/hub/session/gw-42/se/cdp" {
		t.Fatalf("sockets %v %v", caps["webSocketUrl"], caps["se:cdp"])
	}
	if caps["browserVersion"] != "120.0" || caps["se:cdpVersion"] != "120.0" || caps["timeouts"].(map[string]any)["script"] != 30000.0 {
		t.Fatalf("the rest changed: %s", b)
	}
	if o := caps["goog:chromeOptions"].(map[string]any); o["x"] != 1.0 || o["debuggerAddress"] != nil {
		t.Fatalf("goog:chromeOptions %v", o)
	}
	if nodes := caps["nodes"].([]any); len(nodes) != 1 || nodes[0] != "fine" {
		t.Fatalf("nodes %v", nodes)
	}
	text := string(b)
	port := strings.Split(f.Addr, ":")[1]
	for _, leak := range []string{s.ID, port, f.Addr, "localhost:", "debuggerAddress", "se:vnc", "cloud:options", "echo"} {
		if strings.Contains(text, leak) {
			t.Errorf("the answer holds %q: %s", leak, text)
		}
	}
	noSecret(t, "the answer", text)
	// The provider's own socket URLs, loopback kept at the configured host.
	if s.SocketURL() != "ws://127.0.0.1:"+port+"/session/"+s.ID || s.CDPURL() != "ws://127.0.0.1:"+port+"/session/"+s.ID+"/se/cdp" || s.SocketError() != nil {
		t.Fatalf("sockets %q %q %v", s.SocketURL(), s.CDPURL(), s.SocketError())
	}
	// Without sockets, none in the answer.
	res2 := func() Result {
		f.OnCreate, f.CDP = nil, false
		return p.CreateWebDriver(context.Background(), mustCreateRequest(t, `{"capabilities":{}}`), nil)
	}()
	defer res2.WebDriver.Remote.Release()
	b2, _ := res2.WebDriver.Answer("gw-43", "ws://gw:1")
	if strings.Contains(string(b2), "webSocketUrl") || strings.Contains(string(b2), "se:cdp") || !strings.Contains(string(b2), `"sessionId":"gw-43"`) {
		t.Fatalf("answer %s", b2)
	}
}

// TestWebDriverSocketURLRules: a loopback or unspecified host is the
// configured one; another host must be the provider's or under its
// domain; ws or wss only, wss after https.
func TestWebDriverSocketURLRules(t *testing.T) {
	grid, _ := wdProvider(t, "http://grid.example.com:4444/wd/hub")
	tlsGrid, _ := wdProvider(t, "https://hub.example.org/wd/hub")
	v6, _ := wdProvider(t, "http://[2001:db8::1]:4444")
	for _, tc := range []struct {
		p        *Provider
		in, want string // want "": refused
	}{
		{grid, "ws://localhost:4444/session/a", "ws://grid.example.com:4444/session/a"},
		{grid, "ws://LOCALHOST:4444/session/a", "ws://grid.example.com:4444/session/a"},
		{grid, "ws://127.0.0.1:4444/session/a", "ws://grid.example.com:4444/session/a"},
		{grid, "ws://127.8.9.10:5555/session/a?x=1", "ws://grid.example.com:5555/session/a?x=1"},
		{grid, "ws://[::1]:4444/session/a", "ws://grid.example.com:4444/session/a"},
		{grid, "ws://0.0.0.0:4444/session/a", "ws://grid.example.com:4444/session/a"},
		{grid, "ws://[::]:4444/session/a", "ws://grid.example.com:4444/session/a"},
		{grid, "ws://[::ffff:127.0.0.1]:4444/session/a", "ws://grid.example.com:4444/session/a"},
		{grid, "ws://localhost/session/a", "ws://grid.example.com/session/a"},
		{grid, "WS://grid.example.com:4444/session/a", "ws://grid.example.com:4444/session/a"},
		{grid, "ws://node-7.example.com:5555/session/a", "ws://node-7.example.com:5555/session/a"},
		{grid, "ws://user:pw@grid.example.com:4444/session/a#frag", "ws://grid.example.com:4444/session/a"},
		{grid, "ws://evil.example.net:4444/session/a", ""},
		{grid, "ws://10.0.0.7:4444/session/a", ""},
		{grid, "http://grid.example.com:4444/session/a", ""},
		{grid, "/session/a", ""},
		{tlsGrid, "wss://localhost:443/session/a", "wss://hub.example.org:443/session/a"},
		{tlsGrid, "wss://hub.example.org/session/a", "wss://hub.example.org/session/a"},
		{tlsGrid, "ws://hub.example.org/session/a", ""},
		{v6, "ws://localhost:4444/session/a", "ws://[2001:db8::1]:4444/session/a"},
		{v6, "ws://localhost/session/a", "ws://[2001:db8::1]/session/a"},
	} {
		s, err := tc.p.WebDriverSessionOf("a", tc.in, "")
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("%s: accepted as %q", tc.in, s.SocketURL())
		case tc.want == "":
			if !errors.Is(err, errSocketURL) || strings.Contains(err.Error(), "pw") {
				t.Errorf("%s: error %v", tc.in, err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.in, err)
		case s.SocketURL() != tc.want:
			t.Errorf("%s: %q, want %q", tc.in, s.SocketURL(), tc.want)
		}
	}
	// A session rebuilt from elsewhere: its ID checked, its URLs too, and
	// it has no end of its own nor an answer.
	if _, err := grid.WebDriverSessionOf("..", "", ""); err == nil {
		t.Error("a dot-dot ID")
	}
	if _, err := grid.WebDriverSessionOf("a", "", "ws://evil.example.net/session/a/se/cdp"); err == nil || !strings.Contains(err.Error(), "se:cdp") {
		t.Errorf("a foreign CDP host: %v", err)
	}
	s, err := grid.WebDriverSessionOf("a", "", "ws://localhost:4444/session/a/se/cdp")
	if err != nil || s.CDPURL() != "ws://grid.example.com:4444/session/a/se/cdp" || s.SocketURL() != "" || s.Remote != nil {
		t.Fatalf("%+v %v", s, err)
	}
	if _, err := s.Answer("g", "ws://gw"); err == nil {
		t.Error("an answer out of nothing")
	}
	s.Remote.Release() // nil: a no-op
	// A create answer with a refused socket: the session stands, the
	// socket is gone from the answer, and the error says why.
	f := fakes.NewWebDriver("")
	defer f.Close()
	f.SocketHost = "evil.example.net:9999"
	p, _ := wdProvider(t, f.URL())
	res := p.CreateWebDriver(context.Background(), mustCreateRequest(t, chromeCreate), nil)
	if res.Outcome.Kind != Success {
		t.Fatalf("outcome %+v", res.Outcome)
	}
	defer res.WebDriver.Remote.Release()
	if res.WebDriver.SocketURL() != "" || res.WebDriver.SocketError() == nil || !strings.Contains(res.WebDriver.SocketError().Error(), `"evil.example.net"`) {
		t.Fatalf("socket %q, error %v", res.WebDriver.SocketURL(), res.WebDriver.SocketError())
	}
	if b, _ := res.WebDriver.Answer("g", "ws://gw"); strings.Contains(string(b), "webSocketUrl") || strings.Contains(string(b), "evil") {
		t.Fatalf("answer %s", b)
	}
	sock := p.WebDriverSocket(context.Background(), testHandshake(), res.WebDriver, false, nil)
	if sock.Outcome.Word != WordBadConnectURL || !strings.Contains(sock.Outcome.Err.Error(), "evil.example.net") {
		t.Fatalf("socket attempt %+v", sock.Outcome)
	}
}

// countingLedger is the real ledger, counting its calls.
type countingLedger struct {
	*ledger.Ledger
	mu              sync.Mutex
	records, remove []string
}

func (c *countingLedger) Record(ctx context.Context, provider, id string) error {
	c.mu.Lock()
	c.records = append(c.records, provider+"/"+id)
	c.mu.Unlock()
	return c.Ledger.Record(ctx, provider, id)
}

func (c *countingLedger) Remove(ctx context.Context, provider, id string) error {
	c.mu.Lock()
	c.remove = append(c.remove, provider+"/"+id)
	c.mu.Unlock()
	return c.Ledger.Remove(ctx, provider, id)
}

// TestWebDriverLedger: a session is in the ledger from its create answer
// until its DELETE is confirmed (a 404 counts); a reaper's Adopt deletes
// one a gone process left.
func TestWebDriverLedger(t *testing.T) {
	f := fakes.NewWebDriver("/wd/hub")
	defer f.Close()
	rel := NewReleaser()
	rel.Sleep = func(time.Duration) {}
	l := &countingLedger{Ledger: ledger.New(&certmagic.FileStorage{Path: t.TempDir()}, "n1", nil)}
	rel.Ledger = l
	p, err := New(Config{Name: "wd", URL: f.URL(), Protocol: "webdriver"}, Defaults{Releaser: rel, Books: &Books{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res := p.CreateWebDriver(context.Background(), mustCreateRequest(t, chromeCreate), nil)
	if res.Outcome.Kind != Success {
		t.Fatalf("outcome %+v", res.Outcome)
	}
	s := res.WebDriver
	if n := l.Pending()["wd"]; n != 1 || len(l.records) != 1 || l.records[0] != "wd/"+s.ID {
		t.Fatalf("pending %d, records %v", n, l.records)
	}
	// The provider ended it already: its 404 counts as released.
	resp, err := p.WebDriverCommand(context.Background(), s, "DELETE", "", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	s.Remote.Release()
	if !rel.Wait(time.Now().Add(10 * time.Second)) {
		t.Fatal("pending")
	}
	if f.Deleted(s.ID) != 2 || len(l.remove) != 1 || l.Pending()["wd"] != 0 {
		t.Fatalf("deleted %d, removes %v, pending %v", f.Deleted(s.ID), l.remove, l.Pending())
	}
	if b := p.Books(); b.Released.Load() != 1 || b.ReleaseFailures.Load() != 0 {
		t.Fatalf("books released %d, failures %d", b.Released.Load(), b.ReleaseFailures.Load())
	}
	// The client's own DELETE, answered: confirmed without a second one.
	res = p.CreateWebDriver(context.Background(), mustCreateRequest(t, chromeCreate), nil)
	if res.Outcome.Kind != Success {
		t.Fatalf("outcome %+v", res.Outcome)
	}
	s2 := res.WebDriver
	resp, err = p.WebDriverCommand(context.Background(), s2, "DELETE", "", "", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("DELETE: %v %v", resp, err)
	}
	resp.Body.Close()
	s2.Remote.Confirmed()
	s2.Remote.Release()
	s2.Remote.Confirmed()
	if !rel.Wait(time.Now().Add(10 * time.Second)) {
		t.Fatal("pending")
	}
	if f.Deleted(s2.ID) != 1 || len(l.remove) != 2 || l.Pending()["wd"] != 0 || p.Books().Released.Load() != 2 {
		t.Fatalf("deleted %d, removes %v, pending %v, released %d", f.Deleted(s2.ID), l.remove, l.Pending(), p.Books().Released.Load())
	}
	// A session another process left behind.
	f.Plant("left-behind")
	reaped := make(chan string, 1)
	rel.OnReaped = func(provider, id, from string) { reaped <- provider + "/" + id + "/" + from }
	if !p.CreatesSessions() {
		t.Fatal("a webdriver provider creates sessions")
	}
	p.Adopt("left-behind", "n0", nil).Release()
	if got := <-reaped; got != "wd/left-behind/n0" {
		t.Fatalf("reaped %s", got)
	}
	if f.Deleted("left-behind") != 1 || p.Books().Reaped.Load() != 1 {
		t.Fatalf("adopted session: deleted %d", f.Deleted("left-behind"))
	}
}

// TestWebDriverLedgerFails: a session the ledger cannot name is deleted,
// and the attempt ends with kind Gateway.
func TestWebDriverLedgerFails(t *testing.T) {
	f := fakes.NewWebDriver("")
	defer f.Close()
	rel := NewReleaser()
	rel.Sleep = func(time.Duration) {}
	rel.Ledger = &orderedLedger{Ledger: ledger.New(&certmagic.FileStorage{Path: t.TempDir()}, "n1", nil), contacts: &fakes.Contacts{}, failing: true}
	p, err := New(Config{Name: "wd", URL: f.URL(), Protocol: "webdriver"}, Defaults{Releaser: rel}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res := p.CreateWebDriver(context.Background(), mustCreateRequest(t, chromeCreate), nil)
	if res.Outcome.Kind != Gateway || res.Outcome.Word != WordLedger || res.WebDriver != nil {
		t.Fatalf("outcome %+v", res.Outcome)
	}
	if !rel.Wait(time.Now().Add(10 * time.Second)) {
		t.Fatal("pending")
	}
	if live := f.Live(); len(live) != 0 {
		t.Fatalf("left at the provider: %v", live)
	}
}
