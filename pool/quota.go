package pool

import (
	"crypto/sha256"
	"encoding/hex"
	"sort"
	"sync"
)

// Client quotas: the live sessions of each client key value (client_limit),
// process-wide, so they survive reloads like the sessions they count. An
// entry lives while it has live sessions, waiting clients, or both. Clients
// held back by their key's limit wait in the process queue for the key's
// resource, which ReleaseQuota offers.

// quotaEntry is one key value's count.
type quotaEntry struct {
	shown   string // the hashed key for status
	active  int
	waiting int
}

var (
	quotaMu sync.Mutex
	quotas  = map[string]*quotaEntry{}
)

// QuotaKey identifies a key value under a client_limit key template (so two
// handlers with the same template share counts, and different templates
// never do).
type QuotaKey struct {
	Template string
	Value    string
}

func (k QuotaKey) id() string { return k.Template + "\x00" + k.Value }

// Resource is the name under which clients held back by k's limit wait in
// the queue.
func (k QuotaKey) Resource() string { return "client\x00" + k.id() }

// ShownKey is how a key value appears in status: a short SHA-256 prefix,
// never the value itself (it may be an API key).
func ShownKey(value string) string {
	if value == "" {
		return "(empty)"
	}
	sum := sha256.Sum256([]byte(value))
	return "sha256:" + hex.EncodeToString(sum[:6])
}

func entryLocked(k QuotaKey) *quotaEntry {
	id := k.id()
	e := quotas[id]
	if e == nil {
		e = &quotaEntry{shown: ShownKey(k.Value)}
		quotas[id] = e
	}
	return e
}

func dropIfUnusedLocked(k QuotaKey, e *quotaEntry) {
	if e.active == 0 && e.waiting == 0 {
		delete(quotas, k.id())
	}
}

// TakeQuota counts one more session for k if it holds fewer than limit.
// The caller gives it back with ReleaseQuota exactly once.
func TakeQuota(k QuotaKey, limit int) bool {
	quotaMu.Lock()
	defer quotaMu.Unlock()
	e := entryLocked(k)
	if e.active >= limit {
		dropIfUnusedLocked(k, e)
		return false
	}
	e.active++
	return true
}

// ReleaseQuota gives back a session counted by TakeQuota and offers k to
// the longest-waiting client held back by it.
func ReleaseQuota(k QuotaKey) {
	quotaMu.Lock()
	e := quotas[k.id()]
	if e == nil || e.active == 0 {
		quotaMu.Unlock()
		return
	}
	e.active--
	dropIfUnusedLocked(k, e)
	quotaMu.Unlock()
	Waiting.Offer(k.Resource())
}

// AddQuotaWaiting counts clients waiting on k's limit (delta +1 or -1), for
// status.
func AddQuotaWaiting(k QuotaKey, delta int) {
	quotaMu.Lock()
	defer quotaMu.Unlock()
	e := entryLocked(k)
	e.waiting += delta
	dropIfUnusedLocked(k, e)
}

// QuotaActive is the live count of k (for tests and checks).
func QuotaActive(k QuotaKey) int {
	quotaMu.Lock()
	defer quotaMu.Unlock()
	if e := quotas[k.id()]; e != nil {
		return e.active
	}
	return 0
}

// ClientCount is one key value's figures: its shown key (ShownKey), live
// sessions and waiting clients.
type ClientCount struct {
	Key     string
	Active  int
	Waiting int
}

// Clients lists every key value with live sessions or waiters, by key.
// Values under different templates that hash alike are listed apart.
func Clients() []ClientCount {
	quotaMu.Lock()
	out := make([]ClientCount, 0, len(quotas))
	for _, e := range quotas {
		if e.active == 0 && e.waiting == 0 {
			continue
		}
		out = append(out, ClientCount{Key: e.shown, Active: e.active, Waiting: e.waiting})
	}
	quotaMu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Key != out[j].Key {
			return out[i].Key < out[j].Key
		}
		return out[i].Active > out[j].Active
	})
	return out
}

// Shown is how k's value appears in status and the session list.
func (k QuotaKey) Shown() string { return ShownKey(k.Value) }
