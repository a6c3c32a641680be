// Command probes measures what the gateway's active health checks cost
// against Caddy's own: reverse_proxy's active health checks (health_uri,
// health_interval) and browser_failover's (health_check), for the same
// number of upstreams probed at the same interval, in one run.
//
//	go run ./bench/probes [-upstreams 50,200] [-interval 1s] [-duration 10s] [-rounds 3] [-caddy path]
//
// It builds ./cmd/caddy (or runs -caddy) as two processes: one with a
// reverse_proxy to N fake upstreams, one with a browser_failover of N
// providers at the same upstreams. The upstreams are N listeners on
// 127.0.0.1 in a child process of this program, each answering 200 to GET
// /json/version (like Chrome), so their work is not counted. Both Caddy
// processes start with their health checks off; then, -rounds times, each
// in turn (the order alternating from round to round) is reloaded through
// its admin API with its health checks on, measured once its checks run (an
// interval and a half, and a second, after the reload), and reloaded with
// them off again.
//
// CPU time is each Caddy process's user + system time over the window, the
// sum of its threads' run time (/proc/<pid>/task/*/sched, nanoseconds:
// /proc/<pid>/stat counts in 10 ms ticks, too coarse for these windows);
// at the end it is compared with the getrusage figures of the exited
// processes (wait4). The probes are the GETs the upstreams answered in the
// window, told apart by User-Agent. The CPU per probe subtracts what the
// same process costs idle (measured while the other one was on). It prints
// every window, the medians and the ratio of browser_failover's CPU per
// probe to reverse_proxy's; nothing is judged. Everything is bounded: about
// (-rounds × 2 × (-duration + 1.5 × -interval + 2s) + 5s) per upstream
// count, and a watchdog ends the run (and its processes) past twice that.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
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

	"github.com/browserfailover/caddy-browser-failover/internal/caddybin"
)

// probeUserAgent is the User-Agent of browser_failover's probes; Caddy's
// reverse_proxy sends Go's default.
const probeUserAgent = "Caddy-browser_failover-health-check"

func main() {
	counts := flag.String("upstreams", "50,200", "comma-separated numbers of upstreams, each measured in turn")
	interval := flag.Duration("interval", time.Second, "health check interval of both")
	duration := flag.Duration("duration", 10*time.Second, "each measured window")
	rounds := flag.Int("rounds", 3, "windows of each kind (reverse_proxy, browser_failover), alternating")
	caddyBin := flag.String("caddy", "", "a Caddy binary with browser_failover (default: build ./cmd/caddy)")
	serve := flag.Int("serve", 0, "run the fake upstreams: this many listeners (the child process)")
	flag.Parse()
	if *serve > 0 {
		runServer(*serve)
		return
	}
	var ns []int
	for _, s := range strings.Split(*counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 2000 {
			fail(fmt.Errorf("-upstreams: want numbers in 1..2000, got %q", s))
		}
		ns = append(ns, n)
	}
	if *interval < 100*time.Millisecond || *interval > time.Minute || *duration <= 0 || *duration > 10*time.Minute || *rounds < 1 || *rounds > 20 {
		fail(fmt.Errorf("want an interval in 100ms..1m, a duration of at most 10m and 1..20 rounds"))
	}
	if !cpuSupported {
		fmt.Println("probes: measured on Linux only (it reads /proc)")
		return
	}
	caddybin.RaiseFileLimit()

	perCount := time.Duration(*rounds)*2*(*duration+*interval*3/2+2*time.Second) + 5*time.Second
	watchdog := time.AfterFunc(2*time.Duration(len(ns))*perCount+2*time.Minute, func() {
		fmt.Fprintln(os.Stderr, "probes: the run took too long; stopping")
		children.kill(false)
		os.Exit(1)
	})
	err := run(ns, *interval, *duration, *rounds, *caddyBin)
	watchdog.Stop()
	children.kill(true)
	if err != nil {
		fail(err)
	}
}

// children are the processes started, ended at the end of each upstream
// count, of the run, or by the watchdog.
var children procSet

func run(ns []int, interval, duration time.Duration, rounds int, bin string) error {
	tmp, bin, err := caddybin.Workdir("bf-probes", bin)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	fmt.Printf("active health checks, browser_failover against reverse_proxy: interval %v, %d rounds of %v, Go %s, %d CPUs (%s/%s)\n",
		interval, rounds, duration, runtime.Version(), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
	var results []string
	for _, n := range ns {
		r, err := measureCount(bin, tmp, n, interval, duration, rounds)
		children.kill(true)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	fmt.Println()
	for _, r := range results {
		fmt.Println(r)
	}
	return nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "probes:", err)
	os.Exit(1)
}

// side is one Caddy process and its two configs.
type side struct {
	name    string
	ua      string // "bf" or "rp": whose GETs the upstreams count
	cmd     *exec.Cmd
	admin   string
	on, off string // Caddyfiles with the health checks on and off
	// Per measured window: the CPU time with its checks on, the probes,
	// and the window's length; idle is its CPU rate while the other
	// side's checks were on.
	cpuOn, wallOn []time.Duration
	probes        []int64
	idle          []float64
}

// measureCount runs the rounds for n upstreams and returns the summary line.
func measureCount(bin, dir string, n int, interval, duration time.Duration, rounds int) (string, error) {
	addrs, control, err := startServer(n)
	if err != nil {
		return "", err
	}
	sides := []*side{
		{name: "reverse_proxy", ua: "rp"},
		{name: "browser_failover", ua: "bf"},
	}
	for _, s := range sides {
		s.admin = caddybin.FreeAddr()
		listen := caddybin.FreeAddr()
		s.on, s.off = caddyfile(s.ua, s.admin, listen, addrs, interval, true), caddyfile(s.ua, s.admin, listen, addrs, interval, false)
		if s.cmd, err = caddybin.StartCaddy(bin, dir, fmt.Sprintf("%s-%d", s.ua, n), s.off, childAttr()); err != nil {
			return "", err
		}
		children.add(s.cmd)
		if err := caddybin.WaitListening(listen); err != nil {
			return "", fmt.Errorf("%s: %w (see %s)", s.name, err, filepath.Join(dir, fmt.Sprintf("%s-%d.log", s.ua, n)))
		}
	}
	fmt.Printf("\n%d upstreams, each probed every %v (%d probes due per window)\n", n, interval, int(float64(n)*duration.Seconds()/interval.Seconds()))
	time.Sleep(time.Second) // the processes settle
	for r := range rounds {
		order := []int{0, 1}
		if r%2 == 1 {
			order = []int{1, 0}
		}
		for _, i := range order {
			on, other := sides[i], sides[1-i]
			if err := load(on.admin, on.on); err != nil {
				return "", fmt.Errorf("%s: reloading with health checks: %w", on.name, err)
			}
			time.Sleep(interval*3/2 + time.Second) // every check has started
			c0, o0, t0 := cpuOf(on.cmd.Process.Pid), cpuOf(other.cmd.Process.Pid), time.Now()
			k0, err := count(control)
			if err != nil {
				return "", err
			}
			time.Sleep(duration)
			c1, o1, t1 := cpuOf(on.cmd.Process.Pid), cpuOf(other.cmd.Process.Pid), time.Now()
			k1, err := count(control)
			if err != nil {
				return "", err
			}
			wall := t1.Sub(t0)
			probes := k1[on.ua] - k0[on.ua]
			on.cpuOn, on.wallOn, on.probes = append(on.cpuOn, c1-c0), append(on.wallOn, wall), append(on.probes, probes)
			other.idle = append(other.idle, (o1-o0).Seconds()/wall.Seconds())
			if stray := k1[other.ua] - k0[other.ua]; stray != 0 {
				fmt.Printf("  (%s's checks still ran: %d GETs)\n", other.name, stray)
			}
			due := float64(n) * wall.Seconds() / interval.Seconds()
			fmt.Printf("round %d %-16s %7.3f%% of one core: %6d probes (%.0f%% of those due), %s CPU each (gross); the other, idle: %.3f%%\n",
				r+1, on.name, 100*(c1-c0).Seconds()/wall.Seconds(), probes, 100*float64(probes)/due, perProbe(c1-c0, probes), 100*(o1-o0).Seconds()/wall.Seconds())
			if err := load(on.admin, on.off); err != nil {
				return "", fmt.Errorf("%s: reloading without health checks: %w", on.name, err)
			}
			time.Sleep(time.Second)
		}
	}
	var each [2]float64
	for i, s := range sides {
		idle := median(s.idle)
		var net []float64
		for w := range s.cpuOn {
			cpu := s.cpuOn[w].Seconds() - idle*s.wallOn[w].Seconds()
			net = append(net, cpu/float64(max(s.probes[w], 1)))
		}
		each[i] = median(net)
		fmt.Printf("%-16s idle %.3f%% of one core; CPU per probe (net of idle), median: %s (windows: %s)\n",
			s.name, 100*idle, fmtSeconds(each[i]), fmtList(net))
	}
	// The processes' own getrusage, once they exit, against the sums read
	// while they ran.
	for _, s := range sides {
		before := cpuOf(s.cmd.Process.Pid)
		s.cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { s.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			s.cmd.Process.Kill()
			<-done
		}
		children.remove(s.cmd)
		if ru, ok := rusageOf(s.cmd.ProcessState); ok {
			fmt.Printf("%-16s lifetime CPU: getrusage %v, its threads' run time %v just before it stopped\n", s.name,
				ru.Round(time.Millisecond), before.Round(time.Millisecond))
		}
	}
	return fmt.Sprintf("%4d upstreams, interval %v: CPU per probe reverse_proxy %s, browser_failover %s: %.2f× Caddy's (goal ≤ 1.00×)",
		n, interval, fmtSeconds(each[0]), fmtSeconds(each[1]), each[1]/each[0]), nil
}

// caddyfile is the config of one side: who "rp" or "bf", its health checks
// on or off.
func caddyfile(who, admin, listen string, upstreams []string, interval time.Duration, on bool) string {
	timeout := min(2*time.Second, interval) // a probe's timeout, the same for both
	var b strings.Builder
	fmt.Fprintf(&b, "{\n\tadmin %s\n\tpersist_config off\n}\nhttp://%s {\n", admin, listen)
	switch who {
	case "rp":
		fmt.Fprintf(&b, "\treverse_proxy %s {\n", strings.Join(upstreams, " "))
		if on {
			fmt.Fprintf(&b, "\t\thealth_uri /json/version\n\t\thealth_interval %v\n\t\thealth_timeout %v\n", interval, timeout)
		}
		b.WriteString("\t}\n")
	case "bf":
		b.WriteString("\tbrowser_failover {\n")
		for i, a := range upstreams {
			fmt.Fprintf(&b, "\t\tprovider u%d http://%s\n", i, a)
		}
		if on {
			fmt.Fprintf(&b, "\t\thealth_check {\n\t\t\turi /json/version\n\t\t\tinterval %v\n\t\t\ttimeout %v\n\t\t}\n", interval, timeout)
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// load replaces a Caddy process's config through its admin API.
func load(admin, caddyfile string) error {
	req, _ := http.NewRequest(http.MethodPost, "http://"+admin+"/load", strings.NewReader(caddyfile))
	req.Header.Set("Content-Type", "text/caddyfile")
	c := http.Client{Timeout: 30 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("POST /load: %d %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	return nil
}

// procSet is a set of child processes.
type procSet struct {
	mu   sync.Mutex
	cmds []*exec.Cmd
	// pipes are kept open while the children run (a pipe dropped would be
	// closed by the garbage collector).
	pipes []io.Closer
}

func (p *procSet) add(c *exec.Cmd) {
	p.mu.Lock()
	p.cmds = append(p.cmds, c)
	p.mu.Unlock()
}

func (p *procSet) keep(c io.Closer) {
	p.mu.Lock()
	p.pipes = append(p.pipes, c)
	p.mu.Unlock()
}

// remove forgets c, which has exited and been waited for.
func (p *procSet) remove(c *exec.Cmd) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, x := range p.cmds {
		if x == c {
			p.cmds = append(p.cmds[:i], p.cmds[i+1:]...)
			return
		}
	}
}

// kill ends the processes of the set, and waits for them with wait.
func (p *procSet) kill(wait bool) {
	p.mu.Lock()
	cmds, pipes := p.cmds, p.pipes
	p.cmds, p.pipes = nil, nil
	p.mu.Unlock()
	for _, c := range pipes {
		c.Close()
	}
	for _, c := range cmds {
		c.Process.Kill()
		if wait {
			c.Wait()
		}
	}
}

// startServer runs this program with -serve n and returns the upstreams'
// addresses and the address answering /count.
func startServer(n int) (addrs []string, control string, err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, "", err
	}
	cmd := exec.Command(self, "-serve", strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = childAttr()
	stdin, err := cmd.StdinPipe() // closed when this process ends
	if err != nil {
		return nil, "", err
	}
	children.keep(stdin)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	children.add(cmd)
	line, err := bufio.NewReader(out).ReadString('\n')
	fields := strings.Fields(line)
	if err != nil || len(fields) != n+2 || fields[0] != "ADDRS" {
		return nil, "", fmt.Errorf("the upstreams' process said %.100q (%v)", line, err)
	}
	return fields[2:], fields[1], nil
}

// runServer is the child: n listeners answering every GET like Chrome's
// /json/version, and /count on another one with the GETs answered so far,
// by User-Agent. It ends when its stdin closes (the parent went away).
func runServer(n int) {
	var bf, rp atomic.Int64
	body := []byte(`{"Browser":"HeadlessChrome/fake","Protocol-Version":"1.3","webSocketDebuggerUrl":"ws://127.0.0.1/devtools/browser/x"}`)
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.UserAgent() == probeUserAgent {
			bf.Add(1)
		} else {
			rp.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	})}
	ctl := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%d %d\n", bf.Load(), rp.Load())
	})}
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Fprintln(os.Stderr, "upstreams:", err)
			os.Exit(1)
		}
		return ln
	}
	c := listen()
	go ctl.Serve(c)
	line := []string{"ADDRS", c.Addr().String()}
	for range n {
		ln := listen()
		go up.Serve(ln)
		line = append(line, ln.Addr().String())
	}
	fmt.Println(strings.Join(line, " "))
	io.Copy(io.Discard, os.Stdin)
}

// count asks the upstreams how many GETs they answered, by whom.
func count(control string) (map[string]int64, error) {
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + control + "/count")
	if err != nil {
		return nil, fmt.Errorf("count: %w", err)
	}
	defer resp.Body.Close()
	var bf, rp int64
	if _, err := fmt.Fscan(resp.Body, &bf, &rp); err != nil {
		return nil, fmt.Errorf("count: %w", err)
	}
	return map[string]int64{"bf": bf, "rp": rp}, nil
}

func perProbe(cpu time.Duration, probes int64) string {
	return fmtSeconds(cpu.Seconds() / float64(max(probes, 1)))
}

func fmtSeconds(s float64) string { return fmt.Sprintf("%.1fµs", s*1e6) }

func fmtList(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmtSeconds(x)
	}
	return strings.Join(parts, " ")
}

// median of xs (0 when empty).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	}
	n := len(s)
	return (s[n/2-1] + s[n/2]) / 2
}
