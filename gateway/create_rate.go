package gateway

import (
	"context"
	"time"
)

// create_rate: a provider is asked to start at most n sessions in any
// sliding window of a second or a minute. Every attempt that would start
// a session there takes one start from the window (admit), and so does
// anything else of the gateway that starts one; a provider without a
// start left is skipped, not failed, and the queue offers it again when
// the window admits one.

// takeRate takes one start of m's create_rate window for a session about
// to be started at m: ok, or when the window admits a start again
// (retryAt). Under state redis the window is over every node (one round
// trip, bounded by ctx and the store's timeout); while Redis cannot be
// reached, on_unavailable decides: this node's own window (local), or no
// start (reject: ok false with a zero retryAt, the shared state being
// what stands in the way). A ctx that ends first allows no start, with
// retryAt now. A provider without create_rate allows every start.
func (h *Gateway) takeRate(ctx context.Context, m *member) (ok bool, retryAt time.Time) {
	st := m.state
	r := st.CreateRate()
	if r.N <= 0 {
		return true, time.Time{}
	}
	if sh := h.shared; sh != nil {
		if sh.s.Usable() {
			start, err := sh.s.Store().Rates().Take(ctx, st.Name(), r.N, r.Window)
			switch {
			case err == nil:
				sh.s.Worked()
				if !start.OK {
					return false, h.reg.Now().Add(start.Wait)
				}
				// This node's window counts it too, for when Redis
				// cannot be reached.
				st.RecordStart()
				return true, time.Time{}
			case ctx.Err() != nil:
				return false, h.reg.Now()
			}
			sh.s.Failed("rate", err)
		}
		if sh.reject {
			return false, time.Time{}
		}
	}
	return st.TakeStart()
}
