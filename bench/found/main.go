// Command found measures providers found at run time (a providers block
// with Caddy's srv source, at a DNS server on loopback): the time from a
// client's upgrade to its 101 through a found provider against a
// configured one (both reached at localhost, one connect to each in turn
// per round, so both see the same machine); and the time from a change
// of the SRV records to the first client served by the provider it adds,
// against the source's refresh.
//
//	go run ./bench/found [-caddy <caddy>] [-rounds 200] [-changes 10] [-refresh 1s]
//
// Every load is bounded in count and time and stops by itself.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/caddybin"
	"github.com/browserfailover/caddy-browser-failover/internal/fakedns"
)

var (
	caddyBin = flag.String("caddy", "", "Caddy binary (default: build ./cmd/caddy)")
	rounds   = flag.Int("rounds", 200, "connects through each provider")
	changes  = flag.Int("changes", 10, "record changes timed")
	refresh  = flag.Duration("refresh", time.Second, "the srv source's refresh")
)

const srvName = "_cdp._tcp.bench.browsers.test."

// echo is a provider that echoes, on a 127.0.0.1 port.
type echo struct{ port uint16 }

func startEcho() echo {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: websocket.CompressionDisabled})
		if err != nil {
			return
		}
		for {
			typ, b, err := c.Read(context.Background())
			if err != nil {
				return
			}
			c.Write(context.Background(), typ, b)
		}
	}))
	_, p, _ := net.SplitHostPort(ln.Addr().String())
	n, _ := strconv.Atoi(p)
	return echo{port: uint16(n)}
}

func (e echo) srv() fakedns.SRV { return fakedns.SRV{Target: "localhost.", Port: e.port, Weight: 1} }
func (e echo) name() string     { return fmt.Sprintf("br/localhost:%d", e.port) }

func main() {
	flag.Parse()
	caddybin.RaiseFileLimit()
	tmp, bin, err := caddybin.Workdir("bf-bench-found", *caddyBin)
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(tmp)
	dns, err := fakedns.Listen()
	if err != nil {
		fail(err)
	}
	defer dns.Down()
	configured, x, y := startEcho(), startEcho(), startEcho()
	dns.SetSRV(srvName, x.srv())

	admin, cAddr, fAddr := caddybin.FreeAddr(), caddybin.FreeAddr(), caddybin.FreeAddr()
	cfg := fmt.Sprintf(`{
	admin %s
}
http://%s {
	bind 127.0.0.1
	browser_failover {
		provider configured ws://localhost:%d/
	}
}
http://%s {
	bind 127.0.0.1
	browser_failover {
		queue {
			size 10
			timeout 1m
		}
		providers br {
			dynamic srv %s {
				refresh %s
				resolvers %s
			}
			scheme ws
			max_concurrent 1
		}
	}
}
`, admin, cAddr, configured.port, fAddr, srvName, *refresh, dns.Addr)
	gw, err := caddybin.StartCaddy(bin, tmp, "gw", cfg, nil)
	if err != nil {
		fail(err)
	}
	defer func() { gw.Process.Kill(); gw.Wait() }()
	for _, a := range []string{cAddr, fAddr} {
		if err := caddybin.WaitListening(a); err != nil {
			fail(err)
		}
	}
	until(30*time.Second, x.name()+" found", func() bool { return listed(admin, x.name()) })

	// Connect time, interleaved.
	var tConf, tFound []float64
	for range *rounds {
		ms, c := connect(cAddr)
		c.Close(websocket.StatusNormalClosure, "")
		tConf = append(tConf, ms)
		ms, c = connect(fAddr)
		c.Close(websocket.StatusNormalClosure, "")
		tFound = append(tFound, ms)
	}
	fmt.Printf("time from upgrade to 101, %d connects each, in turn (ms)\n", *rounds)
	fmt.Printf("%-34s %9s %9s\n", "", "p50", "p99")
	cp50, cp99 := caddybin.Percentiles(tConf)
	fp50, fp99 := caddybin.Percentiles(tFound)
	fmt.Printf("%-34s %9.3f %9.3f\n", "configured provider", cp50, cp99)
	fmt.Printf("%-34s %9.3f %9.3f\n", "found provider (srv)", fp50, fp99)
	fmt.Printf("found p50 / configured p50: %.3f\n", fp50/cp50)

	// A record change: x is busy, a client waits, y is added; the time to
	// that client's 101. Then y is taken out again and goes.
	var tChange []float64
	for range *changes {
		_, held := connect(fAddr) // x's one slot
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		served := make(chan time.Time, 1)
		go func() {
			c, _, err := websocket.Dial(ctx, "ws://"+fAddr+"/", &websocket.DialOptions{CompressionMode: websocket.CompressionDisabled})
			if err != nil {
				fail(fmt.Errorf("waiting client: %w", err))
			}
			served <- time.Now()
			c.Close(websocket.StatusNormalClosure, "")
		}()
		until(10*time.Second, "a client waiting", func() bool { return waiting(admin) == 1 })
		// At a random point of the source's refresh period.
		time.Sleep(rand.N(*refresh))
		changed := time.Now()
		dns.SetSRV(srvName, x.srv(), y.srv())
		at := <-served
		cancel()
		tChange = append(tChange, float64(at.Sub(changed).Microseconds())/1000)
		held.Close(websocket.StatusNormalClosure, "")
		dns.SetSRV(srvName, x.srv())
		until(30*time.Second, y.name()+" gone", func() bool { return !listed(admin, y.name()) })
	}
	sort.Float64s(tChange)
	p50, _ := caddybin.Percentiles(tChange)
	fmt.Printf("record change to the first client served by the new provider, %d changes (ms): p50 %.1f, min %.1f, max %.1f; refresh %v (the source is asked every %v)\n",
		*changes, p50, tChange[0], tChange[len(tChange)-1], *refresh, min(time.Second, max(*refresh/4, 10*time.Millisecond)))
}

// connect opens a session through the gateway at addr, timing its 101,
// and checks it with one echo.
func connect(addr string) (float64, *websocket.Conn) {
	ms, c, err := caddybin.EchoSession(addr)
	if err != nil {
		fail(err)
	}
	return ms, c
}

// statusDoc is the part of the status the benchmark reads.
type statusDoc struct {
	Providers []struct {
		Name string `json:"name"`
	} `json:"providers"`
	Queues []struct {
		Handler string `json:"handler"`
		Waiting int    `json:"waiting"`
	} `json:"queues"`
}

func readStatus(admin string) statusDoc {
	var st statusDoc
	resp, err := http.Get("http://" + admin + "/browser_failover/status")
	if err != nil {
		return st
	}
	defer resp.Body.Close()
	json.NewDecoder(resp.Body).Decode(&st)
	return st
}

// listed reports whether the status lists provider name.
func listed(admin, name string) bool {
	for _, p := range readStatus(admin).Providers {
		if p.Name == name {
			return true
		}
	}
	return false
}

// waiting is the clients waiting at the providers block's handler.
func waiting(admin string) int {
	for _, q := range readStatus(admin).Queues {
		if q.Handler == "br" {
			return q.Waiting
		}
	}
	return -1
}

// until polls cond every 5 ms, failing after wait.
func until(wait time.Duration, what string, cond func() bool) {
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			fail(fmt.Errorf("no %s after %v", what, wait))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "found:", err)
	os.Exit(1)
}
