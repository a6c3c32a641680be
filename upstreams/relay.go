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

// The sides of a session, as indexes: a direction is named by the side it
// writes to.
const (
	toProvider = 0 // the up direction: client to provider
	toClient   = 1 // the down direction: provider to client
)

// Session relays one established WebSocket session byte for byte between a
// client and a provider. It ends when both directions have ended; when the
// gateway ends it (Close), each side gets a close frame at a frame boundary.
// Its phases are in relay_state.go.
//
// It has more methods than a type should, for a reason: they are what the
// gateway asks of a live session (Run, Done, Close, its bytes and reason,
// keepalive's pings, hold's Parked and Resume) and the steps its phases
// take (sync, step, cut, end, tick), each in the file of the feature that
// adds it (hold.go, keepalive.go, farewell.go). Split into types, they
// would share its lock and its one table of phases, the only place its
// state changes.
type Session struct {
	upstream net.Conn
	start    time.Time
	// done is made by the first Done (an idle session nobody waits on
	// holds no channel) and closed when the session has ended; ended
	// tells a Done after that to return closed. Under mu.
	done     chan struct{}
	onEnd    func(*Session)
	onPark   func(*Session)
	farewell *Farewell  // nil: none (farewell.go)
	lastWord *LastWord  // nil: none (lastword.go)
	ka       *keepalive // nil: off
	tap      Tap        // nil: none (tap.go)
	// bytes relayed to each side (BytesUp, BytesDown).
	bytes [2]atomic.Int64
	// outPending: the tap's messages wait in outbox (tap.go); read by
	// the up direction without the lock.
	outPending atomic.Bool

	mu      sync.Mutex // guards what follows but hold
	client  net.Conn
	up      *direction
	down    *direction
	running int // directions whose goroutine runs
	reason  string
	timers  []*time.Timer
	ticker  *time.Timer // tick's
	// closing: the close frames' code and reason, when frames in flight
	// are cut, and whether the session had no client then (closeHeld,
	// below).
	closeCode   int
	closeReason string
	closeBy     time.Time
	// closingBegun is set, with both reads interrupted, as closing begins
	// (read without the lock by a direction whose read returned bytes).
	closingBegun atomic.Bool
	// Hold (hold.go): why the client looks gone, and for how many
	// keepalive ticks (leaving: leaveByWrite, below); the answer to its
	// close frame (parking); the client waiting to join (joining); what
	// the provider sent while the session had no client.
	leaveTicks            int
	echo                  []byte
	joiner                *resumeReq
	dropFrames, dropBytes int64
	clientCode            int // the client's close code (closeNoStatus: none in its frame; 0: no frame)
	// outbox: the tap's frames for the provider, waiting for the client's
	// stream to reach a message boundary (tap.go).
	outbox []byte

	// The small fields, together. hold and parks are set at the start,
	// the others are under mu.
	hold bool
	// parks: the client's leaving parks the session for a resume (Hold),
	// even with a last word.
	parks        bool
	phase        phase
	closeHeld    bool
	leaveByWrite bool
	kaClientDead bool // keepalive ended the session: the client answered no ping
	ended        bool // end has run (done)
}

// SessionOptions configure a session.
type SessionOptions struct {
	// ClientPending are bytes the client sent behind its handshake; they go
	// to the provider first.
	ClientPending []byte
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
	// Farewell is a message the gateway sends the provider when the
	// client's side ends, before it closes the provider's connection
	// (farewell.go). It does not go with Hold.
	Farewell *Farewell
	// Tap is a participant of the gateway's own in the session: it sees
	// the provider's messages toward the client and says which the client
	// gets, and sends the provider messages of its own (tap.go). Not for
	// a session that negotiated an extension.
	Tap Tap
	// LastWord is a conversation the gateway has with the provider when
	// the session ends with the browser still there, before the
	// provider's connection closes (lastword.go). With Hold, the client's
	// leaving parks the session, and it is said when the session ends.
	// Not with Farewell, nor for a session that negotiated an extension.
	LastWord *LastWord
}

// NewSession prepares the relay between client and the upstream connection
// up. Call Run to start it.
func NewSession(client net.Conn, up *Conn, o SessionOptions) *Session {
	s := &Session{
		upstream: up.Conn,
		client:   client,
		start:    time.Now(),
		onEnd:    o.OnEnd,
		onPark:   o.OnPark,
		// A farewell and a last word take the provider's side over as
		// hold does when the client leaves, to end it there.
		hold:     o.Hold || o.Farewell != nil || o.LastWord != nil,
		parks:    o.Hold,
		farewell: o.Farewell,
		lastWord: o.LastWord,
		tap:      o.Tap,
		running:  2,
	}
	if o.Keepalive > 0 {
		s.ka = newKeepalive(o.Keepalive)
	}
	s.up = s.newDirection(client, up.Conn, toProvider, o.ClientPending)
	s.down = s.newDirection(up.Conn, client, toClient, up.Leftover)
	s.arm()
	return s
}

// tickEvery is how often tick samples the session: a quarter of the
// keepalive interval (0: never).
func (s *Session) tickEvery() time.Duration {
	if s.ka == nil {
		return 0
	}
	return max(s.ka.interval/4, time.Millisecond)
}

// tick has keepalive ping the sides; it samples what the relay keeps
// anyway, so its hot path pays nothing for keepalive. Under s.mu.
func (s *Session) tick() {
	if s.phase == over {
		return
	}
	s.keepaliveTick(time.Now())
	s.ticker.Reset(s.tickEvery())
}

// Activity is what its session's lifecycle reads of the relay for the
// idle timeout: the bytes relayed both ways (the gateway's own pings and
// pongs are not among them), and whether the session waits for its
// client (held without one, or its client leaving), which is not idle.
func (s *Session) Activity() (n int64, waiting bool) {
	n = s.bytes[toProvider].Load() + s.bytes[toClient].Load()
	s.mu.Lock()
	waiting = s.phase.withoutClient() || s.phase == leaving
	s.mu.Unlock()
	return n, waiting
}

// Run starts both directions in their own goroutines and returns at once.
func (s *Session) Run() {
	go s.up.run()
	go s.down.run()
}

// Done is closed when the session has ended.
func (s *Session) Done() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done == nil {
		if s.ended {
			return closedDone
		}
		s.done = make(chan struct{})
	}
	return s.done
}

// closedDone is the Done of every session that ended before anyone asked.
var closedDone = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// Start is when the session was established.
func (s *Session) Start() time.Time { return s.start }

// BytesUp counts bytes relayed from client to provider.
func (s *Session) BytesUp() int64 { return s.bytes[toProvider].Load() }

// BytesDown counts bytes relayed from provider to client.
func (s *Session) BytesDown() int64 { return s.bytes[toClient].Load() }

// Reason tells why the session ended (valid once Done is closed).
func (s *Session) Reason() string { return s.sync(change{ev: evLook}).reason }

// setReason gives the session its end reason, unless it has one ("" gives
// none). Under s.mu.
func (s *Session) setReason(r string) {
	if s.reason == "" && r != "" {
		s.reason = r
	}
}

// Ending reports whether the session has begun to end: a side ended, or
// the gateway is closing it (the reason is known). Valid at any time.
func (s *Session) Ending() bool { return s.Reason() != "" }

// Close ends the session from the gateway's side: each direction lets the
// frame in flight finish (as long as it keeps moving, within
// CloseFrameLimit), sends a close frame with code and reason to its
// receiver at that boundary, and waits at most CloseWait for the reply to
// it; then both sockets close. It returns at once; wait on Done.
func (s *Session) Close(code int, reason string) {
	s.sync(change{ev: evClose, code: code, reason: reason})
}

// CloseLost ends a connection that won its handshake too late (another
// provider's hedged attempt won the race): it sends close 1000 "hedge lost"
// so the provider ends that browser at once, waits up to CloseWait for the
// provider to close, then closes the socket.
func (c *Conn) CloseLost() { c.CloseWith(CloseNormal, EndHedgeLost) }

// CloseWith ends an established connection that no client will use: a
// close frame with code and reason, at most CloseWait for the provider to
// answer it, then the socket; its provider session is released.
func (c *Conn) CloseWith(code int, reason string) {
	c.SetDeadline(time.Now().Add(CloseWait))
	if _, err := c.Write(closeFrame(code, reason, true)); err == nil {
		io.Copy(io.Discard, c.Conn)
	}
	c.Close()
}

// cut gives the session reason (unless it has one; "" gives none) and
// closes both sockets at once; it reports false, for a direction that
// ends with it.
func (s *Session) cut(reason string) bool {
	v := s.sync(change{ev: evEnd, reason: reason})
	// Closing a TLS connection may write: never under the lock.
	v.client.Close()
	s.upstream.Close()
	return false
}

// end runs once no direction runs any more.
func (s *Session) end() {
	s.cut("")
	if s.onEnd != nil {
		s.onEnd(s)
	}
	s.mu.Lock()
	s.ended = true
	done := s.done
	s.mu.Unlock()
	if done != nil {
		close(done)
	}
}

// direction is one half of the relay: src to dst. Its fields are its
// goroutine's, but for the few under s.mu.
//
// Its many methods are the steps of that one goroutine's loop, each in the
// file of the feature it serves (hold.go: park, let go, join;
// keepalive.go: ping, pong; farewell*.go; relay_raw_*.go: raw reads), most
// of them saying whether the loop goes on. A type per feature would need
// the same fields and run on the same goroutine.
type direction struct {
	s        *Session
	src, dst net.Conn
	pending  []byte
	frames   frameTracker
	// ctl is a control frame from src being collected; nil for a
	// session with neither keepalive nor hold nor a tap, which never
	// collects one (an idle session holds no buffer for it).
	ctl *ctlFrame
	// tr puts together the provider's messages for the session's tap
	// (down direction of a tapped session; tap.go).
	tr *tapReader

	// Reading (relay_raw_*.go): src's raw connection when it is plain TCP,
	// and the last raw read's result; small is the read buffer of another
	// source while it trickles (a blocked read holds it, so an idle
	// session holds 4 KiB there instead of a pooled 32 KiB), bulk (below)
	// while reads fill their buffer (then pooled buffers serve).
	raw     syscall.RawConn
	rawFn   func(fd uintptr) bool
	rbuf    *[]byte
	rn      int
	rerr    error
	small   *[]byte
	limited io.LimitedReader

	// Hold (down direction, hold.go): wait while a client waits to join;
	// alone (below) once the old client is let go (it alone writes to the
	// provider then).
	wait *replyWait

	// Under s.mu: since when the direction sends nothing more to dst (its
	// close frame is out, or it ended); pingDue and awaitsReply below.
	quietAt time.Time

	// The small fields, together (an idle session holds two directions).
	side uint8 // the side dst is (toProvider, toClient)
	mode mode
	// watching: the relay looks at what it relays (control frames, or a
	// tap's messages): not the plain path. controls: it stops at frames
	// whose first byte is one of watch (keepalive's pongs, hold's close
	// frames from the client) and hands them, whole, to control.
	watching bool
	controls bool
	watch    [2]byte
	// closeNoted: the first close frame from src was noted. closingSeen:
	// a wake found the session closing.
	closeNoted  bool
	closingSeen bool
	bulk        bool
	splice      bool // both ends plain TCP
	alone       bool
	// Under s.mu: a ping is due (keepalive.go); awaiting while it reads
	// src for the answer to the other direction's close frame; sendDue:
	// its read was interrupted for the tap's messages (tap.go);
	// talkWaits: the down direction waits for the up direction to go
	// quiet, to say the session's last word (lastword.go); exited: its
	// goroutine ended.
	pingDue     bool
	awaitsReply bool
	sendDue     bool
	talkWaits   bool
	exited      bool
	// talked: the down direction began the session's last word.
	talked bool
}

// mode is what a direction does with the bytes it reads.
type mode uint8

const (
	relaying  mode = iota // to dst, as they are
	finishing             // the session closes: to dst up to the frame's end, then the close frame
	awaiting              // the close frame is out: dropped, until src's close frame
	dropping              // hold, down: dropped, the provider's frames followed (hold.go)
)

func (s *Session) newDirection(src, dst net.Conn, side int, pending []byte) *direction {
	d := &direction{s: s, src: src, dst: dst, side: uint8(side), pending: pending}
	if s.ka != nil || s.hold || s.tap != nil {
		d.ctl = new(ctlFrame)
	}
	if s.ka != nil {
		d.controls, d.watch = true, [2]byte{pongFirstByte, pongFirstByte}
	}
	if s.hold && side == toProvider {
		d.controls, d.watch[1] = true, closeFirstByte
		if s.ka == nil {
			d.watch[0] = closeFirstByte
		}
	}
	if s.tap != nil && side == toClient {
		d.tr = newTapReader(s.tap)
	}
	d.watching = d.controls || s.tap != nil
	// A message the client cuts short is completed (farewell_fill.go).
	d.frames.followText = d.sendsFarewell()
	if st, ok := src.(*net.TCPConn); ok {
		d.bindRaw(st)
		_, tcp := dst.(*net.TCPConn)
		// With hold the provider's stream is not spliced: a splice that
		// fails toward a client that left loses bytes already taken from
		// the provider, and where its frames start. With a farewell the
		// client's is not either: its tracker follows the text.
		// A tap reads every message of the provider's.
		d.splice = tcp && !(s.hold && side == toClient) && !d.frames.followText && d.tr == nil
	}
	return d
}

// other is the opposite direction (under s.mu).
func (d *direction) other() *direction {
	if d.side == toProvider {
		return d.s.down
	}
	return d.s.up
}

// run is the relay loop of one direction: read, take, and wake on what
// stopped a read.
func (d *direction) run() {
	ok := d.take(d.pending)
	d.pending = nil
	for ok {
		if d.splice && d.mode == relaying && d.frames.remaining >= spliceMin {
			ok = d.spliceFrame()
			continue
		}
		bp, n, err := d.read()
		if n > 0 {
			ok = d.takeRead((*bp)[:n])
		}
		if bp != nil {
			d.release(bp)
		}
		if ok && err != nil {
			ok = d.wake(err)
		}
	}
	d.exit()
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
	switch {
	case err != nil:
		if bp != nil {
			d.release(bp)
		}
		return nil, 0, err
	case rerr != nil:
		return bp, 0, os.NewSyscallError("read", rerr)
	case n <= 0:
		return bp, 0, io.EOF
	}
	return bp, n, nil
}

// takeRead takes bytes a read returned. A read that its interrupt woke
// may still return bytes that came after it: once the session closes,
// those can be the peer's answer to the close frame the other direction
// sent it, which must not be relayed ahead of this direction's own close
// frame. So a relaying direction that reads while the session closes
// acts on the interrupt first, as if its read had returned it, and then
// takes the bytes the way that leaves it (the frame in flight finished,
// then the answer awaited).
func (d *direction) takeRead(p []byte) bool {
	if d.mode == relaying && !d.closingSeen && d.s.closingBegun.Load() {
		if !d.wake(os.ErrDeadlineExceeded) {
			return false
		}
	}
	return d.take(p)
}

// release gives back a buffer read returned (the small one stays).
func (d *direction) release(bp *[]byte) {
	if bp != d.small {
		relayBufs.Put(bp)
	}
}

// take handles bytes read from src as the direction's mode says; it
// reports whether the direction goes on.
func (d *direction) take(p []byte) bool {
	switch {
	case len(p) == 0:
		return true
	case d.mode == relaying && !d.watching:
		d.frames.advance(p, false)
		return d.write(p)
	case d.mode == relaying:
		return d.relayWatching(p)
	case d.mode == finishing:
		return d.finish(p)
	case d.mode == awaiting:
		d.frames.advance(p, false)
		return !d.frames.sawClose
	}
	return d.drop(p)
}

// relayWatching relays p, looking at it: a tapped session's messages
// (tap.go), or the watched control frames.
func (d *direction) relayWatching(p []byte) bool {
	if d.s.tap != nil {
		return d.relayTapped(p)
	}
	return d.relayControl(p)
}

// relayControl relays p, but for the watched control frames: each is
// collected whole (it is short) and handed to control, which may take it
// out of the stream.
func (d *direction) relayControl(p []byte) bool {
	for len(p) > 0 {
		if d.ctl.held() == 0 {
			if n := d.frames.advanceToEither(p, d.watch[0], d.watch[1]); n > 0 {
				if !d.write(p[:n]) {
					return false
				}
				p = p[n:]
				continue
			}
		}
		var done bool
		if p, done = d.ctl.collect(p); !done {
			return true // the frame goes on in the next read
		}
		f := d.ctl.bytes()
		if d.ctl.whole() {
			taken, ok := d.control(f)
			if taken || !ok {
				d.ctl.clear()
				if !ok {
					return false
				}
				if d.mode != relaying {
					return d.take(p) // the session closes (control)
				}
				continue
			}
		}
		// Not one the gateway takes: relayed as it is.
		d.frames.advance(f, false)
		ok := d.write(f)
		d.ctl.clear()
		if !ok {
			return false
		}
	}
	return true
}

// control is handed each whole watched control frame f from src: it
// reports whether the frame is taken out of the stream, and whether the
// direction goes on.
func (d *direction) control(f []byte) (taken, ok bool) {
	switch f[0] {
	case pongFirstByte:
		return d.pong(f), true
	case closeFirstByte:
		if d.side != toProvider || !d.s.hold {
			break
		}
		switch v := d.parkOnClose(f); {
		case v.moved:
			// The session parks: the client's close frame is not relayed
			// (nor anything behind it).
			return true, false
		case v.phase == closing:
			// The gateway closes the session, and the client answered
			// its close frame before this direction's read learnt of it
			// (a read may still return bytes that came after its
			// interrupt): the provider gets the gateway's close frame,
			// with the farewell, and this one is the client's answer.
			return true, d.closeOut(nil)
		}
	}
	return false, true
}

// write relays p, which the frame tracker has already taken, to dst.
func (d *direction) write(p []byte) bool {
	if d.frames.sawClose && !d.closeNoted {
		// The first close frame through the relay tells who ended the
		// session, whichever side hangs up the connection first.
		d.closeNoted = true
		d.s.sync(change{ev: evCloseSeen, d: d, code: d.frames.closeCode()})
	}
	if _, err := d.dst.Write(p); err != nil {
		return d.writeFailed()
	}
	d.s.bytes[d.side].Add(int64(len(p)))
	return true
}

// writeFailed: a write to dst failed. Toward the client of a session with
// hold, the client may be leaving: the direction drops what it reads from
// then on (hold.go). Otherwise the direction ends.
func (d *direction) writeFailed() bool {
	if d.side == toClient && d.lose() {
		return true
	}
	return d.s.cut(endWords[1-d.side][1])
}

// endWords are the end reasons when the source of the direction writing
// to a side ends cleanly, or fails.
var endWords = [2][2]string{
	toProvider: {EndClientClosed, EndClientError},
	toClient:   {EndProviderClosed, EndProviderError},
}

// spliceFrame moves the rest of a long frame with splice(2).
func (d *direction) spliceFrame() bool {
	n := min(d.frames.remaining, spliceMax)
	d.limited.R, d.limited.N = d.src, n
	w, err := d.dst.(*net.TCPConn).ReadFrom(&d.limited)
	if w > 0 {
		d.frames.remaining -= w
		if d.frames.remaining == 0 && d.frames.opcode == opClose {
			d.frames.sawClose = true
		}
		d.s.bytes[d.side].Add(w)
	}
	switch {
	case err != nil:
		return d.wake(err)
	case w < n:
		return d.wake(io.EOF)
	}
	return true
}

// wake handles a read of src that failed with err: an interrupt (for a
// phase the session entered, or a ping), a deadline of the phase, or the
// end of src. It reports whether the direction goes on.
func (d *direction) wake(err error) bool {
	timeout := isTimeout(err)
	switch d.mode {
	case awaiting:
		if d.talkWaits {
			return d.talkReady(err) // lastword.go
		}
		return false // no reply within the wait, or src ended: done
	case finishing:
		if d.sendsFarewell() && !errors.Is(err, net.ErrClosed) {
			// The client's frame stalled for CloseWait, or its connection
			// ended: the provider gets the rest of its message made up,
			// then the farewell (closeOut).
			return d.closeOut(nil)
		}
		if timeout {
			return d.s.cut("") // the frame stalled for CloseWait
		}
		return d.ended(err)
	}
	ev := evLook
	if timeout {
		ev = evWake
	}
	v := d.s.sync(change{ev: ev, d: d})
	d.closingSeen = d.closingSeen || v.phase >= closing
	up := d.side == toProvider
	switch {
	case !up && d.wait != nil && d.wait.talk != nil:
		return d.talkWake(err) // lastword.go
	case !up && v.held:
		return d.held(err, v) // hold.go
	case up && d.s.hold && !errors.Is(err, net.ErrClosed) && (v.phase == leaving || v.phase == live && !timeout):
		return d.leave(err) // hold.go
	case v.phase == closing && !timeout && d.sendsFarewell() && !errors.Is(err, net.ErrClosed):
		// The client's connection ended while the gateway closes the
		// session: the provider still gets the farewell.
		return d.closeOut(nil)
	case !timeout:
		return d.ended(err)
	case v.phase == closing && d.mode == dropping && d.s.lastWord != nil && !d.talked:
		return d.waitToTalk(nil) // the client is lost: the last word first (lastword.go)
	case v.phase == closing && d.mode == dropping:
		return false // the client is lost: the up direction sends the provider its close frame
	case v.phase == closing:
		if d.atWriteBoundary() {
			return d.closeOut(nil)
		}
		d.mode = finishing
		return d.extend()
	case v.phase == ending:
		return d.s.cut("") // the CloseWait after the other side ended is over
	case v.out != nil && !d.writeOut(v.out): // tap.go
		return false
	case v.ping:
		return d.ping() // keepalive.go
	}
	return true
}

// finish writes p to dst up to the end of the frame in flight; at its end
// the close frame follows.
func (d *direction) finish(p []byte) bool {
	n := d.frames.advance(p, true)
	if n > 0 {
		if _, err := d.dst.Write(p[:n]); err != nil {
			return false
		}
		d.s.bytes[d.side].Add(int64(n))
	}
	if d.frames.atBoundary() {
		return d.closeOut(p[n:])
	}
	return d.extend()
}

// extend gives the frame in flight CloseWait more to move, both ways (src
// to send it, dst to take it), unless CloseFrameLimit has passed: then the
// session is cut. (While the session closes, only the direction itself
// sets its deadlines.)
func (d *direction) extend() bool {
	now := time.Now()
	if now.After(d.s.closeBy) {
		if d.sendsFarewell() {
			return d.closeOut(nil) // as for a stalled frame (wake)
		}
		return d.s.cut("")
	}
	dl := now.Add(CloseWait)
	d.src.SetReadDeadline(dl)
	d.dst.SetWriteDeadline(dl)
	return true
}

// closeOut writes the gateway's close frame to dst, at a frame boundary,
// then reads src, discarding it, until the peer there has answered the
// other direction's close frame or CloseWait has passed since that went
// out. rest are bytes read from src behind the boundary. A session's
// farewell goes to the provider right before the close frame, behind the
// rest of a message the client had begun (farewell_fill.go: the client's
// stream may then stop anywhere), without waiting for its answer. A
// session's last word goes to the provider before its close frame too,
// from the down direction (lastword.go): the up direction writes nothing
// more but the rest of the client's message.
func (d *direction) closeOut(rest []byte) bool {
	s := d.s
	b := closeFrame(s.closeCode, s.closeReason, d.side == toProvider)
	if d.sendsFarewell() {
		// A copy: the tracker goes on following the client's stream
		// for the answer to the close frame.
		t := d.frames
		if !d.completeMessage(&t) {
			return d.s.cut("")
		}
		if s.lastWord == nil {
			b = append(appendDataFrame(nil, 0x1, s.farewell.Message), b...)
		} else if s.sync(change{ev: evTalk, d: d}).talkNow {
			// The down direction says the last word, then the close.
			return d.await(rest)
		}
	}
	d.dst.SetWriteDeadline(time.Now().Add(CloseWait))
	if _, err := d.dst.Write(b); err != nil {
		return false
	}
	if d.side == toClient && s.lastWord != nil && !d.talked {
		return d.waitToTalk(rest)
	}
	s.sync(change{ev: evAwait, d: d})
	return d.await(rest)
}

// await has the direction read src only for its close frame, rest first;
// a control frame held back is part of that stream.
func (d *direction) await(rest []byte) bool {
	d.mode = awaiting
	if d.ctl.held() > 0 {
		d.frames.advance(d.ctl.bytes(), false)
		d.ctl.clear()
	}
	d.frames.advance(rest, false)
	return !d.frames.sawClose
}

// goQuiet notes that the direction sends nothing more to dst: when the
// other direction awaits the answer of dst's peer, that peer now has
// CloseWait to give it. Under s.mu.
func (d *direction) goQuiet() {
	if !d.quietAt.IsZero() {
		return
	}
	d.quietAt = time.Now()
	// (An up direction that left a parked session is no one's other.)
	if o := d.other(); o.awaitsReply && o.other() == d {
		d.dst.SetReadDeadline(d.quietAt.Add(CloseWait))
	} else if o.talkWaits && o.other() == d {
		// The down direction waits to say the last word: now it may
		// (lastword.go).
		d.dst.SetReadDeadline(aLongTimeAgo)
	}
}

// ended handles the end of src: a clean end half-closes dst and gives the
// other direction CloseWait to finish; a failure cuts the session.
func (d *direction) ended(err error) bool {
	switch {
	case errors.Is(err, io.EOF):
		// The reason first: the half-close may have dst's peer hang up
		// at once, and the other direction must not find its source's
		// end the first news of who ended the session.
		d.s.sync(change{ev: evEnd, d: d, reason: endWords[d.side][0]})
		if c, ok := d.dst.(interface{ CloseWrite() error }); ok {
			c.CloseWrite()
		}
		return false
	case errors.Is(err, net.ErrClosed):
		// Someone closed a socket under us (the session's own cut, or a
		// client whose handshake answer failed): make sure the other
		// direction stops too, whatever its peer does.
		return d.s.cut("")
	}
	return d.s.cut(endWords[d.side][1])
}

// exit is the direction's last act: it goes quiet, and the session ends
// once no direction runs.
func (d *direction) exit() {
	if d.s.sync(change{ev: evExit, d: d}).last {
		d.s.end()
	}
}
