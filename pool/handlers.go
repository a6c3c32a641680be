package pool

import (
	"strconv"
	"sync"
)

// Handler keys: what tells the handlers of the gateway apart, so that
// what one handler made (a WebDriver session, a warm session) serves only
// that handler's clients. A handler's key is a hash of its configuration
// and its place among the handlers of its config load with the same
// configuration: two site blocks with the same browser_failover block get
// two keys, and a reload or another node with the same config gives each
// handler the key it had.

// Handlers are the handlers of the gateway as the registry knows them:
// the keys given per config load (Key), and the live handlers with the
// successors of those a reload replaced (succession.go), to whom the live
// sessions bound to a retired key move.
type Handlers struct {
	sessions *LiveSessions

	mu         sync.Mutex
	keys       handlerKeys
	succession succession
}

func newHandlers(sessions *LiveSessions) *Handlers { return &Handlers{sessions: sessions} }

// handlerKeys counts, per config load, the handlers provisioned with each
// configuration hash.
type handlerKeys struct {
	byLoad map[any]map[string]int
}

// Key is the key of the next handler of config load load whose
// configuration hashes to sum: sum, then its place among the load's
// handlers with that hash ("-0" for the first). Handlers are provisioned
// in config order, so the same config gives the same keys.
func (h *Handlers) Key(load any, sum string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.keys.byLoad == nil {
		h.keys.byLoad = map[any]map[string]int{}
	}
	seen := h.keys.byLoad[load]
	if seen == nil {
		seen = map[string]int{}
		h.keys.byLoad[load] = seen
	}
	n := seen[sum]
	seen[sum] = n + 1
	return sum + "-" + strconv.Itoa(n)
}

// ForgetLoad drops what Key counted for load, once its handlers have been
// provisioned (a handler's Cleanup: the load is being replaced, or
// failed).
func (h *Handlers) ForgetLoad(load any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.keys.byLoad, load)
}
