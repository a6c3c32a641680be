package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BrowserlessToken is the token every browserless server of the tests
// requires, in the query (?token=…) as browserless's clients send it.
const BrowserlessToken = "e2e-browserless-token"

// browserlessPackage is the npm package js/browserless.mjs runs.
const browserlessPackage = "@browserless.io/browserless"

// browserlessSessionTimeout is how long browserless lets a session run
// before it cuts it (its TIMEOUT; its own default is 30s): longer than any
// test holds one.
const browserlessSessionTimeout = 10 * time.Minute

// BrowserlessServer is a real browserless v2 server on a loopback port, run
// by js/browserless.mjs: each session it accepts is a Chromium of its own,
// and it refuses an upgrade over its cap (CONCURRENT running, QUEUED
// waiting) with 429.
type BrowserlessServer struct {
	// URL is its CDP endpoint, ws://127.0.0.1:port/?token=…: a provider's
	// URL as browserless documents it.
	URL string
	// Addr is 127.0.0.1:port.
	Addr string
	// Version is the package's version.
	Version string
	n       *NodeProc
	stdin   *os.File
}

// HTTPURL is the http:// URL of path on the server, with the token.
func (s *BrowserlessServer) HTTPURL(path string) string {
	return "http://" + s.Addr + path + "?token=" + url.QueryEscape(BrowserlessToken)
}

// Stop ends the server and the browsers of its sessions: its stdin closes,
// then SIGTERM, then SIGKILL to its process group.
func (s *BrowserlessServer) Stop() {
	s.stdin.Close()
	select {
	case <-s.n.p.done:
	case <-time.After(10 * time.Second):
	}
	s.n.p.stop(5 * time.Second)
}

// Output is the tail of the server's log.
func (s *BrowserlessServer) Output() string { return s.n.Output() }

// BrowserlessPressure is browserless's GET /pressure answer, the
// "pressure" object.
type BrowserlessPressure struct {
	CPU              *int   `json:"cpu"`    // percent; null when unknown
	Memory           *int   `json:"memory"` // percent; null when unknown
	Date             int64  `json:"date"`   // milliseconds since the epoch
	IsAvailable      bool   `json:"isAvailable"`
	MaxConcurrent    int    `json:"maxConcurrent"`
	MaxQueued        int    `json:"maxQueued"`
	Running          int    `json:"running"`
	Queued           int    `json:"queued"`
	RecentlyRejected int    `json:"recentlyRejected"`
	Reason           string `json:"reason"`  // "full", "cpu", "memory" or ""
	Message          string `json:"message"` // "" when available
}

// Pressure GETs /pressure; raw is the body as served.
func (s *BrowserlessServer) Pressure() (p BrowserlessPressure, raw []byte, err error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(s.HTTPURL("/pressure"))
	if err != nil {
		return p, nil, err
	}
	defer resp.Body.Close()
	raw, err = io.ReadAll(resp.Body)
	if err != nil {
		return p, raw, err
	}
	if resp.StatusCode != http.StatusOK {
		return p, raw, fmt.Errorf("/pressure: %d %s", resp.StatusCode, raw)
	}
	var doc struct {
		Pressure *BrowserlessPressure `json:"pressure"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil || doc.Pressure == nil {
		return p, raw, fmt.Errorf("/pressure: not a pressure answer (%v): %s", err, raw)
	}
	return *doc.Pressure, raw, nil
}

// RequireBrowserless skips the test when the browserless provider cannot
// run (Chromium, node or the npm packages missing), as Require does; under
// CI=true it fails instead.
func RequireBrowserless(t testing.TB) {
	t.Helper()
	Require(t, true)
	pkg := filepath.Join(dir(t), "node_modules", filepath.FromSlash(browserlessPackage), "package.json")
	if _, err := os.Stat(pkg); err == nil {
		return
	}
	msg := "browser e2e suite: missing e2e/node_modules/" + browserlessPackage + "; run e2e/setup.sh"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " (CI=true: not skipping)")
	}
	t.Skip(msg)
}

// StartBrowserless starts a browserless server capped at concurrent
// sessions running and queued waiting, and returns its CDP endpoint,
// ws://127.0.0.1:port/?token=… (see StartBrowserlessServer).
func StartBrowserless(t testing.TB, concurrent, queued int) string {
	t.Helper()
	return StartBrowserlessServer(t, concurrent, queued).URL
}

// StartBrowserlessServer starts a browserless server on a free loopback
// port, capped at concurrent sessions running and queued waiting; it
// returns once the server accepts connections, and stops it at cleanup. It
// skips the test as RequireBrowserless does.
//
// Only the cap decides whether it takes a session: its CPU and memory
// thresholds are off (on a shared machine they would make /pressure say
// unavailable at random), and a session runs until its client leaves.
func StartBrowserlessServer(t testing.TB, concurrent, queued int) *BrowserlessServer {
	t.Helper()
	RequireBrowserless(t)
	work, err := os.MkdirTemp("", "e2e-browserless-")
	if err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs after the kill: a browser's last
	// children may still be writing for a moment.
	t.Cleanup(func() {
		for i := 0; i < 20 && os.RemoveAll(work) != nil; i++ {
			time.Sleep(50 * time.Millisecond)
		}
	})
	for _, d := range []string{"data", "downloads"} {
		if err := os.Mkdir(filepath.Join(work, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	_, port, err := net.SplitHostPort(freePort(t))
	if err != nil {
		t.Fatal(err)
	}

	cmd := nodeCmd(context.Background(), t, "browserless.mjs", port)
	cmd.Env = append(cmd.Env,
		"CONCURRENT="+strconv.Itoa(concurrent),
		"QUEUED="+strconv.Itoa(queued),
		"TOKEN="+BrowserlessToken,
		"TIMEOUT="+strconv.FormatInt(browserlessSessionTimeout.Milliseconds(), 10),
		"MAX_CPU_PERCENT=101",
		"MAX_MEMORY_PERCENT=101",
		"DATA_DIR="+filepath.Join(work, "data"),
		"DOWNLOAD_DIR="+filepath.Join(work, "downloads"),
		"METRICS_JSON_PATH="+filepath.Join(work, "metrics.json"),
		// Its log without the per-route trace lines.
		"DEBUG=browserless*,-**:trace,-**:verbose",
	)
	// The script ends when its stdin closes: when this process goes, even
	// killed, so does the server, and it closes its browsers (they run in
	// process groups of their own, out of reach of the group kill).
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = stdinR
	pr, pw := io.Pipe()
	start := time.Now()
	p := startProc(t, cmd, pw)
	stdinR.Close()
	s := &BrowserlessServer{
		Addr:  net.JoinHostPort("127.0.0.1", port),
		n:     nodeLines(p, pr, pw),
		stdin: stdinW,
	}
	// Runs before startProc's kill: a polite stop first.
	t.Cleanup(s.Stop)

	line := s.n.Expect(t, "ready ", 60*time.Second)
	if f := strings.Fields(line); len(f) >= 3 {
		s.Version = f[2]
	}
	s.URL = "ws://" + s.Addr + "/?token=" + url.QueryEscape(BrowserlessToken)
	t.Logf("browserless %s on %s (concurrent %d, queued %d) ready after %v",
		s.Version, s.Addr, concurrent, queued, time.Since(start).Round(time.Millisecond))
	return s
}

// freePort returns a loopback address nothing listens on (yet).
func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
