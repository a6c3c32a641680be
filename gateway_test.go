package browserfailover_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// provider renders one provider's JSON.
func provider(name, url string, extra string) string {
	if extra != "" {
		extra = "," + extra
	}
	return fmt.Sprintf(`{"name":%q,"url":%q%s}`, name, url, extra)
}

// handler renders the handler JSON with the given providers; extra holds
// more handler keys.
func handler(extra string, providers ...string) string {
	if extra != "" {
		extra = "," + extra
	}
	return fmt.Sprintf(`{"handler":"browser_failover","providers":[%s]%s}`, strings.Join(providers, ","), extra)
}

// dial opens a WebSocket through the gateway. Like a real client it tries
// again (twice at most) when the connection is reset before any answer:
// during a config reload Caddy 2.11 swaps its SO_REUSEPORT listener, and
// connections still in the old socket's accept queue are reset before the
// handler ever sees them.
func dial(t *testing.T, url string, opts *websocket.DialOptions) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	for try := 0; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, resp, err := websocket.Dial(ctx, url, opts)
		cancel()
		if c != nil {
			c.SetReadLimit(-1)
		}
		if err != nil && resp == nil && try < 2 && resetBeforeAnswer(err) {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		return c, resp, err
	}
}

// resetBeforeAnswer tells a connection dropped by the listener from any
// answer of the gateway.
func resetBeforeAnswer(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

func echoOnce(t *testing.T, c *websocket.Conn, msg []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageBinary, msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	_, got, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("echo mismatch: %d bytes back, want %d", len(got), len(msg))
	}
}

func active(name string) int64 {
	p, ok := pool.Current().Lookup(name)
	if !ok {
		return -1
	}
	return p.Slots.Active()
}

// TestFailoverChain: every failing kind of provider is tried once, in
// priority order, and the client lands on the echo provider.
func TestFailoverChain(t *testing.T) {
	var contacts fakes.Contacts
	refused := fakes.Refused("refused")
	hang := fakes.Hang("hang", &contacts)
	defer hang.Close()
	s500 := fakes.Status("s500", &contacts, 500, nil, "boom")
	defer s500.Close()
	s401 := fakes.Status("s401", &contacts, 401, nil, "no")
	defer s401.Close()
	s403 := fakes.Status("s403", &contacts, 403, nil, "no")
	defer s403.Close()
	s429 := fakes.Status("s429", &contacts, 429, http.Header{"Retry-After": {"30"}}, "slow down")
	defer s429.Close()
	s428 := fakes.Status("s428", &contacts, 428, nil, "other playwright")
	defer s428.Close()
	badAccept := fakes.Raw("badaccept", &contacts, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: d3Jvbmc=\r\n\r\n")
	defer badAccept.Close()
	ok200 := fakes.Raw("ok200", &contacts, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
	defer ok200.Close()
	redirect := fakes.Status("s302", &contacts, 302, http.Header{"Location": {"http://127.0.0.1:1/"}}, "")
	defer redirect.Close()
	echo := fakes.Echo("echo", &contacts)
	defer echo.Close()

	names := []*fakes.Server{refused, hang, s500, s401, s403, s429, s428, badAccept, ok200, redirect, echo}
	var ps []string
	for i, s := range names {
		extra := fmt.Sprintf(`"priority":%d`, i+1)
		if s == hang {
			extra += `,"connect_timeout":"300ms"`
		}
		ps = append(ps, provider(s.Name, s.URL(), extra))
	}
	g := testgw.Start(t, handler(`"queue":{"size":0}`, ps...))

	c, resp, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d", resp.StatusCode)
	}
	echoOnce(t, c, []byte("hello"))
	c.Close(websocket.StatusNormalClosure, "")

	want := []string{"hang", "s500", "s401", "s403", "s429", "s428", "badaccept", "ok200", "s302", "echo"}
	if got := contacts.List(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("contacted %v, want %v", got, want)
	}
	testgw.Eventually(t, 5*time.Second, "echo's slot to free", func() bool { return active("echo") == 0 })

	// The session's log entry lists every attempt with its outcome word.
	testgw.Eventually(t, 5*time.Second, "session ended log", func() bool { return len(g.LogEntries("session ended")) == 1 })
	entry := g.LogEntries("session ended")[0]
	var words []string
	for _, a := range entry["attempts"].([]any) {
		words = append(words, a.(map[string]any)["outcome"].(string))
	}
	wantWords := "refused,timeout,status_500,status_401,status_403,status_429,status_428,bad_handshake,bad_handshake,bad_handshake,ok"
	if strings.Join(words, ",") != wantWords {
		t.Fatalf("attempt outcomes %v, want %s", words, wantWords)
	}
	if entry["provider"] != "echo" {
		t.Fatalf("provider %v", entry["provider"])
	}
}

// TestRelayed4xx: a 404 goes to the client as it is and stops the chain.
func TestRelayed4xx(t *testing.T) {
	var contacts fakes.Contacts
	s404 := fakes.Status("s404", &contacts, 404, http.Header{"X-Provider-Says": {"gone"}}, `{"error":"no such session"}`)
	defer s404.Close()
	echo := fakes.Echo("echo", &contacts)
	defer echo.Close()
	g := testgw.Start(t, handler("", provider("s404", s404.URL(), ""), provider("echo", echo.URL(), `"priority":2`)))

	_, resp, err := dial(t, g.WS("/"), nil)
	if err == nil {
		t.Fatal("dial succeeded, want the provider's 404")
	}
	if resp == nil || resp.StatusCode != 404 {
		t.Fatalf("want 404, got %v", resp)
	}
	body, _ := io.ReadAll(resp.Body)
	if string(body) != `{"error":"no such session"}` || resp.Header.Get("X-Provider-Says") != "gone" {
		t.Fatalf("relayed answer: %q %v", body, resp.Header)
	}
	if echo.Hits.Load() != 0 {
		t.Fatal("the chain went on after a relayed 4xx")
	}
}

// TestNothingAvailable503 checks the 503 body and that no secret leaks.
func TestNothingAvailable503(t *testing.T) {
	const secret = "sEcReT-tOkEn-42"
	s500 := fakes.Status("s500", nil, 500, nil, "")
	defer s500.Close()
	refused := fakes.Refused("refused")
	g := testgw.Start(t, handler(`"queue":{"size":0}`,
		provider("a", "ws://user:"+secret+"@"+refused.Addr+"/?apiKey="+secret, ""),
		provider("b", "ws://"+s500.Addr+"/path?token="+secret, `"priority":2,"headers_up":[{"op":"set","field":"X-Api-Key","value":"`+secret+`"}]`)))

	resp, err := http.DefaultClient.Do(upgradeRequest(t, g.HTTP("/")))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var rb struct {
		Error    string `json:"error"`
		Attempts []struct {
			Provider string  `json:"provider"`
			Outcome  string  `json:"outcome"`
			MS       float64 `json:"ms"`
		} `json:"attempts"`
		RetryAfterS int `json:"retry_after_s"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rb); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	if rb.Error != "no browser provider available" || len(rb.Attempts) != 2 ||
		rb.Attempts[0].Provider != "a" || rb.Attempts[0].Outcome != "refused" ||
		rb.Attempts[1].Provider != "b" || rb.Attempts[1].Outcome != "status_500" {
		t.Fatalf("body %s", body)
	}
	if fmt.Sprint(rb.RetryAfterS) != resp.Header.Get("Retry-After") {
		t.Fatalf("retry_after_s %d vs header %q", rb.RetryAfterS, resp.Header.Get("Retry-After"))
	}
	testgw.Eventually(t, 5*time.Second, "rejected log", func() bool { return len(g.LogEntries("rejected")) > 0 })
	if strings.Contains(string(body), secret) || strings.Contains(g.Logs(), secret) {
		t.Fatal("a secret leaked into the 503 body or the logs")
	}
}

func upgradeRequest(t *testing.T, url string) *http.Request {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", upstreams.NewKey())
	return req
}

// TestMalformedUpgrades: 400 or 426 and no provider contacted.
func TestMalformedUpgrades(t *testing.T) {
	echo := fakes.Echo("echo", nil)
	defer echo.Close()
	g := testgw.Start(t, handler("", provider("echo", echo.URL(), "")))
	cases := []struct {
		name   string
		edit   func(r *http.Request)
		status int
	}{
		{"no key", func(r *http.Request) { r.Header.Del("Sec-WebSocket-Key") }, 400},
		{"short key", func(r *http.Request) { r.Header.Set("Sec-WebSocket-Key", "c2hvcnQ=") }, 400},
		{"not base64", func(r *http.Request) { r.Header.Set("Sec-WebSocket-Key", "!!!!!!!!!!!!!!!!!!!!!!!!") }, 400},
		{"version 8", func(r *http.Request) { r.Header.Set("Sec-WebSocket-Version", "8") }, 426},
		{"no version", func(r *http.Request) { r.Header.Del("Sec-WebSocket-Version") }, 426},
		{"POST", func(r *http.Request) { r.Method = http.MethodPost }, 400},
		{"plain GET", func(r *http.Request) { r.Header.Del("Upgrade"); r.Header.Del("Connection") }, 426},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := upgradeRequest(t, g.HTTP("/"))
			tc.edit(req)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d (%s)", resp.StatusCode, tc.status, body)
			}
			if tc.status == 426 && tc.name != "plain GET" && resp.Header.Get("Sec-WebSocket-Version") != "13" {
				t.Fatal("426 without Sec-WebSocket-Version: 13")
			}
			if !json.Valid(body) {
				t.Fatalf("body is not JSON: %s", body)
			}
		})
	}
	if echo.Hits.Load() != 0 {
		t.Fatalf("provider contacted %d times", echo.Hits.Load())
	}
}

// TestRelayFidelity: a 4 MiB message, 1,000 small ones in order, a
// negotiated subprotocol, the client's credentials and an allowed Origin held back,
// header_up values delivered.
func TestRelayFidelity(t *testing.T) {
	echo := fakes.Echo("echo", nil, "cdp.v1", "other")
	defer echo.Close()
	g := testgw.Start(t, handler(`"allowed_origins":["http://app.example"]`, provider("echo", echo.URL(),
		`"headers_up":[{"op":"set","field":"X-Api-Key","value":"k1"},{"op":"add","field":"X-Trace","value":"t2"}]`)))

	c, resp, err := dial(t, g.WS("/"), &websocket.DialOptions{
		Subprotocols: []string{"cdp.v1"},
		HTTPHeader: http.Header{
			"Authorization": {"Bearer for-the-gateway"},
			"Origin":        {"http://app.example"},
			"X-Trace":       {"t1"},
			"User-Agent":    {"test-client/1"},
		},
	})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.CloseNow()
	if c.Subprotocol() != "cdp.v1" || resp.Header.Get("Sec-WebSocket-Protocol") != "cdp.v1" {
		t.Fatalf("subprotocol %q", c.Subprotocol())
	}
	h := echo.LastHeader()
	if h.Get("Authorization") != "" || h.Get("Origin") != "" {
		t.Fatalf("provider saw Authorization %q Origin %q", h.Get("Authorization"), h.Get("Origin"))
	}
	// The client's X-Trace stays at the gateway; header_up adds one.
	if h.Get("X-Api-Key") != "k1" || strings.Join(h.Values("X-Trace"), ",") != "t2" || h.Get("User-Agent") != "test-client/1" {
		t.Fatalf("provider headers %v", h)
	}

	big := make([]byte, 4<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	echoOnce(t, c, big)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		for i := 0; i < 1000; i++ {
			if err := c.Write(ctx, websocket.MessageText, []byte(fmt.Sprintf("msg-%d", i))); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for i := 0; i < 1000; i++ {
		_, got, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if want := fmt.Sprintf("msg-%d", i); string(got) != want {
			t.Fatalf("message %d is %q", i, got)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	c.Close(websocket.StatusNormalClosure, "bye")
	testgw.Eventually(t, 5*time.Second, "slot freed", func() bool { return active("echo") == 0 })
}

// TestPipelinedBytes: frames sent right behind the handshake on both sides
// arrive.
func TestPipelinedBytes(t *testing.T) {
	// A provider that sends a frame right behind its 101, in the same write.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	gotFromClient := make(chan []byte, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		buf := make([]byte, 4096)
		n, _ := conn.Read(buf)
		head := string(buf[:n])
		i := strings.Index(head, "\r\n\r\n")
		var key string
		for _, line := range strings.Split(head[:i], "\r\n") {
			if k, v, ok := strings.Cut(line, ": "); ok && strings.EqualFold(k, "Sec-WebSocket-Key") {
				key = v
			}
		}
		rest := []byte(head[i+4:])
		conn.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " +
			upstreams.AcceptFor(key) + "\r\n\r\n\x81\x05hello"))
		for len(rest) < 7 {
			n, err := conn.Read(buf)
			if err != nil {
				break
			}
			rest = append(rest, buf[:n]...)
		}
		gotFromClient <- rest
		conn.Read(buf)
	}()
	g := testgw.Start(t, handler("", provider("pipe", "ws://"+ln.Addr().String()+"/", "")))

	conn, err := net.Dial("tcp", g.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	key := upstreams.NewKey()
	// The handshake and a masked frame "hi" in one write.
	frame := []byte{0x81, 0x82, 1, 2, 3, 4, 'h' ^ 1, 'i' ^ 2}
	req := "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + key + "\r\n\r\n"
	conn.Write(append([]byte(req), frame...))
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var all []byte
	buf := make([]byte, 4096)
	for !bytes.Contains(all, []byte("\x81\x05hello")) {
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("read: %v (got %q)", err, all)
		}
		all = append(all, buf[:n]...)
	}
	select {
	case got := <-gotFromClient:
		if !bytes.Equal(got, frame) {
			t.Fatalf("provider got %x, want %x", got, frame)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("provider never got the pipelined frame")
	}
}

// TestReloadKeepsSession: a session open across a reload keeps working and
// still counts toward max_concurrent.
func TestReloadKeepsSession(t *testing.T) {
	echo := fakes.Echo("echo", nil)
	defer echo.Close()
	cfg := handler(`"queue":{"size":0}`, provider("echo", echo.URL(), `"max_concurrent":1`))
	g := testgw.Start(t, cfg)
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	echoOnce(t, c, []byte("before"))

	// Reload with a changed config (a new option) but the same provider.
	if err := g.Reload(handler(`"queue":{"size":0},"connect_timeout":"5s"`, provider("echo", echo.URL(), `"max_concurrent":1`))); err != nil {
		t.Fatal(err)
	}
	echoOnce(t, c, []byte("after reload"))
	if n := active("echo"); n != 1 {
		t.Fatalf("active %d after reload, want 1", n)
	}
	// The slot is still taken: a second client is turned away.
	_, resp, err := dial(t, g.WS("/"), nil)
	if err == nil || resp == nil || resp.StatusCode != 503 {
		t.Fatalf("second client: %v %v", err, resp)
	}
	c.Close(websocket.StatusNormalClosure, "")
	testgw.Eventually(t, 5*time.Second, "slot freed", func() bool { return active("echo") == 0 })
	c2, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatalf("after the first session ended: %v", err)
	}
	echoOnce(t, c2, []byte("x"))
	c2.Close(websocket.StatusNormalClosure, "")
}

// TestBurstCountsReturnToZero: mixed successes, failures and vanishing
// clients leave every live count at 0.
func TestBurstCountsReturnToZero(t *testing.T) {
	echo := fakes.Echo("echo", nil)
	defer echo.Close()
	s500 := fakes.Status("s500", nil, 500, nil, "")
	defer s500.Close()
	hang := fakes.Hang("hang", nil)
	defer hang.Close()
	g := testgw.Start(t, handler(`"queue":{"size":0},"strategy":"priority"`,
		provider("s500", s500.URL(), `"priority":1`),
		provider("hang", hang.URL(), `"priority":2,"connect_timeout":"200ms"`),
		provider("echo", echo.URL(), `"priority":3,"max_concurrent":20`)))

	var wg sync.WaitGroup
	for i := 0; i < 60; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			switch i % 3 {
			case 0: // a full session
				c, _, err := dial(t, g.WS("/"), nil)
				if err != nil {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				c.Write(ctx, websocket.MessageText, []byte("x"))
				c.Read(ctx)
				c.Close(websocket.StatusNormalClosure, "")
			case 1: // vanishes mid-handshake
				conn, err := net.Dial("tcp", g.Addr)
				if err != nil {
					return
				}
				conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + upstreams.NewKey() + "\r\n\r\n"))
				time.Sleep(time.Duration(i%7) * 30 * time.Millisecond)
				conn.Close()
			case 2: // drops the TCP connection mid-session
				c, _, err := dial(t, g.WS("/"), nil)
				if err != nil {
					return
				}
				c.CloseNow()
			}
		}(i)
	}
	wg.Wait()
	testgw.Eventually(t, 10*time.Second, "every count back to 0", func() bool {
		for _, n := range []string{"echo", "s500", "hang"} {
			p, _ := pool.Current().Lookup(n)
			if p.Slots.Active() != 0 || p.Slots.Reserved() != 0 {
				return false
			}
		}
		return pool.Current().Sessions.Count() == 0
	})
}

// TestOnly428AnswersAtOnce: when every provider is a Playwright server of
// another version (428), no provider could ever serve the client, so it is
// answered at once instead of waiting in the queue.
func TestOnly428AnswersAtOnce(t *testing.T) {
	s428 := fakes.Status("pw-other", nil, 428, nil, "version mismatch")
	defer s428.Close()
	g := testgw.Start(t, handler(`"queue":{"size":10,"timeout":"20s"}`, provider("pw-other", s428.URL(), "")))
	start := time.Now()
	_, resp, err := dial(t, g.WS("/"), nil)
	// No provider could ever serve this client: 502 at once.
	if err == nil || resp == nil || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("want 502, got %v %v", resp, err)
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Fatalf("the client waited %v in the queue", waited)
	}
	if s428.Hits.Load() != 1 {
		t.Fatalf("provider contacted %d times", s428.Hits.Load())
	}
	p, _ := pool.Current().Lookup("pw-other")
	if snap := p.Health.Snapshot(); !snap.Healthy || snap.Failures != 0 {
		t.Fatalf("a 428 counted against the provider: %+v", snap)
	}
}

// TestTryDurationIsNotTheProvidersFault: an attempt cut by the pass's
// try_duration, well inside the provider's own connect_timeout, is listed
// as a timeout but not counted as the provider's failure.
func TestTryDurationIsNotTheProvidersFault(t *testing.T) {
	hang := fakes.Hang("slow", nil)
	defer hang.Close()
	g := testgw.Start(t, handler(`"queue":{"size":0},"try_duration":"200ms","cooldown":{"min_requests":1}`,
		provider("slow", hang.URL(), `"connect_timeout":"10s"`)))
	_, resp, err := dial(t, g.WS("/"), nil)
	if err == nil || resp == nil || resp.StatusCode != 503 {
		t.Fatalf("want 503, got %v %v", resp, err)
	}
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `"outcome":"timeout"`) {
		t.Fatalf("body %s", body)
	}
	p, _ := pool.Current().Lookup("slow")
	if snap := p.Health.Snapshot(); !snap.Healthy || snap.Failures != 0 || p.Slots.Reserved() != 0 {
		t.Fatalf("try_duration counted against the provider: %+v reserved %d", snap, p.Slots.Reserved())
	}
}

// TestRemovedProviderKeepsCounting: a provider that leaves the config keeps
// its live session running, and when a later config brings the name back
// that session still holds its slot.
func TestRemovedProviderKeepsCounting(t *testing.T) {
	echo := fakes.Echo("rm-echo", nil)
	defer echo.Close()
	other := fakes.Echo("rm-other", nil)
	defer other.Close()
	with := handler(`"queue":{"size":0}`, provider("rm-echo", echo.URL(), `"max_concurrent":1`))
	g := testgw.Start(t, with)
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := g.Reload(handler(`"queue":{"size":0}`, provider("rm-other", other.URL(), ""))); err != nil {
		t.Fatal(err)
	}
	echoOnce(t, c, []byte("still here"))
	if err := g.Reload(with); err != nil {
		t.Fatal(err)
	}
	if n := active("rm-echo"); n != 1 {
		t.Fatalf("active %d after the provider came back, want 1", n)
	}
	_, resp, err := dial(t, g.WS("/"), nil)
	if err == nil || resp == nil || resp.StatusCode != 503 {
		t.Fatalf("a second session got past max_concurrent 1: %v %v", resp, err)
	}
	c.Close(websocket.StatusNormalClosure, "")
	testgw.Eventually(t, 5*time.Second, "the slot to free", func() bool { return active("rm-echo") == 0 })
}
