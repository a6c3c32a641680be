package browserfailover_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/net/http2"

	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// closeSeen is how one side saw a WebSocket end.
type closeSeen struct {
	code   websocket.StatusCode
	reason string
	err    error
}

func seen(err error) closeSeen {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return closeSeen{code: ce.Code, reason: ce.Reason, err: err}
	}
	return closeSeen{code: websocket.CloseStatus(err), err: err}
}

func (c closeSeen) is(code websocket.StatusCode, reason string) bool {
	return c.code == code && c.reason == reason
}

func (c closeSeen) String() string {
	return fmt.Sprintf("close %d %q (%v)", c.code, c.reason, c.err)
}

// recorder is an echo provider (coder/websocket, so it rejects unmasked
// frames) that reports how each of its connections ended.
type recorder struct {
	url    string
	closes chan closeSeen
	// got receives the length of each message it read.
	got chan int
}

func newRecorder(t *testing.T) *recorder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{url: "ws://" + ln.Addr().String() + "/", closes: make(chan closeSeen, 64), got: make(chan int, 1024)}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		c, err := websocket.Accept(w, req, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: websocket.CompressionDisabled})
		if err != nil {
			return
		}
		c.SetReadLimit(-1)
		ctx := context.Background()
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				r.closes <- seen(err)
				return
			}
			select {
			case r.got <- len(msg):
			default:
			}
			if err := c.Write(ctx, typ, msg); err != nil {
				return
			}
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return r
}

func (r *recorder) next(t *testing.T, wait time.Duration) closeSeen {
	t.Helper()
	select {
	case c := <-r.closes:
		return c
	case <-time.After(wait):
		t.Fatal("the provider saw no end of its session")
		return closeSeen{}
	}
}

func readEnd(c *websocket.Conn, wait time.Duration) (closeSeen, time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for {
		_, _, err := c.Read(ctx)
		if err != nil {
			return seen(err), time.Now()
		}
	}
}

// TestIdleTimeout: an idle session is closed with 1000 "idle timeout" on
// both sides, while a busy one next to it goes on.
func TestIdleTimeout(t *testing.T) {
	rec := newRecorder(t)
	g := testgw.Start(t, handler(`"session":{"idle_timeout":"300ms"}`, provider("rec", rec.url, "")))

	idle, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.CloseNow()
	start := time.Now()
	busy, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.CloseNow()

	type end struct {
		c  closeSeen
		at time.Time
	}
	idleEnd := make(chan end, 1)
	go func() {
		c, at := readEnd(idle, 5*time.Second)
		idleEnd <- end{c, at}
	}()
	for i := 0; time.Since(start) < 1200*time.Millisecond; i++ {
		echoOnce(t, busy, []byte(fmt.Sprintf("busy %d", i)))
		time.Sleep(50 * time.Millisecond)
	}
	// The busy session kept talking past 1.2s, four idle timeouts; the
	// idle one ended, not before its 300ms (readEnd waits up to 5s).
	e := <-idleEnd
	if !e.c.is(websocket.StatusNormalClosure, "idle timeout") {
		t.Fatalf("idle client saw %v", e.c)
	}
	if d := e.at.Sub(start); d < 250*time.Millisecond {
		t.Fatalf("idle session closed after %v, before its 300ms", d)
	}
	t.Logf("idle session closed after %v (idle_timeout 300ms)", e.at.Sub(start).Round(time.Millisecond))
	if c := rec.next(t, 3*time.Second); !c.is(websocket.StatusNormalClosure, "idle timeout") {
		t.Fatalf("provider of the idle session saw %v", c)
	}
	// The busy session is untouched.
	echoOnce(t, busy, []byte("still here"))
	if n := active("rec"); n != 1 {
		t.Fatalf("active %d, want 1", n)
	}
	busy.Close(websocket.StatusNormalClosure, "done")
	if c := rec.next(t, 3*time.Second); !c.is(websocket.StatusNormalClosure, "done") {
		t.Fatalf("provider of the busy session saw %v", c)
	}
	testgw.Eventually(t, 5*time.Second, "slots freed", func() bool { return active("rec") == 0 })
	testgw.Eventually(t, 5*time.Second, "two session ended logs", func() bool { return len(g.LogEntries("session ended")) == 2 })
	reasons := map[string]int{}
	for _, e := range g.LogEntries("session ended") {
		reasons[e["close_reason"].(string)]++
	}
	if reasons[upstreams.EndIdle] != 1 || reasons[upstreams.EndClientClosed] != 1 {
		t.Fatalf("close reasons %v", reasons)
	}
}

// TestMaxDuration: a session is closed at its age limit with 1000
// "session time limit" on both sides, busy or not.
func TestMaxDuration(t *testing.T) {
	rec := newRecorder(t)
	g := testgw.Start(t, handler(`"session":{"max_duration":"400ms","idle_timeout":"10s"}`, provider("rec", rec.url, "")))
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var end closeSeen
	for i := 0; ; i++ {
		if err := c.Write(ctx, websocket.MessageText, []byte(fmt.Sprintf("m%d", i))); err != nil {
			end, _ = readEnd(c, 3*time.Second)
			break
		}
		_, got, err := c.Read(ctx)
		if err != nil {
			end = seen(err)
			break
		}
		if string(got) != fmt.Sprintf("m%d", i) {
			t.Fatalf("echo %q for m%d", got, i)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if d := time.Since(start); d < 350*time.Millisecond || d > 10*time.Second {
		t.Fatalf("closed after %v, want about 400ms", d)
	}
	if !end.is(websocket.StatusNormalClosure, "session time limit") {
		t.Fatalf("client saw %v", end)
	}
	if p := rec.next(t, 3*time.Second); !p.is(websocket.StatusNormalClosure, "session time limit") {
		t.Fatalf("provider saw %v", p)
	}
	testgw.Eventually(t, 5*time.Second, "slot freed", func() bool { return active("rec") == 0 })
}

// slowProvider is a raw WebSocket server that, right after its 101, sends
// one binary frame of size bytes in chunks of chunk bytes with pause
// between them, while it reads and parses what the gateway sends it. Once
// its frame is out and it has received a close frame, it answers with its
// own close and waits for the gateway to hang up.
type slowProvider struct {
	addr    string
	closeCh chan providerClose
	sentAt  chan time.Time
}

type providerClose struct {
	masked bool
	code   int
	reason string
	err    error
}

func bigPayload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*131 + i>>16)
	}
	return b
}

func newSlowProvider(t *testing.T, payload []byte, chunk int, pause time.Duration) *slowProvider {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	p := &slowProvider{addr: ln.Addr().String(), closeCh: make(chan providerClose, 1), sentAt: make(chan time.Time, 1)}
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(30 * time.Second))
		br := bufio.NewReader(conn)
		req, err := http.ReadRequest(br)
		if err != nil {
			p.closeCh <- providerClose{err: err}
			return
		}
		fmt.Fprintf(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
			upstreams.AcceptFor(req.Header.Get("Sec-WebSocket-Key")))
		// Read the gateway's frames while sending.
		gotClose := make(chan providerClose, 1)
		go func() {
			for {
				op, masked, payload, err := readRawFrame(br)
				if err != nil {
					gotClose <- providerClose{err: err}
					return
				}
				if op == 0x8 {
					pc := providerClose{masked: masked}
					if len(payload) >= 2 {
						pc.code = int(binary.BigEndian.Uint16(payload))
						pc.reason = string(payload[2:])
					}
					gotClose <- pc
					// Then wait for the gateway to close the connection.
					io.Copy(io.Discard, br)
					return
				}
			}
		}()
		hdr := []byte{0x82, 127}
		hdr = binary.BigEndian.AppendUint64(hdr, uint64(len(payload)))
		if _, err := conn.Write(hdr); err != nil {
			return
		}
		for off := 0; off < len(payload); off += chunk {
			if _, err := conn.Write(payload[off:min(off+chunk, len(payload))]); err != nil {
				return
			}
			time.Sleep(pause)
		}
		p.sentAt <- time.Now()
		pc := <-gotClose
		p.closeCh <- pc
		if pc.err == nil {
			// Answer the close (server frames are not masked).
			conn.Write([]byte{0x88, 0x02, 0x03, 0xe8})
		}
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		io.Copy(io.Discard, conn)
	}()
	return p
}

// readRawFrame reads one frame, unmasking its payload.
func readRawFrame(br *bufio.Reader) (op byte, masked bool, payload []byte, err error) {
	var h [2]byte
	if _, err = io.ReadFull(br, h[:]); err != nil {
		return
	}
	op = h[0] & 0x0f
	masked = h[1]&0x80 != 0
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err = io.ReadFull(br, b[:]); err != nil {
			return
		}
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err = io.ReadFull(br, b[:]); err != nil {
			return
		}
		n = binary.BigEndian.Uint64(b[:])
	}
	var key [4]byte
	if masked {
		if _, err = io.ReadFull(br, key[:]); err != nil {
			return
		}
	}
	payload = make([]byte, n)
	if _, err = io.ReadFull(br, payload); err != nil {
		return
	}
	if masked {
		for i := range payload {
			payload[i] ^= key[i&3]
		}
	}
	return
}

// TestCloseAfterMessageInFlight: max_duration fires while the client is
// receiving an 8 MiB single-frame message that the provider sends slowly,
// taking well over CloseWait after the limit. The client gets the whole
// message, intact, and then close 1000; the provider gets a masked close
// frame.
func TestCloseAfterMessageInFlight(t *testing.T) {
	// 64 chunks of 128 KiB, 45ms apart: about 2.9s on the wire, at a
	// pace a client slowed down by the race detector on a busy machine
	// still keeps up with (a write to a client that takes nothing for
	// CloseWait is cut, by design).
	payload := bigPayload(8 << 20)
	p := newSlowProvider(t, payload, 128<<10, 45*time.Millisecond)
	g := testgw.Start(t, handler(`"session":{"max_duration":"300ms"}`, provider("slow", "ws://"+p.addr+"/", "")))
	start := time.Now()
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	typ, got, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("reading the big message after %v: %v", time.Since(start), err)
	}
	if typ != websocket.MessageBinary || !bytes.Equal(got, payload) {
		t.Fatalf("message of %d bytes differs from the %d sent", len(got), len(payload))
	}
	if d := time.Since(start); d < 2*time.Second {
		t.Fatalf("the message took only %v: the test does not hold the close back long enough", d)
	}
	end, _ := readEnd(c, 5*time.Second)
	if !end.is(websocket.StatusNormalClosure, "session time limit") {
		t.Fatalf("after the message the client saw %v", end)
	}
	select {
	case pc := <-p.closeCh:
		if pc.err != nil || !pc.masked || pc.code != 1000 || pc.reason != "session time limit" {
			t.Fatalf("provider got close %+v", pc)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the provider got no close frame")
	}
	testgw.Eventually(t, 5*time.Second, "session ended log", func() bool { return len(g.LogEntries("session ended")) == 1 })
	e := g.LogEntries("session ended")[0]
	if e["close_reason"] != upstreams.EndMaxDuration {
		t.Fatalf("close_reason %v", e["close_reason"])
	}
	if down := e["bytes_down"].(float64); down < float64(len(payload)) {
		t.Fatalf("bytes_down %v", down)
	}
	testgw.Eventually(t, 5*time.Second, "slot freed", func() bool { return active("slow") == 0 })
}

// TestReloadsKeepSessions: ten reloads while twenty sessions exchange
// messages continuously: nothing drops, nothing is lost or reordered, and
// the counts are exact.
func TestReloadsKeepSessions(t *testing.T) {
	rec := newRecorder(t)
	cfg := func(i int) string {
		return handler(fmt.Sprintf(`"connect_timeout":"%ds","queue":{"size":0}`, 5+i%2), provider("rec", rec.url, `"max_concurrent":20`))
	}
	g := testgw.Start(t, cfg(0))
	const sessions = 20
	conns := make([]*websocket.Conn, sessions)
	for i := range conns {
		c, _, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
		defer c.CloseNow()
		conns[i] = c
	}
	// A session counts as live right after the gateway answered its 101.
	testgw.Eventually(t, 5*time.Second, "20 live sessions", func() bool { return active("rec") == sessions })

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 2*sessions)
	var total atomic.Int64
	for i, c := range conns {
		sent := make(chan int, 1)
		wg.Add(2)
		go func() { // writer: numbered messages, then "end"
			defer wg.Done()
			n := 0
			for {
				select {
				case <-stop:
					sent <- n
					if err := c.Write(ctx, websocket.MessageText, []byte("end")); err != nil {
						errs <- fmt.Errorf("session %d: writing end: %v", i, err)
					}
					return
				default:
				}
				if err := c.Write(ctx, websocket.MessageText, []byte(fmt.Sprintf("%d:%d", i, n))); err != nil {
					errs <- fmt.Errorf("session %d: write %d: %v", i, n, err)
					sent <- n
					return
				}
				n++
				time.Sleep(3 * time.Millisecond)
			}
		}()
		go func() { // reader: every echo in order, then "end"
			defer wg.Done()
			for n := 0; ; n++ {
				_, msg, err := c.Read(ctx)
				if err != nil {
					errs <- fmt.Errorf("session %d: read after %d: %v", i, n, err)
					return
				}
				if string(msg) == "end" {
					if s := <-sent; s != n {
						errs <- fmt.Errorf("session %d: %d echoed of %d sent", i, n, s)
					}
					total.Add(int64(n))
					return
				}
				if want := fmt.Sprintf("%d:%d", i, n); string(msg) != want {
					errs <- fmt.Errorf("session %d: got %q, want %q", i, msg, want)
					return
				}
			}
		}()
	}

	for r := 1; r <= 10; r++ {
		time.Sleep(100 * time.Millisecond)
		if err := g.Reload(cfg(r)); err != nil {
			t.Fatalf("reload %d: %v", r, err)
		}
		if n := active("rec"); n != sessions {
			t.Fatalf("after reload %d: active %d, want %d", r, n, sessions)
		}
		p, _ := pool.Current().Lookup("rec")
		if p.Slots.Reserved() != sessions || p.Slots.MaxConcurrent() != sessions {
			t.Fatalf("after reload %d: reserved %d max %d", r, p.Slots.Reserved(), p.Slots.MaxConcurrent())
		}
	}
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	if total.Load() < sessions*20 {
		t.Fatalf("only %d messages went through", total.Load())
	}
	// Still full: a 21st client is turned away.
	if _, resp, err := dial(t, g.WS("/"), nil); err == nil || resp == nil || resp.StatusCode != 503 {
		t.Fatalf("21st client: %v", err)
	}
	for _, c := range conns {
		c.Close(websocket.StatusNormalClosure, "")
	}
	testgw.Eventually(t, 5*time.Second, "every slot freed", func() bool {
		p, _ := pool.Current().Lookup("rec")
		return p.Slots.Active() == 0 && p.Slots.Reserved() == 0 && pool.Current().Sessions.Count() == 0
	})
	// A session's slot is freed just before its end is logged.
	testgw.Eventually(t, 5*time.Second, "every session's end logged", func() bool {
		return len(g.LogEntries("session ended")) >= sessions
	})
	if n := len(g.LogEntries("session ended")); n != sessions {
		t.Fatalf("%d session ended logs", n)
	}
}

// buildCaddy builds ./cmd/caddy into dir.
func buildCaddy(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "caddy")
	out, err := exec.Command("go", "build", "-o", bin, "./cmd/caddy").CombinedOutput()
	if err != nil {
		t.Fatalf("go build ./cmd/caddy: %v\n%s", err, out)
	}
	return bin
}

// caddyProc is a real Caddy process.
type caddyProc struct {
	cmd    *exec.Cmd
	done   chan error
	logs   *bytes.Buffer
	logsMu *sync.Mutex
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (p *caddyProc) output() string {
	p.logsMu.Lock()
	defer p.logsMu.Unlock()
	return p.logs.String()
}

// startCaddy runs the built binary with caddyfile, its state kept in a
// temporary home, and waits until url answers.
func startCaddy(t *testing.T, caddyfile string, ready func() bool) *caddyProc {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs a Caddy binary")
	}
	if runtime.GOOS == "windows" {
		t.Skip("needs SIGTERM")
	}
	home := t.TempDir()
	bin := buildCaddy(t, home)
	cf := filepath.Join(home, "Caddyfile")
	if err := os.WriteFile(cf, []byte(caddyfile), 0o644); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "HOME="+home, "XDG_DATA_HOME="+filepath.Join(home, "data"), "XDG_CONFIG_HOME="+filepath.Join(home, "config"))
	// Check that the Caddyfile adapts (and so that the directive parses).
	adapt := exec.Command(bin, "adapt", "--config", cf, "--validate")
	adapt.Env = env
	if out, err := adapt.CombinedOutput(); err != nil {
		t.Fatalf("caddy adapt: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "run", "--config", cf, "--adapter", "caddyfile")
	cmd.Env = env
	p := &caddyProc{cmd: cmd, done: make(chan error, 1), logs: &bytes.Buffer{}, logsMu: &sync.Mutex{}}
	cmd.Stdout = lockedWriter{p.logsMu, p.logs}
	cmd.Stderr = lockedWriter{p.logsMu, p.logs}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("caddy output:\n%s", p.output())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for !ready() {
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("caddy exited: %v\n%s", err, p.output())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("caddy did not come up\n%s", p.output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p
}

// TestSIGTERMClosesSessions: SIGTERM to a real Caddy process closes every
// live session with 1001 "server shutting down" on both sides (three over
// HTTP/1.1, one over HTTP/2 extended CONNECT), and the process exits.
func TestSIGTERMClosesSessions(t *testing.T) {
	rec := newRecorder(t)
	addr, tlsAddr, admin := testgw.FreePort(t), testgw.FreePort(t), testgw.FreePort(t)
	storage := filepath.Join(t.TempDir(), "storage")
	var tr *http2.Transport
	p := startCaddy(t, fmt.Sprintf(`{
	admin %s
	persist_config off
	skip_install_trust
	storage file_system %s
	auto_https disable_redirects
}

http://%s {
	browser_failover {
		provider echo %s
	}
}

https://%s {
	tls internal
	browser_failover {
		provider echo %s
	}
}
`, admin, storage, addr, rec.url, tlsAddr, rec.url), func() bool {
		resp, err := http.Get("http://" + addr + "/json/version")
		if err != nil {
			return false
		}
		resp.Body.Close()
		if tr == nil {
			pem, err := os.ReadFile(filepath.Join(storage, "pki", "authorities", "local", "root.crt"))
			if err != nil {
				return false
			}
			roots := x509.NewCertPool()
			roots.AppendCertsFromPEM(pem)
			tr = &http2.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
		}
		resp, err = (&http.Client{Transport: tr}).Get("https://" + tlsAddr + "/json/version")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	defer tr.CloseIdleConnections()

	var conns []*websocket.Conn
	for i := 0; i < 3; i++ {
		c, _, err := dial(t, "ws://"+addr+"/", nil)
		if err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
		defer c.CloseNow()
		echoOnce(t, c, []byte(fmt.Sprintf("hello %d", i)))
		conns = append(conns, c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h2c, err := dialH2(ctx, tr, "https://"+tlsAddr+"/", nil)
	if err != nil {
		t.Fatalf("HTTP/2 session: %v", err)
	}
	defer h2c.close()
	h2c.echo(t, 0x1, []byte("hello h2"))

	ends := make(chan closeSeen, len(conns)+1)
	for _, c := range conns {
		go func() {
			e, _ := readEnd(c, 10*time.Second)
			ends <- e
		}()
	}
	go func() {
		op, p, err := h2c.readFrame()
		switch {
		case err != nil:
			ends <- closeSeen{err: err}
		case op != 0x8 || len(p) < 2:
			ends <- closeSeen{err: fmt.Errorf("HTTP/2 client got op %d", op)}
		default:
			ends <- closeSeen{code: websocket.StatusCode(binary.BigEndian.Uint16(p)), reason: string(p[2:])}
			h2c.closeFrame(int(binary.BigEndian.Uint16(p)), "")
		}
	}()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for range len(conns) + 1 {
		if e := <-ends; !e.is(websocket.StatusGoingAway, "server shutting down") {
			t.Errorf("client saw %v", e)
		}
	}
	for range len(conns) + 1 {
		if e := rec.next(t, 5*time.Second); !e.is(websocket.StatusGoingAway, "server shutting down") {
			t.Errorf("provider saw %v", e)
		}
	}
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Fatalf("caddy exited with %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("caddy did not exit after SIGTERM")
	}
	if out := p.output(); !strings.Contains(out, "shutdown complete") {
		t.Fatalf("no clean shutdown in the output:\n%s", out)
	}
}
