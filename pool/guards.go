package pool

import "github.com/caddyserver/caddy/v2"

// Interface guards: a Provider is a value of the process-wide UsagePool
// (its Destruct runs when no config uses the name any more), and it passes
// the wake-ups it is given on to the queues waiting on it.
var (
	_ caddy.Destructor = (*Provider)(nil)
	_ Waker            = (*Provider)(nil)
)
