// Package testgw runs Caddy in-process with a browser_failover handler for
// tests: one HTTP server on a loopback port, the admin API on another, and
// the logs in a file the test can read.
package testgw

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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
	// Storage is the root of Caddy's file storage, private to the test.
	Storage string
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
	dir := t.TempDir()
	g := &Gateway{t: t, Addr: FreePort(t), Admin: FreePort(t), LogPath: filepath.Join(dir, "caddy.log"), Storage: filepath.Join(dir, "storage")}
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
  "storage": {"module": "file_system", "root": %q},
  "logging": {"logs": {"default": {"level": "DEBUG", "encoder": {"format": "json"},
     "writer": {"output": "file", "filename": %q}}}},
  "apps": {"http": {"servers": {"gw": {
     "listen": [%q],
     "automatic_https": {"disable": true},
     "routes": [{"handle": [%s]}]
  }}}}
}`, g.Admin, g.Storage, g.LogPath, g.Addr, handlerJSON))
}

// Reload posts a new config to the admin API's /load, as an operator would.
func (g *Gateway) Reload(handlerJSON string) error {
	return g.Load(g.Config(handlerJSON))
}

// ReloadSame posts a config to /load as Reload does, and has Caddy load
// it even when it is the config running (Cache-Control: must-revalidate),
// as an operator reloads an unchanged Caddyfile whose secrets changed.
func (g *Gateway) ReloadSame(handlerJSON string) error {
	code, body, err := g.adminDo(http.MethodPost, "/load", g.Config(handlerJSON), http.Header{"Cache-Control": {"must-revalidate"}})
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("load: %d %s", code, body)
	}
	return nil
}

// Load posts a whole config to /load and returns the admin API's error.
func (g *Gateway) Load(cfg []byte) error {
	code, body, err := g.AdminDo(http.MethodPost, "/load", cfg)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("load: %d %s", code, body)
	}
	return nil
}

// AdminDo sends one request to the admin API (a JSON body when body is
// not nil) and returns the answer's status and body.
//
// Every load, even a rejected one, replaces Caddy's admin server, and the
// one before shuts down in the background: a connection it had accepted
// or that sat in its accept queue is closed without an answer (EOF or a
// reset). So each try uses a fresh connection, and a try that got no
// answer at all is made again. That is safe for what the tests send:
// reads, drain/undrain/reset, and whole configs to /load.
func (g *Gateway) AdminDo(method, path string, body []byte) (int, []byte, error) {
	return g.adminDo(method, path, body, nil)
}

// adminDo is AdminDo with more header fields.
func (g *Gateway) adminDo(method, path string, body []byte, hdr http.Header) (int, []byte, error) {
	var err error
	for try := range 5 {
		if try > 0 {
			time.Sleep(time.Duration(try) * 50 * time.Millisecond)
		}
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		req, rerr := http.NewRequest(method, "http://"+g.Admin+path, rd)
		if rerr != nil {
			return 0, nil, rerr
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		for k, vs := range hdr {
			req.Header[k] = vs
		}
		req.Close = true
		var resp *http.Response
		resp, err = adminClient.Do(req)
		if err != nil {
			if noAnswer(err) {
				continue
			}
			return 0, nil, err
		}
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if rerr != nil {
			return 0, nil, rerr
		}
		return resp.StatusCode, b, nil
	}
	return 0, nil, fmt.Errorf("%s %s: no answer after 5 tries: %w", method, path, err)
}

var adminClient = &http.Client{Timeout: 60 * time.Second}

// noAnswer tells a connection closed or reset before any answer.
func noAnswer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED)
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
