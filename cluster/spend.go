package cluster

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// Spend totals: what the sessions of one provider, or of one client key,
// cost in one calendar window, summed over every node. A session's cost
// is added once, by the node it ran on, when it ends; each key lives one
// window past its own. Client keys are named by their shown (hashed)
// form, never by their value.

// spendKey is the total of scope ("provider:<name>" or "client:<shown
// key>") for the window starting at start.
func (s *Store) spendKey(scope string, start time.Time) string {
	return s.cfg.KeyPrefix + "spend:" + scope + ":" + strconv.FormatInt(start.Unix(), 10)
}

// ProviderScope is the spend scope of a provider.
func ProviderScope(name string) string { return "provider:" + name }

// ClientScope is the spend scope of a client key, by its shown form.
func ClientScope(shown string) string { return "client:" + shown }

// AddSpend adds cost to scope's total for the window [start, end) and
// returns the new total.
func (s *Store) AddSpend(ctx context.Context, scope string, start, end time.Time, cost float64) (float64, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	expire := end.Add(end.Sub(start)).UnixMilli()
	v, err := spendScript.Run(ctx, s.rdb, []string{s.spendKey(scope, start)},
		strconv.FormatFloat(cost, 'g', -1, 64), expire).Text()
	if err != nil {
		return 0, s.fail(fmt.Sprintf("add the spend of %s", scope), err)
	}
	return strconv.ParseFloat(v, 64)
}

// SpendWindow names one scope's window for ReadSpend.
type SpendWindow struct {
	Scope string
	Start time.Time
}

// ReadSpend reads the totals of windows in one round trip, in their
// order (0 for a window nothing was added to).
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
	vals, err := s.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, s.fail("read spend totals", err)
	}
	out := make([]float64, len(windows))
	for i, v := range vals {
		if str, ok := v.(string); ok {
			out[i], _ = strconv.ParseFloat(str, 64)
		}
	}
	return out, nil
}
