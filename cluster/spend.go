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
func (sp *Spend) key(scope string, start time.Time) string {
	// The scope is the hash tag: a scope's windows share a slot.
	return sp.c.cfg.KeyPrefix + "spend:{" + scope + "}:" + strconv.FormatInt(start.Unix(), 10)
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

// Spend is the spend totals kept over every node: QueueSpend gathers the
// costs of the sessions ended here and a loop writes them together, off
// the clients' path; ReadSpend reads totals back.
type Spend struct {
	c *conn
	// mu guards what QueueSpend gathered since the last write (adds, by
	// key) and the loop's start.
	mu      sync.Mutex
	adds    map[string]*spendAdd
	started bool
	stop    chan struct{} // closed by close: the loop writes once more and ends
	done    chan struct{} // closed when the loop has ended
	// bad names the totals found unreadable (logged once each).
	bad sync.Map
}

func newSpend(c *conn) *Spend { return &Spend{c: c, stop: make(chan struct{})} }

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
func (sp *Spend) QueueSpend(windows []SpendWindow, cost float64, notify func(i int, total, added float64)) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.adds == nil {
		sp.adds = map[string]*spendAdd{}
	}
	for i, w := range windows {
		key := sp.key(w.Scope, w.Start)
		a := sp.adds[key]
		if a == nil {
			a = &spendAdd{expire: w.End.Add(w.End.Sub(w.Start)).UnixMilli()}
			sp.adds[key] = a
		}
		a.cost += cost
		if notify != nil {
			i := i
			a.notify = func(total, added float64) { notify(i, total, added) }
		}
	}
	if !sp.started {
		sp.started, sp.done = true, make(chan struct{})
		go sp.loop()
	}
}

// loop writes the queued costs until the store closes, then once more.
func (sp *Spend) loop() {
	defer close(sp.done)
	t := time.NewTicker(spendFlushEvery)
	defer t.Stop()
	for {
		select {
		case <-sp.stop:
			sp.flush()
			return
		case <-t.C:
			sp.flush()
		}
	}
}

// close ends the loop, once it has written what is left.
func (sp *Spend) close() {
	close(sp.stop)
	sp.mu.Lock()
	done := sp.done
	sp.mu.Unlock()
	if done != nil {
		<-done
	}
}

// flush writes the queued costs in one round trip (in Cluster mode, one
// per total).
func (sp *Spend) flush() {
	sp.mu.Lock()
	adds := sp.adds
	sp.adds = nil
	sp.mu.Unlock()
	if len(adds) == 0 {
		return
	}
	all := make([]string, 0, len(adds))
	for k := range adds {
		all = append(all, k)
	}
	groups := [][]string{all}
	if sp.c.perSlot {
		groups = groups[:0]
		for _, k := range all {
			groups = append(groups, []string{k})
		}
	}
	var failed []string
	for _, keys := range groups {
		if err := sp.flushGroup(keys, adds); err != nil {
			sp.c.log.Debug("shared state: spend not written; tried again", zap.Error(sp.c.fail("add spend", err)))
			failed = append(failed, keys...)
		}
	}
	if len(failed) == 0 {
		return
	}
	// Put back what was not written, before what came since.
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.adds == nil {
		sp.adds = map[string]*spendAdd{}
	}
	for _, k := range failed {
		a := adds[k]
		if cur := sp.adds[k]; cur != nil {
			cur.cost += a.cost
			if cur.notify == nil {
				cur.notify = a.notify
			}
		} else {
			sp.adds[k] = a
		}
	}
}

// flushGroup adds the pending costs of keys (one slot group) and tells
// each total's notify.
func (sp *Spend) flushGroup(keys []string, adds map[string]*spendAdd) error {
	args := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		a := adds[k]
		args = append(args, strconv.FormatFloat(a.cost, 'g', -1, 64), a.expire)
	}
	ctx, cancel := sp.c.ctx(context.Background())
	defer cancel()
	vals, err := spendScript.Run(ctx, sp.c.rdb, keys, args...).StringSlice()
	if err == nil && len(vals) != len(keys) {
		err = fmt.Errorf("unexpected reply %v", vals)
	}
	if err != nil {
		return err
	}
	for i, k := range keys {
		a := adds[k]
		total, ok := sp.total(k, vals[i])
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

// total reads the total v of key: a cost total is a finite number, not
// negative. Another value (a foreign or corrupted one: text, NaN, an
// infinity, a negative) is unreadable; the first one of each key is
// logged.
func (sp *Spend) total(key, v string) (float64, bool) {
	total, err := strconv.ParseFloat(v, 64)
	if err == nil && !math.IsNaN(total) && !math.IsInf(total, 0) && total >= 0 {
		return total, true
	}
	if _, seen := sp.bad.LoadOrStore(key, true); !seen {
		sp.c.log.Warn("shared state: a spend total in Redis is not a cost total; it is left unread",
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
// not a cost total: see total; a book never lowers the figure it
// holds for a window). In Cluster mode the reads are pipelined, one batch
// per node.
func (sp *Spend) ReadSpend(ctx context.Context, windows []SpendWindow) ([]float64, error) {
	if len(windows) == 0 {
		return nil, nil
	}
	ctx, cancel := sp.c.ctx(ctx)
	defer cancel()
	keys := make([]string, len(windows))
	for i, w := range windows {
		keys[i] = sp.key(w.Scope, w.Start)
	}
	vals, err := sp.readMany(ctx, keys)
	if err != nil {
		return nil, sp.c.fail("read spend totals", err)
	}
	out := make([]float64, len(windows))
	for i, v := range vals {
		if str, ok := v.(string); ok {
			out[i], _ = sp.total(keys[i], str)
		}
	}
	return out, nil
}

// readMany reads keys: one MGET, or in Cluster mode (where an MGET must
// stay in one slot) a pipeline of GETs. A missing key reads as nil.
func (sp *Spend) readMany(ctx context.Context, keys []string) ([]any, error) {
	if !sp.c.perSlot {
		return sp.c.rdb.MGet(ctx, keys...).Result()
	}
	pipe := sp.c.rdb.Pipeline()
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
