package gateway

import (
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/config"
	"github.com/browserfailover/caddy-browser-failover/options"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/sessions"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Warm sessions: with `warm <n>` a provider of a handler keeps up to n
// sessions opened ahead of demand (the upgrade made, for a session API
// provider the session created first, the provider's 101 read), for that
// handler's clients: two handlers with the same provider keep a set each.
// A client of the handler that can use one — it speaks what the provider
// serves (CDP, or BiDi for a bidi provider), states no session option or
// those the sessions were made with, brings no subprotocol and, under
// pass_query, no query — is handed one at once: the gateway answers its
// upgrade itself, and every byte after that is relayed as for any
// session. The warmer refills in the background.
//
// A warm session is made with the provider settings of its handler,
// resolved when its config loaded, and handed out only while those
// settings still resolve to the same values: a secret read from the
// environment or a file that changed since ({env.*}, {file.*}) closes
// the warm sessions made with the old value before any client gets one,
// and no new one is made until a reload builds the provider with the new
// value. What is compared is a keyed hash of the settings, never the
// values.
//
// A warm-up is a client of its own front (front_warm.go), with no client
// behind it: it walks the chain's admission step (not drained, no waiter
// first, not full, its budget able to pay for a session of
// expected_duration, a health permit, a slot, the cluster-wide lease) and
// its attempt is settled like any other, so a failed warm-up cools the
// provider down and warm sessions count wherever live ones do. Its
// ticket's meter runs from the warm-up: a warm session is billed whether
// or not a client takes it. A warm session has the lifecycle of every
// session (package sessions) from its warm-up: warm_max_age is its time
// limit while it waits, and the client it is handed to takes it over
// (Handover). A provider that closes an idle warm session gets its close
// frame answered, and the session is replaced.

// defaultWarmMaxAge is how long a warm session waits for a client.
const defaultWarmMaxAge = 5 * time.Minute

// warmRefill is how often a warmer looks at its count besides when told.
const warmRefill = time.Second

// maxWarmLeftover bounds what a provider may send on a warm session
// before a client takes it; more ends the session.
const maxWarmLeftover = 64 << 10

// Close reasons of warm sessions no client took: older than warm_max_age,
// their provider draining, taken by a client whose client_budget was
// spent meanwhile, or made with provider settings that are no longer
// their handler's.
const (
	EndWarmAge     = "warm session aged"
	EndWarmDrained = "provider drained"
	EndWarmUnpaid  = "client budget reached"
	EndWarmStale   = "provider settings changed"
)

// warmer keeps one handler's warm sessions of one provider. It lives in
// the registry under the handler's key and the provider's name, so a
// reload that keeps the handler's configuration keeps it; the newest
// handler with that key owns it, and hands its sessions to its own
// clients only.
type warmer struct {
	key pool.WarmKey
	// makeOne makes one warm session at m, as h's, whose provider's
	// settings print as fp (front_warm.go's warm-up).
	makeOne func(h *Gateway, m *member, fp string)
	reg     *pool.Registry
	st      *pool.ProviderState
	// set is what the warm sessions are made with, as configured; opts
	// are the session options among it.
	set  warmSettings
	opts options.Set
	kick chan struct{}
	done chan struct{}

	mu   sync.Mutex
	h    *Gateway // the owner
	m    *member
	prev *Gateway // the owner before the last adoption (nil: none)
	// print is the print of the settings the owner's provider was built
	// with (resolved when its config loaded), prevPrint the one before
	// the last adoption: warm-ups send those settings, and are made only
	// while they are still what the settings resolve to.
	print, prevPrint string
	target           int
	maxAge           time.Duration
	ready            []*warmSession
	making           int
	// ending are warm sessions being closed: their slots are still held,
	// so they are not replaced before they are gone.
	ending int
	closed bool
	// paused: the settings resolve to other values than the owner's
	// provider was built with (a secret changed without a reload); no
	// warm-up is made until a reload.
	paused bool
}

// warmSession is one warm session: its provider connection, the ticket
// it holds and the print of the settings it was made with.
type warmSession struct {
	w  *warmer
	up *upstreams.Conn
	t  *pool.Ticket
	// life is its lifecycle, from its warm-up: warm_max_age its time
	// limit until a client takes it over.
	life  *sessions.Session
	made  time.Time
	print string
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

// warmSettings are the provider settings a handler's warm sessions of one
// provider are made with, as configured: what the provider is sent (its
// configuration but for what only chooses among providers: URL, headers,
// header_up, session API, capabilities, TLS) and the session options they
// are made with, and the {env.*} and {file.*} placeholders among them,
// resolved each time a print is taken.
type warmSettings struct {
	conf  []byte
	names []string
}

// newWarmSettings reads the warm sessions' settings of provider pc.
func newWarmSettings(pc *config.ProviderConfig) warmSettings {
	c := pc.Config
	c.Priority, c.Weight, c.ConnectTimeout = nil, 0, 0
	c.Region, c.Supports = nil, nil
	if len(pc.WarmOptions) == 0 {
		// Nothing of the options is rendered then.
		c.OptionMap = nil
	}
	b, _ := json.Marshal(c)
	var tree any
	_ = json.Unmarshal(b, &tree)
	opts, _ := pc.WarmSet()
	s := warmSettings{conf: append(append(b, 0), opts.Query()...)}
	s.names = secretPlaceholders(tree, nil)
	return s
}

// secretPlaceholders appends the {env.*} and {file.*} placeholders in the
// strings of v (a decoded JSON value) to names, each once.
func secretPlaceholders(v any, names []string) []string {
	switch v := v.(type) {
	case string:
		for rest := v; ; {
			i := strings.IndexByte(rest, '{')
			if i < 0 {
				break
			}
			j := strings.IndexByte(rest[i:], '}')
			if j < 0 {
				break
			}
			name := rest[i+1 : i+j]
			if (strings.HasPrefix(name, "env.") || strings.HasPrefix(name, "file.")) && (i == 0 || rest[i-1] != '\\') && !slices.Contains(names, name) {
				names = append(names, name)
			}
			rest = rest[i+j+1:]
		}
	case []any:
		for _, e := range v {
			names = secretPlaceholders(e, names)
		}
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			names = secretPlaceholders(k, names)
			names = secretPlaceholders(v[k], names)
		}
	}
	return names
}

// print is the settings' print with their placeholders resolved now: a
// keyed hash (pool.Warmers.Print), so no resolved value is kept.
func (s *warmSettings) print(reg *pool.Registry) string {
	b := slices.Clip(s.conf)
	if len(s.names) > 0 {
		repl := caddy.NewReplacer()
		for _, n := range s.names {
			v, _ := repl.GetString(n)
			b = append(append(b, 0), n...)
			b = strconv.AppendInt(append(b, 0), int64(len(v)), 10)
			b = append(append(b, 0), v...)
		}
	}
	return reg.Warmers.Print(b)
}

// adopt makes h the owner, its provider's settings printing as fp;
// warm sessions made with other settings are closed at once. It reports
// false when the warmer is closed.
func (w *warmer) adopt(h *Gateway, m *member, fp string, target int, maxAge time.Duration) bool {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return false
	}
	w.prev, w.h, w.m, w.target, w.maxAge = w.h, h, m, target, maxAge
	w.prevPrint, w.print = w.print, fp
	w.paused = false
	stale := w.staleLocked(fp)
	w.publish()
	w.mu.Unlock()
	w.endStale(stale)
	w.poke()
	return true
}

// staleLocked takes out of the ready ones those made with settings that
// do not print as now; the caller ends them (endStale). w.mu held.
func (w *warmer) staleLocked(now string) []*warmSession {
	var stale []*warmSession
	kept := w.ready[:0]
	for _, ws := range w.ready {
		if ws.print == now {
			kept = append(kept, ws)
		} else {
			stale = append(stale, ws)
		}
	}
	clear(w.ready[len(kept):])
	w.ready = kept
	w.ending += len(stale)
	return stale
}

// endStale closes and releases warm sessions staleLocked took out.
func (w *warmer) endStale(stale []*warmSession) {
	for _, ws := range stale {
		ws.end(upstreams.CloseNormal, EndWarmStale, w.ended)
	}
}

// cleanupWarm gives up h's warmers: one a newer handler owns goes on; one
// h owns goes back to the handler it took it from while that one still
// runs (a config load that failed), and is closed otherwise.
func (h *Gateway) cleanupWarm() {
	for _, m := range h.current().members {
		w, _ := m.warm.(*warmer)
		if w == nil {
			continue
		}
		w.mu.Lock()
		mine := w.h == h
		back := mine && w.prev != nil && !w.prev.cleaned.Load() && !caddy.Exiting()
		if back {
			w.h, w.prev = w.prev, nil
			w.print = w.prevPrint
			if pm := w.h.current().named(w.st.Name()); pm != nil {
				w.m = pm
			}
		}
		w.mu.Unlock()
		if mine && !back {
			h.reg.Warmers.Drop(w.key, w)
			w.Close()
		}
	}
}

// stopWarm closes the handler's warmer of m, if it owns one: m takes no
// new session (a found provider leaving).
func (h *Gateway) stopWarm(m *member) {
	w, _ := m.warm.(*warmer)
	if w == nil {
		return
	}
	w.mu.Lock()
	mine := w.h == h
	w.mu.Unlock()
	if mine {
		h.reg.Warmers.Drop(w.key, w)
		w.Close()
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
	w.st.SetWarm(w.key.Handler, 0, 0)
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

// fill closes the warm sessions made with settings that no longer
// resolve as they did, and starts the warm-ups the target still wants:
// none while the owner's provider was built with settings that no longer
// resolve as now (they would be made with old values), and none for a
// draining provider or an exiting process, which keep none.
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
	now := w.set.print(w.reg)
	w.mu.Lock()
	stale := w.staleLocked(now)
	w.publish()
	paused := now != w.print
	if paused && !w.paused {
		w.h.logger.Warn("warm sessions paused: the provider's settings resolve to other values than when the config was loaded (a changed {env.*} or {file.*}); reload the config to warm it again",
			zap.String("provider", w.key.Provider))
	}
	w.paused = paused
	need := w.target - len(w.ready) - w.making - w.ending
	if w.closed || paused || need <= 0 {
		w.mu.Unlock()
		w.endStale(stale)
		return
	}
	w.making += need
	h, m, fp := w.h, w.m, w.print
	w.mu.Unlock()
	w.endStale(stale)
	for range need {
		go w.makeOne(h, m, fp)
	}
}

// publish puts the counts where status and metrics read them (w.mu
// held); a closed warmer has none.
func (w *warmer) publish() {
	if !w.closed {
		w.st.SetWarm(w.key.Handler, len(w.ready), w.target)
	}
}

// add takes in the warm session ws a warm-up made for w (ws.w is w): ready
// for a client, watched, and its lifecycle running. One not wanted
// any more (the warmer closed or full, or made with the settings of an
// owner before a reload that changed them) is closed at once.
func (w *warmer) add(ws *warmSession, m *member) {
	w.mu.Lock()
	if w.closed || len(w.ready) >= w.target || ws.print != w.print {
		w.mu.Unlock()
		ws.end(upstreams.CloseGoingAway, upstreams.EndShutdown, nil)
		return
	}
	ws.watched = make(chan watchResult, 1)
	go ws.watch()
	w.ready = append(w.ready, ws)
	w.publish()
	w.mu.Unlock()
	// Its time limit counts from here: one that ran out before it was
	// ready would find nothing to drop.
	ws.life.Run()
	// A client waiting for the provider may take it now.
	m.state.Notify()
}

// warmBody is a warm session waiting for a client, as its lifecycle sees
// it: no activity (it has no idle timeout), and its time limit
// (warm_max_age) drops it.
type warmBody struct{ ws *warmSession }

func (b warmBody) Activity() (int64, bool) { return 0, false }
func (b warmBody) BytesUp() int64          { return 0 }
func (b warmBody) BytesDown() int64        { return 0 }

// Close drops the warm session when it is still waiting (its age reached
// warm_max_age: a reason of its own).
func (b warmBody) Close(code int, reason string) {
	if reason == upstreams.EndMaxDuration {
		code, reason = upstreams.CloseNormal, EndWarmAge
	}
	b.ws.w.drop(b.ws, code, reason)
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
	go func() {
		if answered {
			ws.up.Close()
		} else {
			ws.up.CloseWith(code, reason)
		}
		ws.life.Ended(reason)
		if done != nil {
			done()
		}
	}()
}

// take hands out the oldest warm session whose connection is still good
// and which was made with the settings of its handler's provider as they
// resolve now (nil: none), and asks for a new one. Those made with other
// values (a secret changed since) are closed first: no client gets one.
func (w *warmer) take() *warmSession {
	w.mu.Lock()
	n := len(w.ready)
	w.mu.Unlock()
	if n == 0 {
		return nil
	}
	now := w.set.print(w.reg)
	w.mu.Lock()
	stale := w.staleLocked(now)
	w.publish()
	w.mu.Unlock()
	w.endStale(stale)
	for {
		w.mu.Lock()
		if len(w.ready) == 0 {
			w.mu.Unlock()
			w.poke()
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
	// The client's profile is the gateway's, not the session's: a warm
	// session takes it on (profile_session.go).
	opts := c.opts.ForProviders()
	if c.resuming || !(opts.Empty() || opts.Equal(w.opts)) || c.hs.Header.Get("Sec-Websocket-Protocol") != "" {
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

// WordWarm is the attempt word of a client handed a warm session.
const WordWarm = "warm"
