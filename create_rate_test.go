package browserfailover_test

// create_rate through a real Caddy: the starts over the cap wait in the
// queue (skipped as rate, not failed) and are served once the sliding
// window admits them; without a queue they get 503 listing rate. An
// attempt the provider refused with a 4xx started nothing, and its start
// is given back.

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// TestCreateRateQueues: with create_rate 2 per second and the queue on,
// three clients at once are all served, and the provider is asked for
// three sessions, no more: two at once, the third after it waited in the
// queue (its attempts list rate before ok). Nothing counts as a failure.
func TestCreateRateQueues(t *testing.T) {
	echo := fakes.Echo("cr-echo", nil)
	defer echo.Close()
	g := testgw.Start(t, handler(`"queue":{"size":10,"timeout":"20s"}`,
		provider("cr-echo", echo.URL(), `"create_rate":{"n":2,"per":"second"}`)))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var results []<-chan dialResult
	for range 3 {
		results = append(results, dialAsync(ctx, g.WS("/")))
	}
	for i, ch := range results {
		r := receive(t, ch, 25*time.Second, "client "+strconv.Itoa(i+1))
		if r.err != nil {
			t.Fatalf("client %d: %d %v", i+1, r.status, r.err)
		}
		r.conn.Close(websocket.StatusNormalClosure, "")
	}
	if echo.Hits.Load() != 3 {
		t.Fatalf("the provider was asked for %d sessions, want 3", echo.Hits.Load())
	}
	// Two went straight through; one was skipped as rate, waited, and got
	// its session at the provider.
	testgw.Eventually(t, 5*time.Second, "three sessions ended", func() bool { return len(g.LogEntries("session ended")) == 3 })
	straight, waited := 0, 0
	for _, e := range g.LogEntries("session ended") {
		w := attemptWords(e)
		switch {
		case slices.Equal(w, []string{"cr-echo:ok"}):
			straight++
		case len(w) >= 2 && w[len(w)-1] == "cr-echo:ok" && !slices.ContainsFunc(w[:len(w)-1], func(s string) bool { return s != "cr-echo:"+upstreams.WordRate }):
			waited++
		default:
			t.Errorf("a session's attempts: %v", w)
		}
	}
	if straight != 2 || waited != 1 {
		t.Fatalf("%d served at once and %d after waiting, want 2 and 1", straight, waited)
	}
	p := providerStatus(t, g, "cr-echo")
	if !p.Healthy || p.Failures != 0 || p.CooldownUntil != nil {
		t.Fatalf("a rate skip counted against the provider: %+v", p)
	}
	if p.CreateRate == nil || p.CreateRate.N != 2 || p.CreateRate.Per != "second" || p.CreateRate.Used > 2 {
		t.Fatalf("status create_rate: %+v", p.CreateRate)
	}
}

// TestCreateRateWithoutQueue: with queue size 0 the start over the cap is
// answered 503 at once, its attempts listing rate and its Retry-After when
// the window admits one again (within the minute); the provider is not
// contacted for it and stays healthy.
func TestCreateRateWithoutQueue(t *testing.T) {
	echo := fakes.Echo("cr0-echo", nil)
	defer echo.Close()
	g := testgw.Start(t, handler(`"queue":{"size":0}`,
		provider("cr0-echo", echo.URL(), `"create_rate":{"n":2,"per":"minute"}`)))
	for i := range 2 {
		c, _, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatalf("session %d: %v", i+1, err)
		}
		c.Close(websocket.StatusNormalClosure, "")
	}
	// Ended sessions still count: the cap is on starts, not live ones.
	r := refusedForRate(t, g, "cr0-echo")
	if r.Body.RetryAfterS < 1 || r.Body.RetryAfterS > 60 || r.RetryAfter != strconv.Itoa(r.Body.RetryAfterS) {
		t.Fatalf("Retry-After %q, retry_after_s %d: want within the minute", r.RetryAfter, r.Body.RetryAfterS)
	}
	if echo.Hits.Load() != 2 {
		t.Fatalf("the provider was asked for %d sessions, want 2", echo.Hits.Load())
	}
	p := providerStatus(t, g, "cr0-echo")
	if !p.Healthy || p.Failures != 0 || p.Attempts != 2 || p.CreateRate == nil || p.CreateRate.Used != 2 {
		t.Fatalf("status after the refusal: %+v %+v", p, p.CreateRate)
	}
	// A reload that raises the cap applies it to the same window: one
	// more start now, then refused again.
	if err := g.Reload(handler(`"queue":{"size":0}`,
		provider("cr0-echo", echo.URL(), `"create_rate":{"n":3,"per":"minute"}`))); err != nil {
		t.Fatal(err)
	}
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatalf("after raising the cap: %v", err)
	}
	c.Close(websocket.StatusNormalClosure, "")
	refusedForRate(t, g, "cr0-echo")
}

// refusedForRate dials through g and wants a 503 whose only attempt is
// provider skipped as rate.
func refusedForRate(t *testing.T, g *testgw.Gateway, provider string) *rejection {
	t.Helper()
	c, resp, err := dial(t, g.WS("/"), nil)
	if err == nil {
		c.Close(websocket.StatusNormalClosure, "")
		t.Fatal("a session was started over the create_rate")
	}
	if resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("over the create_rate: %v %v", resp, err)
	}
	r := &rejection{Status: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After")}
	b, _ := io.ReadAll(resp.Body)
	r.Raw = string(b)
	if err := json.Unmarshal(b, &r.Body); err != nil {
		t.Fatalf("503 body %q: %v", b, err)
	}
	if w := r.words(); !slices.Equal(w, []string{provider + ":" + upstreams.WordRate}) {
		t.Fatalf("attempts %v: %s", w, b)
	}
	return r
}

// TestCreateRateGivenBackOn4xx: attempts a provider refused with a 4xx
// started nothing, so they leave its create_rate window as they found it.
// With create_rate 2 per minute: a WebSocket provider that answers 400 to
// three upgrades (relayed to their clients), then serves two sessions; a
// session API provider whose create answers 400 twice, then serves two.
// In both cases a third session is refused as rate: the starts that
// counted are the sessions'.
func TestCreateRateGivenBackOn4xx(t *testing.T) {
	ws := refusingEcho(t)
	rest := fakes.NewREST(nil)
	defer rest.Close()
	rest.Connect = func(string) string { return ws.url }
	var refuseCreates atomic.Int32
	refuseCreates.Store(2)
	rest.OnCreate = func(w http.ResponseWriter, r *http.Request) bool {
		if refuseCreates.Add(-1) < 0 {
			return false
		}
		http.Error(w, `{"error":"projectId unknown"}`, http.StatusBadRequest)
		return true
	}
	rate := `"create_rate":{"n":2,"per":"minute"}`
	g := testgw.Start(t, handler(`"queue":{"size":0}`, provider("cr4-ws", ws.url, rate+`,"pass_query":true`)))
	for i := range 3 {
		c, resp, err := dial(t, g.WS("/?refuse=1"), nil)
		if err == nil {
			c.Close(websocket.StatusNormalClosure, "")
		}
		if resp == nil || resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("refused upgrade %d: %v %v", i+1, resp, err)
		}
	}
	for i := range 2 {
		c, _, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatalf("session %d after three 400s: %v", i+1, err)
		}
		c.Close(websocket.StatusNormalClosure, "")
	}
	refusedForRate(t, g, "cr4-ws")
	if p := providerStatus(t, g, "cr4-ws"); p.CreateRate == nil || p.CreateRate.Used != 2 || p.Failures != 0 {
		t.Fatalf("status: %+v %+v", p, p.CreateRate)
	}

	if err := g.Reload(handler(`"queue":{"size":0}`, apiProvider("cr4-api", rest, rate))); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		c, resp, err := dial(t, g.WS("/"), nil)
		if err == nil {
			c.Close(websocket.StatusNormalClosure, "")
			t.Fatalf("create %d answered 400, yet a session", i+1)
		}
		r := &rejection{}
		if resp != nil {
			b, _ := io.ReadAll(resp.Body)
			json.Unmarshal(b, &r.Body)
		}
		if w := r.words(); !slices.Equal(w, []string{"cr4-api:" + upstreams.WordCreateFailed}) {
			t.Fatalf("create %d answered 400: %v %v", i+1, w, err)
		}
	}
	for i := range 2 {
		c, _, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatalf("session %d after two creates answered 400: %v", i+1, err)
		}
		c.Close(websocket.StatusNormalClosure, "")
	}
	refusedForRate(t, g, "cr4-api")
}

// refusingServer is a CDP-like WebSocket server that echoes, and answers
// 400 to an upgrade with a query item refuse.
type refusingServer struct {
	url  string
	hits atomic.Int64
}

func refusingEcho(t *testing.T) *refusingServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &refusingServer{url: "ws://" + ln.Addr().String() + "/devtools/browser/x"}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		if r.URL.Query().Has("refuse") {
			http.Error(w, "unknown option", http.StatusBadRequest)
			return
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		fakes.EchoMessages(c)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return s
}
