package cluster

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// TestProfilesOneUser: of three nodes taking one profile's lock at once,
// exactly one gets it; another profile is free; once given back, it is
// announced and another node takes it; Redis holds the name only.
func TestProfilesOneUser(t *testing.T) {
	r := startRedis(t)
	var stores []*Store
	for _, n := range []string{"a", "b", "c"} {
		stores = append(stores, open(t, r, n, func(c *Config) { c.Timeout, c.LeaseTTL = caddy.Duration(5*time.Second), caddy.Duration(10*time.Second) }))
	}
	heard := make(chan Event, 8)
	cancel := stores[1].News().Subscribe(func(e Event) {
		if e.Kind == EventProfileFree {
			heard <- e
		}
	})
	defer cancel()
	eventually(t, 10*time.Second, "hearing the news", stores[1].News().Hearing)
	var got atomic.Int64
	var lock *ProfileLock
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range 30 {
		wg.Go(func() {
			l, ok, err := stores[g%3].Profiles().Take(context.Background(), "_/alice")
			if err != nil {
				t.Error(err)
				return
			}
			if ok {
				got.Add(1)
				mu.Lock()
				lock = l
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if got.Load() != 1 {
		t.Fatalf("%d takers of one profile, want 1", got.Load())
	}
	if _, ok, err := stores[0].Profiles().Take(context.Background(), "_/bob"); err != nil || !ok {
		t.Fatalf("another profile: %v %v", ok, err)
	}
	in, err := stores[2].Profiles().InUse(context.Background(), []string{"_/alice", "_/carol"})
	if err != nil || !in["_/alice"] || in["_/carol"] {
		t.Fatalf("in use: %v %v", in, err)
	}
	rdb := stores[0].c.rdb
	keys, _ := rdb.Keys(context.Background(), "test:"+t.Name()+":profile:*").Result()
	if len(keys) != 2 {
		t.Fatalf("keys %v", keys)
	}
	for _, k := range keys {
		v, _ := rdb.Get(context.Background(), k).Result()
		if !strings.Contains(k, "{_/alice}") && !strings.Contains(k, "{_/bob}") || !strings.Contains(v, "|") {
			t.Errorf("key %q holds %q", k, v)
		}
	}
	lock.Release()
	lock.Release()
	select {
	case e := <-heard:
		if e.Session != "_/alice" {
			t.Fatalf("heard %+v", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no news of the profile given back")
	}
	if _, ok, err := stores[2].Profiles().Take(context.Background(), "_/alice"); err != nil || !ok {
		t.Fatalf("after release: %v %v", ok, err)
	}
	if _, _, err := stores[0].Profiles().Take(context.Background(), "{x}"); err == nil {
		t.Fatal("a name with a brace was taken")
	}
}

// TestProfilesExpireWithTheirNode: a node that stops renewing (its
// process died) frees its profiles within the lease TTL; a live node's
// renewals keep its own.
func TestProfilesExpireWithTheirNode(t *testing.T) {
	r := startRedis(t)
	a := open(t, r, "a", nil) // lease TTL 600 ms
	b := open(t, r, "b", nil)
	if _, ok, err := a.Profiles().Take(context.Background(), "_/kept"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, ok, err := b.Profiles().Take(context.Background(), "_/dies"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	// b dies: its renewals stop, nothing is given back.
	b.profiles.stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, ok, err := a.Profiles().Take(context.Background(), "_/dies")
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a dead node's profile stayed in use")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// a's own profile outlived several TTLs.
	if _, ok, _ := b.Profiles().Take(context.Background(), "_/kept"); ok {
		t.Fatal("a live node's profile was taken")
	}
}
