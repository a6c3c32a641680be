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
	// smallBufSize is the read buffer of a quiet source that is not plain
	// TCP.
	smallBufSize = 4 << 10
	// spliceMin is the payload left in a frame from which the relay hands
	// the rest of that frame to splice(2) when both sides are plain TCP.
	spliceMin = 64 << 10
	// spliceMax bounds one splice call so activity is noticed during long
	// frames.
	spliceMax = 4 << 20
	// CloseWait is how long the gateway waits for the peers' close replies
	// when it ends a session itself, how long a frame in flight may stall
	// then before it is cut, and how long one direction may go on after
	// the other has ended.
	CloseWait = time.Second
	// CloseFrameLimit bounds how long frames in flight may take to finish
	// once the gateway has decided to end a session (as long as they keep
	// moving); past it they are cut. Sockets are closed at the latest
	// CloseWait after that.
	CloseFrameLimit = 10 * time.Second
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
	// EndOperator: an operator ended the session (the admin API's DELETE
	// of the session, or the dashboard's end button).
	EndOperator = "closed by operator"
)

// Session relays one established WebSocket session byte for byte between a
// client and a provider. It ends when both directions have ended; when the
// gateway ends it (Close), each side gets a close frame at a frame boundary.
type Session struct {
	client, upstream net.Conn
	up, down         direction

	start time.Time

	closeMu     sync.Mutex
	closing     atomic.Bool
	closeCode   int
	closeReason string
	closeBy     time.Time // frames in flight are cut after this
	// halfClosed: a side ended cleanly and the other direction's read has
	// its CloseWait deadline (guarded by closeMu).
	halfClosed bool

	// keepalive is on; pingToken is the payload of the gateway's pings.
	keepalive bool
	pingToken [pingTokenLen]byte

	// hold: how the client side ended, and parking (hold.go).
	hold holdState

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
	// Keepalive pings a side that has been sent no frame for this long,
	// and ends the session when a side answers no ping (0: never).
	Keepalive time.Duration
	// OnEnd is called once, after both connections are closed.
	OnEnd func(*Session)
	// Hold keeps the provider side open when the client side ends
	// between two of its messages: the session parks until Resume joins a
	// new client or it ends (hold.go).
	Hold bool
	// OnPark is called each time the session parks, on a relay goroutine,
	// once the old client is let go; it must not block.
	OnPark func(*Session)
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
	s.up = direction{s: s, src: client, dst: up.Conn, pending: o.ClientPending, toUpstream: true}
	s.down = direction{s: s, src: up.Conn, dst: client, pending: up.Leftover}
	s.up.init()
	s.down.init()
	s.remaining.Store(2)
	s.initHold(o)
	if o.IdleTimeout > 0 {
		s.timers = append(s.timers, s.idleTimer(o.IdleTimeout))
	}
	if o.MaxDuration > 0 {
		s.timers = append(s.timers, time.AfterFunc(o.MaxDuration, func() { s.Close(CloseNormal, EndMaxDuration) }))
	}
	if o.Keepalive > 0 {
		s.keepalive = true
		s.pingToken = newPingToken()
		s.timers = append(s.timers, s.keepaliveTimer(o.Keepalive))
	}
	return s
}

// idleTimer closes the session once no bytes have moved either way for
// idle. It samples the byte counters every idle/4 instead of stamping the
// time on every read, so the relay's hot path pays nothing for it; the
// close comes between idle and idle*5/4 after the last byte.
func (s *Session) idleTimer(idle time.Duration) *time.Timer {
	tick := idle / 4
	if tick < time.Millisecond {
		tick = time.Millisecond
	}
	var last int64
	lastChange := time.Now()
	var tp atomic.Pointer[time.Timer]
	t := time.AfterFunc(24*time.Hour, func() {
		select {
		case <-s.done:
			return
		default:
		}
		now := time.Now()
		// A parked session is not idle: it waits for its client.
		if b := s.up.bytes.Load() + s.down.bytes.Load(); b != last || s.idleHeld() {
			last, lastChange = b, now
		}
		if now.Sub(lastChange) >= idle {
			s.Close(CloseNormal, EndIdle)
			return
		}
		tp.Load().Reset(tick)
	})
	// Armed only once the callback can see the timer.
	tp.Store(t)
	t.Reset(tick)
	return t
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

// Ending reports whether the session has begun to end: a side ended, or
// the gateway is closing it (the reason is known). Valid at any time.
func (s *Session) Ending() bool { return s.reason.Load() != nil }

// Close ends the session from the gateway's side: each direction lets the
// frame in flight finish (as long as it keeps moving, within
// CloseFrameLimit), sends a close frame with code and reason to its
// receiver at that boundary, and waits at most CloseWait for the reply to
// it; then both sockets close. It returns at once; wait on Done.
func (s *Session) Close(code int, reason string) {
	select {
	case <-s.done:
		return
	default:
	}
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closing.Load() {
		return
	}
	s.closeCode, s.closeReason = code, reason
	s.closeBy = time.Now().Add(CloseFrameLimit)
	s.setReason(reason)
	s.closing.Store(true)
	// Interrupt blocked reads; each direction then finishes its frame and
	// writes the close frame, setting its own deadlines from there on
	// (under closeMu, so after these). No write deadline here: one that
	// fired inside a splice would lose the bytes already taken from src.
	s.client.SetReadDeadline(aLongTimeAgo)
	s.upstream.SetReadDeadline(aLongTimeAgo)
	s.timers = append(s.timers, time.AfterFunc(CloseFrameLimit+2*CloseWait, s.abort))
}

// abort closes both sockets at once.
func (s *Session) abort() {
	// The client changes when a parked session resumes.
	s.closeMu.Lock()
	client := s.client
	s.closeMu.Unlock()
	client.Close()
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
	s        *Session
	src, dst net.Conn
	raw      syscall.RawConn // src's, when it is plain TCP
	rawFn    func(fd uintptr) bool
	limited  io.LimitedReader // reused by spliceFrame
	// small is the read buffer of a source that is not plain TCP (TLS, an
	// HTTP/2 stream) while it trickles: a blocked read holds it, so an
	// idle session holds 4 KiB there instead of a pooled 32 KiB; bulk is
	// set while reads fill their buffer, and then pooled buffers serve.
	small *[]byte
	bulk  bool
	// The result of the last raw read (owned by the direction's goroutine).
	rbuf       *[]byte
	rn         int
	rerr       error
	splice     bool // both ends plain TCP
	pending    []byte
	toUpstream bool
	frames     frameTracker
	bytes      atomic.Int64

	// While the session closes (all owned by the direction's goroutine):
	// how many reads timed out since, and whether the peer's close frame
	// was noted.
	closeTimeouts int
	closeNoted    bool
	// Guarded by s.closeMu: quiet once this direction sends nothing more
	// to dst (its close frame is out, or it ended), since quietAt;
	// replyWait while it reads src for the answer to the other
	// direction's close frame.
	quiet     bool
	quietAt   time.Time
	replyWait bool

	// Keepalive (keepalive.go): kaDue asks for a ping to dst; kaPings
	// counts those sent, kaPongs the pongs to them that came from dst's
	// peer (counted by the other direction, which reads that peer); pong
	// holds a pong frame from src until it is known whether it answers
	// the gateway (owned by the direction's goroutine).
	kaDue   atomic.Bool
	kaPings atomic.Int64
	kaPongs atomic.Int64
	pong    pongHold

	// h: which frames forward watches for, and the direction's part in
	// parking (hold.go).
	h dirHold
}

// other is the opposite direction of the session.
func (d *direction) other() *direction {
	if d.toUpstream {
		return &d.s.down
	}
	return &d.s.up
}

func (d *direction) init() {
	st, ok := d.src.(*net.TCPConn)
	if !ok {
		return
	}
	d.bindRaw(st)
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
	defer d.exit()
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
			d.release(bp)
			if !ok {
				return
			}
		} else if bp != nil {
			d.release(bp)
		}
		if err != nil {
			if d.s.hold.on && d.holdInterrupt(err) {
				if d.holdStep(err) {
					continue
				}
				return
			}
			if d.s.closing.Load() && isTimeout(err) {
				if d.closeStep() {
					continue
				}
				return
			}
			if d.keepaliveInterrupt(err) {
				if d.keepaliveStep() {
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
		bp := d.small
		if d.bulk {
			bp = relayBufs.Get().(*[]byte)
		} else if bp == nil {
			b := make([]byte, smallBufSize)
			bp, d.small = &b, &b
		}
		n, err := d.src.Read(*bp)
		d.bulk = n == len(*bp)
		return bp, n, err
	}
	d.rbuf, d.rn, d.rerr = nil, 0, nil
	err := d.raw.Read(d.rawFn)
	bp, n, rerr := d.rbuf, d.rn, d.rerr
	d.rbuf = nil
	if err != nil {
		if bp != nil {
			d.release(bp)
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

// release gives back a buffer read returned (the small one stays).
func (d *direction) release(bp *[]byte) {
	if bp != d.small {
		relayBufs.Put(bp)
	}
}

// forward writes p to dst, tracking frames. While the session is closing it
// writes only up to the next frame boundary, then the close frame. It
// reports whether the direction goes on.
func (d *direction) forward(p []byte) bool {
	if d.s.closing.Load() {
		if d.s.hold.on && d.stashParked(p) {
			return true
		}
		n := d.frames.advance(p, true)
		if n > 0 {
			if _, err := d.dst.Write(p[:n]); err != nil {
				return false
			}
			d.bytes.Add(int64(n))
		}
		if d.frames.atBoundary() {
			d.sendClose(p[n:])
			return false
		}
		// The frame moves: give it another CloseWait.
		return d.extend()
	}
	if d.h.watch {
		return d.forwardWatching(p)
	}
	d.frames.advance(p, false)
	return d.write(p)
}

// write relays p, which the frame tracker has already taken, to dst.
func (d *direction) write(p []byte) bool {
	if d.frames.sawClose && !d.closeNoted {
		// The first close frame through the relay tells who ended the
		// session, whichever side hangs up the connection first.
		d.closeNoted = true
		d.s.setReason(d.cleanWord())
		if d.toUpstream {
			d.s.hold.clientCode.Store(int32(d.frames.closeCode()))
		}
	}
	if _, err := d.dst.Write(p); err != nil {
		if d.s.hold.on && d.lostClientWrite() {
			return true
		}
		d.s.setReason(d.writeFailWord())
		return false
	}
	d.bytes.Add(int64(len(p)))
	return true
}

// cleanWord is the end reason when src ends the session.
func (d *direction) cleanWord() string {
	clean, _ := d.endWords()
	return clean
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
	d.limited.R, d.limited.N = d.src, n
	w, err := d.dst.(*net.TCPConn).ReadFrom(&d.limited)
	if w > 0 {
		d.frames.remaining -= w
		if d.frames.remaining == 0 && d.frames.opcode == opClose {
			d.frames.sawClose = true
		}
		d.bytes.Add(w)
	}
	if err != nil {
		if d.s.hold.on && d.holdInterrupt(err) {
			return d.holdStep(err)
		}
		if d.s.closing.Load() && isTimeout(err) {
			return d.closeStep()
		}
		if d.keepaliveInterrupt(err) {
			return d.keepaliveStep()
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

// closeStep runs when a read timed out while the session is closing. At a
// frame boundary it sends the close frame and ends the direction. Mid-frame,
// the first timeout is Close interrupting the read: the frame gets
// CloseWait to move on; a later one means the frame stalled that long, and
// the session is cut.
func (d *direction) closeStep() bool {
	if d.frames.atBoundary() {
		d.sendClose(nil)
		return false
	}
	d.closeTimeouts++
	if d.closeTimeouts > 1 {
		d.s.abort()
		return false
	}
	return d.extend()
}

// extend gives the frame in flight CloseWait more to move, both ways (src
// to send it, dst to take it), unless CloseFrameLimit has passed: then the
// session is cut and extend reports false.
func (d *direction) extend() bool {
	d.s.closeMu.Lock()
	now := time.Now()
	if now.After(d.s.closeBy) {
		d.s.closeMu.Unlock()
		// Closing a TLS connection may write: never under the lock.
		d.s.abort()
		return false
	}
	dl := now.Add(CloseWait)
	d.src.SetReadDeadline(dl)
	d.dst.SetWriteDeadline(dl)
	d.s.closeMu.Unlock()
	return true
}

// sendClose writes the gateway's close frame to dst, then reads src,
// discarding it, until the peer there has answered the other direction's
// close frame or CloseWait has passed since that was sent. rest are bytes
// read from src behind the boundary where the direction stopped.
func (d *direction) sendClose(rest []byte) {
	s := d.s
	s.closeMu.Lock()
	code, reason, by := s.closeCode, s.closeReason, s.closeBy
	s.closeMu.Unlock()
	d.dst.SetWriteDeadline(time.Now().Add(CloseWait))
	if _, err := d.dst.Write(closeFrame(code, reason, d.toUpstream)); err != nil {
		return
	}
	d.goQuiet()
	// The answer to the other direction's close frame comes from src;
	// while that frame is not out yet (its own frame in flight), wait on.
	o := d.other()
	s.closeMu.Lock()
	wait := by.Add(CloseWait)
	if o.quiet {
		wait = o.quietAt.Add(CloseWait)
	}
	d.replyWait = true
	d.src.SetReadDeadline(wait)
	s.closeMu.Unlock()
	// From here the tracker reads src for the reply: a pong frame held
	// back is part of that stream.
	if d.pong.n > 0 {
		d.frames.advance(d.pong.buf[:d.pong.n], false)
		d.pong.n = 0
	}
	d.awaitClose(rest)
}

// awaitClose follows src's frames, rest first (bytes already read), and
// reads src, discarding it, until a close frame has passed or the read
// fails (its deadline is the caller's).
func (d *direction) awaitClose(rest []byte) {
	if d.frames.advance(rest, false); d.frames.sawClose {
		return
	}
	for {
		bp, n, err := d.read()
		if n > 0 {
			d.frames.advance((*bp)[:n], false)
		}
		if bp != nil {
			d.release(bp)
		}
		if err != nil || d.frames.sawClose {
			return
		}
	}
}

// goQuiet notes that the direction sends nothing more to dst: when the
// other direction is waiting for dst's peer to answer, that peer now has
// CloseWait to do so.
func (d *direction) goQuiet() {
	s := d.s
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if d.quiet {
		return
	}
	d.quiet, d.quietAt = true, time.Now()
	if d.other().replyWait {
		d.dst.SetReadDeadline(d.quietAt.Add(CloseWait))
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
		// The other direction's src is our dst. (Under closeMu, so no
		// keepalive ping undoes the deadline.)
		d.s.closeMu.Lock()
		d.s.halfClosed = true
		d.dst.SetReadDeadline(time.Now().Add(CloseWait))
		d.s.closeMu.Unlock()
		return
	}
	if errors.Is(err, net.ErrClosed) {
		// Someone closed a socket under us (the session's own abort, or a
		// client whose handshake answer failed): make sure the other
		// direction stops too, whatever its peer does.
		d.s.abort()
		return
	}
	d.s.setReason(failed)
	d.s.abort()
}
