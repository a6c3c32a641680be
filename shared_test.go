package browserfailover_test

// In-process tests of the shared state (state redis) against a real
// redis-server, with another node played by a cluster.Store: slots taken
// elsewhere count against max_concurrent here, a cooldown published
// elsewhere is honoured here, and a Redis outage falls back as configured.
// The multinode folder runs several gateway processes.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
)

func stateJSON(addr, onUnavailable string) string {
	return fmt.Sprintf(`"state":{"redis":{"address":%q,"lease_ttl":"1s","timeout":"300ms","key_prefix":"sh-test:"},"node":"gw-here","on_unavailable":%q}`, addr, onUnavailable)
}

func otherNode(t *testing.T, addr string) *cluster.Store {
	t.Helper()
	s, err := cluster.Open(cluster.Config{Address: addr, KeyPrefix: "sh-test:", LeaseTTL: caddy.Duration(time.Second), Timeout: caddy.Duration(300 * time.Millisecond)}, "gw-other")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// clusterOf reads a provider's "cluster" object from the admin status.
func clusterOf(t *testing.T, g *testgw.Gateway, name string) map[string]any {
	t.Helper()
	_, body := opAdmin(t, g, http.MethodGet, "/browser_failover/status")
	var st struct {
		Providers []struct {
			Name    string         `json:"name"`
			Cluster map[string]any `json:"cluster"`
		} `json:"providers"`
	}
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Providers {
		if p.Name == name {
			return p.Cluster
		}
	}
	t.Fatalf("no provider %s in %s", name, body)
	return nil
}

// TestSharedSlots: leases held by another node count against
// max_concurrent here; when one is given back, the gateway takes it.
func TestSharedSlots(t *testing.T) {
	rs := testredis.Start(t)
	other := otherNode(t, rs.Addr())
	echo := fakes.Echo("sh-echo", nil)
	defer echo.Close()
	g := testgw.Start(t, handler(`"queue":{"size":0},`+stateJSON(rs.Addr(), "local"),
		provider("sh-echo", echo.URL(), `"max_concurrent":2`)))
	ctx := context.Background()
	var leases []*cluster.Lease
	for range 2 {
		gr, err := other.Leases().Acquire(ctx, "sh-echo", 2)
		if err != nil || gr.Lease == nil {
			t.Fatalf("other node: %+v %v", gr, err)
		}
		leases = append(leases, gr.Lease)
	}
	_, resp, err := dial(t, g.WS("/"), nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("want 503 while the other node holds both slots, got %v %v", resp, err)
	}
	leases[0].Release()
	// The other node gives the slot back in the background.
	testgw.Eventually(t, 10*time.Second, "the other node's release written", func() bool {
		sh, err := other.Leases().Snapshot(ctx, []string{"sh-echo"})
		return err == nil && sh["sh-echo"].Active == 1
	})
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatalf("a slot freed on the other node: %v", err)
	}
	echoOnce(t, c, []byte("x"))
	cl := clusterOf(t, g, "sh-echo")
	nodes, _ := cl["nodes"].(map[string]any)
	if cl["active"] != float64(2) || nodes["gw-here"] != float64(1) || nodes["gw-other"] != float64(1) || cl["node"] != "gw-here" {
		t.Fatalf("cluster %v", cl)
	}
	c.Close(websocket.StatusNormalClosure, "")
	testgw.Eventually(t, 10*time.Second, "the gateway's lease given back", func() bool {
		sh, err := other.Leases().Snapshot(ctx, []string{"sh-echo"})
		return err == nil && sh["sh-echo"].Nodes["gw-here"] == 0 && sh["sh-echo"].Active == 1
	})
	leases[1].Release()
}

// TestSharedCooldown: a cooldown another node published is honoured here
// without a single attempt; one started here is published for the others.
func TestSharedCooldown(t *testing.T) {
	rs := testredis.Start(t)
	other := otherNode(t, rs.Addr())
	contacts := &fakes.Contacts{}
	a := fakes.Echo("shc-a", contacts)
	defer a.Close()
	b := fakes.Status("shc-b", contacts, 500, nil, "down")
	defer b.Close()
	fallback := fakes.Echo("shc-c", contacts)
	defer fallback.Close()
	capped := fakes.Echo("shc-d", contacts)
	defer capped.Close()
	g := testgw.Start(t, handler(`"cooldown":{"min_requests":1,"duration":"30s"},`+stateJSON(rs.Addr(), "local"),
		provider("shc-d", capped.URL(), `"priority":0,"max_concurrent":5`),
		provider("shc-a", a.URL(), `"priority":1`),
		provider("shc-b", b.URL(), `"priority":2`),
		provider("shc-c", fallback.URL(), `"priority":3`)))
	ctx := context.Background()
	until := time.Now().Add(30 * time.Second)
	if err := other.News().PublishCooldown(ctx, "shc-a", until, 1); err != nil {
		t.Fatal(err)
	}
	// A provider without a cap is counted without a round trip: its
	// shared cooldown reaches this node as news (or, before the
	// subscription is up, on a slot request, which asks).
	testgw.Eventually(t, 10*time.Second, "shc-a's cooldown heard", func() bool {
		return !state(t, "shc-a").Health.Available()
	})
	// A capped provider's slot request reads the shared hold in the same
	// round trip: a cooldown published just before the connect is
	// honoured even before its news arrives.
	if err := other.News().PublishCooldown(ctx, "shc-d", until, 1); err != nil {
		t.Fatal(err)
	}
	// shc-d and shc-a are skipped without an attempt; shc-b fails and
	// cools down here.
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.CloseNow()
	if state(t, "shc-a").Health.Available() || state(t, "shc-d").Health.Available() {
		t.Fatal("the shared cooldown was not taken on")
	}
	for _, n := range contacts.List() {
		if n == "shc-a" || n == "shc-d" {
			t.Fatalf("contacted %v: the shared cooldown was not honoured", contacts.List())
		}
	}
	testgw.Eventually(t, 10*time.Second, "shc-b's cooldown published", func() bool {
		h, err := other.News().Hold(ctx, "shc-b")
		return err == nil && h.CooldownUntil.After(time.Now()) && h.SkipUntil.IsZero()
	})

	// An operator's reset through this node ends the shared cooldown for
	// every node.
	if code, body := opAdmin(t, g, http.MethodPost, "/browser_failover/providers/shc-b/reset"); code != http.StatusOK {
		t.Fatalf("reset: %d %s", code, body)
	}
	if h, err := other.News().Hold(ctx, "shc-b"); err != nil || !h.IsZero() {
		t.Fatalf("shared cooldown after a reset here: %+v %v", h, err)
	}
	// And one through another node resets it here.
	if err := other.News().ClearCooldown(ctx, "shc-a"); err != nil {
		t.Fatal(err)
	}
	testgw.Eventually(t, 10*time.Second, "shc-a reset through the other node", func() bool {
		return state(t, "shc-a").Health.Available()
	})
}

// TestSharedStateDown: with Redis gone, on_unavailable local serves with
// this node's limits and nothing hangs; reject answers 503; both come back
// when Redis does.
func TestSharedStateDown(t *testing.T) {
	for _, mode := range []string{"local", "reject"} {
		t.Run(mode, func(t *testing.T) {
			rs := testredis.Start(t)
			echo := fakes.Echo("shd-"+mode, nil)
			defer echo.Close()
			g := testgw.Start(t, handler(`"queue":{"size":0},`+stateJSON(rs.Addr(), mode),
				provider("shd-"+mode, echo.URL(), `"max_concurrent":5`)))
			c, _, err := dial(t, g.WS("/"), nil)
			if err != nil {
				t.Fatal(err)
			}
			c.CloseNow()
			rs.Stop()
			for range 3 {
				c, resp, err := dial(t, g.WS("/"), nil)
				switch mode {
				case "local":
					if err != nil {
						t.Fatalf("Redis down, on_unavailable local: %v", err)
					}
					echoOnce(t, c, []byte("x"))
					c.CloseNow()
				case "reject":
					if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
						t.Fatalf("Redis down, on_unavailable reject: want 503, got %v %v", resp, err)
					}
				}
			}
			if cl := clusterOf(t, g, "shd-"+mode); cl["error"] != "shared state unavailable" {
				t.Fatalf("cluster %v", cl)
			}
			rs.Start()
			testgw.Eventually(t, 15*time.Second, "service with the shared state back", func() bool {
				c, _, err := dial(t, g.WS("/"), nil)
				if err != nil {
					return false
				}
				c.CloseNow()
				cl := clusterOf(t, g, "shd-"+mode)
				return cl["error"] == nil
			})
		})
	}
}

// TestSharedCreateRateDown: a create_rate window kept in Redis falls back
// as on_unavailable says when Redis goes away. local: this node's own
// window, which already holds the starts it made while Redis was there,
// so the cap still holds; reject: no start at all, the provider skipped
// as state_unavailable, never as a failure.
func TestSharedCreateRateDown(t *testing.T) {
	for _, mode := range []string{"local", "reject"} {
		t.Run(mode, func(t *testing.T) {
			rs := testredis.Start(t)
			name := "shr-" + mode
			echo := fakes.Echo(name, nil)
			defer echo.Close()
			g := testgw.Start(t, handler(`"queue":{"size":0},`+stateJSON(rs.Addr(), mode),
				provider(name, echo.URL(), `"max_concurrent":5,"create_rate":{"n":2,"per":"minute"}`)))
			c, _, err := dial(t, g.WS("/"), nil)
			if err != nil {
				t.Fatal(err)
			}
			c.Close(websocket.StatusNormalClosure, "")
			rs.Stop()
			switch mode {
			case "local":
				// One start left in the minute, on this node's count.
				c, _, err := dial(t, g.WS("/"), nil)
				if err != nil {
					t.Fatalf("Redis down, on_unavailable local, second start: %v", err)
				}
				echoOnce(t, c, []byte("x"))
				c.Close(websocket.StatusNormalClosure, "")
				refusedForRate(t, g, name)
				if n := echo.Hits.Load(); n != 2 {
					t.Fatalf("the provider was asked for %d sessions, want 2", n)
				}
			case "reject":
				c, resp, err := dial(t, g.WS("/"), nil)
				if err == nil {
					c.CloseNow()
					t.Fatal("Redis down, on_unavailable reject: a session was started")
				}
				if resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
					t.Fatalf("Redis down, on_unavailable reject: want 503, got %v %v", resp, err)
				}
				r := &rejection{Status: resp.StatusCode}
				b, _ := io.ReadAll(resp.Body)
				if err := json.Unmarshal(b, &r.Body); err != nil {
					t.Fatalf("503 body %q: %v", b, err)
				}
				if w := r.words(); !slices.Equal(w, []string{name + ":state_unavailable"}) {
					t.Fatalf("attempts %v: %s", w, b)
				}
				if n := echo.Hits.Load(); n != 1 {
					t.Fatalf("the provider was asked for %d sessions, want 1", n)
				}
			}
			p := providerStatus(t, g, name)
			if p.Failures != 0 || p.CooldownUntil != nil {
				t.Fatalf("the outage counted against the provider: %+v", p)
			}
		})
	}
}
