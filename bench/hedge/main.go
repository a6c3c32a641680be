// Command hedge measures what hedged connects (hedge_after, hedge_max) do to
// the time a client waits for its session when providers' upgrade handshakes
// have a heavy tail, such as cloud browsers' cold starts.
//
//	go run ./bench/hedge [-connects 300] [-rounds 3] [-seed 1] [-quick]
//
// It starts -providers fake providers on 127.0.0.1 and one Caddy process
// with browser_failover (built from ./cmd/caddy) serving two routes side by
// side over the same providers: /off without hedging and /on with hedging.
// Each fake provider waits before it answers a valid 101 and then echoes;
// the wait is drawn once, from a fixed seed, for every pair (connect number,
// provider): most handshakes take 30–80 ms (lognormal), a few percent are
// cold starts (Pareto, capped at -cap). The client sends its connect number
// in a header the gateway forwards, so connect i meets exactly the same
// delays in both configurations: the comparison is paired, and only the
// hedging differs. Connect i is timed from the start of the dial to the
// first echoed message. The two configurations take turns over -rounds
// blocks of connects, at most -conc in flight.
//
// How to read the output:
//
//   - "handshake delay" is the drawn distribution; hedge_after defaults to
//     its -hedge-q quantile (p85), which is printed.
//   - The table gives p50, p90, p99, max and mean connect time per
//     configuration, and the hedged/unhedged ratios: hedging should leave
//     p50 alone (ratio near 1) and cut p99 and max, because a connect is
//     slow only when every attempt in flight is slow.
//   - "model" rows compute the same figures from the delay table alone
//     (unhedged: the first provider's delay; hedged: the earliest of
//     j·hedge_after + delay at provider j+1), so measured − model is the
//     gateway's and the echo's own cost. Shown for strategy priority only.
//   - "hedges" are the gateway's counters from the admin /metrics endpoint
//     (caddy_browser_failover_hedges_{started,won,wasted}_total), checked
//     against the hedges_started / hedges_wasted fields of the "session
//     ended" log entries.
//   - "provider handshakes" is what the fake providers saw: upgrades begun,
//     abandoned by the gateway while the provider was still waiting,
//     answered 101, and 101s later closed with 1000 "hedge lost". Begun
//     minus connects is the extra load hedging put on providers; a real
//     cloud browser may bill a cold start even when it is abandoned.
//
// Everything runs on loopback, is bounded in count and time, and stops by
// itself (-timeout).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/caddybin"
)

var (
	nProviders = flag.Int("providers", 3, "fake providers behind the gateway")
	connects   = flag.Int("connects", 300, "connects per configuration")
	rounds     = flag.Int("rounds", 3, "blocks the connects are split into; the configurations alternate which goes first")
	conc       = flag.Int("conc", 4, "connects in flight at once")
	seed       = flag.Uint64("seed", 1, "seed of the handshake delays")
	hedgeMax   = flag.Int("hedge-max", 2, "hedge_max: attempts in flight at once when hedging")
	hedgeAfter = flag.Duration("hedge-after", 0, "hedge_after (0: the -hedge-q quantile of the drawn delays)")
	hedgeQ     = flag.Float64("hedge-q", 0.85, "quantile of the drawn delays used as hedge_after when -hedge-after is 0")
	strategy   = flag.String("strategy", "priority", "strategy: priority or round_robin")
	coldFrac   = flag.Float64("cold", 0.08, "fraction of handshakes that are cold starts")
	capDelay   = flag.Duration("cap", 5*time.Second, "longest handshake delay")
	quick      = flag.Bool("quick", false, "a short run (~20 s): 100 connects per configuration in 2 rounds")
	caddyBin   = flag.String("caddy", "", "Caddy binary with browser_failover (default: build ./cmd/caddy)")
	timeout    = flag.Duration("timeout", 3*time.Minute, "give up after this long")
)

// The delay distribution: warm handshakes are lognormal, cold starts Pareto.
const (
	warmMedian = 50 * time.Millisecond
	warmSigma  = 0.3
	coldMin    = 300 * time.Millisecond
	coldAlpha  = 1.1
)

// connHeader carries "<config>/<connect number>" from the client through the
// gateway to the fake provider.
const connHeader = "X-Bench-Conn"

func main() {
	flag.Parse()
	if *quick {
		setDefault("connects", "100")
		setDefault("rounds", "2")
	}
	if err := check(); err != nil {
		fmt.Fprintln(os.Stderr, "hedge:", err)
		os.Exit(2)
	}
	done := make(chan error, 1)
	go func() { done <- run() }()
	select {
	case err := <-done:
		if err != nil {
			fmt.Fprintln(os.Stderr, "hedge:", err)
			os.Exit(1)
		}
	case <-time.After(*timeout):
		killChildren()
		fmt.Fprintf(os.Stderr, "hedge: gave up after %s\n", *timeout)
		os.Exit(1)
	}
}

// setDefault sets a flag the command line did not set.
func setDefault(name, v string) {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	if !set {
		flag.Set(name, v)
	}
}

func check() error {
	switch {
	case *nProviders < 2:
		return errors.New("-providers: at least 2, or there is nothing to hedge to")
	case *connects < 1 || *rounds < 1 || *conc < 1:
		return errors.New("-connects, -rounds and -conc must be at least 1")
	case *hedgeMax < 2:
		return errors.New("-hedge-max: at least 2")
	case *hedgeQ <= 0 || *hedgeQ >= 1:
		return errors.New("-hedge-q: between 0 and 1")
	case *coldFrac < 0 || *coldFrac > 1:
		return errors.New("-cold: between 0 and 1")
	case *strategy != "priority" && *strategy != "round_robin":
		return errors.New("-strategy: priority or round_robin")
	}
	if *rounds > *connects {
		*rounds = *connects
	}
	return nil
}

// drawDelay draws one handshake delay.
func drawDelay(r *rand.Rand) time.Duration {
	var d float64
	if r.Float64() < *coldFrac {
		u := 1 - r.Float64() // (0, 1]
		d = float64(coldMin) * math.Pow(u, -1/coldAlpha)
	} else {
		d = float64(warmMedian) * math.Exp(warmSigma*r.NormFloat64())
	}
	return min(time.Duration(d), *capDelay)
}

var (
	childMu  sync.Mutex
	children []*exec.Cmd
)

// killChildren ends the processes this command started, by their own ids.
func killChildren() {
	childMu.Lock()
	defer childMu.Unlock()
	for _, c := range children {
		c.Process.Kill()
		c.Wait()
	}
	children = nil
}

func run() error {
	defer killChildren()
	m, n := *connects, *nProviders

	// The delay table: delays[i][p] is provider p's wait for connect i,
	// the same in both configurations.
	rng := rand.New(rand.NewPCG(*seed, 0x9e3779b97f4a7c15))
	delays := make([][]time.Duration, m)
	var all []time.Duration
	for i := range delays {
		delays[i] = make([]time.Duration, n)
		for p := range delays[i] {
			delays[i][p] = drawDelay(rng)
			all = append(all, delays[i][p])
		}
	}
	ha := *hedgeAfter
	haWhy := "set by -hedge-after"
	if ha == 0 {
		ha = percentile(all, *hedgeQ).Round(time.Millisecond)
		haWhy = fmt.Sprintf("p%g of the drawn delays", *hedgeQ*100)
	}

	tmp, bin, err := caddybin.Workdir("bf-hedge", *caddyBin)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	provs := make([]*provider, n)
	for p := range provs {
		pr, err := startProvider(p, delays)
		if err != nil {
			return err
		}
		defer pr.srv.Close()
		provs[p] = pr
	}

	gwAddr, admin := caddybin.FreeAddr(), caddybin.FreeAddr()
	var b strings.Builder
	fmt.Fprintf(&b, "{\n\tadmin %s\n}\nhttp://%s {\n", admin, gwAddr)
	for _, cfg := range []string{"off", "on"} {
		fmt.Fprintf(&b, "\thandle /%s* {\n\t\tbrowser_failover {\n\t\t\tstrategy %s\n", cfg, *strategy)
		if cfg == "on" {
			fmt.Fprintf(&b, "\t\t\thedge_after %s\n\t\t\thedge_max %d\n", ha, *hedgeMax)
		}
		for p, pr := range provs {
			fmt.Fprintf(&b, "\t\t\tprovider %s-p%d ws://%s/ {\n\t\t\t\tpriority %d\n\t\t\t}\n", cfg, p+1, pr.addr, p+1)
		}
		b.WriteString("\t\t}\n\t}\n")
	}
	b.WriteString("}\n")
	logPath := filepath.Join(tmp, "caddy.log")
	if err := startCaddy(bin, tmp, b.String(), logPath); err != nil {
		return err
	}
	if err := caddybin.WaitListening(gwAddr); err != nil {
		return fmt.Errorf("%w (Caddy's log: %s)", err, tail(logPath))
	}
	url := func(cfg string) string { return "ws://" + gwAddr + "/" + cfg }

	// Warm-up: no delay, no hedges; it is left out of every figure.
	for _, cfg := range []string{"off", "on"} {
		for i := 0; i < 2*n; i++ {
			if _, err := connectOnce(url(cfg), "warm/0"); err != nil {
				return fmt.Errorf("warm-up through /%s: %w (Caddy's log: %s)", cfg, err, tail(logPath))
			}
		}
	}
	before, err := scrapeHedges(admin)
	if err != nil {
		return err
	}

	fmt.Printf("\nbrowser_failover: connect time with and without hedged connects, 127.0.0.1 only\n")
	fmt.Printf("machine: %d CPUs, %s/%s, %s\n", runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())
	fmt.Printf("run: seed %d, %d providers, %d connects per configuration in %d rounds (configurations alternate first), %d in flight\n",
		*seed, n, m, *rounds, *conc)
	if *strategy == "priority" {
		fmt.Printf("strategy priority: every connect starts at p1 and hedges go to p2, p3…, so without hedging the others see\n" +
			"  no traffic and every handshake they get is hedging's cost; delays are i.i.d. per (connect, provider), so\n" +
			"  round_robin (-strategy round_robin) would give the same distribution with the cost spread out\n")
	} else {
		fmt.Printf("strategy round_robin: connects start at each provider in turn; delays are i.i.d. per (connect, provider),\n" +
			"  so the distribution is that of priority with the load spread out (no model row: the start provider varies)\n")
	}
	fmt.Printf("handshake delay: %.0f%% lognormal (median %s, σ %.1f), %.0f%% cold start (Pareto from %s, α %.1f), capped at %s\n",
		(1-*coldFrac)*100, warmMedian, warmSigma, *coldFrac*100, coldMin, coldAlpha, *capDelay)
	fmt.Printf("  drawn (%d values, ms): p50 %s, p75 %s, p85 %s, p90 %s, p99 %s, max %s\n", len(all),
		ms(percentile(all, .5)), ms(percentile(all, .75)), ms(percentile(all, .85)), ms(percentile(all, .9)),
		ms(percentile(all, .99)), ms(percentile(all, 1)))
	fmt.Printf("hedging on: hedge_after %s (%s), hedge_max %d\n\n", ha, haWhy, *hedgeMax)

	// The runs: rounds of consecutive connect numbers, each through both
	// configurations, the first one alternating.
	res := map[string][]time.Duration{}
	type roundFig struct{ off, on []time.Duration }
	var perRound []roundFig
	failures := map[string]int{}
	tcp := map[string]int64{} // TCP connections the providers accepted
	tcpNow := func() (t int64) {
		for _, pr := range provs {
			t += pr.tcp.Load()
		}
		return t
	}
	start := time.Now()
	for r := 0; r < *rounds; r++ {
		lo, hi := r*m / *rounds, (r+1)*m / *rounds
		order := []string{"off", "on"}
		if r%2 == 1 {
			order = []string{"on", "off"}
		}
		var rf roundFig
		for _, cfg := range order {
			t0 := tcpNow()
			d, failed := block(url(cfg), cfg, lo, hi)
			tcp[cfg] += tcpNow() - t0
			failures[cfg] += failed
			res[cfg] = append(res[cfg], d...)
			if cfg == "off" {
				rf.off = d
			} else {
				rf.on = d
			}
		}
		perRound = append(perRound, rf)
	}
	elapsed := time.Since(start)

	after, err := scrapeHedges(admin)
	if err != nil {
		return err
	}

	// The table.
	row := func(name string, d []time.Duration) {
		if len(d) == 0 {
			fmt.Printf("%-34s %8s\n", name, "-")
			return
		}
		fmt.Printf("%-34s %8s %8s %8s %8s %8s\n", name, ms(percentile(d, .5)), ms(percentile(d, .9)),
			ms(percentile(d, .99)), ms(percentile(d, 1)), ms(mean(d)))
	}
	fmt.Printf("%-34s %8s %8s %8s %8s %8s\n", "connect time, dial → first echo (ms)", "p50", "p90", "p99", "max", "mean")
	off, on := res["off"], res["on"]
	row("hedging off", off)
	row(fmt.Sprintf("hedging on (after %s, max %d)", ha, *hedgeMax), on)
	fmt.Printf("%-34s %8s %8s %8s %8s %8s\n", "hedged/unhedged",
		ratio(percentile(on, .5), percentile(off, .5)), ratio(percentile(on, .9), percentile(off, .9)),
		ratio(percentile(on, .99), percentile(off, .99)), ratio(percentile(on, 1), percentile(off, 1)),
		ratio(mean(on), mean(off)))
	if *strategy == "priority" {
		modOff, modOn := model(delays, ha, *hedgeMax, n)
		row("model off (delay table only)", modOff)
		row("model on (delay table only)", modOn)
	}
	for _, cfg := range []string{"off", "on"} {
		if failures[cfg] > 0 {
			fmt.Printf("WARNING: %d connects failed with hedging %s (left out of the figures)\n", failures[cfg], cfg)
		}
	}
	fmt.Printf("\nper round, p50 / p99 (ms):\n")
	for r, rf := range perRound {
		fmt.Printf("  round %d: off %s / %s, on %s / %s\n", r+1, ms(percentile(rf.off, .5)), ms(percentile(rf.off, .99)),
			ms(percentile(rf.on, .5)), ms(percentile(rf.on, .99)))
	}
	fmt.Printf("wall time of the measured connects: %.1fs\n", elapsed.Seconds())

	// Hedges, from the gateway.
	diff := func(name, cfg string) int {
		return int(after.sum(name, cfg+"-") - before.sum(name, cfg+"-"))
	}
	started, won, wasted := diff("hedges_started_total", "on"), diff("hedges_won_total", "on"), diff("hedges_wasted_total", "on")
	fmt.Printf("\nhedges (gateway /metrics, hedging on): started %d (%.1f%% of %d connects), won %d, wasted %d\n",
		started, pct(started, len(on)), len(on), won, wasted)
	if o := diff("hedges_started_total", "off") + diff("hedges_wasted_total", "off"); o != 0 {
		fmt.Printf("WARNING: the unhedged route counted %d hedge events\n", o)
	}
	ls, lw, ln := sessionLogs(logPath, 2*m-failures["off"]-failures["on"]+4*n)
	fmt.Printf("hedges (\"session ended\" log, hedging on): %d sessions, hedges_started %d, hedges_wasted %d\n", ln, ls, lw)

	// Hedges, from the providers.
	fmt.Printf("\nprovider handshakes   %5s %7s %10s %9s %11s %16s   %s\n", "TCP", "begun", "abandoned", "101 sent", "hedge lost", "extra begun", "begun per provider")
	for _, cfg := range []string{"off", "on"} {
		var t struct{ begun, abandoned, accepted, lost int64 }
		var per []string
		for p, pr := range provs {
			c := pr.get(cfg)
			t.begun += c.begun.Load()
			t.abandoned += c.abandoned.Load()
			t.accepted += c.accepted.Load()
			t.lost += c.lost.Load()
			per = append(per, fmt.Sprintf("p%d %d", p+1, c.begun.Load()))
		}
		done := int64(len(res[cfg]))
		extra := fmt.Sprintf("%d (+%.1f%%)", t.begun-done, pct(int(t.begun-done), int(done)))
		fmt.Printf("  hedging %-3s         %5d %7d %10d %9d %11d %16s   %s\n", cfg, tcp[cfg], t.begun, t.abandoned, t.accepted, t.lost,
			extra, strings.Join(per, ", "))
	}
	fmt.Printf("  TCP: connections the providers accepted; begun: upgrade requests they read (a hedge cancelled before its\n" +
		"  request arrived is in TCP only); abandoned: given up by the gateway while the provider waited\n")
	var unkeyed int64
	for _, pr := range provs {
		unkeyed += pr.unkeyed.Load()
	}
	if unkeyed > 0 {
		fmt.Printf("WARNING: %d handshakes arrived without the %s header (the gateway did not forward it?)\n", unkeyed, connHeader)
	}
	return nil
}

// block runs connects lo..hi-1 through url, at most -conc at once, and
// returns their times and how many failed.
func block(url, cfg string, lo, hi int) ([]time.Duration, int) {
	var (
		mu     sync.Mutex
		out    []time.Duration
		failed int
		next   atomic.Int64
		wg     sync.WaitGroup
	)
	next.Store(int64(lo))
	for range *conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= hi {
					return
				}
				d, err := connectOnce(url, cfg+"/"+strconv.Itoa(i))
				mu.Lock()
				if err != nil {
					failed++
					fmt.Fprintf(os.Stderr, "connect %s/%d: %v\n", cfg, i, err)
				} else {
					out = append(out, d)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out, failed
}

// connectOnce dials url with the connect key, sends one message and waits
// for its echo; it returns the time from the dial to the echo.
func connectOnce(url, key string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	msg := []byte("hello, browser")
	start := time.Now()
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		HTTPHeader:      http.Header{connHeader: {key}},
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		return 0, err
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
		return 0, err
	}
	_, got, err := c.Read(ctx)
	if err != nil {
		return 0, err
	}
	d := time.Since(start)
	if string(got) != string(msg) {
		return 0, fmt.Errorf("echo: got %q", got)
	}
	c.Close(websocket.StatusNormalClosure, "")
	return d, nil
}

// model computes connect times from the delay table alone, for strategy
// priority: unhedged, provider 1's delay; hedged, attempt j (0-based) starts
// at j·hedge_after while nothing has answered, and the first answer wins.
func model(delays [][]time.Duration, ha time.Duration, most, n int) (off, on []time.Duration) {
	for _, row := range delays {
		off = append(off, row[0])
		best := row[0]
		for j := 1; j < min(most, n); j++ {
			at := time.Duration(j) * ha
			if at >= best {
				break
			}
			best = min(best, at+row[j])
		}
		on = append(on, best)
	}
	return off, on
}

// counters are one provider's handshakes for one configuration.
type counters struct {
	begun, abandoned, accepted, lost atomic.Int64
}

// provider is one fake provider.
type provider struct {
	index   int
	addr    string
	srv     *http.Server
	delays  [][]time.Duration
	stats   map[string]*counters // by configuration, fixed at start
	unkeyed atomic.Int64
	tcp     atomic.Int64 // connections accepted
}

func (p *provider) get(cfg string) *counters { return p.stats[cfg] }

func startProvider(index int, delays [][]time.Duration) (*provider, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &provider{index: index, addr: ln.Addr().String(), delays: delays,
		stats: map[string]*counters{"off": {}, "on": {}, "warm": {}}}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second,
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				p.tcp.Add(1)
			}
		}}
	go p.srv.Serve(ln)
	return p, nil
}

// ServeHTTP waits the drawn delay for this connect, then answers 101 and
// echoes. The wait ends early when the gateway gives up the attempt.
func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	cfg, num, _ := strings.Cut(r.Header.Get(connHeader), "/")
	st := p.stats[cfg]
	i, err := strconv.Atoi(num)
	if st == nil || err != nil || i < 0 || (cfg != "warm" && i >= len(p.delays)) {
		p.unkeyed.Add(1)
		http.Error(w, "no "+connHeader+" header", http.StatusBadRequest)
		return
	}
	st.begun.Add(1)
	if cfg != "warm" {
		t := time.NewTimer(p.delays[i][p.index])
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			st.abandoned.Add(1)
			return
		}
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return
	}
	st.accepted.Add(1)
	defer c.CloseNow()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		typ, b, err := c.Read(ctx)
		if err != nil {
			var ce websocket.CloseError
			if errors.As(err, &ce) && ce.Code == websocket.StatusNormalClosure && ce.Reason == "hedge lost" {
				st.lost.Add(1)
			}
			return
		}
		if err := c.Write(ctx, typ, b); err != nil {
			return
		}
	}
}

// hedgeMetrics are the hedge counters read from /metrics: name (without
// the caddy_browser_failover_ prefix) → provider → value.
type hedgeMetrics map[string]map[string]float64

func (h hedgeMetrics) sum(name, providerPrefix string) float64 {
	var s float64
	for p, v := range h[name] {
		if strings.HasPrefix(p, providerPrefix) {
			s += v
		}
	}
	return s
}

// scrapeHedges reads the hedge counters from Caddy's admin /metrics.
func scrapeHedges(admin string) (hedgeMetrics, error) {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("admin /metrics: %s", resp.Status)
	}
	const prefix = "caddy_browser_failover_"
	out := hedgeMetrics{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix+"hedges_") {
			continue
		}
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, prefix), "{")
		if !ok {
			continue
		}
		labels, val, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		prov := ""
		if _, after, ok := strings.Cut(labels, `provider="`); ok {
			prov, _, _ = strings.Cut(after, `"`)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		if out[name] == nil {
			out[name] = map[string]float64{}
		}
		out[name][prov] += v
	}
	return out, sc.Err()
}

// sessionLogs sums hedges_started and hedges_wasted over the "session
// ended" entries of the hedged route's providers, waiting up to 5 s for
// want entries in all (sessions log when they end, just after the client
// closes).
func sessionLogs(path string, want int) (started, wasted, sessions int) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		started, wasted, sessions = 0, 0, 0
		total := 0
		f, err := os.Open(path)
		if err != nil {
			return
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			if !strings.Contains(sc.Text(), `"session ended"`) {
				continue
			}
			var e struct {
				Msg      string `json:"msg"`
				Provider string `json:"provider"`
				Started  int    `json:"hedges_started"`
				Wasted   int    `json:"hedges_wasted"`
			}
			if json.Unmarshal(sc.Bytes(), &e) != nil || e.Msg != "session ended" {
				continue
			}
			total++
			if strings.HasPrefix(e.Provider, "on-") {
				sessions++
				started += e.Started
				wasted += e.Wasted
			}
		}
		f.Close()
		if total >= want || time.Now().After(deadline) {
			// The warm-up's sessions are in the count; they have no
			// hedges.
			sessions -= 2 * *nProviders
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func startCaddy(bin, dir, caddyfile, logPath string) error {
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o644); err != nil {
		return err
	}
	cmd := exec.Command(bin, "run", "--config", path, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return err
	}
	childMu.Lock()
	children = append(children, cmd)
	childMu.Unlock()
	return nil
}

// tail is the end of a log file, for error messages.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// percentile is the nearest-rank p quantile of d (p = 1: the maximum).
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func mean(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	var s time.Duration
	for _, v := range d {
		s += v
	}
	return s / time.Duration(len(d))
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 1, 64) }

func ratio(a, b time.Duration) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", float64(a)/float64(b))
}

func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}
