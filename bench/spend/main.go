// Command spend measures what the spend accounting and the learnt cap cost
// a client's connect: the same Caddy binary serving one echo provider,
// once without any spend option and once with a cost, a budget, a
// client_budget, max_concurrent auto and strategy cheapest, side by side
// in the same run, alternating over the rounds; and, when redis-server is
// installed, the same pair under state redis (where each connect's lease
// then also reads the learnt cap, in the same round trip). Each round
// measures sequential connects (p50, p99 of the time to the 101) and the
// handshakes per second of 4 clients connecting in a loop.
//
//	go run ./bench/spend [-caddy <caddy>] [-rounds 5] [-connects 300] [-redis=false]
//
// Every load is bounded in count and time and stops by itself.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/caddybin"
	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
)

var (
	caddyBin = flag.String("caddy", "", "Caddy binary (default: build ./cmd/caddy)")
	rounds   = flag.Int("rounds", 5, "rounds over the configurations; medians are printed")
	connects = flag.Int("connects", 300, "sequential connects, and connects of the 4 parallel clients, per configuration and round")
	redisOn  = flag.Bool("redis", true, "also measure under state redis (needs redis-server)")
)

// spendOptions are the options whose cost is measured.
const (
	providerSpend = `
			cost 0.05 per minute minimum 1m
			budget 1000000 per day
			max_concurrent auto`
	handlerSpend = `
		strategy cheapest
		client_budget {http.request.header.X-Tenant} 1000000 per day`
)

func main() {
	flag.Parse()
	tmp, bin, err := caddybin.Workdir("bf-bench-spend", *caddyBin)
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(tmp)
	echo := fakes.Echo("browser", nil)
	defer echo.Close()

	type target struct {
		name          string
		addr          string
		p50, p99, hps []float64
	}
	runs := []struct {
		name  string
		spend bool
		redis string
	}{{"no spend options", false, ""}, {"cost, budgets, auto cap, cheapest", true, ""}}
	if *redisOn {
		raddr, stop, err := caddybin.StartRedis(tmp)
		if err != nil {
			fail(err)
		}
		defer stop()
		if raddr == "" {
			fmt.Println("redis-server not found: the state redis pair is skipped")
		}
		if raddr != "" {
			runs = append(runs, struct {
				name  string
				spend bool
				redis string
			}{"state redis, no spend options", false, raddr}, struct {
				name  string
				spend bool
				redis string
			}{"state redis, cost, budgets, auto cap", true, raddr})
		}
	}
	var targets []*target
	for i, r := range runs {
		addr := caddybin.FreeAddr()
		dir := filepath.Join(tmp, fmt.Sprint(i))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			fail(err)
		}
		cmd, err := start(bin, dir, addr, echo.URL(), r.spend, r.redis, i)
		if err != nil {
			fail(err)
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		if err := caddybin.WaitListening(addr); err != nil {
			fail(err)
		}
		targets = append(targets, &target{name: r.name, addr: addr})
	}
	for r := 0; r < *rounds; r++ {
		for _, t := range targets {
			url := "ws://" + t.addr + "/"
			p50, p99, err := connectTimes(url, *connects)
			if err != nil {
				fail(fmt.Errorf("%s: %w", t.name, err))
			}
			hps, err := handshakeRate(url, 4, *connects)
			if err != nil {
				fail(fmt.Errorf("%s: %w", t.name, err))
			}
			t.p50, t.p99, t.hps = append(t.p50, p50), append(t.p99, p99), append(t.hps, hps)
		}
	}
	fmt.Printf("connects to an echo provider, %d sequential and %d over 4 clients × %d rounds (medians of the rounds)\n", *connects, *connects, *rounds)
	fmt.Printf("%-40s %10s %10s %14s\n", "", "p50 (ms)", "p99 (ms)", "handshakes/s")
	for _, t := range targets {
		fmt.Printf("%-40s %10.3f %10.3f %14.0f\n", t.name, caddybin.Median(t.p50), caddybin.Median(t.p99), caddybin.Median(t.hps))
	}
	for i := 0; i+1 < len(targets); i += 2 {
		b, s := targets[i], targets[i+1]
		fmt.Printf("%-40s %+10.3f %+10.3f %13.2f×\n", "added: "+s.name, caddybin.Median(s.p50)-caddybin.Median(b.p50), caddybin.Median(s.p99)-caddybin.Median(b.p99), caddybin.Median(s.hps)/caddybin.Median(b.hps))
	}
}

// start runs bin on a Caddyfile serving addr with one echo provider at
// providerURL, with the spend options or without; with redis (an
// address), under state redis with a key prefix of its own (n).
func start(bin, dir, addr, providerURL string, spend bool, redis string, n int) (*exec.Cmd, error) {
	pOpts, hOpts, state := "", "", ""
	if spend {
		pOpts, hOpts = providerSpend, handlerSpend
	}
	if redis != "" {
		state = fmt.Sprintf("state redis %s {\n\t\t\tkey_prefix bench%d:\n\t\t\tnode bench%d\n\t\t}", redis, n, n)
	}
	cfg := fmt.Sprintf(`{
	admin off
	storage file_system %s
}
http://%s {
	browser_failover {
		provider browser %s {%s
		}%s
		%s
	}
}
`, filepath.Join(dir, "storage"), addr, providerURL, pOpts, hOpts, state)
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "run", "--config", path, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	logf, err := os.Create(filepath.Join(dir, "caddy.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	return cmd, cmd.Start()
}

// dialOnce opens and closes one session, as tenant t.
func dialOnce(url, tenant string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t0 := time.Now()
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"X-Tenant": {tenant}}})
	d := time.Since(t0)
	if err != nil {
		return 0, err
	}
	c.CloseNow()
	return d, nil
}

// connectTimes opens and closes n sessions one after another and returns
// the p50 and p99 of the time to the 101, in ms.
func connectTimes(url string, n int) (p50, p99 float64, err error) {
	times := make([]float64, 0, n)
	for i := 0; i < n; i++ {
		d, err := dialOnce(url, fmt.Sprint("tenant-", i%8))
		if err != nil {
			return 0, 0, err
		}
		times = append(times, float64(d.Microseconds())/1000)
	}
	sort.Float64s(times)
	return times[len(times)/2], times[len(times)*99/100], nil
}

// handshakeRate runs workers clients that open and close n sessions in
// all, and returns the sessions opened per second.
func handshakeRate(url string, workers, n int) (float64, error) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	per := n / workers
	t0 := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				if _, err := dialOnce(url, fmt.Sprint("tenant-", w)); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return 0, first
	}
	return float64(per*workers) / time.Since(t0).Seconds(), nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "spend:", err)
	os.Exit(1)
}
