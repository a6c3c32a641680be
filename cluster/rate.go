package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Rates are the providers' create_rate windows over every node: each
// provider's sessions started in its sliding window, kept in Redis so that
// all the nodes together start no more than the cap (see the package doc's
// data model). Each decision is one script in one round trip, on Redis'
// clock: taking a start, and giving one back.
type Rates struct {
	c    *conn
	news *News // for the event a start given back sends
}

// Start is the answer of Rates.Take.
type Start struct {
	// OK: the start was counted; the session may be started.
	OK bool
	// Wait is, when not OK, how long from now until the window admits a
	// start again (measured on Redis' clock; add it to this node's).
	Wait time.Duration
	// ID names the start counted (when OK), for GiveBack.
	ID string
}

// Take counts one start of a session at provider if fewer than n were
// counted, over every node, in the last window; else it tells how long
// until the oldest that stand in the way leave the window. Errors wrap
// ErrUnavailable.
func (r *Rates) Take(ctx context.Context, provider string, n int, window time.Duration) (Start, error) {
	c := r.c
	if provider == "" {
		return Start{}, errors.New("take a start: empty provider name")
	}
	if n < 1 || window < time.Millisecond {
		return Start{}, fmt.Errorf("take a start of provider %q: bad rate %d per %v", provider, n, window)
	}
	op := fmt.Sprintf("take a start of provider %q", provider)
	if c.closed.Load() {
		return Start{}, c.fail(op, errClosed)
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	member := c.node + "|" + hex.EncodeToString(b[:])
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	res, err := takeStartScript.Run(ctx, c.rdb, []string{c.startsKey(provider)}, n, window.Milliseconds(), member).Int64Slice()
	if err != nil {
		return Start{}, c.fail(op, err)
	}
	if len(res) != 2 {
		return Start{}, c.fail(op, fmt.Errorf("unexpected reply %v", res))
	}
	if res[0] == 1 {
		return Start{OK: true, ID: member}, nil
	}
	return Start{Wait: time.Duration(max(res[1], 1)) * time.Millisecond}, nil
}

// GiveBack takes the start id (a Start.ID of Take) out of provider's
// window, as if never counted: the provider started nothing for it. When
// it was still in the window, the nodes hear EventReleased: a client
// waiting for a start may take it. A start that already left the window,
// or was given back before, changes nothing. Errors wrap ErrUnavailable;
// the start then leaves the window in its time.
func (r *Rates) GiveBack(ctx context.Context, provider, id string) error {
	c := r.c
	if provider == "" || id == "" {
		return errors.New("give a start back: empty provider name or start")
	}
	op := fmt.Sprintf("give back a start of provider %q", provider)
	if c.closed.Load() {
		return c.fail(op, errClosed)
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	err := giveBackStartScript.Run(ctx, c.rdb, []string{c.startsKey(provider)}, id, c.channel(), r.news.of(provider).released).Err()
	if err != nil {
		return c.fail(op, err)
	}
	return nil
}

// startsKey is the sorted set of a provider's starts in its window.
func (c *conn) startsKey(provider string) string { return c.providerKey(provider, "starts") }

// takeStartScript drops the starts that left the window (a start counts
// until window after it), and counts a new one when fewer than n remain.
//
// KEYS[1] the provider's starts (members node|id, scored by the start's
// time in Unix milliseconds of Redis' clock).
// ARGV[1] n, ARGV[2] window ms, ARGV[3] the new start's member.
//
// Returns {1, 0} when counted, or {0, ms until the window admits a start}:
// until the start that would have to leave last for the count to fall
// below n leaves. The key expires with its newest start.
var takeStartScript = redis.NewScript(luaNow + `
local n, window = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
if count < n then
  redis.call('ZADD', KEYS[1], now, ARGV[3])
  redis.call('PEXPIRE', KEYS[1], window)
  return {1, 0}
end
local stand = redis.call('ZRANGE', KEYS[1], count - n, count - n, 'WITHSCORES')
return {0, tonumber(stand[2]) + window - now}
`)

// giveBackStartScript removes one start from a provider's window and,
// when it was there, announces the room it leaves.
//
// KEYS[1] the provider's starts. ARGV[1] the start's member, ARGV[2] the
// events channel, ARGV[3] the released event.
//
// Returns 1 when the start was removed, 0 when it was not in the window.
var giveBackStartScript = redis.NewScript(`
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
if removed == 1 then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return removed
`)
