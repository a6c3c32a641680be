package pool

import (
	"fmt"
	"testing"
)

// TestClientBookKeptWhileInUse: the sweep of idle client books never
// drops one a connect still uses (it joined, and waits or attempts
// before its session's meter starts): that key's spend would go to a
// book nobody finds again, and its next connect would start from nothing.
func TestClientBookKeptWhileInUse(t *testing.T) {
	r := NewRegistry(nil)
	id := ClientBookID{Template: "{http.request.header.X-Tenant}", Per: "day", Value: "tenant-a"}
	book := r.ClientBooks.Use(id, 1)
	// Enough other keys, each seen once and let go, for several sweeps.
	for i := range 250 {
		other := r.ClientBooks.Use(ClientBookID{Template: id.Template, Per: "day", Value: fmt.Sprint("k", i)}, 1)
		r.ClientBooks.Leave(other)
	}
	if got := r.ClientBooks.Use(id, 1); got != book {
		t.Fatal("the sweep dropped a book a connect still uses")
	}
	r.ClientBooks.Leave(book)
	r.ClientBooks.Leave(book)
	// Let go and idle, it is swept with the rest.
	for i := range 250 {
		r.ClientBooks.Leave(r.ClientBooks.Use(ClientBookID{Template: id.Template, Per: "day", Value: fmt.Sprint("j", i)}, 1))
	}
	if n := len(r.ClientBooks.Entries()); n > 100 {
		t.Fatalf("%d books kept of 501 idle keys", n)
	}
}

// TestClientBooksPerBudget: handlers whose client_budget differs in key
// template or period keep books of their own for the same key value; the
// same template and period share one, each handler holding it to its own
// amount.
func TestClientBooksPerBudget(t *testing.T) {
	r := NewRegistry(nil)
	day := ClientBookID{Template: "{http.request.header.X-Tenant}", Per: "day", Value: "tenant-a"}
	hour := day
	hour.Per = "hour"
	user := day
	user.Template = "{http.auth.user.id}"
	a, b, c := r.ClientBooks.Use(day, 1), r.ClientBooks.Use(hour, 5), r.ClientBooks.Use(user, 1)
	if a == b || a == c || b == c {
		t.Fatal("books of different client budgets are shared")
	}
	a.Charge(1)
	if got := r.ClientBooks.Use(day, 50); got != a {
		t.Fatal("the same template and period got another book")
	}
	if over, _ := a.ReachedAt(1); !over {
		t.Fatal("the day's budget of 1 is not reached at 1")
	}
	if over, _ := a.ReachedAt(50); over {
		t.Fatal("a budget of 50 is reached at 1")
	}
	if st := b.Read(); st.Spent != 0 {
		t.Fatalf("the hour's book counts the day's spend: %+v", st)
	}
	entries := map[string]bool{}
	for _, e := range r.ClientBooks.Entries() {
		entries[e.Scope] = true
	}
	if len(entries) != 3 {
		t.Fatalf("shared scopes %v: want three distinct", entries)
	}
}
