package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// sharedConfig is a Config on r private to the test.
func sharedConfig(t *testing.T, r *redisServer) Config {
	return Config{
		Address:   r.Addr(),
		LeaseTTL:  caddy.Duration(600 * time.Millisecond),
		Timeout:   caddy.Duration(300 * time.Millisecond),
		KeyPrefix: "test:" + t.Name() + ":",
	}
}

// use calls Use and fails the test on error.
func use(t *testing.T, cfg Config, node string) *Shared {
	t.Helper()
	s, err := Use(cfg, node, testLogger(t))
	if err != nil {
		t.Fatalf("Use: %v", err)
	}
	return s
}

// users is the number of users of key in the pool (0: not there).
func users(key string) int {
	n, _ := stores.References(key)
	return n
}

// TestSharedOneStore: two handlers with the same settings share one store,
// a live session holding a lease keeps it open past both handlers, and it
// closes (giving the lease back) only at the last Release.
func TestSharedOneStore(t *testing.T) {
	r := startRedis(t)
	cfg := sharedConfig(t, r)
	a := use(t, cfg, "n1")
	b := use(t, cfg, "n1")
	if a != b || a.Store() != b.Store() {
		t.Fatal("two users of the same settings got different stores")
	}
	if n := users(a.key); n != 2 {
		t.Fatalf("users %d, want 2", n)
	}
	other := use(t, cfg, "n2")
	if other == a {
		t.Fatal("another node name shares the store")
	}
	other.Release()

	// A session takes a slot and keeps the store for its renewals.
	g, err := a.Store().Leases().Acquire(context.Background(), "p", 0)
	if err != nil || g.Lease == nil {
		t.Fatalf("Acquire: %+v %v", g, err)
	}
	a.Retain()
	a.Release() // first handler
	b.Release() // second handler: the session still holds it
	if a.gone.Load() || a.Store().Closed() {
		t.Fatal("store closed while a session still uses it")
	}
	if n := users(a.key); n != 1 {
		t.Fatalf("users %d, want 1 (the session)", n)
	}
	if sh := share(t, open(t, r, "reader", func(c *Config) { c.KeyPrefix = cfg.KeyPrefix }), "p"); sh.Active != 1 {
		t.Fatalf("lease not held while the session lives: %+v", sh)
	}

	a.Release() // the session ends
	if !a.gone.Load() {
		t.Fatal("the last Release did not take the store out of the pool")
	}
	if n := users(a.key); n != 0 {
		t.Fatalf("users %d after the last Release", n)
	}
	eventually(t, 5*time.Second, "store closed", a.Store().Closed)
	if sh := share(t, open(t, r, "reader2", func(c *Config) { c.KeyPrefix = cfg.KeyPrefix }), "p"); sh.Active != 0 {
		t.Fatalf("closing the store did not give its lease back: %+v", sh)
	}

	// The same settings again open a new store.
	c := use(t, cfg, "n1")
	defer c.Release()
	if c == a || c.Store().Closed() {
		t.Fatal("Use after the last Release returned the closed store")
	}
}

// TestSharedRetainAfterClose: a late session of a handler whose store has
// closed neither brings it back nor counts against the store that replaced
// it under the same settings.
func TestSharedRetainAfterClose(t *testing.T) {
	r := startRedis(t)
	cfg := sharedConfig(t, r)
	old := use(t, cfg, "n1")
	old.Release()
	if !old.gone.Load() {
		t.Fatal("not closed after its only Release")
	}
	fresh := use(t, cfg, "n1")
	defer fresh.Release()
	old.Retain()
	if n := users(fresh.key); n != 1 {
		t.Fatalf("users %d after a Retain of the closed store, want 1", n)
	}
	old.Release()
	if n := users(fresh.key); n != 1 || fresh.gone.Load() {
		t.Fatalf("the closed store's Release touched its successor: users %d", n)
	}
}

// TestSharedUseInvalid: settings Open rejects leave nothing in the pool.
func TestSharedUseInvalid(t *testing.T) {
	cfg := Config{Address: "redis://user:hunter22@host:6379", Password: "hunter22"}
	if _, err := Use(cfg, "n1", nil); err == nil || strings.Contains(err.Error(), "hunter22") {
		t.Fatalf("Use: %v", err)
	}
	if n := users(poolKey(cfg, "n1")); n != 0 {
		t.Fatalf("a failed Use left %d users", n)
	}
}

// TestSharedKeyHidesPassword: the pool key tells settings apart without
// holding the password.
func TestSharedKeyHidesPassword(t *testing.T) {
	cfg := Config{Address: "127.0.0.1:6379", Password: "hunter22"}
	k1 := poolKey(cfg, "n1")
	if strings.Contains(k1, "hunter22") {
		t.Fatalf("key %q holds the password", k1)
	}
	cfg.Password = "hunter23"
	if poolKey(cfg, "n1") == k1 {
		t.Fatal("a changed password keeps the key")
	}
	cfg.Password = "hunter22"
	if poolKey(cfg, "n2") == k1 {
		t.Fatal("another node keeps the key")
	}
	if poolKey(cfg, "n1") != k1 {
		t.Fatal("the same settings give another key")
	}
}

// hookLog records what a Shared tells its Hooks.
type hookLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *hookLog) add(c string) {
	l.mu.Lock()
	l.calls = append(l.calls, c)
	l.mu.Unlock()
}

// hooks returns Hooks recording into l.
func (l *hookLog) hooks() Hooks {
	return Hooks{
		Opened: func() { l.add("opened") },
		Closed: func() { l.add("closed") },
		Up:     func(up bool) { l.add(fmt.Sprintf("up %v", up)) },
		Failed: func(op string) { l.add("failed " + op) },
	}
}

// take returns the calls recorded since the last take.
func (l *hookLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.calls
	l.calls = nil
	return out
}

// TestSharedClusterStates: the providers' states, read in one call, and
// their unavailable form, given at once, with the back-off while Redis is
// down; the Hooks are told of the store's opening, its calls' outcomes and
// its closing.
func TestSharedClusterStates(t *testing.T) {
	r := startRedis(t)
	var log hookLog
	cfg := sharedConfig(t, r)
	cfg.Hooks = log.hooks()
	s := use(t, cfg, "n1")
	released := false
	defer func() {
		if !released {
			s.Release()
		}
	}()
	// The first ping runs on its own goroutine: it tells nothing when it
	// works, and there is no call to wait for.
	if got := log.take(); !slices.Equal(got, []string{"opened", "up true"}) {
		t.Fatalf("hooks at open: %q", got)
	}
	ctx := context.Background()
	g, err := s.Store().Leases().Acquire(ctx, "p", 0)
	if err != nil || g.Lease == nil {
		t.Fatalf("Acquire: %+v %v", g, err)
	}
	defer g.Lease.Release()
	states, up := s.ClusterStates(ctx, []string{"p", "none"})
	got := states["p"]
	if !up || len(states) != 2 || !got.Up || got.Node != "n1" || got.Active != 1 || got.Nodes["n1"] != 1 || !got.Hold.IsZero() {
		t.Fatalf("ClusterStates %+v %v", states, up)
	}
	if idle := states["none"]; !idle.Up || idle.Node != "n1" || idle.Active != 0 || len(idle.Nodes) != 0 || !idle.Hold.IsZero() {
		t.Fatalf("idle provider: %+v", idle)
	}
	if got := log.take(); !slices.Equal(got, []string{"up true"}) {
		t.Fatalf("hooks after a read: %q", got)
	}
	if n, ok := s.ClusterActive("p"); !ok || n != 1 {
		t.Fatalf("ClusterActive %d %v", n, ok)
	}
	if !s.Usable() {
		t.Fatal("not usable while Redis answers")
	}

	r.Stop()
	states, up = s.ClusterStates(ctx, []string{"p", "none"})
	want := map[string]ProviderState{"p": {Node: "n1"}, "none": {Node: "n1"}}
	if up || fmt.Sprint(states) != fmt.Sprint(want) {
		t.Fatalf("Redis down: %+v %v", states, up)
	}
	if s.Usable() {
		t.Fatal("usable right after a failed call")
	}
	// The open's first check runs on its own goroutine: on a loaded
	// machine it may be the call that finds Redis gone (then the read
	// answers without asking).
	if got := log.take(); !slices.Equal(got, []string{"failed status", "up false"}) && !slices.Equal(got, []string{"failed ping", "up false"}) {
		t.Fatalf("hooks after a failed read: %q", got)
	}
	// Known down: the next read answers without asking (a call that
	// failed again would push the back-off further).
	backoff := s.downUntil.Load()
	if _, up := s.ClusterStates(ctx, []string{"p"}); up || s.downUntil.Load() != backoff {
		t.Fatalf("read while known down: up %v, back-off moved %v", up, s.downUntil.Load() != backoff)
	}
	r.Start()
	eventually(t, 10*time.Second, "the watcher sees Redis back", func() bool { return !s.down.Load() && s.Usable() })
	for _, c := range log.take() {
		// The watcher's failed pings are not counted: only calls made
		// for the gateway are.
		if c != "up true" {
			t.Fatalf("hook %q while the watcher waited for Redis", c)
		}
	}
	released = true
	s.Release()
	if got := log.take(); !slices.Equal(got, []string{"closed"}) {
		t.Fatalf("hooks at close: %q", got)
	}
}

// TestOverLimit: live sessions above max, none for unlimited.
func TestOverLimit(t *testing.T) {
	for _, tc := range []struct {
		live int
		max  int64
		want int
	}{{0, 0, 0}, {7, 0, 0}, {3, 4, 0}, {4, 4, 0}, {7, 4, 3}} {
		if got := OverLimit(tc.live, tc.max); got != tc.want {
			t.Errorf("OverLimit(%d, %d) = %d, want %d", tc.live, tc.max, got, tc.want)
		}
	}
}
