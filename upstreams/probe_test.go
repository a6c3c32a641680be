package upstreams

import (
	"context"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/internal/conf"
)

func probedProvider(t *testing.T, o Config) *Provider {
	t.Helper()
	if o.Name == "" {
		o.Name = "p"
	}
	p, err := New(o, Defaults{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestProbeTargets: what a probe GETs, from the provider's URL and the
// uri: a path takes the provider's scheme (ws→http, wss→https), host and
// query; a full URL is used as it is (its user info as Authorization, not
// in the URL); the defaults; the provider's credentials go only to its own
// host; the shown target is redacted; https dials with the provider's TLS
// settings; no proxy from the environment.
func TestProbeTargets(t *testing.T) {
	cases := []struct {
		name, url, uri, capacity string
		get, shown               string
		tls, own                 bool
		err                      string
	}{
		{name: "chrome default", url: "http://127.0.0.1:9222", get: "http://127.0.0.1:9222/json/version", shown: "http://127.0.0.1:9222/json/version", own: true},
		{name: "http path and query", url: "http://h:9222/base/?token=s3cr3t", get: "http://h:9222/base/json/version?token=s3cr3t", shown: "http://h:9222/base/json/version?token=REDACTED", own: true},
		{name: "https default", url: "https://h/", get: "https://h/json/version", shown: "https://h/json/version", tls: true, own: true},
		{name: "browserless pressure", url: "wss://production-sfo.browserless.io/?token=s3cr3t", capacity: CapacityBrowserless,
			get: "https://production-sfo.browserless.io/pressure?token=s3cr3t", shown: "https://production-sfo.browserless.io/pressure?token=REDACTED", tls: true, own: true},
		{name: "ws path", url: "ws://h:3000/pw", uri: "/health", get: "http://h:3000/health", shown: "http://h:3000/health", own: true},
		{name: "ws path with queries", url: "ws://u:pw@h:3000/pw?token=a", uri: "/health?x=1", get: "http://h:3000/health?token=a&x=1", shown: "http://REDACTED@h:3000/health?token=REDACTED&x=REDACTED", own: true},
		{name: "escaped path", url: "ws://h:3000/", uri: "/a%2Fb/health", get: "http://h:3000/a%2Fb/health", shown: "http://h:3000/a%2Fb/health", own: true},
		{name: "session options in the query", url: "ws://h:3000/?token=a&stealth={bf.option.stealth}", uri: "/pressure", get: "http://h:3000/pressure?token=a", shown: "http://h:3000/pressure?token=REDACTED", own: true},
		{name: "session options and the uri's query", url: "ws://h:3000/?r={bf.option.region}&token=a", uri: "/pressure?x=1", get: "http://h:3000/pressure?token=a&x=1", shown: "http://h:3000/pressure?token=REDACTED&x=REDACTED", own: true},
		{name: "ws without uri", url: "ws://h:3000/pw", err: "needs a uri for a ws:// or wss:// provider"},
		{name: "full URL elsewhere", url: "wss://h/?apiKey=k", uri: "https://status.example.com/ok?key=s3cr3t",
			get: "https://status.example.com/ok?key=s3cr3t", shown: "https://status.example.com/ok?key=REDACTED", tls: true},
		{name: "full URL with user info", url: "wss://h/", uri: "https://me:pw@status.example.com/ok",
			get: "https://status.example.com/ok", shown: "https://REDACTED@status.example.com/ok", tls: true},
		{name: "full URL same host", url: "wss://h:8443/?apiKey=k", uri: "https://h:8443/health", get: "https://h:8443/health", shown: "https://h:8443/health", tls: true, own: true},
		{name: "full URL other scheme", url: "wss://h/", uri: "http://h/health", get: "http://h/health", shown: "http://h/health"},
		{name: "not a path", url: "ws://h:1/", uri: "health", err: "want a path starting with / or an http:// or https:// URL"},
		{name: "ws URL", url: "ws://h:1/", uri: "ws://h:1/x", err: "want a path starting with /"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := probedProvider(t, Config{URL: tc.url, HeadersUp: []HeaderOp{{Op: "set", Field: "X-Api-Key", Value: "k3y"}}})
			pr, err := p.NewProber(ProbeOptions{URI: tc.uri, Capacity: tc.capacity})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer pr.Close()
			own := pr.req.Header.Get("X-Api-Key") != ""
			tls := pr.transport.DialTLSContext != nil
			if pr.target.String() != tc.get || pr.Target() != tc.shown || tls != tc.tls || own != tc.own {
				t.Fatalf("got %s shown %s tls %v own %v", pr.target, pr.Target(), tls, own)
			}
			if pr.transport.Proxy != nil {
				t.Fatal("probes would use a proxy from the environment")
			}
		})
	}
}

// probeServer is a fake provider's HTTP side: it answers with handler and
// counts the TCP connections it accepted.
type probeServer struct {
	*httptest.Server
	conns atomic.Int64
	mu    sync.Mutex
	reqs  []*http.Request
}

func newProbeServer(t *testing.T, h http.HandlerFunc) *probeServer {
	t.Helper()
	ps := &probeServer{}
	ps.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ps.mu.Lock()
		ps.reqs = append(ps.reqs, r.Clone(context.Background()))
		ps.mu.Unlock()
		h(w, r)
	}))
	ps.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			ps.conns.Add(1)
		}
	}
	ps.Start()
	t.Cleanup(ps.Close)
	return ps
}

func (ps *probeServer) last() *http.Request {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if len(ps.reqs) == 0 {
		return nil
	}
	return ps.reqs[len(ps.reqs)-1]
}

func probeOnce(t *testing.T, pr *Prober) ProbeResult {
	t.Helper()
	return pr.Probe(context.Background())
}

// TestProbeOutcomes: a probe is classified with the outcome words of
// client attempts; the expected status passes; a hanging provider is a
// timeout within the probe's timeout; a called-off probe says nothing.
func TestProbeOutcomes(t *testing.T) {
	status := atomic.Int64{}
	status.Store(200)
	ps := newProbeServer(t, func(w http.ResponseWriter, r *http.Request) {
		if status.Load() == 302 {
			w.Header().Set("Location", "/elsewhere")
		}
		w.WriteHeader(int(status.Load()))
		fmt.Fprint(w, `{"Browser":"x"}`)
	})
	p := probedProvider(t, Config{URL: ps.URL})
	pr, err := p.NewProber(ProbeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	if r := probeOnce(t, pr); r.Outcome.Kind != Success || r.Outcome.Word != WordOK || r.Pressure != nil || r.Outcome.Elapsed <= 0 {
		t.Fatalf("200: %+v", r)
	}
	if got := ps.last(); got.URL.Path != "/json/version" || got.Method != http.MethodGet || got.Header.Get("Upgrade") != "" {
		t.Fatalf("the probe was %s %s (Upgrade %q)", got.Method, got.URL, got.Header.Get("Upgrade"))
	}
	status.Store(503)
	if r := probeOnce(t, pr); r.Outcome.Kind != Failure || r.Outcome.Word != "status_503" {
		t.Fatalf("503: %+v", r)
	}
	status.Store(404)
	if r := probeOnce(t, pr); r.Outcome.Kind != Failure || r.Outcome.Word != "status_404" {
		t.Fatalf("404: %+v", r)
	}
	// A redirect is the answer, not followed.
	status.Store(302)
	before := len(ps.reqs)
	if r := probeOnce(t, pr); r.Outcome.Word != "status_302" || len(ps.reqs) != before+1 {
		t.Fatalf("302: %+v, %d requests", r, len(ps.reqs)-before)
	}
	// expect_status.
	pr204, _ := p.NewProber(ProbeOptions{ExpectStatus: 204})
	status.Store(204)
	if r := probeOnce(t, pr204); r.Outcome.Kind != Success {
		t.Fatalf("204 expected: %+v", r)
	}
	status.Store(200)
	if r := probeOnce(t, pr204); r.Outcome.Word != "status_200" {
		t.Fatalf("200 when 204 is expected: %+v", r)
	}
	pr204.Close()

	// Refused.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	prr, _ := probedProvider(t, Config{URL: "http://" + addr + "/?token=s3cr3t"}).NewProber(ProbeOptions{})
	if r := probeOnce(t, prr); r.Outcome.Word != WordRefused || r.Outcome.Kind != Failure {
		t.Fatalf("refused: %+v", r)
	} else if strings.Contains(r.Outcome.Err.Error(), "s3cr3t") || strings.Contains(r.Outcome.Err.Error(), "json/version") {
		t.Fatalf("the cause names the URL: %v", r.Outcome.Err)
	}
	// Hanging: a timeout, within bounds.
	hang, _ := net.Listen("tcp", "127.0.0.1:0")
	defer hang.Close()
	go func() {
		for {
			c, err := hang.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	prh, _ := probedProvider(t, Config{URL: "http://" + hang.Addr().String()}).NewProber(ProbeOptions{Timeout: caddy.Duration(200 * time.Millisecond)})
	start := time.Now()
	r := probeOnce(t, prh)
	if r.Outcome.Word != WordTimeout || time.Since(start) < 200*time.Millisecond || time.Since(start) > 5*time.Second {
		t.Fatalf("hang: %+v after %v", r, time.Since(start))
	}
	// Called off: nothing learnt.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	prh2, _ := probedProvider(t, Config{URL: "http://" + hang.Addr().String()}).NewProber(ProbeOptions{Timeout: caddy.Duration(5 * time.Second)})
	if r := prh2.Probe(ctx); r.Outcome.Kind != ClientGone {
		t.Fatalf("called off: %+v", r)
	}
}

// TestProbeKeepsConnection: probes reuse one connection while the provider
// keeps it; one the provider closed between probes is replaced without a
// failure.
func TestProbeKeepsConnection(t *testing.T) {
	closeNext := atomic.Bool{}
	ps := newProbeServer(t, func(w http.ResponseWriter, r *http.Request) {
		if closeNext.Swap(false) {
			w.Header().Set("Connection", "close")
		}
		fmt.Fprint(w, "ok")
	})
	pr, _ := probedProvider(t, Config{URL: ps.URL}).NewProber(ProbeOptions{})
	defer pr.Close()
	for i := range 5 {
		if r := probeOnce(t, pr); r.Outcome.Kind != Success {
			t.Fatalf("probe %d: %+v", i, r)
		}
	}
	if n := ps.conns.Load(); n != 1 {
		t.Fatalf("%d connections for 5 probes", n)
	}
	closeNext.Store(true)
	probeOnce(t, pr)
	if r := probeOnce(t, pr); r.Outcome.Kind != Success || ps.conns.Load() != 2 {
		t.Fatalf("after Connection: close: %+v, %d connections", r, ps.conns.Load())
	}
	// The provider drops idle connections: the kept one fails at once and
	// a fresh one serves the probe.
	ps.CloseClientConnections()
	time.Sleep(20 * time.Millisecond)
	if r := probeOnce(t, pr); r.Outcome.Kind != Success || ps.conns.Load() != 3 {
		t.Fatalf("after the provider dropped the kept connection: %+v, %d connections", r, ps.conns.Load())
	}
	// Closed, the prober keeps no connection: each later probe dials.
	pr.Close()
	for range 2 {
		if r := probeOnce(t, pr); r.Outcome.Kind != Success {
			t.Fatalf("probe after Close: %+v", r)
		}
	}
	if n := ps.conns.Load(); n != 5 {
		t.Fatalf("%d connections: a closed prober kept one", n)
	}
}

// TestProbeSlowAnswers: an answer that comes late, in parts or chunked is
// waited for within the timeout and read whole, on the kept connection.
func TestProbeSlowAnswers(t *testing.T) {
	full := `{"pressure":{"running":1,"maxConcurrent":4,"queued":0,"isAvailable":false}}`
	var n atomic.Int64
	ps := newProbeServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch n.Add(1) {
		case 2: // late
			time.Sleep(50 * time.Millisecond)
		case 3: // the head and part of the body, then the rest
			w.Header().Set("Content-Length", strconv.Itoa(len(full)))
			fmt.Fprint(w, full[:25])
			w.(http.Flusher).Flush()
			time.Sleep(20 * time.Millisecond)
			fmt.Fprint(w, full[25:])
			return
		case 4: // chunked
			for _, part := range []string{full[:10], full[10:40], full[40:]} {
				fmt.Fprint(w, part)
				w.(http.Flusher).Flush()
			}
			return
		}
		fmt.Fprint(w, full)
	})
	pr, _ := probedProvider(t, Config{URL: ps.URL}).NewProber(ProbeOptions{Capacity: CapacityBrowserless, Timeout: caddy.Duration(5 * time.Second)})
	defer pr.Close()
	for i := 1; i <= 5; i++ {
		r := probeOnce(t, pr)
		if r.Outcome.Kind != Success || r.Pressure == nil || *r.Pressure != (Pressure{Running: 1, MaxConcurrent: 4}) {
			t.Fatalf("answer %d: %+v %+v (%v)", i, r, r.Pressure, r.CapacityErr)
		}
		if i == 2 && r.Outcome.Elapsed < 50*time.Millisecond {
			t.Fatalf("late answer: elapsed %v", r.Outcome.Elapsed)
		}
	}
	if c := ps.conns.Load(); c != 1 {
		t.Fatalf("%d connections, want the kept one", c)
	}
}

// TestProbeKeptConnectionTimeoutAndCalledOff: an answer that never comes on
// the kept connection is a timeout within the probe's timeout, and the next
// probe passes on a fresh connection; calling a probe off ends it at once,
// saying nothing.
func TestProbeKeptConnectionTimeoutAndCalledOff(t *testing.T) {
	var hang atomic.Bool
	ps := newProbeServer(t, func(w http.ResponseWriter, r *http.Request) {
		if hang.Load() {
			<-r.Context().Done()
			return
		}
		fmt.Fprint(w, "ok")
	})
	pr, _ := probedProvider(t, Config{URL: ps.URL}).NewProber(ProbeOptions{Timeout: caddy.Duration(200 * time.Millisecond)})
	defer pr.Close()
	probeOnce(t, pr)
	hang.Store(true)
	start := time.Now()
	if r := probeOnce(t, pr); r.Outcome.Word != WordTimeout || r.Outcome.Kind != Failure || time.Since(start) < 200*time.Millisecond || time.Since(start) > 5*time.Second {
		t.Fatalf("hang: %+v after %v", r, time.Since(start))
	}
	hang.Store(false)
	if r := probeOnce(t, pr); r.Outcome.Kind != Success || ps.conns.Load() != 2 {
		t.Fatalf("after the timeout: %+v, %d connections", r, ps.conns.Load())
	}

	pr2, _ := probedProvider(t, Config{URL: ps.URL}).NewProber(ProbeOptions{Timeout: caddy.Duration(10 * time.Second)})
	defer pr2.Close()
	probeOnce(t, pr2)
	hang.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start = time.Now()
	if r := pr2.Probe(ctx); r.Outcome.Kind != ClientGone || time.Since(start) > 5*time.Second {
		t.Fatalf("called off: %+v after %v", r, time.Since(start))
	}
}

// TestProbeCloseWaits: Close waits for a probe in flight.
func TestProbeCloseWaits(t *testing.T) {
	release := make(chan struct{})
	ps := newProbeServer(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
		fmt.Fprint(w, "ok")
	})
	pr, _ := probedProvider(t, Config{URL: ps.URL}).NewProber(ProbeOptions{Timeout: caddy.Duration(10 * time.Second)})
	probed := make(chan ProbeResult, 1)
	go func() { probed <- probeOnce(t, pr) }()
	waitFor(t, "the probe to reach the provider", func() bool { return ps.last() != nil })
	closed := make(chan struct{})
	go func() { pr.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close did not wait for the probe in flight")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if r := <-probed; r.Outcome.Kind != Success {
		t.Fatalf("the probe in flight: %+v", r)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return once the probe ended")
	}
}

// TestProbeUnreadableAnswers: what is not an HTTP/1.x answer, or ends too
// soon, has the words of a client's attempt that met it.
func TestProbeUnreadableAnswers(t *testing.T) {
	for _, tc := range []struct {
		name, answer, word string
	}{
		{"not HTTP", "SSH-2.0-OpenSSH_9.6\r\n", WordBadHandshake},
		{"bad status code", "HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n", WordBadHandshake},
		{"bad header line", "HTTP/1.1 200 OK\r\nno colon\r\nContent-Length: 0\r\n\r\n", WordBadHandshake},
		{"header too large", "HTTP/1.1 200 OK\r\nX-A: " + strings.Repeat("a", MaxAnswerHeader) + "\r\n\r\n", WordBadHandshake},
		{"closed at once", "", WordReset},
		{"body cut short", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nok", WordReset},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						c.Read(make([]byte, 4096))
						c.Write([]byte(tc.answer))
					}()
				}
			}()
			pr, _ := probedProvider(t, Config{URL: "http://" + ln.Addr().String()}).NewProber(ProbeOptions{})
			defer pr.Close()
			if r := probeOnce(t, pr); r.Outcome.Word != tc.word || r.Outcome.Kind != Failure {
				t.Fatalf("%+v, want %s", r, tc.word)
			}
		})
	}
}

// waitFor polls cond, bounding the wait generously; it asserts no timing.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestProbeCapacityRead: browserless's pressure answer is read; a passing
// probe whose answer is not that JSON passes but says why it has no
// capacity.
func TestProbeCapacityRead(t *testing.T) {
	body := atomic.Value{}
	body.Store(`{"pressure":{"date":1,"running":3,"maxConcurrent":5,"queued":2,"isAvailable":true,"cpu":0.1}}`)
	ps := newProbeServer(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, body.Load().(string))
	})
	pr, _ := probedProvider(t, Config{URL: "ws" + strings.TrimPrefix(ps.URL, "http") + "/?token=T"}).NewProber(ProbeOptions{Capacity: CapacityBrowserless})
	defer pr.Close()
	r := probeOnce(t, pr)
	if r.Outcome.Kind != Success || r.Pressure == nil || *r.Pressure != (Pressure{Running: 3, MaxConcurrent: 5, Queued: 2, IsAvailable: true}) || r.Pressure.Full() {
		t.Fatalf("pressure %+v %+v", r, r.Pressure)
	}
	if got := ps.last(); got.URL.Path != "/pressure" || got.URL.Query().Get("token") != "T" {
		t.Fatalf("capacity read went to %s", got.URL)
	}
	for _, tc := range []struct {
		body string
		full bool
	}{
		{`{"pressure":{"running":0,"maxConcurrent":5,"queued":0,"isAvailable":false}}`, true},
		{`{"pressure":{"running":5,"maxConcurrent":5,"queued":0,"isAvailable":true}}`, true},
		{`{"pressure":{"running":9,"maxConcurrent":5}}`, true},
		{`{"pressure":{"running":1,"maxConcurrent":5}}`, false},
	} {
		body.Store(tc.body)
		r := probeOnce(t, pr)
		if r.Pressure == nil || r.Pressure.Full() != tc.full {
			t.Fatalf("%s: %+v, want full %v", tc.body, r.Pressure, tc.full)
		}
	}
	for _, bad := range []string{`<html>`, `{"running":1}`, `{"pressure":{"isAvailable":true}}`} {
		body.Store(bad)
		r := probeOnce(t, pr)
		if r.Outcome.Kind != Success || r.Pressure != nil || r.CapacityErr == nil {
			t.Fatalf("%s: %+v", bad, r)
		}
	}
}

// TestProbeCredentials: the provider's credentials (URL user info,
// header_up values known at load time) go with probes of its own host,
// never to another; request placeholders are left out.
func TestProbeCredentials(t *testing.T) {
	ps := newProbeServer(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	host := strings.TrimPrefix(ps.URL, "http://")
	p := probedProvider(t, Config{URL: "ws://user:pa55@" + host + "/", HeadersUp: []HeaderOp{
		{Op: "set", Field: "X-Api-Key", Value: "k3y"},
		{Op: "set", Field: "X-Client", Value: "{http.request.header.X-Client}"},
	}})
	own, _ := p.NewProber(ProbeOptions{URI: "/health"})
	defer own.Close()
	probeOnce(t, own)
	r := ps.last()
	if u, pw, ok := r.BasicAuth(); !ok || u != "user" || pw != "pa55" || r.Header.Get("X-Api-Key") != "k3y" || r.Header.Get("X-Client") != "" {
		t.Fatalf("own host got auth %v %q %q, key %q, client %q", ok, u, pw, r.Header.Get("X-Api-Key"), r.Header.Get("X-Client"))
	}
	other := newProbeServer(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	pr, _ := p.NewProber(ProbeOptions{URI: other.URL + "/status"})
	defer pr.Close()
	if res := probeOnce(t, pr); res.Outcome.Kind != Success {
		t.Fatal(res)
	}
	r = other.last()
	if r.Header.Get("Authorization") != "" || r.Header.Get("X-Api-Key") != "" {
		t.Fatalf("another host got the provider's credentials: %v", r.Header)
	}
}

// TestProbeTLS: an https probe uses the provider's TLS options: a private
// CA trusted through tls_trusted_ca_certs passes, the system roots fail
// with tls_error.
func TestProbeTLS(t *testing.T) {
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	defer ts.Close()
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	u := "wss" + strings.TrimPrefix(ts.URL, "https") + "/"
	trusted, _ := probedProvider(t, Config{URL: u, TLS: &conf.TLS{TrustedCACertFiles: []string{caFile}}}).NewProber(ProbeOptions{URI: "/json/version"})
	defer trusted.Close()
	if r := probeOnce(t, trusted); r.Outcome.Kind != Success {
		t.Fatalf("trusted CA: %+v", r)
	}
	untrusted, _ := probedProvider(t, Config{URL: u}).NewProber(ProbeOptions{URI: "/json/version"})
	defer untrusted.Close()
	if r := probeOnce(t, untrusted); r.Outcome.Word != WordTLS {
		t.Fatalf("unknown CA: %+v", r)
	}
}

// TestProbeChromeHost: Chrome refuses /json/* for a Host that is neither
// an IP address nor localhost; the probe then sends the dialed address,
// as discovery does.
func TestProbeChromeHost(t *testing.T) {
	ps := newProbeServer(t, func(w http.ResponseWriter, r *http.Request) {
		if h, _, _ := net.SplitHostPort(r.Host); net.ParseIP(h) == nil {
			w.WriteHeader(500)
			fmt.Fprint(w, "Host header is specified and is not an IP address or localhost.")
			return
		}
		fmt.Fprint(w, `{"Browser":"x"}`)
	})
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(ps.URL, "http://"))
	pr, _ := probedProvider(t, Config{URL: "http://localhost:" + port}).NewProber(ProbeOptions{})
	defer pr.Close()
	for range 2 {
		if r := probeOnce(t, pr); r.Outcome.Kind != Success {
			t.Fatalf("named host: %+v", r)
		}
	}
	if h := ps.last().Host; strings.HasPrefix(h, "localhost") {
		t.Fatalf("Host %q after the refusal", h)
	}
	// A refusal that comes later, on the kept connection, is met alike.
	var refuse atomic.Bool
	ps2 := newProbeServer(t, func(w http.ResponseWriter, r *http.Request) {
		if h, _, _ := net.SplitHostPort(r.Host); refuse.Load() && h == "localhost" {
			w.WriteHeader(500)
			fmt.Fprint(w, "Host header is specified and is not an IP address or localhost.")
			return
		}
		fmt.Fprint(w, `{"Browser":"x"}`)
	})
	_, port, _ = net.SplitHostPort(strings.TrimPrefix(ps2.URL, "http://"))
	pr2, _ := probedProvider(t, Config{URL: "http://localhost:" + port}).NewProber(ProbeOptions{})
	defer pr2.Close()
	probeOnce(t, pr2)
	refuse.Store(true)
	for range 2 {
		if r := probeOnce(t, pr2); r.Outcome.Kind != Success {
			t.Fatalf("refused Host: %+v", r)
		}
	}
	if h := ps2.last().Host; strings.HasPrefix(h, "localhost") || ps2.conns.Load() != 1 {
		t.Fatalf("Host %q after the refusal, %d connections", h, ps2.conns.Load())
	}
}
