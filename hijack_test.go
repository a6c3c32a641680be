package browserfailover

import (
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestRelayConnUnwrapsCaddy: the connection Caddy's response recorder
// hands out on a hijack (which counts bytes for the access log) is relayed
// on through the TCP connection underneath it; anything else as it is.
func TestRelayConnUnwrapsCaddy(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rr := caddyhttp.NewResponseRecorder(w, nil, nil)
		conn, _, err := http.NewResponseController(rr).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		if _, ok := conn.(*net.TCPConn); ok {
			t.Error("Caddy's recorder no longer wraps a hijacked connection: relayConn has nothing to do")
		}
		if _, ok := relayConn(conn).(*net.TCPConn); !ok {
			t.Errorf("relayConn(%T) = %T, want the *net.TCPConn underneath", conn, relayConn(conn))
		}
	}))
	defer srv.Close()
	if resp, err := http.Get(srv.URL); err == nil {
		resp.Body.Close()
	}
	// Connections that wrap nothing stay as they are.
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if relayConn(a) != a {
		t.Fatal("relayConn changed a connection that wraps nothing")
	}
	type other struct{ net.Conn }
	o := &other{a}
	if relayConn(o) != a {
		t.Fatal("relayConn did not unwrap an embedded net.Conn")
	}
	var nc net.Conn = struct{ net.Conn }{a}
	if relayConn(nc) != nc {
		t.Fatal("relayConn unwrapped a value that is not a pointer to a struct")
	}
}
