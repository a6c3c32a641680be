package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/options"
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
func (h webDrivers) serveWebDriver(w http.ResponseWriter, r *http.Request, wr wdRequest) {
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
func (h webDrivers) webDriverStatus(w http.ResponseWriter) {
	ready := false
	for _, m := range h.current().members {
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

// create is the front of one WebDriver create (POST <base>/session): its
// attempts are create calls at webdriver providers that can start the
// browser it asks for, one after the other (hedging does not apply), and
// its session the provider's, whose commands come over HTTP
// (webdriver_session.go).
type create struct {
	req *upstreams.CreateRequest
	// base is the client's base path ("" for the root, "/wd/hub" …).
	base string
}

// webDriverCreate serves POST <base>/session through the chain: a body
// that is not a create request, or is over 1 MiB, is an invalid argument
// before any provider is asked.
func (h webDrivers) webDriverCreate(w http.ResponseWriter, r *http.Request, wr wdRequest) {
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
	c := h.newConnect(w, r, create{req: req, base: wr.base})
	defer func() { c.ticket.Release() }()
	if !c.check() {
		return
	}
	c.run()
}

// protocol: a WebDriver client.
func (create) protocol() (upstreams.Protocol, string) { return upstreams.ProtocolWebDriver, "" }

// accepts reports whether up can start the browser the create asks for.
func (f create) accepts(up *upstreams.Provider) bool { return up.Accepts(f.req) }

// noneAccepts names the browser no provider here starts.
func (f create) noneAccepts() string {
	b := f.req.Browser()
	if b == "" {
		b = "the browser asked for"
	}
	return "no WebDriver provider here starts " + b
}

// options reads the client's bf_ query items, its options header and its
// bf:options capability.
func (f create) options(c *connect) (options.Set, error) {
	s, _, err := readOptions(c.r.URL.RawQuery, c.r.Header, f.req.Extension(options.Capability))
	return s, err
}

// hedged: a create is never hedged (a loser's browser would be started
// for nothing).
func (create) hedged() bool { return false }

// shortcut: nothing is made ahead for a create.
func (create) shortcut(*connect, []int) (passEnd, bool) { return 0, false }

// attempt is one create call at m.
func (f create) attempt(ctx context.Context, c *connect, m *member) upstreams.Result {
	return m.up.CreateWebDriver(ctx, f.req, c.replaceAt(m))
}

// establish registers the session the provider created (its client's
// ticket its own, its route shared), and answers the client with the
// provider's answer rewritten: its path ID, socket URLs on the gateway's
// host, nothing of the provider.
func (f create) establish(c *connect, m *member, res upstreams.Result) passEnd {
	ps := res.WebDriver
	if caddy.Exiting() {
		ps.Remote.Release()
		c.finish(c.shuttingDown())
		return passAnswered
	}
	pathID := newPathID()
	answer, err := ps.Answer(pathID, f.wsBase(c.r))
	if err != nil {
		ps.Remote.Release()
		c.h.logger.Error("WebDriver create answer not usable", zap.String("provider", m.up.Name), zap.Error(err))
		c.finish(c.unavailable("bad create answer"))
		return passAnswered
	}
	c.served(m)
	s := c.newWebDriverSession(m, ps, pathID, f.req.Browser())
	c.learnt(m.up.Name)
	hd := c.w.Header()
	hd.Set("Content-Type", "application/json; charset=utf-8")
	hd.Set("Content-Length", strconv.Itoa(len(answer)))
	hd.Set(SessionHeader, c.id)
	hd.Set("Cache-Control", "no-cache")
	c.w.WriteHeader(http.StatusOK)
	c.w.Write(answer)
	s.life.Run()
	return passEstablished
}

// wsBase is where the client reaches the gateway's WebDriver sockets:
// ws(s)://<the Host it used><its base>.
func (f create) wsBase(r *http.Request) string {
	scheme := "ws"
	if r.TLS != nil {
		scheme = "wss"
	}
	return scheme + "://" + r.Host + f.base
}

// answer writes the refusal as a WebDriver error: session not created,
// with the refusal's message, the providers tried and its Retry-After; a
// foreign Origin 403 (unknown error), bad options 400 (invalid
// argument); a provider's own answer goes as it is.
func (create) answer(c *connect, rf *refusal) {
	w := c.w
	w.Header().Set(SessionHeader, c.id)
	if rf.relayed != nil {
		writeRelayed(w, c.r, rf.relayed)
		return
	}
	msg := rf.msg
	if len(rf.attempts) > 0 {
		tried := make([]string, len(rf.attempts))
		for i, a := range rf.attempts {
			tried[i] = a.Provider + ": " + a.Outcome
		}
		msg += " (" + strings.Join(tried, ", ") + ")"
	}
	if rf.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(rf.retryAfter))
	}
	code, status := upstreams.ErrCodeSessionNotCreated, http.StatusInternalServerError
	switch rf.reason {
	case observe.ReasonOrigin:
		code, status = upstreams.ErrCodeUnknownError, http.StatusForbidden
	case observe.ReasonBadOptions:
		code, status = upstreams.ErrCodeInvalidArgument, http.StatusBadRequest
	}
	writeWebDriverError(w, status, code, msg)
}
