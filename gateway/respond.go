package gateway

import (
	"encoding/json"
	"math"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/spend"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// How a client's way ends. A client that gets a session is logged when the
// session ends (sessionEnd). Every other client ends through finish, once:
// it leaves the queue, gives back its holds, gets its answer (none when it
// went away), and is counted, observed and logged.

// reply is a terminal answer: a client that gets no session.
type reply struct {
	status int
	// reason is the rejection reason of metrics, events and the log.
	reason string
	// provider is the one whose answer the client gets, if any.
	provider string
	write    func(w http.ResponseWriter, r *http.Request)
}

// finish ends the way of a client that got no session: rp is its answer,
// nil when it went away. Only the first call does anything.
func (c *connect) finish(rp *reply) {
	if c.finished {
		return
	}
	c.finished = true
	if c.waiter != nil {
		c.waiter.Leave()
		c.waited = time.Since(c.joined)
	}
	c.ticket.Release()
	c.observeWait()
	if rp == nil {
		c.learnt("")
		if ce := c.h.logger.Check(zap.DebugLevel, "client went away"); ce != nil {
			ce.Write(zap.String("session_id", c.id), zap.Array("attempts", attempts(c.attempts)), zap.Float64("queue_wait_ms", roundMS(c.waited)))
		}
		return
	}
	c.learnt(rp.provider)
	c.w.Header().Set(SessionHeader, c.id)
	if c.wd != nil {
		webDriverAnswer(c.w, c.r, rp)
	} else {
		rp.write(c.w, c.r)
	}
	c.h.obs.Rejected(rp.status, rp.reason, len(c.attempts))
	c.h.logger.Info("rejected",
		zap.String("session_id", c.id),
		zap.String("provider", rp.provider),
		zap.Array("attempts", attempts(c.attempts)),
		zap.Float64("queue_wait_ms", roundMS(c.waited)),
		zap.Float64("duration_ms", roundMS(time.Since(c.start))),
		zap.Int64("bytes_up", 0),
		zap.Int64("bytes_down", 0),
		zap.Int("status", rp.status),
		zap.String("close_reason", rp.reason),
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

// rejectBody is the JSON of a 503: what each provider did, and when to
// come back.
type rejectBody struct {
	Error       string    `json:"error"`
	Attempts    []attempt `json:"attempts"`
	RetryAfterS int       `json:"retry_after_s"`
	// Unsupported are the providers the client's session options ruled
	// out.
	Unsupported []unsupported `json:"unsupported,omitempty"`
}

// unavailable is the 503 of a client no provider could take.
func (c *connect) unavailable(why string) *reply {
	retry := c.h.retryAfter()
	// An attempt cut short by the client's own queue deadline is no
	// provider's outcome: the body lists what the providers did.
	shown := make([]attempt, 0, len(c.attempts))
	for _, a := range c.attempts {
		if a.Outcome != upstreams.WordClientGone {
			shown = append(shown, a)
		}
	}
	c.attempts = shown
	body := rejectBody{Error: "no browser provider available", Attempts: shown, RetryAfterS: retry, Unsupported: c.unsupported}
	return &reply{status: http.StatusServiceUnavailable, reason: why, write: func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusServiceUnavailable, body, func(hd http.Header) {
			hd.Set("Retry-After", strconv.Itoa(retry))
		})
	}}
}

// shutdownRetryAfter is the Retry-After of a client that an exiting
// process turns away: another node, or this one restarted, may serve it.
const shutdownRetryAfter = 1

// shuttingDown is the 503 of a client that arrives, waits or finishes an
// attempt while the process is exiting.
func (c *connect) shuttingDown() *reply {
	body := rejectBody{Error: "the gateway is shutting down", Attempts: c.attempts, RetryAfterS: shutdownRetryAfter}
	if body.Attempts == nil {
		body.Attempts = []attempt{}
	}
	return &reply{status: http.StatusServiceUnavailable, reason: observe.ReasonShutdown, write: func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusServiceUnavailable, body, func(hd http.Header) {
			hd.Set("Retry-After", strconv.Itoa(shutdownRetryAfter))
		})
	}}
}

// quotaRetryAfter is the Retry-After of a 429 for client_limit: sessions
// are long and their end unknown, so a fixed, modest hint.
const quotaRetryAfter = 5

// overOrUnavailable is the answer of a wait that ended: 429 while the
// client waited for its client_limit share, 503 while it waited for a
// provider.
func (c *connect) overOrUnavailable(why string) *reply {
	if !c.inQuota {
		return c.unavailable(why)
	}
	limit := 0
	if c.h.ClientLimit != nil {
		limit = c.h.ClientLimit.Limit
	}
	body := map[string]any{
		"error":         "client limit reached: this key already holds " + strconv.Itoa(limit) + " live sessions",
		"limit":         limit,
		"retry_after_s": quotaRetryAfter,
	}
	return &reply{status: http.StatusTooManyRequests, reason: observe.ReasonClientLimit, write: func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusTooManyRequests, body, func(hd http.Header) {
			hd.Set("Retry-After", strconv.Itoa(quotaRetryAfter))
		})
	}}
}

// unservable is the 502 of a client no provider here could ever serve.
func (c *connect) unservable(why string) *reply {
	body := map[string]any{"error": why}
	if len(c.unsupported) > 0 {
		body["unsupported"] = c.unsupported
	}
	return &reply{status: http.StatusBadGateway, reason: observe.ReasonUnservable, write: func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusBadGateway, body, nil)
	}}
}

// relayed passes a provider's 4xx answer to the client as it is: status,
// headers and up to 64 KiB of body.
func (c *connect) relayed(res upstreams.Result) *reply {
	return c.relayedTo(c.attempts[len(c.attempts)-1].Provider, res)
}

// relayedTo is relayed, for a provider named apart.
func (c *connect) relayedTo(provider string, res upstreams.Result) *reply {
	status := res.Answer.Status
	return &reply{
		status:   status,
		reason:   observe.ReasonRelayed,
		provider: provider,
		write: func(w http.ResponseWriter, r *http.Request) {
			hd := w.Header()
			for k, vs := range res.Answer.Header {
				if upstreams.HopByHop(k) || k == "Content-Length" || k == SessionHeader {
					continue
				}
				hd[k] = vs
			}
			hd.Set("Content-Length", strconv.Itoa(len(res.Body)))
			w.WriteHeader(status)
			if r.Method != http.MethodHead {
				w.Write(res.Body)
			}
		},
	}
}

// noProviderServes is the 502 message when no configured provider speaks
// the client's protocol.
func (h *Gateway) noProviderServes(cl *class) string {
	kinds := ""
	for i, m := range h.members {
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
	for _, m := range h.members {
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

// sessionEnd is what a session's end log needs; it keeps nothing of the
// request alive.
type sessionEnd struct {
	logger   *zap.Logger
	metrics  *observe.Metrics
	attempts attempts
	waited   time.Duration
	hedges   int32
	wasted   int32
	// keepalive: the session pinged its sides (keepalive on).
	keepalive bool
	// options are the session options the client stated (nil: none).
	options map[string]any
	// warm: the session was opened ahead of demand (warm.go).
	warm bool
}

// log writes the end entry of session id at provider; cost is what it
// cost (so far, for a session parked with its provider session).
func (e *sessionEnd) log(s *upstreams.Session, id, provider string, cost float64) {
	e.metrics.SessionEnded(provider, time.Since(s.Start()))
	var pings []zap.Field
	if e.keepalive {
		pings = append(pings, zap.Int64("keepalive_pings", s.KeepalivePings()))
	}
	if e.options != nil {
		pings = append(pings, zap.Any("options", e.options))
	}
	if e.warm {
		pings = append(pings, zap.Bool("warm", true))
	}
	e.logger.Info("session ended", append([]zap.Field{
		zap.String("session_id", id),
		zap.String("provider", provider),
		zap.Array("attempts", e.attempts),
		zap.Float64("queue_wait_ms", roundMS(e.waited)),
		zap.Float64("duration_ms", roundMS(time.Since(s.Start()))),
		zap.Int64("bytes_up", s.BytesUp()),
		zap.Int64("bytes_down", s.BytesDown()),
		zap.String("close_reason", s.Reason()),
		zap.Int32("hedges_started", e.hedges),
		zap.Int32("hedges_wasted", e.wasted),
		zap.Float64("cost", roundCost(cost)),
	}, pings...)...)
}

// roundCost rounds a cost to 1e-9 of a unit, so a log or a status shows
// 0.3 rather than 0.30000000000000004.
func roundCost(v float64) float64 { return math.Round(v*1e9) / 1e9 }

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

// refuseOrigin is the 403 of an upgrade that a web page opened from an
// origin allowed_origins does not name. The body does not repeat the
// origin.
func (c *connect) refuseOrigin() *reply {
	const msg = "refused: this upgrade carries an Origin header, so a web page opened it, and this gateway accepts " +
		"web pages only from the origins its allowed_origins option names (automation clients send no Origin)"
	return &reply{status: http.StatusForbidden, reason: observe.ReasonOrigin, write: func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusForbidden, map[string]string{"error": msg}, nil)
	}}
}

// clientBudgetRetryHint is the fewest seconds a client_budget 429 asks a
// client to wait.
const clientBudgetRetryHint = 1

// overClientBudget is the 429 of a client key whose budget is spent until
// turn.
func (c *connect) overClientBudget(book *spend.Book, turn time.Time) *reply {
	return c.clientBudgetReply(book, turn, false)
}

// clientBudgetReply is the 429 of a client key over its budget; held: only
// with what its sessions being admitted hold, which may yet fail, so the
// client may try again in a second.
func (c *connect) clientBudgetReply(book *spend.Book, turn time.Time, held bool) *reply {
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
	body := map[string]any{
		"error":         msg,
		"spent":         st.Spent + st.Accrued,
		"budget":        amount,
		"window_end":    turn.UTC().Format(time.RFC3339),
		"retry_after_s": retry,
	}
	return &reply{status: http.StatusTooManyRequests, reason: observe.ReasonClientBudget, write: func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusTooManyRequests, body, func(hd http.Header) {
			hd.Set("Retry-After", strconv.Itoa(retry))
		})
	}}
}
