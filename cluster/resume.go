package cluster

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// Resumable sessions shared by every node: a session that ended from its
// client's side is kept under <prefix>resume:<id>:<key> for its resume
// window (PX), where id is the caller's key of the session (a keyed hash
// of its resume token: never the token, and never anything an operator
// could present) and key the hashed resume key it is bound to ("-" for
// none), so a resume with another key finds nothing and leaves the entry
// for its owner. The value is the caller's (the provider and where its
// browser was dialled, without the provider's secrets), opaque here.
// Taking one is one script: read, remaining time and delete at once, so
// each parked session is resumed at most once across nodes.

func (c *conn) resumeKey(id, key string) string {
	if key == "" {
		key = "-"
	}
	return c.cfg.KeyPrefix + "resume:" + id + ":" + key
}

// ParkResume keeps value for id under key for window. Errors wrap
// ErrUnavailable.
func (s *Store) ParkResume(ctx context.Context, id, key string, value []byte, window time.Duration) error {
	c := s.c
	const op = "park a resumable session"
	if c.closed.Load() {
		return c.fail(op, errClosed)
	}
	if window <= 0 {
		return nil
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	if err := c.rdb.Set(ctx, c.resumeKey(id, key), value, window).Err(); err != nil {
		return c.fail(op, err)
	}
	return nil
}

// ClaimResume takes the entry of id under key: its value and how long its
// window had left. ok is false when there is none (unknown, over, taken
// by another node, or bound to another key). Errors wrap ErrUnavailable.
func (s *Store) ClaimResume(ctx context.Context, id, key string) (value []byte, left time.Duration, ok bool, err error) {
	c := s.c
	const op = "claim a resumable session"
	if c.closed.Load() {
		return nil, 0, false, c.fail(op, errClosed)
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	res, err := claimResumeScript.Run(ctx, c.rdb, []string{c.resumeKey(id, key)}).Slice()
	if errors.Is(err, redis.Nil) {
		return nil, 0, false, nil
	}
	if err != nil {
		return nil, 0, false, c.fail(op, err)
	}
	if len(res) != 2 {
		return nil, 0, false, c.fail(op, errors.New("unexpected answer"))
	}
	v, _ := res[0].(string)
	ms, _ := res[1].(int64)
	if ms <= 0 {
		return nil, 0, false, nil
	}
	return []byte(v), time.Duration(ms) * time.Millisecond, true, nil
}

// AnnounceResumed tells every node's subscribers that the parked session
// id of provider was taken back or ended here (EventResumed), so that the
// node that parked it forgets it. Errors wrap ErrUnavailable.
func (n *News) AnnounceResumed(ctx context.Context, provider, id string) error {
	return n.publish(ctx, "announce a resumed session", wireEvent{Kind: EventResumed, Provider: provider, Node: n.c.node, Session: id})
}

// DropResume deletes the entry of id under key, if any (resumed or ended
// on this node). Errors wrap ErrUnavailable.
func (s *Store) DropResume(ctx context.Context, id, key string) error {
	c := s.c
	const op = "drop a resumable session"
	if c.closed.Load() {
		return c.fail(op, errClosed)
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	if err := c.rdb.Del(ctx, c.resumeKey(id, key)).Err(); err != nil {
		return c.fail(op, err)
	}
	return nil
}

// claimResumeScript returns {value, pttl} of KEYS[1] and deletes it, or
// nil when it does not exist.
var claimResumeScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return false end
local t = redis.call('PTTL', KEYS[1])
redis.call('DEL', KEYS[1])
return {v, t}
`)
