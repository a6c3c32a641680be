// Command ledger measures what the ledger of created sessions costs a
// client's connect: the connect time through a provider with a session API
// (a fake REST provider on loopback whose sessions connect to an echo
// server), for a Caddy binary whose ledger is on the file system against a
// baseline binary without a ledger (an earlier build, given with -base),
// and, when redis-server is installed, the same two under state redis
// (the ledger then in Redis), all run side by side in the same run,
// alternating over the rounds.
//
//	go run ./bench/ledger -base <caddy without the ledger> [-caddy <caddy>] [-rounds 5] [-connects 300] [-redis=false]
//
// Every load is bounded in count and time and stops by itself.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/caddybin"
	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
)

var (
	base     = flag.String("base", "", "Caddy binary without the ledger (the baseline); required")
	caddyBin = flag.String("caddy", "", "Caddy binary with the ledger (default: build ./cmd/caddy)")
	rounds   = flag.Int("rounds", 5, "rounds over the two binaries; medians are printed")
	connects = flag.Int("connects", 300, "sequential connects per binary and round")
	redisOn  = flag.Bool("redis", true, "also measure both binaries under state redis (needs redis-server)")
)

func main() {
	flag.Parse()
	if *base == "" {
		fmt.Fprintln(os.Stderr, "ledger: -base (a Caddy binary without the ledger) is required")
		os.Exit(2)
	}
	tmp, bin, err := caddybin.Workdir("bf-bench-ledger", *caddyBin)
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(tmp)
	echo := fakes.Echo("browser", nil)
	defer echo.Close()
	rest := fakes.NewREST(func(string) string { return echo.URL() })
	defer rest.Close()

	type target struct {
		name string
		addr string
		p50  []float64
		p99  []float64
	}
	var targets []*target
	runs := []struct{ name, bin, redis string }{{"no ledger (base)", *base, ""}, {"ledger on the file system", bin, ""}}
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
			runs = append(runs, struct{ name, bin, redis string }{"state redis, no ledger", *base, raddr},
				struct{ name, bin, redis string }{"state redis, ledger in Redis", bin, raddr})
		}
	}
	for _, t := range runs {
		addr := caddybin.FreeAddr()
		dir := filepath.Join(tmp, fmt.Sprint(len(targets)))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			fail(err)
		}
		cmd, err := start(t.bin, dir, addr, rest.URL(), t.redis, len(targets))
		if err != nil {
			fail(err)
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		if err := caddybin.WaitListening(addr); err != nil {
			fail(err)
		}
		targets = append(targets, &target{name: t.name, addr: addr})
	}
	for r := 0; r < *rounds; r++ {
		for _, t := range targets {
			p50, p99, err := connectTimes("ws://"+t.addr+"/", *connects)
			if err != nil {
				fail(fmt.Errorf("%s: %w", t.name, err))
			}
			t.p50, t.p99 = append(t.p50, p50), append(t.p99, p99)
		}
	}
	fmt.Printf("connect time through a session-API provider, %d sequential connects × %d rounds (medians of the rounds)\n", *connects, *rounds)
	fmt.Printf("%-40s %10s %10s\n", "", "p50 (ms)", "p99 (ms)")
	for _, t := range targets {
		fmt.Printf("%-40s %10.3f %10.3f\n", t.name, caddybin.Median(t.p50), caddybin.Median(t.p99))
	}
	for i := 0; i+1 < len(targets); i += 2 {
		b, l := targets[i], targets[i+1]
		fmt.Printf("%-40s %+10.3f %+10.3f   (%.2f× at p50)\n", "added: "+l.name, caddybin.Median(l.p50)-caddybin.Median(b.p50), caddybin.Median(l.p99)-caddybin.Median(b.p99), caddybin.Median(l.p50)/caddybin.Median(b.p50))
	}
	books := rest.Books()
	fmt.Printf("fake provider: %d created, %d released\n", len(books.Created), len(books.Released))
}

// start runs bin on a Caddyfile serving addr with one provider whose
// sessions are created over the fake REST API at restURL; its storage is
// dir; with redis (an address), under state redis with a key prefix of
// its own (n).
func start(bin, dir, addr, restURL, redis string, n int) (*exec.Cmd, error) {
	state := ""
	if redis != "" {
		state = fmt.Sprintf("state redis %s {\n\t\t\tkey_prefix bench%d:\n\t\t\tnode bench%d\n\t\t}", redis, n, n)
	}
	cfg := fmt.Sprintf(`{
	admin off
	storage file_system %s
}
http://%s {
	browser_failover {
		provider cloud %s {
			session_api {
				create POST /v1/sessions
				connect_url /connectUrl
				session_id /id
				release POST /v1/sessions/{session_id}/release
			}
		}
		%s
	}
}
`, filepath.Join(dir, "storage"), addr, restURL, state)
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

// connectTimes opens and closes n sessions one after another and returns
// the p50 and p99 of the time to the 101, in ms.
func connectTimes(url string, n int) (p50, p99 float64, err error) {
	times := make([]float64, 0, n)
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t0 := time.Now()
		c, _, err := websocket.Dial(ctx, url, nil)
		d := time.Since(t0)
		cancel()
		if err != nil {
			return 0, 0, err
		}
		c.CloseNow()
		times = append(times, float64(d.Microseconds())/1000)
	}
	sort.Float64s(times)
	return times[len(times)/2], times[len(times)*99/100], nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "ledger:", err)
	os.Exit(1)
}
