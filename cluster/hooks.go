package cluster

// Hooks are told how the process's shared state fares, so that the gateway
// can show it (the shared_state_up gauge, shared_state_errors_total)
// without this package knowing of metrics. A nil field is not called. They
// are called on the goroutine of the call that found out, so they must be
// quick and safe for concurrent use.
type Hooks struct {
	// Opened is called when Use opens a store, and Closed when its last
	// user has let go of it.
	Opened, Closed func()
	// Up is called with true when a store is opened and after every call
	// that reached it, and with false when a call could not reach it
	// while it was thought up.
	Up func(up bool)
	// Failed is called for every call that could not reach a store, with
	// the operation's fixed word (acquire, publish, status, ping, reset).
	Failed func(op string)
	// Failover is called for each change of master a store follows (a
	// Sentinel promoting a replica), not for the first discovery.
	Failover func()
	// Reasserted is called, on its own goroutine, once a store that
	// failed a call or changed master has put this node's leases back:
	// the gateway then writes again what else it keeps there (its
	// ledger), which the new master may have lost.
	Reasserted func()
}

func (h Hooks) reasserted() {
	if h.Reasserted != nil {
		go h.Reasserted()
	}
}

func (h Hooks) opened() {
	if h.Opened != nil {
		h.Opened()
	}
}

func (h Hooks) closed() {
	if h.Closed != nil {
		h.Closed()
	}
}

func (h Hooks) up(up bool) {
	if h.Up != nil {
		h.Up(up)
	}
}

func (h Hooks) failed(op string) {
	if h.Failed != nil {
		h.Failed(op)
	}
}

func (h Hooks) failover() {
	if h.Failover != nil {
		h.Failover()
	}
}
