package cluster

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/browserfailover/caddy-browser-failover/status"
)

// sharedConfig is a Config on r private to the test.
func sharedConfig(t *testing.T, r *redisServer) Config {
	return Config{
		Address:   r.Addr(),
		LeaseTTL:  600 * time.Millisecond,
		Timeout:   300 * time.Millisecond,
		KeyPrefix: "test:" + t.Name() + ":",
	}
}

// use calls Use and fails the test on error.
func use(t *testing.T, cfg Config, node string) *Shared {
	t.Helper()
	s, err := Use(cfg, node, zaptest.NewLogger(t))
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
	g, err := a.Store().Acquire(context.Background(), "p", 0)
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

// TestSharedClusterStatus: the providers' "cluster" objects, read in one
// call, and their unavailable form, given at once, with the back-off while
// Redis is down.
func TestSharedClusterStatus(t *testing.T) {
	r := startRedis(t)
	s := use(t, sharedConfig(t, r), "n1")
	defer s.Release()
	ctx := context.Background()
	g, err := s.Store().Acquire(ctx, "p", 0)
	if err != nil || g.Lease == nil {
		t.Fatalf("Acquire: %+v %v", g, err)
	}
	defer g.Lease.Release()
	objs, up := s.ClusterStatus(ctx, []string{"p", "none"})
	got, ok := objs["p"].(status.Cluster)
	if !up || !ok || got.Node != "n1" || got.Active != 1 || got.Nodes["n1"] != 1 || got.CooldownUntil != nil {
		t.Fatalf("ClusterStatus %+v %v", objs, up)
	}
	b, _ := json.Marshal(objs["none"])
	if string(b) != `{"node":"n1","active":0,"nodes":{},"cooldown_until":null,"over_limit":0}` {
		t.Fatalf("idle provider: %s", b)
	}
	if n, ok := s.ClusterActive("p"); !ok || n != 1 {
		t.Fatalf("ClusterActive %d %v", n, ok)
	}
	if !s.Usable() {
		t.Fatal("not usable while Redis answers")
	}

	r.Stop()
	objs, up = s.ClusterStatus(ctx, []string{"p", "none"})
	b, _ = json.Marshal(objs)
	if up || string(b) != `{"none":{"error":"shared state unavailable","node":"n1"},"p":{"error":"shared state unavailable","node":"n1"}}` {
		t.Fatalf("Redis down: %s %v", b, up)
	}
	if s.Usable() {
		t.Fatal("usable right after a failed call")
	}
	// Known down: the next read answers without asking (a call that
	// failed again would push the back-off further).
	backoff := s.downUntil.Load()
	if _, up := s.ClusterStatus(ctx, []string{"p"}); up || s.downUntil.Load() != backoff {
		t.Fatalf("read while known down: up %v, back-off moved %v", up, s.downUntil.Load() != backoff)
	}
	r.Start()
	eventually(t, 10*time.Second, "the watcher sees Redis back", func() bool { return !s.down.Load() && s.Usable() })
}
