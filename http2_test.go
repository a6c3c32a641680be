package browserfailover_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"golang.org/x/net/http2"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
)

// h2Gateway runs Caddy in-process serving HTTPS (HTTP/2) on a loopback
// port with a certificate for 127.0.0.1 that the test makes and loads.
// (No certificate automation: Caddy 2.11's TLS app races with its own
// asynchronous obtain at start, which the race detector reports.)
type h2Gateway struct {
	addr, admin, logPath, storage string
	certPEM, keyPEM               string
}

func (g *h2Gateway) config(handlerJSON string) []byte {
	return []byte(fmt.Sprintf(`{
  "admin": {"listen": %q, "config": {"persist": false}},
  "storage": {"module": "file_system", "root": %q},
  "logging": {"logs": {"default": {"level": "DEBUG", "encoder": {"format": "json"},
     "writer": {"output": "file", "filename": %q}}}},
  "apps": {
    "tls": {"certificates": {"load_pem": [{"certificate": %q, "key": %q}]}},
    "http": {"servers": {"gw": {
      "listen": [%q],
      "automatic_https": {"disable": true},
      "tls_connection_policies": [{}],
      "routes": [{"match": [{"host": ["127.0.0.1"]}], "handle": [%s]}]
    }}}
  }
}`, g.admin, g.storage, g.logPath, g.certPEM, g.keyPEM, g.addr, handlerJSON))
}

// selfSigned makes a certificate for 127.0.0.1 and its key, in PEM.
func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// startH2 starts the gateway and returns it with an HTTP/2 client
// transport that trusts it. The client is golang.org/x/net/http2's: Go
// 1.26's net/http.Transport refuses the ":protocol" pseudo-header
// (http.Transport validates header names before its bundled HTTP/2 code,
// which would send it, sees them).
func startH2(t *testing.T, handlerJSON string) (*h2Gateway, *http2.Transport) {
	t.Helper()
	dir := t.TempDir()
	certPEM, keyPEM := selfSigned(t)
	g := &h2Gateway{addr: testgw.FreePort(t), admin: testgw.FreePort(t), logPath: filepath.Join(dir, "caddy.log"), storage: filepath.Join(dir, "data"),
		certPEM: string(certPEM), keyPEM: string(keyPEM)}
	if err := caddy.Load(g.config(handlerJSON), true); err != nil {
		t.Fatalf("loading config: %v", err)
	}
	t.Cleanup(func() { caddy.Stop() })
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(certPEM)
	tr := &http2.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
	t.Cleanup(tr.CloseIdleConnections)
	testgw.Eventually(t, 20*time.Second, "the gateway over HTTP/2", func() bool {
		resp, err := (&http.Client{Transport: tr}).Get("https://" + g.addr + "/json/version")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200 && resp.ProtoMajor == 2
	})
	return g, tr
}

// h2WS is a WebSocket client over one HTTP/2 extended CONNECT stream (RFC
// 8441), with a minimal framer: it writes masked frames and reads whole
// unfragmented ones.
type h2WS struct {
	resp *http.Response
	w    *io.PipeWriter
	br   *bufio.Reader
	wmu  sync.Mutex
}

func dialH2(ctx context.Context, tr http.RoundTripper, url string, hd http.Header) (*h2WS, error) {
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(ctx, http.MethodConnect, url, pr)
	if err != nil {
		return nil, err
	}
	for k, v := range hd {
		req.Header[k] = v
	}
	req.Header.Set(":protocol", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		pw.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		pw.Close()
		return nil, fmt.Errorf("extended CONNECT answered %d: %s", resp.StatusCode, b)
	}
	return &h2WS{resp: resp, w: pw, br: bufio.NewReader(resp.Body)}, nil
}

// writeHeader writes a masked frame header for n payload bytes and returns
// the masking key.
func (c *h2WS) frameHeader(op byte, n int) ([]byte, [4]byte) {
	h := []byte{0x80 | op}
	switch {
	case n <= 125:
		h = append(h, 0x80|byte(n))
	case n <= 0xffff:
		h = append(h, 0x80|126)
		h = binary.BigEndian.AppendUint16(h, uint16(n))
	default:
		h = append(h, 0x80|127)
		h = binary.BigEndian.AppendUint64(h, uint64(n))
	}
	var key [4]byte
	rand.Read(key[:])
	return append(h, key[:]...), key
}

func mask(p []byte, key [4]byte, off int) []byte {
	out := make([]byte, len(p))
	for i, b := range p {
		out[i] = b ^ key[(off+i)&3]
	}
	return out
}

func (c *h2WS) writeFrame(op byte, p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	h, key := c.frameHeader(op, len(p))
	_, err := c.w.Write(append(h, mask(p, key, 0)...))
	return err
}

// writeSlowly writes one binary frame of p in chunks with pause between.
func (c *h2WS) writeSlowly(p []byte, chunk int, pause time.Duration) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	h, key := c.frameHeader(0x2, len(p))
	if _, err := c.w.Write(h); err != nil {
		return err
	}
	for off := 0; off < len(p); off += chunk {
		end := min(off+chunk, len(p))
		if _, err := c.w.Write(mask(p[off:end], key, off)); err != nil {
			return err
		}
		time.Sleep(pause)
	}
	return nil
}

func (c *h2WS) closeFrame(code int, reason string) error {
	return c.writeFrame(0x8, append(binary.BigEndian.AppendUint16(nil, uint16(code)), reason...))
}

func (c *h2WS) close() {
	c.w.Close()
	c.resp.Body.Close()
}

func (c *h2WS) readFrame() (op byte, p []byte, err error) {
	op, masked, p, err := readRawFrame(c.br)
	if err == nil && masked {
		err = errors.New("the gateway sent a masked frame to the client")
	}
	return op, p, err
}

func (c *h2WS) echo(t *testing.T, op byte, msg []byte) {
	t.Helper()
	if err := c.writeFrame(op, msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	gotOp, got, err := c.readFrame()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if gotOp != op || string(got) != string(msg) {
		t.Fatalf("echo: op %d, %d bytes; want op %d, %d bytes", gotOp, len(got), op, len(msg))
	}
}

// TestHTTP2ExtendedConnect: an HTTP/2 client opens WebSockets with extended
// CONNECT (:protocol websocket) through the gateway to an echo provider:
// messages both ways, a session kept across a config reload, a second
// session closed by its client, and a
// close injected by the gateway (max_duration) while the client is in the
// middle of sending a large message: the provider gets the whole message,
// then close 1000; the client gets close 1000, then the end of the stream.
func TestHTTP2ExtendedConnect(t *testing.T) {
	rec := newRecorder(t)
	g, tr := startH2(t, handler(`"session":{"max_duration":"6s"}`, provider("rec", rec.url, "")))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	start := time.Now()
	a, err := dialH2(ctx, tr, "https://"+g.addr+"/devtools/browser/x", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	if a.resp.ProtoMajor != 2 {
		t.Fatalf("proto %s", a.resp.Proto)
	}
	a.echo(t, 0x1, []byte("hello over h2"))
	big := bigPayload(1 << 20)
	a.echo(t, 0x2, big)

	// A reload (a changed config) keeps the HTTP/2 session going: the old
	// server sends GOAWAY, and its open streams go on.
	resp, err := http.Post("http://"+g.admin+"/load", "application/json",
		strings.NewReader(string(g.config(handler(`"session":{"max_duration":"6s"},"connect_timeout":"7s"`, provider("rec", rec.url, ""))))))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("reload: %d", resp.StatusCode)
	}
	a.echo(t, 0x1, []byte("after the reload"))

	// A second session, closed by its client. The old server's GOAWAY
	// may reach the connection after this stream's request went out; the
	// request is then refused before any answer, and a client dials again
	// (on a new connection, to the new server).
	var b *h2WS
	for try := 1; ; try++ {
		b, err = dialH2(ctx, tr, "https://"+g.addr+"/", nil)
		if err == nil {
			break
		}
		if try == 3 || !strings.Contains(err.Error(), "GOAWAY") {
			t.Fatal(err)
		}
		t.Logf("dial %d after the reload: %v", try, err)
	}
	defer b.close()
	b.echo(t, 0x1, []byte("second stream"))
	if n := active("rec"); n != 2 {
		t.Fatalf("active %d, want 2", n)
	}
	if err := b.closeFrame(1000, "bye"); err != nil {
		t.Fatal(err)
	}
	if op, p, err := b.readFrame(); err != nil || op != 0x8 || binary.BigEndian.Uint16(p) != 1000 {
		t.Fatalf("close reply: op %d %q %v", op, p, err)
	}
	if c := rec.next(t, 5*time.Second); !c.is(1000, "bye") {
		t.Fatalf("provider of the second session saw %v", c)
	}
	if _, err := io.Copy(io.Discard, b.br); err != nil {
		t.Fatalf("the second stream did not end cleanly: %v", err)
	}
	testgw.Eventually(t, 5*time.Second, "the second slot", func() bool { return active("rec") == 1 })
	for len(rec.got) > 0 {
		<-rec.got
	}

	// max_duration (6s, room for a slow machine before it) fires while the
	// client sends 4 MiB slowly (64 KiB every 30ms from 5.3s on: until
	// about 7.2s).
	msg := bigPayload(4 << 20)
	if time.Since(start) > 5200*time.Millisecond {
		t.Fatalf("the first part took %v: too slow for the timing below", time.Since(start))
	}
	time.Sleep(time.Until(start.Add(5300 * time.Millisecond)))
	wrote := make(chan error, 1)
	go func() { wrote <- a.writeSlowly(msg, 64<<10, 30*time.Millisecond) }()
	op, p, err := a.readFrame()
	if err != nil || op != 0x8 {
		t.Fatalf("want a close frame, got op %d (%d bytes) %v", op, len(p), err)
	}
	if code, reason := binary.BigEndian.Uint16(p), string(p[2:]); code != 1000 || reason != "session time limit" {
		t.Fatalf("close %d %q", code, reason)
	}
	if d := time.Since(start); d < 5900*time.Millisecond || d > 15*time.Second {
		t.Fatalf("close after %v, want about 6s", d)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("the gateway stopped taking the message: %v", err)
	}
	a.closeFrame(1000, "")
	select {
	case n := <-rec.got:
		if n != len(msg) {
			t.Fatalf("provider got a message of %d bytes, want %d", n, len(msg))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the provider never got the whole message")
	}
	if c := rec.next(t, 5*time.Second); !c.is(1000, "session time limit") {
		t.Fatalf("provider saw %v", c)
	}
	// The stream ends.
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, a.br)
		done <- err
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the stream did not end after the close")
	}
	testgw.Eventually(t, 5*time.Second, "every slot freed", func() bool { return active("rec") == 0 })

	// The session log names the provider, and the relay counted the bytes.
	var ended []map[string]any
	testgw.Eventually(t, 5*time.Second, "two session ended logs", func() bool {
		ended = logEntries(g.logPath, "session ended")
		return len(ended) == 2
	})
	var reasons []string
	for _, e := range ended {
		reasons = append(reasons, e["close_reason"].(string))
	}
	if strings.Join(reasons, ",") != "client closed,session time limit" {
		t.Fatalf("close reasons %v", reasons)
	}
	if up := ended[1]["bytes_up"].(float64); up < float64(len(msg)+len(big)) {
		t.Fatalf("bytes_up %v", up)
	}
}

func logEntries(path, msg string) []map[string]any {
	b, _ := os.ReadFile(path)
	var out []map[string]any
	for _, line := range strings.Split(string(b), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// TestHTTP2WaiterLeavesQueueWhenServed: an HTTP/2 client that waited in the
// queue leaves it as soon as it is served, although its handler goroutine
// runs for the whole session (the stream lives as long as the handler).
func TestHTTP2WaiterLeavesQueueWhenServed(t *testing.T) {
	a := fakes.Echo("h2q-a", nil)
	defer a.Close()
	b := fakes.Echo("h2q-b", nil)
	defer b.Close()
	g, tr := startH2(t, handler(`"queue":{"size":10,"timeout":"20s"}`,
		provider("h2q-a", a.URL(), `"max_concurrent":1`),
		provider("h2q-b", b.URL(), `"priority":2,"max_concurrent":1`)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := "https://" + g.addr + "/"
	c1, err := dialH2(ctx, tr, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.close()
	cx, err := dialH2(ctx, tr, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	waiting := func() int {
		n := 0
		for _, q := range pool.Current().Queues.Counts() {
			n += q.Waiting
		}
		return n
	}
	served := make(chan *h2WS, 1)
	go func() {
		c2, err := dialH2(ctx, tr, url, nil)
		if err != nil {
			t.Error(err)
			served <- nil
			return
		}
		served <- c2
	}()
	testgw.Eventually(t, 10*time.Second, "the third client to queue", func() bool { return waiting() == 1 })
	cx.close()
	c2 := <-served
	if c2 == nil {
		t.FailNow()
	}
	defer c2.close()
	c2.echo(t, 0x2, []byte("served"))
	testgw.Eventually(t, 5*time.Second, "the served client to leave the queue", func() bool { return waiting() == 0 })
}
