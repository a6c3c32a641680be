package upstreams

import (
	"context"
	"errors"
	"time"
)

// ResumePoint is where an established connection was made: the upgrade's
// Host and request URI as sent (a discovered provider's
// webSocketDebuggerUrl, a provider's query, a merged client query), and,
// for a session created over a session API, the connect URL its create
// answer gave. Dialling it again reaches the same browser, for as long as
// the provider keeps that browser. It may hold the provider's tokens: it
// is never shown.
type ResumePoint struct {
	ConnectURL string `json:"connect_url,omitempty"`
	Host       string `json:"host"`
	URI        string `json:"uri"`
}

// IsZero reports whether the point is unset.
func (rp ResumePoint) IsZero() bool { return rp.URI == "" }

// errNoPoint is a reconnect without a point to go back to.
var errNoPoint = errors.New("no resume point")

// Reconnect makes one attempt at the browser behind rp: the same
// connection as Connect's, within the same deadline, but to rp's target
// as it is, without discovery and without creating a provider session.
// The client handshake hs is the resuming client's.
func (p *Provider) Reconnect(ctx context.Context, hs *Handshake, rp ResumePoint, replace func(string) string) (res Result) {
	start := time.Now()
	defer func() { res.Outcome.Elapsed = time.Since(start) }()
	if rp.IsZero() {
		return Result{Outcome: Outcome{Word: WordBadHandshake, Kind: Failure, Err: errNoPoint}}
	}
	deadline := start.Add(p.ConnectTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	actx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	via := p
	if rp.ConnectURL != "" {
		t, err := p.retarget(rp.ConnectURL)
		if err != nil {
			return Result{Outcome: Outcome{Word: WordBadCreate, Kind: Failure, Err: err}}
		}
		via = t
	}
	res = via.upgrade(ctx, actx, deadline, hs, target{host: rp.Host, requestURI: rp.URI}, replace)
	if res.Conn != nil {
		res.Conn.Point = rp
	}
	return res
}

// ServerCloseFrame is a close frame from the gateway to a client (not
// masked), with code and reason.
func ServerCloseFrame(code int, reason string) []byte { return closeFrame(code, reason, false) }
