package pool

import "strconv"

// Handler keys: what tells the handlers of the gateway apart, so that
// what one handler made (a WebDriver session, a warm session) serves only
// that handler's clients. A handler's key is a hash of its configuration
// and its place among the handlers of its config load with the same
// configuration: two site blocks with the same browser_failover block get
// two keys, and a reload or another node with the same config gives each
// handler the key it had.

// handlerKeys counts, per config load, the handlers provisioned with each
// configuration hash.
type handlerKeys struct {
	byLoad map[any]map[string]int
}

// HandlerKey is the key of the next handler of config load load whose
// configuration hashes to sum: sum, then its place among the load's
// handlers with that hash ("-0" for the first). Handlers are provisioned
// in config order, so the same config gives the same keys.
func (r *Registry) HandlerKey(load any, sum string) string {
	r.handlersMu.Lock()
	defer r.handlersMu.Unlock()
	if r.handlers.byLoad == nil {
		r.handlers.byLoad = map[any]map[string]int{}
	}
	seen := r.handlers.byLoad[load]
	if seen == nil {
		seen = map[string]int{}
		r.handlers.byLoad[load] = seen
	}
	n := seen[sum]
	seen[sum] = n + 1
	return sum + "-" + strconv.Itoa(n)
}

// ForgetLoad drops what HandlerKey counted for load, once its handlers
// have been provisioned (a handler's Cleanup: the load is being replaced,
// or failed).
func (r *Registry) ForgetLoad(load any) {
	r.handlersMu.Lock()
	defer r.handlersMu.Unlock()
	delete(r.handlers.byLoad, load)
}
