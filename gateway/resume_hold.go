package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// joinHeld joins the resuming client to a held session: the gateway
// answers its upgrade itself (the provider's has been given once), with
// the subprotocol the session speaks, and the session goes on with it at
// a message boundary, once the browser has been told to forget what the
// clients before it set up on the connection (heldReset). A client that
// cannot take the session as it is (it does not offer its subprotocol, or
// the session negotiated an extension such as compression, whose state a
// new connection cannot share) gets 409 and the session stays parked.
func (c resume) joinHeld(e *pool.Parked) {
	pk, _ := e.Data.(*parking)
	s := e.Held
	if pk == nil || !s.Parked() {
		c.refuseResume(resumeFailure{observe.ResumeUnknown, http.StatusGone, "the session has ended"})
		return
	}
	conflict := func(msg string) {
		c.h.reg.Parked.Unclaim(e)
		c.refuseResume(resumeFailure{observe.ResumeConflict, http.StatusConflict, msg})
	}
	sub := pk.answer.Header.Get("Sec-Websocket-Protocol")
	if sub != "" && !offersProtocol(c.r.Header, sub) {
		conflict("the session speaks the subprotocol " + sub + ": ask for it to resume")
		return
	}
	c.finished = true
	c.learnt(e.Provider)
	c.add(attempt{Provider: e.Provider, Outcome: upstreams.WordOK})
	pk.mu.Lock()
	pk.id, pk.remoteIP = c.id, remoteIP(c.r)
	pk.joined = make(chan struct{})
	joined := pk.joined
	pk.mu.Unlock()
	c.h.reg.Sessions.Rename(s, c.id, pk.remoteIP)

	// The chain's hand-over, greeted at once: the provider's answer was
	// given to the first client; this one gets the gateway's.
	fields := []upstreams.HeaderField{{Name: SessionHeader, Value: c.id}}
	if sub != "" {
		fields = append(fields, upstreams.HeaderField{Name: "Sec-Websocket-Protocol", Value: sub})
	}
	ho, err := handOver(c.w, c.r, c.hs, switching(c.hs.Key, sub, c.id), fields)
	if err != nil {
		c.resumeBroke(e, err)
		return
	}
	if err := ho.greet(); err != nil {
		ho.conn.Close()
		pk.left()
		c.resumeBroke(e, err)
		return
	}
	client := ho.conn
	if err := s.ResumeWith(client, c.heldReset(ho.pending, e.ID)); err != nil {
		// It ended meanwhile: the client had its 101, so it gets a close
		// frame.
		client.SetWriteDeadline(time.Now().Add(upstreams.CloseWait))
		client.Write(upstreams.ServerCloseFrame(upstreams.CloseGoingAway, "session ended"))
		client.Close()
		c.resumeBroke(e, err)
		return
	}
	frames, bytes := s.ParkedDropped()
	c.h.reg.Metrics().Resume(observe.ResumeOK)
	c.h.logger.Info("session resumed", zap.String("session_id", c.id), zap.String("resumed_from", e.ID),
		zap.String("provider", e.Provider), zap.Bool("held", true),
		zap.Int64("dropped_frames", frames), zap.Int64("dropped_bytes", bytes))
	// A stream lives as long as this request: until the client leaves
	// again, or the session ends.
	ho.await(s, joined)
}

// resumeBroke notes a held session that could not be joined after all:
// it ended meanwhile, or the client's connection failed before the join.
// A session still parked is given back, under its own ID, for the rest of
// its window.
func (c resume) resumeBroke(e *pool.Parked, err error) {
	if pk, ok := e.Data.(*parking); ok && e.Held.Parked() {
		pk.mu.Lock()
		pk.id, pk.remoteIP = e.ID, e.RemoteIP
		pk.mu.Unlock()
		c.h.reg.Sessions.Rename(e.Held, e.ID, e.RemoteIP)
		c.h.reg.Parked.Unclaim(e)
	}
	c.h.reg.Metrics().Resume(observe.ResumeRefused)
	c.h.logger.Info("resume failed", zap.String("session_id", c.id), zap.String("resumed_from", e.ID),
		zap.String("provider", e.Provider), zap.Error(err))
}

// switching is the gateway's own 101 to a client joining a held session.
func switching(key, subprotocol, id string) []byte {
	b := make([]byte, 0, 256)
	b = append(b, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: "...)
	b = append(b, upstreams.AcceptFor(key)...)
	if subprotocol != "" {
		b = append(b, "\r\nSec-WebSocket-Protocol: "...)
		b = append(b, subprotocol...)
	}
	b = append(b, "\r\n"+SessionHeader+": "...)
	b = append(b, id...)
	return append(b, "\r\n\r\n"...)
}

// offersProtocol reports whether the client's handshake offers the
// subprotocol want.
func offersProtocol(h http.Header, want string) bool {
	for _, v := range h.Values("Sec-Websocket-Protocol") {
		for _, p := range strings.Split(v, ",") {
			if strings.TrimSpace(p) == want {
				return true
			}
		}
	}
	return false
}

// A client joining a held session shares the DevTools connection with the
// clients that used it before, and Chrome keeps what they set up on it:
// their target discovery and auto-attach stay on, and Chrome reports each
// target to a connection once. A new Puppeteer or Playwright client then
// turns them on again, gets plain answers and no target events, and sees
// no page. So before the client joins, the gateway turns both off again
// on the connection, speaking as the client: the browser forgets what it
// has already reported, and reports every target afresh to the new
// client's own commands. The commands carry IDs of the gateway's own, at
// the top of the range Chrome accepts (31-bit), far above those clients
// count up from 1; their answers and the events in between are dropped
// with everything else the browser sends while no client is joined.

// Held-session reset commands and their IDs.
const (
	heldResetAutoAttachID = 2147480001
	heldResetDiscoverID   = 2147480002
	// heldResetWait bounds the wait for the browser's answers; the client
	// joins when it is over, answered or not.
	heldResetWait = 2 * time.Second
)

var heldResetCommands = [][]byte{
	fmt.Appendf(nil, `{"id":%d,"method":"Target.setAutoAttach","params":{"autoAttach":false,"waitForDebuggerOnStart":false,"flatten":true}}`, heldResetAutoAttachID),
	fmt.Appendf(nil, `{"id":%d,"method":"Target.setDiscoverTargets","params":{"discover":false}}`, heldResetDiscoverID),
}

// heldResetIDs are the reset commands' IDs as they appear in an answer.
var heldResetIDs = [][]byte{strconv.AppendInt(nil, heldResetAutoAttachID, 10), strconv.AppendInt(nil, heldResetDiscoverID, 10)}

// heldReset is how the resuming client joins: the reset commands first,
// their answers awaited. from is the session ID it resumes (for the log).
func (c resume) heldReset(pending []byte, from string) upstreams.ResumeOptions {
	logger, id := c.h.logger, c.id
	return upstreams.ResumeOptions{
		Pending:   pending,
		Preamble:  heldResetCommands,
		IsReply:   newResetReplies(),
		ReplyWait: heldResetWait,
		OnJoin: func(r upstreams.JoinReport) {
			fields := []zap.Field{zap.String("session_id", id), zap.String("resumed_from", from),
				zap.Int("answered", r.Replies), zap.Int("sent", r.Sent), zap.Float64("waited_ms", roundMS(r.Waited))}
			if !r.Answered() {
				logger.Info("held session reset unanswered: the client joins anyway", fields...)
				return
			}
			logger.Debug("held session reset", fields...)
		},
	}
}

// newResetReplies returns the IsReply of one join: it takes a message for
// an answer when it is a top-level answer (no CDP session) carrying the ID
// of a reset command not answered yet.
func newResetReplies() func(msg []byte) bool {
	answered := map[int64]bool{}
	return func(msg []byte) bool {
		if !bytes.Contains(msg, heldResetIDs[0]) && !bytes.Contains(msg, heldResetIDs[1]) {
			return false // an event, or another answer: not parsed
		}
		var m struct {
			ID        int64  `json:"id"`
			SessionID string `json:"sessionId"`
		}
		if json.Unmarshal(msg, &m) != nil || m.SessionID != "" {
			return false
		}
		if (m.ID != heldResetAutoAttachID && m.ID != heldResetDiscoverID) || answered[m.ID] {
			return false
		}
		answered[m.ID] = true
		return true
	}
}
