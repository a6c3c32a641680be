// Package testredis runs throwaway redis-server processes for tests of the
// shared state (package cluster, the multinode tests): each on a free
// 127.0.0.1 port, keeping nothing on disk, stopped when its test ends.
package testredis

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Server is a redis-server child process of one test. It can be stopped
// and started again on the same port; it keeps nothing on disk, so a
// restart comes back empty.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	args []string
	conf string // a sentinel's config file: run as a sentinel

	mu     sync.Mutex
	cmd    *exec.Cmd
	out    *bytes.Buffer
	exited chan struct{}
}

// Start starts a redis-server on a free local port, with extra arguments
// (e.g. "--requirepass", "x"), and stops it when the test ends. Without
// redis-server the test is skipped, except under CI=true where it fails: CI
// installs it (scripts/redis-setup.sh).
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin := Binary(t)
	r := &Server{t: t, bin: bin, dir: t.TempDir(), port: freePort(t), args: extra}
	r.Start()
	t.Cleanup(r.Stop)
	return r
}

// Binary returns the path of redis-server. Without it the test is skipped,
// except under CI=true where it fails.
func Binary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server not found; run scripts/redis-setup.sh")
		}
		t.Skip("redis-server not installed (scripts/redis-setup.sh installs it); skipping shared-state tests")
	}
	return bin
}

// freePort returns a TCP port free on 127.0.0.1 at the time of the call.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Addr is the server's host:port.
func (r *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// Start starts the server (again) and waits until it accepts connections.
func (r *Server) Start() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		r.t.Fatal("redis-server already running")
	}
	args := append([]string{
		"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir,
		"--daemonize", "no", "--loglevel", "warning",
	}, r.args...)
	if r.conf != "" {
		// A sentinel rewrites its config file as it learns.
		args = []string{r.conf, "--sentinel", "--daemonize", "no", "--loglevel", "notice"}
	}
	cmd := exec.Command(r.bin, args...)
	cmd.Dir = r.dir
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		r.t.Fatalf("start redis-server: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", r.Addr(), 200*time.Millisecond)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-exited:
			r.t.Fatalf("redis-server exited at start: %s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			r.t.Fatalf("redis-server not listening after 10s: %s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.cmd, r.out, r.exited = cmd, out, exited
}

// Stop kills the server (as a crash would) and waits for it to exit.
func (r *Server) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.exited
	r.cmd = nil
}

// Pause freezes the server (SIGSTOP): connections stay open, nothing
// answers. Resume (SIGCONT) thaws it; the test's cleanup resumes it too.
func (r *Server) Pause() {
	r.t.Helper()
	r.signal(syscall.SIGSTOP)
	r.t.Cleanup(r.Resume)
}

// Resume thaws a paused server.
func (r *Server) Resume() { r.signal(syscall.SIGCONT) }

func (r *Server) signal(sig syscall.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		_ = r.cmd.Process.Signal(sig)
	}
}
