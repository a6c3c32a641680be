package pool

import (
	"testing"

	"github.com/browserfailover/caddy-browser-failover/cooldown"
)

type fakeWarmer struct{ closed bool }

func (w *fakeWarmer) Close() { w.closed = true }

// TestWarmersPerHandler: each handler's set of a provider is its own in
// the registry, a warmer is dropped only by its own key and value, the
// provider's counts sum the sets, and prints tell settings apart without
// holding them.
func TestWarmersPerHandler(t *testing.T) {
	r := NewRegistry(nil)
	p, err := r.Claim("warm-unit", "ws://h:1/", "ws://h:1/", new(int), cooldown.Config{}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, b := &fakeWarmer{}, &fakeWarmer{}
	ka, kb := WarmKey{Handler: "ha-0", Provider: "warm-unit"}, WarmKey{Handler: "hb-0", Provider: "warm-unit"}
	r.Warmers.Set(ka, a)
	r.Warmers.Set(kb, b)
	if r.Warmers.Of(ka) != a || r.Warmers.Of(kb) != b {
		t.Fatal("one handler's warmer replaced the other's")
	}
	p.SetWarm("ha-0", 1, 2)
	p.SetWarm("hb-0", 2, 2)
	if ready, target := p.Warm(); ready != 3 || target != 4 {
		t.Fatalf("warm %d/%d, want both sets summed (3/4)", ready, target)
	}
	r.Warmers.Drop(ka, b) // not ka's: nothing
	if r.Warmers.Of(ka) != a {
		t.Fatal("a warmer dropped by another's value")
	}
	r.Warmers.Drop(ka, a)
	p.SetWarm("ha-0", 0, 0)
	if r.Warmers.Of(ka) != nil || r.Warmers.Of(kb) != b {
		t.Fatal("dropping one set touched the other")
	}
	if ready, target := p.Warm(); ready != 2 || target != 2 {
		t.Fatalf("warm %d/%d after one set went, want 2/2", ready, target)
	}
	secret := []byte("X-Token: key-1")
	if pa, pb := r.Warmers.Print(secret), r.Warmers.Print([]byte("X-Token: key-2")); pa == pb || pa != r.Warmers.Print(secret) {
		t.Fatal("prints do not tell settings apart, or differ for the same")
	}
	if NewRegistry(nil).Warmers.Print(secret) == r.Warmers.Print(secret) {
		t.Fatal("a print is not keyed by its registry")
	}
}
