// Package cluster owns the state that several gateway nodes sharing one
// provider account must agree on, kept in one Redis server: the live-session
// slots of every provider (so max_concurrent is exact across nodes), the
// failure cooldown and the 408/429 skip of every provider (so what one node
// learnt is honoured by all, each as what it is), and the deployment's
// secrets that every node must share. It is the Redis side only; the
// handler decides when to ask it and what to do when it is unavailable.
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
// tells how Redis fares through Config.Hooks, and reads the providers'
// cluster-wide state for the status as plain data (ProviderState).
//
// The package depends on nothing else of the gateway: the gateway gives
// it what it needs (a Clock, Hooks) and builds what it shows from what it
// returns.
//
// # The parts of a Store
//
// A Store is a few values, each with its own state and locks, which Open
// builds and Close ends in order:
//
//   - the connection (conn.go): the Redis client of the mode in use (one
//     server, a Sentinel-managed master or a Redis Cluster), the master
//     in use and the failovers followed, the stale mark left by a failed
//     call or a change of master, the timeout that bounds every call and
//     the error it fails with (errors.go), the keys' names, and the hook
//     told of the background calls' failures. What needs nothing more is
//     the Store's own: the resumable sessions (resume.go) and the shared
//     secret (secret.go).
//   - Leases (Store.Leases, lease.go): taking slots (Acquire, Register)
//     and giving them back (Lease.Release), the live counts (Live,
//     Snapshot); with the background writer that gathers lease writes
//     and releases into one script call (writer.go), the spare slots kept
//     for this node's next connect and the other nodes' "wanted"
//     (spares.go), and the renewals, which also put the leases back after
//     an outage or a failover (renew.go).
//   - News (Store.News, news.go, events.go, cooldown.go): the
//     subscriptions to the events channel, the catch-up on the holds in
//     force when one comes up, whether this node hears the news
//     (Hearing), the events' encoding, and the providers' shared
//     cooldowns and skips, set, read and cleared with their announcements.
//   - Spend (Store.Spend, spend.go): the costs gathered and written
//     together, and the totals read back.
//   - LedgerStore (Store.Ledger, ledger.go, ledger_legacy.go): the
//     storage of the ledger of created sessions, its locks, and the reader
//     of the layout of older versions.
//   - Routes (Store.Routes, webdriver.go): where each WebDriver session
//     lives (its provider, the provider's session ID and socket URLs,
//     its owner node; never a credential), so that any node serves its
//     commands and sockets, and its last activity, written at most once
//     a second per session and read back as how long it has been idle;
//     with the announcements of a WebDriver session's end (to its owner,
//     and by its owner).
//   - Rates (Store.Rates, rate.go): each provider's create_rate window,
//     the sessions started in it over every node, counted and checked in
//     one script.
//
// Close stops taking leases and ends the renewals, waits for the last
// spend write, gives the held leases back, waits for the calls in flight,
// ends the subscriptions, and only then closes the client.
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
//   - <prefix>cooldown:<provider> is a hash {until, streak, skip}: the end
//     of the shared failure cooldown and its doubling count, and the end of
//     the shared 408/429 skip, in Unix milliseconds of Redis' clock. The
//     key expires at the later end (PEXPIREAT), so what ended leaves
//     nothing.
//   - <prefix>{<provider>}:starts is a sorted set of the sessions the
//     nodes started at the provider in its create_rate window: a member is
//     node + "|" + a random id, its score the start's time in Unix
//     milliseconds of Redis' clock. A start is dropped by the next script
//     once a window has passed since it; the key expires one window after
//     its newest start.
//   - <prefix>secret:<name> holds a secret every node uses alike (the
//     client key secret), hex encoded, set once by the first node.
//   - <prefix>wd:{<id>} is a hash {route, at} of the WebDriver session
//     id (the gateway's ID, the key's hash tag): its Route as JSON (at
//     most 8 KiB, checked again when read) and its last activity in Unix
//     milliseconds of Redis' clock. The key expires one ttl after the
//     last write.
//   - <prefix>events is the pub/sub channel of Event notifications, as JSON.
//
// # Clocks
//
// Every deadline kept in Redis is on Redis' clock (TIME, read inside the
// scripts). A node never sends a time of its own clock: it sends how long
// a cooldown or skip lasts from now, and reads back how long is left,
// which it adds to its own clock (Config.Clock). Events carry the length
// too, and a WebDriver session's activity is read back as how long it has
// been idle. So nodes whose clocks disagree keep the same lengths, and
// nothing is dropped as already past.
//
// Every decision is taken by one Lua script in one round trip, so there is
// no read-then-write race between nodes. A script may touch the keys of
// several providers on a single server or a Sentinel-managed master; in a
// Redis Cluster, where a script keeps to one hash slot, a call over
// several providers runs one script per provider.
//
// # Leases
//
// Acquire takes a slot as a lease valid for Config.LeaseTTL. The Store
// renews every lease it holds about every LeaseTTL/3 in one round trip,
// which also drops the dead leases of the providers it watches and counts
// their live leases (Live); a lease found missing at renewal (it expired
// during a Redis outage or while this node was cut off, or Redis restarted
// empty) is put back, since its session is still alive, even if that puts
// the provider above its max: Acquire then grants nothing until the live
// leases are below max again. A node that dies stops renewing, and its
// slots free themselves within one LeaseTTL.
//
// # Failures
//
// Every Redis call is bounded by Config.Timeout and is never retried
// blindly; every error that comes from Redis (network, timeout,
// authentication, script) wraps ErrUnavailable. No error carries the
// password.
package cluster
