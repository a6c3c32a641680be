package cluster

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// renewer keeps the held leases alive: about every LeaseTTL/3 (loop), and
// at once after a failed call or a change of master (Leases.reassert), it
// extends every held lease, putting back those Redis lost, and drops the
// dead leases of the watched providers, counting their live ones.
type renewer struct {
	ls      *Leases
	stopped chan struct{} // closed by stop
	once    sync.Once
	done    chan struct{} // closed when loop has returned
	ok      atomic.Bool   // the last renewal succeeded
	mu      sync.Mutex    // one renewal at a time
}

// loop renews the held leases about every LeaseTTL/3 until stop.
func (r *renewer) loop() {
	defer close(r.done)
	t := time.NewTicker(time.Duration(r.ls.c.cfg.LeaseTTL) / 3)
	defer t.Stop()
	for {
		select {
		case <-r.stopped:
			return
		case <-t.C:
			r.renew()
		}
	}
}

// stop stops loop and waits for it, without releasing anything. Tests
// use it to play a node that died.
func (r *renewer) stop() {
	r.once.Do(func() { close(r.stopped) })
	<-r.done
}

// renew runs one renewal (see run), logging a failure once per outage.
func (r *renewer) renew() {
	c := r.ls.c
	err := r.run(context.Background())
	if err != nil {
		c.backgroundFailed("renew", err)
		if r.ok.Swap(false) {
			c.log.Warn("shared state: lease renewal failed; retrying", zap.Error(err))
		}
		return
	}
	if !r.ok.Swap(true) {
		c.log.Info("shared state: lease renewal works again")
	}
}

// run extends every held lease (putting back those that went missing)
// and drops the dead leases of every provider this node has asked for or
// watches, counting its live leases: one round trip, or in Cluster mode
// one per provider. On success the leases are asserted: the stale mark
// is cleared.
func (r *renewer) run(ctx context.Context) error {
	ls, c := r.ls, r.ls.c
	r.mu.Lock()
	defer r.mu.Unlock()
	byProvider := map[string][]*Lease{}
	for _, p := range ls.watched.list() {
		byProvider[p] = nil
	}
	ls.mu.Lock()
	if ls.closed {
		ls.mu.Unlock()
		return nil
	}
	for l := range ls.held {
		l.written.Store(true) // this renewal writes it, registered or not
		byProvider[l.provider] = append(byProvider[l.provider], l)
	}
	ls.mu.Unlock()
	// Cleared first: a failure from now on marks it again.
	wasStale := c.stale.Swap(false)
	if len(byProvider) == 0 {
		if wasStale {
			c.cfg.Hooks.reasserted()
		}
		return nil
	}
	providers := make([]string, 0, len(byProvider))
	for p := range byProvider {
		providers = append(providers, p)
	}
	sort.Strings(providers)
	var restored int64
	for _, group := range c.slotGroups(providers) {
		n, err := r.group(ctx, group, byProvider)
		if err != nil {
			c.stale.Store(true)
			return err
		}
		restored += n
	}
	if restored > 0 {
		c.log.Info("shared state: put back leases that went missing", zap.Int64("leases", restored))
	} else if wasStale {
		if ce := c.log.Check(zap.DebugLevel, "shared state: leases re-asserted; none was missing"); ce != nil {
			ce.Write()
		}
	}
	// A lease released while this renewal ran may have been put back by
	// it: release it again.
	var again []*Lease
	for _, held := range byProvider {
		for _, l := range held {
			if l.released.Load() {
				again = append(again, l)
			}
		}
	}
	if len(again) > 0 {
		rctx, rcancel := c.ctx(context.Background())
		_ = ls.w.remove(rctx, again)
		rcancel()
	}
	if wasStale {
		// The leases are back: what else this node keeps in the store
		// (its ledger) is written again too.
		c.cfg.Hooks.reasserted()
	}
	return nil
}

// group runs the renewal script over providers (one slot group) and
// returns how many leases it put back.
func (r *renewer) group(ctx context.Context, providers []string, byProvider map[string][]*Lease) (int64, error) {
	ls, c := r.ls, r.ls.c
	keys := make([]string, 0, len(providers))
	args := []any{time.Duration(c.cfg.LeaseTTL).Milliseconds(), c.channel()}
	for _, p := range providers {
		keys = append(keys, c.leaseKey(p))
		held := byProvider[p]
		args = append(args, ls.news.of(p).released, len(held))
		for _, l := range held {
			args = append(args, l.member)
		}
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	res, err := renewScript.Run(ctx, c.rdb, keys, args...).Int64Slice()
	if err == nil && len(res) != 1+len(providers) {
		err = fmt.Errorf("unexpected reply %v", res)
	}
	if err != nil {
		return 0, c.fail("renew leases", err)
	}
	for i, p := range providers {
		ls.sawLive(p, int(res[1+i]))
	}
	return res[0], nil
}
