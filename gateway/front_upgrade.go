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
		c.resume(presented)
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
// query items are taken out of what pass_query passes on.
func (upgrade) options(c *connect) (options.Set, error) {
	s, rest, err := readOptions(c.hs.RawQuery, c.r.Header, nil)
	if err == nil {
		c.hs.RawQuery = rest
	}
	return s, err
}

// hedged: an upgrade's attempts may run side by side.
func (upgrade) hedged() bool { return true }

// shortcut hands the client a warm session, when one may go to it.
func (upgrade) shortcut(c *connect, order []int) (passEnd, bool) {
	return c.tryWarm(order)
}

// attempt is one upgrade at m.
func (upgrade) attempt(ctx context.Context, c *connect, m *member) upstreams.Result {
	return m.up.Connect(ctx, c.hs, c.replaceAt(m))
}

// establish relays the session the provider opened.
func (upgrade) establish(c *connect, m *member, res upstreams.Result) passEnd {
	return c.establishSocket(m, res.Conn)
}

// answer writes the refusal as JSON (or the provider's own answer as it
// is), naming the session.
func (upgrade) answer(c *connect, rf *refusal) {
	c.w.Header().Set(SessionHeader, c.id)
	writeRefusal(c.w, c.r, rf)
}
