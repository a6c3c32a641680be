// Package caddybin builds the project's own Caddy binary (./cmd/caddy:
// Caddy with browser_failover) for the benchmarks and tests that run Caddy
// as a process, and finds and waits for their local addresses.
package caddybin

import (
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"time"
)

// Build compiles ./cmd/caddy of the module at root ("" for the current
// folder) into dir and returns the binary's path.
func Build(root, dir string) (string, error) {
	bin := filepath.Join(dir, "caddy")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/caddy")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/caddy: %v\n%s", err, out)
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
