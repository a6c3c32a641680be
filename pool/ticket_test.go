package pool

import (
	"testing"

	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/spend"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// TestTicketGivesBackOnce: whatever state a ticket is in when it is
// released, its slot, share, spend hold or meter and client book go back
// exactly once; a second release gives back nothing.
func TestTicketGivesBackOnce(t *testing.T) {
	r, _ := fakeRegistry(t, true)
	gen := new(int)
	p, err := r.Claim("ticket-unit", "ws://h:1/", "ws://h:1/", gen, cooldown.Config{MinRequests: 3}, false, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer r.ReleaseClaim("ticket-unit", gen)
	p.Spend.SetPricing(Pricing{Cost: &spend.Cost{Amount: 1, Per: spend.PerSession}, Budget: &spend.Budget{Amount: 10, Per: spend.PerDay}})
	k := QuotaKey{Template: "{k}", Value: "a"}

	admit := func(client *Ticket) *Ticket {
		t.Helper()
		permit, ok := p.Health.Acquire()
		if !ok {
			t.Fatal("no permit")
		}
		tk := p.Admit(permit)
		if tk == nil {
			t.Fatal("no slot")
		}
		hold, over := p.Spend.Reserve(client.ClientBook(), 5, 0)
		if over != nil {
			t.Fatal(over)
		}
		tk.Keep(nil, nil, hold)
		p.Health.Done(permit, cooldown.Neutral, 0)
		return tk
	}

	// A client joins (a share, a book), an attempt is admitted and fails.
	client := r.NewTicket()
	if !client.TakeShare(k, 1) {
		t.Fatal("no share")
	}
	book := client.UseClientBook(ClientBookID{Template: "{k}", Per: "day", Value: "a"}, 5)
	failed := admit(client)
	if p.Slots.Reserved() != 1 || p.Spend.Book().Read().Holds != 1 || book.Read().Holds != 1 {
		t.Fatalf("admitted: reserved %d, holds %+v %+v", p.Slots.Reserved(), p.Spend.Book().Read(), book.Read())
	}
	failed.Failed()
	failed.Release()
	failed.Release()
	if p.Slots.Reserved() != 0 || p.Spend.Book().Read().Holds != 0 || book.Read().Holds != 0 || r.Quotas.Active(k) != 1 {
		t.Fatalf("failed attempt: reserved %d, holds %+v, quota %d", p.Slots.Reserved(), p.Spend.Book().Read(), r.Quotas.Active(k))
	}

	// The next one wins: it takes the client's share and book, goes live,
	// parks and resumes.
	won := admit(client)
	won.Join(client)
	client.Release() // empty: gives back nothing
	if r.Quotas.Active(k) != 1 {
		t.Fatal("the joined share was given back by the client's ticket")
	}
	s := &upstreams.Session{}
	meter := won.Establish(s, SessionInfo{ID: "s1"}, nil)
	if meter == nil || p.Slots.Active() != 1 || p.Spend.Book().Read().Holds != 0 || p.Spend.Book().Read().Live != 1 {
		t.Fatalf("live: meter %v active %d book %+v", meter, p.Slots.Active(), p.Spend.Book().Read())
	}
	if _, ok := r.Sessions.ByID("s1"); !ok {
		t.Fatal("the live session is not listed")
	}
	won.Park()
	if p.Slots.Active() != 0 || p.Slots.Reserved() != 1 {
		t.Fatalf("parked: active %d reserved %d", p.Slots.Active(), p.Slots.Reserved())
	}
	if _, ok := r.Sessions.ByID("s1"); ok {
		t.Fatal("a parked session is listed as live")
	}
	permit, _ := p.Health.Acquire()
	won.Resume(permit)
	p.Health.Done(permit, cooldown.Success, 0)
	if won.Establish(&upstreams.Session{}, SessionInfo{ID: "s2"}, nil) != meter {
		t.Fatal("a resumed session started another meter")
	}
	won.Release()
	won.Release()
	if p.Slots.Active() != 0 || p.Slots.Reserved() != 0 || r.Quotas.Active(k) != 0 {
		t.Fatalf("released: active %d reserved %d quota %d", p.Slots.Active(), p.Slots.Reserved(), r.Quotas.Active(k))
	}
	if st := p.Spend.Book().Read(); st.Spent != 1 || st.Live != 0 {
		t.Fatalf("the session's cost counted %+v", st)
	}
	if st := book.Read(); st.Spent != 1 {
		t.Fatalf("the client's book %+v", st)
	}
	// The book is no longer used: idle keys may be swept.
	r.ClientBooks.mu.Lock()
	users := r.ClientBooks.byBook[book].users
	r.ClientBooks.mu.Unlock()
	if users != 0 {
		t.Fatalf("the client book is still used by %d", users)
	}
}
