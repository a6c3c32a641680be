package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/status"
)

// providerOfSession is the provider a live session runs on, from the
// sessions list.
func providerOfSession(t *testing.T, g *testgw.Gateway, id string) string {
	t.Helper()
	code, b, err := g.AdminDo(http.MethodGet, status.SessionsPath, nil)
	if err != nil || code != 200 {
		t.Fatalf("sessions: %d %v", code, err)
	}
	var list status.Sessions
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Sessions {
		if s.ID == id {
			return s.Provider
		}
	}
	t.Fatalf("no live session %s in %s", id, b)
	return ""
}

// viaGateway opens a CDP session through the gateway, checks that its
// browser answers Browser.getVersion, and returns it with its session ID.
func viaGateway(t *testing.T, g *testgw.Gateway, id int) (*websocket.Conn, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, g.WS("/"), nil)
	if err != nil {
		t.Fatalf("session %d: %v", id, err)
	}
	c.SetReadLimit(16 << 20)
	var v struct {
		Product string `json:"product"`
	}
	if err := json.Unmarshal(cdpCall(t, c, id, "Browser.getVersion", nil), &v); err != nil || v.Product == "" {
		t.Fatalf("session %d: Browser.getVersion: %q, %v", id, v.Product, err)
	}
	return c, resp.Header.Get("Browser-Failover-Session")
}

// TestBrowserlessLearntCap: a real browserless v2 with CONCURRENT=2 and
// no queue as a max_concurrent auto provider, real Chromium behind it as
// the spare. Two sessions go to browserless; the third is answered 429 by
// browserless itself, which teaches the gateway its cap, 2, and fails over
// to the spare; the fourth skips browserless as full without an attempt.
// Then health_check { capacity browserless } reads browserless's real
// /pressure: full with the two sessions, not full once one ends, and the
// next client goes to browserless again.
func TestBrowserlessLearntCap(t *testing.T) {
	Require(t, true)
	bl := StartBrowserless(t, 2, 0)
	spare := StartChromium(t)
	blProvider := func(extra string) string {
		return provider("bl", bl, `"priority":1,"max_concurrent":"auto","cooldown":{"duration":"1h"}`+extra)
	}
	spareProvider := provider("bl-spare", spare.WSURL(), `"priority":2`)
	g := testgw.Start(t, handler(`"queue":{"size":0}`, blProvider(""), spareProvider))

	var open []*websocket.Conn
	defer func() {
		for _, c := range open {
			c.CloseNow()
		}
	}()
	var ids []string
	for i := 1; i <= 4; i++ {
		c, id := viaGateway(t, g, i)
		open, ids = append(open, c), append(ids, id)
	}
	for i, want := range []string{"bl", "bl", "bl-spare", "bl-spare"} {
		if got := providerOfSession(t, g, ids[i]); got != want {
			t.Fatalf("session %d on %s, want %s", i+1, got, want)
		}
	}
	p := providerStatus(t, g, "bl")
	if p.MaxConcurrentLearned != float64(2) || p.CooldownUntil != nil {
		t.Fatalf("browserless's cap: learnt %v, cooldown %v; want 2 and no skip", p.MaxConcurrentLearned, p.CooldownUntil)
	}
	// Three attempts at browserless: two sessions and the 429.
	if got := strings.Join(attemptsOf(g, "bl"), ","); got != "ok,ok,status_429" {
		t.Fatalf("attempts at browserless %q", got)
	}
	// The spare's sessions end; their attempts show the 429 and the skip.
	open[2].Close(websocket.StatusNormalClosure, "")
	open[3].Close(websocket.StatusNormalClosure, "")
	open = open[:2]
	testgw.Eventually(t, 10*time.Second, "the spare's sessions' ends", func() bool { return len(ended(g)) == 2 })
	var words []string
	for _, s := range ended(g) {
		words = append(words, strings.Join(s.Attempts, ","))
	}
	if got := strings.Join(words, " "); got != "bl:status_429,bl-spare:ok bl:full,bl-spare:ok" &&
		got != "bl:full,bl-spare:ok bl:status_429,bl-spare:ok" {
		t.Fatalf("the spare's sessions' attempts: %q", got)
	}

	// Its real /pressure through the capacity health check: full while
	// the two sessions run (they outlive the reload).
	if err := g.Reload(handler(`"queue":{"size":0}`, blProvider(`,"health_check":{"capacity":"browserless","interval":"500ms"}`), spareProvider)); err != nil {
		t.Fatal(err)
	}
	var c status.Capacity
	capacity := func() status.Capacity {
		raw, _ := json.Marshal(providerStatus(t, g, "bl").Capacity)
		var c status.Capacity
		json.Unmarshal(raw, &c)
		return c
	}
	testgw.Eventually(t, 30*time.Second, "the probe to read browserless full", func() bool {
		c = capacity()
		return c.Full && c.Running == 2 && c.Max == 2
	})
	open[0].Close(websocket.StatusNormalClosure, "")
	open = open[1:]
	testgw.Eventually(t, 30*time.Second, "the probe to read a free slot", func() bool {
		c = capacity()
		return !c.Full && c.Running == 1
	})
	c5, id5 := viaGateway(t, g, 5)
	open = append(open, c5)
	if got := providerOfSession(t, g, id5); got != "bl" {
		t.Fatalf("the fifth session ran on %s, want browserless (one of its two slots free)", got)
	}
	if p := providerStatus(t, g, "bl"); p.MaxConcurrentLearned != float64(2) || p.Active != 2 {
		t.Fatalf("after the reload: learnt %v, active %d", p.MaxConcurrentLearned, p.Active)
	}
}
