// Package floor is a benchmark baseline, not part of the gateway: the least
// a Caddy HTTP handler can do to proxy a WebSocket upgrade. It dials its
// one upstream, writes the request's line and fields, hijacks the client,
// copies the upstream's answer and then both streams (io.Copy, which
// splices between TCP sockets). No choice of upstream, no checks, no
// limits, no accounting: whatever a Caddy plugin does per connect costs at
// least this, so it shows how near a handler can come to a raw TCP relay
// on the same machine. Only the benchmarks' own Caddy binary (./caddy)
// holds it.
package floor

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	caddy.RegisterModule(Floor{})
	httpcaddyfile.RegisterHandlerDirective("bench_floor", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		f := new(Floor)
		err := f.UnmarshalCaddyfile(h.Dispenser)
		return f, err
	})
	httpcaddyfile.RegisterDirectiveOrder("bench_floor", httpcaddyfile.Before, "reverse_proxy")
}

// Floor relays each request to Upstream (host:port) as a raw stream.
type Floor struct {
	Upstream string `json:"upstream"`
}

// CaddyModule returns the Caddy module information.
func (Floor) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.bench_floor", New: func() caddy.Module { return new(Floor) }}
}

// UnmarshalCaddyfile reads `bench_floor <host:port>`.
func (f *Floor) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if !d.Args(&f.Upstream) {
		return d.ArgErr()
	}
	return nil
}

func (f *Floor) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	up, err := net.Dial("tcp", f.Upstream)
	if err != nil {
		return caddyhttp.Error(http.StatusBadGateway, err)
	}
	var req bytes.Buffer
	req.WriteString(r.Method + " " + r.RequestURI + " HTTP/1.1\r\nHost: " + r.Host + "\r\n")
	r.Header.Write(&req)
	req.WriteString("\r\n")
	if _, err := up.Write(req.Bytes()); err != nil {
		up.Close()
		return caddyhttp.Error(http.StatusBadGateway, err)
	}
	// The answer's head: read up to its blank line.
	br := bufio.NewReader(up)
	var head bytes.Buffer
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			up.Close()
			return caddyhttp.Error(http.StatusBadGateway, err)
		}
		head.Write(line)
		if len(line) <= 2 {
			break
		}
	}
	client, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.Close()
		return err
	}
	client.Write(head.Bytes())
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		client.Write(b)
	}
	go func() {
		io.Copy(up, client)
		up.(*net.TCPConn).CloseWrite()
	}()
	go func() {
		io.Copy(client, up)
		client.Close()
		up.Close()
	}()
	return nil
}

var (
	_ caddyhttp.MiddlewareHandler = (*Floor)(nil)
	_ caddyfile.Unmarshaler       = (*Floor)(nil)
)
