package gateway

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/options"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// WebDriver sessions over HTTP (Selenium, WebdriverIO). A client creates
// a browser with POST <base>/session and sends each command as its own
// HTTP request to <base>/session/<id>/…; with BiDi on it also opens the
// WebSocket its create answer names. With a webdriver provider in the
// handler, a request whose path has a segment "session" is WebDriver:
//
//   - POST <base>/session is a create: the chain's own way (join, order,
//     admission, attempts one after the other — hedging does not apply —,
//     the queue), each attempt a create call at a webdriver provider
//     that can start the browser asked for. The session that results
//     holds the client's ticket (webdriver_session.go), and the client
//     gets the provider's answer rewritten: the session's path ID (the
//     client's secret, session_id.go), socket URLs on the gateway's host,
//     nothing that tells where the provider runs.
//   - <base>/session/<id>[/…] is a command, forwarded to the session's
//     provider session, its answer streamed back with the provider's
//     session ID replaced by the path ID; DELETE <base>/session/<id> ends
//     it.
//   - an upgrade to <base>/session/<id> or <base>/session/<id>/se/cdp is
//     a live WebDriver session's BiDi or CDP socket, relayed to the
//     provider's own; every other upgrade goes the chain's way (a BiDi
//     client's /session path among them).
//   - GET <base>/status is answered by the gateway.
//
// A path ID serves only the handler that created the session (or the one
// a reload replaced it with) and, when that handler has a client key
// (client_limit, client_budget), only requests with the client's key:
// anything else is an unknown session ("invalid session id"), and the
// provider hears nothing of it. Every WebDriver request follows the
// Origin rule of upgrades (a web page must not drive a browser through
// fetch either). Under shared state each session's route is in Redis,
// under a keyed hash of its path ID, so any node serves its commands and
// sockets; the node that created it owns its slot and its end.

// The default idle timeout of a WebDriver session: its client sends
// commands, so one that sent none for this long (with no socket open) has
// gone.
const defaultWebDriverIdle = 5 * time.Minute

// wdCreate is a WebDriver create's part of a client's way.
type wdCreate struct {
	req *upstreams.CreateRequest
	// base is the client's base path ("" for the root, "/wd/hub" …).
	base string
	// last is the last session not created answer a provider gave it
	// (nil: none); see noteDeclined.
	last *declined
}

// declined is a WebDriver provider's session not created answer to a
// create.
type declined struct {
	provider, resource string
	res                upstreams.Result
}

// wdRequest is where a WebDriver request goes.
type wdRequest struct {
	base string
	// id is the session a command or socket is for ("" for a create).
	id string
	// rest is what follows /session/<id> ("" or "/…").
	rest   string
	status bool // GET <base>/status
}

// parseWebDriverPath reads a WebDriver request's path: ok is false when
// the path has no segment "session" and does not end in "/status".
func parseWebDriverPath(p string) (wdRequest, bool) {
	segs := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for i, s := range segs {
		if s != "session" {
			continue
		}
		wr := wdRequest{base: joinSegments(segs[:i])}
		if i+1 < len(segs) {
			wr.id = segs[i+1]
			if i+2 < len(segs) {
				wr.rest = "/" + strings.Join(segs[i+2:], "/")
			}
		}
		return wr, true
	}
	if len(segs) > 0 && segs[len(segs)-1] == "status" {
		return wdRequest{base: joinSegments(segs[:len(segs)-1]), status: true}, true
	}
	return wdRequest{}, false
}

func joinSegments(segs []string) string {
	if len(segs) == 0 || (len(segs) == 1 && segs[0] == "") {
		return ""
	}
	return "/" + strings.Join(segs, "/")
}

// serveWebDriver answers a WebDriver request that is not an upgrade.
func (h *Gateway) serveWebDriver(w http.ResponseWriter, r *http.Request, wr wdRequest) {
	if !h.origins.Allows(r.Header.Values("Origin")) {
		h.obs.Rejected(http.StatusForbidden, observe.ReasonOrigin, 0)
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		writeWebDriverError(w, http.StatusForbidden, "unknown error", "refused: this request carries an Origin header, so a web page sent it, "+
			"and this gateway accepts web pages only from the origins its allowed_origins option names (automation clients send no Origin)")
		return
	}
	switch {
	case wr.status:
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			upstreams.WriteWebDriverError(w, "unknown method", "the gateway's status is read with GET")
			return
		}
		h.webDriverStatus(w)
	case wr.id == "":
		if r.Method != http.MethodPost {
			upstreams.WriteWebDriverError(w, "unknown method", "a new session is created with POST "+wr.base+"/session")
			return
		}
		h.webDriverCreate(w, r, wr)
	default:
		h.webDriverCommand(w, r, wr)
	}
}

// writeWebDriverError writes a WebDriver error with a status of the
// gateway's own (403 for a foreign Origin), not the code's.
func writeWebDriverError(w http.ResponseWriter, status int, code, msg string) {
	b, _ := json.Marshal(map[string]any{"value": map[string]string{"error": code, "message": msg, "stacktrace": ""}})
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

// webDriverStatus answers GET <base>/status: ready while some webdriver
// provider admits a session now.
func (h *Gateway) webDriverStatus(w http.ResponseWriter) {
	ready := false
	for _, m := range h.members {
		if m.up.Protocol() == upstreams.ProtocolWebDriver && m.state.HasRoom() {
			if over, _ := m.state.Spend.OverBudget(); !over {
				ready = true
				break
			}
		}
	}
	msg := "no WebDriver provider takes a new session now"
	if ready {
		msg = "a WebDriver provider takes new sessions"
	}
	writeJSON(w, http.StatusOK, map[string]any{"value": map[string]any{"ready": ready, "message": msg}}, nil)
}

// webDriverCreate serves POST <base>/session through the chain.
func (h *Gateway) webDriverCreate(w http.ResponseWriter, r *http.Request, wr wdRequest) {
	body, err := io.ReadAll(io.LimitReader(r.Body, upstreams.MaxWebDriverCreate+1))
	if err != nil {
		return // the client went away
	}
	if len(body) > upstreams.MaxWebDriverCreate {
		upstreams.WriteWebDriverError(w, "invalid argument", "the new session's body is over "+strconv.Itoa(upstreams.MaxWebDriverCreate>>20)+" MiB")
		return
	}
	req, err := upstreams.ParseCreateRequest(body)
	if err != nil {
		upstreams.WriteWebDriverError(w, "invalid argument", err.Error())
		return
	}
	c := h.newConnect(w, r, nil)
	c.wd = &wdCreate{req: req, base: wr.base}
	defer func() { c.ticket.Release() }()
	if !c.check() {
		return
	}
	c.run()
}

// attempt is one attempt of the client's at m: a create call for a
// WebDriver client, an upgrade for the others.
func (c *connect) attempt(ctx context.Context, m *member) upstreams.Result {
	if c.wd != nil {
		return m.up.CreateWebDriver(ctx, c.wd.req, c.replaceAt(m))
	}
	return m.up.Connect(ctx, c.hs, c.replaceAt(m))
}

// anyAccepts reports whether some provider of the client's pool can start
// the browser its create asks for.
func (c *connect) anyAccepts() bool {
	for _, i := range c.pool.members {
		if c.h.members[i].up.Accepts(c.wd.req) {
			return true
		}
	}
	return false
}

// A WebDriver provider that answers a create "session not created"
// (other than full) will not start what the client asked for: it is the
// provider's word on those capabilities, not a failure. The client's way
// goes on without it, for the rest of its way: its later passes do not
// ask it again, and it does not wait in the queue for it (nor hold back a
// newcomer who could use it). The client waits only while some provider
// that has not declined could serve it later (busy: full, in cooldown,
// at its create_rate, left to earlier waiters); when none is left, it
// gets the last session not created answer as the provider sent it. A
// client that waits until its queue timeout gets the timeout's answer.

// noteDeclined takes in the providers that declined the create in pass
// ps: the client's class names them (declinedBy), so its later passes
// leave them out and it waits in the queue for the others only (usable).
func (c *connect) noteDeclined(ps *passState) {
	if c.wd == nil || len(ps.declined) == 0 {
		return
	}
	c.wd.last = &ps.declined[len(ps.declined)-1]
	// A new set, never a change to the one a reload may be reading.
	set := map[string]bool{}
	if old := c.cls.declined.Load(); old != nil {
		maps.Copy(set, *old)
	}
	for _, d := range ps.declined {
		set[d.resource] = true
	}
	c.cls.declined.Store(&set)
	if c.waiter != nil {
		c.waiter.Want(c.h.usable(c.cls))
	}
}

// declinedBy reports whether provider p declined the client's WebDriver
// create already.
func (cl *class) declinedBy(p *pool.ProviderState) bool {
	d := cl.declined.Load()
	return d != nil && (*d)[p.Resource()]
}

// noProviderStarts is the answer's message when none can.
func (c *connect) noProviderStarts() string {
	b := c.wd.req.Browser()
	if b == "" {
		b = "the browser asked for"
	}
	return "no WebDriver provider here starts " + b
}

// wsBase is where the client reaches the gateway's WebDriver sockets:
// ws(s)://<the Host it used><its base>.
func (c *connect) wsBase() string {
	scheme := "ws"
	if c.r.TLS != nil {
		scheme = "wss"
	}
	return scheme + "://" + c.r.Host + c.wd.base
}

// 6. Establish, for a WebDriver create: the session (its client's ticket)
// is registered, its route shared, and the client gets the provider's
// answer rewritten.
func (c *connect) establishWebDriver(m *member, ps *upstreams.WebDriverSession) passEnd {
	if caddy.Exiting() {
		ps.Remote.Release()
		c.finish(c.shuttingDown())
		return passAnswered
	}
	pathID := newPathID()
	answer, err := ps.Answer(pathID, c.wsBase())
	if err != nil {
		ps.Remote.Release()
		c.h.logger.Error("WebDriver create answer not usable", zap.String("provider", m.up.Name), zap.Error(err))
		c.finish(c.unavailable("bad create answer"))
		return passAnswered
	}
	c.served(m)
	s := c.newWebDriverSession(m, ps, pathID)
	c.learnt(m.up.Name)
	hd := c.w.Header()
	hd.Set("Content-Type", "application/json; charset=utf-8")
	hd.Set("Content-Length", strconv.Itoa(len(answer)))
	hd.Set(SessionHeader, c.id)
	hd.Set("Cache-Control", "no-cache")
	c.w.WriteHeader(http.StatusOK)
	c.w.Write(answer)
	s.run()
	return passEstablished
}

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
func (h *Gateway) webDriverTargetOf(r *http.Request, pathID string) (webDriverTarget, bool) {
	if !validPathID(pathID) {
		return webDriverTarget{}, false
	}
	if ls, ok := h.reg.Sessions.ByPath(pool.PathHash(pathID)); ok {
		s, ok := ls.Session.(*wdSession)
		if !ok || !h.reg.Handlers.Serves(ls.Bound.Handler, h) || !sameClient(ls.Bound.Keys, ls.Bound.Client, r, pool.ClientHash) {
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
	if !ok || rt.Session == "" || !slices.ContainsFunc(rt.Handlers, func(k string) bool { return h.reg.Handlers.Serves(k, h) }) ||
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

// clientKeys are the client key placeholders the handler's WebDriver
// sessions are bound to: client_limit's, then client_budget's when it is
// another; nil without either.
func (h *Gateway) clientKeys() []string {
	var keys []string
	if cl := h.ClientLimit; cl != nil {
		keys = append(keys, cl.Key)
	}
	if cb := h.ClientBudget; cb != nil && !slices.Contains(keys, cb.Key) {
		keys = append(keys, cb.Key)
	}
	return keys
}

// clientValues resolves keys with replace (nil: every value empty).
func clientValues(keys []string, replace func(string) string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		if replace != nil {
			out[i] = replace(k)
		}
	}
	return out
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

// memberByName is the handler's member called name, nil when none.
func (h *Gateway) memberByName(name string) *member {
	for _, m := range h.members {
		if m.up.Name == name {
			return m
		}
	}
	return nil
}

// active notes a command or a socket's activity for the session's idle
// timeout, here or (another node's) in the shared state.
func (h *Gateway) active(t webDriverTarget) {
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
func (h *Gateway) ended(t webDriverTarget, reason string, gone bool) {
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
func (h *Gateway) webDriverCommand(w http.ResponseWriter, r *http.Request, wr wdRequest) {
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
		t.local.command(r)
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

// End reasons of WebDriver sessions that are their own.
const (
	EndClientDelete = "client deleted the session"
	EndProviderGone = "provider ended the session"
	// EndElsewhere: another node served its end (the client's DELETE,
	// the provider's invalid session id).
	EndElsewhere = "ended through another node"
)

// serveWebDriverSocket relays the BiDi or CDP socket of a live WebDriver
// session; it reports false when the upgrade's path is not a session's
// socket (it then goes the chain's way). A session's socket that is not
// live, or not this client's, is an unknown session, as for commands.
func (h *Gateway) serveWebDriverSocket(w http.ResponseWriter, r *http.Request, wr wdRequest) bool {
	if wr.id == "" || (wr.rest != "" && wr.rest != "/se/cdp") {
		return false
	}
	if !h.origins.Allows(r.Header.Values("Origin")) {
		// Before the session is looked for: a web page learns nothing of
		// which IDs are live.
		h.obs.Rejected(http.StatusForbidden, observe.ReasonOrigin, 0)
		(&connect{h: h}).refuseOrigin().write(w, r)
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
	c := h.newConnect(w, r, hs)
	c.id = t.id
	if c.repl != nil {
		c.repl.Set(PlaceholderSessionID, t.id)
	}
	cdp := wr.rest == "/se/cdp"
	// Its header_up renders the session's options as its create's did
	// (another node's session: its options are not in the shared state,
	// and render as unset).
	var stated options.Set
	if t.local != nil {
		stated = t.local.opts
	}
	replace := withOptions(t.up, stated, c.replace)
	res := t.up.WebDriverSocket(r.Context(), hs, t.ps, cdp, replace)
	if res.Outcome.Kind != upstreams.Success {
		if res.Outcome.Kind == upstreams.Relay {
			res.Body = t.ps.Rewrite(res.Body, wr.id)
			c.relayedTo(t.provider, res).write(w, r)
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
	ho, err := c.handOver(up.Answer.RawWithHeaders(upstreams.HeaderField{Name: SessionHeader, Value: t.id}), fields)
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

// webDriverRouteTTL is how long a session's route stays in the shared
// state without activity: past its idle timeout, the owner has ended it.
func (h *Gateway) webDriverRouteTTL() time.Duration {
	return 2*h.webDriverIdle() + time.Minute
}

// webDriverIdle is the idle timeout of the handler's WebDriver sessions.
func (h *Gateway) webDriverIdle() time.Duration {
	if s := h.Session; s != nil && s.IdleTimeout > 0 {
		return time.Duration(s.IdleTimeout)
	}
	return defaultWebDriverIdle
}

// shareRoute puts a session's route rt in the shared state under key (its
// owner this node).
func (h *Gateway) shareRoute(key string, rt cluster.Route) bool {
	sh := h.shared
	if sh == nil || !sh.s.Usable() {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rt.Node = sh.s.Store().Node()
	if err := sh.s.Store().Routes().Put(ctx, key, rt, h.webDriverRouteTTL()); err != nil {
		sh.s.Failed("put route", err)
		return false
	}
	sh.s.Worked()
	return true
}

// webDriverAnswer writes a reply the chain gives a WebDriver create as a
// WebDriver error: session not created, with the reply's message and its
// Retry-After; a provider's own answer (relayed) goes as it is.
func webDriverAnswer(w http.ResponseWriter, r *http.Request, rp *reply) {
	if rp.reason == observe.ReasonRelayed {
		rp.write(w, r)
		return
	}
	rec := &recorder{header: http.Header{}}
	rp.write(rec, r)
	var b struct {
		Error    string    `json:"error"`
		Attempts []attempt `json:"attempts"`
	}
	json.Unmarshal(rec.body.Bytes(), &b)
	msg := b.Error
	if len(b.Attempts) > 0 {
		var tried []string
		for _, a := range b.Attempts {
			tried = append(tried, a.Provider+": "+a.Outcome)
		}
		msg += " (" + strings.Join(tried, ", ") + ")"
	}
	if ra := rec.header.Get("Retry-After"); ra != "" {
		w.Header().Set("Retry-After", ra)
	}
	code := "session not created"
	status := http.StatusInternalServerError
	switch rp.reason {
	case observe.ReasonOrigin:
		code, status = "unknown error", http.StatusForbidden
	case observe.ReasonBadOptions:
		code, status = "invalid argument", http.StatusBadRequest
	}
	writeWebDriverError(w, status, code, msg)
}

// recorder keeps what a reply writes.
type recorder struct {
	header http.Header
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *recorder) WriteHeader(int)             {}
