package browserfailover_test

// End-to-end tests of the routing rules with fake providers:
// protocol-aware pools (CDP clients never reach Playwright servers and the
// other way round, exact Playwright versions first, 502 when nothing could
// ever serve) and per-client quotas (client_limit, waiting per key or 429).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/status"
)

// playwrightHeaders is what chromium.connect() of Playwright v sends
// (besides the WebSocket headers).
func playwrightHeaders(v string) http.Header {
	return http.Header{
		"User-Agent":           {"Playwright/" + v + " (x64; debian 12) node/20.20"},
		"X-Playwright-Browser": {"chromium"},
	}
}

// landed dials with header and returns which fake provider served it.
func landed(t *testing.T, g *testgw.Gateway, contacts *fakes.Contacts, header http.Header) string {
	t.Helper()
	contacts.Reset()
	c, resp, err := dial(t, g.WS("/"), &websocket.DialOptions{HTTPHeader: header})
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial: %v (status %d)", err, status)
	}
	defer c.Close(websocket.StatusNormalClosure, "")
	echoOnce(t, c, []byte("hi"))
	list := contacts.List()
	if len(list) == 0 {
		t.Fatal("no provider contacted")
	}
	return list[len(list)-1]
}

// TestProtocolPools: each client lands only on providers of its protocol,
// a Playwright client on its exact version first, whatever the priorities.
func TestProtocolPools(t *testing.T) {
	contacts := &fakes.Contacts{}
	pwAny := fakes.Echo("rt-pw-any", contacts)
	defer pwAny.Close()
	pw165 := fakes.Echo("rt-pw-165", contacts)
	defer pw165.Close()
	cdp := fakes.Echo("rt-cdp", contacts)
	defer cdp.Close()
	g := testgw.Start(t, handler("",
		provider("rt-pw-any", pwAny.URL(), `"priority":1,"protocol":"playwright"`),
		provider("rt-pw-165", pw165.URL(), `"priority":2,"protocol":"playwright","playwright_version":"1.65"`),
		provider("rt-cdp", cdp.URL(), `"priority":3,"protocol":"cdp"`),
	))

	// A CDP client (no x-playwright-browser), even with a Playwright
	// User-Agent as connectOverCDP sends: only the CDP provider.
	if got := landed(t, g, contacts, nil); got != "rt-cdp" {
		t.Fatalf("CDP client landed on %s", got)
	}
	if got := landed(t, g, contacts, http.Header{"User-Agent": {"Playwright/1.65.1 (x64; debian 12) node/20.20"}}); got != "rt-cdp" {
		t.Fatalf("connectOverCDP-like client landed on %s", got)
	}
	if n := len(contacts.List()); n != 1 {
		t.Fatalf("a CDP client contacted %v", contacts.List())
	}
	// Playwright 1.65: its exact version before the any-version server.
	if got := landed(t, g, contacts, playwrightHeaders("1.65.1")); got != "rt-pw-165" {
		t.Fatalf("Playwright 1.65 client landed on %s", got)
	}
	if l := contacts.List(); len(l) != 1 {
		t.Fatalf("Playwright 1.65 client contacted %v", l)
	}
	// Playwright 1.64: the 1.65 server can never serve it.
	if got := landed(t, g, contacts, playwrightHeaders("1.64.0")); got != "rt-pw-any" {
		t.Fatalf("Playwright 1.64 client landed on %s", got)
	}
	// When the exact version is full, the any-version server takes it.
	pw165.Close()
	if got := landed(t, g, contacts, playwrightHeaders("1.65.1")); got != "rt-pw-any" {
		t.Fatalf("Playwright 1.65 client with its server down landed on %s", got)
	}
	if l := contacts.List(); len(l) != 1 || l[0] != "rt-pw-any" {
		// The closed fake refuses before it can note a contact.
		t.Fatalf("contacts %v", l)
	}
}

// TestNoProviderCouldServe502: a Playwright client in front of CDP-only
// providers gets 502 with a JSON error at once, queue or not, and no
// provider is contacted; the rejection is logged with status 502.
func TestNoProviderCouldServe502(t *testing.T) {
	contacts := &fakes.Contacts{}
	cdp := fakes.Echo("rt502-cdp", contacts)
	defer cdp.Close()
	g := testgw.Start(t, handler(`"queue":{"size":10,"timeout":"20s"}`,
		provider("rt502-cdp", cdp.URL(), `"protocol":"cdp"`)))
	start := time.Now()
	_, resp, err := dial(t, g.WS("/"), &websocket.DialOptions{HTTPHeader: playwrightHeaders("1.65.1")})
	if err == nil || resp == nil || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("want 502, got %v %v", resp, err)
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Fatalf("the client waited %v", waited)
	}
	var body map[string]any
	b, _ := io.ReadAll(resp.Body)
	if json.Unmarshal(b, &body) != nil || body["error"] == "" || body["error"] == nil {
		t.Fatalf("body %q", b)
	}
	if l := contacts.List(); len(l) != 0 {
		t.Fatalf("contacted %v", l)
	}
	testgw.Eventually(t, 5*time.Second, "a rejected entry with status 502", func() bool {
		for _, e := range g.LogEntries("rejected") {
			if e["status"] == float64(502) {
				return true
			}
		}
		return false
	})
	// A CDP client is served as usual.
	if got := landed(t, g, contacts, nil); got != "rt502-cdp" {
		t.Fatalf("CDP client landed on %s", got)
	}
}

// keyedEcho is a provider that echoes and tracks live sessions per
// X-Api-Key value (forwarded by forward_headers X-Api-Key). A "bye"
// message makes it drop the session from its count and then close with
// 1000: the count falls before the close frame leaves, so a gateway that
// frees the client's slot only once the upstream is closed can never make
// it overlap a later session of the same key. (A close started by the
// client would race: the provider answers the close before it returns.)
type keyedEcho struct {
	addr string
	mu   sync.Mutex
	live map[string]int
	peak map[string]int
	srv  *http.Server
}

func startKeyedEcho(t *testing.T) *keyedEcho {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	k := &keyedEcho{addr: ln.Addr().String(), live: map[string]int{}, peak: map[string]int{}}
	k.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-Api-Key")
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		k.mu.Lock()
		k.live[key]++
		if k.live[key] > k.peak[key] {
			k.peak[key] = k.live[key]
		}
		k.mu.Unlock()
		var once sync.Once
		gone := func() {
			once.Do(func() {
				k.mu.Lock()
				k.live[key]--
				k.mu.Unlock()
			})
		}
		defer gone()
		ctx := r.Context()
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				return
			}
			if string(msg) == "bye" {
				gone()
				c.Close(websocket.StatusNormalClosure, "bye")
				return
			}
			if err := c.Write(ctx, typ, msg); err != nil {
				return
			}
		}
	})}
	go k.srv.Serve(ln)
	t.Cleanup(func() { k.srv.Close() })
	return k
}

func (k *keyedEcho) peakOf(key string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.peak[key]
}

const apiKeyTemplate = "{http.request.header.X-Api-Key}"

// TestClientLimitWaitsPerKey: two keys, limit 2, each opening 5 sessions
// at once: never more than 2 live per key at the provider or in the
// gateway's count, the rest wait and are all served in the end, and every
// count goes back to 0.
func TestClientLimitWaitsPerKey(t *testing.T) {
	up := startKeyedEcho(t)
	g := testgw.Start(t, handler(`"forward_headers":["X-Api-Key"],"client_limit":{"key":"`+apiKeyTemplate+`","limit":2},"queue":{"size":20,"timeout":"30s"}`,
		provider("cl-echo", "ws://"+up.addr+"/", "")))
	keys := []string{"team-a-key-0001", "team-b-key-0002"}
	var overLimit atomic.Bool
	stop := make(chan struct{})
	var watch sync.WaitGroup
	watch.Add(1)
	go func() {
		defer watch.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			for _, k := range keys {
				if pool.Current().Quotas.Active(pool.QuotaKey{Template: apiKeyTemplate, Value: k}) > 2 {
					overLimit.Store(true)
				}
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for _, key := range keys {
		for i := range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				c, resp, err := websocket.Dial(ctx, g.WS("/"), &websocket.DialOptions{HTTPHeader: http.Header{"X-Api-Key": {key}}})
				if err != nil {
					status := 0
					if resp != nil {
						status = resp.StatusCode
					}
					errs <- fmt.Errorf("%s #%d: %v (status %d)", key, i, err, status)
					return
				}
				// Hold the session a little, so the others must wait.
				time.Sleep(150 * time.Millisecond)
				if err := c.Write(ctx, websocket.MessageText, []byte("x")); err != nil {
					errs <- err
				} else if _, _, err := c.Read(ctx); err != nil {
					errs <- err
				}
				// The provider ends the session (see keyedEcho).
				if err := c.Write(ctx, websocket.MessageText, []byte("bye")); err != nil {
					errs <- err
				} else if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
					errs <- fmt.Errorf("%s #%d: want the provider's close 1000, got %v", key, i, err)
				}
				c.CloseNow()
			}()
		}
	}
	wg.Wait()
	close(stop)
	watch.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if overLimit.Load() {
		t.Error("the gateway counted more than 2 live sessions for a key")
	}
	t.Logf("sessions at once at the provider: %s %d, %s %d (limit 2)", keys[0], up.peakOf(keys[0]), keys[1], up.peakOf(keys[1]))
	for _, k := range keys {
		if p := up.peakOf(k); p > 2 || p < 1 {
			t.Errorf("key %s: %d sessions at once at the provider", k, p)
		}
	}
	testgw.Eventually(t, 10*time.Second, "quota counts back to 0", func() bool {
		return len(pool.Current().Quotas.Counts()) == 0 && active("cl-echo") == 0
	})
}

// TestClientLimit429: with the queue off, a key over its limit gets 429
// with Retry-After and a JSON body, while another key is served; the
// status JSON shows the key hashed, never its value.
func TestClientLimit429(t *testing.T) {
	up := startKeyedEcho(t)
	g := testgw.Start(t, handler(`"forward_headers":["X-Api-Key"],"client_limit":{"key":"`+apiKeyTemplate+`","limit":2},"queue":{"size":0}`,
		provider("cl429-echo", "ws://"+up.addr+"/", "")))
	a := http.Header{"X-Api-Key": {"sk-team-a-secret-777"}}
	b := http.Header{"X-Api-Key": {"sk-team-b-secret-888"}}
	for range 2 {
		c, _, err := dial(t, g.WS("/"), &websocket.DialOptions{HTTPHeader: a})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
	}
	_, resp, err := dial(t, g.WS("/"), &websocket.DialOptions{HTTPHeader: a})
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third session of a key: want 429, got %v %v", resp, err)
	}
	if resp.Header.Get("Retry-After") == "" {
		t.Fatal("429 without Retry-After")
	}
	var body map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if json.Unmarshal(raw, &body) != nil || body["error"] == nil {
		t.Fatalf("429 body %q", raw)
	}
	cb, _, err := dial(t, g.WS("/"), &websocket.DialOptions{HTTPHeader: b})
	if err != nil {
		t.Fatalf("another key was held back: %v", err)
	}
	defer cb.CloseNow()

	_, st := opAdmin(t, g, http.MethodGet, "/browser_failover/status")
	var doc struct {
		Clients []status.Client `json:"clients"`
	}
	if err := json.Unmarshal(st, &doc); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{pool.Current().Hashes.ShownKey("sk-team-a-secret-777"): 2, pool.Current().Hashes.ShownKey("sk-team-b-secret-888"): 1}
	if len(doc.Clients) != 2 {
		t.Fatalf("clients %s", st)
	}
	for _, c := range doc.Clients {
		if want[c.Key] != c.Active {
			t.Fatalf("clients %s", st)
		}
	}
	for _, secret := range []string{"sk-team-a-secret-777", "sk-team-b-secret-888"} {
		if bytesContain(st, secret) || bytesContain([]byte(g.Logs()), secret) {
			t.Fatalf("a raw key leaked into status or logs")
		}
	}
}

// TestClientLimitOtherKeysPass: a waiter held back only by its own key's
// limit does not hold back other keys, though the queue is FIFO within a
// key.
func TestClientLimitOtherKeysPass(t *testing.T) {
	up := startKeyedEcho(t)
	g := testgw.Start(t, handler(`"forward_headers":["X-Api-Key"],"client_limit":{"key":"`+apiKeyTemplate+`","limit":1},"queue":{"size":10,"timeout":"20s"}`,
		provider("clo-echo", "ws://"+up.addr+"/", "")))
	a := http.Header{"X-Api-Key": {"key-a"}}
	held, _, err := dial(t, g.WS("/"), &websocket.DialOptions{HTTPHeader: a})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waiterA := make(chan error, 1)
	go func() {
		c, _, err := websocket.Dial(ctx, g.WS("/"), &websocket.DialOptions{HTTPHeader: a})
		if err == nil {
			c.CloseNow()
		}
		waiterA <- err
	}()
	testgw.Eventually(t, 10*time.Second, "key-a's second client waiting", func() bool {
		for _, c := range pool.Current().Quotas.Counts() {
			if c.Key == pool.Current().Hashes.ShownKey("key-a") && c.Waiting == 1 {
				return true
			}
		}
		return false
	})
	// Key b goes straight through while key a waits.
	cb, _, err := dial(t, g.WS("/"), &websocket.DialOptions{HTTPHeader: http.Header{"X-Api-Key": {"key-b"}}})
	if err != nil {
		t.Fatalf("key b held back behind key a's waiter: %v", err)
	}
	cb.CloseNow()
	select {
	case err := <-waiterA:
		t.Fatalf("key a's waiter got through over its limit: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	// Key a's session ends: its waiter is served.
	held.Close(websocket.StatusNormalClosure, "")
	select {
	case err := <-waiterA:
		if err != nil {
			t.Fatalf("key a's waiter: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("key a's waiter not woken when its session ended")
	}
	testgw.Eventually(t, 10*time.Second, "quota counts back to 0", func() bool { return len(pool.Current().Quotas.Counts()) == 0 })
}

func bytesContain(b []byte, s string) bool { return bytes.Contains(b, []byte(s)) }
