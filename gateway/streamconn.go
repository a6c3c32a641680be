package gateway

import (
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// streamConn presents an HTTP/2 or HTTP/3 extended CONNECT stream as a
// net.Conn for the relay.
//
// Its deadlines behave like a socket's. The stream's own do not: in
// golang.org/x/net/http2 a read deadline that passes closes the request
// body for good, and a write deadline that passes resets the stream even
// when no write is waiting. The relay interrupts reads with a deadline in
// the past and then reads on (to let a frame finish, to take the peer's
// close frame), and sets write deadlines that outlive its writes. So reads
// go through a goroutine that reads the body, a read deadline only stops
// the wait for it, and a write deadline is handed to the stream only for
// the time of a Write.
type streamConn struct {
	body io.ReadCloser
	w    http.ResponseWriter
	rc   *http.ResponseController
	// stop is the stream's own controller, below Caddy's idle timeout
	// writer, for Close to cut a blocked Write: that writer's deadlines
	// are not made to be set while another goroutine writes through it.
	stop      *http.ResponseController
	local     net.Addr
	remote    net.Addr
	closeOnce sync.Once
	done      chan struct{}

	chunks  chan []byte   // read from the body, for Read
	taken   chan struct{} // Read has used up the last chunk
	rerr    error         // the body's error, set before chunks closes
	pending []byte        // rest of the chunk Read is using up
	readDL  deadline
	writeDL atomic.Int64 // unix nanos; 0: none
	writing atomic.Bool  // a Write is under way
}

func newStreamConn(r *http.Request, w http.ResponseWriter, rc *http.ResponseController) *streamConn {
	sc := &streamConn{
		body: r.Body, w: w, rc: rc, stop: http.NewResponseController(belowIdleTimeout(w)), done: make(chan struct{}),
		local: streamAddr("local"), remote: streamAddr(r.RemoteAddr),
		chunks: make(chan []byte), taken: make(chan struct{}, 1),
		readDL: makeDeadline(),
	}
	go sc.pump()
	return sc
}

// belowIdleTimeout is w without Caddy's idle timeout writer, when w wraps
// one.
func belowIdleTimeout(w http.ResponseWriter) http.ResponseWriter {
	for inner := w; ; {
		if iw, ok := inner.(*caddyhttp.IdleTimeoutWriter); ok {
			return iw.ResponseWriter
		}
		u, ok := inner.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return w
		}
		inner = u.Unwrap()
	}
}

// streamChunk is the most one body read takes.
const streamChunk = 32 << 10

// pump reads the body and hands each chunk to Read, one at a time.
func (s *streamConn) pump() {
	buf := make([]byte, streamChunk)
	for {
		n, err := s.body.Read(buf)
		if n > 0 {
			select {
			case s.chunks <- buf[:n]:
			case <-s.done:
				return
			}
			select {
			case <-s.taken:
			case <-s.done:
				return
			}
		}
		if err != nil {
			s.rerr = err
			close(s.chunks)
			return
		}
	}
}

func (s *streamConn) Read(p []byte) (int, error) {
	if len(s.pending) == 0 {
		select {
		case c, ok := <-s.chunks:
			if !ok {
				return 0, s.rerr
			}
			s.pending = c
		case <-s.readDL.wait():
			return 0, os.ErrDeadlineExceeded
		case <-s.done:
			return 0, net.ErrClosed
		}
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	if len(s.pending) == 0 {
		s.taken <- struct{}{}
	}
	return n, nil
}

func (s *streamConn) Write(p []byte) (int, error) {
	s.writing.Store(true)
	defer s.writing.Store(false)
	select {
	case <-s.done:
		return 0, net.ErrClosed
	default:
	}
	if dl := s.writeDL.Load(); dl != 0 {
		t := time.Unix(0, dl)
		if !time.Now().Before(t) {
			return 0, os.ErrDeadlineExceeded
		}
		s.rc.SetWriteDeadline(t)
		defer s.rc.SetWriteDeadline(time.Time{})
	}
	n, err := s.w.Write(p)
	if err != nil {
		return n, err
	}
	return n, s.rc.Flush()
}

func (s *streamConn) Close() error {
	s.closeOnce.Do(func() {
		close(s.done)
		s.body.Close()
		s.readDL.set(time.Time{})
		// A write blocked on a client that stopped reading must return
		// too: a past deadline resets the stream (only then, so that a
		// session that ends cleanly ends its stream cleanly).
		if s.writing.Load() {
			s.stop.SetWriteDeadline(time.Unix(1, 0))
		}
	})
	return nil
}

func (s *streamConn) LocalAddr() net.Addr  { return s.local }
func (s *streamConn) RemoteAddr() net.Addr { return s.remote }

func (s *streamConn) SetDeadline(t time.Time) error {
	s.SetReadDeadline(t)
	return s.SetWriteDeadline(t)
}

func (s *streamConn) SetReadDeadline(t time.Time) error {
	s.readDL.set(t)
	return nil
}

func (s *streamConn) SetWriteDeadline(t time.Time) error {
	var v int64
	if !t.IsZero() {
		v = t.UnixNano()
	}
	s.writeDL.Store(v)
	return nil
}

// streamAddr names a stream's end.
type streamAddr string

func (a streamAddr) Network() string { return "stream" }
func (a streamAddr) String() string  { return string(a) }

// deadline is a read deadline as net.Pipe has it: a channel closed when it
// passes.
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{}
}

func makeDeadline() deadline { return deadline{cancel: make(chan struct{})} }

// set arms the deadline at t (zero: none; past: now).
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // the timer's func is closing it
	}
	d.timer = nil
	closed := isClosed(d.cancel)
	if t.IsZero() {
		if closed {
			d.cancel = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.cancel = make(chan struct{})
		}
		cancel := d.cancel
		d.timer = time.AfterFunc(dur, func() { close(cancel) })
		return
	}
	if !closed {
		close(d.cancel)
	}
}

// wait returns a channel closed once the deadline has passed.
func (d *deadline) wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cancel
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
