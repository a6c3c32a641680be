// Package e2e drives the browser_failover gateway with real browsers and real
// automation clients: headless Chromium and Firefox processes as providers, a
// Playwright launchServer, and Puppeteer (over CDP and WebDriver BiDi),
// Playwright and chromedp as clients.
//
// The tests need /usr/bin/chromium (or $E2E_CHROMIUM), node and the npm
// packages of this folder, and for the BiDi tests /usr/bin/firefox-esr (or
// $E2E_FIREFOX) (run ./setup.sh once). Without them the tests skip, except
// when CI=true: then a missing piece is a failure.
//
// github.com/chromedp/chromedp is imported by the tests of this package only
// (the gateway itself never depends on it): it is one of the three clients
// the gateway must serve.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ChromiumPath is the browser the tests start ($E2E_CHROMIUM overrides).
func ChromiumPath() string {
	if p := os.Getenv("E2E_CHROMIUM"); p != "" {
		return p
	}
	return "/usr/bin/chromium"
}

// dir is this package's folder: go test runs with it as working directory.
func dir(t testing.TB) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}

// Require skips the test when a piece of the browser suite is missing, with
// the command that installs it; under CI=true it fails instead.
func Require(t testing.TB, node bool) {
	t.Helper()
	var missing []string
	if _, err := os.Stat(ChromiumPath()); err != nil {
		missing = append(missing, ChromiumPath())
	}
	if node {
		if _, err := exec.LookPath("node"); err != nil {
			missing = append(missing, "node")
		}
		for _, m := range []string{"puppeteer-core", "playwright-core"} {
			if _, err := os.Stat(filepath.Join(dir(t), "node_modules", m, "package.json")); err != nil {
				missing = append(missing, "e2e/node_modules/"+m)
			}
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("browser e2e suite: missing %s; run e2e/setup.sh", strings.Join(missing, ", "))
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " (CI=true: not skipping)")
	}
	t.Skip(msg)
}

// proc is a child process in its own process group, so that killing it
// takes its children along (renderers, a Playwright server's browser).
type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has been waited for
	err  error         // Wait's error, once done is closed

	killOnce sync.Once
	mu       sync.Mutex
	buf      bytes.Buffer // stderr, and stdout unless it goes elsewhere
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.buf.Write(b)
}

// startProc starts cmd; its stdout goes to stdout (nil: with stderr into
// the process's log). The process group is killed at cleanup.
func startProc(t testing.TB, cmd *exec.Cmd, stdout io.Writer) *proc {
	t.Helper()
	p := &proc{cmd: cmd, done: make(chan struct{})}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = p
	cmd.Stdout = stdout
	if stdout == nil {
		cmd.Stdout = p
	}
	// Grandchildren may hold the output pipes a little longer.
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", cmd.Path, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(p.kill)
	return p
}

// stop asks the process to end (SIGTERM, so that a Playwright server
// closes its browser and removes its temporary profile), and kills the
// whole group after grace.
func (p *proc) stop(grace time.Duration) {
	if !p.exited() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
		}
	}
	p.kill()
}

// kill ends the whole process group at once (once: the group id is not
// signaled again later, when it could have been reused) and waits for its
// leader.
func (p *proc) kill() {
	p.killOnce.Do(func() { syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) })
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Output is the tail of what the process wrote (for error messages).
func (p *proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.buf.String()
	if len(s) > 6000 {
		s = "…" + s[len(s)-6000:]
	}
	return s
}

// Chromium is a headless Chromium serving DevTools on a loopback port.
type Chromium struct {
	// Addr is 127.0.0.1:port of its DevTools endpoint.
	Addr string
	// WSPath is the browser target's path (/devtools/browser/<id>).
	WSPath string
	p      *proc
}

// HTTPURL is the http:// URL of the DevTools endpoint (for discovery).
func (c *Chromium) HTTPURL() string { return "http://" + c.Addr }

// WSURL is the browser's webSocketDebuggerUrl.
func (c *Chromium) WSURL() string { return "ws://" + c.Addr + c.WSPath }

// Kill ends the browser at once (SIGKILL to its whole process group).
func (c *Chromium) Kill() { c.p.kill() }

// Output is the tail of the browser's stderr.
func (c *Chromium) Output() string { return c.p.Output() }

// StartChromium starts a headless Chromium on a free port (Chromium picks
// it: --remote-debugging-port=0 and the DevToolsActivePort file), waits
// until /json/version answers, and kills it at cleanup.
func StartChromium(t testing.TB) *Chromium {
	t.Helper()
	return startChromium(t, "0")
}

// StartChromiumAt starts a headless Chromium serving DevTools on
// 127.0.0.1:port, as a browser restarted where it ran before; like
// StartChromium otherwise.
func StartChromiumAt(t testing.TB, port string) *Chromium {
	t.Helper()
	return startChromium(t, port)
}

// StartChromiumWith starts a headless Chromium as StartChromium does, with
// more command-line flags (--host-resolver-rules=…).
func StartChromiumWith(t testing.TB, flags ...string) *Chromium {
	t.Helper()
	return startChromium(t, "0", flags...)
}

func startChromium(t testing.TB, port string, flags ...string) *Chromium {
	t.Helper()
	profile, err := os.MkdirTemp("", "e2e-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs after the kill; the browser's last
	// children may still be writing for a moment.
	t.Cleanup(func() {
		for i := 0; i < 20 && os.RemoveAll(profile) != nil; i++ {
			time.Sleep(50 * time.Millisecond)
		}
	})
	args := append([]string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--no-default-browser-check", "--mute-audio",
		"--user-data-dir=" + profile,
		"--remote-debugging-address=127.0.0.1", "--remote-debugging-port=" + port,
	}, flags...)
	cmd := exec.Command(ChromiumPath(), append(args, "about:blank")...)
	p := startProc(t, cmd, nil)
	c := &Chromium{p: p}
	deadline := time.Now().Add(30 * time.Second)
	if port != "0" {
		// A given port: Chromium writes no DevToolsActivePort then.
		c.Addr = net.JoinHostPort("127.0.0.1", port)
	}
	for c.Addr == "" {
		if b, err := os.ReadFile(filepath.Join(profile, "DevToolsActivePort")); err == nil {
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if len(lines) == 2 {
				if port, err := strconv.Atoi(lines[0]); err == nil && port > 0 {
					c.Addr = net.JoinHostPort("127.0.0.1", lines[0])
					c.WSPath = strings.TrimSpace(lines[1])
					break
				}
			}
		}
		if p.exited() {
			t.Fatalf("chromium exited (%v) before serving DevTools:\n%s", p.err, p.Output())
		}
		if time.Now().After(deadline) {
			t.Fatalf("chromium did not serve DevTools within 30s:\n%s", p.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for {
		v, err := JSONVersion(c.HTTPURL())
		if err == nil && v.WebSocketDebuggerURL != "" {
			if u, err := url.Parse(v.WebSocketDebuggerURL); err == nil && c.WSPath == "" {
				c.WSPath = u.Path
			}
			break
		}
		if p.exited() {
			t.Fatalf("chromium exited (%v) before serving DevTools:\n%s", p.err, p.Output())
		}
		if time.Now().After(deadline) {
			t.Fatalf("chromium's /json/version did not answer within 30s (%v):\n%s", err, p.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return c
}

// StartChromiums starts n browsers concurrently.
func StartChromiums(t testing.TB, n int) []*Chromium {
	t.Helper()
	out := make([]*Chromium, n)
	var wg sync.WaitGroup
	errs := make([]string, n)
	for i := range out {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ft := &fatalCatcher{TB: t}
			defer func() {
				if r := recover(); r != nil && r != errFatal {
					panic(r)
				}
				errs[i] = ft.msg
			}()
			out[i] = StartChromium(ft)
		}(i)
	}
	wg.Wait()
	for _, e := range errs {
		if e != "" {
			t.Fatal(e)
		}
	}
	return out
}

// fatalCatcher turns Fatal in a helper goroutine into a recorded message
// (t.Fatal must run on the test's goroutine).
type fatalCatcher struct {
	testing.TB
	msg string
}

var errFatal = new(int)

func (f *fatalCatcher) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(errFatal)
}

func (f *fatalCatcher) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	panic(errFatal)
}

func (f *fatalCatcher) Helper() {}

// Version is the part of a /json/version answer the tests read.
type Version struct {
	Browser              string `json:"Browser"`
	ProtocolVersion      string `json:"Protocol-Version"`
	WebSocketDebuggerURL string `json:"webSocketDebuggerUrl"`
}

// JSONVersion GETs base + "/json/version".
func JSONVersion(base string) (Version, error) {
	var v Version
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(strings.TrimSuffix(base, "/") + "/json/version")
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return v, fmt.Errorf("/json/version: %d %s", resp.StatusCode, b)
	}
	err = json.NewDecoder(resp.Body).Decode(&v)
	return v, err
}

// nodeTimeout bounds one client script.
const nodeTimeout = 150 * time.Second

// nodeCmd prepares node js/<script> args… with env E2E_CHROMIUM set.
func nodeCmd(ctx context.Context, t testing.TB, script string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "node", append([]string{filepath.Join(dir(t), "js", script)}, args...)...)
	cmd.Dir = dir(t)
	cmd.Env = append(os.Environ(), "E2E_CHROMIUM="+ChromiumPath())
	return cmd
}

// RunNode runs node e2e/js/<script> with args (the gateway URL among them)
// and returns its stdout; a non-zero exit or a timeout fails the test with
// everything the script wrote.
func RunNode(t testing.TB, script string, args ...string) string {
	t.Helper()
	stdout, stderr, err := runNode(t, script, args...)
	if err != nil {
		t.Fatalf("node %s %s: %v\nstdout:\n%s\nstderr:\n%s", script, strings.Join(args, " "), err, stdout, stderr)
	}
	return stdout
}

// RunNodeFail runs node e2e/js/<script> with args, which must fail (a
// non-zero exit within nodeTimeout), and returns everything it wrote.
func RunNodeFail(t testing.TB, script string, args ...string) string {
	t.Helper()
	stdout, stderr, err := runNode(t, script, args...)
	if err == nil {
		t.Fatalf("node %s %s succeeded, want a failure\n%s", script, strings.Join(args, " "), stdout)
	}
	return stdout + stderr
}

// runNode runs node e2e/js/<script> args…, killing it and its children
// after nodeTimeout (which fails the test), and returns what it wrote and
// how it exited.
func runNode(t testing.TB, script string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), nodeTimeout)
	defer cancel()
	cmd := nodeCmd(ctx, t, script, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	start := time.Now()
	err = cmd.Run()
	t.Logf("node %s %s: %v\n%s", script, strings.Join(args, " "), time.Since(start).Round(time.Millisecond), strings.TrimSpace(out.String()))
	if ctx.Err() != nil {
		t.Fatalf("node %s timed out after %v\nstdout:\n%s\nstderr:\n%s", script, nodeTimeout, out.String(), errOut.String())
	}
	return out.String(), errOut.String(), err
}

// NodeProc is a long-running node script whose stdout is read line by line.
type NodeProc struct {
	p     *proc
	lines chan string
}

// StartNode starts node e2e/js/<script> args… and kills it (with its
// children) at cleanup. Read its output with Expect.
func StartNode(t testing.TB, script string, args ...string) *NodeProc {
	t.Helper()
	pr, pw := io.Pipe()
	p := startProc(t, nodeCmd(context.Background(), t, script, args...), pw)
	// Runs before startProc's kill: a polite stop first.
	t.Cleanup(func() { p.stop(5 * time.Second) })
	return nodeLines(p, pr, pw)
}

// nodeLines is the NodeProc of p, whose stdout goes to pw: its lines are
// read from pr, and pw closes when p ends.
func nodeLines(p *proc, pr *io.PipeReader, pw *io.PipeWriter) *NodeProc {
	n := &NodeProc{p: p, lines: make(chan string, 100)}
	go func() {
		<-p.done
		pw.Close()
	}()
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			n.lines <- sc.Text()
		}
		close(n.lines)
		io.Copy(io.Discard, pr)
	}()
	return n
}

// Expect waits for a stdout line starting with prefix and returns it; every
// line read is logged. The script's end or the timeout fails the test.
func (n *NodeProc) Expect(t testing.TB, prefix string, wait time.Duration) string {
	t.Helper()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-n.lines:
			if !ok {
				<-n.p.done
				t.Fatalf("node script ended (%v) before printing %q; stderr:\n%s", n.p.err, prefix, n.p.Output())
			}
			t.Logf("node: %s", line)
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-timer.C:
			t.Fatalf("node script did not print %q within %v; stderr:\n%s", prefix, wait, n.p.Output())
		}
	}
}

// Wait waits for the script to exit (logging the rest of its output) and
// returns its exit error.
func (n *NodeProc) Wait(t testing.TB, wait time.Duration) error {
	t.Helper()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-n.lines:
			if !ok {
				<-n.p.done
				return n.p.err
			}
			t.Logf("node: %s", line)
		case <-timer.C:
			t.Fatalf("node script did not exit within %v; stderr:\n%s", wait, n.p.Output())
		}
	}
}

// Output is the tail of the script's stderr.
func (n *NodeProc) Output() string { return n.p.Output() }

// PlaywrightServer is a Playwright launchServer (Chromium) run by
// js/pw-server.mjs.
type PlaywrightServer struct {
	// WSEndpoint is ws://127.0.0.1:port/<guid>.
	WSEndpoint string
	n          *NodeProc
}

// Stop ends the server and its browser (SIGTERM, then SIGKILL).
func (s *PlaywrightServer) Stop() { s.n.p.stop(5 * time.Second) }

// StartPlaywrightServer starts a Playwright server for Chromium on a free
// loopback port and returns once it prints its wsEndpoint.
func StartPlaywrightServer(t testing.TB) *PlaywrightServer {
	t.Helper()
	n := StartNode(t, "pw-server.mjs")
	line := n.Expect(t, "WS ", 60*time.Second)
	return &PlaywrightServer{WSEndpoint: strings.TrimPrefix(line, "WS "), n: n}
}
