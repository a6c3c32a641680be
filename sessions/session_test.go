package sessions

import (
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/queue"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// fakeClock runs AfterFunc callbacks from Advance, in time order.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c    *fakeClock
	at   time.Time
	f    func()
	done bool
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.done
	t.done = true
	return was
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) queue.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

// Advance moves the clock by d, running what falls due on the way.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		sort.SliceStable(c.timers, func(i, j int) bool { return c.timers[i].at.Before(c.timers[j].at) })
		var next *fakeTimer
		for _, t := range c.timers {
			if !t.done && !t.at.After(end) {
				next = t
				break
			}
		}
		if next == nil {
			c.now = end
			c.mu.Unlock()
			return
		}
		next.done = true
		c.now = next.at
		c.mu.Unlock()
		next.f()
	}
}

// fakeBody is a body whose activity the test moves; Close ends it at
// once, as its session's Ended.
type fakeBody struct {
	s      *Session
	n      atomic.Int64
	busy   atomic.Bool
	ticks  atomic.Int64
	closed []string
	mu     sync.Mutex
	// elsewhere, when set, is how long ago another node saw it used.
	elsewhere *time.Duration
}

func (b *fakeBody) Activity() (int64, bool) { return b.n.Load(), b.busy.Load() }
func (b *fakeBody) BytesUp() int64          { return 3 }
func (b *fakeBody) BytesDown() int64        { return 4 }
func (b *fakeBody) Close(code int, reason string) {
	b.mu.Lock()
	b.closed = append(b.closed, reason)
	b.mu.Unlock()
	b.s.Ended(reason)
}
func (b *fakeBody) closes() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.closed...)
}

type tickingBody struct{ *fakeBody }

func (b tickingBody) Tick(time.Time) { b.ticks.Add(1) }

type elsewhereBody struct{ *fakeBody }

func (b elsewhereBody) IdleElsewhere() (time.Duration, bool) {
	if b.elsewhere == nil {
		return 0, false
	}
	return *b.elsewhere, true
}

type fieldBody struct{ *fakeBody }

func (b fieldBody) EndFields() []zap.Field { return []zap.Field{zap.Int64("commands", 7)} }

// setup is a session of body on a fake clock whose ticket holds a
// client_limit share, and the log it writes to.
func setup(t *testing.T, body Body, fb *fakeBody, limits Limits) (*Session, *fakeClock, *pool.Registry, pool.QuotaKey, *observer.ObservedLogs) {
	t.Helper()
	clock := &fakeClock{now: time.Unix(1000, 0)}
	reg := pool.NewRegistry(clock)
	tk := reg.NewTicket()
	k := pool.QuotaKey{Template: "{k}", Value: "v"}
	if !tk.TakeShare(k, 1) {
		t.Fatal("no share")
	}
	core, logs := observer.New(zap.InfoLevel)
	s := New(Deps{Clock: clock, Logger: zap.New(core), Metrics: observe.NewMetrics()}, tk, body, limits,
		Entry{ID: "id1", Provider: "p", Fields: []zap.Field{zap.Bool("warm", true)}})
	fb.s = s
	s.Run()
	return s, clock, reg, k, logs
}

func TestIdle(t *testing.T) {
	fb := &fakeBody{}
	s, clock, reg, k, logs := setup(t, fb, fb, Limits{Idle: 4 * time.Second})
	clock.Advance(3 * time.Second)
	fb.n.Add(1) // used: idleness counts again from the next look
	clock.Advance(3 * time.Second)
	if len(fb.closes()) != 0 {
		t.Fatalf("closed while used: %v", fb.closes())
	}
	clock.Advance(3 * time.Second)
	if got := fb.closes(); len(got) != 1 || got[0] != upstreams.EndIdle {
		t.Fatalf("closes %v, want one %q", got, upstreams.EndIdle)
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("not done")
	}
	if n := reg.Quotas.Active(k); n != 0 {
		t.Fatalf("share still held: %d", n)
	}
	es := logs.FilterMessage("session ended").All()
	if len(es) != 1 {
		t.Fatalf("%d end entries", len(es))
	}
	m := es[0].ContextMap()
	if m["session_id"] != "id1" || m["provider"] != "p" || m["close_reason"] != upstreams.EndIdle || m["bytes_up"] != int64(3) || m["warm"] != true {
		t.Fatalf("entry %v", m)
	}
	// A second end does nothing more.
	s.Ended("again")
	if n := len(logs.FilterMessage("session ended").All()); n != 1 {
		t.Fatalf("%d end entries after a second end", n)
	}
}

func TestBusyNeverIdle(t *testing.T) {
	fb := &fakeBody{}
	fb.busy.Store(true)
	_, clock, _, _, _ := setup(t, fb, fb, Limits{Idle: time.Second})
	clock.Advance(time.Minute)
	if got := fb.closes(); len(got) != 0 {
		t.Fatalf("a busy session closed: %v", got)
	}
	fb.busy.Store(false)
	clock.Advance(2 * time.Second)
	if got := fb.closes(); len(got) != 1 {
		t.Fatalf("closes %v after it stopped being busy", got)
	}
}

func TestMaxDuration(t *testing.T) {
	fb := &fakeBody{}
	_, clock, _, _, _ := setup(t, fb, fb, Limits{MaxDuration: 10 * time.Second})
	clock.Advance(9 * time.Second)
	if len(fb.closes()) != 0 {
		t.Fatal("closed early")
	}
	clock.Advance(time.Second)
	if got := fb.closes(); len(got) != 1 || got[0] != upstreams.EndMaxDuration {
		t.Fatalf("closes %v", got)
	}
}

func TestKeeperKeepsTicket(t *testing.T) {
	fb := &fakeBody{}
	s, _, reg, k, _ := setup(t, fb, fb, Limits{})
	s.SetKeeper(func() bool { return true })
	fb.Close(1000, upstreams.EndClientClosed)
	if n := reg.Quotas.Active(k); n != 1 {
		t.Fatalf("a kept ticket gave back its share: %d", n)
	}
	s.Ticket().Release()
	if n := reg.Quotas.Active(k); n != 0 {
		t.Fatalf("share %d after the keeper released", n)
	}
}

func TestKeepaliveTicks(t *testing.T) {
	fb := &fakeBody{}
	_, clock, _, _, _ := setup(t, tickingBody{fb}, fb, Limits{Keepalive: 4 * time.Second})
	clock.Advance(8 * time.Second)
	if n := fb.ticks.Load(); n < 7 || n > 8 {
		t.Fatalf("%d ticks in two keepalive intervals, want 8", n)
	}
	if len(fb.closes()) != 0 {
		t.Fatal("keepalive alone ended the session")
	}
}

func TestIdleElsewhere(t *testing.T) {
	fb := &fakeBody{}
	seen := 2 * time.Second
	fb.elsewhere = &seen
	_, clock, _, _, _ := setup(t, elsewhereBody{fb}, fb, Limits{Idle: 8 * time.Second})
	clock.Advance(10 * time.Second)
	if len(fb.closes()) != 0 {
		t.Fatal("ended although another node saw it used 2 s ago")
	}
	fb.elsewhere = nil
	clock.Advance(10 * time.Second)
	if len(fb.closes()) != 1 {
		t.Fatalf("closes %v", fb.closes())
	}
}

func TestHandover(t *testing.T) {
	warm := &fakeBody{}
	s, clock, _, _, logs := setup(t, warm, warm, Limits{MaxDuration: 5 * time.Second})
	clock.Advance(4 * time.Second)
	client := &fakeBody{s: s}
	s.Handover(fieldBody{client}, Limits{MaxDuration: 10 * time.Second}, Entry{ID: "id2", Provider: "p"})
	clock.Advance(5 * time.Second)
	if len(warm.closes())+len(client.closes()) != 0 {
		t.Fatal("the warm session's age ended the client's session")
	}
	clock.Advance(5 * time.Second)
	if got := client.closes(); len(got) != 1 || got[0] != upstreams.EndMaxDuration {
		t.Fatalf("client closes %v", got)
	}
	m := logs.FilterMessage("session ended").All()[0].ContextMap()
	if m["session_id"] != "id2" || m["commands"] != int64(7) || m["duration_ms"] != float64(10000) {
		t.Fatalf("entry %v", m)
	}
}
