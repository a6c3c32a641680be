package multinode_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/browserfailover/caddy-browser-failover/internal/caddybin"
)

// caddyPath is the Caddy binary built once per test run by TestMain; empty
// when buildErr says why not.
var (
	caddyPath string
	buildErr  error
)

// TestMain builds ./cmd/caddy into a temporary directory, runs the tests
// and removes the directory. Without redis-server (and CI unset) nothing
// is built: every test skips anyway.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "bf-multinode")
	if err != nil {
		fmt.Fprintln(os.Stderr, "multinode:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if _, err := exec.LookPath("redis-server"); err == nil || os.Getenv("CI") == "true" {
		caddyPath, buildErr = build(dir)
	}
	return m.Run()
}

// build compiles the module's ./cmd/caddy into dir.
func build(dir string) (string, error) {
	root, err := filepath.Abs("..")
	if err != nil {
		return "", err
	}
	return caddybin.Build(root, dir)
}

// caddyBin returns the Caddy binary, failing the test when it could not be
// built.
func caddyBin(t *testing.T) string {
	t.Helper()
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	if caddyPath == "" {
		t.Fatal("the Caddy binary was not built")
	}
	return caddyPath
}
