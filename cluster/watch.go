package cluster

import "sync"

// watchList is the providers this node has asked for a slot of or
// watches (Leases.Watch): the renewals drop their dead leases and count
// their live ones, and a subscription that comes up catches up on their
// holds. Leases and News share it.
type watchList struct {
	mu  sync.Mutex
	set map[string]struct{}
}

// add watches the providers named (an empty name is none).
func (w *watchList) add(providers ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range providers {
		if p != "" {
			w.set[p] = struct{}{}
		}
	}
}

// remove stops watching the providers named.
func (w *watchList) remove(providers ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range providers {
		delete(w.set, p)
	}
}

// list returns the providers watched, in no order.
func (w *watchList) list() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.set))
	for p := range w.set {
		out = append(out, p)
	}
	return out
}
