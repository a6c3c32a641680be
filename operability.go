package browserfailover

import (
	"github.com/browserfailover/caddy-browser-failover/observe"
)

// observeWait measures the client's time in the wait queue, if it queued.
// It is called once per client, where its wait ends: when its session
// starts, when it is answered without one, or when it leaves.
func (c *connect) observeWait() {
	switch {
	case c.waiter != nil:
		observe.QueueWait(c.sinceJoined())
	case c.quotaWaited > 0:
		observe.QueueWait(c.quotaWaited)
	}
}
