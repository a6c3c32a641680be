package browserfailover

import (
	"encoding/json"
	"math"
	"net"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// attempt is one line of a client's way through the chain: a provider tried
// (or skipped) and how it went.
type attempt struct {
	Provider string  `json:"provider"`
	Outcome  string  `json:"outcome"`
	MS       float64 `json:"ms"`
}

// attempts renders as a zap array.
type attempts []attempt

func (as attempts) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	for _, a := range as {
		enc.AppendObject(a)
	}
	return nil
}

func (a attempt) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddString("provider", a.Provider)
	enc.AddString("outcome", a.Outcome)
	enc.AddFloat64("ms", a.MS)
	return nil
}

func roundMS(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Millisecond)*10) / 10
}

// add keeps the latest maxLoggedAttempts attempts.
func (c *connect) add(a attempt) {
	if len(c.attempts) >= maxLoggedAttempts {
		copy(c.attempts, c.attempts[1:])
		c.attempts = c.attempts[:len(c.attempts)-1]
	}
	c.attempts = append(c.attempts, a)
}

// skip records a provider passed over without an attempt.
func (c *connect) skip(m *member, word string) {
	c.add(attempt{Provider: m.up.Name, Outcome: word})
}

// record notes an attempt's outcome; a failure becomes the provider's last
// error (words and transport errors hold no URL).
func (c *connect) record(m *member, o upstreams.Outcome) {
	c.add(attempt{Provider: m.up.Name, Outcome: o.Word, MS: roundMS(o.Elapsed)})
	observe.Attempt(m.up.Name, o)
	if o.Kind != upstreams.Success && o.Kind != upstreams.ClientGone && o.Kind != upstreams.Relay {
		m.state.SetLastError(o.Word)
	}
	if ce := c.h.logger.Check(zap.DebugLevel, "attempt"); ce != nil {
		fields := []zap.Field{
			zap.String("provider", m.up.Name),
			zap.String("outcome", o.Word),
			zap.Float64("ms", roundMS(o.Elapsed)),
		}
		if o.Err != nil {
			fields = append(fields, zap.String("cause", o.Err.Error()))
		}
		ce.Write(fields...)
	}
}

// establish hands the client over to the provider's connection: it answers
// the client with the provider's 101 and starts the relay. It reports false
// when the client could not be taken over (the upstream is closed then).
func (c *connect) establish(m *member, up *upstreams.Conn) bool {
	st := m.state
	if c.hs.ExtendedConnect {
		return c.establishStream(m, up)
	}
	conn, brw, err := http.NewResponseController(c.w).Hijack()
	if err != nil {
		up.Close()
		st.Unreserve()
		c.h.logger.Error("cannot take over the client connection", zap.Error(err))
		return false
	}
	conn.SetDeadline(time.Time{})
	// Bytes the client pipelined behind its handshake go first.
	var pending []byte
	if n := brw.Reader.Buffered(); n > 0 {
		pending = make([]byte, n)
		brw.Read(pending)
	}
	// The provider's 101 goes to the client only once the session counts
	// as live, so a client never holds a session that status and
	// max_concurrent do not see yet.
	c.startSession(m, conn, up, pending, func() {
		if _, err := conn.Write(up.Answer.Raw); err != nil {
			conn.Close() // the relay ends at once and frees the slot
		}
	})
	return true
}

// startSession registers the session with its provider, answers the client
// (greet, when not nil) and starts the relay.
func (c *connect) startSession(m *member, client netConn, up *upstreams.Conn, pending []byte, greet func()) *upstreams.Session {
	st := m.state
	end := &sessionEnd{
		logger:   c.h.logger,
		provider: m.up.Name,
		attempts: c.attempts,
		waited:   c.waited,
		hedges:   c.hedgesStarted,
		wasted:   c.hedgesWasted,
	}
	if c.waiter != nil {
		// Served: out of the queue before the client hears of it (an
		// HTTP/2 session keeps this goroutine until it ends).
		c.waited = c.sinceJoined()
		end.waited = c.waited
		c.waiter.Leave()
	}
	c.observeWait()
	// The client's quota session and the cluster-wide slot now live as
	// long as the session (which keeps the store open for its renewals).
	quota := c.quota
	c.quota = nil
	lease := c.lease
	c.lease = nil
	var store *cluster.Shared
	if lease != nil && c.h.shared != nil {
		store = c.h.shared.s
		store.Retain()
	}
	var idle, maxDur time.Duration
	if s := c.h.Session; s != nil {
		idle, maxDur = time.Duration(s.IdleTimeout), time.Duration(s.MaxDuration)
	}
	s := upstreams.NewSession(client, up, upstreams.SessionOptions{
		ClientPending: pending,
		IdleTimeout:   idle,
		MaxDuration:   maxDur,
		OnEnd: func(s *upstreams.Session) {
			st.End(s)
			if quota != nil {
				pool.ReleaseQuota(*quota)
			}
			if lease != nil {
				lease.Release()
			}
			if store != nil {
				store.Release()
			}
			end.log(s)
		},
	})
	st.Establish(s)
	if greet != nil {
		greet()
	}
	s.Run()
	return s
}

// sessionEnd is what a session's end log needs; it keeps nothing of the
// request alive.
type sessionEnd struct {
	logger   *zap.Logger
	provider string
	attempts attempts
	waited   time.Duration
	hedges   int
	wasted   int
}

func (e *sessionEnd) log(s *upstreams.Session) {
	observe.SessionEnded(e.provider, time.Since(s.Start()))
	e.logger.Info("session ended",
		zap.String("provider", e.provider),
		zap.Array("attempts", e.attempts),
		zap.Float64("queue_wait_ms", roundMS(e.waited)),
		zap.Float64("duration_ms", roundMS(time.Since(s.Start()))),
		zap.Int64("bytes_up", s.BytesUp()),
		zap.Int64("bytes_down", s.BytesDown()),
		zap.String("close_reason", s.Reason()),
		zap.Int("hedges_started", e.hedges),
		zap.Int("hedges_wasted", e.wasted),
	)
}

// relayAnswer passes a provider's 4xx answer to the client as it is:
// status, headers and up to 64 KiB of body.
func (c *connect) relayAnswer(res upstreams.Result) {
	hd := c.w.Header()
	for k, vs := range res.Answer.Header {
		if upstreams.HopByHop(k) || k == "Content-Length" {
			continue
		}
		hd[k] = vs
	}
	hd.Set("Content-Length", strconv.Itoa(len(res.Body)))
	c.w.WriteHeader(res.Answer.Status)
	if c.r.Method != http.MethodHead {
		c.w.Write(res.Body)
	}
	c.observeWait()
	c.h.obs.Rejected(res.Answer.Status, observe.ReasonRelayed, len(c.attempts))
	c.logRejected(res.Answer.Status, c.attempts[len(c.attempts)-1].Provider, "provider answered "+strconv.Itoa(res.Answer.Status))
}

// logRejected writes the "rejected" entry of SPEC 10: the client got no
// session (provider is the one whose answer it got, if any).
func (c *connect) logRejected(status int, provider, why string) {
	c.h.logger.Info("rejected",
		zap.String("provider", provider),
		zap.Array("attempts", attempts(c.attempts)),
		zap.Float64("queue_wait_ms", roundMS(c.waited)),
		zap.Float64("duration_ms", roundMS(time.Since(c.start))),
		zap.Int64("bytes_up", 0),
		zap.Int64("bytes_down", 0),
		zap.Int("status", status),
		zap.String("close_reason", why),
		zap.Int("hedges_started", c.hedgesStarted),
		zap.Int("hedges_wasted", c.hedgesWasted),
	)
}

// rejectBody is the JSON of SPEC 3.7.
type rejectBody struct {
	Error       string    `json:"error"`
	Attempts    []attempt `json:"attempts"`
	RetryAfterS int       `json:"retry_after_s"`
}

// reject answers 503 (or status) with Retry-After and the attempts.
func (c *connect) reject(status int, why string) {
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
	body := rejectBody{Error: "no browser provider available", Attempts: shown, RetryAfterS: retry}
	writeJSON(c.w, status, body, func(hd http.Header) {
		hd.Set("Retry-After", strconv.Itoa(retry))
	})
	c.observeWait()
	c.h.obs.Rejected(status, why, len(c.attempts))
	c.logRejected(status, "", why)
}

// logGone notes a client that left before it got a session.
func (c *connect) logGone() {
	c.observeWait()
	if ce := c.h.logger.Check(zap.DebugLevel, "client went away"); ce != nil {
		ce.Write(zap.Array("attempts", attempts(c.attempts)), zap.Float64("queue_wait_ms", roundMS(c.waited)))
	}
}

// retryAfter is the seconds until the earliest cooldown of the handler's
// providers ends, at least 1.
func (h *Handler) retryAfter() int {
	now := time.Now()
	best := time.Duration(0)
	for _, m := range h.members {
		if u := m.state.Health.Until(); u.After(now) {
			if d := u.Sub(now); best == 0 || d < best {
				best = d
			}
		}
	}
	secs := int(math.Ceil(best.Seconds()))
	if secs < 1 {
		secs = 1
	}
	return secs
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

// netConn is the client side of a session.
type netConn = net.Conn

// establishStream serves an HTTP/2 or HTTP/3 extended CONNECT client: it
// answers 200 with the provider's negotiated subprotocol and extensions,
// then relays the stream for as long as the session lives (the stream ends
// when ServeHTTP returns).
func (c *connect) establishStream(m *member, up *upstreams.Conn) bool {
	hd := c.w.Header()
	for _, k := range []string{"Sec-Websocket-Protocol", "Sec-Websocket-Extensions"} {
		if vs := up.Answer.Header[k]; len(vs) > 0 {
			hd[k] = vs
		}
	}
	rc := http.NewResponseController(c.w)
	sc := newStreamConn(c.r, c.w, rc)
	s := c.startSession(m, sc, up, nil, func() {
		c.w.WriteHeader(http.StatusOK)
		if err := rc.Flush(); err != nil {
			sc.Close() // the relay ends at once and frees the slot
		}
	})
	// The stream lives as long as this handler runs: return only once both
	// relay directions are done with the ResponseWriter.
	<-s.Done()
	return true
}
