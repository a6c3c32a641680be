package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// LedgerStore keeps the gateway's ledger of created provider sessions
// (its entries and every node's heartbeat) in Redis, so that every node
// sees every node's entries and the surviving nodes release what a dead
// one left. It has the storage methods the ledger uses: Store, Load,
// Delete, List, Lock, Unlock, with keys as paths ("a/b/c"). Values hold no
// secret: the ledger writes only names, session IDs and times.
//
// A directory is kept where one command finds it, never by a walk of the
// keyspace (which may hold millions of keys of other uses):
//
//   - <prefix>{ledger}:f:<dir> is a hash of the directory's files: field
//     the file's name, value its content;
//   - <prefix>{ledger}:d:<dir> is a set of its subdirectories that hold
//     files: writing a file names its directory in the parent's set, and
//     deleting a directory's last file takes it out again.
//
// So the ledger's owners holding entries are one set, an owner's entries
// one hash, and the heartbeats one hash. Every key carries the hash tag
// {ledger}, like the locks: in a Redis Cluster they share one slot, so a
// file and its directory's listing change together in one script.
type LedgerStore struct {
	c *conn
	// locks holds the tokens of the ledger locks this store took, by
	// name.
	locks sync.Map
}

// ledgerLockTTL bounds a lock of the ledger held by a node that died.
const ledgerLockTTL = 30 * time.Second

// MaxLedgerValue is the longest value the ledger store writes or reads
// back (an entry is a few hundred bytes): a longer one in Redis is not
// the ledger's, and is refused rather than read.
const MaxLedgerValue = 64 << 10

func (l *LedgerStore) files(dir string) string { return l.c.cfg.KeyPrefix + "{ledger}:f:" + dir }
func (l *LedgerStore) dirs(dir string) string  { return l.c.cfg.KeyPrefix + "{ledger}:d:" + dir }

// split cuts a key into its directory ("" at the top) and its name.
func split(key string) (dir, name string) {
	key = strings.Trim(key, "/")
	if i := strings.LastIndexByte(key, '/'); i >= 0 {
		return key[:i], key[i+1:]
	}
	return "", key
}

// ledgerStoreScript writes a file and names its directory in the parent's
// set.
//
// KEYS[1] the directory's files, KEYS[2] its parent's subdirectories.
// ARGV[1] the file's name, ARGV[2] its content, ARGV[3] the directory's
// name in its parent ("" at the top: no parent).
var ledgerStoreScript = redis.NewScript(`
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] ~= '' then redis.call('SADD', KEYS[2], ARGV[3]) end
return 1`)

// ledgerLoadScript reads a file, refusing one longer than the ledger
// writes.
//
// KEYS[1] the directory's files. ARGV[1] the file's name, ARGV[2] the
// longest value. Returns the content, false when there is none, or the
// length (a number) of one too long.
var ledgerLoadScript = redis.NewScript(`
local n = redis.call('HSTRLEN', KEYS[1], ARGV[1])
if n > tonumber(ARGV[2]) then return n end
return redis.call('HGET', KEYS[1], ARGV[1])`)

// ledgerDeleteScript deletes a file, or a directory's own files and
// listing, and takes the directory out of its parent's set once it holds
// nothing. A key that has subdirectories is left as it is: the script
// returns them, to be deleted first.
//
// KEYS[1] the directory's files, KEYS[2] its subdirectories, KEYS[3] its
// parent's subdirectories, KEYS[4] the files and KEYS[5] the
// subdirectories of the key as a directory. ARGV[1] the key's name,
// ARGV[2] the directory's name in its parent ("" at the top).
var ledgerDeleteScript = redis.NewScript(`
local subs = redis.call('SMEMBERS', KEYS[5])
if #subs > 0 then return subs end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[4])
if ARGV[2] ~= '' and redis.call('EXISTS', KEYS[1], KEYS[2]) == 0 then
	redis.call('SREM', KEYS[3], ARGV[2])
end
return {}`)

// Store puts value at key.
func (l *LedgerStore) Store(ctx context.Context, key string, value []byte) error {
	if len(value) > MaxLedgerValue {
		return fmt.Errorf("ledger write: %d bytes, over the %d a ledger value may hold", len(value), MaxLedgerValue)
	}
	dir, name := split(key)
	parent, base := split(dir)
	ctx, cancel := l.c.ctx(ctx)
	defer cancel()
	err := ledgerStoreScript.Run(ctx, l.c.rdb, []string{l.files(dir), l.dirs(parent)}, name, value, base).Err()
	if err != nil {
		return l.c.fail("ledger write", err)
	}
	return nil
}

// Load returns the value at key; fs.ErrNotExist when there is none.
func (l *LedgerStore) Load(ctx context.Context, key string) ([]byte, error) {
	dir, name := split(key)
	ctx, cancel := l.c.ctx(ctx)
	defer cancel()
	v, err := ledgerLoadScript.Run(ctx, l.c.rdb, []string{l.files(dir)}, name, MaxLedgerValue).Result()
	if errors.Is(err, redis.Nil) {
		return nil, fs.ErrNotExist
	}
	if err != nil {
		return nil, l.c.fail("ledger read", err)
	}
	switch v := v.(type) {
	case string:
		return []byte(v), nil
	case int64:
		return nil, fmt.Errorf("ledger read: %s: %d bytes, over the %d a ledger value may hold: not the ledger's", key, v, MaxLedgerValue)
	}
	return nil, fmt.Errorf("ledger read: %s: unexpected reply %T", key, v)
}

// Delete removes key and every key under it ("key/...").
func (l *LedgerStore) Delete(ctx context.Context, key string) error {
	key = strings.Trim(key, "/")
	dir, name := split(key)
	parent, base := split(dir)
	keys := []string{l.files(dir), l.dirs(dir), l.dirs(parent), l.files(key), l.dirs(key)}
	// A file goes in one call; a directory with subdirectories once they
	// went (a writer may add one meanwhile: a few rounds at most).
	for range 8 {
		cctx, cancel := l.c.ctx(ctx)
		subs, err := ledgerDeleteScript.Run(cctx, l.c.rdb, keys, name, base).StringSlice()
		cancel()
		if err != nil {
			return l.c.fail("ledger delete", err)
		}
		if len(subs) == 0 {
			return nil
		}
		for _, sub := range subs {
			if err := l.Delete(ctx, key+"/"+sub); err != nil {
				return err
			}
		}
	}
	return fmt.Errorf("ledger delete: %s: subdirectories keep coming", key)
}

// List returns the keys under prefix: without recursive, its files and
// the subdirectories that hold files ("prefix/name"), once each; with it,
// every file under it.
func (l *LedgerStore) List(ctx context.Context, prefix string, recursive bool) ([]string, error) {
	prefix = strings.Trim(prefix, "/")
	cctx, cancel := l.c.ctx(ctx)
	pipe := l.c.rdb.Pipeline()
	files := pipe.HKeys(cctx, l.files(prefix))
	subs := pipe.SMembers(cctx, l.dirs(prefix))
	_, err := pipe.Exec(cctx)
	cancel()
	if err != nil {
		return nil, l.c.fail("ledger list", err)
	}
	seen := map[string]bool{}
	var out []string
	add := func(k string) {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	for _, f := range files.Val() {
		add(path.Join(prefix, f))
	}
	for _, sub := range subs.Val() {
		if !recursive {
			add(path.Join(prefix, sub))
			continue
		}
		under, err := l.List(ctx, path.Join(prefix, sub), true)
		if err != nil {
			return nil, err
		}
		for _, k := range under {
			add(k)
		}
	}
	return out, nil
}

// unlockScript deletes a lock only when it is still the caller's.
var unlockScript = redis.NewScript(`
if redis.call("GET", KEYS[1]) == ARGV[1] then
	return redis.call("DEL", KEYS[1])
end
return 0`)

// Lock takes the lock called name, waiting until it is free or ctx ends.
// A lock whose holder died frees itself after ledgerLockTTL.
func (l *LedgerStore) Lock(ctx context.Context, name string) error {
	token := make([]byte, 12)
	_, _ = rand.Read(token)
	tok := hex.EncodeToString(token)
	for {
		cctx, cancel := l.c.ctx(ctx)
		ok, err := l.c.rdb.SetNX(cctx, l.lockKey(name), tok, ledgerLockTTL).Result()
		cancel()
		if err != nil {
			return l.c.fail("ledger lock", err)
		}
		if ok {
			l.locks.Store(name, tok)
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
func (l *LedgerStore) Unlock(ctx context.Context, name string) error {
	v, ok := l.locks.LoadAndDelete(name)
	if !ok {
		return nil
	}
	ctx, cancel := l.c.ctx(ctx)
	defer cancel()
	if err := unlockScript.Run(ctx, l.c.rdb, []string{l.lockKey(name)}, v.(string)).Err(); err != nil {
		return l.c.fail("ledger unlock", err)
	}
	return nil
}

// The locks are the same in both layouts (an older version's adoption
// and a move of its entries exclude each other).
func (l *LedgerStore) lockKey(name string) string {
	return l.c.cfg.KeyPrefix + "{ledger}-lock:" + name
}
