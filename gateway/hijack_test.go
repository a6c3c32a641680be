package gateway

import (
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestHijackBeneathCaddy: behind Caddy's response recorder (which counts
// bytes for the access log on the connections its hijack hands out), and
// behind a wrapper around that, the gateway still takes over the server's
// own TCP connection; the recorder counts none of the bytes relayed on it.
func TestHijackBeneathCaddy(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rr := caddyhttp.NewResponseRecorder(w, nil, nil)
		outer := &caddyhttp.ResponseWriterWrapper{ResponseWriter: rr}
		conn, _, err := hijack(outer)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		if _, ok := conn.(*net.TCPConn); !ok {
			t.Errorf("hijack handed out %T, want the server's *net.TCPConn", conn)
		}
		conn.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
		if n := rr.Size(); n != 0 {
			t.Errorf("the recorder counted %d bytes written on the hijacked connection", n)
		}
	}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}
