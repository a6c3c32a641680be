package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Resume: a CDP session that ends from the client's side (its close frame,
// or its connection dropping) may be taken back within the resume window
// by a client that presents the session's resume token, and gets the same
// browser: the same provider, the same upstream URL (a discovered
// provider's webSocketDebuggerUrl, a created session's connect URL), never
// a fresh browser elsewhere. Chrome keeps its browser and pages when a
// DevTools connection closes, so without hold the gateway closes the
// provider connection as usual and dials the same URL again on resume.
// With hold, for providers that end the browser when the socket closes,
// the provider connection stays open (and keeps its slot) while no client
// is joined, and a resuming client is joined to it.
//
// The token is a secret only the client holds: it brings its own on its
// first connect (CDP clients cannot read their 101's headers), or takes
// the one the gateway hands out on the 101. The gateway keeps only a keyed
// hash of it. The session ID, which operators see everywhere, identifies
// a session and never takes one back. A resumed session keeps its token,
// so a client may drop and resume again with the same URL. With
// resume_key, a token resumes only for a client whose key has the same
// value. Whatever cannot be resumed is answered 410 with a JSON error,
// and no provider is asked for anything else.
//
// A parked session that still holds a provider session (a held socket, or
// a session created over a session API and not released yet) keeps what
// it counts against: its slot (max_concurrent), its client_limit share
// and its cluster-wide slot, until it is resumed or its window ends.

// resumeRequest takes out of the client's request what it says of
// resuming: presented is the token of a session it takes back (the
// ResumeQuery item or ResumeHeader), token the one it brings for the
// session it opens now (ResumeTokenQuery or ResumeTokenHeader). None of
// them goes to a provider; the rest of the query stays as the client
// wrote it.
func resumeRequest(r *http.Request, hs *upstreams.Handshake) (presented, token string) {
	presented = strings.TrimSpace(r.Header.Get(ResumeHeader))
	token = strings.TrimSpace(r.Header.Get(ResumeTokenHeader))
	hs.Header.Del(ResumeHeader)
	hs.Header.Del(ResumeTokenHeader)
	if !strings.Contains(hs.RawQuery, ResumeQuery) {
		return presented, token
	}
	var kept []string
	for _, part := range strings.Split(hs.RawQuery, "&") {
		k, v, _ := strings.Cut(part, "=")
		ku, err := url.QueryUnescape(k)
		if err != nil || (ku != ResumeQuery && ku != ResumeTokenQuery) {
			kept = append(kept, part)
			continue
		}
		vu, err := url.QueryUnescape(v)
		if err != nil {
			continue
		}
		switch {
		case ku == ResumeQuery && presented == "":
			presented = strings.TrimSpace(vu)
		case ku == ResumeTokenQuery && token == "":
			token = strings.TrimSpace(vu)
		}
	}
	hs.RawQuery = strings.Join(kept, "&")
	return presented, token
}

// resume is the way of a client that presents the resume token of a
// session it takes back: a way beside the chain, for upgrade clients,
// through its steps (admit, conclude) but with no order and no queue. It
// never contacts any provider but the session's.
type resume struct {
	*connect
}

// take serves the client: the session it names back, or a refusal.
func (c resume) take(presented string) {
	h := c.h
	if h.Resume == nil {
		c.refuseResume(resumeFailure{observe.ResumeNotResumable, http.StatusGone, "sessions are not resumable here"})
		return
	}
	proto, version := upstreams.ClientProtocol(c.r.Header, c.r.URL.Path)
	c.cls = &class{proto: proto, pwVersion: version}
	switch proto {
	case upstreams.ProtocolPlaywright:
		c.refuseResume(resumeFailure{observe.ResumeNotResumable, http.StatusGone, "Playwright-protocol sessions are not resumable: connect over CDP to resume"})
		return
	case upstreams.ProtocolBiDi:
		c.refuseResume(resumeFailure{observe.ResumeNotResumable, http.StatusGone, "WebDriver BiDi sessions are not resumable: the gateway ends each one with its client"})
		return
	}
	if h.ResumeKey != "" && c.resumeKeyValue() == "" {
		c.refuseResume(resumeFailure{observe.ResumeUnknown, http.StatusGone,
			"no resumable session: resume_key has no value for this client, so it has none to take back"})
		return
	}
	c.pool = h.poolFor(c.cls)
	unknown := resumeFailure{observe.ResumeUnknown, http.StatusGone,
		"no resumable session for this resume token: unknown, its window is over, already resumed, or not yours (a session ID is not a resume token)"}
	if !validResumeToken(presented) {
		c.refuseResume(unknown)
		return
	}
	token := c.h.reg.Hashes.ResumeToken(presented)
	e, ok, unreachable := c.claim(token)
	switch {
	case unreachable:
		c.refuseResume(resumeFailure{observe.ResumeUnavailable, http.StatusServiceUnavailable,
			"the shared resume registry cannot be asked now; try again shortly"})
		return
	case !ok:
		c.refuseResume(unknown)
		return
	}
	if e.Refuse != "" {
		c.h.reg.Parked.Unclaim(e)
		c.refuseResume(resumeFailure{observe.ResumeConflict, http.StatusConflict, e.Refuse})
		return
	}
	// The resumed session parks again, if its client leaves, under the
	// same token, and keeps the options it was made with.
	c.token = presented
	c.opts = parkedOptions(e.Options)
	c.recording = e.Recording
	if c.recording != "" || c.opts.Profile() != "" {
		// Its recording goes on, or its profile is saved at its end: no
		// compression (recording.go, profile_session.go).
		offerNoExtension(c.hs)
	}
	if e.Held != nil {
		c.joinHeld(e)
		return
	}
	c.redial(e)
}

// claim takes the parked entry of the token hash for this client: from
// this node's registry, or from the shared one. unreachable reports that
// the shared registry, which may hold the entry or know that another node
// took it, cannot be asked: the entry is left where it was.
func (c resume) claim(token string) (e *pool.Parked, ok, unreachable bool) {
	key := c.resumeKey()
	c.awaitLeaving(token)
	e, ok = c.h.reg.Parked.Claim(token, key)
	sh := c.h.shared
	if sh == nil || (ok && !e.Shared) {
		// Only this node could have parked it, and nobody else taken it.
		return e, ok, false
	}
	down := func(op string, err error) (*pool.Parked, bool, bool) {
		if err != nil {
			sh.s.Failed(op, err)
		}
		if ok {
			c.h.reg.Parked.Unclaim(e)
		}
		return nil, false, true
	}
	if !sh.s.Usable() {
		return down("", nil)
	}
	v, left, found, err := sh.s.Store().ClaimResume(c.ctx, token, key)
	if err != nil {
		return down("claim resume", err)
	}
	sh.s.Worked()
	if ok {
		// Taken here and in the shared store, or by another node
		// meanwhile.
		return e, found, false
	}
	if !found {
		return nil, false, false
	}
	sp, err := decodeSharedParked(v)
	var rp upstreams.ResumePoint
	var m *member
	if err == nil {
		if m = c.memberNamed(sp.Provider); m != nil {
			rp, err = m.up.Restore(sp.Point)
		}
	}
	if err != nil {
		c.h.logger.Warn("resume entry from the shared state refused", zap.String("cause", err.Error()))
		return nil, false, false
	}
	// The node that parked it forgets it.
	if err := sh.s.Store().News().AnnounceResumed(c.ctx, sp.Provider, token); err != nil {
		sh.s.Failed("announce resumed", err)
	}
	now := c.h.reg.Now()
	return &pool.Parked{ID: sp.ID, Token: token, Provider: sp.Provider, Protocol: string(upstreams.ProtocolCDP), Point: rp,
		Key: key, Started: sp.Started, Parked: now, Until: now.Add(left), Shared: true, Options: sp.Options, Recording: sp.Recording, Data: sp.Point}, true, false
}

// memberNamed is the member of the client's pool called name, nil when
// none.
func (c resume) memberNamed(name string) *member {
	for _, i := range c.pool.members {
		if m := c.pool.all[i]; m.up.Name == name {
			return m
		}
	}
	return nil
}

// leavingWait bounds how long a resume waits for the session it names to
// finish ending: a client that reconnects at once after a drop often
// arrives while the gateway is still closing its old session (it gives the
// provider CloseWait to answer the close).
const leavingWait = 2*upstreams.CloseWait + 500*time.Millisecond

// leavingStart bounds how long a resume waits for a live session of its
// token to begin ending at all: a client that reconnects right after its
// connection dropped may be a little ahead of the relay seeing the drop.
const leavingStart = 150 * time.Millisecond

// awaitLeaving waits, a bounded time, while the session of the token hash
// is ending but not parked yet, so that it is parked by the time the
// resume looks for it. A session whose client is still connected stays
// live: after leavingStart the resume finds nothing to take.
func (c resume) awaitLeaving(token string) {
	ls, ok := c.h.reg.Sessions.ByResumeToken(token)
	if !ok {
		return
	}
	s, relayed := ls.Session.(*upstreams.Session)
	if !relayed || s.Parked() {
		return
	}
	start := time.Now()
	t := time.NewTimer(leavingWait)
	defer t.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-s.Done():
			return
		case <-tick.C:
			if s.Parked() || (!s.Ending() && time.Since(start) > leavingStart) {
				return
			}
		case <-t.C:
			return
		case <-c.ctx.Done():
			return
		}
	}
}

// giveBack puts a claimed entry back for the rest of its window: the
// resume failed for a reason that is not the session's.
func (c resume) giveBack(e *pool.Parked) {
	if !e.Shared {
		c.h.reg.Parked.Unclaim(e)
		return
	}
	sh := c.h.shared
	if !c.h.reg.Parked.Unclaim(e) || sh == nil || !sh.s.Usable() {
		return
	}
	sp, ok := e.Data.(upstreams.SharedPoint)
	if pk, isLocal := e.Data.(*parking); isLocal {
		sp, ok = pk.up.Share(e.Point)
	}
	if !ok {
		return
	}
	left := e.Until.Sub(c.h.reg.Now())
	v, _ := json.Marshal(sharedParked{ID: e.ID, Provider: e.Provider, Point: sp, Started: e.Started, Options: e.Options, Recording: e.Recording})
	if err := sh.s.Store().ParkResume(context.WithoutCancel(c.ctx), e.Token, e.Key, v, left); err != nil {
		sh.s.Failed("park resume", err)
	}
}

// redial takes the session back at its provider: the same URL, within the
// provider's usual limits, through the chain's own admission (not
// drained, not in cooldown, a free slot, a cluster-wide slot, the
// client's client_limit share). A parked session that kept its provider
// session hands its ticket (slot, share, cluster-wide slot, meter) to the
// resume instead. When the provider cannot be asked, the entry stays for
// another try, with its ticket; when it refuses, the session is lost, and
// what it held is given back with the client's ticket.
func (c resume) redial(e *pool.Parked) {
	h := c.h
	m := c.memberNamed(e.Provider)
	pk, _ := e.Data.(*parking)
	kept := pk.takeKept()
	if kept != nil {
		// The client holds the parked session's ticket from here (its
		// own, fresh, held nothing yet).
		c.ticket.Release()
		c.ticket = kept
	}
	hadKept := c.ticket.Provider() != nil
	// A ticket that keeps only the session's browser profile (a session
	// without a provider session of its own to keep).
	profileKept := kept != nil && !hadKept
	c.resuming = true
	// unavailable refuses the resume for its provider's sake, the skip
	// recorded; the window goes on, with the ticket it kept.
	unavailable := func(refuse func()) {
		if hadKept || profileKept {
			pk.putKept(c.ticket)
			c.ticket = nil
		}
		c.giveBack(e)
		refuse()
	}
	if m == nil {
		c.h.reg.Parked.Remove(e.ID)
		c.refuseResume(resumeFailure{observe.ResumeUnavailable, http.StatusGone, "the session's provider is no longer configured here"})
		return
	}
	if cb := h.ClientBudget; cb != nil && c.ticket.ClientBook() == nil {
		// A resumed session that is a new provider session counts
		// toward its key's spend too (a resume is never refused for
		// it: the session was admitted before).
		c.clientBookOf(cb)
	}
	ps := &passState{}
	t, ok := c.admit(ps, m)
	if !ok {
		if ps.quotaOver {
			unavailable(func() {
				c.finish(c.overOrUnavailableQuota())
				c.h.reg.Metrics().Resume(observe.ResumeUnavailable)
			})
			return
		}
		why := c.attempts[len(c.attempts)-1].Outcome
		unavailable(func() {
			c.refuseResume(resumeFailure{observe.ResumeUnavailable, http.StatusGone,
				"the session's provider cannot take it back now (" + why + "); its window goes on"})
		})
		return
	}
	res := m.up.Reconnect(c.ctx, c.hs, e.Point, c.replaceAt(m))
	c.record(m, res.Outcome)
	if res.Outcome.Kind == upstreams.Failure && strings.HasPrefix(res.Outcome.Word, "status_") {
		// The provider answered: that browser is gone (Chrome answers a
		// page that no longer exists with 500), the provider is not
		// failing.
		res.Outcome.Kind = upstreams.Relay
	}
	// Anything but a session releases the ticket: a provider session
	// that could no longer be counted is not kept.
	switch h.conclude(nil, m, t, res, false) {
	case verdictSuccess:
		c.won(t)
		c.h.reg.Metrics().Resume(observe.ResumeOK)
		h.logger.Info("session resumed", zap.String("session_id", c.id), zap.String("resumed_from", e.ID),
			zap.String("provider", m.up.Name), zap.Bool("held", false))
		socket{c.connect}.establish(m, res.Conn)
		return
	case verdictGone:
		if profileKept {
			pk.putKept(c.ticket)
			c.ticket = nil
		}
		if !hadKept {
			c.giveBack(e)
		}
		c.finish(nil)
		c.h.reg.Metrics().Resume(observe.ResumeRefused)
		return
	}
	// The provider no longer has that browser, or cannot be reached: the
	// session is lost.
	c.refuseResume(resumeFailure{observe.ResumeRefused, http.StatusGone,
		"the session's provider did not give it back (" + res.Outcome.Word + ")"})
}

// overOrUnavailableQuota is the 429 of a resuming client over its
// client_limit.
func (c resume) overOrUnavailableQuota() *refusal {
	c.inQuota = true
	return c.overOrUnavailable("client limit")
}

// refuseResume answers a resume that cannot be served.
func (c resume) refuseResume(f resumeFailure) {
	c.h.reg.Metrics().Resume(f.result)
	rf := &refusal{status: f.status, reason: "resume " + f.result, msg: f.msg}
	if len(c.attempts) > 0 {
		rf.more = map[string]any{"attempts": c.attempts}
		rf.provider = c.attempts[len(c.attempts)-1].Provider
	}
	if f.status == http.StatusServiceUnavailable {
		rf.retryAfter = resumeRetryAfter
	}
	c.finish(rf)
}
