package pool

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"sort"
)

// Client quotas: the live sessions of each client key value (client_limit),
// process-wide, so they survive reloads like the sessions they count. An
// entry lives while it has live sessions, waiting clients, or both. Clients
// held back by their key's limit wait in the process queue for the key's
// resource, which releaseQuota offers.

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

// SetClientKeySecret sets the secret ShownKey is keyed with: the
// deployment's, kept in Caddy's storage (and agreed on through the shared
// state by every node), so the shown keys are the same on every node and
// across restarts. An empty secret changes nothing.
func (r *Registry) SetClientKeySecret(secret []byte) {
	if len(secret) == 0 {
		return
	}
	b := append([]byte(nil), secret...)
	r.keySecret.Store(&b)
}

// ShownKey is how a key value appears in status: "hmac:" and 16 hex
// digits of its HMAC-SHA256 keyed with the deployment's secret, never the
// value itself (it may be an API key or a user id). Without the secret,
// likely values cannot be tried against it.
func (r *Registry) ShownKey(value string) string {
	if value == "" {
		return "(empty)"
	}
	m := hmac.New(sha256.New, *r.keySecret.Load())
	m.Write([]byte(value))
	return "hmac:" + hex.EncodeToString(m.Sum(nil)[:8])
}

func (r *Registry) entryLocked(k QuotaKey) *quotaEntry {
	id := k.id()
	e := r.quotas[id]
	if e == nil {
		e = &quotaEntry{value: k.Value}
		r.quotas[id] = e
	}
	return e
}

func (r *Registry) dropIfUnusedLocked(k QuotaKey, e *quotaEntry) {
	if e.active == 0 && e.waiting == 0 {
		delete(r.quotas, k.id())
	}
}

// takeQuota counts one more session for k if it holds fewer than limit.
// The caller gives it back with releaseQuota exactly once.
func (r *Registry) takeQuota(k QuotaKey, limit int) bool {
	r.quotaMu.Lock()
	defer r.quotaMu.Unlock()
	e := r.entryLocked(k)
	if e.active >= limit {
		r.dropIfUnusedLocked(k, e)
		return false
	}
	e.active++
	return true
}

// releaseQuota gives back a session counted by takeQuota and offers k to
// the longest-waiting client held back by it.
func (r *Registry) releaseQuota(k QuotaKey) {
	r.quotaMu.Lock()
	e := r.quotas[k.id()]
	if e == nil || e.active == 0 {
		r.quotaMu.Unlock()
		return
	}
	e.active--
	r.dropIfUnusedLocked(k, e)
	r.quotaMu.Unlock()
	r.Waiting.Offer(k.Resource())
}

// AddQuotaWaiting counts clients waiting on k's limit (delta +1 or -1), for
// status.
func (r *Registry) AddQuotaWaiting(k QuotaKey, delta int) {
	r.quotaMu.Lock()
	defer r.quotaMu.Unlock()
	e := r.entryLocked(k)
	e.waiting += delta
	r.dropIfUnusedLocked(k, e)
}

// QuotaActive is the live count of k (for tests and checks).
func (r *Registry) QuotaActive(k QuotaKey) int {
	r.quotaMu.Lock()
	defer r.quotaMu.Unlock()
	if e := r.quotas[k.id()]; e != nil {
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
func (r *Registry) Clients() []ClientCount {
	r.quotaMu.Lock()
	out := make([]ClientCount, 0, len(r.quotas))
	for _, e := range r.quotas {
		if e.active == 0 && e.waiting == 0 {
			continue
		}
		out = append(out, ClientCount{Key: r.ShownKey(e.value), Active: e.active, Waiting: e.waiting})
	}
	r.quotaMu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Key != out[j].Key {
			return out[i].Key < out[j].Key
		}
		return out[i].Active > out[j].Active
	})
	return out
}

// Shown is how k's value appears in status and the session list.
func (r *Registry) Shown(k QuotaKey) string { return r.ShownKey(k.Value) }
