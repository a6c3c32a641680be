package upstreams

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Relay tuning.
const (
	// relayBufSize is the size of the pooled read buffers. Idle sessions
	// hold none: a buffer is taken only once bytes are ready to read.
	relayBufSize = 32 << 10
	// spliceMin is the payload left in a frame from which the relay hands
	// the rest of that frame to splice(2) when both sides are plain TCP.
	spliceMin = 64 << 10
	// spliceMax bounds one splice call so activity is noticed during long
	// frames.
	spliceMax = 4 << 20
	// CloseWait is how long the gateway waits for the peers' close replies
	// (and for a frame in flight to finish) when it ends a session itself,
	// and how long one direction may go on after the other has ended.
	CloseWait = time.Second
)

var relayBufs = sync.Pool{New: func() any { b := make([]byte, relayBufSize); return &b }}

// End reasons of a session.
const (
	EndClientClosed   = "client closed"
	EndProviderClosed = "provider closed"
	EndClientError    = "client error"
	EndProviderError  = "provider error"
	EndIdle           = "idle timeout"
	EndMaxDuration    = "session time limit"
	EndShutdown       = "server shutting down"
	EndHedgeLost      = "hedge lost"
)

// Session relays one established WebSocket session byte for byte between a
// client and a provider. It ends when both directions have ended; when the
// gateway ends it (Close), each side gets a close frame at a frame boundary.
type Session struct {
	client, upstream net.Conn
	up, down         direction

	start      time.Time
	lastActive atomic.Int64 // unix nanos of the last bytes either way

	closeMu     sync.Mutex
	closing     atomic.Bool
	closeCode   int
	closeReason string

	endOnce   sync.Once
	reason    atomic.Value // string
	done      chan struct{}
	remaining atomic.Int32
	onEnd     func(*Session)
	timers    []*time.Timer
}

// SessionOptions configure a session.
type SessionOptions struct {
	// ClientPending are bytes the client sent behind its handshake; they go
	// to the provider first.
	ClientPending []byte
	// IdleTimeout closes the session after this long without bytes either
	// way (0: never).
	IdleTimeout time.Duration
	// MaxDuration closes the session at this age (0: never).
	MaxDuration time.Duration
	// OnEnd is called once, after both connections are closed.
	OnEnd func(*Session)
}

// NewSession prepares the relay between client and the upstream connection
// up. Call Run to start it.
func NewSession(client net.Conn, up *Conn, o SessionOptions) *Session {
	s := &Session{
		client:   client,
		upstream: up.Conn,
		start:    time.Now(),
		done:     make(chan struct{}),
		onEnd:    o.OnEnd,
	}
	s.lastActive.Store(s.start.UnixNano())
	s.up = direction{s: s, src: client, dst: up.Conn, pending: o.ClientPending, toUpstream: true}
	s.down = direction{s: s, src: up.Conn, dst: client, pending: up.Leftover}
	s.up.init()
	s.down.init()
	s.remaining.Store(2)
	if o.IdleTimeout > 0 {
		idle := o.IdleTimeout
		var t *time.Timer
		t = time.AfterFunc(idle, func() {
			last := time.Unix(0, s.lastActive.Load())
			if wait := idle - time.Since(last); wait > 0 {
				t.Reset(wait)
				return
			}
			s.Close(CloseNormal, EndIdle)
		})
		s.timers = append(s.timers, t)
	}
	if o.MaxDuration > 0 {
		s.timers = append(s.timers, time.AfterFunc(o.MaxDuration, func() { s.Close(CloseNormal, EndMaxDuration) }))
	}
	return s
}

// Run starts both directions in their own goroutines and returns at once.
func (s *Session) Run() {
	go s.up.run()
	go s.down.run()
}

// Done is closed when the session has ended.
func (s *Session) Done() <-chan struct{} { return s.done }

// Start is when the session was established.
func (s *Session) Start() time.Time { return s.start }

// BytesUp counts bytes relayed from client to provider.
func (s *Session) BytesUp() int64 { return s.up.bytes.Load() }

// BytesDown counts bytes relayed from provider to client.
func (s *Session) BytesDown() int64 { return s.down.bytes.Load() }

// Reason tells why the session ended (valid once Done is closed).
func (s *Session) Reason() string {
	r, _ := s.reason.Load().(string)
	return r
}

func (s *Session) setReason(r string) { s.reason.CompareAndSwap(nil, r) }

// Close ends the session from the gateway's side: each direction sends a
// close frame with code and reason to its receiver at the next frame
// boundary, waits at most CloseWait for the reply, then both sockets close.
// It returns at once; wait on Done.
func (s *Session) Close(code int, reason string) {
	s.closeMu.Lock()
	if s.closing.Load() {
		s.closeMu.Unlock()
		return
	}
	s.closeCode, s.closeReason = code, reason
	s.closing.Store(true)
	s.closeMu.Unlock()
	select {
	case <-s.done:
		return
	default:
	}
	s.setReason(reason)
	// Interrupt blocked reads; each direction then finishes its frame and
	// writes the close frame.
	s.client.SetReadDeadline(aLongTimeAgo)
	s.upstream.SetReadDeadline(aLongTimeAgo)
	// Bound everything that follows.
	hard := time.Now().Add(2 * CloseWait)
	s.client.SetWriteDeadline(hard)
	s.upstream.SetWriteDeadline(hard)
	s.closeMu.Lock()
	s.timers = append(s.timers, time.AfterFunc(2*CloseWait, s.abort))
	s.closeMu.Unlock()
}

// abort closes both sockets at once.
func (s *Session) abort() {
	s.client.Close()
	s.upstream.Close()
}

func (s *Session) directionDone() {
	if s.remaining.Add(-1) != 0 {
		return
	}
	s.endOnce.Do(func() {
		s.abort()
		s.closeMu.Lock()
		for _, t := range s.timers {
			t.Stop()
		}
		s.closeMu.Unlock()
		s.setReason(EndProviderClosed)
		if s.onEnd != nil {
			s.onEnd(s)
		}
		close(s.done)
	})
}

// direction is one half of the relay: src to dst.
type direction struct {
	s          *Session
	src, dst   net.Conn
	raw        syscall.RawConn // src's, when it is plain TCP
	splice     bool            // both ends plain TCP
	pending    []byte
	toUpstream bool
	frames     frameTracker
	bytes      atomic.Int64
}

func (d *direction) init() {
	st, ok := d.src.(*net.TCPConn)
	if !ok {
		return
	}
	if raw, err := st.SyscallConn(); err == nil {
		d.raw = raw
	}
	_, dstTCP := d.dst.(*net.TCPConn)
	d.splice = dstTCP
}

// endWords are the end reasons when src ends cleanly or with an error.
func (d *direction) endWords() (clean, failed string) {
	if d.toUpstream {
		return EndClientClosed, EndClientError
	}
	return EndProviderClosed, EndProviderError
}

func (d *direction) run() {
	defer d.s.directionDone()
	if len(d.pending) > 0 {
		p := d.pending
		d.pending = nil
		if !d.forward(p) {
			return
		}
	}
	for {
		if d.frames.remaining >= spliceMin && d.splice && !d.s.closing.Load() {
			if !d.spliceFrame() {
				return
			}
			continue
		}
		bp, n, err := d.read()
		if n > 0 {
			ok := d.forward((*bp)[:n])
			relayBufs.Put(bp)
			if !ok {
				return
			}
		} else if bp != nil {
			relayBufs.Put(bp)
		}
		if err != nil {
			if d.s.closing.Load() && isTimeout(err) {
				if d.closeStep() {
					continue
				}
				return
			}
			d.ended(err)
			return
		}
	}
}

// read waits for bytes on src and reads them into a pooled buffer. On plain
// TCP the wait holds no buffer.
func (d *direction) read() (*[]byte, int, error) {
	if d.raw == nil {
		bp := relayBufs.Get().(*[]byte)
		n, err := d.src.Read(*bp)
		return bp, n, err
	}
	var bp *[]byte
	var n int
	var rerr error
	err := d.raw.Read(func(fd uintptr) bool {
		b := relayBufs.Get().(*[]byte)
		for {
			n, rerr = syscall.Read(int(fd), *b)
			if rerr != syscall.EINTR {
				break
			}
		}
		if rerr == syscall.EAGAIN {
			relayBufs.Put(b)
			return false
		}
		bp = b
		return true
	})
	if err != nil {
		if bp != nil {
			relayBufs.Put(bp)
		}
		return nil, 0, err
	}
	if rerr != nil {
		return bp, 0, os.NewSyscallError("read", rerr)
	}
	if n <= 0 {
		return bp, 0, io.EOF
	}
	return bp, n, nil
}

// forward writes p to dst, tracking frames. While the session is closing it
// writes only up to the next frame boundary, then the close frame. It
// reports whether the direction goes on.
func (d *direction) forward(p []byte) bool {
	d.s.lastActive.Store(time.Now().UnixNano())
	if d.s.closing.Load() {
		n := d.frames.advance(p, true)
		if n > 0 {
			if _, err := d.dst.Write(p[:n]); err != nil {
				return false
			}
			d.bytes.Add(int64(n))
		}
		if d.frames.atBoundary() {
			d.sendClose()
			return false
		}
		return true
	}
	d.frames.advance(p, false)
	if _, err := d.dst.Write(p); err != nil {
		d.s.setReason(d.writeFailWord())
		return false
	}
	d.bytes.Add(int64(len(p)))
	return true
}

func (d *direction) writeFailWord() string {
	if d.toUpstream {
		return EndProviderError
	}
	return EndClientError
}

// spliceFrame moves the rest of a long frame with splice(2).
func (d *direction) spliceFrame() bool {
	n := d.frames.remaining
	if n > spliceMax {
		n = spliceMax
	}
	w, err := d.dst.(*net.TCPConn).ReadFrom(&io.LimitedReader{R: d.src, N: n})
	if w > 0 {
		d.frames.remaining -= w
		if d.frames.remaining == 0 && d.frames.opcode == opClose {
			d.frames.sawClose = true
		}
		d.bytes.Add(w)
		d.s.lastActive.Store(time.Now().UnixNano())
	}
	if err != nil {
		if d.s.closing.Load() && isTimeout(err) {
			return d.closeStep()
		}
		d.ended(err)
		return false
	}
	if w < n {
		d.ended(io.EOF)
		return false
	}
	return true
}

// closeStep runs when a read was interrupted because the session is
// closing. At a frame boundary it sends the close frame and ends the
// direction; mid-frame it lets the frame finish within CloseWait.
func (d *direction) closeStep() bool {
	if d.frames.atBoundary() {
		d.sendClose()
		return false
	}
	d.src.SetReadDeadline(time.Now().Add(CloseWait))
	return true
}

// sendClose writes the gateway's close frame to dst, then reads src until
// the peer's own close frame arrives or CloseWait passes, discarding it.
func (d *direction) sendClose() {
	d.s.closeMu.Lock()
	code, reason := d.s.closeCode, d.s.closeReason
	d.s.closeMu.Unlock()
	if _, err := d.dst.Write(closeFrame(code, reason, d.toUpstream)); err != nil {
		return
	}
	// The reply to the close frame the other direction sent comes from src.
	d.src.SetReadDeadline(time.Now().Add(CloseWait))
	var t frameTracker
	for !t.sawClose {
		bp, n, err := d.read()
		if n > 0 {
			t.advance((*bp)[:n], false)
		}
		if bp != nil {
			relayBufs.Put(bp)
		}
		if err != nil {
			return
		}
	}
}

// ended handles the end of src: a clean end half-closes dst and gives the
// other direction CloseWait to finish; an error ends both.
func (d *direction) ended(err error) {
	clean, failed := d.endWords()
	if errors.Is(err, io.EOF) {
		d.s.setReason(clean)
		if tc, ok := d.dst.(interface{ CloseWrite() error }); ok {
			tc.CloseWrite()
		}
		// The other direction's src is our dst.
		d.dst.SetReadDeadline(time.Now().Add(CloseWait))
		return
	}
	if errors.Is(err, net.ErrClosed) {
		return
	}
	d.s.setReason(failed)
	d.s.abort()
}
