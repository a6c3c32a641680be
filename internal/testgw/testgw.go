// Package testgw runs Caddy in-process with a browser_failover handler for
// tests: one HTTP server on a loopback port, the admin API on another, and
// the logs in a file the test can read.
package testgw

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/browserfailover/caddy-browser-failover"
)

// Gateway is a running in-process Caddy.
type Gateway struct {
	t       testing.TB
	Addr    string // host:port of the HTTP server
	Admin   string // host:port of the admin API
	LogPath string
}

// FreePort returns a loopback address nothing listens on (yet).
func FreePort(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Start loads a config whose only route is the given handler JSON (an
// object with "handler":"browser_failover").
func Start(t testing.TB, handlerJSON string) *Gateway {
	t.Helper()
	g := &Gateway{t: t, Addr: FreePort(t), Admin: FreePort(t), LogPath: filepath.Join(t.TempDir(), "caddy.log")}
	if err := caddy.Load(g.Config(handlerJSON), true); err != nil {
		t.Fatalf("loading config: %v", err)
	}
	t.Cleanup(func() { caddy.Stop() })
	return g
}

// Config builds the whole Caddy config around handlerJSON.
func (g *Gateway) Config(handlerJSON string) []byte {
	return []byte(fmt.Sprintf(`{
  "admin": {"listen": %q, "config": {"persist": false}},
  "logging": {"logs": {"default": {"level": "DEBUG", "encoder": {"format": "json"},
     "writer": {"output": "file", "filename": %q}}}},
  "apps": {"http": {"servers": {"gw": {
     "listen": [%q],
     "automatic_https": {"disable": true},
     "routes": [{"handle": [%s]}]
  }}}}
}`, g.Admin, g.LogPath, g.Addr, handlerJSON))
}

// Reload posts a new config to the admin API's /load, as an operator would.
func (g *Gateway) Reload(handlerJSON string) error {
	return g.Load(g.Config(handlerJSON))
}

// Load posts a whole config to /load and returns the admin API's error.
func (g *Gateway) Load(cfg []byte) error {
	req, _ := http.NewRequest(http.MethodPost, "http://"+g.Admin+"/load", bytes.NewReader(cfg))
	req.Header.Set("Content-Type", "application/json")
	// A fresh connection: each load replaces Caddy's admin server, which
	// closes the idle keep-alive connections of the one before, and a POST
	// sent on such a connection fails with EOF (Go retries only idempotent
	// requests on a reused connection).
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("load: %d %s", resp.StatusCode, b)
	}
	return nil
}

// WS is the gateway's ws:// URL for path.
func (g *Gateway) WS(path string) string { return "ws://" + g.Addr + path }

// HTTP is the gateway's http:// URL for path.
func (g *Gateway) HTTP(path string) string { return "http://" + g.Addr + path }

// Logs returns everything logged so far.
func (g *Gateway) Logs() string {
	b, _ := os.ReadFile(g.LogPath)
	return string(b)
}

// LogEntries returns the JSON log entries whose msg is msg.
func (g *Gateway) LogEntries(msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(g.Logs(), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// Eventually polls cond until it holds or the wait runs out.
func Eventually(t testing.TB, wait time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
