package gateway

import (
	"encoding/json"
	"errors"
	"math"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/options"
	"github.com/browserfailover/caddy-browser-failover/spend"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// How a client's way ends when it gets no session: a refusal, data that
// says what happened (its status, why, the providers tried, when to come
// back), which the client's front renders once in its client's words
// (front.answer: JSON for a WebSocket client, WebDriver's error for a
// WebDriver create). A client that gets a session is logged when the
// session ends (package sessions). Every other client ends through
// finish, once: it leaves the queue, gives back its holds, gets its
// answer (none when it went away), and is counted, observed and logged.

// finish ends the way of a client that got no session: rf is its answer,
// nil when it went away. Only the first call does anything.
func (c *connect) finish(rf *refusal) {
	if c.finished {
		return
	}
	c.finished = true
	if c.waiter != nil {
		if rf == nil {
			// Gone: what it was retrying goes to the next waiter.
			c.waiter.Gone()
		} else {
			c.waiter.Leave()
		}
		c.waited = time.Since(c.joined)
	}
	c.ticket.Release()
	c.observeWait()
	if rf == nil {
		c.learnt("")
		if ce := c.h.logger.Check(zap.DebugLevel, "client went away"); ce != nil {
			ce.Write(zap.String("session_id", c.id), zap.Array("attempts", attempts(c.attempts)), zap.Float64("queue_wait_ms", roundMS(c.waited)))
		}
		return
	}
	c.learnt(rf.provider)
	c.front.answer(c, rf)
	c.h.obs.Rejected(rf.status, rf.reason, len(c.attempts))
	c.h.logger.Info("rejected",
		zap.String("session_id", c.id),
		zap.String("provider", rf.provider),
		zap.Array("attempts", attempts(c.attempts)),
		zap.Float64("queue_wait_ms", roundMS(c.waited)),
		zap.Float64("duration_ms", roundMS(time.Since(c.start))),
		zap.Int64("bytes_up", 0),
		zap.Int64("bytes_down", 0),
		zap.Int("status", rf.status),
		zap.String("close_reason", rf.reason),
		zap.Int("hedges_started", c.hedgesStarted),
		zap.Int("hedges_wasted", c.hedgesWasted),
	)
}

// observeWait measures the client's time in the queue, if it queued.
func (c *connect) observeWait() {
	if c.waiter != nil {
		c.h.reg.Metrics().QueueWait(c.waited)
	}
}

// rejectBody is the JSON of a refusal that lists the attempts (a 503):
// what each provider did, and when to come back.
type rejectBody struct {
	Error       string    `json:"error"`
	Attempts    []attempt `json:"attempts"`
	RetryAfterS int       `json:"retry_after_s"`
	// Unsupported are the providers the client's session options ruled
	// out.
	Unsupported []unsupported `json:"unsupported,omitempty"`
}

// writeRefusal writes rf as JSON, the answer of every client but a
// WebDriver create's: a provider's own answer as it is; a refusal that
// lists the attempts as rejectBody; any other as {"error": …} with its
// other members. Retry-After goes with the ones that have one.
func writeRefusal(w http.ResponseWriter, r *http.Request, rf *refusal) {
	if rf.relayed != nil {
		writeRelayed(w, r, rf.relayed)
		return
	}
	var set func(http.Header)
	if rf.retryAfter > 0 {
		set = func(hd http.Header) { hd.Set("Retry-After", strconv.Itoa(rf.retryAfter)) }
	}
	if rf.attempts != nil {
		writeJSON(w, rf.status, rejectBody{Error: rf.msg, Attempts: rf.attempts, RetryAfterS: rf.retryAfter, Unsupported: rf.unsupported}, set)
		return
	}
	body := map[string]any{"error": rf.msg}
	for k, v := range rf.more {
		body[k] = v
	}
	if len(rf.unsupported) > 0 {
		body["unsupported"] = rf.unsupported
	}
	if rf.retryAfter > 0 {
		body["retry_after_s"] = rf.retryAfter
	}
	writeJSON(w, rf.status, body, set)
}

// writeRelayed passes a provider's answer to the client as it is:
// status, headers and up to 64 KiB of body.
func writeRelayed(w http.ResponseWriter, r *http.Request, res *upstreams.Result) {
	hd := w.Header()
	for k, vs := range res.Answer.Header {
		if upstreams.HopByHop(k) || k == "Content-Length" || k == SessionHeader {
			continue
		}
		hd[k] = vs
	}
	hd.Set("Content-Length", strconv.Itoa(len(res.Body)))
	w.WriteHeader(res.Answer.Status)
	if r.Method != http.MethodHead {
		w.Write(res.Body)
	}
}

// unavailable is the 503 of a client no provider could take.
func (c *connect) unavailable(why string) *refusal {
	// An attempt cut short by the client's own queue deadline is no
	// provider's outcome: the body lists what the providers did.
	shown := make([]attempt, 0, len(c.attempts))
	for _, a := range c.attempts {
		if a.Outcome != upstreams.WordClientGone {
			shown = append(shown, a)
		}
	}
	c.attempts = shown
	return &refusal{status: http.StatusServiceUnavailable, reason: why, msg: "no browser provider available",
		attempts: shown, retryAfter: c.h.retryAfter(), unsupported: c.unsupported}
}

// shutdownRetryAfter is the Retry-After of a client that an exiting
// process turns away: another node, or this one restarted, may serve it.
const shutdownRetryAfter = 1

// shuttingDown is the 503 of a client that arrives, waits or finishes an
// attempt while the process is exiting.
func (c *connect) shuttingDown() *refusal {
	shown := c.attempts
	if shown == nil {
		shown = []attempt{}
	}
	return &refusal{status: http.StatusServiceUnavailable, reason: observe.ReasonShutdown, msg: "the gateway is shutting down",
		attempts: shown, retryAfter: shutdownRetryAfter}
}

// quotaRetryAfter is the Retry-After of a 429 for client_limit: sessions
// are long and their end unknown, so a fixed, modest hint.
const quotaRetryAfter = 5

// overOrUnavailable is the answer of a wait that ended: 429 while the
// client waited for its client_limit share, 503 while it waited for a
// provider.
func (c *connect) overOrUnavailable(why string) *refusal {
	if !c.inQuota {
		return c.unavailable(why)
	}
	limit := 0
	if c.h.ClientLimit != nil {
		limit = c.h.ClientLimit.Limit
	}
	return &refusal{status: http.StatusTooManyRequests, reason: observe.ReasonClientLimit,
		msg:        "client limit reached: this key already holds " + strconv.Itoa(limit) + " live sessions",
		retryAfter: quotaRetryAfter, more: map[string]any{"limit": limit}}
}

// unservable is the 502 of a client no provider here could ever serve.
func (c *connect) unservable(why string) *refusal {
	return &refusal{status: http.StatusBadGateway, reason: observe.ReasonUnservable, msg: why, unsupported: c.unsupported}
}

// relayed passes a provider's 4xx answer to the client as it is.
func (c *connect) relayed(res upstreams.Result) *refusal {
	return relayedFrom(c.attempts[len(c.attempts)-1].Provider, res)
}

// relayedFrom is a provider's answer, which the client gets as it is.
func relayedFrom(provider string, res upstreams.Result) *refusal {
	return &refusal{status: res.Answer.Status, reason: observe.ReasonRelayed, provider: provider, relayed: &res}
}

// refusedOrigin is the 403 of a request that a web page sent from an
// origin allowed_origins does not name. It does not repeat the origin.
func refusedOrigin(what string) *refusal {
	return &refusal{status: http.StatusForbidden, reason: observe.ReasonOrigin,
		msg: "refused: this " + what + " carries an Origin header, so a web page sent it, and this gateway accepts " +
			"web pages only from the origins its allowed_origins option names (automation clients send no Origin)"}
}

// badOptions is the 400 of a client whose options cannot be read; the
// answer names the option.
func badOptions(err error) *refusal {
	rf := &refusal{status: http.StatusBadRequest, reason: observe.ReasonBadOptions, msg: err.Error()}
	var e *options.Error
	if errors.As(err, &e) && e.Option != "" {
		rf.more = map[string]any{"option": e.Option}
	}
	return rf
}

// clientBudgetRetryHint is the fewest seconds a client_budget 429 asks a
// client to wait.
const clientBudgetRetryHint = 1

// overClientBudget is the 429 of a client key whose budget is spent until
// turn.
func (c *connect) overClientBudget(book *spend.Book, turn time.Time) *refusal {
	return c.clientBudgetRefusal(book, turn, false)
}

// clientBudgetRefusal is the 429 of a client key over its budget; held:
// only with what its sessions being admitted hold, which may yet fail,
// so the client may try again in a second.
func (c *connect) clientBudgetRefusal(book *spend.Book, turn time.Time, held bool) *refusal {
	st := book.Read()
	retry := max(int(time.Until(turn).Seconds()+0.999), clientBudgetRetryHint)
	msg := "client budget reached: this key's sessions have cost its budget for the current " + book.Period() + " (UTC)"
	if held {
		retry = clientBudgetRetryHint
		msg = "client budget reached: this key's sessions, with those being connected now, cost its budget for the current " + book.Period() + " (UTC)"
	}
	amount := st.Budget
	if cb := c.h.ClientBudget; cb != nil {
		amount = cb.Amount
	}
	return &refusal{status: http.StatusTooManyRequests, reason: observe.ReasonClientBudget, msg: msg, retryAfter: retry,
		more: map[string]any{"spent": st.Spent + st.Accrued, "budget": amount, "window_end": turn.UTC().Format(time.RFC3339)}}
}

// noProviderServes is the 502 message when no configured provider speaks
// the client's protocol.
func (h *Gateway) noProviderServes(cl *class) string {
	kinds := ""
	for i, m := range h.current().members {
		if i > 0 {
			kinds += ", "
		}
		k := string(m.up.Protocol())
		if v := m.up.PlaywrightVersion(); v != "" {
			k += " " + v
		}
		kinds += m.up.Name + " (" + k + ")"
	}
	return "no provider here serves " + cl.kind() + " clients; providers: " + kinds
}

// retryAfter is the seconds until the first of the handler's providers
// may be tried again: its cooldown ended, or its budget window turned, and
// its create_rate window admitting a start again; at least 1.
func (h *Gateway) retryAfter() int {
	now := time.Now()
	best := time.Duration(0)
	for _, m := range h.current().members {
		u := m.state.Health.Until()
		if over, turn := m.state.Spend.OverBudget(); over {
			u = turn
		}
		if r := m.state.Starts.RefusedUntil(); r.After(u) {
			u = r
		}
		if u.After(now) {
			if d := u.Sub(now); best == 0 || d < best {
				best = d
			}
		}
	}
	return max(int(math.Ceil(best.Seconds())), 1)
}

// writeJSON writes v as JSON with status; set adjusts headers first.
func writeJSON(w http.ResponseWriter, status int, v any, set func(http.Header)) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	hd := w.Header()
	hd.Set("Content-Type", "application/json")
	hd.Set("Content-Length", strconv.Itoa(len(b)))
	hd.Set("Cache-Control", "no-store")
	if set != nil {
		set(hd)
	}
	w.WriteHeader(status)
	_, err = w.Write(b)
	return err
}

// replacerOf is the request's placeholder replacer, nil outside Caddy.
func replacerOf(r *http.Request) *caddy.Replacer {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	return repl
}

// netConn is the client side of a session.
type netConn = net.Conn
