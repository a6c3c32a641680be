package browserfailover

import (
	"context"
	"time"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Hedged connects (SPEC 11): when the newest attempt has not answered
// within hedge_after, the next candidate starts beside it, up to hedge_max
// attempts in flight. The first 101 wins; every other attempt is cancelled,
// and one that answers 101 anyway gets close 1000 "hedge lost".

// defaultHedgeMax is hedge_max when not set.
const defaultHedgeMax = 2

// flight is one attempt running in parallel.
type flight struct {
	m      *member
	permit cooldown.Permit
	lease  *cluster.Lease
	cancel context.CancelFunc
	start  time.Time
	hedge  bool // started beside another attempt
}

// landing is a flight's result.
type landing struct {
	f   *flight
	res upstreams.Result
}

// passHedged attempts the candidates with hedging (4.).
func (c *connect) passHedged(ctx context.Context, ps *passState) passEnd {
	h := c.h
	most := h.HedgeMax
	if most == 0 {
		most = defaultHedgeMax
	}
	// Each flight sends exactly once and at most most are in flight.
	results := make(chan landing, most)
	live := make(map[*flight]struct{}, most)
	timer := time.NewTimer(time.Duration(h.HedgeAfter))
	defer timer.Stop()

	launch := func(hedge bool) bool {
		m, permit, lease := c.pick(ps)
		if m == nil {
			return false
		}
		actx, cancel := context.WithCancel(ctx)
		f := &flight{m: m, permit: permit, lease: lease, cancel: cancel, start: time.Now(), hedge: hedge}
		live[f] = struct{}{}
		if hedge {
			c.hedgesStarted++
			observe.HedgeStarted(m.up.Name)
		}
		go func() { results <- landing{f: f, res: f.m.up.Connect(actx, c.hs, c.replace)} }()
		// hedge_after counts from the newest attempt.
		timer.Reset(time.Duration(h.HedgeAfter))
		return true
	}

	if !launch(false) {
		return passNothing
	}
	for len(live) > 0 {
		var due <-chan time.Time
		if len(live) < most && ps.next < len(ps.order) {
			due = timer.C
		}
		select {
		case <-due:
			launch(true)
		case l := <-results:
			delete(live, l.f)
			l.f.cancel()
			switch end := c.conclude(ps, l.f.m, l.f.permit, l.res); end {
			case passEstablished:
				if l.f.hedge {
					observe.HedgeWon(l.f.m.up.Name)
				}
				c.abandon(live, results)
				// 6. Relay.
				c.lease = l.f.lease
				if c.establish(l.f.m, l.res.Conn) {
					return passEstablished
				}
				return passClientGone
			case passNothing:
				releaseLease(l.f.lease)
				// Failed on its own: with nothing else in flight the
				// next candidate starts at once, as without hedging.
				if len(live) == 0 && !(ctx.Err() != nil && c.r.Context().Err() != nil) {
					launch(false)
				}
			default:
				releaseLease(l.f.lease)
				c.abandon(live, results)
				return end
			}
		}
	}
	if ctx.Err() != nil && c.r.Context().Err() != nil {
		return passClientGone
	}
	return passNothing
}

// abandon cancels the attempts still in flight, lists them as hedge_lost,
// and settles each in the background as it returns: a cancelled one counts
// neither as success nor as failure, one that answered 101 anyway gets
// close 1000 "hedge lost", one that failed on its own counts as usual.
// Every slot is given back.
func (c *connect) abandon(live map[*flight]struct{}, results <-chan landing) {
	if len(live) == 0 {
		return
	}
	for f := range live {
		f.cancel()
		c.add(attempt{Provider: f.m.up.Name, Outcome: upstreams.WordHedgeLost, MS: roundMS(time.Since(f.start))})
		c.hedgesWasted++
		observe.HedgeWasted(f.m.up.Name)
	}
	n := len(live)
	h := c.h
	go func() {
		for range n {
			l := <-results
			releaseLease(l.f.lease)
			st := l.f.m.state
			o := l.res.Outcome
			switch o.Kind {
			case upstreams.Success:
				st.Health.Done(l.f.permit, cooldown.Neutral, 0)
				st.Unreserve()
				l.res.Conn.CloseLost()
			case upstreams.Failure, upstreams.Capacity:
				observe.Attempt(st.Name(), o)
				st.SetLastError(o.Word)
				r := cooldown.Failure
				if o.Kind == upstreams.Capacity {
					r = cooldown.Capacity
				}
				h.settle(st, l.f.permit, r, o.RetryAfter)
				st.UnreserveFailed()
			default: // cancelled, 428, a 4xx nobody will read
				st.Health.Done(l.f.permit, cooldown.Neutral, 0)
				st.Unreserve()
			}
		}
	}()
}
