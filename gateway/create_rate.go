package gateway

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/pool"
)

// create_rate: a provider is asked to start at most n sessions in any
// sliding window of a second or a minute. Every attempt that would start
// a session there takes one start from the window (admit), and so does
// anything else of the gateway that starts one; a provider without a
// start left is skipped, not failed, and the queue offers it again when
// the window admits one. An attempt the provider refused with a 4xx
// started nothing: its start is given back (conclude), and a client
// waiting for a start may take it.

// takeRate takes one start of m's create_rate window for a session about
// to be started at m: ok with the start s (for giveBackStart), or when
// the window admits a start again (retryAt). Under state redis the window
// is over every node (one round trip, bounded by ctx and the store's
// timeout); while Redis cannot be reached, on_unavailable decides: this
// node's own window (local), or no start (reject: ok false with a zero
// retryAt, the shared state being what stands in the way). A ctx that
// ends first allows no start, with retryAt now. A provider without
// create_rate allows every start.
func (h *Gateway) takeRate(ctx context.Context, m *member) (s pool.Start, ok bool, retryAt time.Time) {
	st := m.state
	r := st.Starts.Rate()
	if r.N <= 0 {
		return pool.Start{}, true, time.Time{}
	}
	if sh := h.shared; sh != nil {
		if sh.s.Usable() {
			start, err := sh.s.Store().Rates().Take(ctx, st.Name(), r.N, r.Window)
			switch {
			case err == nil:
				sh.s.Worked()
				if !start.OK {
					return pool.Start{}, false, h.reg.Now().Add(start.Wait)
				}
				// This node's window counts it too, for when Redis
				// cannot be reached.
				return st.Starts.Record(start.ID), true, time.Time{}
			case ctx.Err() != nil:
				return pool.Start{}, false, h.reg.Now()
			}
			sh.s.Failed("rate", err)
		}
		if sh.reject {
			return pool.Start{}, false, time.Time{}
		}
	}
	return st.Starts.Take()
}

// giveBackStart gives back the create_rate start t's attempt took at m
// (none: nothing to do): the provider started nothing for it. It leaves
// this node's window and, under state redis, the window over every node
// (one round trip, whose script tells every node that the provider has
// room); a client the window turned away is offered the provider. While
// Redis cannot be reached the shared start stays until it leaves the
// window in its time.
func (h *Gateway) giveBackStart(m *member, t *pool.Ticket) {
	s, ok := t.TakeBackStart()
	if !ok {
		return
	}
	if sh := h.shared; sh != nil && s.Shared != "" && sh.s.Usable() {
		if err := sh.s.Store().Rates().GiveBack(context.Background(), m.state.Name(), s.Shared); err != nil {
			sh.s.Failed("rate", err)
			h.logger.Debug("create_rate start not given back in the shared state", zap.String("provider", m.state.Name()), zap.Error(err))
		} else {
			sh.s.Worked()
		}
	}
	m.state.Starts.GiveBack(s)
}
