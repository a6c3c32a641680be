package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// conn is a Store's connection to Redis, which every part of the Store
// talks through: the client, how it reaches Redis (the mode, and whether
// a script must keep to one hash slot), the master in use and the
// failovers followed, the stale mark that has the leases put back before
// the next admission, and what every call goes through (its timeout, its
// error, the keys' names).
type conn struct {
	cfg  Config
	node string
	rdb  redis.UniversalClient
	log  *zap.Logger
	// mode is cfg.Mode(); perSlot is set in Cluster mode, where a script
	// may only touch the keys of one hash slot: calls over several
	// providers go one slot group (one provider) at a time.
	mode    string
	perSlot bool
	// master is the address of the server in use (Sentinel: the master
	// last dialled); failovers counts the changes of it.
	master     atomic.Pointer[string]
	failovers  atomic.Int64
	onFailover func() // set before the first call; may be nil
	// onFailed is told of the failures of the store's own background
	// calls (renewals, lease writes), with a fixed word for the op (see
	// Shared.Failed); nil until set.
	onFailed atomic.Pointer[func(op string, err error)]
	// stale is set when a call failed or the master changed: before the
	// next admission, the held leases are put back (Leases.reassert).
	stale atomic.Bool
	// closed is set when the Store's Close begins: calls fail from then
	// on.
	closed atomic.Bool
	// libLog receives the Redis library's own messages (see liblog.go).
	libLog *zap.Logger
}

// errClosed is the cause of calls made after Close.
var errClosed = errors.New("store closed")

// newConn builds the client for cfg (validated, with its defaults), tc
// its TLS settings (nil: none), and node. It does no network I/O: the
// first call connects.
func newConn(cfg Config, node string, tc *tls.Config, onFailover func()) *conn {
	c := &conn{
		cfg:        cfg,
		node:       node,
		log:        cfg.Logger.With(zap.String("node", node)),
		mode:       cfg.Mode(),
		onFailover: onFailover,
	}
	switch c.mode {
	case ModeSentinel:
		c.rdb = redis.NewFailoverClient(cfg.failoverOptions(tc, c.dialed))
	case ModeCluster:
		c.perSlot = true
		seeds := strings.Join(cfg.Cluster, ",")
		c.master.Store(&seeds)
		c.rdb = redis.NewClusterClient(cfg.clusterOptions(tc))
	default:
		addr := cfg.Address
		c.master.Store(&addr)
		c.rdb = redis.NewClient(cfg.options(tc))
	}
	c.libLog = routeLibraryLog(cfg.Logger)
	return c
}

// dialed notes the server a new connection goes to (Sentinel mode: the
// master the sentinels name). A change of it is a failover followed: the
// held leases are put back before the next admission, since the new
// master may lack writes that were never replicated to it.
func (c *conn) dialed(addr string) {
	old := c.master.Swap(&addr)
	if old == nil || *old == addr {
		return
	}
	c.failovers.Add(1)
	c.stale.Store(true)
	c.log.Info("shared state: following a new master", zap.String("mode", c.mode), zap.String("address", addr))
	if c.onFailover != nil {
		c.onFailover()
	}
}

// address is the server in use (see Store.Address).
func (c *conn) address() string {
	if p := c.master.Load(); p != nil {
		return *p
	}
	return ""
}

// ctx bounds a call by Timeout.
func (c *conn) ctx(parent context.Context) (context.Context, context.CancelFunc) {
	if parent == nil {
		parent = context.Background()
	}
	return context.WithTimeout(parent, time.Duration(c.cfg.Timeout))
}

// backgroundFailed tells onFailed of a background call's failure.
func (c *conn) backgroundFailed(op string, err error) {
	if fn := c.onFailed.Load(); fn != nil {
		(*fn)(op, err)
	}
}

// now reads this node's clock (Config.Clock).
func (c *conn) now() time.Time {
	if c.cfg.Clock != nil {
		return c.cfg.Clock.Now()
	}
	return time.Now()
}

// Keys and channel.

// A provider's keys carry its name as a hash tag ({name}), so that the
// scripts touching its lease set, cooldown and learnt cap together run in
// one hash slot of a Redis Cluster. Whatever the name holds, the three
// keys begin with the same prefix + "{" + name + "}", so they share their
// slot.

func (c *conn) providerKey(provider, kind string) string {
	return c.cfg.KeyPrefix + "{" + provider + "}:" + kind
}
func (c *conn) leaseKey(provider string) string    { return c.providerKey(provider, "lease") }
func (c *conn) cooldownKey(provider string) string { return c.providerKey(provider, "cooldown") }
func (c *conn) capKey(provider string) string      { return c.providerKey(provider, "cap") }
func (c *conn) channel() string                    { return c.cfg.KeyPrefix + "events" }

// slotGroups splits providers into the groups a script may touch
// together: all of them, or in Cluster mode one each.
func (c *conn) slotGroups(providers []string) [][]string {
	if !c.perSlot {
		return [][]string{providers}
	}
	out := make([][]string, len(providers))
	for i, p := range providers {
		out[i] = []string{p}
	}
	return out
}

// ping checks, within ctx, that the Redis server answers.
func (c *conn) ping(ctx context.Context) error {
	const op = "ping the shared state"
	if c.closed.Load() {
		return c.fail(op, errClosed)
	}
	if cc, ok := c.rdb.(*redis.ClusterClient); ok && c.stale.Load() {
		// After a failed call the slot map may be out of date (a master
		// replaced by its replica): read it again, rather than wait for
		// the client's own refresh.
		cc.ReloadState(ctx)
	}
	if err := c.rdb.Ping(ctx).Err(); err != nil {
		return c.fail(op, err)
	}
	return nil
}

// close closes the client; the Store's parts have stopped using it.
func (c *conn) close() error {
	err := c.rdb.Close()
	unrouteLibraryLog(c.libLog)
	return err
}
