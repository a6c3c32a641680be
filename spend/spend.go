// Package spend owns what browser sessions cost: a provider's price (per
// session, minute or hour, with a minimum), the calendar windows budgets
// are counted in (hours, days and months in UTC), the meter of one
// session's cost as it runs, and the book of what was spent in the current
// window by one provider or one client key, with the accrued cost of its
// live sessions beside it.
//
// The package is pure logic over an injectable clock: no I/O, no
// goroutines, no timers. The amounts are the operator's units (no
// currency). Under shared state the caller writes each ended session's cost
// to the shared store and tells the book the shared total (SetShared).
package spend

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// The units of a cost.
const (
	PerSession = "session"
	PerMinute  = "minute"
	PerHour    = "hour"
)

// The periods of a budget.
const (
	PerDay   = "day"
	PerMonth = "month"
)

// Cost is what a provider charges (JSON key "cost"): an amount per
// session, or per minute or hour of a session's life, which a minimum
// bounds from below.
type Cost struct {
	// Amount is the price per unit, not negative. Required.
	Amount float64 `json:"amount"`
	// Per is the unit: "session", "minute" or "hour". Required.
	Per string `json:"per"`
	// Minimum is the least duration a session is charged for (minute or
	// hour only); not negative. Default: 0.
	Minimum caddy.Duration `json:"minimum,omitempty"`
}

// Validate checks the cost's form; messages name the option as the
// Caddyfile does ("cost").
func (c *Cost) Validate() error {
	if c == nil {
		return nil
	}
	var errs []error
	if !(c.Amount >= 0) || math.IsInf(c.Amount, 0) {
		errs = append(errs, fmt.Errorf("cost amount must be a number not below 0, got %v", c.Amount))
	}
	switch c.Per {
	case PerSession, PerMinute, PerHour:
	default:
		errs = append(errs, fmt.Errorf("cost per %q: want session, minute or hour", c.Per))
	}
	if c.Minimum < 0 {
		errs = append(errs, fmt.Errorf("cost minimum must not be negative, got %v", time.Duration(c.Minimum)))
	}
	if c.Minimum > 0 && c.Per == PerSession {
		errs = append(errs, errors.New("cost minimum applies to a rate (per minute or hour), not to a price per session"))
	}
	return errors.Join(errs...)
}

// unit is the duration a rate is priced by (0 for a price per session).
func (c *Cost) unit() time.Duration {
	switch c.Per {
	case PerMinute:
		return time.Minute
	case PerHour:
		return time.Hour
	}
	return 0
}

// Of is the cost of a session that has lasted d: the price per session
// (charged in full from its first moment), or max(d, Minimum) times the
// rate. A nil Cost costs nothing.
func (c *Cost) Of(d time.Duration) float64 {
	if c == nil {
		return 0
	}
	u := c.unit()
	if u == 0 {
		return c.Amount
	}
	d = max(d, time.Duration(c.Minimum), 0)
	return c.Amount * float64(d) / float64(u)
}

// String is the cost as the Caddyfile writes it.
func (c *Cost) String() string {
	if c == nil {
		return ""
	}
	s := fmt.Sprintf("%g per %s", c.Amount, c.Per)
	if c.Minimum > 0 {
		s += " minimum " + time.Duration(c.Minimum).String()
	}
	return s
}

// Budget caps what a provider, or a client key, may spend in one calendar
// window (JSON key "budget").
type Budget struct {
	// Amount is the most that may be spent in one window; positive.
	// Required.
	Amount float64 `json:"amount"`
	// Per is the window: "hour", "day" or "month", in UTC. Required.
	Per string `json:"per"`
}

// Validate checks the budget's form.
func (b *Budget) Validate() error {
	if b == nil {
		return nil
	}
	var errs []error
	if !(b.Amount > 0) || math.IsInf(b.Amount, 0) {
		errs = append(errs, fmt.Errorf("budget amount must be a number above 0, got %v", b.Amount))
	}
	if err := CheckPeriod(b.Per); err != nil {
		errs = append(errs, fmt.Errorf("budget %w", err))
	}
	return errors.Join(errs...)
}

// CheckPeriod checks the name of a budget's window.
func CheckPeriod(per string) error {
	switch per {
	case PerHour, PerDay, PerMonth:
		return nil
	}
	return fmt.Errorf("per %q: want hour, day or month", per)
}

// Window is the calendar window of period per (hour, day or month; any
// other value counts as day) that holds t, in UTC: its start, and its end,
// which is the next window's start.
func Window(per string, t time.Time) (start, end time.Time) {
	t = t.UTC()
	switch per {
	case PerHour:
		start = t.Truncate(time.Hour)
		return start, start.Add(time.Hour)
	case PerMonth:
		start = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 1, 0)
	}
	start = time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	return start, start.AddDate(0, 0, 1)
}

// ParseAmount reads an amount as the Caddyfile gives it: a plain decimal
// number (amounts carry no currency).
func ParseAmount(s string) (float64, error) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("amount %q is not a number", s)
	}
	return v, nil
}

// Book is what one provider or client key spent: the sessions that ended
// in the current window (of its budget's period, or of a day without a
// budget), all-time, and its live meters. Safe for concurrent use.
type Book struct {
	now    func() time.Time
	per    string
	budget float64 // 0: none

	mu         sync.Mutex
	start, end time.Time
	// spent is what sessions that ended in the window cost, counted
	// here: all of them, or under shared state those not yet written to
	// the shared store.
	spent float64
	// shared is the window's spent as the shared store last told it
	// (sharedAt is its window's start).
	shared    float64
	sharedAt  time.Time
	hasShared bool
	live      map[*Meter]struct{}
	// held is what the sessions being admitted will cost at their first
	// moment (hold.go), holds how many there are.
	held  float64
	holds int
}

// NewBook returns the book of a budget (nil: none; its window is then a
// day) over the clock now.
func NewBook(b *Budget, now func() time.Time) *Book {
	k := &Book{now: now, per: PerDay, live: map[*Meter]struct{}{}}
	k.Configure(b)
	return k
}

// Configure sets the budget (a config reload may change it; nil: none).
// The window keeps what it counted when its period stays the same.
func (k *Book) Configure(b *Budget) {
	k.mu.Lock()
	defer k.mu.Unlock()
	per, amount := PerDay, 0.0
	if b != nil {
		per, amount = b.Per, b.Amount
	}
	if per != k.per {
		k.per = per
		k.start, k.end = time.Time{}, time.Time{}
		k.spent, k.hasShared = 0, false
	}
	k.budget = amount
}

// turn moves the book to the window of now; called with mu held.
func (k *Book) turn(now time.Time) {
	if !k.end.IsZero() && now.Before(k.end) && !now.Before(k.start) {
		return
	}
	k.start, k.end = Window(k.per, now)
	k.spent = 0
	if k.hasShared && !k.sharedAt.Equal(k.start) {
		k.hasShared = false
	}
}

// Period is the book's window period.
func (k *Book) Period() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.per
}

// Start begins metering a session at cost c from now; the meter counts
// toward the book's accrued cost until it stops. other, when not nil, is a
// second book (the client key's) that counts the same session. Without a
// cost there is nothing to meter: the meter is nil (its methods take nil),
// and a live session of a provider without a price weighs nothing here.
func (k *Book) Start(c *Cost, other *Book) *Meter {
	if c == nil {
		return nil
	}
	m := &Meter{cost: c, start: k.now(), books: [2]*Book{k, other}}
	for _, b := range m.books {
		if b != nil {
			b.mu.Lock()
			b.live[m] = struct{}{}
			b.mu.Unlock()
		}
	}
	return m
}

// Charge adds amount to the window's spent at once (a session that cost
// something without being relayed: a hedge loser).
func (k *Book) Charge(amount float64) {
	if amount <= 0 {
		return
	}
	k.mu.Lock()
	k.turn(k.now())
	k.spent += amount
	k.mu.Unlock()
}

// SetShared records the shared store's total for the window starting at
// start, after a write of this process's that carried mine (0 for a
// plain read): the total stands for every ended session of the window
// written there, and mine is no longer counted apart. A total for another
// window than the current one is ignored; totals only grow within a
// window (an older read never lowers a newer one). A total that is not a
// finite number ≥ 0 is no total: ignored, mine stays counted here.
func (k *Book) SetShared(start time.Time, total, mine float64) {
	if math.IsNaN(total) || math.IsInf(total, 0) || total < 0 {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.turn(k.now())
	if !start.Equal(k.start) {
		return
	}
	if !k.hasShared || total > k.shared {
		k.shared = total
	}
	k.sharedAt, k.hasShared = start, true
	k.spent = max(k.spent-mine, 0)
}

// Shared reports whether the book counts a shared total.
func (k *Book) Shared() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.hasShared
}

// State is a book as status shows it.
type State struct {
	// WindowStart is when the current window began (UTC).
	WindowStart time.Time
	// WindowEnd is when it turns.
	WindowEnd time.Time
	// Spent is what ended sessions cost in the window.
	Spent float64
	// Accrued is what the live sessions cost so far.
	Accrued float64
	// Live is the number of live meters.
	Live int
	// Budget is the window's budget (0: none).
	Budget float64
	// Held is what the sessions being admitted will cost at their first
	// moment (Reserve), Holds how many they are.
	Held  float64
	Holds int
}

// Reached reports whether Spent + Accrued has reached the budget.
func (s State) Reached() bool { return s.ReachedAt(s.Budget) }

// ReachedAt reports whether Spent + Accrued has reached budget (0: none).
func (s State) ReachedAt(budget float64) bool { return budget > 0 && s.Spent+s.Accrued >= budget }

// Read returns the book's state now.
func (k *Book) Read() State {
	now := k.now()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.turn(now)
	return k.readLocked(now)
}

// readLocked is Read, with mu held and the window turned.
func (k *Book) readLocked(now time.Time) State {
	st := State{WindowStart: k.start, WindowEnd: k.end, Spent: k.spent, Budget: k.budget, Live: len(k.live),
		Held: k.held, Holds: k.holds}
	if k.hasShared {
		st.Spent += k.shared
	}
	for m := range k.live {
		st.Accrued += m.cost.Of(now.Sub(m.start))
	}
	return st
}

// Reached reports whether the budget is reached now, and when the window
// turns.
func (k *Book) Reached() (bool, time.Time) {
	st := k.Read()
	return st.Reached(), st.WindowEnd
}

// ReachedAt reports whether budget (0: none) is reached now, and when the
// window turns: a client key's book is held to the budget of the handler
// that asks.
func (k *Book) ReachedAt(budget float64) (bool, time.Time) {
	st := k.Read()
	return st.ReachedAt(budget), st.WindowEnd
}

// Idle reports whether the book holds nothing worth keeping: no live
// meter, no session being admitted, nothing spent in the current window.
func (k *Book) Idle() bool {
	st := k.Read()
	return st.Live == 0 && st.Holds == 0 && st.Spent == 0
}

// Meter is one session's cost as it runs.
type Meter struct {
	cost  *Cost
	start time.Time
	books [2]*Book

	mu    sync.Mutex
	done  bool
	final float64
}

// Accrued is the session's cost so far: its final cost once stopped.
func (m *Meter) Accrued() float64 {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done {
		return m.final
	}
	return m.cost.Of(m.books[0].now().Sub(m.start))
}

// Stop ends the meter: the session's cost is added to its books' current
// windows and returned, with true the first time (a second Stop returns the
// same cost and false).
func (m *Meter) Stop() (float64, bool) {
	if m == nil {
		return 0, false
	}
	m.mu.Lock()
	if m.done {
		m.mu.Unlock()
		return m.final, false
	}
	now := m.books[0].now()
	m.final = m.cost.Of(now.Sub(m.start))
	m.done = true
	m.mu.Unlock()
	for _, b := range m.books {
		if b == nil {
			continue
		}
		b.mu.Lock()
		delete(b.live, m)
		b.turn(now)
		b.spent += m.final
		b.mu.Unlock()
	}
	return m.final, true
}

// Cost is what the meter charges by (nil for a nil meter).
func (m *Meter) Cost() *Cost {
	if m == nil {
		return nil
	}
	return m.cost
}

// Client is the meter's second book (nil: none, or a nil meter).
func (m *Meter) Client() *Book {
	if m == nil {
		return nil
	}
	return m.books[1]
}
