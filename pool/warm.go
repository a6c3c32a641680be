package pool

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
)

// Warm sessions: sessions a provider opens ahead of demand, handed to a
// client at once. A handler's warmer makes, watches and hands them out,
// one per handler and provider: a provider used by two handlers keeps a
// set for each, and each set goes only to its own handler's clients. The
// registry keeps the warmers by handler key and provider name (so a reload
// that keeps a handler's configuration keeps its warm sessions) and the
// counts status and metrics read, summed per provider. A warm session
// holds a ticket like any attempt: its slot counts toward max_concurrent,
// its lease, spend and ledger entry are held, and its meter runs from its
// creation (Ticket.Warm).

// Warmer is what keeps one set of warm sessions; Close ends them all.
type Warmer interface{ Close() }

// WarmKey names one set of warm sessions: the key of the handler that
// keeps it (HandlerKey) and the provider's name.
type WarmKey struct {
	Handler, Provider string
}

// warmers are the registry's warmers.
type warmers struct {
	byKey map[WarmKey]Warmer
}

// Warmer is the warmer of key (nil: none).
func (r *Registry) Warmer(key WarmKey) Warmer {
	r.warmMu.Lock()
	defer r.warmMu.Unlock()
	return r.warm.byKey[key]
}

// SetWarmer makes w the warmer of key and returns the one it had.
func (r *Registry) SetWarmer(key WarmKey, w Warmer) Warmer {
	r.warmMu.Lock()
	defer r.warmMu.Unlock()
	if r.warm.byKey == nil {
		r.warm.byKey = map[WarmKey]Warmer{}
	}
	old := r.warm.byKey[key]
	r.warm.byKey[key] = w
	return old
}

// DropWarmer forgets w as the warmer of key, if it still is.
func (r *Registry) DropWarmer(key WarmKey, w Warmer) {
	r.warmMu.Lock()
	defer r.warmMu.Unlock()
	if r.warm.byKey[key] == w {
		delete(r.warm.byKey, key)
	}
}

// WarmPrint is a keyed hash of what a set of warm sessions is made with
// (the provider settings of its handler, resolved): prints are compared,
// and never tell those settings, which hold secrets. The key is the
// registry's own, random, never stored or shared.
func (r *Registry) WarmPrint(settings []byte) string {
	mac := hmac.New(sha256.New, r.warmSecret)
	mac.Write(settings)
	return hex.EncodeToString(mac.Sum(nil))
}

// warmCount is one set's counts.
type warmCount struct{ ready, target int }

// SetWarm records how many warm sessions of the set of handler key
// handler are ready and how many are wanted; 0 and 0 forgets the set.
func (p *Provider) SetWarm(handler string, ready, target int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ready == 0 && target == 0 {
		delete(p.warm, handler)
		return
	}
	if p.warm == nil {
		p.warm = map[string]warmCount{}
	}
	p.warm[handler] = warmCount{ready, target}
}

// Warm is how many warm sessions of the provider are ready and how many
// are wanted, over every handler's set.
func (p *Provider) Warm() (ready, target int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.warm {
		ready += int64(c.ready)
		target += int64(c.target)
	}
	return ready, target
}

// Warm turns the reserved slot of a warm-up that succeeded into a warm
// session's: the slot stays counted, and the session's cost starts now
// (a warm session is billed whether or not a client takes it); Establish
// goes on with the same meter when a client does.
func (t *Ticket) Warm() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.released || t.live.Meter != nil {
		return
	}
	if t.hold != nil {
		t.live.Meter = t.hold.Start()
		t.hold = nil
	} else {
		t.live.Meter = t.p.Meter(nil)
	}
}
