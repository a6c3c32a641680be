// Command compare measures browser_failover side by side with a direct
// connection, a minimal raw TCP relay, Caddy's own reverse_proxy (the same
// Caddy binary) and the least a Caddy handler can do per upgrade
// (bench/floor, from the benchmarks' own Caddy binary), on loopback, alternating the targets over several rounds
// and printing medians and ratios. It also measures what the shared state
// (state redis, against a redis-server it starts) costs per connect; -redis=false
// skips that (see state.go).
//
//	go run ./bench/compare [-rounds 3] [-held 2000] [-scale 10000] [-redis=false]
//
// Every load is bounded in count and time and stops by itself.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/caddybin"
)

var (
	rounds    = flag.Int("rounds", 3, "rounds over the targets; medians are printed")
	held      = flag.Int("held", 2000, "idle sessions held for the memory figure")
	scale     = flag.Int("scale", 10000, "sessions of the scale run (0: skip)")
	rttN      = flag.Int("rtt", 2000, "round trips per target and round for the RTT figures")
	tputMsgs  = flag.Int("tput", 200, "1 MiB messages per throughput measurement")
	hsN       = flag.Int("handshakes", 2000, "handshakes per measurement")
	connects  = flag.Int("connects", 300, "sequential connects per connect-time measurement")
	redisOn   = flag.Bool("redis", true, "measure the shared state's cost per connect (needs redis-server)")
	caddyBin  = flag.String("caddy", "", "Caddy binary with browser_failover (default: build ./cmd/caddy)")
	cpuProf   = flag.String("cpuprofile", "", "write a CPU profile of browser_failover's process under -cpuload to this file, then exit")
	cpuLoad   = flag.String("cpuload", "rtt", "the load of -cpuprofile: rtt (256-byte round trips on one session) or handshakes (connect and close, concurrency 4)")
	heapProf  = flag.String("heapprofile", "", "write a heap profile of browser_failover's process holding -held idle sessions to this file, then exit")
	relayMode = flag.String("relay", "", "internal: run as the raw relay listening on this address")
	echoMode  = flag.String("echo", "", "internal: run as the echo server listening on this address")
	relayTo   = flag.String("relay-to", "", "internal: the raw relay's target")
)

func main() {
	flag.Parse()
	if *relayMode != "" {
		runRelay(*relayMode, *relayTo)
		return
	}
	if *echoMode != "" {
		runEcho(*echoMode)
		return
	}
	caddybin.RaiseFileLimit()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

// target is one thing the client connects through.
type target struct {
	name string
	url  string
	pid  int // the process whose RSS is measured (0: none)
}

func run() error {
	tmp, bin, err := caddybin.Workdir("bf-bench", *caddyBin)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	var procs []*exec.Cmd
	defer func() { caddybin.KillAll(procs) }()
	// The echo server and the raw relay run in processes of their own, so
	// each process stays within the open-file limit and the relay's memory
	// can be read on its own.
	self, _ := os.Executable()
	echo := caddybin.FreeAddr()
	echoProc := exec.Command(self, "-echo", echo)
	echoProc.Stderr = os.Stderr
	if err := echoProc.Start(); err != nil {
		return err
	}
	procs = append(procs, echoProc)
	if err := caddybin.WaitListening(echo); err != nil {
		return err
	}

	relayAddr := caddybin.FreeAddr()
	relay := exec.Command(self, "-relay", relayAddr, "-relay-to", echo)
	relay.Stderr = os.Stderr
	if err := relay.Start(); err != nil {
		return err
	}
	procs = append(procs, relay)

	rpAddr, rpAdmin := caddybin.FreeAddr(), caddybin.FreeAddr()
	rp, err := caddybin.StartCaddy(bin, tmp, "rp", fmt.Sprintf("{\n\tadmin %s\n}\nhttp://%s {\n\treverse_proxy %s\n}\n", rpAdmin, rpAddr, echo), nil)
	if err != nil {
		return err
	}
	procs = append(procs, rp)

	// The least a Caddy handler can do per upgrade (bench/floor), from the
	// benchmarks' own Caddy binary.
	fmt.Println("building ./bench/floor/caddy …")
	floorBin, err := caddybin.BuildPackage("", tmp, "./bench/floor/caddy", "caddy-floor")
	if err != nil {
		return err
	}
	floorAddr, floorAdmin := caddybin.FreeAddr(), caddybin.FreeAddr()
	floor, err := caddybin.StartCaddy(floorBin, tmp, "floor", fmt.Sprintf("{\n\tadmin %s\n}\nhttp://%s {\n\tbench_floor %s\n}\n", floorAdmin, floorAddr, echo), nil)
	if err != nil {
		return err
	}
	procs = append(procs, floor)

	bfAddr, bfAdmin := caddybin.FreeAddr(), caddybin.FreeAddr()
	refused := caddybin.FreeAddr()
	failing := startStatus(500)
	bfConf := fmt.Sprintf(`{
	admin %s
}
http://%s {
	handle /refused* {
		browser_failover {
			provider gone ws://%s/ {
				priority 1
			}
			provider echo-r ws://%s/ {
				priority 2
			}
			queue {
				size 0
			}
		}
	}
	handle /cooldown* {
		browser_failover {
			provider failing ws://%s/ {
				priority 1
			}
			provider echo-c ws://%s/ {
				priority 2
			}
			cooldown {
				min_requests 1
				duration 1h
				max_duration 1h
			}
			queue {
				size 0
			}
		}
	}
	handle {
		browser_failover {
			provider echo ws://%s/
		}
	}
}
`, bfAdmin, bfAddr, refused, echo, failing, echo, echo)
	bf, err := caddybin.StartCaddy(bin, tmp, "bf", bfConf, nil)
	if err != nil {
		return err
	}
	procs = append(procs, bf)
	for _, a := range []string{relayAddr, rpAddr, floorAddr, bfAddr} {
		if err := caddybin.WaitListening(a); err != nil {
			return err
		}
	}

	targets := []target{
		{"direct", "ws://" + echo + "/", 0},
		{"raw relay", "ws://" + relayAddr + "/", relay.Process.Pid},
		{"caddy reverse_proxy", "ws://" + rpAddr + "/", rp.Process.Pid},
		{"caddy floor handler", "ws://" + floorAddr + "/", floor.Process.Pid},
		{"browser_failover", "ws://" + bfAddr + "/", bf.Process.Pid},
	}
	if *cpuProf != "" || *heapProf != "" {
		return profile(targets[4].url, bfAdmin)
	}
	var sb *stateBench
	var sbSkip string
	if *redisOn {
		if sb, sbSkip, err = startStateBench(bin, tmp, echo, &procs); err != nil {
			return err
		}
	}
	fmt.Printf("machine: %d CPUs, %s/%s, %s; rounds %d\n\n", runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), *rounds)

	type series map[string][]float64
	res := map[string]series{}
	add := func(metric, tgt string, v float64) {
		if res[metric] == nil {
			res[metric] = series{}
		}
		res[metric][tgt] = append(res[metric][tgt], v)
	}
	// Memory first, while every process is fresh: a Go process keeps
	// freed memory for reuse, so a later delta would read low.
	for _, t := range targets {
		if t.pid != 0 {
			add("idle_session_KiB", t.name, idleMemory(t.url, t.pid, *held))
		}
	}
	// Round trips: one connection per target, the targets interleaved in
	// short batches so that drift on a shared machine hits them alike.
	for i, d := range rttInterleaved(targets, *rounds**rttN) {
		add("rtt_p50_us", targets[i].name, float64(percentile(d, 0.5).Nanoseconds())/1e3)
		add("rtt_p99_us", targets[i].name, float64(percentile(d, 0.99).Nanoseconds())/1e3)
	}
	for r := 0; r < *rounds; r++ {
		for _, t := range targets {
			add("tput_MBps", t.name, throughput(t.url, *tputMsgs))
			for _, conc := range []int{4, 32} {
				cpu0 := caddybin.CPUTime(t.pid)
				add(fmt.Sprintf("handshakes_per_s_%d", conc), t.name, handshakes(t.url, *hsN, conc))
				if t.pid != 0 {
					add(fmt.Sprintf("handshake_cpu_us_%d", conc), t.name, float64((caddybin.CPUTime(t.pid)-cpu0).Microseconds())/float64(*hsN))
				}
			}
		}
		// Added connect time: first provider refused, first provider in
		// cooldown, against the plain one-provider route.
		base := connectTime("ws://"+bfAddr+"/", *connects)
		add("connect_ms", "one provider", base)
		add("connect_ms", "first refused", connectTime("ws://"+bfAddr+"/refused", *connects))
		add("connect_ms", "first in cooldown", connectTime("ws://"+bfAddr+"/cooldown", *connects))
		if sb != nil {
			sb.round(r, *connects, *hsN)
		}
	}

	metrics := []struct{ key, title string }{
		{"rtt_p50_us", "round trip p50, 256 B (µs)"},
		{"rtt_p99_us", "round trip p99, 256 B (µs)"},
		{"tput_MBps", "throughput, 1 MiB messages, 4 in flight (MB/s)"},
		{"handshakes_per_s_4", "WebSocket handshakes/s, concurrency 4"},
		{"handshakes_per_s_32", "WebSocket handshakes/s, concurrency 32"},
		{"handshake_cpu_us_4", "proxy CPU per handshake, concurrency 4 (µs)"},
		{"handshake_cpu_us_32", "proxy CPU per handshake, concurrency 32 (µs)"},
		{"idle_session_KiB", fmt.Sprintf("memory per idle session, %d held, fresh process (KiB)", *held)},
	}
	fmt.Printf("%-48s %9s %10s %14s %13s %17s %9s %9s %9s %11s\n", "metric (median)", "direct", "raw relay", "reverse_proxy", "caddy floor", "browser_failover", "bf/caddy", "bf/relay", "bf/floor", "floor/relay")
	for _, m := range metrics {
		s := res[m.key]
		cad, bfv, raw, fl := median(s["caddy reverse_proxy"]), median(s["browser_failover"]), median(s["raw relay"]), median(s["caddy floor handler"])
		fmt.Printf("%-48s %9s %10s %14s %13s %17s %9s %9s %9s %11s\n", m.title, fmtv(s["direct"]), fmtv(s["raw relay"]), fmtv(s["caddy reverse_proxy"]),
			fmtv(s["caddy floor handler"]), fmtv(s["browser_failover"]), ratio(bfv, cad), ratio(bfv, raw), ratio(bfv, fl), ratio(fl, raw))
	}
	c := res["connect_ms"]
	fmt.Printf("\nconnect time through browser_failover (median ms): one provider %.3f, first refused %.3f (+%.3f), first in cooldown %.3f (+%.3f)\n",
		median(c["one provider"]), median(c["first refused"]), median(c["first refused"])-median(c["one provider"]),
		median(c["first in cooldown"]), median(c["first in cooldown"])-median(c["one provider"]))
	switch {
	case sb != nil:
		sb.print(*connects)
	case sbSkip != "":
		fmt.Printf("\nshared state cost: skipped, %s\n", sbSkip)
	}

	if *scale > 0 {
		n := *scale
		// The gateway holds two sockets per session; stay inside the
		// process's open-file limit.
		if lim := fileLimit(); lim > 0 && 2*n+200 > lim {
			n = (lim - 200) / 2
			fmt.Printf("\nscale run capped at %d sessions by the open-file limit of %d per process\n", n, lim)
		}
		scaleRun("ws://"+bfAddr+"/", bf.Process.Pid, bfAdmin, n)
	}
	return nil
}

func fmtv(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	return strconv.FormatFloat(median(v), 'f', 1, 64)
}

func ratio(a, b float64) string {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "-"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func percentile(d []time.Duration, p float64) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	i := int(math.Ceil(p*float64(len(d)))) - 1
	if i < 0 {
		i = 0
	}
	return d[i]
}

func dial(url string) (*websocket.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{CompressionMode: websocket.CompressionDisabled})
	if err == nil {
		c.SetReadLimit(-1)
	}
	return c, err
}

// rttInterleaved measures n sequential 256-byte round trips per target,
// visiting the targets in turn, 50 round trips at a time, after a warm-up.
func rttInterleaved(targets []target, n int) [][]time.Duration {
	conns := make([]*websocket.Conn, len(targets))
	for i, t := range targets {
		c, err := dial(t.url)
		if err != nil {
			fmt.Fprintln(os.Stderr, "rtt dial:", err)
			return make([][]time.Duration, len(targets))
		}
		defer c.CloseNow()
		conns[i] = c
	}
	msg := make([]byte, 256)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	one := func(c *websocket.Conn) (time.Duration, bool) {
		start := time.Now()
		if err := c.Write(ctx, websocket.MessageBinary, msg); err != nil {
			return 0, false
		}
		if _, _, err := c.Read(ctx); err != nil {
			return 0, false
		}
		return time.Since(start), true
	}
	for _, c := range conns {
		for i := 0; i < 200; i++ {
			one(c)
		}
	}
	const batch = 50
	out := make([][]time.Duration, len(targets))
	for done := 0; done < n; done += batch {
		for i, c := range conns {
			for j := 0; j < batch; j++ {
				if d, ok := one(c); ok {
					out[i] = append(out[i], d)
				}
			}
		}
	}
	return out
}

// throughput sends n 1 MiB messages with up to 4 in flight and returns the
// echoed payload rate in MB/s.
func throughput(url string, n int) float64 {
	c, err := dial(url)
	if err != nil {
		return math.NaN()
	}
	defer c.CloseNow()
	msg := make([]byte, 1<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	inflight := make(chan struct{}, 4)
	start := time.Now()
	errc := make(chan error, 1)
	go func() {
		for i := 0; i < n; i++ {
			inflight <- struct{}{}
			if err := c.Write(ctx, websocket.MessageBinary, msg); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for i := 0; i < n; i++ {
		if _, _, err := c.Read(ctx); err != nil {
			return math.NaN()
		}
		<-inflight
	}
	if err := <-errc; err != nil {
		return math.NaN()
	}
	return float64(n) * float64(len(msg)) / time.Since(start).Seconds() / 1e6
}

// handshakes runs n WebSocket handshakes from conc goroutines.
func handshakes(url string, n, conc int) float64 {
	var left atomic.Int64
	left.Store(int64(n))
	var failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for g := 0; g < conc; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				c, err := dial(url)
				if err != nil {
					failed.Add(1)
					continue
				}
				c.CloseNow()
			}
		}()
	}
	wg.Wait()
	if failed.Load() > 0 {
		fmt.Fprintf(os.Stderr, "%s: %d handshakes failed\n", url, failed.Load())
	}
	return float64(n-int(failed.Load())) / time.Since(start).Seconds()
}

// connectTime is the median handshake time in ms over n sequential connects.
func connectTime(url string, n int) float64 {
	d := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		start := time.Now()
		c, err := dial(url)
		if err != nil {
			fmt.Fprintln(os.Stderr, "connect:", err)
			continue
		}
		d = append(d, time.Since(start))
		c.CloseNow()
	}
	if len(d) == 0 {
		return math.NaN()
	}
	return float64(percentile(d, 0.5).Microseconds()) / 1e3
}

// hold opens n sessions and returns them.
func hold(url string, n int) []*websocket.Conn {
	conns := make([]*websocket.Conn, 0, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := dial(url)
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return conns
}

func closeAll(conns []*websocket.Conn) {
	for _, c := range conns {
		c.CloseNow()
	}
}

// idleMemory is the RSS growth of pid per idle session over n held ones.
func idleMemory(url string, pid, n int) float64 {
	runtime.GC()
	time.Sleep(300 * time.Millisecond)
	before := caddybin.RSS(pid)
	conns := hold(url, n)
	time.Sleep(time.Second)
	after := caddybin.RSS(pid)
	got := len(conns)
	closeAll(conns)
	time.Sleep(500 * time.Millisecond)
	if got == 0 {
		return math.NaN()
	}
	return float64(after-before) / float64(got) / 1024
}

// goroutines reads the goroutine count from Caddy's admin pprof endpoint.
func goroutines(admin string) int {
	resp, err := http.Get("http://" + admin + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b := make([]byte, 256)
	n, _ := io.ReadFull(resp.Body, b)
	line, _, _ := strings.Cut(string(b[:n]), "\n")
	f := strings.Fields(line)
	if len(f) == 0 {
		return -1
	}
	v, _ := strconv.Atoi(f[len(f)-1])
	return v
}

// scaleRun holds n sessions through browser_failover, then closes them.
func scaleRun(url string, pid int, admin string, n int) {
	fmt.Printf("\nscale run: %d concurrent idle sessions through browser_failover\n", n)
	show := func(when string) {
		fmt.Printf("  %-8s RSS %7.1f MiB, goroutines %6d\n", when, float64(caddybin.RSS(pid))/(1<<20), goroutines(admin))
	}
	show("before")
	start := time.Now()
	conns := hold(url, n)
	fmt.Printf("  opened %d sessions in %.1fs\n", len(conns), time.Since(start).Seconds())
	time.Sleep(time.Second)
	show("during")
	closeAll(conns)
	time.Sleep(3 * time.Second)
	show("after")
}

// runEcho is the WebSocket echo server.
func runEcho(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		os.Exit(1)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: websocket.CompressionDisabled})
		if err != nil {
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(-1)
		ctx := context.Background()
		for {
			typ, rd, err := c.Reader(ctx)
			if err != nil {
				return
			}
			wr, err := c.Writer(ctx, typ)
			if err != nil {
				return
			}
			if _, err := io.Copy(wr, rd); err != nil {
				return
			}
			if err := wr.Close(); err != nil {
				return
			}
		}
	})}
	srv.ErrorLog = nil
	srv.Serve(ln)
}

// startStatus runs an HTTP server answering every request with code.
func startStatus(code int) string {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(code) }))
	return ln.Addr().String()
}

// profile fetches pprof profiles from browser_failover's Caddy process
// (its admin endpoint serves /debug/pprof/): CPU under a round-trip load,
// heap while idle sessions are held.
func profile(url, admin string) error {
	fetch := func(path, file string) error {
		resp, err := http.Get("http://" + admin + path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		f, err := os.Create(file)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(f, resp.Body)
		return err
	}
	if *cpuProf != "" && *cpuLoad == "handshakes" {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if c, err := dial(url); err == nil {
						c.CloseNow()
					}
				}
			}()
		}
		err := fetch("/debug/pprof/profile?seconds=10", *cpuProf)
		close(stop)
		wg.Wait()
		if err != nil {
			return err
		}
		fmt.Println("CPU profile under handshakes:", *cpuProf, "(go tool pprof -top", *cpuProf+")")
	} else if *cpuProf != "" {
		stop := make(chan struct{})
		go func() {
			c, err := dial(url)
			if err != nil {
				return
			}
			defer c.CloseNow()
			msg := make([]byte, 256)
			ctx := context.Background()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if c.Write(ctx, websocket.MessageBinary, msg) != nil {
					return
				}
				if _, _, err := c.Read(ctx); err != nil {
					return
				}
			}
		}()
		err := fetch("/debug/pprof/profile?seconds=10", *cpuProf)
		close(stop)
		if err != nil {
			return err
		}
		fmt.Println("CPU profile:", *cpuProf, "(go tool pprof -top", *cpuProf+")")
	}
	if *heapProf != "" {
		before, err := memStats(admin)
		if err != nil {
			return err
		}
		// The heap before, for pprof's -base.
		if err := fetch("/debug/pprof/heap", *heapProf+".base"); err != nil {
			return err
		}
		conns := hold(url, *held)
		defer closeAll(conns)
		time.Sleep(time.Second)
		after, err := memStats(admin)
		if err != nil {
			return err
		}
		if err := fetch("/debug/pprof/heap", *heapProf); err != nil {
			return err
		}
		fmt.Printf("heap profile with %d sessions held: %s, before them: %[2]s.base (go tool pprof -sample_index=inuse_space -base %[2]s.base -top %[2]s)\n", len(conns), *heapProf)
		if n := float64(len(conns)); n > 0 {
			fmt.Printf("per session (runtime.MemStats, after − before): heap in use %.2f KiB, goroutine stacks %.2f KiB, goroutines %.1f\n",
				float64(after.HeapInuse-before.HeapInuse)/n/1024, float64(after.StackInuse-before.StackInuse)/n/1024,
				float64(goroutines(admin)-before.goroutines)/n)
		}
	}
	return nil
}

// memFigures are the parts of runtime.MemStats an idle session weighs on.
type memFigures struct {
	HeapInuse, StackInuse int64
	goroutines            int
}

// memStats reads the Caddy process's memory statistics from its admin
// endpoint's /debug/vars (expvar's "memstats"), after a GC there.
func memStats(admin string) (memFigures, error) {
	// A heap profile with gc=1 runs a collection first.
	if resp, err := http.Get("http://" + admin + "/debug/pprof/heap?gc=1"); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	resp, err := http.Get("http://" + admin + "/debug/vars")
	if err != nil {
		return memFigures{}, err
	}
	defer resp.Body.Close()
	var v struct {
		Memstats memFigures `json:"memstats"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return memFigures{}, fmt.Errorf("/debug/vars: %w", err)
	}
	v.Memstats.goroutines = goroutines(admin)
	return v.Memstats, nil
}

// fileLimit is this process's open-file limit (children inherit it).
func fileLimit() int {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) != nil {
		return 0
	}
	return int(l.Cur)
}

// runRelay is the raw relay: io.Copy both ways between TCP connections.
func runRelay(listen, to string) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(1)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			u, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				return
			}
			go func() {
				io.Copy(u, c)
				u.(*net.TCPConn).CloseWrite()
			}()
			io.Copy(c, u)
			c.Close()
			u.Close()
		}()
	}
}
