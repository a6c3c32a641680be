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
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func probedProvider(t *testing.T, o Options) *Provider {
	t.Helper()
	if o.Name == "" {
		o.Name = "p"
	}
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestProbeTargets: what a probe GETs, from the provider's URL and the
// uri: a path takes the provider's scheme (ws→http, wss→https), host and
// query; a full URL is used as it is; the defaults; the provider's
// credentials go only to its own host; the shown target is redacted.
func TestProbeTargets(t *testing.T) {
	cases := []struct {
		name, url, uri, capacity string
		addr, reqURI, shown      string
		tls, own                 bool
		err                      string
	}{
		{name: "chrome default", url: "http://127.0.0.1:9222", addr: "127.0.0.1:9222", reqURI: "/json/version", shown: "http://127.0.0.1:9222/json/version", own: true},
		{name: "http path and query", url: "http://h:9222/base/?token=s3cr3t", addr: "h:9222", reqURI: "/base/json/version?token=s3cr3t", shown: "http://h:9222/base/json/version?token=REDACTED", own: true},
		{name: "https default", url: "https://h/", addr: "h:443", reqURI: "/json/version", shown: "https://h/json/version", tls: true, own: true},
		{name: "browserless pressure", url: "wss://production-sfo.browserless.io/?token=s3cr3t", capacity: CapacityBrowserless,
			addr: "production-sfo.browserless.io:443", reqURI: "/pressure?token=s3cr3t", shown: "https://production-sfo.browserless.io/pressure?token=REDACTED", tls: true, own: true},
		{name: "ws path", url: "ws://h:3000/pw", uri: "/health", addr: "h:3000", reqURI: "/health", shown: "http://h:3000/health", own: true},
		{name: "ws path with queries", url: "ws://u:pw@h:3000/pw?token=a", uri: "/health?x=1", addr: "h:3000", reqURI: "/health?token=a&x=1", shown: "http://REDACTED@h:3000/health?token=REDACTED&x=REDACTED", own: true},
		{name: "ws without uri", url: "ws://h:3000/pw", err: "needs a uri for a ws:// or wss:// provider"},
		{name: "full URL elsewhere", url: "wss://h/?apiKey=k", uri: "https://status.example.com/ok?key=s3cr3t",
			addr: "status.example.com:443", reqURI: "/ok?key=s3cr3t", shown: "https://status.example.com/ok?key=REDACTED", tls: true},
		{name: "full URL same host", url: "wss://h:8443/?apiKey=k", uri: "https://h:8443/health", addr: "h:8443", reqURI: "/health", shown: "https://h:8443/health", tls: true, own: true},
		{name: "full URL other scheme", url: "wss://h/", uri: "http://h/health", addr: "h:80", reqURI: "/health", shown: "http://h/health"},
		{name: "not a path", url: "ws://h:1/", uri: "health", err: "want a path starting with / or an http:// or https:// URL"},
		{name: "ws URL", url: "ws://h:1/", uri: "ws://h:1/x", err: "want a path starting with /"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := probedProvider(t, Options{URL: tc.url})
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
			if pr.address != tc.addr || pr.requestURI != tc.reqURI || pr.Target() != tc.shown || (pr.tlsConfig != nil) != tc.tls || pr.own != tc.own {
				t.Fatalf("got addr %s uri %s shown %s tls %v own %v", pr.address, pr.requestURI, pr.Target(), pr.tlsConfig != nil, pr.own)
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
		w.WriteHeader(int(status.Load()))
		fmt.Fprint(w, `{"Browser":"x"}`)
	})
	p := probedProvider(t, Options{URL: ps.URL})
	pr, err := p.NewProber(ProbeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	if r := probeOnce(t, pr); r.Outcome.Kind != Success || r.Outcome.Word != WordOK || r.Pressure != nil {
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
	prr, _ := probedProvider(t, Options{URL: "http://" + addr}).NewProber(ProbeOptions{})
	if r := probeOnce(t, prr); r.Outcome.Word != WordRefused || r.Outcome.Kind != Failure {
		t.Fatalf("refused: %+v", r)
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
	prh, _ := probedProvider(t, Options{URL: "http://" + hang.Addr().String()}).NewProber(ProbeOptions{Timeout: 200 * time.Millisecond})
	start := time.Now()
	r := probeOnce(t, prh)
	if r.Outcome.Word != WordTimeout || time.Since(start) < 200*time.Millisecond || time.Since(start) > 5*time.Second {
		t.Fatalf("hang: %+v after %v", r, time.Since(start))
	}
	// Called off: nothing learnt.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	prh2, _ := probedProvider(t, Options{URL: "http://" + hang.Addr().String()}).NewProber(ProbeOptions{Timeout: 5 * time.Second})
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
	pr, _ := probedProvider(t, Options{URL: ps.URL}).NewProber(ProbeOptions{})
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
	if r := probeOnce(t, pr); r.Outcome.Kind != Success {
		t.Fatalf("after the provider dropped the kept connection: %+v", r)
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
	pr, _ := probedProvider(t, Options{URL: "ws" + strings.TrimPrefix(ps.URL, "http") + "/?token=T"}).NewProber(ProbeOptions{Capacity: CapacityBrowserless})
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
	p := probedProvider(t, Options{URL: "ws://user:pa55@" + host + "/", HeaderOps: []HeaderOp{
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
	trusted, _ := probedProvider(t, Options{URL: u, TLS: TLSOptions{TrustedCACertFiles: []string{caFile}}}).NewProber(ProbeOptions{URI: "/json/version"})
	defer trusted.Close()
	if r := probeOnce(t, trusted); r.Outcome.Kind != Success {
		t.Fatalf("trusted CA: %+v", r)
	}
	untrusted, _ := probedProvider(t, Options{URL: u}).NewProber(ProbeOptions{URI: "/json/version"})
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
	pr, _ := probedProvider(t, Options{URL: "http://localhost:" + port}).NewProber(ProbeOptions{})
	defer pr.Close()
	for range 2 {
		if r := probeOnce(t, pr); r.Outcome.Kind != Success {
			t.Fatalf("named host: %+v", r)
		}
	}
}
