package gateway

import (
	"bufio"
	"net"
	"net/http"
)

// hijack takes an HTTP/1.1 client's connection over from the server
// itself, beneath every wrapper the handler chain put around the
// ResponseWriter.
//
// Caddy's access log wraps the writer to count the bytes of the response,
// and its hijack hands out a connection that goes on counting. A session
// outlives its request: Caddy writes the request's log line as soon as
// the handler returns, while the relay goes on reading and writing, so the
// relay must not touch those counters (they are not safe to share across
// goroutines), and it needs the server's own connection (a TCP connection
// is spliced). Every wrapper in Caddy's chain exposes the writer it wraps
// (Unwrap), as http.ResponseController expects; the innermost is the
// server's, and hijacking it hands out the connection itself. The access
// log therefore records the request and its status but no response bytes
// for an upgrade.
func hijack(w http.ResponseWriter) (net.Conn, *bufio.ReadWriter, error) {
	for {
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			break
		}
		w = u.Unwrap()
	}
	return http.NewResponseController(w).Hijack()
}
