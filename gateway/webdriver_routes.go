package gateway

import (
	"context"
	"crypto/subtle"
	"errors"
	"io"
	"net/http"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/options"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// The routes of live WebDriver sessions: each command a client sends to
// its session (<base>/session/<id>/…) is forwarded to the session's
// provider session, its answer streamed back with the provider's session
// ID replaced by the client's; DELETE <base>/session/<id> ends the
// session; an upgrade to <base>/session/<id> or …/se/cdp is the session's
// BiDi or CDP socket, relayed to the provider's own. The session is this
// node's (wdSession), or under shared state another node's, reached
// through its route in Redis. None of this walks the chain: the session
// exists; a path ID that names no live session of this client is an
// unknown one, and the provider hears nothing of it.

// webDriverTarget is the session a command or socket is for: this node's,
// or under shared state another node's (a route).
type webDriverTarget struct {
	local *wdSession
	// remote: another node's session.
	up       *upstreams.Provider
	ps       *upstreams.WebDriverSession
	provider string
	// id is the session's operator ID (placeholders, logs, headers);
	// route its route's key in the shared state ("" when not shared).
	id, route string
}

// webDriverTargetOf finds the session that r names by pathID; ok is false
// when it is not a live WebDriver session of this gateway that r may use:
// one bound to this handler (or to one it succeeds,
// pool.Handlers.Serves) and, when bound to client key
// placeholders, to the values r gives them (sameClient).
func (h webDrivers) webDriverTargetOf(r *http.Request, pathID string) (webDriverTarget, bool) {
	if !validPathID(pathID) {
		return webDriverTarget{}, false
	}
	if ls, ok := h.reg.Sessions.ByPath(pool.PathHash(pathID)); ok {
		s, ok := ls.Session.(*wdSession)
		if !ok || !h.reg.Handlers.Serves(ls.Bound.Handler, h.Gateway) || !sameClient(ls.Bound.Keys, ls.Bound.Client, r, pool.ClientHash) {
			return webDriverTarget{}, false
		}
		return webDriverTarget{local: s, up: s.upNow(), ps: s.ps, provider: s.provider, id: s.id, route: s.route}, true
	}
	sh := h.shared
	if sh == nil || !sh.s.Usable() {
		return webDriverTarget{}, false
	}
	key := h.reg.Hashes.RouteKey(pathID)
	rt, ok, err := sh.s.Store().Routes().Get(r.Context(), key)
	if err != nil {
		h.logger.Warn("WebDriver route from the shared state not read", zap.String("cause", err.Error()))
		return webDriverTarget{}, false
	}
	if !ok || rt.Session == "" || !slices.ContainsFunc(rt.Handlers, func(k string) bool { return h.reg.Handlers.Serves(k, h.Gateway) }) ||
		!sameClient(rt.Keys, rt.Client, r, h.reg.Hashes.SharedClient) {
		return webDriverTarget{}, false
	}
	m := h.memberByName(rt.Provider)
	if m == nil || m.up.Protocol() != upstreams.ProtocolWebDriver {
		return webDriverTarget{}, false
	}
	ps, err := m.up.WebDriverSessionOf(rt.ProviderID, rt.SocketURL, rt.CDPURL)
	if err != nil {
		h.logger.Warn("WebDriver route from the shared state refused", zap.String("provider", rt.Provider), zap.String("cause", err.Error()))
		return webDriverTarget{}, false
	}
	return webDriverTarget{up: m.up, ps: ps, provider: rt.Provider, id: rt.Session, route: key}, true
}

// sameClient reports whether r's values of the client key placeholders
// keys hash (with hash) to want: the request is the bound client's. A
// session bound to no keys is any client's.
func sameClient(keys []string, want string, r *http.Request, hash func([]string) string) bool {
	if len(keys) == 0 {
		return true
	}
	var replace func(string) string
	if repl := replacerOf(r); repl != nil {
		replace = func(s string) string { return repl.ReplaceKnown(s, "") }
	}
	got := hash(clientValues(keys, replace))
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// memberByName is the handler's member called name, nil when none: a
// found provider leaving too, whose live sessions go on.
func (h webDrivers) memberByName(name string) *member {
	return h.current().named(name)
}

// active notes a command or a socket's activity for the session's idle
// timeout, here or (another node's) in the shared state.
func (h webDrivers) active(t webDriverTarget) {
	if t.local != nil {
		t.local.touch()
	}
	if sh := h.shared; sh != nil && t.route != "" && sh.s.Usable() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if err := sh.s.Store().Routes().Touch(ctx, t.route, h.webDriverRouteTTL()); err != nil {
			sh.s.Failed("touch route", err)
		}
		cancel()
	}
}

// ended tells the session's owner that it ended here (the client's
// DELETE, or the provider's invalid session id): this node's own session
// ends now, its provider session known gone when gone is set (else the
// gateway sends DELETE itself); another node's hears it from the shared
// state.
func (h webDrivers) ended(t webDriverTarget, reason string, gone bool) {
	if t.local != nil {
		t.local.end(reason, !gone)
		return
	}
	sh := h.shared
	if sh == nil || !sh.s.Usable() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := sh.s.Store().News().AnnounceWebDriverEnd(ctx, t.route); err != nil {
		sh.s.Failed("announce end", err)
	}
}

// noSuchSession answers a request for a session it may not use, or that
// is not live: the same answer either way, which does not repeat the ID.
func noSuchSession(w http.ResponseWriter) {
	upstreams.WriteWebDriverError(w, "invalid session id", "no live session with this ID for this client on this gateway")
}

// webDriverCommand forwards a command to its session's provider session,
// and streams the answer back with the provider's session ID replaced by
// the client's.
func (h webDrivers) webDriverCommand(w http.ResponseWriter, r *http.Request, wr wdRequest) {
	t, ok := h.webDriverTargetOf(r, wr.id)
	if !ok {
		noSuchSession(w)
		return
	}
	if repl := replacerOf(r); repl != nil {
		repl.Set(PlaceholderSessionID, t.id)
		repl.Set(PlaceholderProvider, t.provider)
	}
	h.active(t)
	resp, err := t.up.WebDriverCommand(r.Context(), t.ps, r.Method, wr.rest, r.URL.RawQuery, upstreams.CommandBody(r.Body, r.ContentLength))
	h.reg.Metrics().WebDriverCommand(t.provider)
	if t.local != nil {
		t.local.command()
	}
	if err != nil {
		switch {
		case r.Context().Err() != nil:
			return // the client went away
		case errors.Is(err, upstreams.ErrCommandTooLarge), errors.Is(err, upstreams.ErrCommandPath):
			upstreams.WriteWebDriverError(w, "invalid argument", err.Error())
		default:
			// Its text names the provider, never its address.
			var ce *upstreams.CommandError
			if errors.As(err, &ce) {
				h.logger.Debug("WebDriver command not sent", zap.String("provider", t.provider), zap.String("cause", ce.Unwrap().Error()))
			}
			upstreams.WriteWebDriverError(w, "unknown error", "the session's "+err.Error())
		}
		return
	}
	defer resp.Body.Close()
	// The provider's own end of the session shows in its answer's first
	// bytes; the answer is relayed as it is all the same.
	head := make([]byte, 512)
	n, _ := io.ReadFull(resp.Body, head)
	head = head[:n]
	gone := upstreams.IsInvalidSessionAnswer(resp.StatusCode, head)
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	rw := t.ps.Rewriter(w, wr.id)
	if cl := resp.Header.Get("Content-Length"); cl != "" && rw.SameLength() {
		w.Header().Set("Content-Length", cl)
	}
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(resp.StatusCode)
	if _, err := rw.Write(head); err == nil {
		if _, err := io.Copy(rw, resp.Body); err == nil {
			rw.Flush()
		}
	}
	if t.local != nil {
		t.local.counted(r.ContentLength, rw.Written())
	}
	switch {
	case r.Method == http.MethodDelete && wr.rest == "":
		// Ended whatever the provider answers; known gone when it says
		// so (else the gateway sends DELETE again, with retries).
		st := resp.StatusCode
		h.ended(t, EndClientDelete, st/100 == 2 || st == http.StatusNotFound || st == http.StatusGone)
	case gone:
		h.ended(t, EndProviderGone, true)
	}
}

// serveWebDriverSocket relays the BiDi or CDP socket of a live WebDriver
// session; it reports false when the upgrade's path is not a session's
// socket (it then goes the chain's way). A session's socket that is not
// live, or not this client's, is an unknown session, as for commands.
func (h webDrivers) serveWebDriverSocket(w http.ResponseWriter, r *http.Request, wr wdRequest) bool {
	if wr.id == "" || (wr.rest != "" && wr.rest != "/se/cdp") {
		return false
	}
	if !h.origins.Allows(r.Header.Values("Origin")) {
		// Before the session is looked for: a web page learns nothing of
		// which IDs are live.
		h.obs.Rejected(http.StatusForbidden, observe.ReasonOrigin, 0)
		writeRefusal(w, r, refusedOrigin("upgrade"))
		return true
	}
	t, ok := h.webDriverTargetOf(r, wr.id)
	if !ok {
		noSuchSession(w)
		return true
	}
	hs, err := upstreams.Check(r)
	if err != nil {
		var ce *upstreams.CheckError
		errors.As(err, &ce)
		writeJSON(w, ce.Status, map[string]string{"error": ce.Msg}, nil)
		return true
	}
	var replace func(string) string
	if repl := replacerOf(r); repl != nil {
		replace = func(s string) string { return repl.ReplaceKnown(s, "") }
		repl.Set(PlaceholderSessionID, t.id)
	}
	cdp := wr.rest == "/se/cdp"
	// Its header_up renders the session's options as its create's did
	// (another node's session: its options are not in the shared state,
	// and render as unset).
	var stated options.Set
	if t.local != nil {
		stated = t.local.opts
	}
	res := t.up.WebDriverSocket(r.Context(), hs, t.ps, cdp, withOptions(t.up, stated, replace))
	if res.Outcome.Kind != upstreams.Success {
		if res.Outcome.Kind == upstreams.Relay {
			res.Body = t.ps.Rewrite(res.Body, wr.id)
			writeRefusal(w, r, relayedFrom(t.provider, res))
			return true
		}
		writeJSON(w, http.StatusBadGateway, map[string]string{
			"error": "the session's provider " + t.provider + " did not open its socket (" + res.Outcome.Word + ")",
		}, nil)
		return true
	}
	up := res.Conn
	fields := []upstreams.HeaderField{{Name: SessionHeader, Value: t.id}}
	for _, k := range []string{"Sec-Websocket-Protocol", "Sec-Websocket-Extensions"} {
		for _, v := range up.Answer.Header.Values(k) {
			fields = append(fields, upstreams.HeaderField{Name: k, Value: v})
		}
	}
	ho, err := handOver(w, r, hs, up.Answer.RawWithHeaders(upstreams.HeaderField{Name: SessionHeader, Value: t.id}), fields)
	if err != nil {
		up.Close()
		return true
	}
	up.Answer = nil
	h.active(t)
	opts := upstreams.SessionOptions{
		ClientPending: ho.pending,
		Keepalive:     time.Duration(h.Keepalive),
	}
	if t.local != nil {
		local := t.local
		opts.OnEnd = func(s *upstreams.Session) { local.socketEnded(s) }
	} else {
		reg := h.reg
		opts.OnEnd = func(s *upstreams.Session) { reg.Sockets.Remove(s) }
	}
	s := upstreams.NewSession(ho.conn, up, opts)
	if t.local != nil {
		if !t.local.addSocket(s) {
			s.Close(upstreams.CloseNormal, "session ended")
		}
	} else {
		h.reg.Sockets.Add(t.route, s)
	}
	if ho.greet != nil {
		if err := ho.greet(); err != nil {
			s.Close(upstreams.CloseGoingAway, upstreams.EndClientError)
		}
	}
	s.Run()
	ho.await(s, nil)
	return true
}

// webDriverNews is what the other nodes say of WebDriver sessions, under
// shared state: one saw this node's session end (its client's DELETE, its
// provider's end), so its ticket goes; or a session's owner ended it, so
// its sockets here close.
func (h webDrivers) webDriverNews(e cluster.Event) {
	s := h.shared.s
	switch e.Kind {
	case cluster.EventWebDriverEnd:
		if e.Node != s.Store().Node() {
			if wd := h.webDriverSessionByRoute(e.Session); wd != nil {
				wd.end(EndElsewhere, false)
			}
		}
	case cluster.EventWebDriverEnded:
		h.reg.Sockets.CloseSession(e.Session, upstreams.CloseNormal, "session ended")
	}
}
