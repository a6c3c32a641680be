package pool

import (
	"sort"
	"sync"

	"github.com/browserfailover/caddy-browser-failover/queue"
)

// Client quotas: the live sessions of each client key value (client_limit),
// process-wide, so they survive reloads like the sessions they count. An
// entry lives while it has live sessions, waiting clients, or both. Clients
// held back by their key's limit wait in the process queue for the key's
// resource, which release offers.

// Quotas are the client_limit counts of every key value. A ticket takes
// and gives back its share (Ticket.TakeShare, Ticket.Release); the wait
// counts are the connect's.
type Quotas struct {
	waiting *queue.Queue
	hashes  *Hashes

	mu      sync.Mutex
	entries map[string]*quotaEntry
}

func newQuotas(waiting *queue.Queue, hashes *Hashes) *Quotas {
	return &Quotas{waiting: waiting, hashes: hashes, entries: map[string]*quotaEntry{}}
}

// quotaEntry is one key value's count.
type quotaEntry struct {
	value   string // the key value: shown only hashed (ShownKey)
	active  int
	waiting int
}

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

func (q *Quotas) entryLocked(k QuotaKey) *quotaEntry {
	id := k.id()
	e := q.entries[id]
	if e == nil {
		e = &quotaEntry{value: k.Value}
		q.entries[id] = e
	}
	return e
}

func (q *Quotas) dropIfUnusedLocked(k QuotaKey, e *quotaEntry) {
	if e.active == 0 && e.waiting == 0 {
		delete(q.entries, k.id())
	}
}

// take counts one more session for k if it holds fewer than limit. The
// caller gives it back with release exactly once.
func (q *Quotas) take(k QuotaKey, limit int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.entryLocked(k)
	if e.active >= limit {
		q.dropIfUnusedLocked(k, e)
		return false
	}
	e.active++
	return true
}

// release gives back a session counted by take and offers k to the
// longest-waiting client held back by it.
func (q *Quotas) release(k QuotaKey) {
	q.mu.Lock()
	e := q.entries[k.id()]
	if e == nil || e.active == 0 {
		q.mu.Unlock()
		return
	}
	e.active--
	q.dropIfUnusedLocked(k, e)
	q.mu.Unlock()
	q.waiting.Offer(k.Resource())
}

// AddWaiting counts clients waiting on k's limit (delta +1 or -1), for
// status.
func (q *Quotas) AddWaiting(k QuotaKey, delta int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.entryLocked(k)
	e.waiting += delta
	q.dropIfUnusedLocked(k, e)
}

// Active is the live count of k (for tests and checks).
func (q *Quotas) Active(k QuotaKey) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if e := q.entries[k.id()]; e != nil {
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

// Counts lists every key value with live sessions or waiters, by key.
// Values under different templates that hash alike are listed apart.
func (q *Quotas) Counts() []ClientCount {
	q.mu.Lock()
	out := make([]ClientCount, 0, len(q.entries))
	for _, e := range q.entries {
		if e.active == 0 && e.waiting == 0 {
			continue
		}
		out = append(out, ClientCount{Key: q.hashes.ShownKey(e.value), Active: e.active, Waiting: e.waiting})
	}
	q.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Key != out[j].Key {
			return out[i].Key < out[j].Key
		}
		return out[i].Active > out[j].Active
	})
	return out
}
