package cluster

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
)

// writer is the background writer of Leases: one goroutine at a time
// (run) that gathers a few milliseconds of lease writes (Register) and
// releases (Lease.Release) into one script call, so that a connect or a
// release waits for no round trip and, under load, many sessions share
// one. It also gives back the kept slots once due. Its state is guarded
// by ls.mu.
type writer struct {
	ls *Leases
	// adding are the leases registered and not yet written in Redis,
	// releasing those released and not yet given back there; running
	// while run runs; idle while it has nothing to write and waits for
	// the end of a kept slot, until a kick (on kick) says there is.
	adding    []*Lease
	releasing []*Lease
	running   bool
	idle      bool
	kick      chan struct{}
}

// flushDelay is how long the writer gathers what is queued before it
// writes: a lease registered and released within it is never written,
// and the node's next acquire of a provider carries the releases queued
// meanwhile in its own round trip. Other nodes see a lease, or a slot
// freed, that much later.
const flushDelay = 5 * time.Millisecond

// addLocked queues a registered lease for writing. Under ls.mu.
func (w *writer) addLocked(l *Lease) {
	w.adding = append(w.adding, l)
	w.startLocked()
}

// queueLocked queues released leases for giving back. Under ls.mu,
// before Close (which marks every held lease released first).
func (w *writer) queueLocked(released ...*Lease) {
	w.releasing = append(w.releasing, released...)
	w.startLocked()
}

// giveBackLocked queues kept slots for release (unless Close took them).
// Under ls.mu.
func (w *writer) giveBackLocked(kept []spare) {
	for _, sp := range kept {
		if sp.l.released.CompareAndSwap(false, true) {
			delete(w.ls.held, sp.l)
			w.releasing = append(w.releasing, sp.l)
		}
	}
}

// takeLocked takes the queued releases of provider off the queue, for an
// Acquire of it to give back in its own round trip. Under ls.mu.
func (w *writer) takeLocked(provider string) []*Lease {
	var taken []*Lease
	kept := w.releasing[:0]
	for _, l := range w.releasing {
		if l.provider == provider {
			taken = append(taken, l)
		} else {
			kept = append(kept, l)
		}
	}
	w.releasing = kept
	return taken
}

// startLocked starts run unless it runs, and wakes it if it waits for a
// kept slot's end. Under ls.mu.
func (w *writer) startLocked() {
	if !w.running {
		w.running = true
		w.ls.inflight.Add(1)
		go w.run()
		return
	}
	w.kickLocked()
}

// kickLocked wakes run if it waits for a kept slot's end. Under ls.mu.
func (w *writer) kickLocked() {
	if w.idle {
		w.idle = false
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
}

// run writes the registered leases and gives back the released ones, all
// those queued in one round trip, until none is queued. With nothing
// queued but slots kept, it sleeps until the oldest is due (or something
// is queued), then gives it back.
func (w *writer) run() {
	ls := w.ls
	defer ls.inflight.Done()
	for {
		time.Sleep(flushDelay)
		ls.mu.Lock()
		w.idle = false
		now := time.Now()
		w.giveBackLocked(ls.spares.expire(now))
		adds, rels := w.adding, w.releasing
		w.adding, w.releasing = nil, nil
		if len(adds) == 0 && len(rels) == 0 {
			if due, ok := ls.spares.nextEnd(); ok {
				w.idle = true
				ls.mu.Unlock()
				// The loop's own gathering delay comes on top.
				t := time.NewTimer(max(due.Sub(now)-flushDelay, 0))
				select {
				case <-t.C:
				case <-w.kick:
				}
				t.Stop()
				continue
			}
			w.running = false
			ls.mu.Unlock()
			return
		}
		ls.mu.Unlock()
		ops := make([]leaseOp, 0, len(adds)+len(rels))
		for _, l := range adds {
			if !l.released.Load() { // released already: nothing to write
				l.written.Store(true)
				ops = append(ops, leaseOp{l: l, add: true})
			}
		}
		for _, l := range rels {
			if l.written.Load() { // a lease never written has nothing to remove
				ops = append(ops, leaseOp{l: l})
			}
		}
		ctx, cancel := ls.c.ctx(context.Background())
		var err error
		if len(adds) > 0 {
			// After an outage or a failover the held leases are put
			// back first (the ones registered here among them).
			err = ls.reassert(ctx)
		}
		if err == nil {
			err = w.write(ctx, ops)
		}
		if err != nil {
			ls.c.backgroundFailed("write", err)
			// Registered leases missing are put back by the next
			// renewal; released ones expire on their own.
			ls.c.log.Debug("shared state: leases not written; renewals and expiry mend it",
				zap.Int("registered", len(adds)), zap.Int("released", len(rels)), zap.Error(err))
		}
		cancel()
	}
}

// leaseOp is a lease to write (add) or to remove.
type leaseOp struct {
	l   *Lease
	add bool
}

// remove removes leases from Redis in one round trip (in Cluster mode,
// one per provider).
func (w *writer) remove(ctx context.Context, leases []*Lease) error {
	ops := make([]leaseOp, len(leases))
	for i, l := range leases {
		ops[i] = leaseOp{l: l}
	}
	return w.write(ctx, ops)
}

// write writes and removes leases in one round trip (in Cluster mode,
// one per provider: a script touches one hash slot). The other nodes are
// told once per provider whose slots are capped and were freed, in the
// same script: no node waits for a slot of an unlimited provider.
func (w *writer) write(ctx context.Context, ops []leaseOp) error {
	if len(ops) == 0 {
		return nil
	}
	c := w.ls.c
	groups := [][]leaseOp{ops}
	if c.perSlot {
		byProvider := map[string]int{}
		groups = groups[:0]
		for _, op := range ops {
			i, ok := byProvider[op.l.provider]
			if !ok {
				i = len(groups)
				byProvider[op.l.provider] = i
				groups = append(groups, nil)
			}
			groups[i] = append(groups[i], op)
		}
	}
	ttl := time.Duration(c.cfg.LeaseTTL).Milliseconds()
	var errs []error
	for _, g := range groups {
		keys := make([]string, 0, len(g))
		args := make([]any, 0, 2+3*len(g))
		args = append(args, c.channel(), ttl)
		for _, op := range g {
			keys = append(keys, c.leaseKey(op.l.provider))
			kind, event := "0", ""
			if op.add {
				kind = "1"
			} else if op.l.limited {
				event = w.ls.news.of(op.l.provider).released
			}
			args = append(args, kind, op.l.member, event)
		}
		if err := leaseOpsScript.Run(ctx, c.rdb, keys, args...).Err(); err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return c.fail("write leases", err)
	}
	return nil
}
