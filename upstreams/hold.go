package upstreams

import (
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"time"
)

// Hold: a session whose client leaves can keep its provider connection and
// wait for the client to come back.
//
// The client side ends in one of three ways: its close frame, its
// connection ending (EOF, reset, a write to it that fails), or keepalive
// finding it answers no ping. With hold, when that happens while the
// client's stream is between two messages, the session parks instead of
// ending: the client's close frame is not relayed (the gateway answers it
// itself), the client's connection is closed, and the provider's
// connection stays open with its slot. While parked, whatever the
// provider sends is read and dropped (counted), whole frames only being
// followed by their headers; its pings are answered with masked pongs;
// the idle timeout and keepalive rest; the time limit still applies.
// Resume joins a new client where the provider's stream is next between
// two messages (so its first frame starts a message), and the relay goes
// on as before: it may park and resume again. ResumeWith may have the
// gateway send the provider messages of its own first, and await their
// answers (hold_preamble.go). A client that leaves in the middle of one of
// its frames (or between the frames of a fragmented message) cannot be
// held: the provider would wait for the rest of it. The session then ends
// as it would without hold.
//
// The relay's hot path pays nothing for hold when it is off; with hold,
// the client's stream is watched for close frames the way keepalive
// watches for pongs (the first byte of each frame), and the provider's
// stream toward the client is not spliced: a splice that fails on the
// client's side loses bytes already taken from the provider, and the relay
// would no longer know where the provider's frames start.

// ErrNotParked is Resume's error when the session is not parked (it has
// ended, is closing, or another client has resumed it).
var ErrNotParked = errors.New("the session is not parked")

// Frame first bytes the hold watches for (FIN set, no RSV bits: control
// frames are never fragmented).
const (
	closeFirstByte = 0x80 | opClose
	pingFirstByte  = 0x80 | opPing
)

// Hold states of a session (holdState.state), changed under closeMu.
const (
	// hsLive: a client is joined.
	hsLive int32 = iota
	// hsLosing: a write toward the client failed; the down direction
	// drops what the provider sends while the up direction decides
	// whether the session parks.
	hsLosing
	// hsParking: the up direction decided to park and is on its way out.
	hsParking
	// hsParked: the down direction alone reads the provider.
	hsParked
	// hsOver: the session ended (or is ending) while parked.
	hsOver
)

// kaLostTicks is how many keepalive ticks the up direction has, once
// keepalive found the client dead, to park the session before keepalive
// closes it as it would without hold.
const kaLostTicks = 4

// holdState is a session's part in parking, and how its client side ended.
type holdState struct {
	on     bool
	onPark func(*Session)
	state  atomic.Int32
	// parked: from just before OnPark until a Resume is taken or the
	// session ends (set under closeMu).
	parked atomic.Bool
	// Under closeMu: echo is the close frame answering the client's,
	// sent when the old client is let go; resume is the client waiting to
	// join; kaLostN counts the keepalive ticks since keepalive asked the
	// up direction to park.
	echo    []byte
	resume  *resumeReq
	kaLostN int
	// resumeWanted mirrors resume != nil, for the down direction's checks
	// between frames while parked.
	resumeWanted atomic.Bool
	// kaLost: keepalive found the client dead and interrupted the up
	// direction to park.
	kaLost atomic.Bool
	// epoch counts resumes: keepalive starts afresh with each client.
	epoch atomic.Int64
	// What the provider sent while the session had no client.
	droppedFrames, droppedBytes atomic.Int64

	// For every session, with hold or not: clientCode is the status code
	// of the client's close frame (closeNoStatus when it had none; 0 when
	// it sent none); kaClientDead tells that keepalive closed the session
	// because the client side answered no ping.
	clientCode   atomic.Int32
	kaClientDead atomic.Bool
}

// resumeReq is a client waiting to join a parked session.
type resumeReq struct {
	client  net.Conn
	pending []byte
	opts    ResumeOptions
}

// dirHold is a direction's part in watching frames and parking.
type dirHold struct {
	// watch: forward goes through forwardWatching, which stops before
	// frames whose first byte is watchA or watchB.
	watch          bool
	watchA, watchB byte
	// parkClose (the up direction with hold): a close frame from the
	// client at a frame start parks the session.
	parkClose bool
	// parking (up): run is on its way out to park the session.
	parking bool
	// The down direction while the session has no client: entered (the
	// parked loop has counted the frame in flight), dropped (it has
	// dropped bytes of the provider's stream), left (the old client is let
	// go), stash (bytes read while the session was closing, before the
	// parked loop took over).
	entered, dropped, left bool
	stash                  []byte
	// wait: the answers to a joining client's preamble are awaited
	// (hold_preamble.go).
	wait *replyWait
}

// initHold sets up the frame watching of both directions: keepalive's
// pongs, and with hold the client's close frames.
func (s *Session) initHold(o SessionOptions) {
	if o.Keepalive > 0 {
		s.up.h = dirHold{watch: true, watchA: pongFirstByte, watchB: pongFirstByte}
		s.down.h = dirHold{watch: true, watchA: pongFirstByte, watchB: pongFirstByte}
	}
	if !o.Hold {
		return
	}
	s.hold.on = true
	s.hold.onPark = o.OnPark
	s.up.h.watch, s.up.h.parkClose = true, true
	s.up.h.watchB = closeFirstByte
	if o.Keepalive <= 0 {
		s.up.h.watchA = closeFirstByte
	}
	s.down.splice = false
}

// Parked reports whether the session is parked: its client has left, the
// provider's connection is held, and Resume can join a new client.
func (s *Session) Parked() bool { return s.hold.parked.Load() }

// ClientEnded reports whether the session ended, or parked, because of the
// client's side: its close frame, its connection ending or failing (a write
// toward it that fails too), or keepalive finding it answers no ping. It is
// false when the provider ended it, when the gateway closed it (an
// operator, the idle timeout, the time limit, shutdown), and for a session
// that ended while parked. Valid once Done is closed, or while parked.
func (s *Session) ClientEnded() bool {
	switch s.hold.state.Load() {
	case hsParking, hsParked:
		return true
	case hsOver:
		return false
	}
	switch s.Reason() {
	case EndClientClosed, EndClientError:
		return true
	case EndKeepalive:
		return s.hold.kaClientDead.Load()
	}
	return false
}

// ClientCloseCode is the status code of the client's close frame when it
// sent one (1000 when the frame carried none, or one that may not be sent
// on the wire), and 1001 when it sent none (its connection dropped: the
// 1006 a receiver reports then can never be sent). For a parked session it
// is the code of the client that left last.
func (s *Session) ClientCloseCode() int {
	c := int(s.hold.clientCode.Load())
	switch {
	case c == 0:
		return CloseGoingAway
	case !sendableCode(c):
		return CloseNormal
	}
	return c
}

// sendableCode reports whether a close status code may be sent in a close
// frame.
func sendableCode(c int) bool {
	switch {
	case c >= 1000 && c <= 1003, c >= 1007 && c <= 1014, c >= 3000 && c <= 4999:
		return true
	}
	return false
}

// ParkedDropped counts what the provider sent while the session had no
// client (over all its parks): frames (a frame in flight toward the client
// that left counts as one), and bytes.
func (s *Session) ParkedDropped() (frames, bytes int64) {
	return s.hold.droppedFrames.Load(), s.hold.droppedBytes.Load()
}

// Resume joins client to the parked session. pending are bytes the client
// sent behind its handshake: they go to the provider first. The caller has
// answered the client's handshake; from a nil return on, the session owns
// client: it joins where the provider's stream is next between two
// messages (what the provider sent until then is dropped), or, when the
// session ends before that, it gets a close frame and is closed. The error is
// ErrNotParked when the session is not parked: it ended or is closing
// meanwhile, or another client resumed it first.
func (s *Session) Resume(client net.Conn, pending []byte) error {
	return s.resume(&resumeReq{client: client, pending: pending})
}

func (s *Session) resume(req *resumeReq) error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if !s.hold.parked.Load() || s.closing.Load() || s.hold.resume != nil {
		return ErrNotParked
	}
	s.hold.resume = req
	s.hold.resumeWanted.Store(true)
	s.hold.parked.Store(false)
	// Wake the down direction.
	s.upstream.SetReadDeadline(aLongTimeAgo)
	return nil
}

// idleHeld reports whether the idle timeout rests: a parked session waits
// for its client.
func (s *Session) idleHeld() bool {
	return s.hold.on && s.hold.state.Load() != hsLive
}

// keepaliveRests reports whether keepalive rests: the session has no
// client. After a resume, the pingers start afresh.
func (s *Session) keepaliveRests(seen *int64, pingers ...*pinger) bool {
	if s.hold.state.Load() != hsLive {
		return true
	}
	if e := s.hold.epoch.Load(); e != *seen {
		*seen = e
		for _, k := range pingers {
			*k = pinger{interval: k.interval}
		}
	}
	return false
}

// clientDead is keepalive's word that the client side answered no ping.
// With hold, it asks the up direction to park the session and reports true;
// when that is not possible, or the up direction has not done it within a
// few ticks, it reports false and keepalive closes the session.
func (s *Session) clientDead() bool {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if !s.hold.on || s.closing.Load() || s.hold.state.Load() != hsLive || s.hold.kaLostN >= kaLostTicks {
		s.hold.kaClientDead.Store(true)
		return false
	}
	s.hold.kaLostN++
	if !s.hold.kaLost.Load() {
		s.hold.kaLost.Store(true)
		s.client.SetReadDeadline(aLongTimeAgo)
	}
	return true
}

// holdKeepsDeadline reports (under closeMu) whether the direction's read is
// interrupted for hold, so keepalive leaves its deadline alone.
func (d *direction) holdKeepsDeadline() bool {
	s := d.s
	if !s.hold.on {
		return false
	}
	return s.hold.state.Load() != hsLive || (d.toUpstream && s.hold.kaLost.Load())
}

// holdInterrupt reports whether a read error of src is hold's to handle:
// for the up direction, the client's side ended (or was found dead) while
// the session is not closing; for the down direction, the session has no
// client (any more).
func (d *direction) holdInterrupt(err error) bool {
	s := d.s
	if !d.toUpstream {
		return s.hold.state.Load() != hsLive
	}
	if s.closing.Load() {
		return false
	}
	if isTimeout(err) {
		return s.hold.state.Load() == hsLosing || s.hold.kaLost.Load()
	}
	// A socket closed under us: the session is being torn down.
	return !errors.Is(err, net.ErrClosed)
}

// holdStep handles what holdInterrupt reported; it tells whether the
// direction goes on.
func (d *direction) holdStep(err error) bool {
	if !d.toUpstream {
		return d.parkedRun(err)
	}
	return d.clientGone(err)
}

// clientGone runs on the up direction when the client's side has ended:
// between two of the client's messages the session parks (run exits and
// exit finishes the park); in the middle of one it ends as it would
// without hold.
func (d *direction) clientGone(err error) bool {
	s := d.s
	if d.frames.atMessageBoundary() && d.pong.n == 0 && d.tryPark(0, nil) {
		return false
	}
	s.closeMu.Lock()
	losing := s.hold.state.Load() == hsLosing
	s.closeMu.Unlock()
	kaLost := s.hold.kaLost.Load()
	switch {
	case isTimeout(err) && kaLost && !losing:
		// Keepalive found the client dead: it closes the session.
		s.hold.kaClientDead.Store(true)
		s.Close(CloseGoingAway, EndKeepalive)
		return true
	case isTimeout(err) || losing:
		// A write toward the client failed: it is gone.
		if errors.Is(err, io.EOF) {
			s.setReason(EndClientClosed)
		} else {
			s.setReason(EndClientError)
		}
		s.abort()
		return false
	}
	d.ended(err)
	return false
}

// parkOnClose parks the session on the client's close frame (whole in
// frame), which is then not relayed; the client gets the answer to it.
func (d *direction) parkOnClose(frame []byte) bool {
	if d.frames.fragmented {
		// Between two frames of a message: the provider would wait for
		// the rest of it.
		return false
	}
	code := closeNoStatus
	payload := frame[2:]
	var key []byte
	if frame[1]&0x80 != 0 {
		key, payload = frame[2:6], frame[6:]
	}
	echo := controlFrame(opClose, nil, false)
	if len(payload) >= 2 {
		b := [2]byte{payload[0], payload[1]}
		if key != nil {
			b[0] ^= key[0]
			b[1] ^= key[1]
		}
		code = int(binary.BigEndian.Uint16(b[:]))
		echo = controlFrame(opClose, b[:], false)
	}
	return d.tryPark(int32(code), echo)
}

// tryPark decides, on the up direction between two messages of the
// client's stream, to park the session; it reports false when the session
// is ending anyway (closing, the provider gone or its close frame relayed,
// an end reason already given). code is the client's close code (0: none),
// echo the close frame answering it.
func (d *direction) tryPark(code int32, echo []byte) bool {
	s := d.s
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	st := s.hold.state.Load()
	if (st != hsLive && st != hsLosing) || s.closing.Load() || s.halfClosed || s.down.quiet || s.reason.Load() != nil {
		return false
	}
	s.hold.state.Store(hsParking)
	s.hold.clientCode.Store(code)
	s.hold.echo = echo
	d.h.parking = true
	return true
}

// exit ends a direction's run: it goes quiet; an up direction that parks
// hands the session to the down direction; the session ends once no
// direction runs.
func (d *direction) exit() {
	d.goQuiet()
	if d.h.parking {
		d.parkDone()
	}
	d.s.directionDone()
}

// parkDone runs as the up direction's very last use of its state: the down
// direction may now let the old client go and, later, rebuild the up
// direction for a new client.
func (d *direction) parkDone() {
	s := d.s
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	d.h.parking = false
	if s.hold.state.Load() != hsParking {
		return // the session ended meanwhile
	}
	s.hold.state.Store(hsParked)
	// A write to a client that reads nothing more gives up.
	s.client.SetWriteDeadline(time.Now().Add(CloseWait))
	// Wake the down direction.
	s.upstream.SetReadDeadline(aLongTimeAgo)
}

// lostClientWrite runs on the down direction when a write toward the client
// failed. With the session live, the client is taken as gone: the up
// direction is interrupted to decide whether the session parks, and this
// direction drops what the provider sends from its next read on. It
// reports whether the direction goes on (the bytes are dropped).
func (d *direction) lostClientWrite() bool {
	if d.toUpstream {
		return false
	}
	s := d.s
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	switch s.hold.state.Load() {
	case hsLive:
		if s.closing.Load() || s.halfClosed || s.up.quiet || s.reason.Load() != nil {
			return false
		}
		s.hold.state.Store(hsLosing)
		s.client.SetReadDeadline(aLongTimeAgo)
		d.src.SetReadDeadline(aLongTimeAgo)
		return true
	case hsLosing, hsParking, hsParked:
		return true
	}
	return false
}

// stashParked keeps bytes the down direction read from the provider while
// the session, without a client, started closing: the parked loop takes
// them from there.
func (d *direction) stashParked(p []byte) bool {
	if d.toUpstream || d.s.hold.state.Load() == hsLive {
		return false
	}
	d.h.stash = append(d.h.stash, p...)
	return true
}

// Events of dropBytes.
const (
	evNone   = iota // the bytes were all taken
	evJoin          // a message boundary where a waiting client can join
	evClose         // the provider's close frame is whole in d.pong
	evFailed        // a pong could not be written to the provider
)

// parkedRun is the down direction while the session has no client (or is
// losing it). err is the read error that brought it here. It reports true
// once a new client has joined (the direction goes on relaying to it), and
// false when the session ends.
func (d *direction) parkedRun(err error) bool {
	s := d.s
	if !d.h.entered {
		d.h.entered = true
		if !d.frames.atBoundary() || d.pong.n > 0 {
			s.hold.droppedFrames.Add(1) // the rest of it is dropped
		}
	}
	for {
		if err != nil && !isTimeout(err) {
			return d.parkedEnd(err)
		}
		err = nil
		s.closeMu.Lock()
		st := s.hold.state.Load()
		closing := s.closing.Load()
		if !closing {
			// Interruptions (parking, a resume, Close) come under closeMu:
			// none is missed. The wait for a preamble's answers ends at
			// its deadline.
			d.src.SetReadDeadline(d.parkedDeadline())
		}
		s.closeMu.Unlock()
		if closing {
			return d.parkedClose(st)
		}
		if st == hsParked && !d.h.left {
			d.leaveClient()
		}
		if d.h.left && s.hold.resumeWanted.Load() {
			ready, ok := d.joinReady()
			if !ok {
				return d.parkedFailed()
			}
			if ready && d.frames.atMessageBoundary() && d.pong.n == 0 && d.join() {
				return true
			}
		}
		bp, n, rerr := d.read()
		if n > 0 {
			joined, ok := d.dropRead((*bp)[:n])
			d.release(bp)
			if joined || !ok {
				return ok
			}
		} else if bp != nil {
			d.release(bp)
		}
		err = rerr
	}
}

// dropRead takes bytes read from the provider while parked. It reports
// whether a client joined (the bytes behind the boundary went to it) and
// whether the direction goes on.
func (d *direction) dropRead(p []byte) (joined, ok bool) {
	for {
		rest, ev := d.dropBytes(p)
		switch ev {
		case evJoin:
			if d.join() {
				return true, len(rest) == 0 || d.forward(rest)
			}
			if d.s.closing.Load() {
				// The session closes: the parked loop goes on from the
				// close, these bytes with it.
				d.h.stash = append(d.h.stash, rest...)
				return false, true
			}
			p = rest
			continue
		case evClose:
			return false, d.providerClosed()
		case evFailed:
			return false, d.parkedFailed()
		}
		return false, true
	}
}

// dropBytes drops bytes from the provider, following its frames, up to an
// event: a message boundary where a waiting client can join, or the
// provider's close frame. Pings are answered (masked pongs, as a client
// answers) once the up direction is gone. It returns what is left of p.
func (d *direction) dropBytes(p []byte) ([]byte, int) {
	s := d.s
	start := len(p)
	defer func() {
		if n := start - len(p); n > 0 {
			d.h.dropped = true
			s.hold.droppedBytes.Add(int64(n))
		}
	}()
	h := &d.pong
	for len(p) > 0 {
		if h.n == 0 {
			if !d.frames.atBoundary() {
				if d.collecting() {
					p = d.collect(p)
				} else {
					p = p[d.frames.advance(p, true):]
				}
				continue
			}
			if d.h.left && !d.frames.fragmented && s.hold.resumeWanted.Load() {
				ready, ok := d.joinReady()
				if !ok {
					return p, evFailed
				}
				if ready {
					return p, evJoin
				}
			}
			s.hold.droppedFrames.Add(1)
			if b := p[0]; b != pingFirstByte && b != closeFirstByte {
				d.frames.advance(p[:1], false)
				p = p[1:]
				continue
			}
		}
		// p starts with (the rest of) a control frame: collect it.
		var total int
		if p, total = h.collect(p); total == 0 || (total > 0 && h.n < total) {
			break // the frame goes on in the next read
		}
		if total < 0 {
			// Too long for a control frame: the tracker skips it.
			d.frames.advance(h.buf[:h.n], false)
			h.n = 0
			continue
		}
		switch h.buf[0] {
		case closeFirstByte:
			return p, evClose
		case pingFirstByte:
			if s.hold.state.Load() != hsLosing {
				if _, err := d.src.Write(controlFrame(opPong, h.payload(), true)); err != nil {
					h.n = 0
					s.setReason(EndProviderError)
					return p, evFailed
				}
			}
		}
		h.n = 0
	}
	return p, evNone
}

// payload is the held (whole) frame's payload, unmasked.
func (h *pongHold) payload() []byte {
	f := h.buf[:h.n]
	if f[1]&0x80 == 0 {
		return append([]byte(nil), f[2:]...)
	}
	out := append([]byte(nil), f[6:]...)
	for i := range out {
		out[i] ^= f[2+(i&3)]
	}
	return out
}

// leaveClient lets the old client go once the up direction is gone: the
// answer to its close frame when it sent one (and the stream toward it is
// between two frames), then its connection closes; OnPark follows.
func (d *direction) leaveClient() {
	s := d.s
	s.closeMu.Lock()
	echo := s.hold.echo
	s.hold.echo = nil
	s.closeMu.Unlock()
	old := d.dst
	if echo != nil && !d.h.dropped && d.frames.atBoundary() {
		old.Write(echo) // parkDone gave it a write deadline
	}
	old.Close()
	d.h.left = true
	s.closeMu.Lock()
	parked := s.hold.state.Load() == hsParked && !s.closing.Load()
	if parked {
		s.hold.parked.Store(true)
	}
	s.closeMu.Unlock()
	if parked && s.hold.onPark != nil {
		s.hold.onPark(s)
	}
}

// join makes the waiting client the session's client, at a message
// boundary of the provider's stream: this direction relays to it from here, and a
// new up direction relays from it (its pending bytes first). It reports
// false when no client waits or the session is closing.
func (d *direction) join() bool {
	s := d.s
	s.closeMu.Lock()
	req := s.hold.resume
	if req == nil || s.closing.Load() || s.hold.state.Load() != hsParked {
		s.closeMu.Unlock()
		return false
	}
	s.hold.resume = nil
	s.hold.resumeWanted.Store(false)
	c := req.client
	s.client = c
	d.dst = c
	d.kaDue.Store(false)
	d.h.entered, d.h.dropped, d.h.left = false, false, false
	// The up direction starts afresh on the new client; its counters go
	// on.
	u := &s.up
	u.src = c
	u.raw, u.rawFn, u.splice = nil, nil, false
	u.small, u.bulk, u.rbuf, u.rn, u.rerr = nil, false, nil, 0, nil
	u.pending = req.pending
	u.frames = frameTracker{}
	u.closeTimeouts, u.closeNoted = 0, false
	u.quiet, u.quietAt, u.replyWait = false, time.Time{}, false
	u.kaDue.Store(false)
	u.pong.n = 0
	u.h.parking = false
	u.init()
	s.hold.kaLost.Store(false)
	s.hold.kaLostN = 0
	s.hold.kaClientDead.Store(false)
	s.hold.clientCode.Store(0)
	s.hold.epoch.Add(1)
	s.hold.state.Store(hsLive)
	s.remaining.Add(1)
	d.src.SetReadDeadline(time.Time{})
	s.closeMu.Unlock()
	go u.run()
	d.joinedReport()
	return true
}

// takeResume ends the parked state for good (the session ends): a client
// waiting to join gets a close frame with code and reason and is closed.
// It returns the state the session was in.
func (d *direction) takeResume(code int, reason string) int32 {
	s := d.s
	s.closeMu.Lock()
	st := s.hold.state.Load()
	req := s.hold.resume
	s.hold.resume = nil
	s.hold.resumeWanted.Store(false)
	s.hold.parked.Store(false)
	if st != hsLosing {
		s.hold.state.Store(hsOver)
	}
	s.closeMu.Unlock()
	if req != nil {
		req.client.SetWriteDeadline(time.Now().Add(CloseWait))
		req.client.Write(closeFrame(code, reason, false))
		req.client.Close()
	}
	return st
}

// parkedEnd: the provider's connection ended or failed while the session
// had no client.
func (d *direction) parkedEnd(err error) bool {
	s := d.s
	clean, failed := d.endWords()
	word := failed
	if errors.Is(err, io.EOF) {
		word = clean
	}
	if st := d.takeResume(CloseGoingAway, word); st == hsLosing {
		// The up direction still decides: as without hold.
		d.ended(err)
		return false
	}
	// An error from the session's own abort (a closed socket) leaves the
	// reason it was given.
	if !errors.Is(err, net.ErrClosed) {
		s.setReason(word)
	}
	d.letClientGo()
	return false
}

// providerClosed: the provider sent a close frame (whole in d.pong) while
// the session had no client. The gateway answers it as the client would,
// and the session ends once the provider hangs up (or CloseWait has
// passed).
func (d *direction) providerClosed() bool {
	s := d.s
	s.setReason(EndProviderClosed)
	frame := d.pong.payload()
	d.pong.n = 0
	code := CloseGoingAway
	var echo []byte
	if len(frame) >= 2 {
		echo = frame[:2]
		if c := int(binary.BigEndian.Uint16(echo)); sendableCode(c) {
			code = c
		}
	}
	if st := d.takeResume(code, EndProviderClosed); st == hsLosing {
		// The up direction is still there (and may be writing to the
		// provider): it finds this direction gone and ends the session.
		return false
	}
	d.letClientGo()
	d.src.SetWriteDeadline(time.Now().Add(CloseWait))
	if _, err := d.src.Write(controlFrame(opClose, echo, true)); err != nil {
		return false
	}
	d.src.SetReadDeadline(time.Now().Add(CloseWait))
	var buf [512]byte
	for {
		if _, err := d.src.Read(buf[:]); err != nil {
			return false
		}
	}
}

// letClientGo closes the down direction's client connection, once: the
// session no longer writes to the client that left.
func (d *direction) letClientGo() {
	if !d.h.left {
		d.dst.Close()
		d.h.left = true
	}
}

// parkedClose: Close on a session without a client. The provider gets the
// close frame (masked: the gateway speaks as the client), and the session
// ends once it answers or CloseWait has passed. st is the hold state the
// session was in.
func (d *direction) parkedClose(st int32) bool {
	s := d.s
	s.closeMu.Lock()
	code, reason := s.closeCode, s.closeReason
	s.closeMu.Unlock()
	d.takeResume(code, reason)
	if st == hsLosing {
		// The up direction is still there: it sends the close frame to
		// the provider.
		return false
	}
	d.letClientGo()
	d.src.SetWriteDeadline(time.Now().Add(CloseWait))
	if _, err := d.src.Write(closeFrame(code, reason, true)); err != nil {
		return false
	}
	d.src.SetReadDeadline(time.Now().Add(CloseWait))
	// The answer: the tracker follows the provider's frames from where
	// they are (a control frame held, bytes stashed, then reads).
	d.frames.sawClose = false
	if d.pong.n > 0 {
		d.frames.advance(d.pong.buf[:d.pong.n], false)
		d.pong.n = 0
	}
	stash := d.h.stash
	d.h.stash = nil
	d.awaitClose(stash)
	return false
}

// controlFrame builds a control frame (payload at most 125 bytes), masked
// toward the provider.
func controlFrame(op byte, payload []byte, masked bool) []byte {
	b := make([]byte, 0, 6+len(payload))
	b = append(b, 0x80|op)
	if !masked {
		b = append(b, byte(len(payload)))
		return append(b, payload...)
	}
	b = append(b, 0x80|byte(len(payload)))
	return appendMasked(b, payload)
}

// appendMasked appends a fresh masking key and payload masked with it.
func appendMasked(b, payload []byte) []byte {
	var key [4]byte
	binary.LittleEndian.PutUint32(key[:], rand.Uint32())
	b = append(b, key[:]...)
	start := len(b)
	b = append(b, payload...)
	for i := start; i < len(b); i++ {
		b[i] ^= key[(i-start)&3]
	}
	return b
}
