package upstreams

// WebDriver commands and sockets against a fake server, and the health
// check of a webdriver provider.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
)

// wdSession creates a session at a webdriver provider on f.
func wdSession(t *testing.T, f *fakes.WebDriver, edit ...func(*Config)) (*Provider, *WebDriverSession) {
	t.Helper()
	p, rel := wdProvider(t, f.URL(), edit...)
	res := p.CreateWebDriver(context.Background(), mustCreateRequest(t, chromeCreate), nil)
	if res.Outcome.Kind != Success {
		t.Fatalf("create: %+v", res.Outcome)
	}
	t.Cleanup(func() {
		res.WebDriver.Remote.Release()
		rel.Wait(time.Now().Add(10 * time.Second))
	})
	return p, res.WebDriver
}

// TestWebDriverCommandForwarded: method, path, query and body reach the
// provider as the client sent them, with the provider's credentials, on
// one kept-alive connection; the answer comes back as it is.
func TestWebDriverCommandForwarded(t *testing.T) {
	f := fakes.NewWebDriver("/wd/hub")
	defer f.Close()
	p, s := wdSession(t, f, withSecrets)
	body := `{"script":"return 1 < 2 && \"\u00e9\"","args":[1.50,{"k":null}]}`
	cases := []struct{ method, rest, query, body string }{
		{"POST", "/execute/sync", "", body},
		{"GET", "/url", "", ""},
		{"POST", "/element/f.1%3A2.d.3/click", "a=1&b=%20x&a=2", "{}"},
		{"GET", "", "", ""},
		{"POST", "/se/file", "", strings.Repeat("x", 3<<20)},
	}
	before := f.Conns()
	for _, c := range cases {
		var rd io.Reader
		if c.body != "" {
			rd = CommandBody(strings.NewReader(c.body), int64(len(c.body)))
		}
		resp, err := p.WebDriverCommand(context.Background(), s, c.method, c.rest, c.query, rd)
		if err != nil {
			t.Fatalf("%s %s: %v", c.method, c.rest, err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json; charset=utf-8" {
			t.Fatalf("%s %s: %d %v", c.method, c.rest, resp.StatusCode, resp.Header)
		}
		reqs := f.Requests()
		r := reqs[len(reqs)-1]
		uri := "/wd/hub/session/" + s.ID + c.rest
		if c.query != "" {
			uri += "?" + c.query
		}
		if r.Method != c.method || r.URI != uri || string(r.Body) != c.body {
			t.Fatalf("sent %s %s (%d bytes), want %s %s (%d bytes)", r.Method, r.URI, len(r.Body), c.method, uri, len(c.body))
		}
		if r.Header.Get("Authorization") != "Basic "+base64Basic("hubuser", wdTestSecret) || r.Header.Get("X-Api-Key") != "api-"+wdTestSecret {
			t.Fatalf("credentials missing: %v", r.Header)
		}
		if c.body != "" && (r.Header.Get("Content-Length") == "" || r.Header.Get("Transfer-Encoding") != "") {
			t.Fatalf("not sent with its length: %v", r.Header)
		}
		var echoed struct {
			Value struct {
				URI  string `json:"uri"`
				Body string `json:"body"`
			} `json:"value"`
		}
		if err := json.Unmarshal(got, &echoed); err != nil || echoed.Value.URI != uri || echoed.Value.Body != c.body {
			t.Fatalf("answer %.200s (%v)", got, err)
		}
	}
	if n := f.Conns() - before; n != 0 {
		t.Fatalf("%d new connections for %d commands after the create: not kept alive", n, len(cases))
	}
	// A body of unknown length is read first, and sent with its length.
	resp, err := p.WebDriverCommand(context.Background(), s, "POST", "/url", "", CommandBody(io.MultiReader(strings.NewReader(`{"url":`), strings.NewReader(`"about:blank"}`)), -1))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	reqs := f.Requests()
	if r := reqs[len(reqs)-1]; string(r.Body) != `{"url":"about:blank"}` || r.Header.Get("Content-Length") != "21" {
		t.Fatalf("sent %q %v", r.Body, r.Header)
	}
	// One over MaxBufferedCommand is streamed on, chunked, intact.
	long := strings.Repeat(`{"x":"0123456789abcdef"}`, (3<<20)/24)
	resp, err = p.WebDriverCommand(context.Background(), s, "POST", "/se/file", "", CommandBody(io.MultiReader(strings.NewReader(long[:1<<20]), strings.NewReader(long[1<<20:])), -1))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	reqs = f.Requests()
	if r := reqs[len(reqs)-1]; string(r.Body) != long || r.ContentLength != -1 {
		t.Fatalf("sent %d bytes (of %d), length %d", len(r.Body), len(long), r.ContentLength)
	}
	// A provider's own answer, an error included, comes back as it is.
	resp, err = p.WebDriverCommand(context.Background(), &WebDriverSession{ID: "gone", header: s.header}, "GET", "/url", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !IsInvalidSessionAnswer(resp.StatusCode, b) {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
}

// TestWebDriverCommandRefused: what the gateway does not send on, and a
// provider out of reach, without naming a URL or a secret.
func TestWebDriverCommandRefused(t *testing.T) {
	f := fakes.NewWebDriver("")
	defer f.Close()
	p, s := wdSession(t, f, withSecrets)
	n := len(f.Requests())
	for _, rest := range []string{"/../other/url", "/..", "/%2e%2E/x", "/a%2F..%2Fb", "/./url", "url", "/url?x=1", "/url#f", "/a b", "/a\\..\\b", "/%zz"} {
		if _, err := p.WebDriverCommand(context.Background(), s, "GET", rest, "", nil); !errors.Is(err, ErrCommandPath) {
			t.Errorf("%q: %v", rest, err)
		}
	}
	if _, err := p.WebDriverCommand(context.Background(), s, "GET", "/url", "a=1#x", nil); !errors.Is(err, ErrCommandPath) {
		t.Errorf("query with a fragment: %v", err)
	}
	if _, err := p.WebDriverCommand(context.Background(), s, "get\r\n", "/url", "", nil); !errors.Is(err, ErrCommandPath) {
		t.Errorf("bad method: %v", err)
	}
	big := CommandBody(strings.NewReader("{}"), MaxWebDriverCommand+1)
	if _, err := p.WebDriverCommand(context.Background(), s, "POST", "/url", "", big); !errors.Is(err, ErrCommandTooLarge) {
		t.Errorf("too large: %v", err)
	}
	if got := len(f.Requests()); got != n {
		t.Fatalf("the provider heard %d of them", got-n)
	}
	// Of unknown length, it is streamed until it is too large: the
	// provider's request fails there.
	bigHeard := make(chan heard, 2)
	f.OnCommand = func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, "/big") {
			return false
		}
		n, err := io.Copy(io.Discard, r.Body)
		bigHeard <- heard{n, err}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		io.WriteString(w, `{"value":null}`)
		return true
	}
	endless := CommandBody(io.LimitReader(zeros{}, MaxWebDriverCommand+10), -1)
	if _, err := p.WebDriverCommand(context.Background(), s, "POST", "/big", "", endless); !errors.Is(err, ErrCommandTooLarge) {
		t.Errorf("too large, length unknown: %v", err)
	}
	if h := heardOf(t, bigHeard); h.err == nil || h.n > MaxWebDriverCommand {
		t.Fatalf("the provider read %d bytes (%v), want a body cut short", h.n, h.err)
	}
	// At the bound exactly, it goes.
	atBound := CommandBody(io.LimitReader(zeros{}, MaxWebDriverCommand), -1)
	resp, err := p.WebDriverCommand(context.Background(), s, "POST", "/big", "", atBound)
	if err != nil {
		t.Fatalf("at the bound: %v", err)
	}
	resp.Body.Close()
	if h := heardOf(t, bigHeard); h.err != nil || h.n != MaxWebDriverCommand {
		t.Fatalf("at the bound: the provider read %d bytes (%v)", h.n, h.err)
	}
	f.Close()
	_, err = p.WebDriverCommand(context.Background(), s, "GET", "/url", "", nil)
	var ce *CommandError
	if !errors.As(err, &ce) || ce.Word != WordRefused || err.Error() != `provider "wd" could not be reached (refused)` {
		t.Fatalf("unreachable: %v", err)
	}
	noSecret(t, "the error", err.Error())
}

// TestWebDriverCommandStreamed: a body of unknown length that goes on
// past MaxBufferedCommand reaches the provider as it comes, while the
// client still sends it: the gateway holds no more than
// MaxBufferedCommand of it. A body that breaks off fails the command as
// the client's, not the provider's.
func TestWebDriverCommandStreamed(t *testing.T) {
	f := fakes.NewWebDriver("")
	defer f.Close()
	var received atomic.Int64
	f.OnCommand = func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, "/se/file") {
			return false
		}
		h := sha256.New()
		n, err := io.Copy(io.MultiWriter(h, writerFunc(func(p []byte) { received.Add(int64(len(p))) })), r.Body)
		if err != nil {
			fakes.WriteError(w, http.StatusBadRequest, "invalid argument", err.Error())
			return true
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		json.NewEncoder(w).Encode(map[string]any{"value": map[string]any{"n": n, "sha256": hex.EncodeToString(h.Sum(nil)), "length": r.ContentLength}})
		return true
	}
	p, s := wdSession(t, f)
	pr, pw := io.Pipe()
	type answer struct {
		resp *http.Response
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := p.WebDriverCommand(context.Background(), s, "POST", "/se/file", "", CommandBody(pr, -1))
		done <- answer{resp, err}
	}()
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 4<<10) // 64 KiB
	sum := sha256.New()
	const sent = 4 << 20
	for range sent / len(chunk) {
		if _, err := pw.Write(chunk); err != nil {
			t.Fatal(err)
		}
		sum.Write(chunk)
	}
	// The body is not over, and the provider has all but what the
	// transports hold on the way.
	deadline := time.Now().Add(20 * time.Second)
	for received.Load() < sent-MaxBufferedCommand {
		if time.Now().After(deadline) {
			t.Fatalf("the provider received %d bytes of %d sent while the body goes on: not streamed", received.Load(), sent)
		}
		time.Sleep(20 * time.Millisecond)
	}
	pw.Close()
	a := <-done
	if a.err != nil {
		t.Fatal(a.err)
	}
	var got struct {
		Value struct {
			N      int64  `json:"n"`
			SHA256 string `json:"sha256"`
			Length int64  `json:"length"`
		} `json:"value"`
	}
	err := json.NewDecoder(a.resp.Body).Decode(&got)
	a.resp.Body.Close()
	if err != nil || got.Value.N != sent || got.Value.SHA256 != hex.EncodeToString(sum.Sum(nil)) || got.Value.Length != -1 {
		t.Fatalf("the provider got %+v (%v), want %d bytes, chunked", got.Value, err, sent)
	}
	// A body that breaks off is the client's failure.
	pr, pw = io.Pipe()
	go func() {
		pw.Write(bytes.Repeat([]byte("x"), 2<<20))
		pw.CloseWithError(io.ErrUnexpectedEOF)
	}()
	_, err = p.WebDriverCommand(context.Background(), s, "POST", "/se/file", "", CommandBody(pr, -1))
	var ce *CommandError
	if !errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ce) {
		t.Fatalf("a body cut short: %v", err)
	}
}

// heard is what a provider read of a body: n bytes, until err.
type heard struct {
	n   int64
	err error
}

// heardOf waits (up to 20 s) for what the provider read of a body.
func heardOf(t *testing.T, c <-chan heard) heard {
	t.Helper()
	select {
	case h := <-c:
		return h
	case <-time.After(20 * time.Second):
		t.Fatal("the provider heard no body")
		return heard{}
	}
}

type writerFunc func([]byte)

func (f writerFunc) Write(p []byte) (int, error) {
	f(p)
	return len(p), nil
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestWebDriverCommandProviderQuery: a provider URL's query goes with
// every call, its keys winning over the client's.
func TestWebDriverCommandProviderQuery(t *testing.T) {
	f := fakes.NewWebDriver("")
	defer f.Close()
	p, s := wdSession(t, f, func(c *Config) { c.URL += "?token=t1" })
	if r := f.Requests()[0]; r.URI != "/session?token=t1" {
		t.Fatalf("create %s", r.URI)
	}
	resp, err := p.WebDriverCommand(context.Background(), s, "GET", "/url", "token=mine&x=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	reqs := f.Requests()
	if r := reqs[len(reqs)-1]; r.URI != "/session/"+s.ID+"/url?token=t1&x=1" {
		t.Fatalf("command %s", r.URI)
	}
}

// TestWebDriverSocketFake: the socket goes to the provider's own URL
// with the provider's credentials, never the client's Authorization.
func TestWebDriverSocketFake(t *testing.T) {
	f := fakes.NewWebDriver("/wd/hub")
	defer f.Close()
	p, s := wdSession(t, f, withSecrets)
	hs := testHandshake()
	hs.Header.Set("Authorization", "Bearer client-token")
	res := p.WebDriverSocket(context.Background(), hs, s, false, nil)
	if res.Outcome.Kind != Success {
		t.Fatalf("outcome %+v", res.Outcome)
	}
	defer res.Conn.Close()
	if hs.Header.Get("Authorization") != "Bearer client-token" {
		t.Fatal("the client's handshake was changed")
	}
	reqs := f.Requests()
	r := reqs[len(reqs)-1]
	if r.URI != "/session/"+s.ID || r.Header.Get("Authorization") != "Basic "+base64Basic("hubuser", wdTestSecret) || r.Header.Get("X-Api-Key") == "" {
		t.Fatalf("socket request %s %v", r.URI, r.Header)
	}
	// One message, echoed.
	if _, err := res.Conn.Write(mkFrame(true, 1, []byte(`{"id":1}`), true, 0)); err != nil {
		t.Fatal(err)
	}
	res.Conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := readFrame(bufio.NewReader(io.MultiReader(bytes.NewReader(res.Conn.Leftover), res.Conn)))
	if err != nil || got.masked || string(got.payload) != `{"id":1}` {
		t.Fatalf("echo %+v %v", got, err)
	}
	// No CDP socket was given.
	if res := p.WebDriverSocket(context.Background(), testHandshake(), s, true, nil); res.Outcome.Word != WordBadConnectURL {
		t.Fatalf("CDP socket %+v", res.Outcome)
	}
}

// TestWebDriverProbe: a webdriver provider's health check GETs
// <base>/status and reads value.ready: false is full, not a failure.
func TestWebDriverProbe(t *testing.T) {
	f := fakes.NewWebDriver("/wd/hub")
	defer f.Close()
	p, _ := wdProvider(t, f.URL(), withSecrets)
	pr, err := p.NewProber(ProbeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	if !pr.ReadsCapacity() || !strings.HasSuffix(pr.Target(), "/wd/hub/status") {
		t.Fatalf("target %s, reads capacity %v", pr.Target(), pr.ReadsCapacity())
	}
	noSecret(t, "the target", pr.Target())
	res := pr.Probe(context.Background())
	if res.Outcome.Kind != Success || res.Pressure == nil || res.Pressure.Full() {
		t.Fatalf("ready: %+v %+v", res.Outcome, res.Pressure)
	}
	r := f.Requests()[0]
	if r.URI != "/wd/hub/status" || r.Header.Get("Authorization") == "" || r.Header.Get("X-Api-Key") == "" {
		t.Fatalf("probe %s %v", r.URI, r.Header)
	}
	f.Ready.Store(false)
	if res := pr.Probe(context.Background()); res.Outcome.Kind != Success || res.Pressure == nil || !res.Pressure.Full() {
		t.Fatalf("not ready: %+v %+v", res.Outcome, res.Pressure)
	}
	// A server that says so with 503 is full too; one that is not
	// WebDriver's is a failure, or unreadable.
	for _, tc := range []struct {
		status int
		body   string
		kind   Kind
		full   bool
		broken bool
	}{
		{503, `{"value":{"ready":false,"message":"busy"}}`, Success, true, false},
		{503, `{"value":{"ready":true}}`, Failure, false, false},
		{503, `oops`, Failure, false, false},
		{200, `{"ready":true}`, Success, false, true},
	} {
		s := fakes.Status("st", nil, tc.status, http.Header{"Content-Type": {"application/json"}}, tc.body)
		sp, _ := wdProvider(t, "http://"+s.Addr)
		pr, err := sp.NewProber(ProbeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		res := pr.Probe(context.Background())
		pr.Close()
		s.Close()
		if res.Outcome.Kind != tc.kind || (res.Pressure != nil && res.Pressure.Full()) != tc.full || (res.CapacityErr != nil) != tc.broken {
			t.Errorf("%d %s: %+v %+v %v", tc.status, tc.body, res.Outcome, res.Pressure, res.CapacityErr)
		}
	}
	// capacity webdriver may be asked of another provider too.
	if err := (&ProbeOptions{Capacity: CapacityWebDriver}).Validate(nil); err != nil {
		t.Fatal(err)
	}
	if err := (&ProbeOptions{Capacity: "grid"}).Validate(nil); err == nil || !strings.Contains(err.Error(), "want browserless or webdriver") {
		t.Fatalf("unknown capacity: %v", err)
	}
}
