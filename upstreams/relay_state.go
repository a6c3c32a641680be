package upstreams

import (
	"net"
	"time"
)

// The relay's phases, and the one function that changes them.
//
// A session is in one phase at a time. step moves it, and does there what
// entering the new phase asks of the relay's two directions (up: the
// client's bytes to the provider; down: the provider's to the client).
// The directions do not look at the phase while they relay: a phase one
// of them must act on interrupts its read (a read deadline in the past),
// so it learns of it at its next read, every byte it read before relayed,
// and acts on it at a frame boundary (relay.go, and the hooks in
// keepalive.go and hold.go). A read deadline is cleared only here, when
// the phase asks nothing (more) of the direction, so no interrupt is lost.
//
//	from              event     to        entering it
//	live              evLost    leaving   (hold) the up direction's read is interrupted
//	live, leaving     evLeft    parking   (hold) the down direction's read is interrupted
//	parking           evLetGo   parked    (hold) the provider's reads block again
//	parked            evResume  joining   (hold, not with a farewell) the down direction's read is interrupted
//	joining           evJoin    live      (hold) a new up direction starts on the new client
//	live … joining    evEnd     ending    a clean end gives the other direction CloseWait
//	live … ending     evClose   closing   both reads interrupted; the sockets close at the latest
//	                                      CloseFrameLimit + 2*CloseWait later
//	any               evDone    over      the timers stop (end closes the sockets)
//
// A client waiting to join a session that goes to ending, closing or over
// instead gets a close frame. Without hold a session only ever goes from
// live to ending or closing, and to over.
//
// All the session's shared state is under s.mu, taken only by sync below:
// the goroutines of the directions, the session's timers and its methods
// meet there. (closeCode, closeReason and closeBy are written once, as
// closing begins, before a direction can learn of it; they are read
// without the lock after that.)
type phase uint8

const (
	// live: a client is joined and both directions relay.
	live phase = iota
	// leaving: the client looks gone (a write to it failed, or it
	// answered no ping); the up direction is asked whether the client's
	// stream is between two messages: then the session parks, else it
	// ends as it would without hold. If a write failed, the down
	// direction drops what it reads meanwhile.
	leaving
	// parking: the client left between two of its messages; the up
	// direction is gone, and the down direction is to let the old client
	// go (the answer to its close frame, then its connection closed).
	parking
	// parked: no client. The down direction follows the provider's frames
	// and drops them, answers its pings and its close frame.
	parked
	// joining: a client waits to join (Resume): it does where the
	// provider's stream is next between two messages, once the answers to
	// its preamble are in (hold_preamble.go).
	joining
	// ending: a side ended, or the session was cut: nothing more is
	// started (no ping, park or join); what still runs finishes by itself.
	ending
	// closing: the gateway ends the session (Close): each direction
	// finishes its frame in flight, sends its receiver a close frame and
	// waits at most CloseWait for the reply; without a client, the
	// provider alone gets one.
	closing
	// over: no direction runs; the sockets are closed.
	over
)

// withoutClient reports whether, in p, the down direction holds the
// provider's connection with no client (hold).
func (p phase) withoutClient() bool { return p == parking || p == parked || p == joining }

// An event is a phase event (the table above), or a note sync takes
// without a move.
type event uint8

const (
	evLost event = iota
	evLeft
	evLetGo
	evResume
	evJoin
	evEnd
	evClose
	evDone

	// evWake: a direction's read stopped on a deadline, or it is done
	// with what its phase asked: sync hands it what the phase asks (a due
	// ping, the answer to the client's close frame, the client waiting to
	// join), and has its reads block again if that is nothing.
	evWake
	evAwait     // the direction's close frame is out: it reads src for the reply
	evExit      // the direction's goroutine ends (v.last: it was the last)
	evCloseSeen // the first close frame from the direction's source went through
	evPong      // a pong from the direction's source answered the gateway
	evDropped   // the provider sent c.frames, c.bytes while without a client
	evTick      // the session's timer (Session.tick)
	evLook      // a look at the session's state
	evSend      // the tap sends the provider c.msg (tap.go)
	evOut       // the up direction is at a message boundary: it takes the tap's messages
	evTalk      // a closing session's last word (lastword.go): the up direction is done with the provider, or the down direction with the client
)

// change is an event with what it carries.
type change struct {
	ev event
	// d is the direction it happened on; for evEnd, the one whose source
	// ended cleanly (the other then has CloseWait).
	d *direction
	// evClose: the close frame's code and reason (clientDead: keepalive
	// found the client dead). evEnd: the reason to give the session ("":
	// none), and the close code for a client waiting to join. evLeft: the
	// client's close code (0: it sent none), and echo the frame answering
	// it. evCloseSeen: the code.
	code       int
	reason     string
	echo       []byte
	clientDead bool
	req        *resumeReq // evResume: the client waiting to join
	byWrite    bool       // evLost: a write failed (else keepalive found the client dead)
	msg        []byte     // evSend: the frame
	// evDropped.
	frames, bytes int64
}

// view is what sync tells its caller.
type view struct {
	moved bool  // the phase event applied
	from  phase // the phase before it
	phase phase
	// held: before c, the down direction held the provider with no client
	// (the session was parking, parked, joining, or closing from there).
	held bool
	// leaving: a write toward the client failed (else keepalive found it
	// dead).
	byWrite bool
	// evWake: a ping is due and dst is at a frame boundary (counted: the
	// caller writes it); parking: the answer to the client's close frame
	// (taken); joining: the client waiting to join.
	ping bool
	echo []byte
	req  *resumeReq
	// evWake, evOut: the tap's frames for the provider, to write now;
	// evSend: whether the frame was queued.
	out  []byte
	sent bool
	// evTalk: the down direction says the last word now (down: the up
	// direction is quiet; up: the down direction still runs to say it).
	talkNow bool
	// client: the client's connection; last (evExit): the last
	// direction ended.
	client net.Conn
	last   bool
	// For the session's methods.
	reason                       string
	clientCode                   int
	kaClientDead                 bool
	dropFrames, dropBytes, pings int64
}

// sync applies c to the session under s.mu and tells the caller what it
// needs to know.
func (s *Session) sync(c change) (v view) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v.from = s.phase
	v.held = s.phase.withoutClient() || s.phase == closing && s.closeHeld
	d := c.d
	switch c.ev {
	case evWake:
		v.ping = d.pingDue && s.phase == live && d.atWriteBoundary()
		d.pingDue = false
		if d.sendDue && d.frames.atMessageBoundary() && d.ctl.held() == 0 {
			v.out = s.takeOut(d)
		}
		if v.ping {
			s.ka.pings[d.side]++
		}
		if s.asksNothing(d) {
			d.src.SetReadDeadline(d.replyDeadline())
		}
		if d.side == toClient && s.phase == parking {
			v.echo, s.echo = s.echo, nil
		}
		v.req = s.joiner
	case evAwait:
		d.goQuiet()
		// While the other direction's close frame is not out yet (its own
		// frame in flight), wait on.
		wait := s.closeBy.Add(CloseWait)
		if o := d.other(); !o.quietAt.IsZero() {
			wait = o.quietAt.Add(CloseWait)
		}
		d.awaitsReply = true
		d.src.SetReadDeadline(wait)
	case evExit:
		d.goQuiet()
		d.exited, d.talkWaits = true, false
		s.running--
		if v.last = s.running == 0; v.last {
			s.setReason(EndProviderClosed)
			s.step(change{ev: evDone})
		}
	case evCloseSeen:
		s.setReason(endWords[d.side][0])
		if d.side == toProvider {
			s.clientCode = c.code
		}
	case evPong:
		s.ka.pongs[1-d.side]++
	case evDropped:
		s.dropFrames += c.frames
		s.dropBytes += c.bytes
	case evTick:
		s.tick()
	case evSend:
		v.sent = s.queueOut(c.msg)
	case evOut:
		v.out = s.takeOut(d)
	case evTalk:
		v.talkNow = s.talkTurn(d)
	case evLook:
		v.req = s.joiner
	default:
		v.moved = s.step(c)
	}
	v.phase, v.byWrite, v.client = s.phase, s.leaveByWrite, s.client
	v.reason, v.clientCode, v.kaClientDead = s.reason, s.clientCode, s.kaClientDead
	v.dropFrames, v.dropBytes = s.dropFrames, s.dropBytes
	if s.ka != nil {
		v.pings = s.ka.pings[0] + s.ka.pings[1]
	}
	return v
}

// talkTurn is evTalk's work (under s.mu) in a closing session with a
// last word. For the up direction: it writes the provider nothing more,
// and awaits the client's answer to the close frame; the last word is the
// down direction's while that one still runs. For the down direction: the
// client has its close frame; it may talk once the up direction is quiet,
// else it waits for that (goQuiet interrupts its read), at the latest
// until the client's frame in flight is cut.
func (s *Session) talkTurn(d *direction) bool {
	d.goQuiet()
	if d.side == toProvider {
		o := s.down
		wait := s.closeBy.Add(CloseWait)
		if !o.quietAt.IsZero() {
			wait = o.quietAt.Add(CloseWait)
		}
		d.awaitsReply = true
		d.src.SetReadDeadline(wait)
		return !o.exited
	}
	if u := s.up; u == nil || !u.quietAt.IsZero() || u.exited {
		d.talkWaits = false
		return true
	}
	d.talkWaits = true
	d.src.SetReadDeadline(s.closeBy.Add(CloseWait))
	return false
}

// asksNothing reports whether the phase asks nothing of d beyond relaying
// (or, without a client, dropping): its reads may block again.
func (s *Session) asksNothing(d *direction) bool {
	switch s.phase {
	case live:
		return true
	case leaving, parked:
		return d.side == toClient
	case joining:
		return d.side == toClient && d.wait != nil // the preamble is out
	}
	return false
}

// next is the phase ev moves p to; ok is false when ev does not apply in
// p.
func next(p phase, ev event) (to phase, ok bool) {
	switch {
	case ev == evLost && (p == live || p == leaving):
		return leaving, true
	case ev == evLeft && (p == live || p == leaving):
		return parking, true
	case ev == evLetGo && p == parking:
		return parked, true
	case ev == evResume && p == parked:
		return joining, true
	case ev == evJoin && p == joining:
		return live, true
	case ev == evEnd && p < ending:
		return ending, true
	case ev == evClose && p < closing:
		return closing, true
	case ev == evDone:
		return over, true
	}
	return p, false
}

// step is the relay's transition function: it moves the session on c, if
// c applies, and reports whether it did. Under s.mu.
func (s *Session) step(c change) bool {
	from := s.phase
	to, ok := next(from, c.ev)
	// A client may only leave a session no side has begun to end.
	switch c.ev {
	case evLost:
		ok = ok && s.hold && s.reason == "" && s.up.quietAt.IsZero()
	case evLeft:
		ok = ok && s.hold && s.reason == "" && s.down.quietAt.IsZero()
	case evResume:
		ok = ok && !s.farewells()
	}
	if !ok {
		if c.ev == evEnd {
			s.setReason(c.reason)
		}
		return false
	}
	s.phase = to
	now := time.Now()
	switch to {
	case leaving:
		if from == live {
			s.leaveTicks, s.leaveByWrite = 0, false
		}
		s.leaveByWrite = s.leaveByWrite || c.byWrite
		s.client.SetReadDeadline(aLongTimeAgo)
	case parking:
		s.clientCode, s.echo = c.code, c.echo
		// The tap's messages were for the client that left.
		s.outbox = nil
		s.outPending.Store(false)
		if s.farewells() {
			// The session ends once the provider has had its farewell
			// (or the last word).
			s.leavingReason(c.reason)
		}
		// A write to a client that reads nothing more gives up.
		s.client.SetWriteDeadline(now.Add(CloseWait))
		s.upstream.SetReadDeadline(aLongTimeAgo)
	case parked:
		s.upstream.SetReadDeadline(time.Time{})
	case joining:
		s.joiner = c.req
		s.upstream.SetReadDeadline(aLongTimeAgo)
	case live:
		req := s.joiner
		s.joiner, s.client = nil, req.client
		s.clientCode, s.kaClientDead = 0, false
		if s.ka != nil {
			s.ka.restart()
		}
		s.up = s.newDirection(req.client, s.upstream, toProvider, req.pending)
		s.running++
		s.upstream.SetReadDeadline(time.Time{})
		go s.up.run()
	case ending:
		s.setReason(c.reason)
		if c.d != nil {
			// The other direction's source is this one's destination.
			c.d.dst.SetReadDeadline(now.Add(CloseWait))
		}
	case closing:
		s.closeCode, s.closeReason = c.code, c.reason
		s.closeBy = now.Add(CloseFrameLimit)
		s.closeHeld = from.withoutClient()
		s.kaClientDead = c.clientDead
		s.setReason(c.reason)
		// No write deadline here: one that fired inside a splice would
		// lose the bytes already taken from the source.
		s.client.SetReadDeadline(aLongTimeAgo)
		s.upstream.SetReadDeadline(aLongTimeAgo)
		s.closingBegun.Store(true)
		s.timers = append(s.timers, time.AfterFunc(CloseFrameLimit+2*CloseWait, func() { s.cut("") }))
	case over:
		for _, t := range s.timers {
			t.Stop()
		}
	}
	if r := s.joiner; r != nil && from == joining && to != live {
		// The waiting client will not join. (Writing to it may block.)
		s.joiner = nil
		code := c.code
		if to != closing && !sendableCode(code) {
			code = CloseGoingAway
		}
		reason := c.reason
		if reason == "" {
			reason = s.reason
		}
		go r.refuse(code, reason)
	}
	return true
}

// arm starts the session's tick (keepalive). Its idle timeout and time
// limit are its lifecycle's (package sessions), which reads Activity and
// calls Close.
func (s *Session) arm() {
	s.mu.Lock() // the callbacks see the timers
	defer s.mu.Unlock()
	if tick := s.tickEvery(); tick > 0 {
		s.ticker = time.AfterFunc(tick, func() { s.sync(change{ev: evTick}) })
		s.timers = append(s.timers, s.ticker)
	}
}
