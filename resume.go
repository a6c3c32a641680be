package browserfailover

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Resume: a CDP session that ends from the client's side (its close frame,
// or its connection dropping) may be taken back within the resume window
// by a client that names its session ID, and gets the same browser: the
// same provider, the same upstream URL (a discovered provider's
// webSocketDebuggerUrl, a created session's connect URL), never a fresh
// browser elsewhere. Chrome keeps its browser and pages when a DevTools
// connection closes, so without hold the gateway closes the provider
// connection as usual and dials the same URL again on resume. With hold,
// for providers that end the browser when the socket closes, the provider
// connection stays open (and keeps its slot) while no client is joined,
// and a resuming client is joined to it.
//
// Each ID resumes once: the resumed session gets a new ID, on its 101 as
// usual, to resume with next time. With resume_key, an ID resumes only for
// a client whose key has the same value. Whatever cannot be resumed is
// answered 410 with a JSON error, and no provider is asked for anything
// else.

// Where a client names the session it resumes.
const (
	ResumeQuery  = "bf_resume"
	ResumeHeader = "Browser-Failover-Resume"
)

// EndResumeWindow is the close reason a held session's provider side gets
// when its window ends without a resume.
const EndResumeWindow = "resume window over"

// ResumeConfig makes sessions resumable (JSON key "resume").
type ResumeConfig struct {
	// Window is how long a session that its client ended may be resumed.
	// Required, positive.
	Window caddy.Duration `json:"window"`
	// Hold keeps the provider connection open during the window, for
	// providers that end the browser when its connection closes. A held
	// session keeps its slot. Default: false.
	Hold bool `json:"hold,omitempty"`
}

func (rc *ResumeConfig) validate() error {
	if rc == nil {
		return nil
	}
	if rc.Window <= 0 {
		return badOpt("resume", "resume needs a positive window, got %s", time.Duration(rc.Window))
	}
	return nil
}

// validateResumeKey checks resume_key against resume.
func (h *Handler) validateResumeKey() error {
	if h.ResumeKey == "" {
		return nil
	}
	if h.Resume == nil {
		// Judged on the whole block: resume may come after it.
		return &optionError{msg: "resume_key binds resumable sessions to a key: it needs resume", opts: []string{"resume_key"}, whole: true}
	}
	if !strings.Contains(h.ResumeKey, "{") {
		return badOpt("resume_key", "resume_key must hold a placeholder (e.g. {http.auth.user.id}), got a constant")
	}
	return nil
}

// resumeID takes the ID a client asks to resume out of its request ("" when
// it asks for none): neither the query item nor the header goes to a
// provider.
func resumeID(r *http.Request, hs *upstreams.Handshake) string {
	id := strings.TrimSpace(r.Header.Get(ResumeHeader))
	if id != "" {
		hs.Header.Del(ResumeHeader)
	}
	if !strings.Contains(hs.RawQuery, ResumeQuery) {
		return id
	}
	// Take the item out, leaving the rest of the query as the client
	// wrote it.
	var kept []string
	for _, part := range strings.Split(hs.RawQuery, "&") {
		k, v, _ := strings.Cut(part, "=")
		if ku, err := url.QueryUnescape(k); err == nil && ku == ResumeQuery {
			if vu, err := url.QueryUnescape(v); err == nil && id == "" {
				id = strings.TrimSpace(vu)
			}
			continue
		}
		kept = append(kept, part)
	}
	hs.RawQuery = strings.Join(kept, "&")
	return id
}

// parking is what a resumable session needs to be parked when its client
// ends it: where its browser is, and under which key.
type parking struct {
	h        *Handler
	window   time.Duration
	hold     bool
	key      string // hashed resume key ("" when none)
	provider string
	proto    string
	point    upstreams.ResumePoint
	// remote is the provider session created for it (session_api), whose
	// release waits for the window's end while parked.
	remote   *upstreams.Remote
	answer   *upstreams.Answer // the provider's 101 (its subprotocol, extensions)
	started  time.Time
	client   string
	store    *cluster.Shared // set when the resume registry is shared
	bytesUp  int64
	bytesDn  int64
	remoteIP string

	mu sync.Mutex
	id string // the session's current ID
	// joined is closed when the client joined now leaves (the session is
	// parked, or ends): an extended CONNECT client's handler returns then.
	joined chan struct{}
}

// newParking prepares the parking of the session c establishes with up at
// m, or returns nil when it cannot be resumed.
func (c *connect) newParking(m *member, up *upstreams.Conn) *parking {
	h := c.h
	if h.Resume == nil || c.cls.proto == upstreams.ProtocolPlaywright || up.Point.IsZero() {
		return nil
	}
	pk := &parking{
		h:        h,
		window:   time.Duration(h.Resume.Window),
		hold:     h.Resume.Hold,
		key:      c.resumeKey(),
		provider: m.up.Name,
		proto:    string(c.cls.proto),
		point:    up.Point,
		remote:   up.Remote,
		answer:   up.Answer,
		started:  time.Now(),
		remoteIP: remoteIP(c.r),
		id:       c.id,
		joined:   make(chan struct{}),
	}
	if c.quota != nil {
		pk.client = c.quota.Shown()
	}
	if h.shared != nil {
		pk.store = h.shared.s
	}
	return pk
}

// resumeKey is the hashed value of the client's resume_key ("" without
// one).
func (c *connect) resumeKey() string {
	if c.h.ResumeKey == "" {
		return ""
	}
	v := ""
	if c.replace != nil {
		v = c.replace(c.h.ResumeKey)
	}
	return pool.ResumeKeyHash(v)
}

func (pk *parking) currentID() string {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	return pk.id
}

// left marks the joined client gone.
func (pk *parking) left() {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	select {
	case <-pk.joined:
	default:
		close(pk.joined)
	}
}

// compressed reports whether the session negotiated a WebSocket extension
// (compression): a new connection cannot share its state, so it is never
// held.
func (pk *parking) compressed() bool {
	return pk.answer.Header.Get("Sec-Websocket-Extensions") != ""
}

// ended is called when a session that was not held has ended: a session
// its client ended is parked, and reports true (its created provider
// session, if any, is then released at the window's end rather than now).
// A session that negotiated compression under hold is parked only to
// answer its resume 409.
func (pk *parking) ended(s *upstreams.Session) bool {
	if pk == nil || (pk.hold && !pk.compressed()) || !s.ClientEnded() {
		return false
	}
	pk.bytesUp, pk.bytesDn = s.BytesUp(), s.BytesDown()
	if pk.hold {
		// Nothing to go back to: a provider session created for it is
		// released now.
		pk.remote = nil
		pk.park(nil, s.ClientCloseCode())
		return false
	}
	pk.park(nil, s.ClientCloseCode())
	return true
}

// onPark is the held session's OnPark: its client left, its provider
// connection stays open for the window.
func (pk *parking) onPark(s *upstreams.Session) {
	pk.left()
	pk.park(s, s.ClientCloseCode())
}

// park registers the session for the window.
func (pk *parking) park(held *upstreams.Session, code int) {
	now := pool.Clock.Now()
	e := &pool.Parked{
		ID:        pk.currentID(),
		Provider:  pk.provider,
		Protocol:  pk.proto,
		Point:     pk.point,
		Key:       pk.key,
		Started:   pk.started,
		Parked:    now,
		Until:     now.Add(pk.window),
		Client:    pk.client,
		RemoteIP:  pk.remoteIP,
		BytesUp:   pk.bytesUp,
		BytesDown: pk.bytesDn,
		CloseCode: code,
		Held:      held,
		Remote:    pk.remote,
		Data:      pk,
	}
	if pk.hold && held == nil {
		// Under hold, a session that is not held has nothing to go back
		// to (its provider ends the browser with the connection).
		e.Refuse = "the session negotiated a WebSocket extension (" + extensionNames(pk.answer.Header.Get("Sec-Websocket-Extensions")) +
			"): it could not be held, and a new connection cannot join it"
	}
	if held != nil {
		e.BytesUp, e.BytesDown = held.BytesUp(), held.BytesDown()
	}
	// Another node may take it back only when nothing of it lives here:
	// no open connection, no provider session to release.
	if pk.store != nil && held == nil && pk.remote == nil && e.Refuse == "" && pk.store.Usable() {
		v, _ := json.Marshal(sharedParked{Provider: pk.provider, Point: pk.point, Started: pk.started})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := pk.store.Store().ParkResume(ctx, e.ID, pk.key, v, pk.window); err != nil {
			pk.store.Failed("park resume", err)
		} else {
			pk.store.Worked()
			e.Shared = true
		}
		cancel()
	}
	logger := pk.h.logger
	store := pk.store
	pool.Park(e, func(e *pool.Parked) {
		// The window ran out (or an operator ended it).
		if e.Shared && store != nil && store.Usable() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			store.Store().DropResume(ctx, e.ID, e.Key)
			cancel()
		}
		if e.Held != nil {
			e.Held.Close(e.CloseCode, EndResumeWindow)
		} else {
			e.Remote.Release()
		}
		logger.Info("resume window over", zap.String("session_id", e.ID), zap.String("provider", e.Provider),
			zap.Bool("held", e.Held != nil))
	})
	logger.Info("session parked",
		zap.String("session_id", e.ID),
		zap.String("provider", e.Provider),
		zap.Bool("held", held != nil),
		zap.Int("close_code", code),
		zap.Time("resumable_until", e.Until),
	)
}

// sharedParked is what the shared registry keeps of a parked session.
type sharedParked struct {
	Provider string                `json:"provider"`
	Point    upstreams.ResumePoint `json:"point"`
	Started  time.Time             `json:"started"`
}

// resumeFailure is why a resume is refused: its metric label and message.
type resumeFailure struct {
	result string
	status int
	msg    string
}

// resume serves a client that asks to take back the session id. It never
// contacts any provider but the session's.
func (c *connect) resume(id string) {
	h := c.h
	if h.Resume == nil {
		c.refuseResume(resumeFailure{observe.ResumeNotResumable, http.StatusGone, "sessions are not resumable here"})
		return
	}
	proto, version := upstreams.ClientProtocol(c.r.Header)
	c.cls = &class{proto: proto, pwVersion: version}
	if proto == upstreams.ProtocolPlaywright {
		c.refuseResume(resumeFailure{observe.ResumeNotResumable, http.StatusGone, "Playwright-protocol sessions are not resumable: connect over CDP to resume"})
		return
	}
	c.pool = h.poolFor(c.cls)
	e, ok := c.claim(id)
	if !ok {
		c.refuseResume(resumeFailure{observe.ResumeUnknown, http.StatusGone,
			"no resumable session with this ID: unknown, its window is over, already resumed, or not yours"})
		return
	}
	if e.Refuse != "" {
		pool.Unclaim(e)
		c.refuseResume(resumeFailure{observe.ResumeConflict, http.StatusConflict, e.Refuse})
		return
	}
	if e.Held != nil {
		c.joinHeld(e)
		return
	}
	c.redial(e)
}

// claim takes the parked entry id for this client: from this node's
// registry, or from the shared one.
func (c *connect) claim(id string) (*pool.Parked, bool) {
	key := c.resumeKey()
	c.awaitLeaving(id)
	e, ok := pool.ClaimParked(id, key)
	sh := c.h.shared
	if ok && !e.Shared {
		return e, true
	}
	if sh == nil || !sh.s.Usable() {
		// Shared, but the store cannot be asked: this node parked it,
		// and no other node could have taken it without the store.
		return e, ok
	}
	v, left, found, err := sh.s.Store().ClaimResume(c.r.Context(), id, key)
	if err != nil {
		sh.s.Failed("claim resume", err)
		return e, ok
	}
	sh.s.Worked()
	if ok {
		if !found {
			// Another node took it back meanwhile.
			return nil, false
		}
		return e, true
	}
	if !found {
		return nil, false
	}
	var sp sharedParked
	if json.Unmarshal(v, &sp) != nil || sp.Point.IsZero() {
		return nil, false
	}
	// The node that parked it forgets it.
	if err := sh.s.Store().AnnounceResumed(c.r.Context(), sp.Provider, id); err != nil {
		sh.s.Failed("announce resumed", err)
	}
	now := pool.Clock.Now()
	return &pool.Parked{ID: id, Provider: sp.Provider, Protocol: string(upstreams.ProtocolCDP), Point: sp.Point,
		Key: key, Started: sp.Started, Parked: now, Until: now.Add(left), Shared: true}, true
}

// leavingWait bounds how long a resume waits for the session it names to
// finish ending: a client that reconnects at once after a drop often
// arrives while the gateway is still closing its old session (it gives the
// provider CloseWait to answer the close).
const leavingWait = 2*upstreams.CloseWait + 500*time.Millisecond

// awaitLeaving waits, a bounded time, while the session id is still live
// and not parked, so that it is parked by the time the resume looks for
// it. A session whose client is still connected stays live: the resume
// then finds nothing to take.
func (c *connect) awaitLeaving(id string) {
	ls, ok := pool.SessionByID(id)
	if !ok || ls.Session.Parked() {
		return
	}
	t := time.NewTimer(leavingWait)
	defer t.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ls.Session.Done():
			return
		case <-tick.C:
			if ls.Session.Parked() {
				return
			}
		case <-t.C:
			return
		case <-c.r.Context().Done():
			return
		}
	}
}

// giveBack puts a claimed entry back for the rest of its window: the
// resume failed for a reason that is not the session's.
func (c *connect) giveBack(e *pool.Parked) {
	if pool.Unclaim(e) && e.Shared {
		if sh := c.h.shared; sh != nil && sh.s.Usable() {
			left := e.Until.Sub(pool.Clock.Now())
			v, _ := json.Marshal(sharedParked{Provider: e.Provider, Point: e.Point, Started: e.Started})
			if err := sh.s.Store().ParkResume(context.WithoutCancel(c.r.Context()), e.ID, e.Key, v, left); err != nil {
				sh.s.Failed("park resume", err)
			}
		}
	}
}

// redial takes the session back at its provider: the same URL, within the
// provider's usual limits (not drained, not in cooldown, a free slot, a
// cluster-wide slot, the client's client_limit share). When it cannot be
// asked, the entry stays for another try; when it refuses, the entry is
// gone.
func (c *connect) redial(e *pool.Parked) {
	h := c.h
	var m *member
	for _, i := range c.pool.members {
		if h.members[i].up.Name == e.Provider {
			m = h.members[i]
		}
	}
	unavailable := func(why string) {
		c.skip(m, why)
		c.giveBack(e)
		c.refuseResume(resumeFailure{observe.ResumeUnavailable, http.StatusGone,
			"the session's provider cannot take it back now (" + why + "); its window goes on"})
	}
	if m == nil {
		pool.Unpark(e.ID)
		e.Remote.Release()
		c.refuseResume(resumeFailure{observe.ResumeUnavailable, http.StatusGone, "the session's provider is no longer configured here"})
		return
	}
	st := m.state
	if st.Draining() {
		unavailable(upstreams.WordDrained)
		return
	}
	if h.ClientLimit != nil {
		k := h.quotaKey(c.replace)
		if !pool.TakeQuota(k, h.ClientLimit.Limit) {
			c.giveBack(e)
			c.finish(c.overOrUnavailableQuota())
			observe.Resume(observe.ResumeUnavailable)
			return
		}
		c.quota = &k
	}
	defer c.releaseHolds()
	permit, ok := st.Health.Acquire()
	if !ok {
		unavailable(upstreams.WordCooldown)
		return
	}
	if !st.TryReserve() {
		h.settle(st, permit, cooldown.Neutral, 0)
		st.SkippedFull()
		unavailable(upstreams.WordFull)
		return
	}
	ps := &passState{}
	lease, ok := c.claimShared(ps, m)
	if !ok {
		h.settle(st, permit, cooldown.Neutral, 0)
		st.UnreserveFailed()
		unavailable(c.attempts[len(c.attempts)-1].Outcome)
		return
	}
	res := m.up.Reconnect(c.r.Context(), c.hs, e.Point, c.replace)
	c.record(m, res.Outcome)
	if res.Outcome.Kind == upstreams.Failure && strings.HasPrefix(res.Outcome.Word, "status_") {
		// The provider answered: that browser is gone (Chrome answers a
		// page that no longer exists with 500), the provider is not
		// failing.
		res.Outcome.Kind = upstreams.Relay
	}
	switch h.conclude(nil, m, permit, res, false) {
	case verdictSuccess:
		c.lease = lease
		res.Conn.Remote = e.Remote
		observe.Resume(observe.ResumeOK)
		h.logger.Info("session resumed", zap.String("session_id", c.id), zap.String("resumed_from", e.ID),
			zap.String("provider", m.up.Name), zap.Bool("held", false))
		c.establish(m, res.Conn)
		return
	case verdictGone:
		releaseLease(lease)
		c.giveBack(e)
		c.finish(nil)
		observe.Resume(observe.ResumeRefused)
		return
	}
	releaseLease(lease)
	// The provider no longer has that browser, or cannot be reached: the
	// session is lost.
	e.Remote.Release()
	c.refuseResume(resumeFailure{observe.ResumeRefused, http.StatusGone,
		"the session's provider did not give it back (" + res.Outcome.Word + ")"})
}

// overOrUnavailableQuota is the 429 of a resuming client over its
// client_limit.
func (c *connect) overOrUnavailableQuota() *reply {
	c.inQuota = true
	return c.overOrUnavailable("client limit")
}

// refuseResume answers a resume that cannot be served.
func (c *connect) refuseResume(f resumeFailure) {
	observe.Resume(f.result)
	body := map[string]any{"error": f.msg}
	if len(c.attempts) > 0 {
		body["attempts"] = c.attempts
	}
	provider := ""
	if len(c.attempts) > 0 {
		provider = c.attempts[len(c.attempts)-1].Provider
	}
	c.finish(&reply{status: f.status, reason: "resume " + f.result, provider: provider, write: func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, f.status, body, nil)
	}})
}

// parseResume reads `resume <window> [hold]`.
func parseResume(d *caddyfile.Dispenser) (*ResumeConfig, error) {
	args := d.RemainingArgs()
	if len(args) == 0 || len(args) > 2 {
		return nil, d.Errf("resume takes a window and, optionally, hold: resume <window> [hold]")
	}
	w, err := caddy.ParseDuration(args[0])
	if err != nil {
		return nil, d.Errf("resume: invalid window %q", args[0])
	}
	rc := &ResumeConfig{Window: caddy.Duration(w)}
	if len(args) == 2 {
		if args[1] != "hold" {
			return nil, d.Errf("resume: unknown word %q after the window (want hold)", args[1])
		}
		rc.Hold = true
	}
	return rc, nil
}
