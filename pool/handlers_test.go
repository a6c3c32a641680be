package pool

import "testing"

func TestHandlerKeys(t *testing.T) {
	r := NewRegistry(nil)
	loadA, loadB := new(int), new(int)
	a0, a1, b0 := r.Handlers.Key(loadA, "s"), r.Handlers.Key(loadA, "s"), r.Handlers.Key(loadA, "t")
	if a0 == a1 || a0 == b0 || a1 == b0 {
		t.Fatalf("keys of one load collide: %q %q %q", a0, a1, b0)
	}
	// The next load, with the same config, gives the same keys in order.
	if k0, k1 := r.Handlers.Key(loadB, "s"), r.Handlers.Key(loadB, "s"); k0 != a0 || k1 != a1 {
		t.Fatalf("a reload gave %q %q, want %q %q", k0, k1, a0, a1)
	}
	r.Handlers.ForgetLoad(loadA)
	r.Handlers.ForgetLoad(loadB)
	if len(r.Handlers.keys.byLoad) != 0 {
		t.Fatalf("loads kept after ForgetLoad: %d", len(r.Handlers.keys.byLoad))
	}
}
