package pool

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/profiles"
)

// TestProfileLockWaits: on a fake clock, a second session of one profile
// waits for it up to wait and takes it when the first gives it back; a
// third, whose wait runs out, gets ErrProfileInUse; another profile is
// free; a client that leaves stops waiting; a ticket gives its profile
// back once, with everything else.
func TestProfileLockWaits(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	r := NewRegistry(clock)
	ctx := context.Background()
	alice := profiles.Name{Scope: profiles.NoScope, ID: "alice"}

	first := r.NewTicket()
	if err := first.TakeProfile(ctx, alice, 0, nil, false); err != nil {
		t.Fatal(err)
	}
	if err := first.TakeProfile(ctx, alice, 0, nil, false); err != nil {
		t.Fatalf("the same ticket again: %v", err)
	}
	if n, ok := first.Profile(); !ok || n != alice || !r.Profiles.InUseHere(alice) {
		t.Fatal("not held")
	}
	// No wait: 409 at once.
	if err := r.NewTicket().TakeProfile(ctx, alice, 0, nil, false); !errors.Is(err, ErrProfileInUse) {
		t.Fatalf("no wait: %v", err)
	}
	// Another profile is free.
	bob := r.NewTicket()
	if err := bob.TakeProfile(ctx, profiles.Name{Scope: profiles.NoScope, ID: "bob"}, 0, nil, false); err != nil {
		t.Fatal(err)
	}

	second := r.NewTicket()
	got := make(chan error, 1)
	go func() { got <- second.TakeProfile(ctx, alice, 10*time.Second, nil, false) }()
	waitFor(t, func() bool { return r.Profiles.Waiting() == 1 })
	clock.Advance(5 * time.Second)
	select {
	case err := <-got:
		t.Fatalf("took it while in use: %v", err)
	default:
	}
	first.Release()
	first.Release()
	if err := <-got; err != nil {
		t.Fatalf("after the release: %v", err)
	}

	third := r.NewTicket()
	go func() { got <- third.TakeProfile(ctx, alice, 3*time.Second, nil, false) }()
	waitFor(t, func() bool { return r.Profiles.Waiting() == 1 })
	clock.Advance(2 * time.Second)
	select {
	case err := <-got:
		t.Fatalf("gave up before its wait was over: %v", err)
	default:
	}
	clock.Advance(time.Second)
	if err := <-got; !errors.Is(err, ErrProfileInUse) {
		t.Fatalf("wait over: %v", err)
	}

	gone, cancel := context.WithCancel(ctx)
	go func() { got <- r.NewTicket().TakeProfile(gone, alice, time.Hour, nil, false) }()
	waitFor(t, func() bool { return r.Profiles.Waiting() == 1 })
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) || r.Profiles.Waiting() != 0 {
		t.Fatalf("client gone: %v, %d waiting", err, r.Profiles.Waiting())
	}

	// Moved with the client to its attempt's ticket, kept apart for a
	// parking, given back with it.
	attempt := r.NewTicket()
	attempt.Join(second)
	if _, ok := second.Profile(); ok {
		t.Fatal("still on the client's ticket")
	}
	kept := attempt.KeepProfile()
	attempt.Release()
	if !r.Profiles.InUseHere(alice) {
		t.Fatal("a kept profile was given back")
	}
	kept.Release()
	if r.Profiles.InUseHere(alice) {
		t.Fatal("not given back")
	}
	bob.Release()
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for i := 0; i < 2000; i++ {
		if cond() {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("condition not met")
}
