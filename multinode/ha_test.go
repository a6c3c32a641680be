package multinode_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
)

// haHandler is the handler JSON object of node with redis as its Redis
// settings (sentinel or cluster), the test's key prefix and lease_ttl.
func haHandler(t *testing.T, cc clusterConfig, node string, redis map[string]any) map[string]any {
	redis["key_prefix"] = "multinode:" + t.Name() + ":"
	redis["lease_ttl"] = leaseTTL.String()
	redis["timeout"] = "300ms"
	state := map[string]any{"redis": redis, "node": node}
	if cc.onUnavailable != "" {
		state["on_unavailable"] = cc.onUnavailable
	}
	return map[string]any{
		"handler":   "browser_failover",
		"providers": cc.providers,
		"queue":     map[string]any{"size": cc.queueSize, "timeout": "30s"},
		"state":     state,
	}
}

// sharedState is the document-level shared-state part of a node's status.
type sharedState struct {
	Up    *bool `json:"shared_state_up"`
	State *struct {
		Mode    string `json:"mode"`
		Address string `json:"address"`
	} `json:"shared_state"`
}

func (n *node) sharedState() (sharedState, string, error) {
	var st sharedState
	b, err := n.get("/browser_failover/status")
	if err != nil {
		return st, "", err
	}
	err = json.Unmarshal(b, &st)
	return st, string(b), err
}

// upOn is an eventually condition: g's status shows the shared state up,
// reached at addr.
func upOn(g *node, mode, addr string) func() (bool, string) {
	return func() (bool, string) {
		st, raw, err := g.sharedState()
		if err != nil {
			return false, err.Error()
		}
		return st.Up != nil && *st.Up && st.State != nil && st.State.Mode == mode && st.State.Address == addr, raw
	}
}

// refused tries one client through g and tells whether it was refused
// with 503 (an admitted session is closed at once).
func refused(g *node) (bool, error) {
	err := serveOnce(g.WS(), 10*time.Second)
	if err == nil {
		return false, nil
	}
	if statusOf(err) == 503 {
		return true, nil
	}
	return false, err
}

// TestSentinelFailoverExact: two nodes share a provider's max_concurrent
// through a Sentinel-managed master; the master is killed (kill -9) while
// clients keep connecting; both nodes follow the promoted replica and
// report up; from then on the cap is exact again (a client beyond it is
// refused while the earlier sessions live, one is admitted once one ends).
func TestSentinelFailoverExact(t *testing.T) {
	sn := testredis.StartSentinel(t)
	echo := startEcho(t)
	const limit = 3
	cc := clusterConfig{
		providers:     []map[string]any{{"name": "echo", "url": echo.URL(), "max_concurrent": limit}},
		onUnavailable: "reject",
	}
	redis := func() map[string]any {
		return map[string]any{"sentinel": map[string]any{"master": sn.Master, "addresses": sn.SentinelAddrs()}}
	}
	gw1 := startNode(t, "gw-1", haHandler(t, cc, "gw-1", redis()))
	gw2 := startNode(t, "gw-2", haHandler(t, cc, "gw-2", redis()))
	nodes := []*node{gw1, gw2}
	for _, g := range nodes {
		eventually(t, 10*time.Second, g.Name+": up on the primary", upOn(g, "sentinel", sn.Primary.Addr()))
	}

	// The cap, held: 2 sessions through gw-1, 1 through gw-2.
	held := append(holdSessions(t, gw1, 2), holdSessions(t, gw2, 1)...)
	want := map[string]int{"gw-1": 2, "gw-2": 1}
	for _, g := range nodes {
		eventually(t, 10*time.Second, g.Name+": 3 leases", clusterIs(g, "echo", limit, want))
		if ok, err := refused(g); !ok || err != nil {
			t.Fatalf("a client beyond the cap through %s: refused %v, %v", g.Name, ok, err)
		}
	}

	// Clients keep connecting through both nodes while the master dies;
	// each is refused (the cap is held), or admitted and closed at once.
	var stop atomic.Bool
	var upSince atomic.Int64 // unix ns once both nodes report up again
	var admitted, admittedAfterUp, tries atomic.Int64
	var wg sync.WaitGroup
	for _, g := range nodes {
		wg.Go(func() {
			for !stop.Load() {
				// Counted after the nodes reported up only when it
				// started after: one that started before was decided
				// in the gap.
				start := time.Now().UnixNano()
				err := serveOnce(g.WS(), 10*time.Second)
				tries.Add(1)
				if err == nil {
					admitted.Add(1)
					if u := upSince.Load(); u != 0 && start > u {
						admittedAfterUp.Add(1)
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	defer func() { stop.Store(true); wg.Wait() }()

	time.Sleep(300 * time.Millisecond)
	killed := time.Now()
	sn.Primary.Stop()
	testredis.WaitFor(t, 60*time.Second, "the sentinels to name the replica", func() bool {
		return sn.MasterAddr(t) == sn.Replica.Addr()
	})
	named := time.Now()
	for _, g := range nodes {
		eventually(t, 30*time.Second, g.Name+": up on the promoted replica", upOn(g, "sentinel", sn.Replica.Addr()))
		t.Logf("%s reports up on the new master %v after the sentinels named it", g.Name, time.Since(named).Round(time.Millisecond))
	}
	upSince.Store(time.Now().UnixNano())
	t.Logf("failover: the sentinels named the replica %v after the kill", named.Sub(killed).Round(time.Millisecond))
	for _, g := range nodes {
		eventually(t, 10*time.Second, g.Name+": the 3 leases counted on the new master", clusterIs(g, "echo", limit, want))
	}
	// Clients beyond the cap go on being refused for a while.
	time.Sleep(time.Second)
	stop.Store(true)
	wg.Wait()
	t.Logf("load: %d tries, %d admitted during the gap, %d after both nodes reported up", tries.Load(), admitted.Load()-admittedAfterUp.Load(), admittedAfterUp.Load())
	if n := admittedAfterUp.Load(); n > 0 {
		t.Errorf("%d clients admitted beyond max_concurrent %d after both nodes reported up on the new master", n, limit)
	}
	for _, g := range nodes {
		if ok, err := refused(g); !ok || err != nil {
			t.Errorf("a client beyond the cap through %s after the failover: refused %v, %v", g.Name, ok, err)
		}
		eventually(t, 10*time.Second, g.Name+": shared_state_failovers_total 1", metricIs(g, "caddy_browser_failover_shared_state_failovers_total", 1))
	}
	// One ends: one more is admitted (through the other node).
	closeSession(held[0])
	eventually(t, 10*time.Second, "a client admitted through gw-2 once a session ended", func() (bool, string) {
		err := serveOnce(gw2.WS(), 10*time.Second)
		return err == nil, fmt.Sprint(err)
	})
	if p := echo.Peak(); p > limit+1 {
		// The gap may admit beyond the cap (reject: nobody while down);
		// the log above says how many.
		t.Logf("provider peak %d sessions", p)
	}
	for _, g := range nodes {
		if b, err := g.get("/browser_failover/status"); err == nil && strings.Contains(string(b), "CROSSSLOT") {
			t.Errorf("%s: CROSSSLOT in status", g.Name)
		}
	}
}

// TestRedisClusterExact: two nodes share state through a three-master
// Redis Cluster; providers whose keys fall in different slots keep exact
// caps over both nodes, a cooldown one node starts holds on the other,
// and no command fails with CROSSSLOT.
func TestRedisClusterExact(t *testing.T) {
	c := testredis.StartCluster(t)
	broken := fakes.Status("broken", nil, http.StatusInternalServerError, nil, "provider exploded")
	t.Cleanup(broken.Close)
	names := []string{"alpha", "bravo", "charlie"}
	echos := map[string]*echoProvider{}
	providers := []map[string]any{{
		"name": "broken", "url": broken.URL(), "priority": 1,
		"cooldown": map[string]any{"min_requests": 1, "failure_threshold": 0.5, "duration": "30s"},
	}}
	slots := map[string]bool{}
	for i, name := range names {
		echos[name] = startEcho(t)
		providers = append(providers, map[string]any{"name": name, "url": echos[name].URL(), "priority": i + 2, "max_concurrent": 1})
		slots[strings.TrimSpace(testredis.Cmd(t, c.Addrs()[0], "CLUSTER", "KEYSLOT", "{"+name+"}"))] = true
	}
	if len(slots) < 2 {
		t.Fatalf("the providers' keys are in %d slot(s)", len(slots))
	}
	cc := clusterConfig{providers: providers}
	seeds := c.Addrs()[:2]
	gw1 := startNode(t, "gw-1", haHandler(t, cc, "gw-1", map[string]any{"cluster": seeds}))
	gw2 := startNode(t, "gw-2", haHandler(t, cc, "gw-2", map[string]any{"cluster": seeds}))
	nodes := []*node{gw1, gw2}
	for _, g := range nodes {
		eventually(t, 10*time.Second, g.Name+": up on the cluster", upOn(g, "cluster", strings.Join(seeds, ",")))
	}

	// gw-1's first client fails on broken (a shared cooldown starts) and
	// takes alpha; gw-2 skips broken, finds alpha full, takes bravo; gw-1
	// then takes charlie. The next client is refused on either node.
	held := holdSessions(t, gw1, 1)
	held = append(held, holdSessions(t, gw2, 1)...)
	held = append(held, holdSessions(t, gw1, 1)...)
	for _, g := range nodes {
		eventually(t, 10*time.Second, g.Name+": alpha held by gw-1", clusterIs(g, "alpha", 1, map[string]int{"gw-1": 1}))
		eventually(t, 10*time.Second, g.Name+": bravo held by gw-2", clusterIs(g, "bravo", 1, map[string]int{"gw-2": 1}))
		eventually(t, 10*time.Second, g.Name+": charlie held by gw-1", clusterIs(g, "charlie", 1, map[string]int{"gw-1": 1}))
		if ok, err := refused(g); !ok || err != nil {
			t.Errorf("a client beyond every cap through %s: refused %v, %v", g.Name, ok, err)
		}
	}
	if got := broken.Hits.Load(); got != 1 {
		t.Errorf("broken got %d requests, want gw-1's first only (the cooldown is shared)", got)
	}
	for name, e := range echos {
		if p := e.Peak(); p > 1 {
			t.Errorf("%s had %d sessions at once; max_concurrent 1 over the cluster", name, p)
		}
	}
	// One ends on gw-1: gw-2 gets its slot.
	closeSession(held[0])
	eventually(t, 10*time.Second, "a client through gw-2 once alpha's session ended", func() (bool, string) {
		err := serveOnce(gw2.WS(), 10*time.Second)
		return err == nil, fmt.Sprint(err)
	})
	for _, n := range c.Nodes {
		if st := n.ErrorStats(t); strings.Contains(st, "CROSSSLOT") {
			t.Errorf("%s answered CROSSSLOT: %s", n.Addr(), st)
		}
	}
	for _, g := range nodes {
		if b, err := os.ReadFile(g.LogPath); err == nil && strings.Contains(string(b), "CROSSSLOT") {
			t.Errorf("%s: CROSSSLOT in the log", g.Name)
		}
	}
}

// TestHAPartition: in Sentinel and in Cluster mode, gw-1 (which holds the
// cap) is cut off from Redis longer than lease_ttl: its ACL user is
// turned off and its connections killed on every server, so each call it
// makes fails. gw-2 takes a slot its expired leases held. Once the user
// is back on, gw-1 puts its leases back: both nodes show the cluster over
// the limit, nobody is admitted, and admission comes back when enough
// sessions end.
func TestHAPartition(t *testing.T) {
	t.Run("sentinel", func(t *testing.T) {
		sn := testredis.StartSentinel(t)
		redis := map[string]any{"sentinel": map[string]any{"master": sn.Master, "addresses": sn.SentinelAddrs()}}
		testPartition(t, []string{sn.Primary.Addr(), sn.Replica.Addr()}, redis)
	})
	t.Run("cluster", func(t *testing.T) {
		c := testredis.StartCluster(t)
		testPartition(t, c.Addrs(), map[string]any{"cluster": c.Addrs()[:1]})
	})
}

func testPartition(t *testing.T, servers []string, redis map[string]any) {
	acl := func(args ...string) {
		for _, s := range servers {
			testredis.Cmd(t, s, args...)
		}
	}
	acl("ACL", "SETUSER", "gw1", "on", ">gw1-pass", "~*", "&*", "+@all")
	echo := startEcho(t)
	const limit = 2
	cc := clusterConfig{providers: []map[string]any{{"name": "echo", "url": echo.URL(), "max_concurrent": limit}}}
	r1 := map[string]any{"username": "gw1", "password": "gw1-pass"}
	r2 := map[string]any{}
	for k, v := range redis {
		r1[k], r2[k] = v, v
	}
	gw1 := startNode(t, "gw-1", haHandler(t, cc, "gw-1", r1))
	gw2 := startNode(t, "gw-2", haHandler(t, cc, "gw-2", r2))
	nodes := []*node{gw1, gw2}
	held := holdSessions(t, gw1, limit)
	for _, g := range nodes {
		eventually(t, 10*time.Second, g.Name+": gw-1 holds the cap", clusterOver(g, "echo", limit, 0))
	}
	if ok, err := refused(gw2); !ok || err != nil {
		t.Fatalf("a client beyond the cap through gw-2: refused %v, %v", ok, err)
	}

	acl("ACL", "SETUSER", "gw1", "off")
	acl("CLIENT", "KILL", "USER", "gw1")
	cut := time.Now()
	var extra []*websocket.Conn
	eventually(t, 10*leaseTTL+10*time.Second, "gw-2 takes a slot once gw-1's leases expired", func() (bool, string) {
		ctx, cancel := withTimeout(5 * time.Second)
		defer cancel()
		c, err := openSession(ctx, gw2.WS())
		if err != nil {
			return false, err.Error()
		}
		extra = append(extra, c)
		return true, ""
	})
	t.Cleanup(func() {
		for _, c := range extra {
			c.CloseNow()
		}
	})
	t.Logf("gw-2 admitted a client %v after the cut (lease_ttl %v)", time.Since(cut).Round(time.Millisecond), leaseTTL)

	acl("ACL", "SETUSER", "gw1", "on")
	healed := time.Now()
	for _, g := range nodes {
		eventually(t, 15*time.Second, g.Name+": over the limit by 1 once gw-1's leases are back", clusterOver(g, "echo", limit+1, 1))
	}
	t.Logf("gw-1's leases back %v after the heal", time.Since(healed).Round(time.Millisecond))
	for _, g := range nodes {
		if ok, err := refused(g); !ok || err != nil {
			t.Errorf("a client through %s while over the limit: refused %v, %v", g.Name, ok, err)
		}
	}
	closeSession(held[0])
	closeSession(held[1])
	eventually(t, 15*time.Second, "admission again below the limit", func() (bool, string) {
		err := serveOnce(gw1.WS(), 10*time.Second)
		return err == nil, fmt.Sprint(err)
	})
}
