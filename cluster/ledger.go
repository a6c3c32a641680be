package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// LedgerStore keeps the gateway's ledger of created provider sessions
// (its entries and every node's heartbeat) in Redis, under
// <prefix>ledger:<key>, so that every node sees every node's entries and
// the surviving nodes release what a dead one left. It has the storage
// methods the ledger uses: Store, Load, Delete, List, Lock, Unlock, with
// keys as paths ("a/b/c"). Values hold no secret: the ledger writes only
// names, session IDs and times.
type LedgerStore struct{ s *Store }

// Ledger returns the store's ledger storage.
func (s *Store) Ledger() LedgerStore { return LedgerStore{s: s} }

// LeaseTTL is how long a lease outlives a node that stopped renewing it.
func (s *Store) LeaseTTL() time.Duration { return time.Duration(s.cfg.LeaseTTL) }

// ledgerLockTTL bounds a lock of the ledger held by a node that died.
const ledgerLockTTL = 30 * time.Second

// The ledger's keys share one hash tag ({ledger}): they live in one slot
// of a Redis Cluster, so a delete of several is one command and a listing
// scans the one node holding them.
func (l LedgerStore) key(k string) string { return l.s.cfg.KeyPrefix + "{ledger}:" + k }

// Store puts value at key.
func (l LedgerStore) Store(ctx context.Context, key string, value []byte) error {
	ctx, cancel := l.s.ctx(ctx)
	defer cancel()
	if err := l.s.rdb.Set(ctx, l.key(key), value, 0).Err(); err != nil {
		return l.s.fail("ledger write", err)
	}
	return nil
}

// Load returns the value at key; fs.ErrNotExist when there is none.
func (l LedgerStore) Load(ctx context.Context, key string) ([]byte, error) {
	ctx, cancel := l.s.ctx(ctx)
	defer cancel()
	b, err := l.s.rdb.Get(ctx, l.key(key)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, fs.ErrNotExist
	}
	if err != nil {
		return nil, l.s.fail("ledger read", err)
	}
	return b, nil
}

// Delete removes key and every key under it ("key/...").
func (l LedgerStore) Delete(ctx context.Context, key string) error {
	under, err := l.scan(ctx, key)
	if err != nil {
		return err
	}
	ctx, cancel := l.s.ctx(ctx)
	defer cancel()
	keys := append([]string{l.key(key)}, under...)
	if err := l.s.rdb.Del(ctx, keys...).Err(); err != nil {
		return l.s.fail("ledger delete", err)
	}
	return nil
}

// List returns the keys under prefix: with recursive, every one; without,
// the names directly under it ("prefix/name"), once each.
func (l LedgerStore) List(ctx context.Context, prefix string, recursive bool) ([]string, error) {
	under, err := l.scan(ctx, prefix)
	if err != nil {
		return nil, err
	}
	base := l.key(prefix) + "/"
	seen := map[string]bool{}
	var out []string
	for _, k := range under {
		rest := strings.TrimPrefix(k, base)
		if !recursive {
			rest, _, _ = strings.Cut(rest, "/")
		}
		if !seen[rest] {
			seen[rest] = true
			out = append(out, prefix+"/"+rest)
		}
	}
	return out, nil
}

// scan returns the Redis keys under key ("key/...").
func (l LedgerStore) scan(ctx context.Context, key string) ([]string, error) {
	ctx, cancel := l.s.ctx(ctx)
	defer cancel()
	pattern := escapeGlob(l.key(key)) + "/*"
	var out []string
	var scanner redis.Cmdable = l.s.rdb
	if cc, ok := l.s.rdb.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, l.key(key))
		if err != nil {
			return nil, l.s.fail("ledger list", err)
		}
		scanner = node
	}
	iter := scanner.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		out = append(out, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return nil, l.s.fail("ledger list", err)
	}
	return out, nil
}

// escapeGlob escapes the characters SCAN's MATCH gives a meaning to.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// unlockScript deletes a lock only when it is still the caller's.
var unlockScript = redis.NewScript(`
if redis.call("GET", KEYS[1]) == ARGV[1] then
	return redis.call("DEL", KEYS[1])
end
return 0`)

// Lock takes the lock called name, waiting until it is free or ctx ends.
// A lock whose holder died frees itself after ledgerLockTTL.
func (l LedgerStore) Lock(ctx context.Context, name string) error {
	token := make([]byte, 12)
	_, _ = rand.Read(token)
	tok := hex.EncodeToString(token)
	for {
		cctx, cancel := l.s.ctx(ctx)
		ok, err := l.s.rdb.SetNX(cctx, l.lockKey(name), tok, ledgerLockTTL).Result()
		cancel()
		if err != nil {
			return l.s.fail("ledger lock", err)
		}
		if ok {
			l.s.ledgerLocks.Store(name, tok)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Unlock gives back the lock called name that this store took.
func (l LedgerStore) Unlock(ctx context.Context, name string) error {
	v, ok := l.s.ledgerLocks.LoadAndDelete(name)
	if !ok {
		return nil
	}
	ctx, cancel := l.s.ctx(ctx)
	defer cancel()
	if err := unlockScript.Run(ctx, l.s.rdb, []string{l.lockKey(name)}, v.(string)).Err(); err != nil {
		return l.s.fail("ledger unlock", err)
	}
	return nil
}

func (l LedgerStore) lockKey(name string) string {
	return l.s.cfg.KeyPrefix + "{ledger}-lock:" + name
}
