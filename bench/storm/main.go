// Command storm is a connect storm: many clients connecting at the same
// moment to a few providers that each take a bounded number of sessions,
// as at a CI fleet's cold start. It runs the storm through browser_failover
// (each provider with max_concurrent, a wait queue in front) and through
// Caddy's own reverse_proxy (no queue: least_conn alone, then with its
// own way of waiting, unhealthy_request_count and lb_try_duration), each
// target in a Caddy process of its own built from the same binary, and
// prints for each: how every client fared, p50/p99 connect time, the CPU
// the proxy's process spent per client, and the top of browser_failover's
// CPU profile over the storm.
//
//	go run ./bench/storm [-clients 2000] [-providers 4] [-max 100] [-hold 500ms] [-rounds 1]
//
// A provider answers 429 to an upgrade beyond its cap, as a hosted browser
// provider does. Every client gives up after the queue timeout and a
// margin, so the storm ends by itself.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
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
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/caddybin"
	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
)

var (
	clients      = flag.Int("clients", 2000, "clients connecting at once")
	providers    = flag.Int("providers", 4, "providers")
	maxConc      = flag.Int("max", 100, "sessions each provider takes (max_concurrent, and the provider's own cap)")
	holdFor      = flag.Duration("hold", 500*time.Millisecond, "how long each served client keeps its session")
	queueTimeout = flag.Duration("queue-timeout", 30*time.Second, "browser_failover's queue timeout (reverse_proxy's lb_try_duration)")
	rounds       = flag.Int("rounds", 1, "storms per target; medians are printed")
	top          = flag.Int("top", 15, "lines of the CPU profile printed (0: none)")
	cpuProfile   = flag.String("cpuprofile", "", "keep browser_failover's CPU profile of the last storm in this file")
	caddyBin     = flag.String("caddy", "", "Caddy binary with browser_failover (default: build ./cmd/caddy)")
	provMode     = flag.String("provide", "", "internal: run as the providers, answering on this control address")
	provCap      = flag.Int("cap", 100, "internal: each provider's cap")
	provCount    = flag.Int("count", 4, "internal: how many providers")
)

func main() {
	flag.Parse()
	caddybin.RaiseFileLimit()
	if *provMode != "" {
		runProviders(*provMode, *provCount, *provCap)
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "storm:", err)
		os.Exit(1)
	}
}

// target is one proxy the storm goes through.
type target struct {
	name string
	url  string
	cmd  *exec.Cmd
	// admin is the Caddy admin address, for the CPU profile ("" for none).
	admin string
}

func run() error {
	tmp, bin, err := caddybin.Workdir("bf-storm", *caddyBin)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var procs []*exec.Cmd
	defer func() { caddybin.KillAll(procs) }()

	// The providers run in a process of their own, so that the proxies'
	// CPU figures are theirs alone; it tells their addresses and their
	// refusals on a control address.
	control := caddybin.FreeAddr()
	self, _ := os.Executable()
	prov := exec.Command(self, "-provide", control, "-cap", strconv.Itoa(*maxConc), "-count", strconv.Itoa(*providers))
	prov.Stderr = os.Stderr
	if err := prov.Start(); err != nil {
		return err
	}
	procs = append(procs, prov)
	if err := caddybin.WaitListening(control); err != nil {
		return err
	}
	controlURL = "http://" + control
	addrs, err := providerAddrs()
	if err != nil {
		return err
	}

	var bfProviders, upstreams strings.Builder
	for i, a := range addrs {
		fmt.Fprintf(&bfProviders, "\t\tprovider p%d ws://%s/ {\n\t\t\tmax_concurrent %d\n\t\t}\n", i+1, a, *maxConc)
		fmt.Fprintf(&upstreams, " %s", a)
	}
	qsize := *clients
	confs := []struct{ name, body string }{
		{"browser_failover", fmt.Sprintf("\tbrowser_failover {\n%s\t\tqueue {\n\t\t\tsize %d\n\t\t\ttimeout %s\n\t\t}\n\t}\n",
			bfProviders.String(), qsize, *queueTimeout)},
		{"reverse_proxy", fmt.Sprintf("\treverse_proxy%s {\n\t\tlb_policy least_conn\n\t}\n", upstreams.String())},
		{"reverse_proxy, waiting", fmt.Sprintf("\treverse_proxy%s {\n\t\tlb_policy least_conn\n\t\tunhealthy_request_count %d\n\t\tlb_try_duration %s\n\t\tlb_try_interval 250ms\n\t}\n",
			upstreams.String(), *maxConc, *queueTimeout)},
	}
	var targets []target
	for i, c := range confs {
		addr, admin := caddybin.FreeAddr(), caddybin.FreeAddr()
		conf := fmt.Sprintf("{\n\tadmin %s\n}\nhttp://%s {\n%s}\n", admin, addr, c.body)
		cmd, err := caddybin.StartCaddy(bin, tmp, fmt.Sprintf("t%d", i), conf, nil)
		if err != nil {
			return err
		}
		procs = append(procs, cmd)
		if err := caddybin.WaitListening(addr); err != nil {
			return fmt.Errorf("%s: %w (log in %s)", c.name, err, tmp)
		}
		targets = append(targets, target{name: c.name, url: "ws://" + addr + "/", cmd: cmd, admin: admin})
	}

	fmt.Printf("machine: %d CPUs, %s/%s, %s\n", runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())
	fmt.Printf("storm: %d clients at once, %d providers taking %d sessions each (%d in all), each session held %s; queue timeout %s; rounds %d\n\n",
		*clients, *providers, *maxConc, *providers**maxConc, *holdFor, *queueTimeout, *rounds)

	results := map[string][]outcome{}
	profFile := filepath.Join(tmp, "storm-cpu.pprof")
	if *cpuProfile != "" {
		profFile = *cpuProfile
	}
	for r := 0; r < *rounds; r++ {
		for _, t := range targets {
			profile := ""
			if t.name == "browser_failover" && r == *rounds-1 {
				profile = profFile
			}
			o := storm(t, profile)
			results[t.name] = append(results[t.name], o)
			time.Sleep(2 * time.Second) // let the providers see every session end
		}
	}

	fmt.Printf("%-24s %8s %8s %22s %10s %10s %10s %12s %10s\n", "target (median)", "served", "refused", "answers", "p50 ms", "p99 ms", "last ms", "CPU ms/client", "wall s")
	for _, t := range targets {
		os := results[t.name]
		fmt.Printf("%-24s %8.0f %8.0f %22s %10.1f %10.1f %10.1f %12.3f %10.2f\n", t.name,
			med(os, func(o outcome) float64 { return float64(o.served) }),
			med(os, func(o outcome) float64 { return float64(o.refused()) }),
			os[len(os)-1].answers(),
			med(os, func(o outcome) float64 { return o.p50 }),
			med(os, func(o outcome) float64 { return o.p99 }),
			med(os, func(o outcome) float64 { return o.last }),
			med(os, func(o outcome) float64 { return o.cpuPerClient }),
			med(os, func(o outcome) float64 { return o.wall }))
	}
	bf := results["browser_failover"]
	last := bf[len(bf)-1]
	fmt.Printf("\nbrowser_failover: every client served or answered within the queue timeout: %v (latest answer %.1f ms, timeout %s); answers other than 101 and 503: %d; provider 429s seen by the providers: %d\n",
		last.withinTimeout, last.last, *queueTimeout, last.unexpected, last.providerRefused)
	for _, t := range targets[1:] {
		o := results[t.name][len(results[t.name])-1]
		fmt.Printf("%s: provider 429s seen by the providers: %d\n", t.name, o.providerRefused)
	}
	if *top > 0 {
		for _, sort := range []string{"-flat", "-cum"} {
			fmt.Printf("\nbrowser_failover's CPU profile over the last storm (go tool pprof -top %s %s):\n", sort, profFile)
			out, err := exec.Command("go", "tool", "pprof", "-top", sort, "-nodecount", strconv.Itoa(*top), bin, profFile).CombinedOutput()
			if err != nil {
				fmt.Printf("  pprof: %v\n", err)
			}
			fmt.Print(indent(string(out)))
		}
	}
	return nil
}

// outcome is what one storm through one target came to.
type outcome struct {
	served          int
	codes           map[int]int    // answered with this status instead of 101
	errs            map[string]int // no answer: by kind
	p50, p99, last  float64        // connect times of the served, and the latest answer of any client (ms)
	cpuPerClient    float64        // the proxy's CPU time per client (ms)
	wall            float64        // from the first dial to the last session's end (s)
	withinTimeout   bool           // every client answered within the queue timeout
	unexpected      int            // answers other than 101 and 503, and errors
	providerRefused int64          // 429s the providers answered during the storm
}

func (o outcome) refused() int {
	n := 0
	for _, c := range o.codes {
		n += c
	}
	for _, c := range o.errs {
		n += c
	}
	return n
}

func (o outcome) answers() string {
	var parts []string
	for code, n := range o.codes {
		parts = append(parts, fmt.Sprintf("%d×%d", n, code))
	}
	for kind, n := range o.errs {
		parts = append(parts, fmt.Sprintf("%d×%s", n, kind))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "all 101"
	}
	return strings.Join(parts, " ")
}

// storm has every client connect at once through t, keep its session for
// -hold (one message echoed to show the relay works) and close it.
// With profile set, the target's CPU profile over the storm is written
// there.
func storm(t target, profile string) outcome {
	type result struct {
		connect time.Duration // to the answer, 101 or not
		code    int           // 101, another status, or 0 (no answer)
		err     string
	}
	res := make([]result, *clients)
	refusedBefore := providerRefusals()
	cpuBefore := caddybin.CPUTime(t.cmd.Process.Pid)
	var profDone chan error
	if profile != "" {
		// Long enough for the storm: its waves, and a margin.
		waves := math.Ceil(float64(*clients) / float64(*providers**maxConc))
		secs := int(math.Ceil(waves*holdFor.Seconds())) + 3
		profDone = make(chan error, 1)
		go func() { profDone <- fetchProfile(t.admin, secs, profile) }()
		time.Sleep(100 * time.Millisecond)
	}
	start := make(chan struct{})
	var ready, wg sync.WaitGroup
	for i := range res {
		ready.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ready.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), *queueTimeout+10*time.Second)
			defer cancel()
			t0 := time.Now()
			c, resp, err := websocket.Dial(ctx, t.url, &websocket.DialOptions{CompressionMode: websocket.CompressionDisabled})
			res[i].connect = time.Since(t0)
			if err != nil {
				if resp != nil {
					res[i].code = resp.StatusCode
				} else {
					res[i].err = errKind(err)
				}
				return
			}
			defer c.CloseNow()
			res[i].code = http.StatusSwitchingProtocols
			if err := c.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
				res[i].err = "relay"
				return
			}
			if _, _, err := c.Read(ctx); err != nil {
				res[i].err = "relay"
				return
			}
			time.Sleep(*holdFor)
			c.Close(websocket.StatusNormalClosure, "")
		}()
	}
	ready.Wait()
	began := time.Now()
	close(start)
	wg.Wait()
	wall := time.Since(began)
	o := outcome{codes: map[int]int{}, errs: map[string]int{}, withinTimeout: true, wall: wall.Seconds()}
	o.cpuPerClient = float64((caddybin.CPUTime(t.cmd.Process.Pid) - cpuBefore).Microseconds()) / 1e3 / float64(*clients)
	var served []time.Duration
	for _, r := range res {
		o.last = math.Max(o.last, float64(r.connect.Microseconds())/1e3)
		if r.connect > *queueTimeout+time.Second {
			o.withinTimeout = false
		}
		switch {
		case r.err != "":
			o.errs[r.err]++
			o.unexpected++
		case r.code == http.StatusSwitchingProtocols:
			o.served++
			served = append(served, r.connect)
		default:
			o.codes[r.code]++
			if r.code != http.StatusServiceUnavailable {
				o.unexpected++
			}
		}
	}
	o.p50, o.p99 = pct(served, 0.5), pct(served, 0.99)
	o.providerRefused = providerRefusals() - refusedBefore
	if profDone != nil {
		if err := <-profDone; err != nil {
			fmt.Fprintln(os.Stderr, "cpu profile:", err)
		}
	}
	return o
}

func errKind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case strings.Contains(err.Error(), "connection reset"):
		return "reset"
	case strings.Contains(err.Error(), "EOF"):
		return "eof"
	}
	return "error"
}

func pct(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return math.NaN()
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	i := int(math.Ceil(p*float64(len(d)))) - 1
	return float64(d[max(i, 0)].Microseconds()) / 1e3
}

func med(os []outcome, f func(outcome) float64) float64 {
	v := make([]float64, len(os))
	for i, o := range os {
		v[i] = f(o)
	}
	return caddybin.Median(v)
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

func fetchProfile(admin string, secs int, file string) error {
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, secs))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile: %s", resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.ReadFrom(resp.Body)
	return err
}

// controlURL is where the providers' process tells its providers'
// addresses (/addrs, one a line) and how many upgrades they answered 429
// (/refused).
var controlURL string

func providerAddrs() ([]string, error) {
	resp, err := http.Get(controlURL + "/addrs")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return strings.Fields(string(b)), err
}

func providerRefusals() int64 {
	resp, err := http.Get(controlURL + "/refused")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var n int64
	fmt.Fscan(resp.Body, &n)
	return n
}

// runProviders runs n echo providers each taking at most capN sessions at
// once and answering 429 with Retry-After: 1 beyond (internal/fakes), and
// answers on the control address.
func runProviders(control string, n, capN int) {
	ps := make([]*fakes.Capped, n)
	for i := range ps {
		ps[i] = fakes.NewCapped(fmt.Sprintf("p%d", i+1), nil, capN)
		ps[i].SetRetryAfter("1")
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/addrs", func(w http.ResponseWriter, r *http.Request) {
		for _, p := range ps {
			fmt.Fprintln(w, p.Addr)
		}
	})
	mux.HandleFunc("/refused", func(w http.ResponseWriter, r *http.Request) {
		var sum int64
		for _, p := range ps {
			sum += p.Refused.Load()
		}
		fmt.Fprint(w, sum)
	})
	if err := http.ListenAndServe(control, mux); err != nil {
		fmt.Fprintln(os.Stderr, "providers:", err)
		os.Exit(1)
	}
}
