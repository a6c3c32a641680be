package browserfailover_test

// End-to-end tests of hedged connects with fake providers that
// answer late: a slow first provider is raced by the next one, losers are
// cancelled or closed with 1000 "hedge lost", nothing counts as a failure
// that did not fail on its own, and every count returns to 0.

import (
	"context"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
)

// sessionEntry waits for the "session ended" entry served by provider.
func sessionEntry(t *testing.T, g *testgw.Gateway, provider string) map[string]any {
	t.Helper()
	var got map[string]any
	testgw.Eventually(t, 10*time.Second, "a session ended entry for "+provider, func() bool {
		for _, e := range g.LogEntries("session ended") {
			if e["provider"] == provider {
				got = e
				return true
			}
		}
		return false
	})
	return got
}

// settled waits until the providers hold no session or reserved slot.
func settled(t *testing.T, names ...string) {
	t.Helper()
	testgw.Eventually(t, 10*time.Second, "every slot given back", func() bool {
		for _, n := range names {
			p := state(t, n)
			if p.Slots.Active() != 0 || p.Slots.Reserved() != 0 {
				return false
			}
		}
		return true
	})
}

func noFailures(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if snap := state(t, n).Health.Snapshot(); snap.Failures != 0 || !snap.Healthy {
			t.Errorf("%s: %+v, want healthy without failures", n, snap)
		}
	}
}

// TestHedgeBeatsSlowProvider: a provider that takes 3 s to answer is
// raced after hedge_after by the next one, which wins; the slow handshake
// is given up, and neither counts as a failure.
func TestHedgeBeatsSlowProvider(t *testing.T) {
	contacts := &fakes.Contacts{}
	slow := fakes.Slow("hg-slow", contacts, fakes.After(3*time.Second))
	defer slow.Close()
	fast := fakes.Echo("hg-fast", contacts)
	defer fast.Close()
	g := testgw.Start(t, handler(`"hedge_after":"200ms"`,
		provider("hg-slow", slow.URL(), `"priority":1`),
		provider("hg-fast", fast.URL(), `"priority":2`)))

	start := time.Now()
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("connected in %v through a hedge (the slow provider answers after 3s)", time.Since(start))
	echoOnce(t, c, []byte("hello"))
	if l := contacts.List(); len(l) != 2 || l[0] != "hg-slow" || l[1] != "hg-fast" {
		t.Fatalf("contacts %v", l)
	}
	testgw.Eventually(t, 10*time.Second, "the slow handshake given up", func() bool { return slow.Cancelled.Load() == 1 })
	if slow.Answered.Load() != 0 {
		t.Fatal("the slow provider answered a handshake the gateway had given up")
	}
	c.Close(websocket.StatusNormalClosure, "")
	e := sessionEntry(t, g, "hg-fast")
	if e["hedges_started"] != float64(1) || e["hedges_wasted"] != float64(1) {
		t.Fatalf("hedge fields %v / %v", e["hedges_started"], e["hedges_wasted"])
	}
	atts, _ := e["attempts"].([]any)
	var words []string
	for _, a := range atts {
		m := a.(map[string]any)
		words = append(words, m["provider"].(string)+":"+m["outcome"].(string))
	}
	if len(words) != 2 || words[0] != "hg-fast:ok" || words[1] != "hg-slow:hedge_lost" {
		t.Fatalf("attempts %v", words)
	}
	settled(t, "hg-slow", "hg-fast")
	noFailures(t, "hg-slow", "hg-fast")
}

// TestHedgeNotNeeded: providers that answer within hedge_after never see
// a hedge.
func TestHedgeNotNeeded(t *testing.T) {
	contacts := &fakes.Contacts{}
	a := fakes.Echo("hn-a", contacts)
	defer a.Close()
	b := fakes.Echo("hn-b", contacts)
	defer b.Close()
	g := testgw.Start(t, handler(`"hedge_after":"2s"`,
		provider("hn-a", a.URL(), `"priority":1`),
		provider("hn-b", b.URL(), `"priority":2`)))
	for range 5 {
		c, _, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatal(err)
		}
		echoOnce(t, c, []byte("x"))
		c.Close(websocket.StatusNormalClosure, "")
	}
	for _, n := range contacts.List() {
		if n != "hn-a" {
			t.Fatalf("contacts %v: a hedge started", contacts.List())
		}
	}
	testgw.Eventually(t, 10*time.Second, "5 session entries", func() bool { return len(g.LogEntries("session ended")) == 5 })
	for _, e := range g.LogEntries("session ended") {
		if e["hedges_started"] != float64(0) || e["hedges_wasted"] != float64(0) {
			t.Fatalf("entry %v", e)
		}
	}
	settled(t, "hn-a", "hn-b")
}

// TestHedgeAllSlow: with every provider slow, at most hedge_max attempts
// are in flight; the first 101 wins and the other attempt is cancelled
// (before its answer, or while its 101 was on the way: its connection is
// dropped) or, if its 101 was read too, closed with 1000 "hedge lost".
func TestHedgeAllSlow(t *testing.T) {
	gate := make(chan time.Time)
	wait := func() <-chan time.Time { return gate }
	contacts := &fakes.Contacts{}
	sa := fakes.Slow("ha-a", contacts, wait)
	defer sa.Close()
	sb := fakes.Slow("ha-b", contacts, wait)
	defer sb.Close()
	sc := fakes.Slow("ha-c", contacts, wait)
	defer sc.Close()
	g := testgw.Start(t, handler(`"hedge_after":"100ms","hedge_max":2`,
		provider("ha-a", sa.URL(), `"priority":1`),
		provider("ha-b", sb.URL(), `"priority":2`),
		provider("ha-c", sc.URL(), `"priority":3`)))

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := make(chan *websocket.Conn, 1)
	errs := make(chan error, 1)
	go func() {
		c, _, err := websocket.Dial(ctx, g.WS("/"), nil)
		if err != nil {
			errs <- err
			return
		}
		got <- c
	}()
	testgw.Eventually(t, 10*time.Second, "both hedged handshakes in flight", func() bool {
		return sa.Hits.Load() == 1 && sb.Hits.Load() == 1
	})
	// hedge_max 2: the third provider is not started while two are in
	// flight, however long they take.
	time.Sleep(400 * time.Millisecond)
	if sc.Hits.Load() != 0 {
		t.Fatal("a third attempt started beside two in flight (hedge_max 2)")
	}
	close(gate) // both answer now
	var c *websocket.Conn
	select {
	case c = <-got:
	case err := <-errs:
		t.Fatal(err)
	}
	echoOnce(t, c, []byte("x"))
	defer func() {
		t.Logf("a: cancelled %d dropped %d closes %v; b: cancelled %d dropped %d closes %v", sa.Cancelled.Load(), sa.Dropped.Load(), sa.Closes(), sb.Cancelled.Load(), sb.Dropped.Load(), sb.Closes())
	}()
	testgw.Eventually(t, 10*time.Second, "the loser given up or closed", func() bool {
		lost := sa.Cancelled.Load() + sb.Cancelled.Load() + sa.Dropped.Load() + sb.Dropped.Load()
		for _, s := range []*fakes.SlowServer{sa, sb} {
			for _, cl := range s.Closes() {
				if cl == "1000 hedge lost" {
					lost++
				}
			}
		}
		return lost == 1
	})
	c.Close(websocket.StatusNormalClosure, "")
	settled(t, "ha-a", "ha-b", "ha-c")
	noFailures(t, "ha-a", "ha-b", "ha-c")
	if sc.Hits.Load() != 0 {
		t.Fatal("the third provider was contacted")
	}
}

// TestHedgeOwnFailureCounts: a hedged attempt that fails on its own is a
// failure as usual, and the next candidate is raced in its place.
func TestHedgeOwnFailureCounts(t *testing.T) {
	contacts := &fakes.Contacts{}
	slow := fakes.Slow("hf-slow", contacts, fakes.After(5*time.Second))
	defer slow.Close()
	bad := fakes.Status("hf-500", contacts, 500, nil, "boom")
	defer bad.Close()
	fast := fakes.Echo("hf-fast", contacts)
	defer fast.Close()
	g := testgw.Start(t, handler(`"hedge_after":"100ms"`,
		provider("hf-slow", slow.URL(), `"priority":1`),
		provider("hf-500", bad.URL(), `"priority":2`),
		provider("hf-fast", fast.URL(), `"priority":3`)))
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	echoOnce(t, c, []byte("x"))
	c.Close(websocket.StatusNormalClosure, "")
	e := sessionEntry(t, g, "hf-fast")
	if e["hedges_started"] != float64(2) || e["hedges_wasted"] != float64(1) {
		t.Fatalf("hedge fields %v / %v", e["hedges_started"], e["hedges_wasted"])
	}
	if snap := state(t, "hf-500").Health.Snapshot(); snap.Failures != 1 {
		t.Fatalf("hf-500: %+v, want its own failure counted", snap)
	}
	settled(t, "hf-slow", "hf-500", "hf-fast")
	noFailures(t, "hf-slow", "hf-fast")
	if d := failovers(t, g, "hf-500"); d != 0 {
		t.Fatalf("hf-500 failovers moved %v: it failed beside another attempt, nothing started in its place", d)
	}
}

// TestHedgeFailoverCounted: with hedging on, an attempt that fails with
// nothing else in flight is a failover when the next provider starts in
// its place (TestHedgeOwnFailureCounts: a hedge that fails beside another
// attempt is not).
func TestHedgeFailoverCounted(t *testing.T) {
	bad := fakes.Status("hc-500", nil, 500, nil, "boom")
	defer bad.Close()
	fast := fakes.Echo("hc-fast", nil)
	defer fast.Close()
	g := testgw.Start(t, handler(`"hedge_after":"5s"`,
		provider("hc-500", bad.URL(), `"priority":1`),
		provider("hc-fast", fast.URL(), `"priority":2`)))
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	echoOnce(t, c, []byte("x"))
	c.Close(websocket.StatusNormalClosure, "")
	if d := failovers(t, g, "hc-500"); d != 1 {
		t.Fatalf("hc-500 failovers moved %v, want 1", d)
	}
	if d := failovers(t, g, "hc-fast"); d != 0 {
		t.Fatalf("hc-fast failovers moved %v, want 0", d)
	}
}

// failovers is failovers_total of provider, counted by the gateway's
// registry (this test's).
func failovers(t *testing.T, g *testgw.Gateway, provider string) float64 {
	t.Helper()
	now, _ := opScrape(t, g)
	return now.get("caddy_browser_failover_failovers_total", "provider="+provider)
}
