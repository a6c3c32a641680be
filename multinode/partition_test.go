package multinode_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
)

// cutProxy is a TCP proxy between one node and redis-server that the test
// cuts and heals. Cut, it black-holes: connections stay open and nothing
// passes either way (new ones are accepted and stay silent), as with a
// network partition, so every call waits for its timeout. Healed, the
// connections that were open before the cut are closed as soon as they
// carry anything, and the others pass again.
type cutProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cond  *sync.Cond
	cut   bool
	epoch int // bumped by every Cut
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// startCutProxy listens on 127.0.0.1 and forwards to target; it is closed
// when the test ends.
func startCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is where the node connects instead of redis-server.
func (p *cutProxy) Addr() string { return p.ln.Addr().String() }

// Cut stops everything passing.
func (p *cutProxy) Cut() {
	p.mu.Lock()
	p.cut = true
	p.epoch++
	p.mu.Unlock()
}

// Heal lets traffic pass again on new connections.
func (p *cutProxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// wait blocks while cut and reports whether a connection opened in epoch
// may go on (no cut happened since).
func (p *cutProxy) wait(epoch int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.cut {
		p.cond.Wait()
	}
	return p.epoch == epoch
}

func (p *cutProxy) track(c net.Conn, on bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		if p.conns == nil {
			return false
		}
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
	return true
}

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		epoch := p.epoch
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer c.Close()
			if !p.track(c, true) {
				return
			}
			defer p.track(c, false)
			if !p.wait(epoch) {
				return // a cut came before it was connected through
			}
			up, err := net.DialTimeout("tcp", p.target, 2*time.Second)
			if err != nil {
				return
			}
			defer up.Close()
			if !p.track(up, true) {
				return
			}
			defer p.track(up, false)
			done := make(chan struct{}, 2)
			go func() { p.pump(up, c, epoch); done <- struct{}{} }()
			go func() { p.pump(c, up, epoch); done <- struct{}{} }()
			<-done
		}()
	}
}

// pump copies src to dst until either ends, holding every byte while cut
// and dropping the connection if a cut happened since it opened.
func (p *cutProxy) pump(dst, src net.Conn, epoch int) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.wait(epoch) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *cutProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.cut = false
	p.epoch++
	p.cond.Broadcast()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// overLimitMetric is the excess of live sessions over max_concurrent.
const overLimitMetric = "caddy_browser_failover_shared_over_limit"

// clusterOver is an eventually condition: provider's cluster object on n
// shows active live sessions over every node and over_limit.
func clusterOver(n *node, provider string, active, over int) func() (bool, string) {
	return func() (bool, string) {
		b, err := n.get("/browser_failover/status")
		if err != nil {
			return false, err.Error()
		}
		var st struct {
			Providers []struct {
				Name    string `json:"name"`
				Cluster struct {
					Active    int    `json:"active"`
					OverLimit int    `json:"over_limit"`
					Error     string `json:"error"`
				} `json:"cluster"`
			} `json:"providers"`
			SharedStateUp *bool `json:"shared_state_up"`
		}
		if err := json.Unmarshal(b, &st); err != nil {
			return false, err.Error()
		}
		for _, p := range st.Providers {
			if p.Name == provider {
				ok := p.Cluster.Error == "" && p.Cluster.Active == active && p.Cluster.OverLimit == over &&
					st.SharedStateUp != nil && *st.SharedStateUp
				return ok, string(b)
			}
		}
		return false, string(b)
	}
}

// loadRun is clients trying through some nodes again and again, each
// session held a moment, until stopped.
type loadRun struct {
	admitted atomic.Int64
	refused  atomic.Int64
	other    atomic.Int64
	stop     chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	samples  []string
}

// startLoad runs per clients on each of nodes; a session a client gets is
// held for hold, then closed.
func startLoad(nodes []*node, per int, hold time.Duration) *loadRun {
	l := &loadRun{stop: make(chan struct{})}
	for _, g := range nodes {
		for range per {
			l.wg.Go(func() {
				for {
					select {
					case <-l.stop:
						return
					default:
					}
					ctx, cancel := withTimeout(10 * time.Second)
					c, err := openSession(ctx, g.WS())
					cancel()
					switch {
					case err == nil:
						l.admitted.Add(1)
						select {
						case <-time.After(hold):
						case <-l.stop:
						}
						closeSession(c)
					case statusOf(err) == http.StatusServiceUnavailable:
						l.refused.Add(1)
						time.Sleep(50 * time.Millisecond)
					default:
						l.other.Add(1)
						l.mu.Lock()
						if len(l.samples) < 5 {
							l.samples = append(l.samples, g.Name+": "+err.Error())
						}
						l.mu.Unlock()
						time.Sleep(50 * time.Millisecond)
					}
				}
			})
		}
	}
	return l
}

// Stop ends the load and waits for its sessions to close.
func (l *loadRun) Stop() {
	close(l.stop)
	l.wg.Wait()
}

func (l *loadRun) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprintf("%d admitted, %d refused (503), %d other %v", l.admitted.Load(), l.refused.Load(), l.other.Load(), l.samples)
}

// TestClusterPartitionOverLimit: gw-1 holds every slot, then is cut off
// from Redis (a black hole) longer than lease_ttl: its leases expire and
// the other nodes, under load, take slots while its sessions live on.
// When the link heals its renewals put its leases back, so the cluster
// has more live sessions than max_concurrent: every node's status and
// metrics show the excess, and no node admits anyone until enough
// sessions have ended. gw-1's status answers fast throughout.
func TestClusterPartitionOverLimit(t *testing.T) {
	r := testredis.Start(t)
	proxy := startCutProxy(t, r.Addr())
	echo := startEcho(t)
	const max = 4
	cc := clusterConfig{providers: []map[string]any{{"name": "echo", "url": echo.URL(), "max_concurrent": max}}, queueSize: 0}
	nodes := startCluster(t, r, cc, func(name string, h map[string]any) {
		if name == "gw-1" {
			h["state"].(map[string]any)["redis"].(map[string]any)["address"] = proxy.Addr()
		}
	})
	gw1, gw2, gw3 := nodes[0], nodes[1], nodes[2]

	// Before: gw-1 holds every slot; load through gw-2 and gw-3 gets
	// nothing.
	held := holdSessions(t, gw1, max)
	for _, g := range nodes {
		eventually(t, 10*time.Second, g.Name+": gw-1 holds every slot", clusterOver(g, "echo", max, 0))
	}
	load := startLoad([]*node{gw2, gw3}, 2, 300*time.Millisecond)
	time.Sleep(time.Second)
	if load.admitted.Load() != 0 || echo.Open() != max {
		t.Fatalf("before the cut: load %s, provider open %d, want nobody admitted and %d open", load, echo.Open(), max)
	}
	t.Logf("before the cut: %s", load)

	// During: gw-1 is cut off for longer than lease_ttl.
	proxy.Cut()
	cut := time.Now()
	eventually(t, 10*leaseTTL+10*time.Second, "gw-2 and gw-3 take the slots gw-1's expired leases held", func() (bool, string) {
		return load.admitted.Load() > 0, load.String()
	})
	t.Logf("the others admitted a session %v after the cut (lease_ttl %v)", time.Since(cut).Round(time.Millisecond), leaseTTL)
	if since := time.Since(cut); since < leaseTTL/2 {
		t.Errorf("the others admitted a session %v after the cut, before gw-1's leases could expire", since)
	}
	// Their view: at most max, all theirs.
	for _, g := range []*node{gw2, gw3} {
		p, raw, err := g.Provider("echo")
		if err != nil {
			t.Fatal(err)
		}
		if p.Cluster == nil || p.Cluster.Error != "" || p.Cluster.Active > max || p.Cluster.Nodes["gw-1"] != 0 {
			t.Errorf("%s during the cut: %s", g.Name, raw)
		}
	}
	// gw-1's status answers at once with its local figures, and says the
	// shared state is down.
	for range 3 {
		start := time.Now()
		b, err := gw1.get("/browser_failover/status")
		took := time.Since(start)
		if err != nil {
			t.Fatalf("gw-1's status during the cut: %v", err)
		}
		var st struct {
			Providers     []providerStatus `json:"providers"`
			SharedStateUp *bool            `json:"shared_state_up"`
		}
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		if took > 5*time.Second || st.SharedStateUp == nil || *st.SharedStateUp || len(st.Providers) != 1 || st.Providers[0].Active != max {
			t.Errorf("gw-1's status during the cut took %v: %s", took, b)
		}
	}
	// Let the load fill what it can while gw-1 is still cut off.
	time.Sleep(2 * time.Second)
	peakDuring := echo.Peak()
	t.Logf("during the cut: %s; provider peak %d open", load, peakDuring)
	if peakDuring > 2*max {
		t.Errorf("the provider had %d open during the cut; at most gw-1's %d and the others' %d", peakDuring, max, max)
	}

	// Heal, with the load still running: once gw-1's leases are back the
	// cluster is over its limit, and every node shows it.
	load.Stop()
	// The load's sessions that live on: hold 3 through gw-2 (room: the
	// cluster sees only gw-2's and gw-3's, and the load has ended).
	eventually(t, 10*time.Second, "the load's sessions ended", func() (bool, string) {
		return echo.Open() == max, fmt.Sprintf("%d open", echo.Open())
	})
	// A node gives a lease back after its session has closed at the
	// provider: wait until the cluster holds none of the load's.
	for _, g := range []*node{gw2, gw3} {
		eventually(t, 10*time.Second, g.Name+": the load's leases given back", clusterIs(g, "echo", 0, nil))
	}
	extra := holdSessions(t, gw2, 3)
	proxy.Heal()
	echo.peak.Store(echo.Open())
	const live = max + 3
	for _, g := range nodes {
		eventually(t, 15*time.Second, g.Name+": over the limit by 3 in status", clusterOver(g, "echo", live, 3))
		eventually(t, 15*time.Second, g.Name+": shared_over_limit 3", metricIs(g, overLimitMetric, 3))
	}
	// Load on every node: nobody is admitted while over the limit, nor at
	// it.
	load = startLoad(nodes, 2, 300*time.Millisecond)
	time.Sleep(2 * time.Second)
	if load.admitted.Load() != 0 || echo.Open() != live {
		t.Errorf("while over the limit: load %s, provider open %d; want nobody admitted and %d open", load, echo.Open(), live)
	}
	t.Logf("after the heal, over the limit: %s", load)
	for _, c := range held[:3] {
		closeSession(c)
	}
	for _, g := range nodes {
		eventually(t, 15*time.Second, g.Name+": at the limit, no excess", clusterOver(g, "echo", max, 0))
		eventually(t, 15*time.Second, g.Name+": shared_over_limit 0", metricIs(g, overLimitMetric, 0))
	}
	time.Sleep(time.Second)
	if load.admitted.Load() != 0 {
		t.Errorf("admitted while the cluster was over or at its limit: load %s, provider open %d", load, echo.Open())
	}
	// Below the limit: admission again.
	closeSession(held[3])
	eventually(t, 15*time.Second, "admission again below the limit", func() (bool, string) {
		return load.admitted.Load() > 0, load.String()
	})
	load.Stop()
	t.Logf("after the sessions ended: %s", load)
	for _, c := range extra {
		closeSession(c)
	}
	if peak := echo.Peak(); peak > live {
		t.Errorf("the provider had %d open at once after the heal; want at most %d", peak, live)
	}
	for _, g := range nodes {
		eventually(t, 15*time.Second, g.Name+": cluster active 0", clusterOver(g, "echo", 0, 0))
	}
}
