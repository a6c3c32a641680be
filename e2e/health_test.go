package e2e

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
)

// TestProbesFindKilledChromium: with active health checks on two real
// Chromium providers, killing one while no client is connected makes it
// unhealthy in the status within about two intervals, found by probes
// alone; the next Puppeteer client goes straight to the other one (the
// dead one is skipped, never attempted); a Chromium started again on the
// same port is healthy again without any client having tried it.
func TestProbesFindKilledChromium(t *testing.T) {
	Require(t, true)
	bs := StartChromiums(t, 2)
	a, b := bs[0], bs[1]
	const interval = time.Second
	g := testgw.Start(t, handler(`"queue":{"size":0},"health_check":{"interval":"1s"},"cooldown":{"window":"3s","min_requests":2,"duration":"1s","max_duration":"2s"}`,
		provider("hc-chrome-a", a.HTTPURL(), `"priority":1`),
		provider("hc-chrome-b", b.HTTPURL(), `"priority":2`)))
	testgw.Eventually(t, 15*time.Second, "both browsers probed", func() bool {
		pa, pb := providerStatus(t, g, "hc-chrome-a"), providerStatus(t, g, "hc-chrome-b")
		return pa.LastProbe != nil && pa.LastProbe.Outcome == "ok" && pb.LastProbe != nil && pb.LastProbe.Outcome == "ok"
	})

	killed := time.Now()
	a.Kill()
	testgw.Eventually(t, 2*interval+10*time.Second, "the killed browser to show unhealthy", func() bool {
		return !providerStatus(t, g, "hc-chrome-a").Healthy
	})
	found := time.Since(killed)
	t.Logf("killed Chromium shown unhealthy %v after the kill (health_check interval %v)", found.Round(time.Millisecond), interval)
	if found > 2*interval+2*time.Second {
		t.Errorf("found after %v: more than about two intervals", found)
	}
	pa := providerStatus(t, g, "hc-chrome-a")
	if pa.LastProbe == nil || pa.LastProbe.Outcome != "refused" || pa.LastError != "refused" {
		t.Fatalf("status of the killed browser: %+v", pa)
	}

	// The next client: straight to b, its one attempt.
	out := RunNode(t, "client.mjs", "puppeteer-ws", g.WS("/"))
	checkResult(t, out, "puppeteer-ws")
	waitIdle(t, "hc-chrome-a", "hc-chrome-b")
	testgw.Eventually(t, 10*time.Second, "the session's end in the log", func() bool { return len(ended(g)) == 1 })
	s := ended(g)[0]
	if s.Provider != "hc-chrome-b" || strings.Join(s.Attempts, ",") != "hc-chrome-a:cooldown,hc-chrome-b:ok" {
		t.Fatalf("session %+v: want hc-chrome-a skipped in cooldown and hc-chrome-b the one attempt", s)
	}

	// Started again on the same port: healthy through its probes alone.
	_, port, _ := net.SplitHostPort(a.Addr)
	restarted := time.Now()
	again := StartChromiumAt(t, port)
	if again.Addr != a.Addr {
		t.Fatalf("restarted on %s, want %s", again.Addr, a.Addr)
	}
	testgw.Eventually(t, 30*time.Second, "the restarted browser to show healthy", func() bool {
		return providerStatus(t, g, "hc-chrome-a").Healthy
	})
	t.Logf("restarted Chromium healthy again %v after it served DevTools", time.Since(restarted).Round(time.Millisecond))
	if len(ended(g)) != 1 || active("hc-chrome-a") != 0 {
		t.Fatal("a client went to the restarted browser")
	}
	rec := g.LogEntries("provider recovered")
	if len(rec) == 0 || rec[len(rec)-1]["provider"] != "hc-chrome-a" || rec[len(rec)-1]["by"] != "health check" {
		t.Fatalf("recovered log %v", rec)
	}
	// And clients use it again.
	out = RunNode(t, "client.mjs", "puppeteer-url", g.HTTP("/"))
	checkResult(t, out, "puppeteer-url")
	testgw.Eventually(t, 10*time.Second, "the second session's end in the log", func() bool { return len(ended(g)) == 2 })
	if s := ended(g)[1]; s.Provider != "hc-chrome-a" || strings.Join(s.Attempts, ",") != "hc-chrome-a:ok" {
		t.Fatalf("second session %+v, want the restarted browser", s)
	}
}

// TestKeepaliveRealChromiumIdle: a Puppeteer session through the gateway
// with keepalive on stays up while idle for five intervals: Chromium and
// the client answer the gateway's pings, and the page still answers
// afterwards.
func TestKeepaliveRealChromiumIdle(t *testing.T) {
	Require(t, true)
	c := StartChromium(t)
	const interval = time.Second
	g := testgw.Start(t, handler(`"queue":{"size":0},"keepalive":"1s"`, provider("ka-chrome", c.HTTPURL(), "")))
	start := time.Now()
	n := StartNode(t, "client.mjs", "puppeteer-idle", g.WS("/"), "--idle-ms=5000")
	n.Expect(t, "IDLE", 60*time.Second)
	idleFrom := time.Now()
	line := n.Expect(t, "AFTER ", 30*time.Second)
	if line != "AFTER 42" || time.Since(idleFrom) < 5*interval-500*time.Millisecond {
		t.Fatalf("after %v idle: %q", time.Since(idleFrom), line)
	}
	if err := n.Wait(t, 30*time.Second); err != nil {
		t.Fatalf("client: %v\n%s", err, n.Output())
	}
	waitIdle(t, "ka-chrome")
	testgw.Eventually(t, 10*time.Second, "the session's end in the log", func() bool { return len(ended(g)) == 1 })
	e := g.LogEntries("session ended")[0]
	pings, _ := e["keepalive_pings"].(float64)
	// Both sides idle for five intervals: several pings each.
	if e["close_reason"] == "keepalive timeout" || pings < 6 {
		t.Fatalf("session %v: want it ended by the client after several answered pings", e)
	}
	t.Logf("idle session lived %v with %v keepalive pings, ended: %v", time.Since(start).Round(time.Millisecond), pings, e["close_reason"])
	if pool.Current().Sessions.Count() != 0 {
		t.Fatalf("%d sessions still live", pool.Current().Sessions.Count())
	}
}
