package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/browserfailover/caddy-browser-failover/internal/caddybin"
)

// The cost of the shared state (state redis) per connect: the same
// one-provider route with and without `state redis`, both in one Caddy
// process of their own, against a redis-server started here on a free
// 127.0.0.1 port and stopped at the end. Each attempt through the state
// route takes a lease in Redis (one script call) and gives it back when the
// session ends (another, off the connect path).

// Keys of stateBench's series.
const (
	noState   = "no state"
	withState = "state redis"
)

// stateBench measures one Caddy process serving /state (state redis) and
// / (no state) side by side. A nil *stateBench with a skip reason means the
// rows are skipped.
type stateBench struct {
	urls      map[string]string // series key → URL
	redisAddr string
	version   string // redis-server's version

	p50, p99, hs map[string][]float64
	sessions     int // sessions opened through the state route
}

// startStateBench starts redis-server and a Caddy with both routes; the
// processes go to *procs, which the caller stops. skip is non-empty when
// redis-server is not installed.
func startStateBench(bin, dir, echo string, procs *[]*exec.Cmd) (b *stateBench, skip string, err error) {
	rbin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, "redis-server not found (scripts/redis-setup.sh installs it)", nil
	}
	rdir := filepath.Join(dir, "redis")
	if err := os.Mkdir(rdir, 0o755); err != nil {
		return nil, "", err
	}
	raddr := caddybin.FreeAddr()
	_, port, _ := strings.Cut(raddr, ":")
	rs := exec.Command(rbin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", rdir, "--daemonize", "no", "--loglevel", "warning")
	rs.Dir = rdir
	logf, _ := os.Create(filepath.Join(dir, "redis.log"))
	rs.Stdout, rs.Stderr = logf, logf
	if err := rs.Start(); err != nil {
		return nil, "", fmt.Errorf("start redis-server: %w", err)
	}
	*procs = append(*procs, rs)
	if err := caddybin.WaitListening(raddr); err != nil {
		return nil, "", fmt.Errorf("redis-server: %w (log: %s)", err, filepath.Join(dir, "redis.log"))
	}

	addr, admin := caddybin.FreeAddr(), caddybin.FreeAddr()
	// Distinct provider names: a provider's state is process-wide by name.
	conf := fmt.Sprintf(`{
	admin %s
}
http://%s {
	handle /state* {
		browser_failover {
			provider echo-s ws://%s/
			state redis %s {
				node bench
			}
		}
	}
	handle {
		browser_failover {
			provider echo ws://%s/
		}
	}
}
`, admin, addr, echo, raddr, echo)
	c, err := startCaddy(bin, dir, "bf-state", conf)
	if err != nil {
		return nil, "", err
	}
	*procs = append(*procs, c)
	if err := caddybin.WaitListening(addr); err != nil {
		return nil, "", err
	}
	b = &stateBench{
		urls:      map[string]string{noState: "ws://" + addr + "/", withState: "ws://" + addr + "/state"},
		redisAddr: raddr,
		p50:       map[string][]float64{},
		p99:       map[string][]float64{},
		hs:        map[string][]float64{},
	}
	b.version = b.redisInfo("server", "redis_version")
	return b, "", nil
}

// round measures both routes once: n sequential connects each, interleaved
// 50 at a time, then handshakes/s at concurrency 4. The route that goes
// first alternates from round to round.
func (b *stateBench) round(r, n, hsN int) {
	keys := []string{noState, withState}
	if r%2 == 1 {
		keys[0], keys[1] = keys[1], keys[0]
	}
	urls := []string{b.urls[keys[0]], b.urls[keys[1]]}
	for i, d := range connectInterleaved(urls, n) {
		if len(d) == 0 {
			b.p50[keys[i]] = append(b.p50[keys[i]], math.NaN())
			b.p99[keys[i]] = append(b.p99[keys[i]], math.NaN())
			continue
		}
		b.p50[keys[i]] = append(b.p50[keys[i]], ms(percentile(d, 0.5)))
		b.p99[keys[i]] = append(b.p99[keys[i]], ms(percentile(d, 0.99)))
	}
	for _, k := range keys {
		b.hs[k] = append(b.hs[k], handshakes(b.urls[k], hsN, 4))
	}
	b.sessions += n + connectWarmup + hsN
}

// print writes the rows: medians over the rounds, the difference and the
// ratio state redis / no state.
func (b *stateBench) print(n int) {
	fmt.Printf("\nshared state cost: one provider without and with `state redis` (redis-server %s on %s, node bench), one Caddy process; connect time over %d sequential connects\n",
		b.version, b.redisAddr, n)
	fmt.Printf("%-48s %14s %14s %12s %10s\n", "metric (median)", noState, withState, "difference", "ratio")
	rows := []struct {
		title string
		s     map[string][]float64
		prec  int
	}{
		{"connect time p50, one provider (ms)", b.p50, 3},
		{"connect time p99, one provider (ms)", b.p99, 3},
		{"WebSocket handshakes/s, concurrency 4", b.hs, 1},
	}
	for _, row := range rows {
		without, with := median(row.s[noState]), median(row.s[withState])
		fmt.Printf("%-48s %14s %14s %12s %10s\n", row.title,
			strconv.FormatFloat(without, 'f', row.prec, 64), strconv.FormatFloat(with, 'f', row.prec, 64),
			fmt.Sprintf("%+.*f", row.prec, with-without), ratio(with, without))
	}
	// Each session through the state route makes two script calls (take
	// the lease, give it back); fewer means the store was not used and
	// the route fell back to local limits (on_unavailable local).
	calls := 0
	for _, cmd := range []string{"cmdstat_evalsha", "cmdstat_eval"} {
		calls += statCalls(b.redisInfo("commandstats", cmd))
	}
	fmt.Printf("redis script calls: %d for %d sessions through state redis\n", calls, b.sessions)
	if calls < b.sessions {
		fmt.Fprintln(os.Stderr, "compare: fewer Redis script calls than sessions: the state route did not always reach Redis (see bf-state.log)")
	}
}

// redisInfo returns field of an INFO section ("" if unknown).
func (b *stateBench) redisInfo(section, field string) string {
	rdb := redis.NewClient(&redis.Options{Addr: b.redisAddr})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := rdb.Info(ctx, section).Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// statCalls reads calls=N from a commandstats value.
func statCalls(v string) int {
	for _, kv := range strings.Split(v, ",") {
		if s, ok := strings.CutPrefix(kv, "calls="); ok {
			n, _ := strconv.Atoi(s)
			return n
		}
	}
	return 0
}

// connectWarmup is the number of unmeasured connects per URL before
// connectInterleaved measures: they open the pooled connections (to the
// provider, to Redis) and load the scripts.
const connectWarmup = 20

// connectInterleaved times n sequential connects per URL, visiting the URLs
// in turn, 50 connects at a time, after a warm-up.
func connectInterleaved(urls []string, n int) [][]time.Duration {
	one := func(url string) (time.Duration, bool) {
		start := time.Now()
		c, err := dial(url)
		if err != nil {
			fmt.Fprintln(os.Stderr, "connect:", err)
			return 0, false
		}
		d := time.Since(start)
		c.CloseNow()
		return d, true
	}
	for _, u := range urls {
		for i := 0; i < connectWarmup; i++ {
			one(u)
		}
	}
	const batch = 50
	out := make([][]time.Duration, len(urls))
	for done := 0; done < n; done += batch {
		for i, u := range urls {
			for j := 0; j < batch && done+j < n; j++ {
				if d, ok := one(u); ok {
					out[i] = append(out[i], d)
				}
			}
		}
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
