package upstreams

import (
	"errors"
	"net"
	"time"
)

// A preamble: messages the gateway itself sends the provider of a parked
// session before a resuming client joins it, such as commands that undo
// what the client that left had set up on the connection. The gateway
// speaks as the client there: the messages go as masked text frames, in
// order, from the goroutine that alone writes to the provider while the
// session is parked (the one that answers its pings), so no byte of the
// new client can come before them. The provider's answers are awaited a
// bounded time and never relayed: while the session waits for them, its
// down direction, which drops the provider's frames anyway, also puts
// together the provider's small text messages and hands each to IsReply;
// once every message of the preamble has had its answer, or the wait is
// over, the client joins at the next message boundary of the provider's
// stream, as without a preamble. Outside that wait nothing is assembled:
// the relay's hot path does not change.

// DefaultReplyWait is how long a resume waits for the answers to its
// preamble when ResumeOptions.ReplyWait is not set.
const DefaultReplyWait = 2 * time.Second

// MaxReplyMessage bounds the provider's text messages put together while a
// resume waits for the answers to its preamble: longer ones are dropped
// unread, like everything the provider sends while parked.
const MaxReplyMessage = 64 << 10

// ErrNoReplyCheck is ResumeWith's error for a preamble without IsReply.
var ErrNoReplyCheck = errors.New("a resume preamble needs IsReply")

// ResumeOptions tell ResumeWith how to join a client.
type ResumeOptions struct {
	// Pending are bytes the client sent behind its handshake: they go to
	// the provider first (after the preamble).
	Pending []byte
	// Preamble are the payloads of text messages the gateway sends the
	// provider before the client joins, in order, each as one masked
	// frame.
	Preamble [][]byte
	// IsReply reports whether a whole text message from the provider
	// (unmasked, at most MaxReplyMessage bytes) answers one of the
	// preamble's messages; the join waits until it has said so once for
	// each of them. It is called on a relay goroutine, one message at a
	// time, and must not block. Required with a preamble.
	IsReply func(msg []byte) bool
	// ReplyWait bounds the wait for the answers, from the preamble's
	// write on (0: DefaultReplyWait). The client joins when it is over,
	// answered or not.
	ReplyWait time.Duration
	// OnJoin, when set, is called once the client has joined (not when
	// the session ends before that), on a relay goroutine; it must not
	// block.
	OnJoin func(JoinReport)
}

// JoinReport tells how a client joined a parked session.
type JoinReport struct {
	// Sent is how many preamble messages went to the provider, Replies how
	// many of their answers came before the join.
	Sent, Replies int
	// Waited is the time from the preamble's write to the moment the
	// client could join (its answers in, or the wait over).
	Waited time.Duration
}

// Answered reports whether every preamble message had its answer.
func (r JoinReport) Answered() bool { return r.Replies >= r.Sent }

// ResumeWith is Resume with options: a preamble for the provider, whose
// answers the join waits for. The error is ErrNotParked as for Resume, or
// ErrNoReplyCheck for a preamble without IsReply.
func (s *Session) ResumeWith(client net.Conn, o ResumeOptions) error {
	if len(o.Preamble) > 0 && o.IsReply == nil {
		return ErrNoReplyCheck
	}
	return s.resume(&resumeReq{client: client, pending: o.Pending, opts: o})
}

// replyWait is the down direction's wait for the answers to a preamble
// (owned by the down direction's goroutine).
type replyWait struct {
	want, got int
	isReply   func([]byte) bool
	onJoin    func(JoinReport)
	sentAt    time.Time
	until     time.Time
	// farewell: the wait is for the answer to the session's farewell
	// (farewell.go) or the end of its last word (lastword.go), not for a
	// client's join; then runs when it is over, with the bytes read from
	// the provider not taken yet.
	farewell bool
	then     func(rest []byte) bool
	// talk is the last word's conversation (nil: a farewell's or a
	// preamble's answers); max bounds a message put together for it (0:
	// MaxReplyMessage); failed: a send to the provider failed.
	talk   Talk
	max    int64
	failed bool
	// ready: the answers are in, or the wait is over, since readyAt.
	ready   bool
	readyAt time.Time
	// The text message being put together: on while one is (its first
	// frame's header was seen, and it has not outgrown MaxReplyMessage),
	// cur while the frame in flight is one of its frames.
	msg     []byte
	on, cur bool
}

// check reports whether the client may join: every answer is in, or the
// wait is over at now.
func (w *replyWait) check(now time.Time) bool {
	if !w.ready && (w.got >= w.want || !now.Before(w.until)) {
		w.ready, w.readyAt, w.msg = true, now, nil
	}
	return w.ready
}

func (w *replyWait) report() JoinReport {
	return JoinReport{Sent: w.want, Replies: w.got, Waited: w.readyAt.Sub(w.sentAt)}
}

// joinReady runs on the down direction when a client (req) waits to join:
// the first time, it sends the client's preamble. It reports whether the
// client may join (its preamble answered, or the wait over), or the error
// writing the preamble (the session ends).
func (d *direction) joinReady(req *resumeReq) (bool, error) {
	if d.wait != nil {
		return d.wait.check(time.Now()), nil
	}
	if req == nil {
		return true, nil // join finds the session closing
	}
	o, now := req.opts, time.Now()
	w := &replyWait{isReply: o.IsReply, onJoin: o.OnJoin, sentAt: now, until: now}
	d.wait = w
	if len(o.Preamble) == 0 {
		return w.check(now), nil
	}
	wait := o.ReplyWait
	if wait <= 0 {
		wait = DefaultReplyWait
	}
	w.want, w.until = len(o.Preamble), now.Add(wait)
	var b []byte
	for _, m := range o.Preamble {
		b = appendDataFrame(b, 0x1, m)
	}
	// A provider that takes not even this much within the wait is stuck.
	d.src.SetWriteDeadline(w.until)
	_, err := d.src.Write(b)
	d.src.SetWriteDeadline(time.Time{})
	return false, err
}

// replyDeadline is the read deadline of the down direction while the
// session has no client: the end of the wait for a preamble's answers, if
// one is on; none otherwise.
func (d *direction) replyDeadline() time.Time {
	if w := d.wait; w != nil && !w.check(time.Now()) {
		return w.until
	}
	return time.Time{}
}

// collect follows p, which starts inside a frame of the provider's stream,
// to the end of that frame at most (or of p), putting text messages
// together for IsReply. It returns what is left of p.
func (d *direction) collect(p []byte) []byte {
	w := d.wait
	t := &d.frames
	if t.hdrN > 0 {
		// A header, a byte at a time: at its end, the frame's kind.
		for t.hdrN > 0 && len(p) > 0 {
			t.advance(p[:1], false)
			p = p[1:]
		}
		if t.hdrN > 0 {
			return p
		}
		w.frameStart(t)
	} else if w.cur {
		n := t.advance(p, true)
		w.msg = append(w.msg, p[:n]...)
		p = p[n:]
	} else {
		p = p[t.advance(p, true):]
	}
	if t.atBoundary() {
		w.frameEnd(t)
	}
	return p
}

// frameStart: the header of a frame is whole in t.
func (w *replyWait) frameStart(t *frameTracker) {
	masked := t.hdr[1]&0x80 != 0
	switch t.opcode {
	case 0x1:
		// A text message starts (a provider's frames are never masked:
		// a masked one is not read).
		w.on, w.msg = !masked, w.msg[:0]
		w.cur = w.on
	case 0x0:
		w.on = w.on && !masked
		w.cur = w.on
	case 0x2:
		w.on, w.cur = false, false
	default:
		// A control frame, maybe in the middle of a message.
		w.cur = false
	}
	if w.cur && int64(len(w.msg))+t.remaining > w.maxMessage() {
		// Too long for an answer to read: dropped unread.
		w.on, w.cur, w.msg = false, false, w.msg[:0]
	}
}

// frameEnd: a frame ended; the message with it when it was its last.
func (w *replyWait) frameEnd(t *frameTracker) {
	w.cur = false
	if t.opcode >= 0x8 || t.fragmented {
		return
	}
	switch {
	case !w.on || w.got >= w.want:
	case w.talk != nil:
		if _, over := w.talk.Heard(w.msg); over {
			w.got = w.want
		}
	case w.isReply(w.msg):
		w.got++
	}
	w.on, w.msg = false, w.msg[:0]
}

// maxMessage bounds a message put together for the wait.
func (w *replyWait) maxMessage() int64 {
	if w.max > 0 {
		return w.max
	}
	return MaxReplyMessage
}
