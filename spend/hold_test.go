package spend

import (
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// TestReserveHoldsTheBudget: sessions admitted at once cannot together
// overshoot a budget: each admission holds its session's cost until the
// session starts or fails.
func TestReserveHoldsTheBudget(t *testing.T) {
	c := &clock{t: time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)}
	price := &Cost{Amount: 1, Per: PerSession}
	provider := NewBook(&Budget{Amount: 1, Per: PerDay}, c.now)

	var wg sync.WaitGroup
	var mu sync.Mutex
	var got []*Hold
	refusedByHolds := 0
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, over := Reserve(price, provider, nil, 0)
			mu.Lock()
			defer mu.Unlock()
			if over == nil {
				got = append(got, h)
			} else if over.Book == provider && over.Held {
				refusedByHolds++
			}
		}()
	}
	wg.Wait()
	if len(got) != 1 || refusedByHolds != 9 {
		t.Fatalf("10 admissions at once to a budget of one session: %d admitted, %d refused by holds", len(got), refusedByHolds)
	}
	if st := provider.Read(); st.Held != 1 || st.Holds != 1 || st.Reached() {
		t.Fatalf("held: %+v", st)
	}

	// A failed attempt gives its hold back: the next one is admitted.
	got[0].Drop()
	got[0].Drop() // twice is harmless
	if st := provider.Read(); st.Held != 0 || st.Holds != 0 {
		t.Fatalf("after drop: %+v", st)
	}
	h, over := Reserve(price, provider, nil, 0)
	if over != nil {
		t.Fatalf("refused after the hold was dropped: %+v", over)
	}
	// Its session starts: the hold becomes its meter, and the budget is
	// reached by what it accrued, not by holds.
	m := h.Start()
	if st := provider.Read(); st.Held != 0 || st.Holds != 0 || st.Live != 1 || !near(st.Accrued, 1) || !st.Reached() {
		t.Fatalf("after start: %+v", st)
	}
	if h.Start() != nil {
		t.Fatal("a hold started twice")
	}
	h.Drop() // after Start: nothing
	if st := provider.Read(); st.Holds != 0 || st.Live != 1 {
		t.Fatalf("drop after start: %+v", st)
	}
	if _, over := Reserve(price, provider, nil, 0); over == nil || over.Held {
		t.Fatalf("a reached budget admitted a session, or blamed holds: %+v", over)
	}
	m.Stop()
	if st := provider.Read(); !near(st.Spent, 1) || st.Live != 0 {
		t.Fatalf("after stop: %+v", st)
	}
}

// TestReserveClientBudget: the client key's book is held to the budget
// the caller gives, checked before the provider's; a refusal by the
// provider gives the client's hold back.
func TestReserveClientBudget(t *testing.T) {
	c := &clock{t: time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)}
	rate := &Cost{Amount: 0.6, Per: PerMinute, Minimum: caddy.Duration(time.Minute)}
	provider := NewBook(&Budget{Amount: 10, Per: PerDay}, c.now)
	client := NewBook(nil, c.now)

	h1, over := Reserve(rate, provider, client, 1)
	if over != nil {
		t.Fatal(over)
	}
	// 0.6 held of 1: a second one still fits below the budget (a budget
	// is reached at or above it, as for sessions that ran).
	h2, over := Reserve(rate, provider, client, 1)
	if over != nil {
		t.Fatal(over)
	}
	if _, over := Reserve(rate, provider, client, 1); over == nil || over.Book != client || !over.Held {
		t.Fatalf("third: %+v", over)
	}
	if st := provider.Read(); !near(st.Held, 1.2) || st.Holds != 2 {
		t.Fatalf("provider held %+v", st)
	}
	h1.Drop()
	h2.Drop()

	// The provider refuses: the client's hold is given back.
	full := NewBook(&Budget{Amount: 0.5, Per: PerDay}, c.now)
	full.Charge(0.5)
	if _, over := Reserve(rate, full, client, 1); over == nil || over.Book != full || over.Held {
		t.Fatalf("provider over its budget: %+v", over)
	}
	if st := client.Read(); st.Held != 0 || st.Holds != 0 {
		t.Fatalf("client kept a hold: %+v", st)
	}
	if !client.Idle() {
		t.Fatal("a client book with nothing held is not idle")
	}

	// Without a price nothing is held, but a reached budget still refuses.
	if h, over := Reserve(nil, provider, client, 1); h != nil || over != nil {
		t.Fatalf("free provider: %v %+v", h, over)
	}
	client.Charge(1)
	if _, over := Reserve(nil, provider, client, 1); over == nil || over.Book != client {
		t.Fatalf("a client over its budget admitted to a free provider: %+v", over)
	}
	// A rate without a minimum costs nothing at its first moment: its
	// hold counts the session, not an amount.
	free := NewBook(&Budget{Amount: 1, Per: PerDay}, c.now)
	h, over := Reserve(&Cost{Amount: 1, Per: PerHour}, free, nil, 0)
	if over != nil || h == nil {
		t.Fatalf("rate without minimum: %v %+v", h, over)
	}
	if st := free.Read(); st.Holds != 1 || st.Held != 0 || free.Idle() {
		t.Fatalf("rate without minimum held %+v", st)
	}
	h.Start().Stop()
}

// TestMeterJoin: a running meter joins a client key's book with its whole
// cost since it started, refused while the key's budget is reached (with
// or without holds) and once it counts in a second book or has stopped;
// its cost goes to both books when it stops.
func TestMeterJoin(t *testing.T) {
	c := &clock{t: time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)}
	rate := &Cost{Amount: 0.6, Per: PerMinute}
	provider := NewBook(nil, c.now)
	client := NewBook(nil, c.now)
	m := provider.Start(rate, nil)
	c.add(time.Minute) // made a minute before a client takes it

	other := NewBook(nil, c.now)
	other.Charge(1)
	if over := m.Join(other, 1); over == nil || over.Book != other || over.Held {
		t.Fatalf("a spent key: %+v", over)
	}
	held := NewBook(nil, c.now)
	h, _ := Reserve(&Cost{Amount: 1, Per: PerSession}, provider, held, 2)
	held.Charge(1)
	if over := m.Join(held, 2); over == nil || over.Book != held || !over.Held {
		t.Fatalf("a key full with holds: %+v", over)
	}
	h.Drop()
	if st := provider.Read(); st.Live != 1 {
		t.Fatalf("a refused join changed the provider's book: %+v", st)
	}

	if over := m.Join(client, 1); over != nil {
		t.Fatal(over)
	}
	if st := client.Read(); st.Live != 1 || !near(st.Accrued, 0.6) {
		t.Fatalf("the client's book counts %+v, want the minute since the start", st)
	}
	if over := m.Join(other, 0); over == nil || over.Book != nil {
		t.Fatalf("a second client book: %+v", over)
	}
	if m.Client() != client {
		t.Fatal("Client is not the joined book")
	}
	c.add(time.Minute)
	if cost, _ := m.Stop(); !near(cost, 1.2) {
		t.Fatalf("cost %v", cost)
	}
	if p, cl := provider.Read(), client.Read(); !near(p.Spent, 1.2) || !near(cl.Spent, 1.2) || cl.Live != 0 {
		t.Fatalf("after stop: provider %+v, client %+v", p, cl)
	}
	if over := m.Join(NewBook(nil, c.now), 0); over == nil {
		t.Fatal("a stopped meter joined a book")
	}
	var none *Meter
	if over := none.Join(client, 1); over != nil {
		t.Fatalf("a nil meter: %+v", over)
	}
}

// TestReserveAhead: a session made ahead of demand is admitted only when
// the budget can pay for it in full, counting what the others being
// admitted hold; a client's admission only needs the budget not reached.
func TestReserveAhead(t *testing.T) {
	c := &clock{t: time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)}
	price := &Cost{Amount: 1, Per: PerSession}
	provider := NewBook(&Budget{Amount: 1.5, Per: PerDay}, c.now)

	var wg sync.WaitGroup
	var mu sync.Mutex
	var got []*Hold
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, over := ReserveAhead(price, provider, nil, 0, price.Of(5*time.Minute))
			mu.Lock()
			defer mu.Unlock()
			if over == nil {
				got = append(got, h)
			} else if over.Book != provider || !over.Held {
				t.Errorf("refused by %+v, want by the other's hold", over)
			}
		}()
	}
	wg.Wait()
	if len(got) != 1 {
		t.Fatalf("two warm-ups at once to a budget of 1.5 at 1 a session: %d admitted", len(got))
	}
	got[0].Start()
	// 1 accrued: another whole session does not fit, though the budget
	// is not reached, so a client is still admitted.
	if _, over := ReserveAhead(price, provider, nil, 0, 1); over == nil || over.Held {
		t.Fatalf("a warm-up the budget cannot pay for: %+v", over)
	}
	if h, over := Reserve(price, provider, nil, 0); over != nil {
		t.Fatalf("a client below the budget refused: %+v", over)
	} else {
		h.Drop()
	}
	// A budget of exactly one session pays for one.
	exact := NewBook(&Budget{Amount: 1, Per: PerDay}, c.now)
	if _, over := ReserveAhead(price, exact, nil, 0, 1); over != nil {
		t.Fatalf("a budget of one session refused it: %+v", over)
	}
}
