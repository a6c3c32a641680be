// Package caddybin builds the project's own Caddy binary (./cmd/caddy:
// Caddy with browser_failover) for the benchmarks and tests that run Caddy
// as a process, finds and waits for their local addresses, and starts the
// redis-server a benchmark's shared state runs on.
package caddybin

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Build compiles ./cmd/caddy of the module at root ("" for the current
// folder) into dir and returns the binary's path.
func Build(root, dir string) (string, error) {
	return BuildPackage(root, dir, "./cmd/caddy", "caddy")
}

// Binary is bin, a Caddy binary with browser_failover given by the
// benchmark's -caddy flag, or when that is "" ./cmd/caddy of the current
// module built into dir (saying so, as the build takes a while).
func Binary(bin, dir string) (string, error) {
	if bin != "" {
		return bin, nil
	}
	fmt.Println("building ./cmd/caddy …")
	return Build("", dir)
}

// Workdir makes a temporary folder for a benchmark's run (its name
// starting with prefix) and resolves its Caddy binary there as Binary
// does. The caller removes dir when done; on an error nothing is left.
func Workdir(prefix, bin string) (dir, caddy string, err error) {
	dir, err = os.MkdirTemp("", prefix)
	if err != nil {
		return "", "", err
	}
	if caddy, err = Binary(bin, dir); err != nil {
		os.RemoveAll(dir)
		return "", "", err
	}
	return dir, caddy, nil
}

// BuildPackage compiles the main package pkg of the module at root into
// dir/name and returns the binary's path.
func BuildPackage(root, dir, pkg, name string) (string, error) {
	bin := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin, nil
}

// FreeAddr returns a 127.0.0.1 address nothing listens on right now.
func FreeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// WaitListening waits (up to 10 s) until something accepts connections on
// addr.
func WaitListening(addr string) error {
	for range 200 {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens on %s", addr)
}

// StartRedis starts a redis-server of its own on a free 127.0.0.1 port,
// its files in dir/redis, and returns its address ("" when redis-server is
// not installed); stop ends it.
func StartRedis(dir string) (addr string, stop func(), err error) {
	rbin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", func() {}, nil
	}
	addr = FreeAddr()
	_, port, _ := strings.Cut(addr, ":")
	rdir := filepath.Join(dir, "redis")
	if err := os.MkdirAll(rdir, 0o700); err != nil {
		return "", nil, err
	}
	cmd := exec.Command(rbin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", rdir)
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() { cmd.Process.Kill(); cmd.Wait() }
	if err := WaitListening(addr); err != nil {
		stop()
		return "", nil, err
	}
	return addr, stop, nil
}

// Median is the median of v (the upper one of an even count); v is not
// changed.
func Median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}
