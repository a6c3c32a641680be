// Package fakes holds fake browser providers for tests and benchmarks: an
// echo WebSocket server and providers that misbehave in each way the
// gateway must survive. Every one listens on 127.0.0.1 only.
package fakes

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// Contacts records, in order, which provider was contacted.
type Contacts struct {
	mu    sync.Mutex
	names []string
}

// Add notes that name was contacted.
func (c *Contacts) Add(name string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.names = append(c.names, name)
	c.mu.Unlock()
}

// List returns the names in contact order.
func (c *Contacts) List() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.names...)
}

// Reset forgets every contact.
func (c *Contacts) Reset() {
	c.mu.Lock()
	c.names = nil
	c.mu.Unlock()
}

// Server is one fake provider.
type Server struct {
	Name string
	// Addr is host:port.
	Addr string
	// Hits counts connections (or requests) it received.
	Hits atomic.Int64
	// LastHeader is the header of the last upgrade request it saw.
	lastHeader atomic.Value
	lastURI    atomic.Value
	closeFn    func()
}

// LastURI returns the request URI (path and query) of the last request
// it saw.
func (s *Server) LastURI() string {
	u, _ := s.lastURI.Load().(string)
	return u
}

// URL is the provider's ws:// URL.
func (s *Server) URL() string { return "ws://" + s.Addr + "/" }

// LastHeader returns the header of the last request it saw.
func (s *Server) LastHeader() http.Header {
	h, _ := s.lastHeader.Load().(http.Header)
	return h
}

// Close stops it.
func (s *Server) Close() { s.closeFn() }

func listen() net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	return ln
}

// serveHTTP runs h on a fresh listener.
func serveHTTP(name string, contacts *Contacts, h func(s *Server, w http.ResponseWriter, r *http.Request)) *Server {
	ln := listen()
	s := &Server{Name: name, Addr: ln.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.Hits.Add(1)
		s.lastHeader.Store(r.Header.Clone())
		s.lastURI.Store(r.RequestURI)
		contacts.Add(name)
		h(s, w, r)
	})}
	go srv.Serve(ln)
	s.closeFn = func() { srv.Close() }
	return s
}

// Echo is a WebSocket provider that echoes every message. It negotiates the
// subprotocols it is given.
func Echo(name string, contacts *Contacts, subprotocols ...string) *Server {
	return serveHTTP(name, contacts, func(s *Server, w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{
			Subprotocols:       subprotocols,
			InsecureSkipVerify: true,
			CompressionMode:    websocket.CompressionDisabled,
		})
		if err != nil {
			return
		}
		EchoMessages(c)
	})
}

// EchoMessages sends every message it reads on c back, with no size limit,
// until the peer goes away; then it closes c's socket, as a browser would
// (an accepted coder/websocket connection is otherwise left open, and the
// gateway would hold the session's slot for its close grace).
func EchoMessages(c *websocket.Conn) { echo(c) }

// echo is EchoMessages; it returns the error that ended the echo.
func echo(c *websocket.Conn) error {
	defer c.CloseNow()
	c.SetReadLimit(-1)
	ctx := context.Background()
	for {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			return err
		}
		if err := c.Write(ctx, typ, msg); err != nil {
			return err
		}
	}
}

// Status answers every request with code and body.
func Status(name string, contacts *Contacts, code int, header http.Header, body string) *Server {
	return serveHTTP(name, contacts, func(s *Server, w http.ResponseWriter, r *http.Request) {
		for k, v := range header {
			w.Header()[k] = v
		}
		w.WriteHeader(code)
		fmt.Fprint(w, body)
	})
}

// Refused returns an address where nothing listens.
func Refused(name string) *Server {
	ln := listen()
	addr := ln.Addr().String()
	ln.Close()
	return &Server{Name: name, Addr: addr, closeFn: func() {}}
}

// serveRaw runs handle for each TCP connection.
func serveRaw(name string, contacts *Contacts, handle func(c net.Conn, br *bufio.Reader)) *Server {
	ln := listen()
	s := &Server{Name: name, Addr: ln.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	closed := false
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.Hits.Add(1)
			contacts.Add(name)
			// Under mu, so that Close's Wait never runs beside an Add.
			mu.Lock()
			if closed {
				mu.Unlock()
				c.Close()
				return
			}
			conns[c] = true
			wg.Add(1)
			mu.Unlock()
			go func() {
				defer wg.Done()
				handle(c, bufio.NewReader(c))
			}()
		}
	}()
	s.closeFn = func() {
		ln.Close()
		mu.Lock()
		closed = true
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}
	return s
}

// Hang accepts TCP connections and never answers.
func Hang(name string, contacts *Contacts) *Server {
	return serveRaw(name, contacts, func(c net.Conn, br *bufio.Reader) {
		buf := make([]byte, 1024)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	})
}

// Raw reads the request head and writes answer as it is, then keeps the
// connection until the peer closes it.
func Raw(name string, contacts *Contacts, answer string) *Server {
	return serveRaw(name, contacts, func(c net.Conn, br *bufio.Reader) {
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if line == "\r\n" {
				break
			}
		}
		c.Write([]byte(answer))
		buf := make([]byte, 1024)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	})
}

// SlowServer is a provider that answers its upgrades late (a cloud
// browser's cold start) and notes what became of each: given up by the
// gateway before the answer, or closed with a close frame after it.
type SlowServer struct {
	*Server
	// Cancelled counts handshakes the gateway gave up before the answer.
	Cancelled atomic.Int64
	// Answered counts 101 answers sent.
	Answered atomic.Int64
	// Dropped counts answered connections that ended without a close
	// frame (the gateway gave up while the 101 was on its way).
	Dropped atomic.Int64

	mu     sync.Mutex
	closes []string
}

// Closes lists "<code> <reason>" of every close frame the gateway sent.
func (s *SlowServer) Closes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.closes...)
}

// Slow answers each upgrade with 101 once wait returns a closed channel
// (or a timer's), then echoes; an upgrade whose client leaves first is
// counted as cancelled.
func Slow(name string, contacts *Contacts, wait func() <-chan time.Time) *SlowServer {
	ss := &SlowServer{}
	ss.Server = serveHTTP(name, contacts, func(s *Server, w http.ResponseWriter, r *http.Request) {
		select {
		case <-wait():
		case <-r.Context().Done():
			ss.Cancelled.Add(1)
			return
		}
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: websocket.CompressionDisabled})
		if err != nil {
			ss.Cancelled.Add(1)
			return
		}
		ss.Answered.Add(1)
		var ce websocket.CloseError
		if err := echo(c); errors.As(err, &ce) {
			ss.mu.Lock()
			ss.closes = append(ss.closes, fmt.Sprintf("%d %s", int(ce.Code), ce.Reason))
			ss.mu.Unlock()
		} else {
			ss.Dropped.Add(1)
		}
	})
	return ss
}

// After is a wait for Slow: every handshake waits d.
func After(d time.Duration) func() <-chan time.Time {
	return func() <-chan time.Time { return time.After(d) }
}

// Capped is an echoing WebSocket provider that holds at most n sessions at
// once and answers 429 to an upgrade beyond them (without Retry-After, or
// with the one SetRetryAfter gives), as a provider whose real concurrency
// cap is n does. Live is its live session count.
type Capped struct {
	*Server
	mu         sync.Mutex
	n          int
	live       int
	retryAfter string
	// Refused counts the upgrades it answered 429.
	Refused atomic.Int64
}

// NewCapped starts a provider capped at n sessions.
func NewCapped(name string, contacts *Contacts, n int) *Capped {
	cp := &Capped{n: n}
	cp.Server = serveHTTP(name, contacts, func(s *Server, w http.ResponseWriter, r *http.Request) {
		cp.mu.Lock()
		if cp.live >= cp.n {
			ra := cp.retryAfter
			cp.mu.Unlock()
			cp.Refused.Add(1)
			if ra != "" {
				w.Header().Set("Retry-After", ra)
			}
			http.Error(w, "too many concurrent sessions", http.StatusTooManyRequests)
			return
		}
		cp.live++
		cp.mu.Unlock()
		defer func() {
			cp.mu.Lock()
			cp.live--
			cp.mu.Unlock()
		}()
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: websocket.CompressionDisabled})
		if err != nil {
			return
		}
		EchoMessages(c)
	})
	return cp
}

// Live is how many sessions it holds now.
func (cp *Capped) Live() int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.live
}

// SetRetryAfter has its 429s carry Retry-After: v ("" for none).
func (cp *Capped) SetRetryAfter(v string) {
	cp.mu.Lock()
	cp.retryAfter = v
	cp.mu.Unlock()
}

// SetCap changes its cap.
func (cp *Capped) SetCap(n int) {
	cp.mu.Lock()
	cp.n = n
	cp.mu.Unlock()
}
