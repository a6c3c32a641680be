package upstreams

// What a create answer may make the gateway do: dial only hosts the
// provider's headers may go to, read answers up to MaxCreateAnswer and
// release (or count) the sessions of answers it cannot use, and keep a
// process exit waiting for creates still in flight.

import (
	"context"
	"errors"
	"github.com/caddyserver/caddy/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/internal/conf"
	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
)

const testAPIKey = "sk-live-answers-93c1f0"

// testRel releases the sessions of the providers restProvider makes.
var testRel = NewReleaser()

// restProvider is a provider whose session API is the fake f's, with an
// API key in header_up and in the session API headers.
func restProvider(t *testing.T, name string, f *fakes.REST, connectHosts ...string) *Provider {
	t.Helper()
	p, err := New(Config{
		Name: name, URL: f.URL(), ConnectTimeout: caddy.Duration(3 * time.Second),
		HeadersUp: []HeaderOp{{Op: "set", Field: "X-Api-Key", Value: testAPIKey}},
		SessionAPI: &SessionAPI{
			CreateMethod: "POST", CreateURL: "/v1/sessions",
			Headers:    []Header{{Field: "X-Api-Key", Value: testAPIKey}},
			ConnectURL: "/connectUrl", SessionID: "/id",
			ReleaseMethod: "POST", ReleaseURL: "/v1/sessions/{session_id}/release",
			ConnectHosts: connectHosts,
		},
	}, Defaults{Releaser: testRel}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func testHandshake() *Handshake { return &Handshake{Key: NewKey(), Header: http.Header{}} }

// settle waits until f's books balance with n sessions created, and until
// the releaser has nothing pending.
func settle(t *testing.T, f *fakes.REST, n int) {
	t.Helper()
	if !testRel.Wait(time.Now().Add(10 * time.Second)) {
		t.Fatalf("releases still pending: %d", testRel.Pending())
	}
	b := f.Books()
	if err := b.Balanced(); err != nil || len(b.Created) != n {
		t.Fatalf("books %+v: %v (want %d created, each released once)", b, err, n)
	}
}

// swapOrphanHook records testRel's OnOrphan calls for the test.
func swapOrphanHook(t *testing.T) func() []string {
	var mu sync.Mutex
	var got []string
	prev := testRel.OnOrphan
	testRel.OnOrphan = func(provider, cause string) {
		mu.Lock()
		got = append(got, provider+": "+cause)
		mu.Unlock()
	}
	t.Cleanup(func() { testRel.OnOrphan = prev })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
}

func TestConnectHostRule(t *testing.T) {
	cases := []struct {
		create string
		named  []string
		allow  []string
		refuse []string
	}{
		// Real providers answer a connect host under the create host's
		// registrable domain.
		{"api.browserbase.com", nil, []string{"connect.browserbase.com", "CONNECT.BrowserBase.com.", "api.browserbase.com", "browserbase.com", "a.b.browserbase.com"},
			[]string{"browserbase.com.evil.example", "evilbrowserbase.com", "connect.browserbase.net", "127.0.0.1", "localhost", ""}},
		{"api.steel.dev", nil, []string{"connect.steel.dev"}, []string{"connect.steel.app"}},
		{"api.hyperbrowser.ai", nil, []string{"connect.hyperbrowser.ai"}, []string{"hyperbrowser.ai.example.com"}},
		// Two-label public suffixes and private ones (github.io) are not a
		// shared domain.
		{"api.example.co.uk", nil, []string{"ws.example.co.uk"}, []string{"other.co.uk", "co.uk"}},
		{"alice.github.io", nil, []string{"alice.github.io"}, []string{"bob.github.io", "github.io"}},
		// IP addresses and single-label names match only themselves.
		{"127.0.0.1", nil, []string{"127.0.0.1"}, []string{"127.0.0.2", "localhost", "1.0.0.127"}},
		{"localhost", nil, []string{"localhost", "LOCALHOST"}, []string{"127.0.0.1", "a.localhost"}},
		{"::1", nil, []string{"::1", "0:0:0:0:0:0:0:1"}, []string{"::2"}},
		// connect_hosts: exact names (case-insensitive), IP addresses,
		// *.domain for the names under domain.
		{"api.provider.example", []string{"Browsers.Other.NET", "10.0.0.7", "*.cdn.example.org"},
			[]string{"browsers.other.net", "10.0.0.7", "eu.cdn.example.org", "a.eu.cdn.example.org", "x.provider.example"},
			[]string{"other.net", "x.other.net", "cdn.example.org", "xcdn.example.org", "10.0.0.8"}},
	}
	for _, tc := range cases {
		h := newHostRule(tc.create, tc.named)
		for _, a := range tc.allow {
			if !h.allows(a) {
				t.Errorf("create %s, connect_hosts %v: %q refused", tc.create, tc.named, a)
			}
		}
		for _, r := range tc.refuse {
			if h.allows(r) {
				t.Errorf("create %s, connect_hosts %v: %q allowed", tc.create, tc.named, r)
			}
		}
	}
}

func TestValidateConnectHost(t *testing.T) {
	for _, ok := range []string{"connect.example.com", "Connect.Example.COM", "localhost", "browsers.corp.internal",
		"*.example.com", "*.corp.internal", "*.localhost", "10.0.0.7", "::1", "[::1]", "xn--bcher-kva.example", "{env.CONNECT_HOST}", "a_b.example.com"} {
		if err := ValidateConnectHost(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for in, want := range map[string]string{
		"":                        "empty host",
		"wss://connect.example":   "is not a host name",
		"connect.example.com:443": "is not a host name",
		"connect.example.com/x":   "is not a host name",
		"*":                       "is not a host name",
		"*.*.example.com":         "is not a host name",
		"a.*.example.com":         "is not a host name",
		"-a.example.com":          "is not a host name",
		"bücher.example":          "punycode",
		"*.com":                   "public suffix com",
		"*.co.uk":                 "public suffix co.uk",
		"*.github.io":             "public suffix github.io",
	} {
		err := ValidateConnectHost(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
	// ValidateSessionAPI names the option.
	a := SessionAPI{CreateMethod: "POST", CreateURL: "/s", ConnectURL: "/u", SessionID: "/id",
		ReleaseMethod: "DELETE", ReleaseURL: "/s/{session_id}", ConnectHosts: []string{"ok.example.com", "bad host"}}
	var ap *conf.Problem
	if err := ValidateSessionAPI(a); !errors.As(err, &ap) || ap.Options[0] != "connect_hosts" || !strings.Contains(ap.Msg, `connect_hosts: "bad host"`) {
		t.Fatalf("%v (%+v)", err, ap)
	}
}

// TestConnectURLElsewhereRefused: a create answer whose connect URL points
// to another host (here localhost, while the create call went to
// 127.0.0.1) is not dialed with the provider's headers: bad_connect_url, a
// failure, and the session is released. The same host on another port is
// dialed, and connect_hosts opens the other host.
func TestConnectURLElsewhereRefused(t *testing.T) {
	echo := fakes.Echo("elsewhere", nil)
	defer echo.Close()
	_, port, _ := net.SplitHostPort(echo.Addr)
	f := fakes.NewREST(func(string) string { return "ws://localhost:" + port + "/devtools/browser/x?token=t0k" })
	defer f.Close()

	res := restProvider(t, "api-elsewhere", f).Connect(context.Background(), testHandshake(), nil)
	if res.Conn != nil {
		res.Conn.Close()
	}
	if res.Outcome.Word != WordBadConnectURL || res.Outcome.Kind != Failure {
		t.Fatalf("outcome %q %v (%v), want %s, a failure", res.Outcome.Word, res.Outcome.Kind, res.Outcome.Err, WordBadConnectURL)
	}
	if n := echo.Hits.Load(); n != 0 {
		t.Fatalf("the other host was dialed %d times", n)
	}
	if msg := res.Outcome.Err.Error(); !strings.Contains(msg, `"localhost"`) || strings.Contains(msg, "t0k") || strings.Contains(msg, testAPIKey) {
		t.Fatalf("error %q: should name the host only", msg)
	}
	settle(t, f, 1)

	// Named in connect_hosts: dialed, with the provider's headers.
	res = restProvider(t, "api-elsewhere-named", f, "LOCALHOST").Connect(context.Background(), testHandshake(), nil)
	if res.Outcome.Kind != Success {
		t.Fatalf("with connect_hosts: %q %v", res.Outcome.Word, res.Outcome.Err)
	}
	if echo.LastHeader().Get("X-Api-Key") != testAPIKey {
		t.Fatal("the dial went without header_up")
	}
	res.Conn.Close()
	settle(t, f, 2)

	// The create host on another port: dialed.
	same := fakes.NewREST(func(string) string { return echo.URL() })
	defer same.Close()
	res = restProvider(t, "api-same-host", same).Connect(context.Background(), testHandshake(), nil)
	if res.Outcome.Kind != Success {
		t.Fatalf("same host, other port: %q %v", res.Outcome.Word, res.Outcome.Err)
	}
	res.Conn.Close()
	settle(t, same, 1)
}

// TestCreateAnswerLimit: a create answer up to MaxCreateAnswer is read
// whole (one over 64 KiB connects); a larger one is bad_create, and its
// session is released when its ID comes before the limit, or else counted
// as an orphan and reported, as is a 2xx answer without an ID.
func TestCreateAnswerLimit(t *testing.T) {
	echo := fakes.Echo("big-answers", nil)
	defer echo.Close()
	orphans := swapOrphanHook(t)

	t.Run("200 KiB connects", func(t *testing.T) {
		f := fakes.NewREST(func(string) string { return echo.URL() })
		defer f.Close()
		f.Pad = 200 << 10
		res := restProvider(t, "api-200k", f).Connect(context.Background(), testHandshake(), nil)
		if res.Outcome.Kind != Success {
			t.Fatalf("%q %v", res.Outcome.Word, res.Outcome.Err)
		}
		res.Conn.Close()
		settle(t, f, 1)
	})
	t.Run("over the limit, ID first: released", func(t *testing.T) {
		f := fakes.NewREST(func(string) string { return echo.URL() })
		defer f.Close()
		f.Pad = MaxCreateAnswer + 1
		p := restProvider(t, "api-big-id", f)
		b := p.Books()
		before := b.Orphans.Load()
		res := p.Connect(context.Background(), testHandshake(), nil)
		if res.Outcome.Word != WordBadCreate || res.Outcome.Kind != Failure || !strings.Contains(res.Outcome.Err.Error(), "larger than") {
			t.Fatalf("%q %v %v", res.Outcome.Word, res.Outcome.Kind, res.Outcome.Err)
		}
		settle(t, f, 1)
		if b.Orphans.Load() != before || b.Unreleased() != 0 {
			t.Fatalf("orphans %d→%d, unreleased %d", before, b.Orphans.Load(), b.Unreleased())
		}
	})
	t.Run("over the limit, ID after it: an orphan", func(t *testing.T) {
		f := fakes.NewREST(func(string) string { return echo.URL() })
		defer f.Close()
		f.Pad, f.PadFirst = MaxCreateAnswer+1, true
		p := restProvider(t, "api-big-noid", f)
		b := p.Books()
		before, seen := b.Orphans.Load(), len(orphans())
		res := p.Connect(context.Background(), testHandshake(), nil)
		if res.Outcome.Word != WordBadCreate || res.Outcome.Kind != Failure {
			t.Fatalf("%q %v %v", res.Outcome.Word, res.Outcome.Kind, res.Outcome.Err)
		}
		if n := b.Orphans.Load() - before; n != 1 {
			t.Fatalf("orphans moved %d, want 1", n)
		}
		got := orphans()[seen:]
		if len(got) != 1 || !strings.HasPrefix(got[0], "api-big-noid: ") || strings.Contains(got[0], "xxxx") || strings.Contains(got[0], testAPIKey) {
			t.Fatalf("orphan reports %q", got)
		}
		if !testRel.Wait(time.Now().Add(5*time.Second)) || len(f.Books().Released) != 0 {
			t.Fatalf("released %+v", f.Books())
		}
	})
	t.Run("cut short after the ID: released", func(t *testing.T) {
		f := fakes.NewREST(nil)
		defer f.Close()
		f.OnCreate = func(w http.ResponseWriter, _ *http.Request) bool {
			w.Header().Set("Content-Length", "4096")
			w.Write([]byte(`{"id":"s-cut","connectUrl":"ws://127.0.0.1:1/","padding":"xx`))
			return true // the connection ends 4 KiB short
		}
		p := restProvider(t, "api-cut", f)
		b := p.Books()
		before := b.Orphans.Load()
		res := p.Connect(context.Background(), testHandshake(), nil)
		if res.Outcome.Word != WordReset || res.Outcome.Kind != Failure {
			t.Fatalf("%q %v %v", res.Outcome.Word, res.Outcome.Kind, res.Outcome.Err)
		}
		if !testRel.Wait(time.Now().Add(5*time.Second)) || f.Books().Unknown != 1 || b.Orphans.Load() != before {
			t.Fatalf("the session s-cut was not released: %+v, orphans %d→%d", f.Books(), before, b.Orphans.Load())
		}
	})
	t.Run("2xx without an ID: an orphan", func(t *testing.T) {
		f := fakes.NewREST(nil)
		defer f.Close()
		f.OnCreate = func(w http.ResponseWriter, _ *http.Request) bool {
			w.Write([]byte(`{"connectUrl":"ws://127.0.0.1:1/"}`))
			return true
		}
		p := restProvider(t, "api-noid", f)
		b := p.Books()
		before, seen := b.Orphans.Load(), len(orphans())
		res := p.Connect(context.Background(), testHandshake(), nil)
		if res.Outcome.Word != WordBadCreate {
			t.Fatalf("%q %v", res.Outcome.Word, res.Outcome.Err)
		}
		if got := orphans()[seen:]; b.Orphans.Load()-before != 1 || len(got) != 1 || got[0] != "api-noid: no session ID at /id" {
			t.Fatalf("orphans moved %d, reports %q", b.Orphans.Load()-before, got)
		}
	})
}

func TestFindPointer(t *testing.T) {
	doc := `{"meta":{"list":[{"u":"ws://h/0"},{"u":"ws://h/1"}],"skip":{"id":"not me"}},"a/b":{"m~n":7},"id":"s1","empty":"","obj":{}}`
	for p, want := range map[string]string{"/id": "s1", "/meta/list/1/u": "ws://h/1", "/meta/list/0/u": "ws://h/0", "/a~1b/m~0n": "7", "/meta/skip/id": "not me"} {
		if got, ok := findPointer([]byte(doc), p); !ok || got != want {
			t.Errorf("%s: %q %v, want %q", p, got, ok, want)
		}
	}
	for _, p := range []string{"/missing", "/empty", "/obj", "/meta", "/meta/list/2/u", "/meta/list/x", "/id/x"} {
		if got, ok := findPointer([]byte(doc), p); ok {
			t.Errorf("%s: found %q", p, got)
		}
	}
	// Cut short, or malformed, after the value: still found; before it:
	// not.
	cut := `{"id":"s9","connectUrl":"ws://h/","padding":"xxxxxxxx`
	if got, ok := findPointer([]byte(cut), "/id"); !ok || got != "s9" {
		t.Fatalf("cut: %q %v", got, ok)
	}
	if _, ok := findPointer([]byte(`{"padding":"xxxx`), "/id"); ok {
		t.Fatal("found in a document cut before it")
	}
	if got, ok := findPointer([]byte(`{"id":"s3", oops}`), "/id"); !ok || got != "s3" {
		t.Fatalf("malformed after: %q %v", got, ok)
	}
}

// TestWaitReleasesWaitsForCreate: a create still in flight when the
// client left keeps WaitReleases waiting until it answered and the
// session it made was released.
func TestWaitReleasesWaitsForCreate(t *testing.T) {
	echo := fakes.Echo("slow-create", nil)
	defer echo.Close()
	f := fakes.NewREST(func(string) string { return echo.URL() })
	defer f.Close()
	entered := make(chan struct{}, 1)
	f.OnCreate = func(http.ResponseWriter, *http.Request) bool {
		entered <- struct{}{}
		<-time.After(1500 * time.Millisecond) // the provider is slow to create
		return false
	}
	p := restProvider(t, "api-slow-create", f)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan Result, 1)
	go func() { done <- p.Connect(ctx, testHandshake(), nil) }()
	<-entered
	cancel() // the client leaves at once
	if res := <-done; res.Outcome.Kind != ClientGone {
		t.Fatalf("%q %v", res.Outcome.Word, res.Outcome.Err)
	}
	if testRel.Pending() == 0 {
		t.Fatal("the create in flight is not pending")
	}
	if !testRel.Wait(time.Now().Add(5 * time.Second)) {
		t.Fatalf("still pending: %d", testRel.Pending())
	}
	b := f.Books()
	if len(b.Created) != 1 || len(f.Creates()) != 1 || b.Balanced() != nil {
		t.Fatalf("when WaitReleases returned: %+v (%v)", b, b.Balanced())
	}
	if n := echo.Hits.Load(); n != 0 {
		t.Fatalf("dialed %d times after the client left", n)
	}
}

// TestStopCreates: once creates are stopped no create call starts (the
// attempt ends as client_gone, not against the provider), and a create in
// flight is waited for and its session released, not dialed.
func TestStopCreates(t *testing.T) {
	t.Cleanup(testRel.AllowCreates)
	echo := fakes.Echo("stop-creates", nil)
	defer echo.Close()
	f := fakes.NewREST(func(string) string { return echo.URL() })
	defer f.Close()
	gate := make(chan struct{})
	entered := make(chan struct{}, 1)
	f.OnCreate = func(http.ResponseWriter, *http.Request) bool {
		entered <- struct{}{}
		<-gate
		return false
	}
	p := restProvider(t, "api-stop", f)
	done := make(chan Result, 1)
	go func() { done <- p.Connect(context.Background(), testHandshake(), nil) }()
	<-entered
	testRel.StopCreates()
	if !testRel.CreatesStopped() {
		t.Fatal("not stopped")
	}
	// A new attempt: no create call.
	res := p.Connect(context.Background(), testHandshake(), nil)
	if res.Outcome.Kind != ClientGone || res.Outcome.Word != WordClientGone || !errors.Is(res.Outcome.Err, ErrCreatesStopped) {
		t.Fatalf("after StopCreates: %q %v %v", res.Outcome.Word, res.Outcome.Kind, res.Outcome.Err)
	}
	if n := len(f.Creates()); n != 1 {
		t.Fatalf("%d create calls, want the one in flight", n)
	}
	if testRel.Wait(time.Now().Add(50 * time.Millisecond)) {
		t.Fatal("WaitReleases did not wait for the create in flight")
	}
	close(gate)
	res = <-done
	if res.Outcome.Kind != ClientGone || !errors.Is(res.Outcome.Err, ErrCreatesStopped) || res.Conn != nil {
		t.Fatalf("the create in flight: %q %v %v", res.Outcome.Word, res.Outcome.Kind, res.Outcome.Err)
	}
	settle(t, f, 1)
	if n := echo.Hits.Load(); n != 0 {
		t.Fatalf("dialed %d times after StopCreates", n)
	}
	testRel.AllowCreates()
	res = p.Connect(context.Background(), testHandshake(), nil)
	if res.Outcome.Kind != Success {
		t.Fatalf("after AllowCreates: %q %v", res.Outcome.Word, res.Outcome.Err)
	}
	res.Conn.Close()
	settle(t, f, 2)
}

// TestConnectDowngradeRefused: a create call made over https whose answer
// gives a plain ws:// or http:// connect URL would send the provider's
// header_up values (and the URL's user info) in clear text: the attempt
// fails with bad_connect_url, nothing is dialed, and the session is
// released, unless insecure_connect allows it. A create over plain http
// may answer a plain connect URL: the operator chose plain.
func TestConnectDowngradeRefused(t *testing.T) {
	echo := fakes.Echo("downgrade", nil)
	defer echo.Close()
	_, port, _ := net.SplitHostPort(echo.Addr)
	tlsProvider := func(t *testing.T, name string, f *fakes.REST, insecure bool) *Provider {
		t.Helper()
		p, err := New(Config{
			Name: name, URL: f.URL(), ConnectTimeout: caddy.Duration(3 * time.Second),
			TLS:       &conf.TLS{InsecureSkipVerify: true},
			HeadersUp: []HeaderOp{{Op: "set", Field: "X-Api-Key", Value: testAPIKey}},
			SessionAPI: &SessionAPI{
				CreateMethod: "POST", CreateURL: "/v1/sessions",
				Headers:    []Header{{Field: "X-Api-Key", Value: testAPIKey}},
				ConnectURL: "/connectUrl", SessionID: "/id",
				ReleaseMethod: "POST", ReleaseURL: "/v1/sessions/{session_id}/release",
				InsecureConnect: insecure,
			},
		}, Defaults{Releaser: testRel}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, scheme := range []string{"ws", "http", "WS"} {
		t.Run(scheme, func(t *testing.T) {
			f := fakes.NewRESTTLS(func(string) string { return scheme + "://user:pw@127.0.0.1:" + port + "/devtools/browser/x" })
			defer f.Close()
			res := tlsProvider(t, "api-downgrade-"+scheme, f, false).Connect(context.Background(), testHandshake(), nil)
			if res.Conn != nil {
				res.Conn.Close()
			}
			if res.Outcome.Word != WordBadConnectURL || res.Outcome.Kind != Failure {
				t.Fatalf("outcome %q %v (%v), want %s, a failure", res.Outcome.Word, res.Outcome.Kind, res.Outcome.Err, WordBadConnectURL)
			}
			if n := echo.Hits.Load(); n != 0 {
				t.Fatalf("the plain connect URL was dialed %d times", n)
			}
			if msg := res.Outcome.Err.Error(); !strings.Contains(msg, "insecure_connect") || strings.Contains(msg, "pw") || strings.Contains(msg, testAPIKey) {
				t.Fatalf("error %q: should name the option, never the URL's secrets", msg)
			}
			settle(t, f, 1)
		})
	}
	t.Run("insecure_connect on", func(t *testing.T) {
		f := fakes.NewRESTTLS(func(string) string { return echo.URL() })
		defer f.Close()
		res := tlsProvider(t, "api-downgrade-allowed", f, true).Connect(context.Background(), testHandshake(), nil)
		if res.Outcome.Kind != Success {
			t.Fatalf("outcome %q %v", res.Outcome.Word, res.Outcome.Err)
		}
		if echo.LastHeader().Get("X-Api-Key") != testAPIKey {
			t.Fatal("the dial went without header_up")
		}
		res.Conn.Close()
		settle(t, f, 1)
	})
	t.Run("plain create, plain connect", func(t *testing.T) {
		f := fakes.NewREST(func(string) string { return echo.URL() })
		defer f.Close()
		res := restProvider(t, "api-plain", f).Connect(context.Background(), testHandshake(), nil)
		if res.Outcome.Kind != Success {
			t.Fatalf("outcome %q %v", res.Outcome.Word, res.Outcome.Err)
		}
		res.Conn.Close()
		settle(t, f, 1)
	})
	// A secure connect URL after a secure create: dialed (retarget accepts
	// it; no TLS echo here).
	secure := fakes.NewRESTTLS(nil)
	defer secure.Close()
	p := tlsProvider(t, "api-secure", secure, false)
	for _, u := range []string{"wss://127.0.0.1:1/x", "https://127.0.0.1:1/x"} {
		if _, err := p.retarget(u); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
}
