// Command probes measures what active health checks cost the gateway: the
// CPU time of a process running Caddy with browser_failover in front of
// many providers, each probed every interval, against a fake HTTP server
// on 127.0.0.1 in a child process (so the server's own work is not
// counted).
//
//	go run ./bench/probes [-providers 1000] [-interval 1s] [-duration 6s] [-rounds 3]
//
// The process loads a config of -providers providers (http://<server>/p<i>,
// so each provider is its own probe target, on its own kept connection)
// and first measures it idle with no health check (the baseline). Then,
// -rounds times, it measures side by side:
//
//   - the floor: the same GETs, at the same times, sent by a bare loop in
//     the same process, on connections of its own: plain write, poll and
//     read calls, nothing else (Linux only). It is what the kernel's work
//     for those GETs costs on this machine;
//   - the probes: the config reloaded with `health_check { interval
//     <interval> }` on every provider, measured once every probe loop has
//     started (an interval and a half), then reloaded without.
//
// CPU time is the process's user + system time from
// getrusage(RUSAGE_SELF); the GETs counted are the requests the server
// answered in the same window. The server being on loopback, the kernel's
// work of delivering each request to it (and of waking it) is counted in
// this process's system time too, as it would not be with providers on
// other machines; the floor shows how much that is.
//
// It prints every window, the medians, the probes' cost as a multiple of
// the floor, and whether the median cost with probes stays under -budget
// percent of one core (exit status 1 when it does not). Everything is
// bounded: the run lasts about -baseline + -rounds × (2 × -duration +
// 1.5 × -interval + 2s) and stops by itself.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/browserfailover/caddy-browser-failover"
	"github.com/browserfailover/caddy-browser-failover/pool"
)

func main() {
	providers := flag.Int("providers", 1000, "providers, each probed every -interval")
	interval := flag.Duration("interval", time.Second, "health_check interval")
	duration := flag.Duration("duration", 6*time.Second, "each measured window")
	rounds := flag.Int("rounds", 3, "windows of each kind (floor, probes), side by side")
	baseline := flag.Duration("baseline", 5*time.Second, "measured time with health checks off")
	budget := flag.Float64("budget", 2, "the most CPU the probes may cost, in percent of one core")
	serve := flag.Bool("serve", false, "run the fake provider server (the child process)")
	withFloor := flag.Bool("floor", true, "measure the floor side by side with the probes")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the last measured window with health checks on to this file")
	flag.Parse()
	if *serve {
		runServer()
		return
	}
	if *providers < 1 || *providers > 5000 || *interval <= 0 || *duration <= 0 || *duration > 10*time.Minute || *rounds < 1 || *rounds > 20 {
		fmt.Fprintln(os.Stderr, "probes: want 1..5000 providers, a positive interval, a duration of at most 10m and 1..20 rounds")
		os.Exit(2)
	}

	server, stopServer, err := startServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, "probes:", err)
		os.Exit(1)
	}
	defer stopServer()

	listen := freeAddr()
	if err := caddy.Load(config(listen, server, *providers, 0), true); err != nil {
		fmt.Fprintln(os.Stderr, "probes: loading the config:", err)
		os.Exit(1)
	}
	defer caddy.Stop()

	fmt.Printf("browser_failover health checks: %d providers, interval %v, Go %s, %d CPUs (%s/%s), %d rounds of %v\n",
		*providers, *interval, runtime.Version(), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, *rounds, *duration)
	time.Sleep(time.Second) // the load settles
	base := measure(server, *baseline)
	fmt.Printf("health checks off: %6.3f%% of one core over %v (%d requests at the server)\n", base.pct(), *baseline, base.probes)

	var fl *floorLoop
	if *withFloor {
		if fl, err = newFloor(server, *providers, *interval); err != nil {
			fmt.Fprintln(os.Stderr, "probes: the floor:", err)
			os.Exit(1)
		}
		if fl == nil {
			fmt.Println("floor: measured on Linux only")
		} else {
			defer fl.close()
		}
	}
	var profile *os.File
	if *cpuprofile != "" {
		if profile, err = os.Create(*cpuprofile); err != nil {
			fmt.Fprintln(os.Stderr, "probes:", err)
			os.Exit(1)
		}
		defer profile.Close()
	}
	want := float64(*providers) * duration.Seconds() / interval.Seconds()
	var floors, ons []float64
	fewest := 1.0
	for r := range *rounds {
		if fl != nil {
			s := fl.run(server, *duration)
			floors = append(floors, s.pct())
			fmt.Printf("round %d floor:     %6.3f%% of one core (user %.3f%%, system %.3f%%): %d GETs, %v CPU each\n",
				r+1, s.pct(), 100*s.user.Seconds()/s.wall.Seconds(), 100*s.sys.Seconds()/s.wall.Seconds(), s.probes, s.each())
		}
		if err := caddy.Load(config(listen, server, *providers, *interval), true); err != nil {
			fmt.Fprintln(os.Stderr, "probes: reloading with health checks:", err)
			os.Exit(1)
		}
		// The first probes of the loops are spread over one interval.
		time.Sleep(*interval + *interval/2)
		probed := 0
		for _, p := range pool.All() {
			if p.Probed() {
				probed++
			}
		}
		last := r == *rounds-1
		if profile != nil && last {
			pprof.StartCPUProfile(profile) // the last window with probes
		}
		on := measure(server, *duration)
		if profile != nil && last {
			pprof.StopCPUProfile()
		}
		ons = append(ons, on.pct())
		fewest = min(fewest, float64(on.probes)/want)
		fmt.Printf("round %d probes:    %6.3f%% of one core (user %.3f%%, system %.3f%%): %d probes (%.1f%% of the %d due), %v CPU each, %d probe loops, %d goroutines\n",
			r+1, on.pct(), 100*on.user.Seconds()/on.wall.Seconds(), 100*on.sys.Seconds()/on.wall.Seconds(),
			on.probes, 100*float64(on.probes)/want, int(want), on.each(), probed, runtime.NumGoroutine())
		if err := caddy.Load(config(listen, server, *providers, 0), true); err != nil {
			fmt.Fprintln(os.Stderr, "probes: reloading without health checks:", err)
			os.Exit(1)
		}
		time.Sleep(time.Second)
	}
	cost := median(ons)
	fmt.Printf("median: probes %.3f%% of one core", cost)
	if len(floors) > 0 {
		fmt.Printf(", floor %.3f%%: the probes cost %.2f× the floor", median(floors), cost/median(floors))
	}
	fmt.Printf("\ncost of the probes: %.3f%% of one core, the median (budget %.1f%%): ", cost, *budget)
	switch {
	case fewest < 0.9:
		fmt.Println("FAIL (too few probes: the loops fell behind)")
		os.Exit(1)
	case cost >= *budget:
		fmt.Println("FAIL")
		os.Exit(1)
	default:
		fmt.Println("ok")
	}
}

// median of xs (not empty).
func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// config is a Caddy config with one browser_failover handler of n
// providers at server; a non-zero interval probes each of them.
func config(listen, server string, n int, interval time.Duration) []byte {
	type prov struct {
		Name        string         `json:"name"`
		URL         string         `json:"url"`
		HealthCheck map[string]any `json:"health_check,omitempty"`
	}
	ps := make([]prov, n)
	for i := range ps {
		ps[i] = prov{Name: "bench-probe-" + strconv.Itoa(i), URL: "http://" + server + "/p" + strconv.Itoa(i)}
	}
	h := map[string]any{"handler": "browser_failover", "providers": ps}
	if interval > 0 {
		h["health_check"] = map[string]any{"interval": interval.String()}
	}
	cfg := map[string]any{
		"admin":   map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "INFO", "writer": map[string]any{"output": "discard"}}}},
		"apps": map[string]any{"http": map[string]any{"servers": map[string]any{"gw": map[string]any{
			"listen":          []string{listen},
			"automatic_https": map[string]any{"disable": true},
			"routes":          []any{map[string]any{"handle": []any{h}}},
		}}}},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		panic(err)
	}
	return b
}

// sample is one measured window.
type sample struct {
	wall, cpu, user, sys time.Duration
	probes               int64
}

func (s sample) pct() float64 { return 100 * s.cpu.Seconds() / s.wall.Seconds() }

// each is the CPU time per GET.
func (s sample) each() time.Duration {
	return (s.cpu / time.Duration(max(s.probes, 1))).Round(100 * time.Nanosecond)
}

// measure takes the process's CPU time and the server's request count over
// d.
func measure(server string, d time.Duration) sample {
	u0, s0 := cpuTime()
	n0 := count(server)
	t0 := time.Now()
	time.Sleep(d)
	u1, s1 := cpuTime()
	n1, t1 := count(server), time.Now()
	return sample{wall: t1.Sub(t0), cpu: u1 - u0 + s1 - s0, user: u1 - u0, sys: s1 - s0, probes: n1 - n0}
}

// cpuTime is the process's user and system time so far.
func cpuTime() (user, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

// count asks the server how many requests it answered.
func count(server string) int64 {
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + server + "/count")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		panic(fmt.Sprintf("count: %q", b))
	}
	return n
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startServer runs this program with -serve as a child process and returns
// its address; stop ends it.
func startServer() (addr string, stop func(), err error) {
	cmd := exec.Command(os.Args[0], "-serve")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
		}
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "ADDR ")
	if err != nil || !ok {
		stop()
		return "", nil, fmt.Errorf("the server child said %q (%v)", line, err)
	}
	return addr, stop, nil
}

// runServer is the child: a fake provider answering every GET like
// Chrome's /json/version, and /count with the requests answered so far.
// It ends when its stdin closes (the parent went away).
func runServer() {
	var n atomic.Int64
	body := []byte(`{"Browser":"HeadlessChrome/fake","Protocol-Version":"1.3","webSocketDebuggerUrl":"ws://127.0.0.1/devtools/browser/x"}`)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/count" {
			fmt.Fprintln(w, n.Load())
			return
		}
		n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("ADDR " + ln.Addr().String())
	go srv.Serve(ln)
	io.Copy(io.Discard, os.Stdin)
}
