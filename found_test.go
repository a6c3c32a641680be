package browserfailover_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakedns"
	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/status"
)

// Providers found through Caddy's dynamic upstream sources: a real DNS
// server on loopback (internal/fakedns) whose SRV records the tests
// change, Caddy's own srv source pointed at it with its resolvers option
// and a short refresh, and fake providers at the addresses it gives.

// srvSeq makes each test's SRV name its own: Caddy's srv source caches
// lookups process-wide by name.
var srvSeq atomic.Int64

// foundBlock is a handler whose providers block "br" finds ws:// providers
// through the SRV records of a fresh name at dns; opts are more provider
// options of the block, extra more handler keys. It returns the handler
// and the SRV name.
func foundBlock(dns *fakedns.Server, opts, extra string) (string, string) {
	name := fmt.Sprintf("_cdp._tcp.t%d.browsers.test.", srvSeq.Add(1))
	if opts != "" {
		opts = "," + opts
	}
	if extra != "" {
		extra = "," + extra
	}
	return fmt.Sprintf(`{"handler":"browser_failover","dynamic_providers":[{"name":"br",
		"dynamic":{"source":"srv","name":%q,"refresh":"200ms","resolver":{"addresses":[%q]}},
		"scheme":"ws"%s}]%s}`, name, dns.Addr, opts, extra), name
}

// srvOf is the SRV record of a fake provider: its port, with target
// localhost. (the trailing dot is the DNS name's, and is dropped: the
// provider is reached at localhost, which is 127.0.0.1).
func srvOf(t *testing.T, s *fakes.Server) fakedns.SRV {
	t.Helper()
	n, _ := strconv.Atoi(portOf(s))
	return fakedns.SRV{Target: "localhost.", Port: uint16(n), Weight: 1}
}

// portOf is a fake provider's port.
func portOf(s *fakes.Server) string {
	_, port, _ := net.SplitHostPort(s.Addr)
	return port
}

// foundName is the name a fake provider is found under by block "br".
func foundName(s *fakes.Server) string { return "br/localhost:" + portOf(s) }

// statusDoc reads the whole status document.
func statusDoc(t *testing.T, g *testgw.Gateway) status.Status {
	t.Helper()
	code, b, err := g.AdminDo(http.MethodGet, status.StatusPath, nil)
	if err != nil || code != 200 {
		t.Fatalf("status: %d %v", code, err)
	}
	var st status.Status
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// listed reports the status object of provider name, if the status lists
// it.
func listed(t *testing.T, g *testgw.Gateway, name string) (status.Provider, bool) {
	for _, p := range statusDoc(t, g).Providers {
		if p.Name == name {
			return p, true
		}
	}
	return status.Provider{}, false
}

// handlerQueue is the status of handler's queue.
func handlerQueue(t *testing.T, g *testgw.Gateway, handler string) status.Queue {
	t.Helper()
	for _, q := range statusDoc(t, g).Queues {
		if q.Handler == handler {
			return q
		}
	}
	t.Fatalf("no queue of handler %q", handler)
	return status.Queue{}
}

// TestFoundProvidersTakeWaiters: a client that arrives before any
// provider is found waits, and is served by the first one the source
// gives; a second client that waits for it (it is full) is served by the
// next one found, at its refresh, and never by a provider the first
// took.
func TestFoundProvidersTakeWaiters(t *testing.T) {
	dns := fakedns.Start(t)
	var contacts fakes.Contacts
	a := fakes.Echo("fd1-a", &contacts)
	defer a.Close()
	b := fakes.Echo("fd1-b", &contacts)
	defer b.Close()
	cfg, srv := foundBlock(dns, `"max_concurrent":1`, `"queue":{"size":10,"timeout":"30s"}`)
	g := testgw.Start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Nothing found yet: the client waits for a provider.
	first := dialWith(ctx, g.WS("/"), nil)
	testgw.Eventually(t, 10*time.Second, "the first client to wait", func() bool { return handlerQueue(t, g, "br").Waiting == 1 })
	pending(t, first, "client before any provider is found")

	dns.SetSRV(srv, srvOf(t, a))
	c1 := mustServe(t, first, 10*time.Second, "client waiting when the first provider is found")
	defer c1.CloseNow()
	echoOnce(t, c1, []byte("found"))
	p, ok := listed(t, g, foundName(a))
	if !ok || p.FoundBy != "br" || p.URL != "ws://localhost:"+portOf(a)+"/" || p.Active != 1 {
		t.Fatalf("found provider in status: %+v (listed %v)", p, ok)
	}

	// It is full: the next client waits, and the next provider found
	// serves it.
	second := dialWith(ctx, g.WS("/"), nil)
	testgw.Eventually(t, 10*time.Second, "the second client to wait", func() bool { return handlerQueue(t, g, "br").Waiting == 1 })
	contacts.Reset()
	dns.SetSRV(srv, srvOf(t, a), srvOf(t, b))
	c2 := mustServe(t, second, 10*time.Second, "client waiting when the second provider is found")
	defer c2.CloseNow()
	echoOnce(t, c2, []byte("second"))
	if l := contacts.List(); len(l) != 1 || l[0] != "fd1-b" {
		t.Fatalf("providers contacted for the second client: %v, want fd1-b only", l)
	}
	want := []string{foundName(a), foundName(b)}
	slices.Sort(want) // found providers come by name
	if q := handlerQueue(t, g, "br"); !slices.Equal(q.Providers, want) {
		t.Fatalf("handler's providers: %v, want %v", q.Providers, want)
	}
}

// TestFoundProviderLeaves: an address gone from the source is drained: its
// live session goes on, no new client is sent to it, and once its session
// ended it leaves the status within a refresh.
func TestFoundProviderLeaves(t *testing.T) {
	dns := fakedns.Start(t)
	var contacts fakes.Contacts
	a := fakes.Echo("fd2-a", &contacts)
	defer a.Close()
	b := fakes.Echo("fd2-b", &contacts)
	defer b.Close()
	cfg, srv := foundBlock(dns, `"max_concurrent":2`, "")
	// a first: the priority strategy keeps roster order (by name).
	if foundName(a) > foundName(b) {
		a, b = b, a
	}
	dns.SetSRV(srv, srvOf(t, a), srvOf(t, b))
	g := testgw.Start(t, cfg)
	testgw.Eventually(t, 10*time.Second, "both providers found", func() bool {
		_, okA := listed(t, g, foundName(a))
		_, okB := listed(t, g, foundName(b))
		return okA && okB
	})

	held, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer held.CloseNow()
	echoOnce(t, held, []byte("held"))
	if p, _ := listed(t, g, foundName(a)); p.Active != 1 {
		t.Fatalf("the held session is not on %s: %+v", foundName(a), p)
	}

	// a's address goes: it is leaving, its session goes on.
	dns.SetSRV(srv, srvOf(t, b))
	testgw.Eventually(t, 10*time.Second, foundName(a)+" leaving", func() bool {
		p, ok := listed(t, g, foundName(a))
		return ok && p.Leaving
	})
	echoOnce(t, held, []byte("still relayed while leaving"))

	// New clients go to b, and a is not even tried.
	contacts.Reset()
	for i := range 3 {
		c, _, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		echoOnce(t, c, []byte("new"))
		c.Close(websocket.StatusNormalClosure, "")
	}
	for _, who := range contacts.List() {
		if who != b.Name {
			t.Fatalf("a new client reached %s, which is leaving (contacts %v)", who, contacts.List())
		}
	}
	time.Sleep(time.Second) // a few refreshes: it stays while its session lives
	if _, ok := listed(t, g, foundName(a)); !ok {
		t.Fatal("the leaving provider left the status with a live session")
	}
	echoOnce(t, held, []byte("after a few refreshes"))

	held.Close(websocket.StatusNormalClosure, "")
	testgw.Eventually(t, 5*time.Second, foundName(a)+" to leave the status", func() bool {
		_, ok := listed(t, g, foundName(a))
		return !ok
	})
	if len(g.LogEntries("provider removed")) != 1 {
		t.Fatalf("want one \"provider removed\" entry: %v", g.LogEntries("provider removed"))
	}
	if q := handlerQueue(t, g, "br"); strings.Join(q.Providers, " ") != foundName(b) {
		t.Fatalf("handler's providers after the removal: %v", q.Providers)
	}
}

// TestFoundLookupFailureKeepsSet: while the DNS server answers SERVFAIL,
// and while it is down, the providers found before stay (not leaving) and
// serve clients; each failed lookup is counted, and logged once until a
// lookup works again.
func TestFoundLookupFailureKeepsSet(t *testing.T) {
	dns := fakedns.Start(t)
	a := fakes.Echo("fd3-a", nil)
	defer a.Close()
	cfg, srv := foundBlock(dns, "", "")
	dns.SetSRV(srv, srvOf(t, a))
	g := testgw.Start(t, cfg)
	testgw.Eventually(t, 10*time.Second, "the provider found", func() bool { _, ok := listed(t, g, foundName(a)); return ok })

	failures := func() float64 {
		s, _ := opScrape(t, g)
		return s.get("caddy_browser_failover_provider_lookup_failures_total", "providers=br")
	}
	served := func(what string) {
		t.Helper()
		c, _, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		echoOnce(t, c, []byte(what))
		c.Close(websocket.StatusNormalClosure, "")
	}
	kept := func(what string) {
		t.Helper()
		p, ok := listed(t, g, foundName(a))
		if !ok || p.Leaving {
			t.Fatalf("%s: the provider found before is gone or leaving (%+v, listed %v)", what, p, ok)
		}
	}

	dns.Fail(true)
	before := failures()
	testgw.Eventually(t, 10*time.Second, "failed lookups to be counted", func() bool { return failures() >= before+3 })
	kept("SERVFAIL")
	served("while the DNS server answers SERVFAIL")

	dns.Down()
	before = failures()
	testgw.Eventually(t, 10*time.Second, "lookups to a DNS server that is down to be counted", func() bool { return failures() >= before+3 })
	kept("DNS server down")
	served("while the DNS server is down")
	if n := len(g.LogEntries("providers lookup failed: the providers found before are kept")); n != 1 {
		t.Fatalf("the failing lookups are logged %d times, want once", n)
	}

	if err := dns.Up(); err != nil {
		t.Fatal(err)
	}
	dns.Fail(false)
	testgw.Eventually(t, 10*time.Second, "a lookup to work again", func() bool {
		return len(g.LogEntries("providers lookup works again")) == 1
	})
	kept("lookups work again")
}

// TestFoundReloadKeepsState: a reload keeps the providers found, their
// live sessions counted against max_concurrent and their figures, even
// when its lookups fail; a leaving one stays leaving, and goes once its
// session ends.
func TestFoundReloadKeepsState(t *testing.T) {
	dns := fakedns.Start(t)
	a := fakes.Echo("fd4-a", nil)
	defer a.Close()
	b := fakes.Echo("fd4-b", nil)
	defer b.Close()
	if foundName(a) > foundName(b) {
		a, b = b, a
	}
	cfg, srv := foundBlock(dns, `"max_concurrent":1`, `"queue":{"size":10,"timeout":"20s"}`)
	dns.SetSRV(srv, srvOf(t, a), srvOf(t, b))
	g := testgw.Start(t, cfg)
	testgw.Eventually(t, 10*time.Second, "both providers found", func() bool {
		_, okA := listed(t, g, foundName(a))
		_, okB := listed(t, g, foundName(b))
		return okA && okB
	})
	onA, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer onA.CloseNow()
	onB, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer onB.CloseNow()
	// b's address goes: it is leaving, with its session.
	dns.SetSRV(srv, srvOf(t, a))
	testgw.Eventually(t, 10*time.Second, foundName(b)+" leaving", func() bool { p, _ := listed(t, g, foundName(b)); return p.Leaving })
	beforeA, _ := listed(t, g, foundName(a))

	// A reload (another queue timeout) while lookups fail.
	dns.Fail(true)
	if err := g.Reload(strings.Replace(cfg, `"timeout":"20s"`, `"timeout":"25s"`, 1)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // a few refreshes of the new handler
	pa, okA := listed(t, g, foundName(a))
	pb, okB := listed(t, g, foundName(b))
	if !okA || pa.Leaving || pa.Active != 1 || pa.Attempts != beforeA.Attempts {
		t.Fatalf("%s after the reload: %+v (listed %v), before %+v", foundName(a), pa, okA, beforeA)
	}
	if !okB || !pb.Leaving || pb.Active != 1 {
		t.Fatalf("%s after the reload: %+v (listed %v), want leaving with its session", foundName(b), pb, okB)
	}
	echoOnce(t, onA, []byte("a after the reload"))
	echoOnce(t, onB, []byte("b after the reload"))

	// a is still full: a new client waits for it, and gets it when its
	// session ends.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	next := dialWith(ctx, g.WS("/"), nil)
	testgw.Eventually(t, 10*time.Second, "a client to wait for the full provider", func() bool { return handlerQueue(t, g, "br").Waiting == 1 })
	onA.Close(websocket.StatusNormalClosure, "")
	c := mustServe(t, next, 10*time.Second, "client waiting for the found provider after the reload")
	defer c.CloseNow()
	if p, _ := listed(t, g, foundName(a)); p.Active != 1 {
		t.Fatalf("%s: %d live, want 1", foundName(a), p.Active)
	}

	onB.Close(websocket.StatusNormalClosure, "")
	testgw.Eventually(t, 5*time.Second, foundName(b)+" to leave the status", func() bool {
		_, ok := listed(t, g, foundName(b))
		return !ok
	})
}

// TestFoundScaling: each handler's scaling figures in the status and the
// metrics: live sessions, waiting clients, and the caps of the providers
// that take clients (a drained one's not), their ratio.
func TestFoundScaling(t *testing.T) {
	dns := fakedns.Start(t)
	a := fakes.Echo("fd5-a", nil)
	defer a.Close()
	b := fakes.Echo("fd5-b", nil)
	defer b.Close()
	cfg, srv := foundBlock(dns, `"max_concurrent":2`, `"queue":{"size":10,"timeout":"30s"}`)
	dns.SetSRV(srv, srvOf(t, a), srvOf(t, b))
	g := testgw.Start(t, cfg)
	testgw.Eventually(t, 10*time.Second, "both providers found", func() bool {
		return len(handlerQueue(t, g, "br").Providers) == 2
	})
	check := func(what string, waiting int, active, capacity int64, util float64) {
		t.Helper()
		testgw.Eventually(t, 10*time.Second, what, func() bool {
			sc := handlerQueue(t, g, "br").Scaling
			return sc.Waiting == waiting && sc.Active == active && sc.Capacity == capacity &&
				(util < 0 && sc.Utilization == nil || sc.Utilization != nil && *sc.Utilization == util)
		})
		s, _ := opScrape(t, g)
		const p = "caddy_browser_failover_"
		if s.get(p+"queue_waiting", "handler=br") != float64(waiting) || s.get(p+"sessions_active", "handler=br") != float64(active) ||
			s.get(p+"capacity", "handler=br") != float64(capacity) {
			t.Fatalf("%s: metrics waiting %v active %v capacity %v", what, s.get(p+"queue_waiting", "handler=br"),
				s.get(p+"sessions_active", "handler=br"), s.get(p+"capacity", "handler=br"))
		}
	}
	check("idle", 0, 0, 4, 0)

	var conns []*websocket.Conn
	defer func() {
		for _, c := range conns {
			c.CloseNow()
		}
	}()
	for range 4 {
		c, _, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	check("full", 0, 4, 4, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waiter := dialWith(ctx, g.WS("/"), nil)
	check("full with a waiter", 1, 4, 4, 1.25)

	// A drained provider takes no clients: its cap is not counted; its
	// sessions are.
	providerAction(t, g, foundName(a), "drain")
	check("one drained", 1, 4, 2, 2.5)
	providerAction(t, g, foundName(a), "undrain")
	conns[0].Close(websocket.StatusNormalClosure, "")
	conns = append(conns, mustServe(t, waiter, 10*time.Second, "waiter"))
	check("the waiter served", 0, 4, 4, 1)
	if st, ok := pool.Current().Lookup(foundName(a)); !ok || st.FoundBy() != "br" {
		t.Fatal("the registry does not know the found provider")
	}
}

// TestFoundThroughARecords: Caddy's a source, its port given: each IP the
// name resolves to is a provider named br/<ip>:<port>, dialed at that IP;
// an IP gone from the records is drained, and goes.
func TestFoundThroughARecords(t *testing.T) {
	dns := fakedns.Start(t)
	a := fakes.Echo("fd6-a", nil)
	defer a.Close()
	name := fmt.Sprintf("t%d.a.browsers.test.", srvSeq.Add(1))
	dns.SetA(name, "127.0.0.1")
	g := testgw.Start(t, fmt.Sprintf(`{"handler":"browser_failover","dynamic_providers":[{"name":"br",
		"dynamic":{"source":"a","name":%q,"port":%q,"refresh":"200ms","versions":{"ipv4":true},"resolver":{"addresses":[%q]}},
		"scheme":"ws"}]}`, name, portOf(a), dns.Addr))
	found := "br/" + a.Addr
	testgw.Eventually(t, 10*time.Second, found+" found", func() bool { _, ok := listed(t, g, found); return ok })
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	echoOnce(t, c, []byte("through an A record"))
	if p, _ := listed(t, g, found); p.URL != "ws://"+a.Addr+"/" || p.Active != 1 || a.Hits.Load() != 1 {
		t.Fatalf("%s: %+v, %d upgrades at the provider", found, p, a.Hits.Load())
	}
	// The name now resolves to another address: 127.0.0.1 is drained.
	dns.SetA(name, "192.0.2.10") // TEST-NET-1: found, never dialed
	testgw.Eventually(t, 10*time.Second, found+" leaving", func() bool { p, _ := listed(t, g, found); return p.Leaving })
	echoOnce(t, c, []byte("still relayed"))
	c.Close(websocket.StatusNormalClosure, "")
	testgw.Eventually(t, 5*time.Second, found+" to leave the status", func() bool { _, ok := listed(t, g, found); return !ok })
}
