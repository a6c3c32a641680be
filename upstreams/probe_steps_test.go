package upstreams

import (
	"bufio"
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// steps runs a probe in two steps, as a batch of probes does: Send, a wait
// for the answer to begin, Collect, and Finish when Collect cannot end it.
// collected tells whether Collect did.
func steps(t *testing.T, pr *Prober, ctx context.Context) (res ProbeResult, collected bool) {
	t.Helper()
	if !pr.Send(ctx) {
		t.Fatal("Send declined a probe on a kept connection")
	}
	pr.Await(5 * time.Second)
	if res, ok := pr.Collect(ctx); ok {
		return res, true
	}
	return pr.Finish(ctx), false
}

// TestProbeStepsLikeProbe: a probe run in two steps sends the same request
// on the kept connection and ends as Probe would: the status decides, the
// capacity is read from the body, and Elapsed runs from the request.
func TestProbeStepsLikeProbe(t *testing.T) {
	status := atomic.Int64{}
	status.Store(200)
	body := atomic.Value{}
	body.Store(`{"pressure":{"running":3,"maxConcurrent":5,"queued":2,"isAvailable":true}}`)
	ps := newProbeServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(int(status.Load()))
		fmt.Fprint(w, body.Load().(string))
	})
	pr, _ := probedProvider(t, Options{URL: "ws" + strings.TrimPrefix(ps.URL, "http") + "/?token=T"}).NewProber(ProbeOptions{Capacity: CapacityBrowserless})
	defer pr.Close()
	if pr.Send(context.Background()) {
		t.Fatal("Send took a probe with no connection to send it on")
	}
	if r := probeOnce(t, pr); r.Outcome.Kind != Success {
		t.Fatalf("first probe: %+v", r)
	}
	first := ps.last()
	collected := 0
	for i := range 20 {
		r, c := steps(t, pr, context.Background())
		if c {
			collected++
		}
		if r.Outcome.Kind != Success || r.Outcome.Word != WordOK || r.Outcome.Elapsed <= 0 ||
			r.Pressure == nil || *r.Pressure != (Pressure{Running: 3, MaxConcurrent: 5, Queued: 2, IsAvailable: true}) {
			t.Fatalf("probe %d: %+v %+v", i, r, r.Pressure)
		}
	}
	if collected == 0 {
		t.Fatal("Collect never ended a probe whose answer had come")
	}
	got := ps.last()
	if got.URL.String() != first.URL.String() || got.Header.Get("User-Agent") != first.Header.Get("User-Agent") || got.Method != http.MethodGet {
		t.Fatalf("two steps sent %s %s, Probe %s %s", got.Method, got.URL, first.Method, first.URL)
	}
	if n := ps.conns.Load(); n != 1 {
		t.Fatalf("%d connections, want the kept one", n)
	}
	for _, st := range []int{503, 404} {
		status.Store(int64(st))
		if r, _ := steps(t, pr, context.Background()); r.Outcome.Kind != Failure || r.Outcome.Word != StatusWord(st) || r.Pressure != nil {
			t.Fatalf("%d: %+v", st, r)
		}
	}
	status.Store(200)
	body.Store(`<html>`)
	if r, _ := steps(t, pr, context.Background()); r.Outcome.Kind != Success || r.Pressure != nil || r.CapacityErr == nil {
		t.Fatalf("unreadable capacity: %+v", r)
	}
}

// TestProbeStepsWaitForAnswer: an answer not there yet, or there only in
// part, is left to Finish, which reads it whole.
func TestProbeStepsWaitForAnswer(t *testing.T) {
	var n atomic.Int64
	release := make(chan struct{})
	full := `{"pressure":{"running":1,"maxConcurrent":4,"queued":0,"isAvailable":false}}`
	var late atomic.Bool
	ps := newProbeServer(t, func(w http.ResponseWriter, r *http.Request) {
		if late.Swap(false) {
			<-release
			fmt.Fprint(w, full)
			return
		}
		switch n.Add(1) {
		case 2: // late
			<-release
			fmt.Fprint(w, full)
		case 3: // the head and part of the body, then the rest
			w.Header().Set("Content-Length", strconv.Itoa(len(full)))
			fmt.Fprint(w, full[:25])
			w.(http.Flusher).Flush()
			<-release
			fmt.Fprint(w, full[25:])
		default:
			fmt.Fprint(w, full)
		}
	})
	pr, _ := probedProvider(t, Options{URL: ps.URL}).NewProber(ProbeOptions{Capacity: CapacityBrowserless, Timeout: 5 * time.Second})
	defer pr.Close()
	probeOnce(t, pr)

	ctx := context.Background()
	var ok bool
	if !pr.Send(ctx) {
		t.Fatal("Send declined")
	}
	if _, ok := pr.Collect(ctx); ok {
		t.Fatal("Collect ended a probe with no answer yet")
	}
	if pr.Await(20 * time.Millisecond) {
		t.Fatal("Await saw an answer that had not come")
	}
	time.AfterFunc(50*time.Millisecond, func() { release <- struct{}{} })
	r := pr.Finish(ctx)
	if r.Outcome.Kind != Success || r.Pressure == nil || !r.Pressure.Full() || r.Outcome.Elapsed < 50*time.Millisecond {
		t.Fatalf("late answer: %+v %+v", r, r.Pressure)
	}

	if !pr.Send(ctx) {
		t.Fatal("Send declined")
	}
	if !pr.Await(5 * time.Second) {
		t.Fatal("Await saw nothing of an answer begun")
	}
	if _, ok := pr.Collect(ctx); ok {
		t.Fatal("Collect ended a probe whose body had not all come")
	}
	time.AfterFunc(20*time.Millisecond, func() { release <- struct{}{} })
	r = pr.Finish(ctx)
	if r.Outcome.Kind != Success || r.Pressure == nil || *r.Pressure != (Pressure{Running: 1, MaxConcurrent: 4}) {
		t.Fatalf("answer in two parts: %+v %+v (%v)", r, r.Pressure, r.CapacityErr)
	}
	if r, collected := steps(t, pr, ctx); r.Outcome.Kind != Success || !collected {
		t.Fatalf("after: %+v, collected %v", r, collected)
	}
	// An answer read without waiting leaves the connection quiet (its
	// answers wake no poller thread); a late answer after that is still
	// waited for, by Await, Finish or Probe, and not taken for a timeout.
	for i, how := range []string{"await", "finish", "probe"} {
		if r, collected := steps(t, pr, ctx); r.Outcome.Kind != Success || !collected {
			t.Fatalf("%s: the answer before: %+v, collected %v", how, r, collected)
		}
		late.Store(true) // the next answer is late
		time.AfterFunc(50*time.Millisecond, func() { release <- struct{}{} })
		start := time.Now()
		switch how {
		case "await":
			if !pr.Send(ctx) || !pr.Await(5*time.Second) {
				t.Fatal("Await missed a late answer on a quiet connection")
			}
			if r, ok = pr.Collect(ctx); !ok {
				r = pr.Finish(ctx)
			}
		case "finish":
			if !pr.Send(ctx) {
				t.Fatal("Send declined")
			}
			r = pr.Finish(ctx)
		case "probe":
			r = probeOnce(t, pr)
		}
		if r.Outcome.Kind != Success || time.Since(start) > 4*time.Second {
			t.Fatalf("%d %s: late answer on a quiet connection: %+v after %v", i, how, r, time.Since(start))
		}
	}
	if c := ps.conns.Load(); c != 1 {
		t.Fatalf("%d connections, want the kept one", c)
	}
}

// TestProbeStepsTimeoutAndCalledOff: an answer that never comes is a
// timeout within the probe's timeout, counted from Send; calling the probes
// off ends a probe in two steps at once, saying nothing.
func TestProbeStepsTimeoutAndCalledOff(t *testing.T) {
	var n atomic.Int64
	hang := make(chan struct{})
	defer close(hang)
	ps := newProbeServer(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) > 1 {
			select {
			case <-hang:
			case <-r.Context().Done():
			}
			return
		}
		fmt.Fprint(w, "ok")
	})
	p := probedProvider(t, Options{URL: ps.URL})
	pr, _ := p.NewProber(ProbeOptions{Timeout: 200 * time.Millisecond})
	defer pr.Close()
	probeOnce(t, pr)
	start := time.Now()
	r, _ := steps(t, pr, context.Background())
	if r.Outcome.Word != WordTimeout || time.Since(start) < 200*time.Millisecond || time.Since(start) > 5*time.Second {
		t.Fatalf("hang: %+v after %v", r, time.Since(start))
	}

	n.Store(0)
	pr2, _ := p.NewProber(ProbeOptions{Timeout: 10 * time.Second})
	defer pr2.Close()
	probeOnce(t, pr2)
	ctx, cancel := context.WithCancel(context.Background())
	if !pr2.Send(ctx) {
		t.Fatal("Send declined")
	}
	cancel()
	pr2.Await(5 * time.Second)
	start = time.Now()
	if r := pr2.Finish(ctx); r.Outcome.Kind != ClientGone || time.Since(start) > 5*time.Second {
		t.Fatalf("called off: %+v after %v", r, time.Since(start))
	}
}

// TestProbeStepsDecline: Send leaves to Probe what it cannot run in two
// steps: no connection yet, a TLS one, a closed prober (which keeps no
// connection from then on); a kept connection the provider dropped is
// replaced as Probe would.
func TestProbeStepsDecline(t *testing.T) {
	ps := newProbeServer(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	pr, _ := probedProvider(t, Options{URL: ps.URL}).NewProber(ProbeOptions{})
	probeOnce(t, pr)
	// The provider drops the idle connection: the probe still passes, on
	// a fresh one.
	ps.CloseClientConnections()
	time.Sleep(20 * time.Millisecond)
	var r ProbeResult
	if pr.Send(context.Background()) {
		pr.Await(5 * time.Second)
		var ok bool
		if r, ok = pr.Collect(context.Background()); !ok {
			r = pr.Finish(context.Background())
		}
	} else {
		r = probeOnce(t, pr)
	}
	if r.Outcome.Kind != Success || ps.conns.Load() != 2 {
		t.Fatalf("after the provider dropped the kept connection: %+v, %d connections", r, ps.conns.Load())
	}
	pr.Close()
	if pr.Send(context.Background()) {
		t.Fatal("Send after Close")
	}
	for range 2 {
		if r := probeOnce(t, pr); r.Outcome.Kind != Success {
			t.Fatalf("probe after Close: %+v", r)
		}
	}
	if n := ps.conns.Load(); n != 4 {
		t.Fatalf("%d connections: a closed prober kept one", n)
	}

	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	defer ts.Close()
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	prt, _ := probedProvider(t, Options{URL: "wss" + strings.TrimPrefix(ts.URL, "https") + "/", TLS: TLSOptions{TrustedCACertFiles: []string{caFile}}}).NewProber(ProbeOptions{URI: "/json/version"})
	defer prt.Close()
	if r := probeOnce(t, prt); r.Outcome.Kind != Success {
		t.Fatalf("TLS probe: %+v", r)
	}
	if prt.Send(context.Background()) {
		t.Fatal("Send took a probe on a TLS connection")
	}
}

// TestProbeStepsCloseWaits: Close waits for a probe sent and not yet
// ended.
func TestProbeStepsCloseWaits(t *testing.T) {
	ps := newProbeServer(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	pr, _ := probedProvider(t, Options{URL: ps.URL}).NewProber(ProbeOptions{})
	probeOnce(t, pr)
	if !pr.Send(context.Background()) {
		t.Fatal("Send declined")
	}
	closed := make(chan struct{})
	go func() { pr.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close did not wait for the probe in flight")
	case <-time.After(50 * time.Millisecond):
	}
	pr.Await(5 * time.Second)
	if _, ok := pr.Collect(context.Background()); !ok {
		pr.Finish(context.Background())
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return once the probe ended")
	}
}

// TestProbeStepsChromeHost: Chrome's refusal of the Host header read by
// Collect is left to Finish, which sends the dialed address instead, as
// Probe does.
func TestProbeStepsChromeHost(t *testing.T) {
	var refuse atomic.Bool
	ps := newProbeServer(t, func(w http.ResponseWriter, r *http.Request) {
		if h, _, _ := strings.Cut(r.Host, ":"); refuse.Load() && h == "localhost" {
			w.WriteHeader(500)
			fmt.Fprint(w, "Host header is specified and is not an IP address or localhost.")
			return
		}
		fmt.Fprint(w, `{"Browser":"x"}`)
	})
	_, port, _ := strings.Cut(strings.TrimPrefix(ps.URL, "http://"), ":")
	pr, _ := probedProvider(t, Options{URL: "http://localhost:" + port}).NewProber(ProbeOptions{})
	defer pr.Close()
	probeOnce(t, pr)
	refuse.Store(true)
	if r, collected := steps(t, pr, context.Background()); r.Outcome.Kind != Success || collected {
		t.Fatalf("refused Host: %+v, collected %v", r, collected)
	}
	if r, _ := steps(t, pr, context.Background()); r.Outcome.Kind != Success {
		t.Fatalf("after: %+v", r)
	}
	if h := ps.last().Host; strings.HasPrefix(h, "localhost") {
		t.Fatalf("Host %q after the refusal", h)
	}
}

// TestWholeAnswer: an answer read where it lies says what readExchange
// says of the same bytes, or leaves them to it.
func TestWholeAnswer(t *testing.T) {
	for _, tc := range []struct {
		raw   string
		whole bool
	}{
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true},
		{"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\nbusy", true},
		{"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", true},
		{"HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\nContent-Length: 2\r\n\r\nok", true},
		{"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", true},
		{"HTTP/1.1 204 No Content\r\n\r\n", true},
		{"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n", true},
		{"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", true},
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\no", false},      // part of the body
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP", false}, // more than the answer
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n", false},           // part of the head
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", false},
		{"HTTP/1.1 200 OK\r\n\r\nuntil the end", false},           // no length
		{"HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\nok", false}, // malformed
		{"HTTP/1.1 200 OK\r\nBad Field: x\r\nContent-Length: 2\r\n\r\nok", false},
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok", false},
	} {
		a, body, keep, ok := wholeAnswer([]byte(tc.raw))
		if ok != tc.whole {
			t.Errorf("%q: whole %v, want %v", tc.raw, ok, tc.whole)
			continue
		}
		if !ok {
			continue
		}
		pr := &Prober{br: bufio.NewReader(strings.NewReader(tc.raw))}
		wa, wbody, wkeep, err := pr.readExchange()
		if err != nil || a != wa || !bytes.Equal(body, wbody) || keep != wkeep {
			t.Errorf("%q: %+v %q keep %v; readExchange %+v %q keep %v (%v)", tc.raw, a, body, keep, wa, wbody, wkeep, err)
		}
	}
}
