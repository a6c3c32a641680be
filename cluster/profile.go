package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Profiles are the browser profiles in use over every node: one session
// uses a profile at a time, wherever it runs. A profile in use is a lock in
// Redis, a key holding the member (node + "|" + a random id) of the node
// whose session uses it, expiring LeaseTTL after its last renewal; this
// node renews its locks about every LeaseTTL/3, so the locks of a node
// that died free themselves within LeaseTTL. A lock given back announces
// EventProfileFree, so a node whose client waits for that profile tries
// again at once. The key names the profile only by its scope's hash and
// its ID: nothing of the profile's content is ever in Redis. Each
// decision is one script in one round trip.
type Profiles struct {
	c *conn

	mu   sync.Mutex
	held map[*ProfileLock]struct{}

	stopped chan struct{}
	once    sync.Once
	done    chan struct{}
}

func newProfiles(c *conn) *Profiles {
	return &Profiles{c: c, held: map[*ProfileLock]struct{}{}, stopped: make(chan struct{}), done: make(chan struct{})}
}

// ProfileLock is one profile in use by this node.
type ProfileLock struct {
	p      *Profiles
	name   string
	member string
	once   sync.Once
}

// ValidProfileName reports whether name may name a profile's lock: 1 to
// 128 of letters, digits, '.', '_', '-' and '/' (its scope, a slash, its
// ID).
func ValidProfileName(name string) bool {
	if name == "" || len(name) > 128 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == '/') {
			return false
		}
	}
	return true
}

// profileKey is the lock of profile name; the name is its hash tag.
func (c *conn) profileKey(name string) string { return c.cfg.KeyPrefix + "profile:{" + name + "}" }

// Take takes the lock of profile name (its scope and ID, as the caller
// names it) for this node: ok false when another node's session uses it.
// Errors wrap ErrUnavailable.
func (p *Profiles) Take(ctx context.Context, name string) (l *ProfileLock, ok bool, err error) {
	c := p.c
	if !ValidProfileName(name) {
		return nil, false, fmt.Errorf("take profile lock: %q is not a profile name", name)
	}
	op := "take the lock of a profile"
	if c.closed.Load() {
		return nil, false, c.fail(op, errClosed)
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	l = &ProfileLock{p: p, name: name, member: c.node + "|" + hex.EncodeToString(b[:])}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	n, err := takeProfileScript.Run(ctx, c.rdb, []string{c.profileKey(name)}, l.member, time.Duration(c.cfg.LeaseTTL).Milliseconds()).Int64()
	if err != nil {
		return nil, false, c.fail(op, err)
	}
	if n != 1 {
		return nil, false, nil
	}
	p.mu.Lock()
	p.held[l] = struct{}{}
	p.mu.Unlock()
	return l, true, nil
}

// Release gives the lock back and announces EventProfileFree. It is
// idempotent; with Redis down the lock simply expires within LeaseTTL.
func (l *ProfileLock) Release() {
	if l != nil && !l.p.c.closed.Load() {
		l.giveBack()
	}
}

// giveBack gives the lock back, once.
func (l *ProfileLock) giveBack() {
	l.once.Do(func() {
		p, c := l.p, l.p.c
		p.mu.Lock()
		delete(p.held, l)
		p.mu.Unlock()
		ev, _ := json.Marshal(wireEvent{Kind: EventProfileFree, Node: c.node, Session: l.name})
		ctx, cancel := c.ctx(context.Background())
		defer cancel()
		if err := releaseProfileScript.Run(ctx, c.rdb, []string{c.profileKey(l.name)}, l.member, c.channel(), string(ev)).Err(); err != nil {
			c.backgroundFailed("give back the lock of a profile", c.fail("give back the lock of a profile", err))
		}
	})
}

// InUse reports which of names are in use, by this node or another.
// Errors wrap ErrUnavailable.
func (p *Profiles) InUse(ctx context.Context, names []string) (map[string]bool, error) {
	c := p.c
	op := "read the locks of profiles"
	if c.closed.Load() {
		return nil, c.fail(op, errClosed)
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	cmds := make([]*redis.IntCmd, len(names))
	_, err := c.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i, n := range names {
			cmds[i] = pl.Exists(ctx, c.profileKey(n))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, c.fail(op, err)
	}
	out := make(map[string]bool, len(names))
	for i, n := range names {
		out[n] = cmds[i].Val() > 0
	}
	return out, nil
}

// loop renews the held locks about every LeaseTTL/3 until stop.
func (p *Profiles) loop() {
	defer close(p.done)
	t := time.NewTicker(time.Duration(p.c.cfg.LeaseTTL) / 3)
	defer t.Stop()
	for {
		select {
		case <-p.stopped:
			return
		case <-t.C:
			p.renew()
		}
	}
}

// renew extends each held lock, putting back one that Redis lost (a
// restart, a failover) when no other node took it meanwhile.
func (p *Profiles) renew() {
	c := p.c
	p.mu.Lock()
	held := make([]*ProfileLock, 0, len(p.held))
	for l := range p.held {
		held = append(held, l)
	}
	p.mu.Unlock()
	ttl := time.Duration(c.cfg.LeaseTTL).Milliseconds()
	for _, l := range held {
		ctx, cancel := c.ctx(context.Background())
		n, err := takeProfileScript.Run(ctx, c.rdb, []string{c.profileKey(l.name)}, l.member, ttl).Int64()
		cancel()
		switch {
		case err != nil:
			c.backgroundFailed("renew the lock of a profile", c.fail("renew the lock of a profile", err))
			return
		case n != 1:
			c.backgroundFailed("renew the lock of a profile", errors.New("another node took the lock of a profile in use here while this node could not renew it"))
		}
	}
}

// stop ends the renewals; the held locks are given back by Close.
func (p *Profiles) stop() []*ProfileLock {
	p.once.Do(func() { close(p.stopped) })
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*ProfileLock, 0, len(p.held))
	for l := range p.held {
		out = append(out, l)
	}
	return out
}

// takeProfileScript takes, renews or puts back a profile's lock for
// member: unless another member holds it, it is set to member for TTL.
//
// KEYS[1] the lock. ARGV[1] member, ARGV[2] TTL ms.
// Returns 1 when member holds it now, 0 when another does.
var takeProfileScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
return 1
`)

// releaseProfileScript gives a profile's lock back when member holds it,
// and announces it.
//
// KEYS[1] the lock. ARGV[1] member, ARGV[2] the events channel, ARGV[3]
// the event.
// Returns 1 when it was given back, 0 when member did not hold it.
var releaseProfileScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
`)

// giveBack releases the locks still held as the store closes (best
// effort: if Redis is down they expire), before the connection closes.
func (p *Profiles) giveBack(locks []*ProfileLock) {
	for _, l := range locks {
		l.giveBack()
	}
}
