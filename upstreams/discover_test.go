package upstreams

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// hostCheckingChrome mimics Chrome's DevTools HTTP server: it refuses every
// request — /json/version and the WebSocket upgrade alike — whose Host is
// not an IP address (real Chrome also lets "localhost" through; this fake
// does not, so that a loopback test can use "localhost" as the name that
// gets refused).
type hostCheckingChrome struct {
	ln    net.Listener
	mu    sync.Mutex
	hosts []string // "<path> <Host>" of every request
}

func newHostCheckingChrome(t *testing.T) *hostCheckingChrome {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &hostCheckingChrome{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go c.serve(conn)
		}
	}()
	return c
}

func (c *hostCheckingChrome) serve(conn net.Conn) {
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	req, err := http.ReadRequest(bufio.NewReader(conn))
	if err != nil {
		return
	}
	c.mu.Lock()
	c.hosts = append(c.hosts, req.URL.Path+" "+req.Host)
	c.mu.Unlock()
	h, _, err := net.SplitHostPort(req.Host)
	if err != nil {
		h = req.Host
	}
	if net.ParseIP(h) == nil {
		const msg = "Host header is specified and is not an IP address or localhost."
		fmt.Fprintf(conn, "HTTP/1.1 500 Internal Server Error\r\nContent-Length:%d\r\nContent-Type:text/html\r\n\r\n%s", len(msg), msg)
		return
	}
	switch {
	case req.URL.Path == "/json/version":
		body := fmt.Sprintf(`{"Browser":"Chrome/1","webSocketDebuggerUrl":"ws://%s/devtools/browser/abc"}`, req.Host)
		fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Length:%d\r\nContent-Type:application/json\r\n\r\n%s", len(body), body)
	case req.URL.Path == "/devtools/browser/abc" && headerHasToken(req.Header, "Upgrade", "websocket"):
		fmt.Fprintf(conn, "HTTP/1.1 101 WebSocket Protocol Handshake\r\nUpgrade: WebSocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
			AcceptFor(req.Header.Get("Sec-WebSocket-Key")))
		conn.Read(make([]byte, 1)) // hold the session until the client closes
	default:
		fmt.Fprint(conn, "HTTP/1.1 404 Not Found\r\nContent-Length:0\r\n\r\n")
	}
}

func (c *hostCheckingChrome) requests() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.hosts, ", ")
}

// TestDiscoverHostFallbackAppliesToUpgrade: a provider named by a host name
// Chrome refuses (a compose service name, say) is discovered with the
// dialed address as Host, and the upgrade must use that address too:
// Chrome refuses the WebSocket upgrade with the same 500 as /json/version.
func TestDiscoverHostFallbackAppliesToUpgrade(t *testing.T) {
	chrome := newHostCheckingChrome(t)
	_, port, _ := net.SplitHostPort(chrome.ln.Addr().String())
	p, err := New(Config{Name: "chrome", URL: "http://localhost:" + port}, Defaults{ConnectTimeout: 5 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res := p.Connect(context.Background(), &Handshake{Key: NewKey(), Header: http.Header{}}, nil)
	if res.Conn != nil {
		defer res.Conn.Close()
	}
	if res.Outcome.Kind != Success {
		t.Fatalf("outcome %s (%v); requests: %s", res.Outcome.Word, res.Outcome.Err, chrome.requests())
	}
	ip := "127.0.0.1:" + port
	want := "/json/version localhost:" + port + ", /json/version " + ip + ", /devtools/browser/abc " + ip
	if got := chrome.requests(); got != want {
		t.Fatalf("requests %q, want %q", got, want)
	}
}
