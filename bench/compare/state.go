package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/browserfailover/caddy-browser-failover/internal/caddybin"
)

// The cost of the shared state (state redis) per connect: the same
// one-provider route with and without `state redis`, both in one Caddy
// process of their own, against a redis-server started here on a free
// 127.0.0.1 port and stopped at the end. Through the state route the
// provider is unlimited: its lease is only counted, written in the
// background with others, and the connect waits for no round trip; through
// the capped route (max_concurrent, far above what the benchmark opens)
// each connect takes its lease in one script call, which also gives back
// the node's releases queued meanwhile. Releases are written in the
// background, many in one call.

// Keys of stateBench's series: no state, one Redis server, a master
// behind Redis Sentinel, a Redis Cluster.
const (
	noState   = "no state"
	withState = "state redis"
	capped    = "capped"
	sentinel  = "sentinel"
	clusterHA = "cluster"
)

// stateBench measures one Caddy process serving /state (state redis) and
// / (no state) side by side. A nil *stateBench with a skip reason means the
// rows are skipped.
type stateBench struct {
	urls      map[string]string // series key → URL
	order     []string          // the series measured, noState first
	redisAddr string
	version   string // redis-server's version
	// haSkip says why the Sentinel and Cluster routes are not measured
	// ("" when they are).
	haSkip string

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

	haRoutes, haSkip, err := startHA(rbin, dir, echo, procs)
	if err != nil {
		return nil, "", err
	}
	addr, admin := caddybin.FreeAddr(), caddybin.FreeAddr()
	// Distinct provider names: a provider's state is process-wide by name.
	conf := fmt.Sprintf(`{
	admin %[1]s
}
http://%[2]s {
	handle /state* {
		browser_failover {
			provider echo-s ws://%[3]s/
			state redis %[4]s {
				node bench
			}
		}
	}
	handle /capped* {
		browser_failover {
			provider echo-m ws://%[3]s/ {
				max_concurrent 100000
			}
			state redis %[4]s {
				node bench
			}
		}
	}
%[5]s
	handle {
		browser_failover {
			provider echo ws://%[3]s/
		}
	}
}
`, admin, addr, echo, raddr, haRoutes)
	c, err := caddybin.StartCaddy(bin, dir, "bf-state", conf, nil)
	if err != nil {
		return nil, "", err
	}
	*procs = append(*procs, c)
	if err := caddybin.WaitListening(addr); err != nil {
		return nil, "", err
	}
	b = &stateBench{
		urls:      map[string]string{noState: "ws://" + addr + "/", withState: "ws://" + addr + "/state", capped: "ws://" + addr + "/capped"},
		order:     []string{noState, withState, capped},
		haSkip:    haSkip,
		redisAddr: raddr,
		p50:       map[string][]float64{},
		p99:       map[string][]float64{},
		hs:        map[string][]float64{},
	}
	if haSkip == "" {
		b.urls[sentinel] = "ws://" + addr + "/sentinel"
		b.urls[clusterHA] = "ws://" + addr + "/cluster"
		b.order = append(b.order, sentinel, clusterHA)
	}
	b.version = b.redisInfo("server", "redis_version")
	return b, "", nil
}

// startRedis starts one redis-server on a free port with extra arguments
// (a sentinel: the config file then --sentinel) and returns its address.
func startRedis(rbin, dir, name string, procs *[]*exec.Cmd, extra ...string) (string, error) {
	rdir := filepath.Join(dir, name)
	if err := os.Mkdir(rdir, 0o755); err != nil {
		return "", err
	}
	addr := caddybin.FreeAddr()
	_, port, _ := strings.Cut(addr, ":")
	args := []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", rdir, "--daemonize", "no", "--loglevel", "warning"}
	if len(extra) > 0 && extra[0] == "sentinel" {
		conf := filepath.Join(rdir, "sentinel.conf")
		lines := append([]string{"port " + port, "bind 127.0.0.1", "dir " + rdir}, extra[1:]...)
		if err := os.WriteFile(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			return "", err
		}
		args = []string{conf, "--sentinel", "--daemonize", "no", "--loglevel", "warning"}
	} else {
		args = append(args, extra...)
	}
	cmd := exec.Command(rbin, args...)
	cmd.Dir = rdir
	logf, _ := os.Create(filepath.Join(dir, name+".log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start %s: %w", name, err)
	}
	*procs = append(*procs, cmd)
	if err := caddybin.WaitListening(addr); err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	return addr, nil
}

// startHA starts a Sentinel setup (a master, a replica, three sentinels)
// and a three-master Redis Cluster, and returns the Caddyfile routes
// /sentinel and /cluster using them; skip is non-empty when redis-cli is
// missing.
func startHA(rbin, dir, echo string, procs *[]*exec.Cmd) (routes, skip string, err error) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return "", "redis-cli not found", nil
	}
	master, err := startRedis(rbin, dir, "sentinel-master", procs)
	if err != nil {
		return "", "", err
	}
	mhost, mport, _ := strings.Cut(master, ":")
	if _, err := startRedis(rbin, dir, "sentinel-replica", procs, "--replicaof", mhost, mport); err != nil {
		return "", "", err
	}
	var sentinels []string
	for i := range 3 {
		a, err := startRedis(rbin, dir, fmt.Sprintf("sentinel-%d", i+1), procs, "sentinel",
			"sentinel monitor bench "+mhost+" "+mport+" 2", "sentinel down-after-milliseconds bench 1000")
		if err != nil {
			return "", "", err
		}
		sentinels = append(sentinels, a)
	}
	var nodes []string
	for i := range 3 {
		a, err := startRedis(rbin, dir, fmt.Sprintf("cluster-%d", i+1), procs,
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
		if err != nil {
			return "", "", err
		}
		nodes = append(nodes, a)
	}
	args := append([]string{"--cluster", "create"}, nodes...)
	if out, err := exec.Command(cli, append(args, "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("redis-cli --cluster create: %w: %s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range nodes {
		for {
			out, _ := exec.Command(cli, "-u", "redis://"+n, "CLUSTER", "INFO").Output()
			if strings.Contains(string(out), "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				return "", "", fmt.Errorf("cluster not ok after 30s")
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	routes = fmt.Sprintf(`	handle /sentinel* {
		browser_failover {
			provider echo-sn ws://%s/
			state redis {
				sentinel bench %s
				node bench
			}
		}
	}
	handle /cluster* {
		browser_failover {
			provider echo-c ws://%s/
			state redis {
				cluster %s
				node bench
			}
		}
	}`, echo, strings.Join(sentinels, " "), echo, strings.Join(nodes, " "))
	return routes, "", nil
}

// round measures both routes once: n sequential connects each, interleaved
// 50 at a time, then handshakes/s at concurrency 4. The route that goes
// first alternates from round to round.
func (b *stateBench) round(r, n, hsN int) {
	keys := slices.Clone(b.order)
	if r%2 == 1 {
		slices.Reverse(keys)
	}
	urls := make([]string, len(keys))
	for i, k := range keys {
		urls[i] = b.urls[k]
	}
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
	b.sessions += 2 * (n + connectWarmup + hsN) // the two routes of the one server
}

// print writes the rows: medians over the rounds, and for each state
// route the difference from no state and the ratio to it.
func (b *stateBench) print(n int) {
	fmt.Printf("\nshared state cost: one provider without and with `state redis` (redis-server %s on %s, node bench), one Caddy process; connect time over %d sequential connects\n",
		b.version, b.redisAddr, n)
	fmt.Printf("  %s: unlimited provider (its lease written in the background); %s: max_concurrent 100000 (one script call per connect)\n", withState, capped)
	fmt.Printf("%-40s", "metric (median)")
	for _, k := range b.order {
		fmt.Printf(" %12s", k)
	}
	for _, k := range b.order[1:] {
		fmt.Printf(" %20s", k+" − / ÷ no state")
	}
	fmt.Println()
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
		fmt.Printf("%-40s", row.title)
		for _, k := range b.order {
			fmt.Printf(" %12s", strconv.FormatFloat(median(row.s[k]), 'f', row.prec, 64))
		}
		without := median(row.s[noState])
		for _, k := range b.order[1:] {
			with := median(row.s[k])
			fmt.Printf(" %20s", fmt.Sprintf("%+.*f / %s", row.prec, with-without, ratio(with, without)))
		}
		fmt.Println()
	}
	// Leases are written and given back many to a script call; none at
	// all means the store was not used and the routes fell back to local
	// limits (on_unavailable local).
	calls := 0
	for _, cmd := range []string{"cmdstat_evalsha", "cmdstat_eval"} {
		calls += statCalls(b.redisInfo("commandstats", cmd))
	}
	if b.haSkip != "" {
		fmt.Printf("sentinel and cluster: skipped, %s\n", b.haSkip)
	}
	fmt.Printf("redis script calls on the one server: %d for %d sessions through its two routes (%.2f a session)\n", calls, b.sessions, float64(calls)/float64(max(b.sessions, 1)))
	if calls == 0 {
		fmt.Fprintln(os.Stderr, "compare: no Redis script call: the state routes did not reach Redis (see bf-state.log)")
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
