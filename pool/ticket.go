package pool

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/profiles"
	"github.com/browserfailover/caddy-browser-failover/spend"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Tickets: everything one client holds, in one value, with one give-back.
//
// What a client counts against is a ticket: its client_limit share and its
// client key's spend book (taken as it joins), and at one provider the
// health permit of its attempt, a slot (reserved for the attempt, live
// with its session, kept while the session is parked), the cluster-wide
// lease with the shared store it keeps open, the spend hold that becomes
// the session's meter, the provider session created for it (its
// ledger entry and release), the create_rate start its attempt took
// (given back only when the provider started nothing: TakeBackStart),
// and the browser profile its session uses (taken by the client's first
// admission, like its share, and moved with it). A ticket moves, never copied: from the
// client's way to its attempt's admission (Join), to the session
// (Establish), to a parking (Park) and to a resume (Resume). Release gives
// back whatever it holds, in whatever state it is, once: the second call
// does nothing. No other code gives back a slot, a share or a lease.
//
// A client's way holds one ticket from its join (its share, its book);
// each attempt is admitted with a ticket of its own (its provider's part),
// so attempts in flight side by side (hedging) each hold theirs; the
// winner's takes the client's part (Join), and the others are released.

// slotState is where a ticket's provider slot stands.
type slotState uint8

const (
	slotNone     slotState = iota
	slotReserved           // an attempt in flight, or a resume about to dial
	slotLive               // a live session counts it
	slotParked             // a parked session keeps it, with no live session
)

// Ticket is what one client holds; see above. The zero value is not
// usable: tickets come from Registry.NewTicket and ProviderState.Admit.
type Ticket struct {
	reg *Registry

	mu       sync.Mutex
	released bool
	slot     slotState
	// failed: the attempt failed at the provider; its slot goes back
	// without waking the queue at once (Slots.unreserveFailed).
	failed bool
	p      *ProviderState
	permit cooldown.Permit
	share  *QuotaKey // nil: none
	book   *spend.Book
	lease  *cluster.Lease
	store  *cluster.Shared
	hold   *spend.Hold
	remote *upstreams.Remote
	// start is the create_rate start the attempt took (zero: none): not
	// given back by Release (a start counts whatever the session does),
	// only when the provider started nothing for it (TakeBackStart).
	start Start
	// live is the session's entry in the session registry, its Session
	// and Meter set by Establish (the Meter stays through a parking);
	// written only while the entry is not listed.
	live LiveSession
	// profile is the browser profile the session uses (nil: none).
	profile *ProfileHold
}

// NewTicket is a client's ticket as it joins: nothing held yet.
func (r *Registry) NewTicket() *Ticket { return &Ticket{reg: r} }

// Admit is an attempt's ticket at p: the health permit it was given and a
// slot, when p has room (tryReserve); nil when it has none.
func (p *ProviderState) Admit(permit cooldown.Permit) *Ticket {
	if !p.Slots.tryReserve() {
		return nil
	}
	return &Ticket{reg: p.reg, p: p, permit: permit, slot: slotReserved}
}

// Provider is the provider the ticket holds a slot at (nil: none).
func (t *Ticket) Provider() *ProviderState {
	if t == nil {
		return nil
	}
	return t.p
}

// Permit is the health permit of the ticket's attempt.
func (t *Ticket) Permit() cooldown.Permit { return t.permit }

// TakeShare takes a client_limit share of k when k holds fewer than limit
// live sessions. A ticket holds one share: a second one of another key
// replaces the first only once it is taken.
func (t *Ticket) TakeShare(k QuotaKey, limit int) bool {
	t.mu.Lock()
	old := t.share
	t.mu.Unlock()
	if old != nil && *old == k {
		return true
	}
	if !t.reg.Quotas.take(k, limit) {
		return false
	}
	t.mu.Lock()
	t.share = &k
	t.mu.Unlock()
	if old != nil {
		t.reg.Quotas.release(*old)
	}
	return true
}

// Share is the client_limit share the ticket holds.
func (t *Ticket) Share() (QuotaKey, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.share == nil {
		return QuotaKey{}, false
	}
	return *t.share, true
}

// TakeProfile takes profile n for the ticket's session (Profiles.Take:
// waiting up to wait while another session uses it); a ticket that holds
// it already has it. A ticket holds one profile.
func (t *Ticket) TakeProfile(ctx context.Context, n profiles.Name, wait time.Duration, shared *cluster.Shared, reject bool) error {
	t.mu.Lock()
	held := t.profile
	t.mu.Unlock()
	if held != nil {
		if held.name == n {
			return nil
		}
		return errors.New("the ticket holds another profile")
	}
	h, err := t.reg.Profiles.Take(ctx, n, wait, shared, reject)
	if err != nil {
		return err
	}
	t.mu.Lock()
	if t.released {
		t.mu.Unlock()
		h.Release()
		return ErrProfileInUse
	}
	t.profile = h
	t.mu.Unlock()
	return nil
}

// Profile is the profile the ticket's session uses (ok false: none).
func (t *Ticket) Profile() (profiles.Name, bool) {
	if t == nil {
		return profiles.Name{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.profile == nil {
		return profiles.Name{}, false
	}
	return t.profile.name, true
}

// KeepProfile moves the profile out of the ticket into a ticket of its
// own, which holds nothing else (nil when t holds none): a session its
// client may resume keeps its profile in use while the rest of what it
// held is given back.
func (t *Ticket) KeepProfile() *Ticket {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	h := t.profile
	t.profile = nil
	t.mu.Unlock()
	if h == nil {
		return nil
	}
	return &Ticket{reg: t.reg, profile: h}
}

// UseClientBook takes the book of a client key (ClientBooks.Use) for the
// ticket, which uses it until it is released.
func (t *Ticket) UseClientBook(id ClientBookID, budget float64) *spend.Book {
	b := t.reg.ClientBooks.Use(id, budget)
	t.mu.Lock()
	old := t.book
	t.book = b
	t.mu.Unlock()
	t.reg.ClientBooks.Leave(old)
	return b
}

// ClientBook is the client key's book the ticket uses (nil: none).
func (t *Ticket) ClientBook() *spend.Book {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.book
}

// Keep adds what the attempt's admission took besides its slot: the
// cluster-wide lease (nil: none) with the shared store it keeps open
// until the lease and the session's cost are given back, and the spend
// hold (nil: none).
func (t *Ticket) Keep(lease *cluster.Lease, store *cluster.Shared, hold *spend.Hold) {
	if store != nil {
		store.Retain()
	}
	t.mu.Lock()
	t.lease, t.hold = lease, hold
	if store != nil {
		t.store = store
	}
	t.mu.Unlock()
}

// KeepStart adds the create_rate start the attempt's admission took.
func (t *Ticket) KeepStart(s Start) {
	t.mu.Lock()
	t.start = s
	t.mu.Unlock()
}

// TakeBackStart hands over the ticket's create_rate start for its
// give-back, once (the provider started nothing for it); ok is false when
// the ticket holds none.
func (t *Ticket) TakeBackStart() (s Start, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, t.start = t.start, Start{}
	return s, !s.at.IsZero() || s.Shared != ""
}

// Failed marks the attempt failed at its provider: its slot goes back
// without waking the queue at once.
func (t *Ticket) Failed() {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
}

// Join moves what the client's ticket holds (its share, its book, its
// profile) into the attempt's ticket t, which won: from now on t holds
// the client.
func (t *Ticket) Join(client *Ticket) {
	if client == nil || client == t {
		return
	}
	client.mu.Lock()
	share, book, profile := client.share, client.book, client.profile
	client.share, client.book, client.profile = nil, nil, nil
	client.mu.Unlock()
	t.mu.Lock()
	t.share, t.book = share, book
	if profile != nil {
		t.profile = profile
	}
	t.mu.Unlock()
}

// Establish turns the ticket's slot into a live session s, listed in the
// session registry under info (its Client and Meter are set here), with
// the provider session created for it (nil: none). The session's cost
// starts: the admission's hold becomes its meter (a resumed session that
// kept its provider session goes on with the meter it had). It returns the
// meter.
func (t *Ticket) Establish(s Live, info SessionInfo, remote *upstreams.Remote) *spend.Meter {
	t.mu.Lock()
	meter := t.live.Meter
	if meter == nil {
		if t.hold != nil {
			meter = t.hold.Start()
		} else {
			meter = t.p.Spend.Meter(t.book)
		}
		t.hold = nil
	}
	if remote != nil {
		t.remote = remote
	}
	if t.share != nil {
		info.Client = t.reg.Hashes.ShownKey(t.share.Value)
	}
	info.Meter = meter
	t.live = LiveSession{SessionInfo: info, Session: s}
	t.slot = slotLive
	t.mu.Unlock()
	t.p.Slots.establish(&t.live)
	return meter
}

// Meter is the session's cost (nil before Establish, or without a price).
func (t *Ticket) Meter() *spend.Meter {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.live.Meter
}

// HoldsProviderSession reports whether the ticket holds a provider
// session created for it, which outlives the connection to it.
func (t *Ticket) HoldsProviderSession() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.remote != nil
}

// Park keeps the ticket while its live session's client is away and its
// provider session lives on (a parked session-API session): the session
// leaves the live count and the session registry, and its slot, share,
// lease and meter stay counted until Resume or Release.
func (t *Ticket) Park() {
	t.mu.Lock()
	if t.released || t.slot != slotLive {
		t.mu.Unlock()
		return
	}
	t.slot = slotParked
	t.mu.Unlock()
	t.p.Slots.park(t.live.Session)
}

// Resume readies a parked ticket for its resume's attempt, under the
// attempt's health permit: its slot stands for the attempt's, until
// Establish or Release.
func (t *Ticket) Resume(permit cooldown.Permit) {
	t.mu.Lock()
	if t.slot == slotParked {
		t.slot = slotReserved
	}
	t.permit, t.failed = permit, false
	t.mu.Unlock()
}

// Repark puts a resumed ticket back as it was parked: the resume could not
// go on for its provider's sake, and the session's window goes on.
func (t *Ticket) Repark() {
	t.mu.Lock()
	if t.slot == slotReserved {
		t.slot = slotParked
	}
	t.mu.Unlock()
}

// ChargeLost counts what the session of a hedge loser that answered 101
// costs (its provider created it all the same: a price per session in
// full, a rate for its minimum), against the provider only.
func (t *Ticket) ChargeLost() {
	t.mu.Lock()
	hold, store := t.hold, t.store
	t.hold = nil
	t.mu.Unlock()
	hold.Drop()
	if t.p.Spend.Pricing().Cost.Of(0) <= 0 {
		return
	}
	t.reg.charge(t.p.Name(), t.p.Spend.Meter(nil), store)
}

// Release gives back everything the ticket holds, whatever its state: the
// spend hold (dropped) or the session's meter (its cost counted), the
// slot (a reserved one as its attempt's outcome says, a live one with
// its session, a parked one), the client_limit share, the lease, the
// shared store kept open, the client key's book, the provider session
// created for it (released in the background), and the profile. Safe to call twice: only
// the first call gives anything back.
func (t *Ticket) Release() {
	if t == nil {
		return
	}
	t.mu.Lock()
	if t.released {
		t.mu.Unlock()
		return
	}
	t.released = true
	p, slot, failed, session, meter := t.p, t.slot, t.failed, t.live.Session, t.live.Meter
	hold, lease, store, book, remote := t.hold, t.lease, t.store, t.book, t.remote
	share, profile := t.share, t.profile
	t.hold, t.lease, t.store, t.book, t.remote, t.share, t.profile = nil, nil, nil, nil, nil, nil, nil
	t.slot = slotNone
	t.mu.Unlock()
	defer profile.Release()

	remote.Release()
	hold.Drop()
	// A reserved slot's hold goes with it: unreserve offers the provider
	// to a waiter, for whom the hold's room in the budgets may count; a
	// failed attempt's does not (its waiter would retry the failing
	// provider at once; waiters held back only by holds retry each
	// second).
	switch slot {
	case slotReserved:
		if failed {
			p.Slots.unreserveFailed()
		} else {
			p.Slots.unreserve()
		}
	case slotLive:
		p.Slots.end(session)
	case slotParked:
		p.Slots.unreserve()
	}
	if meter != nil {
		t.reg.charge(p.Name(), meter, store)
	}
	if share != nil {
		t.reg.Quotas.release(*share)
	}
	lease.Release()
	if store != nil {
		store.Release()
	}
	t.reg.ClientBooks.Leave(book)
}
