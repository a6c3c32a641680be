package upstreams

import (
	"errors"
	"net"
	"time"
)

// A last word: a conversation of the gateway's own with the provider at
// the end of a session whose browser is still there, before the
// provider's connection closes — the gateway reading back what the
// session left in the browser (a browser profile). It is a farewell
// (farewell.go) of several messages whose answers may ask for more,
// spoken by the down direction once no client is left to hear the
// provider:
//
//   - When the client's side ends (its close frame, its connection
//     ending, a write to it failing, keepalive finding it dead) between
//     two of its messages, or in the middle of one (completed for the
//     provider first, farewell_fill.go), the session goes the way hold
//     parks it, and instead of waiting for a client to resume, the down
//     direction begins the last word (Talk.Begin); once the Talk says it
//     is over, or Wait has passed, the provider gets the client's close
//     code. A session with Hold parks for a resume instead: its last word
//     is said when it ends.
//   - When the gateway ends the session (Close: an operator, the idle
//     timeout, the time limit, shutdown), the client gets its close frame
//     at a frame boundary as for any session; the client's stream is
//     brought to the end of its message in flight and the up direction
//     writes the provider nothing more (no close frame: it awaits the
//     client's answer); the down direction, once it has sent the client
//     its close frame and the up direction has gone quiet, begins the last
//     word, and then sends the provider the close frame. A parked (held)
//     session closed likewise says it before its close frame.
//   - When the provider ends the session first, nothing is said.
//
// While the last word goes on, the down direction reads the provider
// alone: it answers its pings, puts its text messages together (up to
// MaxMessage each) and hands each to Talk.Heard, whose sends are written
// at once as masked text frames; everything else it drops. A session
// with a last word is never spliced toward the provider (its tracker
// follows the client's text, as a farewell's does).

// DefaultLastWordWait is how long a last word may go on when
// LastWord.Wait is not set.
const DefaultLastWordWait = 5 * time.Second

// Talk is one side of a conversation of the gateway's with the provider
// on a session's connection while no client hears it: before the relay
// (Converse), or as its last word.
type Talk interface {
	// Begin starts the conversation: send writes one text message to the
	// provider (false when it could not be written).
	Begin(send func(msg []byte) bool)
	// Heard is handed each whole text message from the provider, in
	// order (the relay's buffer: valid during the call only); it may
	// send more. mine tells that the message was the conversation's (a
	// message that is not goes to the client when one is to come), over
	// that the conversation is done.
	Heard(msg []byte) (mine, over bool)
}

// LastWord is the conversation a session has with its provider at its
// end (SessionOptions.LastWord).
type LastWord struct {
	// Talk is the gateway's side of it. Required.
	Talk Talk
	// Wait bounds it (0: DefaultLastWordWait); the session then closes
	// whatever the Talk still waits for.
	Wait time.Duration
	// MaxMessage bounds a message of the provider's put together for
	// Heard (0: MaxReplyMessage); a longer one is dropped unread.
	MaxMessage int64
}

// farewells reports whether the client's leaving ends the session with
// words of the gateway's to the provider: a farewell, or a last word
// without hold.
func (s *Session) farewells() bool {
	return s.farewell != nil || s.lastWord != nil && !s.parks
}

// waitToTalk is the down direction's hook of a closing session with a
// last word, once the client has its close frame (or is lost): it says
// the last word as soon as the up direction writes the provider nothing
// more, reading and dropping what the provider sends meanwhile. rest are
// bytes read from the provider not taken yet.
func (d *direction) waitToTalk(rest []byte) bool {
	v := d.s.sync(change{ev: evTalk, d: d})
	if v.talkNow {
		return d.beginLastWord(d.closeAfterWord, rest)
	}
	d.mode = awaiting
	d.frames.advance(rest, false)
	return !d.frames.sawClose
}

// talkReady: the read of a down direction waiting to talk stopped (err):
// the up direction went quiet, the wait for it is over, or the provider
// ended.
func (d *direction) talkReady(err error) bool {
	if !isTimeout(err) {
		if errors.Is(err, net.ErrClosed) {
			return false
		}
		return d.ended(err)
	}
	if v := d.s.sync(change{ev: evTalk, d: d}); v.talkNow {
		return d.beginLastWord(d.closeAfterWord, nil)
	}
	return d.s.cut("") // the client's frame stalled past CloseFrameLimit
}

// beginLastWord has the down direction, alone with the provider, begin
// the session's last word; then runs once it is over (or its wait). rest
// are bytes read from the provider not taken yet.
func (d *direction) beginLastWord(then func(rest []byte) bool, rest []byte) bool {
	lw := d.s.lastWord
	d.talked = true
	d.alone = true
	d.mode = dropping
	wait := lw.Wait
	if wait <= 0 {
		wait = DefaultLastWordWait
	}
	now := time.Now()
	w := &replyWait{want: 1, talk: lw.Talk, sentAt: now, until: now.Add(wait), farewell: true, max: lw.MaxMessage, then: then}
	d.wait = w
	lw.Talk.Begin(func(msg []byte) bool {
		if w.failed {
			return false
		}
		d.src.SetWriteDeadline(w.until)
		_, err := d.src.Write(appendDataFrame(nil, opText, msg))
		d.src.SetWriteDeadline(time.Time{})
		w.failed = err != nil
		return err == nil
	})
	// Reads stop at the end of the wait; while the session closes, only
	// this direction sets its deadlines.
	d.src.SetReadDeadline(w.until)
	if len(rest) > 0 {
		return d.drop(rest)
	}
	return true
}

// talkWake: the read of a down direction saying the last word stopped
// (err): at the end of its wait, for a phase the session entered meanwhile
// (a Close), or because the provider ended.
func (d *direction) talkWake(err error) bool {
	if !isTimeout(err) {
		return d.heldEnd(err)
	}
	if w := d.wait; w.check(time.Now()) {
		d.wait = nil
		return w.then(nil)
	}
	d.src.SetReadDeadline(d.wait.until)
	return true
}

// closeAfterWord: the last word of a session the gateway closes is over;
// the provider gets the close frame.
func (d *direction) closeAfterWord(rest []byte) bool {
	return d.closeProvider(closeFrame(d.s.closeCode, d.s.closeReason, true), rest)
}
