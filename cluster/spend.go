package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Spend totals: what the sessions of one provider, or of one client key,
// cost in one calendar window, summed over every node. A session's cost
// is added once, by the node it ran on, when it ends; each key lives one
// window past its own. Client keys are named by their shown (hashed)
// form, never by their value.

// spendKey is the total of scope ("provider:<name>" or "client:<shown
// key>") for the window starting at start.
func (s *Store) spendKey(scope string, start time.Time) string {
	// The scope is the hash tag: a scope's windows share a slot.
	return s.cfg.KeyPrefix + "spend:{" + scope + "}:" + strconv.FormatInt(start.Unix(), 10)
}

// ProviderScope is the spend scope of a provider.
func ProviderScope(name string) string { return "provider:" + name }

// ClientScope is the spend scope of a client key's book, by a name that
// never holds the key's value (its shown form, with its period and a
// digest of its key template).
func ClientScope(shown string) string { return "client:" + shown }

// spendFlushEvery is how often the costs queued by QueueSpend are
// written, all in one round trip.
const spendFlushEvery = 250 * time.Millisecond

// spendBatch is what QueueSpend gathered since the last write, by key.
type spendBatch struct {
	mu      sync.Mutex
	adds    map[string]*spendAdd
	started bool
	done    chan struct{} // closed when the flush loop has ended
}

// spendAdd is one total's pending increment.
type spendAdd struct {
	cost   float64
	expire int64 // Unix ms
	// notify is told the total once written, with what this write
	// added.
	notify func(total, added float64)
}

// QueueSpend adds cost to the totals of windows (each [Start, End) of
// its Scope): the costs are gathered and written together about every
// 250 ms, off the client's path, and notify (when not nil) is told each
// window's new total with what the write added (i is the window's index
// in windows). A write that fails is tried again with the next; Close
// writes what is left, once.
func (s *Store) QueueSpend(windows []SpendWindow, cost float64, notify func(i int, total, added float64)) {
	b := &s.spend
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.adds == nil {
		b.adds = map[string]*spendAdd{}
	}
	for i, w := range windows {
		key := s.spendKey(w.Scope, w.Start)
		a := b.adds[key]
		if a == nil {
			a = &spendAdd{expire: w.End.Add(w.End.Sub(w.Start)).UnixMilli()}
			b.adds[key] = a
		}
		a.cost += cost
		if notify != nil {
			i := i
			a.notify = func(total, added float64) { notify(i, total, added) }
		}
	}
	if !b.started {
		b.started, b.done = true, make(chan struct{})
		go s.spendLoop()
	}
}

// spendLoop writes the queued costs until the store closes, then once
// more.
func (s *Store) spendLoop() {
	defer close(s.spend.done)
	t := time.NewTicker(spendFlushEvery)
	defer t.Stop()
	for {
		select {
		case <-s.renewStop:
			s.flushSpend()
			return
		case <-t.C:
			s.flushSpend()
		}
	}
}

// flushSpend writes the queued costs in one round trip (in Cluster mode,
// one per total).
func (s *Store) flushSpend() {
	b := &s.spend
	b.mu.Lock()
	adds := b.adds
	b.adds = nil
	b.mu.Unlock()
	if len(adds) == 0 {
		return
	}
	all := make([]string, 0, len(adds))
	for k := range adds {
		all = append(all, k)
	}
	groups := [][]string{all}
	if s.perSlot {
		groups = groups[:0]
		for _, k := range all {
			groups = append(groups, []string{k})
		}
	}
	var failed []string
	for _, keys := range groups {
		if err := s.flushSpendGroup(keys, adds); err != nil {
			s.log.Debug("shared state: spend not written; tried again", zap.Error(s.fail("add spend", err)))
			failed = append(failed, keys...)
		}
	}
	if len(failed) == 0 {
		return
	}
	// Put back what was not written, before what came since.
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.adds == nil {
		b.adds = map[string]*spendAdd{}
	}
	for _, k := range failed {
		a := adds[k]
		if cur := b.adds[k]; cur != nil {
			cur.cost += a.cost
			if cur.notify == nil {
				cur.notify = a.notify
			}
		} else {
			b.adds[k] = a
		}
	}
}

// flushSpendGroup adds the pending costs of keys (one slot group) and
// tells each total's notify.
func (s *Store) flushSpendGroup(keys []string, adds map[string]*spendAdd) error {
	args := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		a := adds[k]
		args = append(args, strconv.FormatFloat(a.cost, 'g', -1, 64), a.expire)
	}
	ctx, cancel := s.ctx(context.Background())
	defer cancel()
	vals, err := spendScript.Run(ctx, s.rdb, keys, args...).StringSlice()
	if err == nil && len(vals) != len(keys) {
		err = fmt.Errorf("unexpected reply %v", vals)
	}
	if err != nil {
		return err
	}
	for i, k := range keys {
		a := adds[k]
		total, ok := s.spendTotal(k, vals[i])
		if !ok {
			// Not counted in a total anyone can read: the cost stays
			// this node's own in its book (no notify).
			continue
		}
		if a.notify != nil {
			a.notify(total, a.cost)
		}
	}
	return nil
}

// spendTotal reads the total v of key: a cost total is a finite number,
// not negative. Another value (a foreign or corrupted one: text, NaN, an
// infinity, a negative) is unreadable; the first one of each key is
// logged.
func (s *Store) spendTotal(key, v string) (float64, bool) {
	total, err := strconv.ParseFloat(v, 64)
	if err == nil && !math.IsNaN(total) && !math.IsInf(total, 0) && total >= 0 {
		return total, true
	}
	if _, seen := s.badSpend.LoadOrStore(key, true); !seen {
		s.log.Warn("shared state: a spend total in Redis is not a cost total; it is left unread",
			zap.String("key", key), zap.Int("length", len(v)))
	}
	return 0, false
}

// SpendWindow names one scope's window: its start, and its end (for
// AddSpend, which keeps the total one window past it).
type SpendWindow struct {
	Scope      string
	Start, End time.Time
}

// ReadSpend reads the totals of windows in one round trip, in their
// order (0 for a window nothing was added to, and for one whose value is
// not a cost total: see spendTotal; a book never lowers the figure it
// holds for a window). In Cluster mode the reads are pipelined, one batch
// per node.
func (s *Store) ReadSpend(ctx context.Context, windows []SpendWindow) ([]float64, error) {
	if len(windows) == 0 {
		return nil, nil
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	keys := make([]string, len(windows))
	for i, w := range windows {
		keys[i] = s.spendKey(w.Scope, w.Start)
	}
	vals, err := s.readMany(ctx, keys)
	if err != nil {
		return nil, s.fail("read spend totals", err)
	}
	out := make([]float64, len(windows))
	for i, v := range vals {
		if str, ok := v.(string); ok {
			out[i], _ = s.spendTotal(keys[i], str)
		}
	}
	return out, nil
}

// readMany reads keys: one MGET, or in Cluster mode (where an MGET must
// stay in one slot) a pipeline of GETs. A missing key reads as nil.
func (s *Store) readMany(ctx context.Context, keys []string) ([]any, error) {
	if !s.perSlot {
		return s.rdb.MGet(ctx, keys...).Result()
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.Get(ctx, k)
	}
	_, _ = pipe.Exec(ctx) // each command's error is read below
	out := make([]any, len(keys))
	for i, c := range cmds {
		v, err := c.Result()
		switch {
		case err == nil:
			out[i] = v
		case !errors.Is(err, redis.Nil):
			return nil, err
		}
	}
	return out, nil
}
