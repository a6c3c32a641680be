package browserfailover_test

// Hostile peers: providers that never end their headers, send huge ones,
// or answer a valid 101 followed by garbage; TLS providers with a
// certificate the gateway must not trust unless told to; clients that
// trickle their handshake (slowloris), send huge headers or bogus keys.
// Each gets a clear error or is cut off, and nothing leaks.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// hostileProvider runs handle on every connection after reading the
// upgrade request head.
type hostileProvider struct {
	addr string
	hits atomic.Int64
	live atomic.Int64 // handlers still running
	ln   net.Listener
	mu   sync.Mutex
	cs   map[net.Conn]bool
	wg   sync.WaitGroup
}

func newHostileProvider(t *testing.T, handle func(c net.Conn, br *bufio.Reader, key string)) *hostileProvider {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &hostileProvider{addr: ln.Addr().String(), ln: ln, cs: map[net.Conn]bool{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.hits.Add(1)
			p.live.Add(1)
			p.mu.Lock()
			p.cs[c] = true
			p.mu.Unlock()
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				defer p.live.Add(-1)
				defer c.Close()
				br := bufio.NewReader(c)
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				c.SetReadDeadline(time.Time{})
				handle(c, br, req.Header.Get("Sec-WebSocket-Key"))
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for c := range p.cs {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *hostileProvider) url() string { return "ws://" + p.addr + "/" }

// leakBaseline notes goroutines and fds now; the returned function waits
// (bounded) until both are back near that and reports the figures.
func leakBaseline(t *testing.T) func() {
	t.Helper()
	http.DefaultClient.CloseIdleConnections()
	time.Sleep(100 * time.Millisecond)
	runtime.GC()
	g0, f0 := runtime.NumGoroutine(), openFDs()
	return func() {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			http.DefaultClient.CloseIdleConnections()
			runtime.GC() // the runtime's pooled splice pipes close on GC
			g1, f1 := runtime.NumGoroutine(), openFDs()
			if g1 <= g0+5 && f1 <= f0+2 {
				t.Logf("goroutines %d -> %d, fds %d -> %d", g0, g1, f0, f1)
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Fatalf("leak: goroutines %d -> %d, fds %d -> %d (%s)\n%s", g0, g1, f0, f1, fdList(), buf[:runtime.Stack(buf, true)])
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// lastSessionAttempts waits for the n-th "session ended" entry and returns
// its provider and attempt words.
func lastSessionAttempts(t *testing.T, g *testgw.Gateway, n int) (string, []string, map[string]any) {
	t.Helper()
	testgw.Eventually(t, 10*time.Second, "session end log", func() bool { return len(g.LogEntries("session ended")) >= n })
	e := g.LogEntries("session ended")[n-1]
	var words []string
	for _, a := range e["attempts"].([]any) {
		words = append(words, a.(map[string]any)["outcome"].(string))
	}
	p, _ := e["provider"].(string)
	return p, words, e
}

// reject503 asks for a session that cannot be had and returns the
// attempts words of the 503 body.
func reject503(t *testing.T, g *testgw.Gateway) []string {
	t.Helper()
	// Like dial, it tries again when the connection is reset before any
	// answer: right after a reload the old listener may still take it.
	var resp *http.Response
	var err error
	for try := 0; ; try++ {
		resp, err = http.DefaultClient.Do(upgradeRequest(t, g.HTTP("/")))
		if err != nil && try < 2 && resetBeforeAnswer(err) {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		break
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("got %d %s, want 503", resp.StatusCode, body)
	}
	var rb struct {
		Attempts []struct{ Provider, Outcome string } `json:"attempts"`
	}
	if err := json.Unmarshal(body, &rb); err != nil {
		t.Fatalf("503 body %s: %v", body, err)
	}
	var words []string
	for _, a := range rb.Attempts {
		words = append(words, a.Provider+":"+a.Outcome)
	}
	return words
}

// TestHostileProviderHeaders: endless headers (slow and fast) and huge
// headers fail within connect_timeout as timeout or bad_handshake; the
// client fails over, or gets 503; nothing leaks.
func TestHostileProviderHeaders(t *testing.T) {
	statusLine := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
	slow := newHostileProvider(t, func(c net.Conn, _ *bufio.Reader, key string) {
		c.Write([]byte(statusLine + "Sec-WebSocket-Accept: " + upstreams.AcceptFor(key) + "\r\n"))
		for i := 0; ; i++ {
			c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if _, err := fmt.Fprintf(c, "X-Drip-%d: never ends\r\n", i); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	fast := newHostileProvider(t, func(c net.Conn, _ *bufio.Reader, key string) {
		c.Write([]byte(statusLine + "Sec-WebSocket-Accept: " + upstreams.AcceptFor(key) + "\r\n"))
		line := []byte("X-Flood: " + strings.Repeat("f", 1000) + "\r\n")
		for {
			c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write(line); err != nil {
				return
			}
		}
	})
	huge := newHostileProvider(t, func(c net.Conn, br *bufio.Reader, key string) {
		// A valid 101 in every way but its size (> 64 KiB of headers).
		c.Write([]byte(statusLine + "Sec-WebSocket-Accept: " + upstreams.AcceptFor(key) + "\r\nX-Huge: " +
			strings.Repeat("h", 100<<10) + "\r\n\r\n"))
		io.Copy(io.Discard, br)
	})
	echo := fakes.Echo("hh-echo", nil)
	defer echo.Close()
	cool := `"cooldown":{"min_requests":100}`
	hostile := []string{
		provider("hh-slow", slow.url(), `"priority":1,"connect_timeout":"1s"`),
		provider("hh-fast", fast.url(), `"priority":2,"connect_timeout":"5s"`),
		provider("hh-huge", huge.url(), `"priority":3,"connect_timeout":"5s"`),
	}
	g := testgw.Start(t, handler(`"queue":{"size":0},`+cool, append(hostile, provider("hh-echo", echo.URL(), `"priority":4`))...))
	done := leakBaseline(t)

	// Fail over to the echo provider.
	start := time.Now()
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	took := time.Since(start)
	echoOnce(t, c, []byte("through"))
	c.Close(websocket.StatusNormalClosure, "")
	prov, words, _ := lastSessionAttempts(t, g, 1)
	if prov != "hh-echo" || strings.Join(words, ",") != "timeout,bad_handshake,bad_handshake,ok" {
		t.Fatalf("session on %s after %v, want hh-echo after timeout,bad_handshake,bad_handshake", prov, words)
	}
	// The slow one is cut at its 1s connect_timeout; the others fail as
	// soon as 64 KiB have come, not at their 5s (which would make 11s).
	if took > 9*time.Second {
		t.Fatalf("the failover took %v", took)
	}
	t.Logf("failover past slow/fast/huge headers took %v", took)

	// Without a good provider: 503 listing each failure.
	if err := g.Reload(handler(`"queue":{"size":0},`+cool, hostile...)); err != nil {
		t.Fatal(err)
	}
	got := reject503(t, g)
	if strings.Join(got, ",") != "hh-slow:timeout,hh-fast:bad_handshake,hh-huge:bad_handshake" {
		t.Fatalf("503 attempts %v", got)
	}
	for _, n := range []string{"hh-slow", "hh-fast", "hh-huge", "hh-echo"} {
		if n == "hh-echo" {
			continue // left the config
		}
		testgw.Eventually(t, 5*time.Second, n+" slot", func() bool { return active(n) == 0 && reserved(n) == 0 })
	}
	// The gateway hung up on every hostile provider.
	for _, p := range []*hostileProvider{slow, fast, huge} {
		testgw.Eventually(t, 10*time.Second, "hostile connections to end", func() bool { return p.live.Load() == 0 })
	}
	done()
}

// TestHostileProviderGarbage: a valid 101 followed by bytes that are no
// WebSocket frames is relayed as it is both ways; the session ends cleanly
// when the provider closes. Garbage that claims a huge frame and stalls
// does not keep a session the gateway ends alive.
func TestHostileProviderGarbage(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	randBytes := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	down1, down2, up := randBytes(100<<10), randBytes(5<<10), randBytes(70<<10)
	var gotUp atomic.Value
	garbage := newHostileProvider(t, func(c net.Conn, br *bufio.Reader, key string) {
		c.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " +
			upstreams.AcceptFor(key) + "\r\n\r\n"))
		c.Write(down1)
		b := make([]byte, len(up))
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, _ := io.ReadFull(br, b)
		gotUp.Store(b[:n])
		c.Write(down2)
	})
	var gotClose atomic.Value
	stall := newHostileProvider(t, func(c net.Conn, br *bufio.Reader, key string) {
		c.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " +
			upstreams.AcceptFor(key) + "\r\n\r\n"))
		// A binary frame of 2^40 bytes, 1000 of which come.
		c.Write(append([]byte{0x82, 0x7f, 0, 0, 1, 0, 0, 0, 0, 0}, randBytes(1000)...))
		b, _ := io.ReadAll(br) // until the gateway hangs up
		gotClose.Store(b)
	})
	g := testgw.Start(t, handler(`"queue":{"size":0}`, provider("hg-garbage", garbage.url(), "")))
	done := leakBaseline(t)

	conn, br := rawDial(t, g)
	defer conn.Close()
	if _, err := conn.Write(up); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	down, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("reading the relayed garbage: %v", err)
	}
	if !bytes.Equal(down, append(append([]byte(nil), down1...), down2...)) {
		t.Fatalf("the client got %d bytes, not the provider's %d as they were", len(down), len(down1)+len(down2))
	}
	testgw.Eventually(t, 5*time.Second, "the provider to read the client's bytes", func() bool { return gotUp.Load() != nil })
	if !bytes.Equal(gotUp.Load().([]byte), up) {
		t.Fatalf("the provider got %d bytes, not the client's %d as they were", len(gotUp.Load().([]byte)), len(up))
	}
	conn.Close()
	_, _, e := lastSessionAttempts(t, g, 1)
	if e["bytes_down"].(float64) != float64(len(down1)+len(down2)) || e["bytes_up"].(float64) != float64(len(up)) {
		t.Fatalf("session end %v", e)
	}
	if r := e["close_reason"]; r != "provider closed" && r != "client closed" {
		t.Fatalf("close_reason %v", r)
	}
	testgw.Eventually(t, 5*time.Second, "the slot to free", func() bool { return active("hg-garbage") == 0 && reserved("hg-garbage") == 0 })

	// A session the gateway ends (max_duration) while the provider's
	// garbage claims a frame that never completes: cut within the close
	// wait, the slot freed.
	if err := g.Reload(handler(`"queue":{"size":0},"session":{"max_duration":"300ms"}`, provider("hg-stall", stall.url(), ""))); err != nil {
		t.Fatal(err)
	}
	conn2, br2 := rawDial(t, g)
	defer conn2.Close()
	start := time.Now()
	conn2.SetReadDeadline(time.Now().Add(20 * time.Second))
	got2, err := io.ReadAll(br2)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the session was not cut: %v", err)
	}
	took := time.Since(start)
	if len(got2) < 1010 || took > 15*time.Second {
		t.Fatalf("got %d bytes, cut after %v", len(got2), took)
	}
	_, _, e2 := lastSessionAttempts(t, g, 2)
	if e2["close_reason"] != "session time limit" {
		t.Fatalf("close_reason %v", e2["close_reason"])
	}
	testgw.Eventually(t, 5*time.Second, "the stalled provider's bytes", func() bool { return gotClose.Load() != nil })
	// Toward the provider, at a frame boundary, the gateway did send its
	// close frame (masked, 1000 "session time limit").
	if b := gotClose.Load().([]byte); len(b) < 2 || b[0] != 0x88 || b[1]&0x80 == 0 {
		t.Fatalf("the provider got % x, want a masked close frame", b[:min(len(b), 8)])
	}
	t.Logf("stalled garbage frame cut %v after max_duration", took-300*time.Millisecond)
	conn2.Close()
	testgw.Eventually(t, 5*time.Second, "the slot to free", func() bool { return active("hg-stall") == 0 && reserved("hg-stall") == 0 })
	done()
}

// rawDial upgrades over a plain TCP connection and returns it positioned
// right behind the 101 answer.
func rawDial(t *testing.T, g *testgw.Gateway) (net.Conn, *bufio.Reader) {
	t.Helper()
	var conn net.Conn
	var br *bufio.Reader
	var resp *http.Response
	// Like dial, it tries again when the connection is reset before any
	// answer: right after a reload the old listener may still take it.
	for try := 0; ; try++ {
		var err error
		conn, err = net.DialTimeout("tcp", g.Addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err = conn.Write([]byte(rawUpgradeRequest(g.Addr, "/"))); err == nil {
			br = bufio.NewReader(conn)
			resp, err = http.ReadResponse(br, nil)
		}
		if err != nil && try < 2 && resetBeforeAnswer(err) {
			conn.Close()
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		break
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d", resp.StatusCode)
	}
	conn.SetDeadline(time.Time{})
	return conn, br
}

func reserved(name string) int64 {
	if p, ok := pool.Current().Lookup(name); ok {
		return p.Slots.Reserved()
	}
	return -1
}

// TestHostileTLSProvider: a wss:// provider with a self-signed certificate
// fails as tls_error and the client fails over; with
// tls_insecure_skip_verify, or its certificate as trusted CA, it serves.
func TestHostileTLSProvider(t *testing.T) {
	var handshakes atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, msg, err := c.Read(r.Context())
			if err != nil {
				return
			}
			c.Write(r.Context(), typ, msg)
		}
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			handshakes.Add(1)
		}
	}
	srv.StartTLS()
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "provider.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	wss := "wss://" + srv.Listener.Addr().String() + "/"
	echo := fakes.Echo("ht-echo", nil)
	defer echo.Close()
	fallback := provider("ht-echo", echo.URL(), `"priority":2`)
	g := testgw.Start(t, handler(`"queue":{"size":0}`, provider("ht-bad", wss, `"priority":1`), fallback))
	done := leakBaseline(t)

	cases := []struct {
		name, tls, want string
	}{
		{"ht-bad", ``, "tls_error"},
		{"ht-skip", `"tls":{"insecure_skip_verify":true}`, "ok"},
		{"ht-ca", fmt.Sprintf(`"tls":{"trusted_ca_certs":[%q]}`, ca), "ok"},
		{"ht-ca-name", fmt.Sprintf(`"tls":{"trusted_ca_certs":[%q],"server_name":"example.com"}`, ca), "ok"},
		{"ht-ca-wrongname", fmt.Sprintf(`"tls":{"trusted_ca_certs":[%q],"server_name":"wrong.example.org"}`, ca), "tls_error"},
	}
	for i, tc := range cases {
		extra := `"priority":1`
		if tc.tls != "" {
			extra += "," + tc.tls
		}
		if err := g.Reload(handler(`"queue":{"size":0}`, provider(tc.name, wss, extra), fallback)); err != nil {
			t.Fatal(err)
		}
		before := handshakes.Load()
		c, _, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatalf("%s: dial: %v", tc.name, err)
		}
		echoOnce(t, c, []byte(tc.name))
		c.Close(websocket.StatusNormalClosure, "")
		prov, words, _ := lastSessionAttempts(t, g, i+1)
		switch tc.want {
		case "ok":
			if prov != tc.name || strings.Join(words, ",") != "ok" {
				t.Fatalf("%s: session on %s after %v", tc.name, prov, words)
			}
		default:
			if prov != "ht-echo" || strings.Join(words, ",") != tc.want+",ok" {
				t.Fatalf("%s: session on %s after %v, want ht-echo after %s", tc.name, prov, words, tc.want)
			}
		}
		if handshakes.Load() == before {
			t.Fatalf("%s: the TLS provider was not contacted", tc.name)
		}
		t.Logf("%s: %v -> session on %s", tc.name, words, prov)
	}
	srv.CloseClientConnections()
	done()
}

// slowConfig is the gateway config with the server's read_header_timeout
// set (Caddyfile: the global option servers { timeouts { read_header 2s } }).
func slowConfig(t *testing.T, g *testgw.Gateway, handlerJSON string) []byte {
	var cfg map[string]any
	if err := json.Unmarshal(g.Config(handlerJSON), &cfg); err != nil {
		t.Fatal(err)
	}
	srv := cfg["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["gw"].(map[string]any)
	srv["read_header_timeout"] = "2s"
	b, _ := json.Marshal(cfg)
	return b
}

// TestHostileClients: a slowloris handshake is cut by the server's
// read_header_timeout, headers over the server's limit get 431 (Caddy's
// default max_header_bytes is 16 KiB; > 1 MiB is far beyond it), a bogus
// key gets 400; no provider is contacted and nothing leaks.
func TestHostileClients(t *testing.T) {
	echo := fakes.Echo("hc-echo", nil)
	defer echo.Close()
	h := handler(`"queue":{"size":0}`, provider("hc-echo", echo.URL(), ""))
	g := testgw.Start(t, h)
	if err := g.Load(slowConfig(t, g, h)); err != nil {
		t.Fatal(err)
	}
	// A good client first: the route works.
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	echoOnce(t, c, []byte("ok"))
	c.Close(websocket.StatusNormalClosure, "")
	testgw.Eventually(t, 5*time.Second, "slot", func() bool { return active("hc-echo") == 0 })
	hits := echo.Hits.Load()
	done := leakBaseline(t)

	// Slowloris: five clients trickle a valid upgrade, a byte every 150ms.
	var wg sync.WaitGroup
	cut := make([]time.Duration, 5)
	for i := range cut {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("tcp", g.Addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			start := time.Now()
			stop := make(chan struct{})
			go func() {
				req := rawUpgradeRequest(g.Addr, "/")
				for j := 0; j < len(req); j++ {
					select {
					case <-stop:
						return
					case <-time.After(150 * time.Millisecond):
					}
					if _, err := conn.Write([]byte{req[j]}); err != nil {
						return
					}
				}
			}()
			conn.SetReadDeadline(time.Now().Add(20 * time.Second))
			_, err = io.ReadAll(conn)
			close(stop)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Errorf("slowloris client %d was not cut off", i)
			}
			cut[i] = time.Since(start)
		}()
	}
	wg.Wait()
	for i, d := range cut {
		if d > 10*time.Second {
			t.Errorf("slowloris client %d cut only after %v", i, d)
		}
	}
	t.Logf("slowloris clients cut after %v", cut)

	// Huge headers: 20 KiB (over Caddy's 16 KiB default) and 1.5 MiB.
	for _, size := range []int{20 << 10, 3 << 19} {
		conn, err := net.Dial("tcp", g.Addr)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			req := strings.TrimSuffix(rawUpgradeRequest(g.Addr, "/"), "\r\n") + "X-Big: " + strings.Repeat("b", size) + "\r\n\r\n"
			conn.Write([]byte(req))
		}()
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%d bytes of header: %v", size, err)
		}
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("%d bytes of header: status %d, want 431", size, resp.StatusCode)
		}
		conn.Close()
	}

	// Bogus keys: 400 with a JSON error.
	for _, key := range []string{"not-a-key", "dGVzdA==", strings.Repeat("A", 24)} {
		req := upgradeRequest(t, g.HTTP("/"))
		req.Header.Set("Sec-WebSocket-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "Sec-WebSocket-Key") {
			t.Fatalf("key %q: %d %s", key, resp.StatusCode, body)
		}
	}
	if n := echo.Hits.Load() - hits; n != 0 {
		t.Fatalf("the provider was contacted %d times by hostile clients", n)
	}
	if active("hc-echo") != 0 || reserved("hc-echo") != 0 {
		t.Fatal("a slot is held")
	}
	done()
}
