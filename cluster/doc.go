// Package cluster owns the state that several gateway nodes sharing one
// provider account must agree on, kept in one Redis server: the live-session
// slots of every provider (so max_concurrent is exact across nodes) and the
// failure cooldown of every provider (so a cooldown started by one node is
// honoured by all). It is the Redis side only; the handler decides when to
// ask it and what to do when it is unavailable.
//
// # Sharing a Store
//
// A process opens one Store per distinct settings and node name, kept in a
// caddy.UsagePool: Use adds a user (a handler, on Provision), Retain adds
// another (a live session holding one of its leases), and Release gives a
// use back; the last one closes the Store. So a config reload that keeps
// the settings keeps the Store, its leases and their renewals. The Shared
// value Use returns also tracks whether Redis answers, so that callers skip
// it for a moment after a failure instead of each waiting for its timeout,
// and it serves a provider's cluster-wide status (pool.ClusterView).
//
// # Data model
//
// Every key lives under Config.KeyPrefix (default "browser_failover:"):
//
//   - <prefix>lease:<provider> is a sorted set of the provider's live
//     leases. A member is node + "|" + a random lease id; its score is the
//     lease's expiry in Unix milliseconds, taken from Redis' own clock (TIME)
//     inside the scripts, so the clocks of the nodes do not matter. A lease
//     whose score has passed is dead and is dropped by the next script that
//     touches the set, which then announces the freed slots. The key itself
//     expires one LeaseTTL after its last lease.
//   - <prefix>cooldown:<provider> is a hash {until, streak}: the end of the
//     shared cooldown in Unix milliseconds and its doubling count. The key
//     expires at until (PEXPIREAT), so an ended cooldown leaves nothing.
//   - <prefix>events is the pub/sub channel of Event notifications, as JSON.
//
// Every decision is taken by one Lua script in one round trip, so there is
// no read-then-write race between nodes. Keys of several providers may be
// touched by one script, so the Redis must be a single server (standalone,
// or a primary behind Sentinel or a proxy), not a Redis Cluster.
//
// # Leases
//
// Acquire takes a slot as a lease valid for Config.LeaseTTL. The Store
// renews every lease it holds about every LeaseTTL/3 in one round trip; a
// lease found missing at renewal (it expired during a Redis outage, or Redis
// restarted empty) is put back, since its session is still alive, even if
// that briefly puts the provider above its max. A node that dies stops
// renewing, and its slots free themselves within one LeaseTTL.
//
// # Failures
//
// Every Redis call is bounded by Config.Timeout and is never retried
// blindly; every error that comes from Redis (network, timeout,
// authentication, script) wraps ErrUnavailable. No error carries the
// password.
package cluster
