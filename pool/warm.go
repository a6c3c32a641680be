package pool

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"sync"
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
// keeps it (Handlers.Key) and the provider's name.
type WarmKey struct {
	Handler, Provider string
}

// Warmers are the registry's warmers, by handler key and provider name,
// and the key of the prints of their settings (Print).
type Warmers struct {
	mu     sync.Mutex
	byKey  map[WarmKey]Warmer
	secret []byte
}

func newWarmers() *Warmers {
	w := &Warmers{byKey: map[WarmKey]Warmer{}, secret: make([]byte, 32)}
	_, _ = rand.Read(w.secret)
	return w
}

// Of is the warmer of key (nil: none).
func (w *Warmers) Of(key WarmKey) Warmer {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.byKey[key]
}

// Set makes x the warmer of key and returns the one it had.
func (w *Warmers) Set(key WarmKey, x Warmer) Warmer {
	w.mu.Lock()
	defer w.mu.Unlock()
	old := w.byKey[key]
	w.byKey[key] = x
	return old
}

// Drop forgets x as the warmer of key, if it still is.
func (w *Warmers) Drop(key WarmKey, x Warmer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byKey[key] == x {
		delete(w.byKey, key)
	}
}

// Print is a keyed hash of what a set of warm sessions is made with (the
// provider settings of its handler, resolved): prints are compared, and
// never tell those settings, which hold secrets. The key is the
// registry's own, random, never stored or shared.
func (w *Warmers) Print(settings []byte) string {
	mac := hmac.New(sha256.New, w.secret)
	mac.Write(settings)
	return hex.EncodeToString(mac.Sum(nil))
}

// warmCount is one set's counts.
type warmCount struct{ ready, target int }

// SetWarm records how many warm sessions of the set of handler key
// handler are ready and how many are wanted; 0 and 0 forgets the set.
func (p *ProviderState) SetWarm(handler string, ready, target int) {
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
func (p *ProviderState) Warm() (ready, target int64) {
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
		t.live.Meter = t.p.Spend.Meter(nil)
	}
}
