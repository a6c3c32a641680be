package pool

import (
	"strconv"
	"testing"
	"time"
)

// boundLive is a Live for the session registry's tests.
type boundLive struct{ done chan struct{} }

func (boundLive) Start() time.Time           { return time.Time{} }
func (boundLive) BytesUp() int64             { return 0 }
func (boundLive) BytesDown() int64           { return 0 }
func (b boundLive) Done() <-chan struct{}    { return b.done }
func (boundLive) Close(code int, why string) {}

// TestHandlerSuccession: a reload that keeps a handler's block keeps its
// key, and nothing moves; one that changes it moves the sessions bound to
// the old key to the handler of the new config sharing the most
// providers with it — not to another handler of that config whose block
// stayed as it was, even one with the same providers; a handler of the
// running config never uses another's session, and one of the config on
// its way out hands its sessions on before its Cleanup; after it, a
// request its server still finishes is served as its successor would.
func TestHandlerSuccession(t *testing.T) {
	r := NewRegistry(nil)
	load1, load2 := new(int), new(int)
	a1, b1 := new(int), new(int) // the handlers of load 1
	r.Handlers.Register(a1, load1, "A", []string{"p1", "p2"})
	r.Handlers.Register(b1, load1, "B", []string{"p1", "p2"})
	l := boundLive{done: make(chan struct{})}
	e := &LiveSession{SessionInfo: SessionInfo{ID: "op", Bound: Bound{Path: PathHash("secret"), Handler: "A"}}, Session: l}
	r.Sessions.add(e)
	if got, ok := r.Sessions.ByPath(PathHash("secret")); !ok || got.ID != "op" || got.Bound.Handler != "A" {
		t.Fatalf("Sessions.ByPath = %+v, %v", got, ok)
	}
	if _, ok := r.Sessions.ByPath(PathHash("op")); ok {
		t.Fatal("the operator's ID finds the session")
	}
	if !r.Handlers.Serves("A", a1) || r.Handlers.Serves("A", b1) || r.Handlers.Serves("", a1) || r.Handlers.Serves("A", new(int)) {
		t.Fatal("load 1: a handler serves another's session, or A not its own")
	}

	// Load 2: A's block changed (key A2, providers p1 p2), B's did not
	// (key B, same providers). While load 1 goes away, A2 serves A's
	// sessions and B does not.
	a2, b2 := new(int), new(int)
	r.Handlers.Register(a2, load2, "A2", []string{"p1", "p2"})
	r.Handlers.Register(b2, load2, "B", []string{"p1", "p2"})
	if !r.Handlers.Serves("A", a2) || r.Handlers.Serves("A", b2) {
		t.Fatalf("before load 1's Cleanup: A2 serves A %v, B serves A %v", r.Handlers.Serves("A", a2), r.Handlers.Serves("A", b2))
	}
	if r.Handlers.Serves("A2", a1) || r.Handlers.Serves("B", a1) {
		t.Fatal("a handler of the old load serves the new load's sessions")
	}
	// B of load 1 leaves: its key lives on in load 2; nothing moves.
	if _, ok := r.Handlers.Retire(b1); ok {
		t.Fatal("retiring a key still live moved something")
	}
	ret, ok := r.Handlers.Retire(a1)
	if !ok || ret.Key != "A" || ret.Successor != "A2" || ret.SuccessorOwner != a2 || len(ret.Moved) != 1 || ret.Moved[0] != l {
		t.Fatalf("Handlers.Retire(a1) = %+v, %v", ret, ok)
	}
	if got, _ := r.Sessions.ByPath(PathHash("secret")); got.Bound.Handler != "A2" {
		t.Fatalf("bound to %q after the reload", got.Bound.Handler)
	}
	// Load 1's servers finish the requests they read: a1 serves what A2
	// serves, b1 what B of load 2 does, and nothing of the other's.
	if !r.Handlers.Serves("A2", a1) || r.Handlers.Serves("B", a1) || !r.Handlers.Serves("B", b1) || r.Handlers.Serves("A2", b1) {
		t.Fatalf("retired handlers: a1 serves A2 %v, B %v; b1 serves B %v, A2 %v",
			r.Handlers.Serves("A2", a1), r.Handlers.Serves("B", a1), r.Handlers.Serves("B", b1), r.Handlers.Serves("A2", b1))
	}
	// Another node's route still bound to A: this node saw A → A2.
	if !r.Handlers.Serves("A", a2) || r.Handlers.Serves("A", b2) || r.Handlers.Serves("Z", a2) {
		t.Fatal("the succession A → A2 is not followed, or followed for another")
	}
	if _, ok := r.Handlers.Retire(a1); ok {
		t.Fatal("retired twice")
	}

	// A handler no other shares a provider with has no successor.
	load3 := new(int)
	c3, d3 := new(int), new(int)
	r.Handlers.Register(c3, load3, "C", []string{"q"})
	r.Handlers.Register(d3, load3, "D", []string{"p1"})
	if ret, ok := r.Handlers.Retire(a2); !ok || ret.Successor != "D" {
		t.Fatalf("Handlers.Retire(a2) = %+v, %v: want D, the one sharing a provider", ret, ok)
	}
	if ret, ok := r.Handlers.Retire(c3); !ok || ret.Successor != "" || ret.Moved != nil {
		t.Fatalf("Handlers.Retire(c3) = %+v, %v: want no successor", ret, ok)
	}
	// The key in use again serves its own, not its old successor.
	r.Handlers.Register(new(int), load3, "A2", []string{"p1"})
	if r.Handlers.Serves("A2", d3) {
		t.Fatal("a key live again still follows its succession")
	}

	r.Sessions.remove(l)
	if _, ok := r.Sessions.ByPath(PathHash("secret")); ok || len(r.Sessions.byPath) != 0 {
		t.Fatal("the session's path outlives it")
	}
}

// TestSuccessionsBounded: the successions kept for other nodes' routes
// are a few, however many reloads change a handler's block.
func TestSuccessionsBounded(t *testing.T) {
	r := NewRegistry(nil)
	prev := new(int)
	r.Handlers.Register(prev, new(int), "k0", []string{"p"})
	for i := 1; i <= 3*maxSuccessions; i++ {
		next := new(int)
		r.Handlers.Register(next, new(int), "k"+strconv.Itoa(i), []string{"p"})
		if _, ok := r.Handlers.Retire(prev); !ok {
			t.Fatalf("reload %d: nothing retired", i)
		}
		prev = next
	}
	if n, m := len(r.Handlers.succession.next), len(r.Handlers.succession.order); n > maxSuccessions || m != n {
		t.Fatalf("%d successions kept (%d in order), want at most %d", n, m, maxSuccessions)
	}
}

// TestPathAndRouteKeys: a path's hash is the same in every registry and
// needs no secret; a route's key and a client's shared hash are keyed
// with the deployment's secret (the same on every node that agreed on
// it), under labels of their own.
func TestPathAndRouteKeys(t *testing.T) {
	a, b := NewRegistry(nil), NewRegistry(nil)
	if PathHash("x") != PathHash("x") || PathHash("x") == PathHash("y") || len(PathHash("x")) != 64 {
		t.Fatal("PathHash is not a stable SHA-256")
	}
	if a.Hashes.RouteKey("x") == b.Hashes.RouteKey("x") {
		t.Fatal("route keys agree without a shared secret")
	}
	secret := []byte("0123456789abcdef0123456789abcdef")
	a.Hashes.SetSecret(secret)
	b.Hashes.SetSecret(secret)
	if a.Hashes.RouteKey("x") != b.Hashes.RouteKey("x") || a.Hashes.RouteKey("x") == PathHash("x") || a.Hashes.RouteKey("x") == a.Hashes.ResumeToken("x") {
		t.Fatal("route keys: not the same on nodes sharing the secret, or the same as another hash")
	}
	if a.Hashes.SharedClient([]string{"alice"}) != b.Hashes.SharedClient([]string{"alice"}) ||
		a.Hashes.SharedClient([]string{"alice"}) == a.Hashes.SharedClient([]string{"bob"}) {
		t.Fatal("shared client hashes: not the same for one value on two nodes, or the same for two values")
	}
	// No two lists of values hash alike.
	for _, pair := range [][2][]string{{{"a", "b"}, {"ab"}}, {{"a", ""}, {"a"}}, {{"1:a"}, {"a"}}, {{"a\x00b"}, {"a", "b"}}} {
		if ClientHash(pair[0]) == ClientHash(pair[1]) || a.Hashes.SharedClient(pair[0]) == a.Hashes.SharedClient(pair[1]) {
			t.Errorf("%q and %q hash alike", pair[0], pair[1])
		}
	}
}
