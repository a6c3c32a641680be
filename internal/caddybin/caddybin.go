// Package caddybin builds the project's own Caddy binary (./cmd/caddy:
// Caddy with browser_failover) for the benchmarks and tests that run Caddy
// as a process.
package caddybin

import (
	"fmt"
	"os/exec"
	"path/filepath"
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
