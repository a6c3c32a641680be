package browserfailover

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/options"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Warm sessions: with `warm <n>` a provider keeps up to n sessions opened
// ahead of demand (the upgrade made, for a session API provider the
// session created first, the provider's 101 read). A client that can use
// one — it speaks what the provider serves (CDP, or BiDi for a bidi
// provider), states no session option, brings no subprotocol and, under
// pass_query, no query — is handed one at once: the gateway answers its
// upgrade itself, and every byte after that is relayed as for any
// session. The warmer refills in the background.
//
// A warm-up is a connect without a client: it walks the chain's own
// admission step (not drained, no waiter first, not full, its budget able
// to pay, a health permit, a slot, the cluster-wide lease) and its attempt
// is settled like any other, so a failed warm-up cools the provider down
// and warm sessions count wherever live ones do. Its ticket's meter runs
// from the warm-up: a warm session is billed whether or not a client
// takes it.

// defaultWarmMaxAge is how long a warm session waits for a client.
const defaultWarmMaxAge = 5 * time.Minute

// warmRefill is how often a warmer looks at its count besides when told.
const warmRefill = time.Second

// maxWarmLeftover bounds what a provider may send on a warm session
// before a client takes it; more ends the session.
const maxWarmLeftover = 64 << 10

// Close reasons of warm sessions no client took: older than warm_max_age,
// their provider draining, or taken by a client whose client_budget
// was spent meanwhile.
const (
	EndWarmAge     = "warm session aged"
	EndWarmDrained = "provider drained"
	EndWarmUnpaid  = "client budget reached"
)

// warmer keeps one provider's warm sessions. It lives in the registry's
// entry of the provider, so a reload that keeps the provider keeps it; the
// newest handler that uses the provider owns it.
type warmer struct {
	st *pool.Provider
	// fp is what the warm sessions were made with (the provider's
	// settings): a reload that changes it replaces them.
	fp string
	// opts are the session options the warm sessions are made with.
	opts options.Set
	kick chan struct{}
	done chan struct{}

	mu     sync.Mutex
	h      *Handler // the owner
	m      *member
	prev   *Handler // the owner before the last adoption (nil: none)
	target int
	maxAge time.Duration
	ready  []*warmSession
	making int
	// ending are warm sessions being closed: their slots are still held,
	// so they are not replaced before they are gone.
	ending int
	closed bool
}

// warmSession is one warm session: its provider connection and the
// ticket it holds.
type warmSession struct {
	w    *warmer
	up   *upstreams.Conn
	t    *pool.Ticket
	made time.Time
	age  *time.Timer
	// watched ends when the watch stops: alive tells whether the
	// connection is still good, extra what the provider sent meanwhile.
	watched chan watchResult

	mu    sync.Mutex
	taken bool
	// answered: the provider closed the session and the watch answered
	// its close frame; what is left is to close the connection.
	answered bool
}

type watchResult struct {
	alive bool
	extra []byte
}

// provisionWarm starts, or takes over from the config before, the warmer
// of each provider with warm.
func (h *Handler) provisionWarm() {
	for i, pc := range h.Providers {
		m := h.members[i]
		old, _ := m.state.Warmer().(*warmer)
		if pc.Warm <= 0 {
			if old != nil && m.state.SetWarmer(nil) == old {
				old.Close()
			}
			continue
		}
		maxAge := time.Duration(pc.WarmMaxAge)
		if maxAge <= 0 {
			maxAge = defaultWarmMaxAge
		}
		fp := warmPrint(m, pc)
		if old != nil && old.fp == fp && old.adopt(h, m, pc.Warm, maxAge) {
			h.warmers = append(h.warmers, old)
			continue
		}
		opts, _ := pc.warmOptions() // checked with the config
		w := &warmer{st: m.state, fp: fp, opts: opts, kick: make(chan struct{}, 1), done: make(chan struct{}),
			h: h, m: m, target: pc.Warm, maxAge: maxAge}
		if prev := m.state.SetWarmer(w); prev != nil {
			prev.Close()
		}
		h.warmers = append(h.warmers, w)
		m.state.SetWarm(0, pc.Warm)
		go w.run()
	}
}

// warmPrint is what a provider's warm sessions depend on: its resolved
// URL, the settings of its connection (not those that only choose among
// providers) and the options they are made with.
func warmPrint(m *member, pc *ProviderConfig) string {
	c := pc.Config
	c.Priority, c.Weight, c.ConnectTimeout = nil, 0, 0
	c.Region, c.Supports = nil, nil
	if len(pc.WarmOptions) == 0 {
		// Nothing of the options is rendered then.
		c.OptionMap = nil
	}
	b, _ := json.Marshal(c)
	opts, _ := pc.warmOptions()
	return m.up.Key() + "\x00" + string(b) + "\x00" + opts.Query()
}

// adopt makes h the owner; false when the warmer is closed.
func (w *warmer) adopt(h *Handler, m *member, target int, maxAge time.Duration) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	w.prev, w.h, w.m, w.target, w.maxAge = w.h, h, m, target, maxAge
	w.publish()
	w.poke()
	return true
}

// cleanupWarm gives up h's warmers: one a newer handler owns goes on; one
// h owns goes back to the handler it took it from while that one still
// runs (a config load that failed), and is closed otherwise.
func (h *Handler) cleanupWarm() {
	for _, w := range h.warmers {
		w.mu.Lock()
		mine := w.h == h
		back := mine && w.prev != nil && !w.prev.cleaned.Load() && !caddy.Exiting()
		if back {
			w.h, w.prev = w.prev, nil
			for _, m := range w.h.members {
				if m.state == w.st {
					w.m = m
				}
			}
		}
		w.mu.Unlock()
		if mine && !back {
			if w.st.Warmer() == pool.Warmer(w) {
				w.st.SetWarmer(nil)
			}
			w.Close()
		}
	}
}

// Close ends every warm session and stops the warmer (pool.Warmer).
func (w *warmer) Close() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	ready := w.ready
	w.ready = nil
	w.mu.Unlock()
	close(w.done)
	// Waited for: at exit, their provider sessions must be released
	// before the process waits for the releases in flight.
	var wg sync.WaitGroup
	for _, ws := range ready {
		wg.Add(1)
		ws.end(upstreams.CloseGoingAway, upstreams.EndShutdown, wg.Done)
	}
	wg.Wait()
	w.st.SetWarm(0, 0)
}

// run refills the warm sessions when told, and every warmRefill.
func (w *warmer) run() {
	t := time.NewTicker(warmRefill)
	defer t.Stop()
	for {
		w.fill()
		select {
		case <-w.done:
			return
		case <-w.kick:
		case <-t.C:
		}
	}
}

// poke asks the warmer to look at its count.
func (w *warmer) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// fill starts the warm-ups the target still wants; a draining provider,
// or an exiting process, keeps none.
func (w *warmer) fill() {
	if caddy.Exiting() || w.st.Draining() {
		w.mu.Lock()
		ready := w.ready
		w.ready = nil
		w.publish()
		w.mu.Unlock()
		for _, ws := range ready {
			ws.end(upstreams.CloseGoingAway, EndWarmDrained, nil)
		}
		return
	}
	w.mu.Lock()
	need := w.target - len(w.ready) - w.making - w.ending
	if w.closed || need <= 0 {
		w.mu.Unlock()
		return
	}
	w.making += need
	h, m := w.h, w.m
	w.mu.Unlock()
	for range need {
		go w.warmUp(h, m)
	}
}

// publish puts the counts where status and metrics read them (w.mu
// held).
func (w *warmer) publish() { w.st.SetWarm(len(w.ready), w.target) }

// warmUp makes one warm session at m through the chain's admission and
// attempt, as h's.
func (w *warmer) warmUp(h *Handler, m *member) {
	ws := h.warmUp(m, w.opts)
	w.mu.Lock()
	w.making--
	if ws == nil {
		w.mu.Unlock()
		return
	}
	if w.closed || len(w.ready) >= w.target {
		w.mu.Unlock()
		ws.end(upstreams.CloseGoingAway, upstreams.EndShutdown, nil)
		return
	}
	ws.w, ws.watched = w, make(chan watchResult, 1)
	ws.age = time.AfterFunc(w.maxAge, func() { w.drop(ws, upstreams.CloseNormal, EndWarmAge) })
	go ws.watch()
	w.ready = append(w.ready, ws)
	w.publish()
	w.mu.Unlock()
	// A client waiting for the provider may take it now.
	m.state.Notify()
}

// warmUp is one warm-up at m: a connect without a client, with session
// options opts, which the provider's budget must be able to pay for in
// full.
func (h *Handler) warmUp(m *member, opts options.Set) *warmSession {
	if caddy.Exiting() {
		return nil
	}
	r, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "/", nil)
	repl := caddy.NewReplacer()
	c := &connect{h: h, r: r, start: time.Now(), ticket: h.reg.NewTicket(),
		// No request: its placeholders render empty.
		replace: func(s string) string { return repl.ReplaceAll(s, "") },
		hs:      &upstreams.Handshake{Key: upstreams.NewKey(), Header: http.Header{}}, opts: opts,
		ahead: m.expectedCost}
	defer c.ticket.Release()
	t, ok := c.admit(&passState{}, m)
	if !ok {
		return nil
	}
	res := m.up.Connect(r.Context(), c.hs, c.replaceAt(m))
	c.record(m, res.Outcome)
	if h.conclude(nil, m, t, res, false) != verdictSuccess {
		if res.Conn != nil {
			res.Conn.Close()
		}
		t.Release()
		if ce := h.logger.Check(zap.DebugLevel, "warm-up failed"); ce != nil {
			ce.Write(zap.String("provider", m.up.Name), zap.String("outcome", res.Outcome.Word))
		}
		return nil
	}
	t.Warm()
	return &warmSession{up: res.Conn, t: t, made: time.Now()}
}

// watch reads the idle connection, so that a provider that closes it is
// seen at once: its close frame is answered as a client would answer it,
// and the session replaced. It stops when a client takes the session (its
// read deadline set in the past), keeping what it read.
func (ws *warmSession) watch() {
	var extra []byte
	var idle upstreams.IdleWatch
	buf := make([]byte, 4096)
	for {
		n, err := ws.up.Conn.Read(buf)
		extra = append(extra, buf[:n]...)
		if idle.Closed(buf[:n]) {
			// Answered under the lock, so that an end meanwhile (a
			// shutdown's) knows the handshake is over and sends no
			// close of its own.
			ws.mu.Lock()
			mine := !ws.taken
			ws.taken = true
			if mine {
				ws.answered = idle.AnswerClose(ws.up) == nil
			}
			ws.mu.Unlock()
			// Never a client's: a client taking it now is told it is
			// gone, and its session is ended with a close frame.
			ws.watched <- watchResult{}
			if mine {
				ws.w.drop(ws, upstreams.CloseGoingAway, upstreams.EndProviderClosed)
			}
			return
		}
		if err != nil {
			ws.mu.Lock()
			taken := ws.taken
			ws.mu.Unlock()
			alive := taken && errors.Is(err, os.ErrDeadlineExceeded)
			ws.watched <- watchResult{alive: alive, extra: extra}
			if !taken {
				// The provider closed it (or broke it): replaced.
				ws.w.drop(ws, upstreams.CloseGoingAway, upstreams.EndProviderClosed)
			}
			return
		}
		if len(extra) > maxWarmLeftover {
			ws.watched <- watchResult{}
			ws.w.drop(ws, upstreams.CloseGoingAway, upstreams.EndProviderClosed)
			return
		}
	}
}

// drop takes ws out of the ready ones, if it is still there, and ends it;
// the warmer refills.
func (w *warmer) drop(ws *warmSession, code int, reason string) {
	w.mu.Lock()
	found := false
	for i, x := range w.ready {
		if x == ws {
			w.ready = append(w.ready[:i], w.ready[i+1:]...)
			found = true
			break
		}
	}
	if found {
		w.ending++
	}
	w.publish()
	w.mu.Unlock()
	if found {
		ws.end(code, reason, w.ended)
	}
}

// ended counts a dropped warm session gone, and refills.
func (w *warmer) ended() {
	w.mu.Lock()
	w.ending--
	w.mu.Unlock()
	w.poke()
}

// end closes a warm session no client took and gives back its ticket
// (its cost counted, its provider session released), in the background;
// done (if set) is called after. One whose close the watch answered is
// only closed: the close handshake is over.
func (ws *warmSession) end(code int, reason string, done func()) {
	ws.mu.Lock()
	ws.taken = true // the watch, if any, stops for good
	answered := ws.answered
	ws.mu.Unlock()
	if ws.age != nil {
		ws.age.Stop()
	}
	go func() {
		if answered {
			ws.up.Close()
		} else {
			ws.up.CloseWith(code, reason)
		}
		ws.t.Release()
		if done != nil {
			done()
		}
	}()
}

// take hands out the oldest warm session whose connection is still good
// (nil: none), and asks for a new one.
func (w *warmer) take() *warmSession {
	for {
		w.mu.Lock()
		if len(w.ready) == 0 {
			w.mu.Unlock()
			return nil
		}
		ws := w.ready[0]
		w.ready = w.ready[1:]
		w.publish()
		w.mu.Unlock()
		w.poke()
		if ws.claim() {
			return ws
		}
		w.mu.Lock()
		w.ending++
		w.mu.Unlock()
		ws.end(upstreams.CloseGoingAway, upstreams.EndProviderClosed, w.ended)
	}
}

// claim stops the watch and reports whether the connection is still
// good; what the provider sent meanwhile goes to the client first.
func (ws *warmSession) claim() bool {
	ws.mu.Lock()
	if ws.taken {
		ws.mu.Unlock()
		return false
	}
	ws.taken = true
	ws.mu.Unlock()
	ws.age.Stop()
	ws.up.Conn.SetReadDeadline(time.Unix(1, 0))
	r := <-ws.watched
	if !r.alive {
		return false
	}
	ws.up.Conn.SetReadDeadline(time.Time{})
	ws.up.Leftover = append(ws.up.Leftover, r.extra...)
	return true
}

// serves reports whether a warm session of w's provider may go to c.
func (w *warmer) serves(c *connect, m *member) bool {
	if c.wd != nil || c.resuming || c.hs == nil || !(c.opts.Empty() || c.opts.Equal(w.opts)) || c.hs.Header.Get("Sec-Websocket-Protocol") != "" {
		return false
	}
	if m.up.PassesQuery() && c.hs.RawQuery != "" {
		return false
	}
	switch m.up.Protocol() {
	case upstreams.ProtocolCDP, upstreams.ProtocolAny:
		return c.cls.proto == upstreams.ProtocolCDP
	case upstreams.ProtocolBiDi:
		return c.cls.proto == upstreams.ProtocolBiDi
	}
	return false
}

// tryWarm hands the client a warm session of the first provider in its
// order that has one, passing over those an attempt would skip anyway
// (drained, full, cooling down): the provider an attempt would go to
// first, when it has no warm session ready, gets the attempt.
func (c *connect) tryWarm(order []int) (passEnd, bool) {
	if len(c.h.warmers) == 0 {
		return 0, false
	}
	for _, i := range order {
		m := c.h.members[i]
		contended := c.waiter == nil && c.h.reg.Waiting.Contended(m.state.Resource())
		if w, _ := m.state.Warmer().(*warmer); w != nil && !contended && w.serves(c, m) && !m.state.Draining() {
			if !c.mayChargeWarm() {
				return 0, false
			}
			if ws := w.take(); ws != nil {
				if !c.chargeWarm(ws) {
					// Its budget was taken meanwhile: the attempts answer.
					w.mu.Lock()
					w.ending++
					w.mu.Unlock()
					ws.end(upstreams.CloseGoingAway, EndWarmUnpaid, w.ended)
					return 0, false
				}
				return c.establishWarm(m, ws), true
			}
		}
		if !m.state.Draining() && !m.state.Full() && m.state.Health.Until().IsZero() {
			return 0, false
		}
	}
	return 0, false
}

// mayChargeWarm reports whether the client's key has room in its
// client_budget for a session now (always, without one): a client that
// has none gets no warm session, its attempts answer it as they would.
func (c *connect) mayChargeWarm() bool {
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
func (c *connect) chargeWarm(ws *warmSession) bool {
	book := c.ticket.ClientBook()
	if c.h.ClientBudget == nil || book == nil {
		return true
	}
	return ws.t.Meter().Join(book, c.h.ClientBudget.Amount) == nil
}

// establishWarm hands the client warm session ws at m: its 101 from the
// gateway (the provider's, accepting the client's own key), then the
// session as any other.
func (c *connect) establishWarm(m *member, ws *warmSession) passEnd {
	c.add(attempt{Provider: m.up.Name, Outcome: WordWarm})
	c.tries++
	c.warm = true
	if c.opts.Empty() {
		// The session has the options it was made with.
		c.opts = ws.w.opts
	}
	c.h.reg.Metrics().WarmHanded(m.up.Name)
	c.won(ws.t)
	up := ws.up
	a := up.Answer
	up.Answer = &upstreams.Answer{Status: a.Status, Header: a.Header,
		Raw: a.RawWithHeaders(upstreams.HeaderField{Name: "Sec-WebSocket-Accept", Value: upstreams.AcceptFor(c.hs.Key)})}
	return c.establish(m, up)
}

// WordWarm is the attempt word of a client handed a warm session.
const WordWarm = "warm"
