package pool

// Warm sessions: sessions a provider opens ahead of demand, handed to a
// client at once. The handler's warmer makes, watches and hands them out;
// the registry keeps the warmer (so a reload that keeps the provider keeps
// its warm sessions) and the counts status and metrics read. A warm
// session holds a ticket like any attempt: its slot counts toward
// max_concurrent, its lease, spend and ledger entry are held, and its
// meter runs from its creation (Ticket.Warm).

// Warmer is what keeps a provider's warm sessions; Close ends them all.
type Warmer interface{ Close() }

// Warmer is the provider's warmer (nil: none).
func (p *Provider) Warmer() Warmer {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.warmer
}

// SetWarmer makes w the provider's warmer and returns the one it had.
func (p *Provider) SetWarmer(w Warmer) Warmer {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.warmer
	p.warmer = w
	return old
}

// SetWarm records how many warm sessions are ready and how many are
// wanted.
func (p *Provider) SetWarm(ready, target int) {
	p.warmReady.Store(int64(ready))
	p.warmTarget.Store(int64(target))
}

// Warm is how many warm sessions are ready and how many are wanted.
func (p *Provider) Warm() (ready, target int64) {
	return p.warmReady.Load(), p.warmTarget.Load()
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
