package cluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/redis/go-redis/v9"
)

// LegacyLedger reads the ledger as versions before the hash layout kept it
// in Redis: one string key per file, <prefix>{ledger}:<path>, found only by
// a walk of the keyspace. The ledger reads it in the background until what
// it holds has moved to the LedgerStore (ledger.Ledger.MoveLegacy), so that
// the entries an older version left are still released.
type LegacyLedger struct{ c *conn }

// Legacy returns the ledger as older versions kept it.
func (l *LedgerStore) Legacy() LegacyLedger { return LegacyLedger{c: l.c} }

// legacyScanCount is how many keys one SCAN call looks at: the walk goes
// in calls of about this size, each within the call timeout.
const legacyScanCount = 10000

func (l LegacyLedger) key(k string) string { return l.c.cfg.KeyPrefix + "{ledger}:" + k }

// legacyLoadScript reads a string, refusing one longer than the ledger
// writes.
//
// KEYS[1] the key. ARGV[1] the longest value. Returns the value, false
// when there is none, or the length (a number) of one too long.
var legacyLoadScript = redis.NewScript(`
local n = redis.call('STRLEN', KEYS[1])
if n > tonumber(ARGV[1]) then return n end
return redis.call('GET', KEYS[1])`)

// Load returns the value at key; fs.ErrNotExist when there is none.
func (l LegacyLedger) Load(ctx context.Context, key string) ([]byte, error) {
	ctx, cancel := l.c.ctx(ctx)
	defer cancel()
	v, err := legacyLoadScript.Run(ctx, l.c.rdb, []string{l.key(key)}, MaxLedgerValue).Result()
	if errors.Is(err, redis.Nil) {
		return nil, fs.ErrNotExist
	}
	if err != nil {
		return nil, l.c.fail("old ledger read", err)
	}
	switch v := v.(type) {
	case string:
		return []byte(v), nil
	case int64:
		return nil, fmt.Errorf("old ledger read: %s: %d bytes, over the %d a ledger value may hold: not the ledger's", key, v, MaxLedgerValue)
	}
	return nil, fmt.Errorf("old ledger read: %s: unexpected reply %T", key, v)
}

// Delete removes the key (only: an older version's files are leaves).
func (l LegacyLedger) Delete(ctx context.Context, key string) error {
	ctx, cancel := l.c.ctx(ctx)
	defer cancel()
	if err := l.c.rdb.Del(ctx, l.key(key)).Err(); err != nil {
		return l.c.fail("old ledger delete", err)
	}
	return nil
}

// List returns every key under prefix ("prefix/..."), recursive or not:
// a walk of the keyspace (in Cluster mode, of the node holding the
// ledger's slot) in calls of legacyScanCount keys, each bounded by the
// call timeout; ctx bounds the walk.
func (l LegacyLedger) List(ctx context.Context, prefix string, _ bool) ([]string, error) {
	base := l.key(strings.Trim(prefix, "/")) + "/"
	pattern := escapeGlob(base) + "*"
	var scanner redis.Cmdable = l.c.rdb
	if cc, ok := l.c.rdb.(*redis.ClusterClient); ok {
		cctx, cancel := l.c.ctx(ctx)
		node, err := cc.MasterForKey(cctx, base)
		cancel()
		if err != nil {
			return nil, l.c.fail("old ledger list", err)
		}
		scanner = node
	}
	var out []string
	var cursor uint64
	for {
		cctx, cancel := l.c.ctx(ctx)
		keys, next, err := scanner.Scan(cctx, cursor, pattern, legacyScanCount).Result()
		cancel()
		if err != nil {
			return nil, l.c.fail("old ledger list", err)
		}
		for _, k := range keys {
			out = append(out, strings.TrimPrefix(k, l.c.cfg.KeyPrefix+"{ledger}:"))
		}
		if cursor = next; cursor == 0 {
			return out, nil
		}
	}
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
