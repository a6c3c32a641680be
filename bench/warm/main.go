// Command warm measures what warm sessions do for a provider with a slow
// start: the time from a client's upgrade to its 101 through the gateway,
// for a provider whose handshake takes -handshake (1.5 s) with `warm 2`,
// the same provider without warm, and an instant provider without warm
// (the gateway's own connect), one connect to each in turn per round so
// all three see the same machine; and the warm sessions the gateway keeps
// idle meanwhile (never more than the target).
//
//	go run ./bench/warm [-caddy <caddy>] [-rounds 20] [-handshake 1.5s]
//
// Every load is bounded in count and time and stops by itself.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/caddybin"
)

var (
	caddyBin  = flag.String("caddy", "", "Caddy binary (default: build ./cmd/caddy)")
	rounds    = flag.Int("rounds", 20, "connects to each provider")
	handshake = flag.Duration("handshake", 1500*time.Millisecond, "the slow provider's handshake time")
	warmN     = flag.Int("warm", 2, "warm sessions of the slow provider")
)

// fake is a provider that answers its upgrades after delay and echoes,
// counting its open connections.
type fake struct {
	addr  string
	open  atomic.Int64
	peak  atomic.Int64
	delay time.Duration
}

func startFake(delay time.Duration) *fake {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	f := &fake{addr: ln.Addr().String(), delay: delay}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(f.delay)
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: websocket.CompressionDisabled})
		if err != nil {
			return
		}
		n := f.open.Add(1)
		for {
			p := f.peak.Load()
			if n <= p || f.peak.CompareAndSwap(p, n) {
				break
			}
		}
		defer f.open.Add(-1)
		for {
			typ, b, err := c.Read(context.Background())
			if err != nil {
				return
			}
			c.Write(context.Background(), typ, b)
		}
	}))
	return f
}

func main() {
	flag.Parse()
	caddybin.RaiseFileLimit()
	tmp, bin, err := caddybin.Workdir("bf-bench-warm", *caddyBin)
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(tmp)
	instant, slowWarm, slowCold := startFake(0), startFake(*handshake), startFake(*handshake)
	admin, aAddr, wAddr, cAddr := caddybin.FreeAddr(), caddybin.FreeAddr(), caddybin.FreeAddr(), caddybin.FreeAddr()
	site := func(addr, name, url, extra string) string {
		return fmt.Sprintf("http://%s {\n\tbind 127.0.0.1\n\tbrowser_failover {\n\t\tconnect_timeout 10s\n\t\tprovider %s ws://%s/ {\n\t\t\thealth_check off\n%s\t\t}\n\t}\n}\n", addr, name, url, extra)
	}
	cfg := fmt.Sprintf("{\n\tadmin %s\n}\n", admin) +
		site(aAddr, "instant", instant.addr, "") +
		site(wAddr, "slow-warm", slowWarm.addr, fmt.Sprintf("\t\t\twarm %d\n", *warmN)) +
		site(cAddr, "slow-cold", slowCold.addr, "")
	gw, err := caddybin.StartCaddy(bin, tmp, "gw", cfg, nil)
	if err != nil {
		fail(err)
	}
	defer func() { gw.Process.Kill(); gw.Wait() }()
	for _, a := range []string{aAddr, wAddr, cAddr} {
		if err := caddybin.WaitListening(a); err != nil {
			fail(err)
		}
	}
	// The warm sessions made before the first round.
	deadline := time.Now().Add(30 * time.Second)
	for ready(admin) < *warmN {
		if time.Now().After(deadline) {
			fail(fmt.Errorf("no %d warm sessions after 30s", *warmN))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The idle warm sessions, sampled through the rounds.
	var maxIdle atomic.Int64
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if n := int64(ready(admin)); n > maxIdle.Load() {
				maxIdle.Store(n)
			}
		}
	}()
	var tInstant, tWarm, tCold []float64
	for range *rounds {
		tInstant = append(tInstant, connect(aAddr))
		tWarm = append(tWarm, connect(wAddr))
		tCold = append(tCold, connect(cAddr))
	}
	close(stop)
	fmt.Printf("time from upgrade to 101, %d connects each, in turn (ms); slow provider's handshake %v\n", *rounds, *handshake)
	fmt.Printf("%-34s %9s %9s\n", "", "p50", "p99")
	row := func(name string, v []float64) {
		p50, p99 := caddybin.Percentiles(v)
		fmt.Printf("%-34s %9.2f %9.2f\n", name, p50, p99)
	}
	row("instant provider (no warm)", tInstant)
	row(fmt.Sprintf("slow provider, warm %d", *warmN), tWarm)
	row("slow provider, no warm", tCold)
	wp50, _ := caddybin.Percentiles(tWarm)
	ip50, _ := caddybin.Percentiles(tInstant)
	fmt.Printf("warm p50 − instant p50: %+.2f ms\n", wp50-ip50)
	fmt.Printf("most warm sessions idle at once: %d (target %d); most connections open at the warm provider: %d\n",
		maxIdle.Load(), *warmN, slowWarm.peak.Load())
}

// connect opens a session through the gateway at addr, timing its 101,
// checks it with one echo and closes it.
func connect(addr string) float64 {
	ms, c, err := caddybin.EchoSession(addr)
	if err != nil {
		fail(err)
	}
	c.Close(websocket.StatusNormalClosure, "")
	return ms
}

// ready is the warm sessions the slow-warm provider has ready.
func ready(admin string) int {
	resp, err := http.Get("http://" + admin + "/browser_failover/status")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var st struct {
		Providers []struct {
			Name string `json:"name"`
			Warm *struct {
				Ready int `json:"ready"`
			} `json:"warm"`
		} `json:"providers"`
	}
	json.NewDecoder(resp.Body).Decode(&st)
	for _, p := range st.Providers {
		if p.Name == "slow-warm" && p.Warm != nil {
			return p.Warm.Ready
		}
	}
	return 0
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "warm:", err)
	os.Exit(1)
}
