package gateway

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/cdp"
	"github.com/browserfailover/caddy-browser-failover/options"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/profiles"
	"github.com/browserfailover/caddy-browser-failover/recordings"
	"github.com/browserfailover/caddy-browser-failover/sessions"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// A relayed socket session: the client's connection taken over (hijacked,
// or an HTTP/2 or HTTP/3 stream), answered 101 (or 200) once the session
// counts as live, and relayed byte for byte to the provider's connection
// (upstreams.Session) for the rest of its life, which its lifecycle
// (package sessions) runs: the session's limits, its one end, its end
// entry, the ticket given back — or, for a session its client may take
// back, kept by its parking (resume_park.go).

// socket is a client's way once its upgrade got a provider's 101: its
// session, a relayed socket.
type socket struct {
	*connect
}

// establish hands the client over to the provider's connection up
// at m, and relays its session. It is told of its session — the
// provider's 101, naming the session — only once the session counts as
// live, so a client never holds a session that status and max_concurrent
// do not see yet.
func (c socket) establish(m *member, up *upstreams.Conn) passEnd {
	if caddy.Exiting() {
		// An attempt that was in flight when the process began to exit:
		// its provider session is ended and released, the client gets
		// 503 rather than a session that shutdown would end at once.
		go up.CloseWith(upstreams.CloseGoingAway, upstreams.EndShutdown)
		c.finish(c.shuttingDown())
		return passAnswered
	}
	// The client's browser profile goes in before it is answered
	// (profile_session.go).
	if rf := c.restoreProfile(m, up); rf != nil {
		go up.CloseWith(upstreams.CloseGoingAway, upstreams.EndProviderError)
		if c.warm != nil {
			c.warm.Ended(upstreams.EndProviderError)
		}
		c.finish(rf)
		return passAnswered
	}
	fields := c.answerHeaders()
	for _, k := range []string{"Sec-Websocket-Protocol", "Sec-Websocket-Extensions"} {
		for _, v := range up.Answer.Header.Values(k) {
			fields = append(fields, upstreams.HeaderField{Name: k, Value: v})
		}
	}
	ho, err := handOver(c.w, c.r, c.hs, up.Answer.RawWithHeaders(c.answerHeaders()...), fields)
	if err != nil {
		up.Close()
		c.h.logger.Error("cannot take over the client connection", zap.Error(err))
		return passClientGone
	}
	s := c.relay(m, ho.conn, up, ho.pending, ho.greet)
	ho.await(s, c.leftHeld)
	return passEstablished
}

// handOff is a client connection taken over for a session.
type handOff struct {
	conn netConn
	// pending are the bytes the client pipelined behind its handshake.
	pending []byte
	// greet tells the client its upgrade succeeded.
	greet func() error
	// stream: an HTTP/2 or HTTP/3 stream, which lives only as long as
	// its request.
	stream bool
}

// handOver takes over the connection of the client that sent upgrade hs
// on (w, r), for a new session as for a resumed one or a WebDriver
// session's socket: an HTTP/1.1 client is hijacked from the server itself
// (hijack; the bytes it pipelined behind its handshake kept), and its
// greeting is the raw 101 answer; an HTTP/2 or HTTP/3 client (extended
// CONNECT) gets a stream, and its greeting is a 200 with fields. The
// resume token handed out in fields is taken out of the header map once
// sent: Caddy's access log reads it again, and must not show it.
func handOver(w http.ResponseWriter, r *http.Request, hs *upstreams.Handshake, answer []byte, fields []upstreams.HeaderField) (handOff, error) {
	if hs.ExtendedConnect {
		hd := w.Header()
		for _, f := range fields {
			hd.Add(f.Name, f.Value)
		}
		rc := http.NewResponseController(w)
		return handOff{conn: newStreamConn(r, w, rc), stream: true, greet: func() error {
			w.WriteHeader(http.StatusOK)
			err := rc.Flush()
			hd.Del(ResumeTokenHeader)
			return err
		}}, nil
	}
	conn, brw, err := hijack(w)
	if err != nil {
		return handOff{}, err
	}
	conn.SetDeadline(time.Time{})
	var pending []byte
	if n := brw.Reader.Buffered(); n > 0 {
		pending = make([]byte, n)
		brw.Read(pending)
	}
	return handOff{conn: conn, pending: pending, greet: func() error {
		_, err := conn.Write(answer)
		return err
	}}, nil
}

// await returns, for a stream, only once the relay is done with the
// ResponseWriter: the session has ended, or its client has been let go
// (left, closed when a held session's client leaves; nil otherwise). A
// hijacked connection needs no wait.
func (ho handOff) await(s *upstreams.Session, left <-chan struct{}) {
	if !ho.stream {
		return
	}
	select {
	case <-s.Done():
	case <-left:
	}
}

// answerHeaders are the gateway's own fields on the client's 101 (or
// 200): the session ID, and a resume token the gateway made for it.
func (c socket) answerHeaders() []upstreams.HeaderField {
	if c.handOut {
		return []upstreams.HeaderField{{Name: SessionHeader, Value: c.id}, {Name: ResumeTokenHeader, Value: c.token}}
	}
	return []upstreams.HeaderField{{Name: SessionHeader, Value: c.id}}
}

// socketBody is a relayed socket as its lifecycle sees it.
type socketBody struct {
	*upstreams.Session
	// keepalive: the session pings its sides, and its end entry counts
	// the pings.
	keepalive bool
	// rec is its recording (nil: not to be recorded; recording.go).
	rec *sessionRecording
}

// EndFields are what its end entry says besides every session's.
func (b socketBody) EndFields() []zap.Field {
	var out []zap.Field
	if b.keepalive {
		out = append(out, zap.Int64("keepalive_pings", b.KeepalivePings()))
	}
	if f, ok := b.rec.field(); ok {
		out = append(out, f)
	}
	return out
}

// relay makes the session live: it is registered with its provider and
// in the session registry, takes what the client held (its ticket), its
// lifecycle starts, the placeholders of what the chain learnt are set,
// the client is answered (greet) and the relay runs. A greeting that
// fails ends the session at once (its slot freed), never resumable.
func (c socket) relay(m *member, client netConn, up *upstreams.Conn, pending []byte, greet func() error) *upstreams.Session {
	c.served(m)
	// The session holds the client's ticket from here.
	t := c.ticket
	c.ticket = nil
	// A session its client ends may be taken back (resume.go).
	pk := c.newParking(m, up, t)
	var shownKey string
	if k, ok := t.Share(); ok {
		shownKey = c.h.reg.Hashes.ShownKey(k.Value)
	}
	// A recorded session has the gateway take part in it (recording.go).
	rec := c.recordingOf(m, up, shownKey)
	if pk != nil {
		pk.recording = rec.recordingID()
	}
	// The provider's 101 is relayed (a parking keeps what it needs of
	// it): a live session does not carry its header block.
	up.Answer = nil
	opts := upstreams.SessionOptions{
		ClientPending: pending,
		Keepalive:     time.Duration(c.h.Keepalive),
	}
	if pk != nil && pk.hold && !pk.compressed() {
		opts.Hold, opts.OnPark = true, pk.onPark
		c.leftHeld = pk.joined
	}
	if c.cls.proto == upstreams.ProtocolBiDi {
		// Firefox keeps a BiDi session its client dropped until
		// session.end: the gateway ends it when the client leaves.
		opts.Farewell = upstreams.BiDiFarewell()
	}
	opts.Tap = rec.tap()
	// A session with a browser profile saves it as its last word, reading
	// the localStorage of the origins its pages visited
	// (profile_session.go).
	var save *profileSave
	var watcher *cdp.Participant
	if name, ok := t.Profile(); ok {
		var known *profiles.Profile
		if c.profile != nil {
			known = c.profile.data
		}
		save = c.profileSaveOf(name, known)
	}
	if save != nil {
		opts.LastWord = save.talk()
		if rec.tap() != nil {
			rec.p.WatchURLs(save.visited)
		} else {
			watcher = cdp.NewWatcher(save.visited)
			opts.Tap = watcher
		}
	}
	remote := up.Remote // the ticket releases it
	up.Remote = nil
	// The closures outlive the request: they must not hold c, whose
	// request and writer keep the server's buffers of the connection.
	// A warm session goes on with the lifecycle it had: the client takes
	// it over.
	life := c.warm
	opts.OnEnd = func(s *upstreams.Session) {
		rec.end()
		save.end(s.Reason())
		life.Ended(s.Reason())
	}
	s := upstreams.NewSession(client, up, opts)
	if rec.tap() != nil {
		rec.p.Start(s.Send)
	}
	if watcher != nil {
		watcher.Start(s.Send)
	}
	body := socketBody{Session: s, keepalive: c.h.Keepalive > 0, rec: rec}
	if life != nil {
		life.Handover(body, c.h.limits(0), c.entry(m))
	} else {
		life = sessions.New(c.h.sessionDeps(), t, body, c.h.limits(0), c.entry(m))
	}
	if pk != nil {
		reg := c.h.reg
		// A held session may end while parked, its ID changed with
		// resumes; a session parked with its provider session keeps its
		// ticket for the window's end, or its resume.
		life.SetKeeper(func() bool {
			pk.left()
			id := pk.currentID()
			reg.Parked.Remove(id)
			life.SetID(id)
			return pk.ended(s, t)
		})
	}
	info := pool.SessionInfo{ID: c.id, Protocol: string(c.cls.proto), RemoteIP: remoteIP(c.r), Attempts: c.tries, Options: c.opts.Map()}
	if rec != nil {
		info.Recording, info.Unrecorded = rec.rec, rec.unavailable
	}
	if pk != nil {
		info.ResumeToken = pk.token
	}
	meter := t.Establish(s, info, remote)
	if pk != nil {
		pk.meter = meter
	}
	c.learnt(m.up.Name)
	life.Run()
	if greet != nil {
		if err := greet(); err != nil {
			s.Close(upstreams.CloseGoingAway, upstreams.EndClientError)
		}
	}
	s.Run()
	return s
}

// entry is what the client's way says in its session's end entry.
func (c socket) entry(m *member) sessions.Entry {
	e := sessions.Entry{ID: c.id, Provider: m.up.Name, Attempts: attempts(c.attempts), Waited: c.waited,
		Fields: []zap.Field{zap.Int("hedges_started", c.hedgesStarted), zap.Int("hedges_wasted", c.hedgesWasted)}}
	if opts := c.opts.Map(); opts != nil {
		e.Fields = append(e.Fields, zap.Any("options", opts))
	}
	if c.warm != nil {
		e.Fields = append(e.Fields, zap.Bool("warm", true))
	}
	return e
}

// recordingOf decides whether the session c establishes with up at m is
// recorded: nil when it is not to be; with unavailable set when it was to
// be and cannot; else its recording, under way, and its participant (the
// relay's tap, started by the caller once the relay is made).
func (c socket) recordingOf(m *member, up *upstreams.Conn, shownKey string) *sessionRecording {
	r := c.h.rec
	if r == nil || c.cls.proto != upstreams.ProtocolCDP {
		return nil
	}
	asked := slices.Contains(c.opts.Asked(), options.Record)
	if !asked && !r.cfg.RecordsAll() && c.recording == "" {
		return nil
	}
	if asked && slices.Contains(m.up.Honours().Supports, options.Record) {
		return nil // the provider records it
	}
	if ext := up.Answer.Header.Get("Sec-Websocket-Extensions"); ext != "" {
		return &sessionRecording{unavailable: "unavailable: the session negotiated a WebSocket extension (" + extensionNames(ext) + "): its messages cannot be read"}
	}
	if path, _, _ := strings.Cut(up.Point.URI, "?"); strings.HasPrefix(path, "/devtools/page/") {
		return &sessionRecording{unavailable: "unavailable: the provider's endpoint is a page's (/devtools/page/…), not the browser's: it cannot follow the session's targets"}
	}
	h := c.h
	provider := m.up.Name
	meta := recordings.Meta{ID: c.id, Provider: provider, Options: c.opts.Map(), Client: shownKey}
	sr := &sessionRecording{}
	o := recordings.Options{Format: r.sc.Format, MaxBytes: r.maxBytes,
		Counter: recordingCounter{m: h.reg.Metrics(), provider: provider},
		OnEnd:   func(*recordings.Recording) { h.reg.Recordings.Remove(sr.live) }}
	if c.recording != "" {
		meta.ID = c.recording
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		sr.rec = r.store.Continue(ctx, meta, o)
		cancel()
	} else {
		sr.rec = r.store.Begin(meta, o)
	}
	sr.live = &pool.LiveRecording{Recording: sr.rec, Session: c.id, Provider: provider, Store: r.store}
	h.reg.Recordings.Add(sr.live)
	sr.p = cdp.New(r.sc, sr.rec)
	return sr
}
