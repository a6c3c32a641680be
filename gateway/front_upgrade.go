package gateway

import (
	"context"
	"errors"
	"net/http"

	"github.com/browserfailover/caddy-browser-failover/options"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// The front of a WebSocket client: CDP (Puppeteer, Playwright's
// connectOverCDP, chromedp), WebDriver BiDi, or Playwright's own
// protocol. Its attempts are upgrades at the providers (after a session
// API's create, for providers that have one), its session a relayed
// socket (socket.go), and before any attempt it may be handed a warm
// session of its handler's (warm.go). A client that presents a resume
// token goes to the session it left instead (resume.go).

// upgrade is the front of one WebSocket client.
type upgrade struct {
	r *http.Request
}

// serveUpgrade checks an upgrade (400 or 426 without contacting anyone)
// and runs the chain for it, or takes back the session it resumes.
func (h *Gateway) serveUpgrade(w http.ResponseWriter, r *http.Request) {
	hs, err := upstreams.Check(r)
	if err != nil {
		var ce *upstreams.CheckError
		errors.As(err, &ce)
		writeJSON(w, ce.Status, map[string]string{"error": ce.Msg}, func(hd http.Header) {
			if ce.Status == http.StatusUpgradeRequired {
				hd.Set("Sec-WebSocket-Version", "13")
			}
		})
		return
	}
	c := h.newConnect(w, r, upgrade{r: r})
	c.hs = hs
	// What the client still holds when its way ends (a session took it
	// otherwise).
	defer func() { c.ticket.Release() }()
	if !c.check() {
		return
	}
	// A client taking back a session it left goes to that session's
	// browser, or nowhere (resume.go).
	presented, token := resumeRequest(r, hs)
	if presented != "" {
		resume{c}.take(presented)
		return
	}
	c.token = token
	c.run()
}

// protocol is what the client's handshake says it speaks.
func (f upgrade) protocol() (upstreams.Protocol, string) {
	return upstreams.ClientProtocol(f.r.Header, f.r.URL.Path)
}

// accepts: every provider of its protocol may serve it.
func (upgrade) accepts(*upstreams.Provider) bool { return true }

// noneAccepts is never asked: every provider accepts an upgrade.
func (upgrade) noneAccepts() string { return "" }

// options reads the client's bf_ query items and its options header; the
// query items are taken out of what pass_query passes on. A client whose
// session is to be recorded, or has a browser profile, offers the
// providers no extension (recording.go, profile_session.go).
func (f upgrade) options(c *connect) (options.Set, error) {
	s, rest, err := readOptions(c.hs.RawQuery, c.r.Header, nil)
	if err == nil {
		c.hs.RawQuery = rest
		if proto, _ := f.protocol(); c.h.mayRecord(s, proto) || s.Profile() != "" {
			// Its messages are to be read (or written) by the gateway.
			offerNoExtension(c.hs)
		}
	}
	return s, err
}

// hedged: an upgrade's attempts may run side by side.
func (upgrade) hedged() bool { return true }

// attempt is one upgrade at m.
func (upgrade) attempt(ctx context.Context, c *connect, m *member) upstreams.Result {
	return m.up.Connect(ctx, c.hs, c.replaceAt(m))
}

// establish relays the session the provider opened.
func (upgrade) establish(c *connect, m *member, res upstreams.Result) passEnd {
	return socket{c}.establish(m, res.Conn)
}

// answer writes the refusal as JSON (or the provider's own answer as it
// is), naming the session.
func (upgrade) answer(c *connect, rf *refusal) {
	c.w.Header().Set(SessionHeader, c.id)
	writeRefusal(c.w, c.r, rf)
}

// shortcut hands the client a warm session of its handler's (made for
// its handler's clients only) at the first provider in its order that has
// one, passing over those an attempt would skip anyway (drained, full,
// cooling down): the provider an attempt would go to first, when it has
// no warm session ready, gets the attempt.
func (upgrade) shortcut(c *connect, order []int) (passEnd, bool) {
	if !c.pool.warm {
		return 0, false
	}
	for _, i := range order {
		m := c.pool.all[i]
		contended := c.waiter == nil && c.h.reg.Waiting.Contended(m.state.Resource())
		if w, _ := m.warm.(*warmer); w != nil && !contended && w.serves(c, m) && !m.state.Draining() {
			if !mayChargeWarm(c) {
				return 0, false
			}
			// Its browser profile first: a client that cannot have it
			// is answered before it takes a warm session.
			if rf, ok := c.holdProfile(); !ok {
				if rf == nil {
					return passClientGone, true
				}
				c.finish(rf)
				return passAnswered, true
			}
			if ws := w.take(); ws != nil {
				if !chargeWarm(c, ws) {
					// Its budget was taken meanwhile: the attempts answer.
					w.mu.Lock()
					w.ending++
					w.mu.Unlock()
					ws.end(upstreams.CloseGoingAway, EndWarmUnpaid, w.ended)
					return 0, false
				}
				return establishWarm(c, m, ws), true
			}
		}
		if !m.state.Draining() && !m.state.Slots.Full() && m.state.Health.Until().IsZero() {
			return 0, false
		}
	}
	return 0, false
}

// mayChargeWarm reports whether the client's key has room in its
// client_budget for a session now (always, without one): a client that
// has none gets no warm session, its attempts answer it as they would.
func mayChargeWarm(c *connect) bool {
	book := c.ticket.ClientBook()
	if c.h.ClientBudget == nil || book == nil {
		return true
	}
	st := book.Read()
	return st.Spent+st.Accrued+st.Held < c.h.ClientBudget.Amount
}

// chargeWarm has the client's key pay for warm session ws as for a
// session made for it: the key's book counts the session's whole cost,
// since the warm session was made, checked against its client_budget in
// the same step; false when the budget has no room left.
func chargeWarm(c *connect, ws *warmSession) bool {
	book := c.ticket.ClientBook()
	if c.h.ClientBudget == nil || book == nil {
		return true
	}
	return ws.t.Meter().Join(book, c.h.ClientBudget.Amount) == nil
}

// establishWarm hands the client warm session ws at m: its 101 from the
// gateway (the provider's, accepting the client's own key), then the
// session as any other.
func establishWarm(c *connect, m *member, ws *warmSession) passEnd {
	c.add(attempt{Provider: m.up.Name, Outcome: WordWarm})
	c.tries++
	c.warm = ws.life
	if c.opts.ForProviders().Empty() {
		// The session has the options it was made with (and the client's
		// profile).
		c.opts = ws.w.opts.WithProfile(c.opts.Profile())
	}
	c.h.reg.Metrics().WarmHanded(m.up.Name)
	c.won(ws.t)
	up := ws.up
	a := up.Answer
	up.Answer = &upstreams.Answer{Status: a.Status, Header: a.Header,
		Raw: a.RawWithHeaders(upstreams.HeaderField{Name: "Sec-WebSocket-Accept", Value: upstreams.AcceptFor(c.hs.Key)})}
	return socket{c}.establish(m, up)
}
