package multinode_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// echoProvider is a fake provider: a WebSocket echo that counts the
// sessions open at once and keeps their peak.
type echoProvider struct {
	Addr string
	// Hits counts the requests it received.
	Hits atomic.Int64
	open atomic.Int64
	peak atomic.Int64

	srv   *http.Server
	mu    sync.Mutex
	conns map[*websocket.Conn]bool
	wg    sync.WaitGroup
}

// startEcho starts an echo provider on 127.0.0.1, stopped (with every
// session it holds) when the test ends.
func startEcho(t *testing.T) *echoProvider {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &echoProvider{Addr: ln.Addr().String(), conns: map[*websocket.Conn]bool{}}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go p.srv.Serve(ln)
	t.Cleanup(p.close)
	return p
}

// URL is its ws:// URL.
func (p *echoProvider) URL() string { return "ws://" + p.Addr + "/" }

// Open is the number of sessions open now.
func (p *echoProvider) Open() int64 { return p.open.Load() }

// Peak is the most sessions that were open at once.
func (p *echoProvider) Peak() int64 { return p.peak.Load() }

// ServeHTTP accepts the upgrade and echoes until the peer goes.
func (p *echoProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.Hits.Add(1)
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return
	}
	p.wg.Add(1)
	defer p.wg.Done()
	p.mu.Lock()
	p.conns[c] = true
	p.mu.Unlock()
	n := p.open.Add(1)
	for {
		old := p.peak.Load()
		if n <= old || p.peak.CompareAndSwap(old, n) {
			break
		}
	}
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
		c.CloseNow()
	}()
	ctx := context.Background()
	for {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			p.open.Add(-1)
			return
		}
		if string(msg) == byeMessage {
			// Counted closed before the close frame leaves, so the
			// gateway cannot see the session end first. (A close the
			// client starts is answered before Read returns: a race.)
			p.open.Add(-1)
			c.Close(websocket.StatusNormalClosure, "bye")
			return
		}
		if err := c.Write(ctx, typ, msg); err != nil {
			p.open.Add(-1)
			return
		}
	}
}

// byeMessage asks the provider to end the session itself.
const byeMessage = "bye"

func (p *echoProvider) close() {
	p.srv.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.CloseNow()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// dialError is a failed client dial: the gateway's answer status (0 when
// there was none) and the start of its body.
type dialError struct {
	Status int
	Body   string
	Err    error
}

func (e *dialError) Error() string {
	if e.Status == 0 {
		return e.Err.Error()
	}
	return fmt.Sprintf("%v (status %d, body %s)", e.Err, e.Status, e.Body)
}

func (e *dialError) Unwrap() error { return e.Err }

// statusOf returns the gateway's answer status of a failed dial, 0 when it
// did not answer.
func statusOf(err error) int {
	var de *dialError
	if errors.As(err, &de) {
		return de.Status
	}
	return 0
}

// openSession dials url as a client, checks that one message comes back,
// and returns the open session. Errors are *dialError for the dial.
func openSession(ctx context.Context, url string) (*websocket.Conn, error) {
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		de := &dialError{Err: err}
		if resp != nil {
			de.Status = resp.StatusCode
			if resp.Body != nil {
				b, _ := io.ReadAll(resp.Body)
				de.Body = string(b)
			}
		}
		return nil, de
	}
	msg := []byte("hello, browser")
	if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
		c.CloseNow()
		return nil, fmt.Errorf("write: %w", err)
	}
	_, got, err := c.Read(ctx)
	if err != nil {
		c.CloseNow()
		return nil, fmt.Errorf("read the echo: %w", err)
	}
	if string(got) != string(msg) {
		c.CloseNow()
		return nil, fmt.Errorf("echo: got %q", got)
	}
	return c, nil
}

// closeSession ends a client session: the provider closes it with 1000
// (see byeMessage) and the client answers.
func closeSession(c *websocket.Conn) {
	defer c.CloseNow()
	ctx, cancel := withTimeout(5 * time.Second)
	defer cancel()
	if c.Write(ctx, websocket.MessageText, []byte(byeMessage)) == nil {
		c.Read(ctx) // the provider's close
	}
}

// serveOnce opens a session through url, within d, and closes it.
func serveOnce(url string, d time.Duration) error {
	ctx, cancel := withTimeout(d)
	defer cancel()
	c, err := openSession(ctx, url)
	if err != nil {
		return err
	}
	closeSession(c)
	return nil
}
