package multinode_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
)

// TestRedisClusterResume: in Redis Cluster mode, a session parked on one
// node (its client dropped) is resumed through the other with its token,
// at the same browser with its state; while it lives there neither node
// has it parked; and no server answered CROSSSLOT.
func TestRedisClusterResume(t *testing.T) {
	c := testredis.StartCluster(t)
	p1, p2 := startState(t, "p1"), startState(t, "p2")
	cc := clusterConfig{providers: []map[string]any{
		{"name": "p1", "url": "ws://" + p1.addr + "/browser/one"},
		{"name": "p2", "url": "ws://" + p2.addr + "/browser/two"},
	}}
	seeds := c.Addrs()[:1]
	var nodes []*node
	for _, name := range []string{"gw-1", "gw-2"} {
		h := haHandler(t, cc, name, map[string]any{"cluster": seeds})
		h["resume"] = map[string]any{"window": "1m"}
		nodes = append(nodes, startNode(t, name, h))
	}
	gw1, gw2 := nodes[0], nodes[1]
	for _, g := range nodes {
		eventually(t, 10*time.Second, g.Name+": up on the cluster", upOn(g, "cluster", strings.Join(seeds, ",")))
	}

	cl, s1, _ := connectAs(t, gw1.WS(), "alice")
	first := talk(t, cl, "who")
	talk(t, cl, "set 42")
	cl.CloseNow()
	eventually(t, 10*time.Second, "parked on gw-1", func() (bool, string) {
		return len(gw1.LogEntries("session parked")) == 1, ""
	})
	c2, _, code := connectAs(t, gw2.WS()+"?bf_resume="+s1.token, "alice")
	if code != 101 {
		t.Fatalf("the resume through gw-2: %d", code)
	}
	if got := talk(t, c2, "who"); got != first {
		t.Fatalf("resumed at %s, want %s", got, first)
	}
	if got := talk(t, c2, "get"); got != "42" {
		t.Fatalf("state after the resume through another node: %q", got)
	}
	// While it lives on gw-2, neither node has it parked.
	for _, g := range nodes {
		if _, _, code := connectAs(t, g.WS()+"?bf_resume="+s1.token, "alice"); code != 410 {
			t.Fatalf("a resume on %s of the session live on gw-2: %d, want 410", g.Name, code)
		}
	}
	c2.Close(websocket.StatusNormalClosure, "")
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

// TestRedisClusterFailover: a Redis Cluster with a replica per master;
// the master of a provider's slot is killed while its one slot (max
// concurrent 1) is held through gw-1. The cluster promotes the replica;
// both nodes refuse clients meanwhile (on_unavailable reject), find the
// new master, gw-1 puts its lease back there, and the cap is exact again:
// a client beyond it is refused on both nodes while the session lives,
// and one is admitted once it ends.
func TestRedisClusterFailover(t *testing.T) {
	c := testredis.StartClusterWithReplicas(t)
	echo := startEcho(t)
	cc := clusterConfig{onUnavailable: "reject", providers: []map[string]any{
		{"name": "alpha", "url": echo.URL(), "max_concurrent": 1},
	}}
	seeds := c.Addrs()[:2]
	var nodes []*node
	for _, name := range []string{"gw-1", "gw-2"} {
		nodes = append(nodes, startNode(t, name, haHandler(t, cc, name, map[string]any{"cluster": seeds})))
	}
	gw1, gw2 := nodes[0], nodes[1]
	for _, g := range nodes {
		eventually(t, 10*time.Second, g.Name+": up on the cluster", upOn(g, "cluster", strings.Join(seeds, ",")))
	}
	held := holdSessions(t, gw1, 1)
	for _, g := range nodes {
		eventually(t, 10*time.Second, g.Name+": alpha held by gw-1", clusterIs(g, "alpha", 1, map[string]int{"gw-1": 1}))
	}

	var live *testredis.Server
	master := c.MasterOf(t, "{alpha}", c.Nodes[0])
	if master == nil {
		t.Fatal("no master serves alpha's slot")
	}
	for _, n := range c.Nodes {
		if n != master {
			live = n
			break
		}
	}
	killed := time.Now()
	master.Stop()
	eventually(t, 60*time.Second, "a replica promoted for alpha's slot", func() (bool, string) {
		nodes := testredis.Cmd(t, live.Addr(), "CLUSTER", "NODES")
		m := c.MasterOf(t, "{alpha}", live)
		return strings.Contains(testredis.Cmd(t, live.Addr(), "CLUSTER", "INFO"), "cluster_state:ok") &&
			m != nil && m != master, nodes
	})
	t.Logf("the cluster promoted alpha's replica %v after the kill", time.Since(killed).Round(time.Millisecond))
	for _, g := range nodes {
		eventually(t, 20*time.Second, g.Name+": alpha's lease back on the new master", clusterIs(g, "alpha", 1, map[string]int{"gw-1": 1}))
	}
	t.Logf("both nodes count gw-1's lease on the new master %v after the kill", time.Since(killed).Round(time.Millisecond))
	for _, g := range nodes {
		if ok, err := refused(g); !ok || err != nil {
			t.Errorf("a client beyond the cap through %s after the failover: refused %v, %v", g.Name, ok, err)
		}
	}
	if p := echo.Peak(); p > 1 {
		t.Fatalf("the provider had %d sessions at once; max_concurrent 1", p)
	}
	closeSession(held[0])
	eventually(t, 10*time.Second, "a client through gw-2 once the session ended", func() (bool, string) {
		err := serveOnce(gw2.WS(), 10*time.Second)
		return err == nil, fmt.Sprint(err)
	})
}
