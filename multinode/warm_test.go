package multinode_test

// Warm sessions belong to the provider settings of the handler that made
// them, in a real Caddy run from a Caddyfile: two site blocks using one
// provider with their own tokens each hand their clients only sessions
// opened with their own token, and a token read from a file that changed
// is never handed out with its old value.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// tokenProvider is a fake provider that records, for each upstream
// connection in the order they were opened, the X-Token it was opened
// with and the messages a client sent on it (echoed back).
type tokenProvider struct {
	Addr string

	mu    sync.Mutex
	conns []*tokenConn
}

// tokenConn is one upstream connection's record.
type tokenConn struct {
	token string
	got   []string
}

// startTokenProvider starts one on 127.0.0.1, stopped when the test ends.
func startTokenProvider(t *testing.T) *tokenProvider {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tokenProvider{Addr: ln.Addr().String()}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return p
}

func (p *tokenProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &tokenConn{token: r.Header.Get("X-Token")}
	p.mu.Lock()
	p.conns = append(p.conns, rec)
	p.mu.Unlock()
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return
	}
	defer c.CloseNow()
	for {
		typ, msg, err := c.Read(context.Background())
		if err != nil {
			return
		}
		p.mu.Lock()
		rec.got = append(rec.got, string(msg))
		p.mu.Unlock()
		if err := c.Write(context.Background(), typ, msg); err != nil {
			return
		}
	}
}

// opened is how many connections were opened so far.
func (p *tokenProvider) opened() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// carrying returns the index and token of the connection a client sent
// msg on (-1: none).
func (p *tokenProvider) carrying(msg string) (int, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, c := range p.conns {
		for _, m := range c.got {
			if m == msg {
				return i, c.token
			}
		}
	}
	return -1, ""
}

// tokenOf is the X-Token connection i was opened with.
func (p *tokenProvider) tokenOf(i int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conns[i].token
}

// describe lists the connections for messages.
func (p *tokenProvider) describe() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for i, c := range p.conns {
		out = append(out, fmt.Sprintf("#%d %s %q", i, c.token, c.got))
	}
	return strings.Join(out, "; ")
}

// startCaddyfile runs `caddy run` on the Caddyfile site writes (given the
// node, whose Addr and Admin it listens on, and its folder), waits until
// it serves, and kills it when the test ends.
func startCaddyfile(t *testing.T, name string, site func(n *node, dir string) string) (*node, string) {
	t.Helper()
	bin := caddyBin(t)
	dir := t.TempDir()
	n := &node{
		t: t, Name: name, Addr: freeAddr(t), Admin: freeAddr(t),
		LogPath: filepath.Join(dir, "caddy.log"), OutPath: filepath.Join(dir, "out.log"),
		exited: make(chan struct{}),
	}
	cfgPath := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(cfgPath, []byte(n.caddyfile(dir, site(n, dir))), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := os.Create(n.OutPath)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	n.cmd = exec.Command(bin, "run", "--config", cfgPath, "--adapter", "caddyfile")
	n.cmd.Dir = dir
	n.cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	n.cmd.Stdout, n.cmd.Stderr = out, out
	if err := n.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = n.cmd.Wait(); close(n.exited) }()
	t.Cleanup(n.Kill)
	t.Cleanup(func() {
		if t.Failed() {
			n.dump()
		}
	})
	eventually(t, 20*time.Second, name+" serving", func() (bool, string) {
		select {
		case <-n.exited:
			t.Fatalf("%s exited at start:\n%s", name, tail(n.OutPath, 30))
		default:
		}
		if _, err := n.Status(); err != nil {
			return false, err.Error()
		}
		c, err := net.DialTimeout("tcp", n.Addr, time.Second)
		if err != nil {
			return false, err.Error()
		}
		c.Close()
		return true, ""
	})
	return n, cfgPath
}

// caddyfile is the whole Caddyfile of n: its admin API, its JSON log and
// storage in dir, then the sites.
func (n *node) caddyfile(dir, sites string) string {
	return fmt.Sprintf(`{
	admin %s
	persist_config off
	storage file_system %s
	log {
		output file %s
		format json
		level DEBUG
	}
}
%s`, n.Admin, filepath.Join(dir, "storage"), n.LogPath, sites)
}

// reloadCaddyfile has n load the Caddyfile at path through the admin API,
// as `caddy reload --force` does: even when it reads as the running one.
func (n *node) reloadCaddyfile(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for try := 0; ; try++ {
		req, _ := http.NewRequest(http.MethodPost, "http://"+n.Admin+"/load", strings.NewReader(string(b)))
		req.Header.Set("Content-Type", "text/caddyfile")
		req.Header.Set("Cache-Control", "must-revalidate")
		req.Close = true
		resp, err := adminClient.Do(req)
		if err != nil {
			// The admin server is replaced with each load: try again.
			if try < 4 {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			t.Fatalf("reload: %v", err)
		}
		body := make([]byte, 4096)
		m, _ := resp.Body.Read(body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("reload: %s %s", resp.Status, body[:m])
		}
		return
	}
}

// warmOf reads the warm object of provider name in n's status.
func warmOf(n *node, name string) (ready, target int64, raw string) {
	b, err := n.get("/browser_failover/status")
	if err != nil {
		return -1, -1, err.Error()
	}
	var st struct {
		Providers []struct {
			Name string `json:"name"`
			Warm *struct {
				Ready  int64 `json:"ready"`
				Target int64 `json:"target"`
			} `json:"warm"`
		} `json:"providers"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return -1, -1, string(b)
	}
	for _, p := range st.Providers {
		if p.Name == name && p.Warm != nil {
			return p.Warm.Ready, p.Warm.Target, string(b)
		}
	}
	return 0, 0, string(b)
}

// warmFull is an eventually condition: provider name has every warm
// session it wants ready (and wants some).
func warmFull(n *node, name string) func() (bool, string) {
	return func() (bool, string) {
		ready, target, raw := warmOf(n, name)
		return target > 0 && ready == target, raw
	}
}

// sendThrough opens a session at url, sends msg and reads it back.
func sendThrough(t *testing.T, url, msg string) {
	t.Helper()
	ctx, cancel := withTimeout(15 * time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatalf("%s: %v", msg, err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		t.Fatalf("%s: write: %v", msg, err)
	}
	if _, got, err := c.Read(ctx); err != nil || string(got) != msg {
		t.Fatalf("%s: read %q, %v", msg, got, err)
	}
	c.Close(websocket.StatusNormalClosure, "")
}

// TestWarmSessionsPerHandler: two sites, each with the same provider and
// its own token in header_up, each keeping one warm session: every client
// of a site is handed a warm session opened with that site's token, never
// the other's; status sums both sets.
func TestWarmSessionsPerHandler(t *testing.T) {
	p := startTokenProvider(t)
	siteB := freeAddr(t)
	g, _ := startCaddyfile(t, "warm-sites", func(n *node, _ string) string {
		block := func(addr, token string) string {
			return fmt.Sprintf(`http://%s {
	browser_failover {
		provider bl ws://%s/ {
			warm 1
			header_up X-Token %s
		}
	}
}
`, addr, p.Addr, token)
		}
		return block(n.Addr, "token-of-a") + block(siteB, "token-of-b")
	})
	sites := map[string]string{"a": "ws://" + g.Addr + "/", "b": "ws://" + siteB + "/"}
	eventually(t, 20*time.Second, "warm sessions ready", warmFull(g, "bl"))
	handed := 0
	for i := range 3 {
		for _, site := range []string{"a", "b"} {
			msg := fmt.Sprintf("client %d of site %s", i, site)
			sendThrough(t, sites[site], msg)
			handed++
			if _, tok := p.carrying(msg); tok != "token-of-"+site {
				t.Fatalf("%s was relayed on a session opened with X-Token %q; connections: %s", msg, tok, p.describe())
			}
			eventually(t, 20*time.Second, "warm sessions refilled", warmFull(g, "bl"))
		}
	}
	// Each client was handed a warm session, and each site keeps its own.
	eventually(t, 10*time.Second, "every client handed a warm session", metricIs(g, "caddy_browser_failover_warm_handed_total", float64(handed)))
	if ready, target, raw := warmOf(g, "bl"); ready != 2 || target != 2 {
		t.Fatalf("status warm %d/%d, want both sites' sets summed (2/2): %s", ready, target, raw)
	}
}

// TestWarmSessionsRotatedSecret: a token read from a file ({file.…}) is
// rotated. After a reload, no client is handed the warm session opened
// with the old token: it is closed, and the client gets one opened with
// the new token. Without a reload, the warm session made with the value
// the file no longer holds is not handed out either (the client gets a
// connection of its own), and none is made until the config is reloaded.
func TestWarmSessionsRotatedSecret(t *testing.T) {
	p := startTokenProvider(t)
	var tokenFile string
	g, cfg := startCaddyfile(t, "warm-rotate", func(n *node, dir string) string {
		tokenFile = filepath.Join(dir, "token")
		if err := os.WriteFile(tokenFile, []byte("key-1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf(`http://%s {
	browser_failover {
		provider bl ws://%s/ {
			warm 1
			header_up X-Token {file.%s}
		}
	}
}
`, n.Addr, p.Addr, tokenFile)
	})
	ws := "ws://" + g.Addr + "/"
	eventually(t, 20*time.Second, "a warm session ready", warmFull(g, "bl"))
	if p.opened() != 1 || p.tokenOf(0) != "key-1" {
		t.Fatalf("warm-up: %s", p.describe())
	}

	// Rotated, then reloaded with the same Caddyfile.
	if err := os.WriteFile(tokenFile, []byte("key-2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	g.reloadCaddyfile(t, cfg)
	sendThrough(t, ws, "after the reload")
	if _, tok := p.carrying("after the reload"); tok != "key-2" {
		t.Fatalf("after a reload, a client was relayed on a session opened with X-Token %q; connections: %s", tok, p.describe())
	}
	eventually(t, 20*time.Second, "a warm session ready again", warmFull(g, "bl"))
	handedBefore := handedTotal(t, g)
	sendThrough(t, ws, "warm with key-2")
	if _, tok := p.carrying("warm with key-2"); tok != "key-2" || handedTotal(t, g) != handedBefore+1 {
		t.Fatalf("the new warm session: token %q, handed %v→%v; connections: %s", tok, handedBefore, handedTotal(t, g), p.describe())
	}
	eventually(t, 20*time.Second, "a warm session ready again", warmFull(g, "bl"))

	// Rotated without a reload: the warm session opened with key-2 is not
	// handed out, and none is made with the value of the config load.
	before := p.opened()
	if err := os.WriteFile(tokenFile, []byte("key-3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	handedBefore = handedTotal(t, g)
	sendThrough(t, ws, "rotated, not reloaded")
	if i, _ := p.carrying("rotated, not reloaded"); i < before || handedTotal(t, g) != handedBefore {
		t.Fatalf("a client was handed the warm session made before the rotation; connections: %s", p.describe())
	}
	eventually(t, 20*time.Second, "no warm session ready", func() (bool, string) {
		ready, target, raw := warmOf(g, "bl")
		return ready == 0 && target == 1, raw
	})
	eventually(t, 10*time.Second, "a log entry saying why the warm sessions paused", func() (bool, string) {
		return len(g.LogEntries("warm sessions paused: the provider's settings resolve to other values than when the config was loaded (a changed {env.*} or {file.*}); reload the config to warm it again")) > 0, ""
	})
	// The reload takes the new value: warm sessions come back with it.
	g.reloadCaddyfile(t, cfg)
	eventually(t, 20*time.Second, "a warm session ready after the reload", warmFull(g, "bl"))
	sendThrough(t, ws, "warm with key-3")
	if _, tok := p.carrying("warm with key-3"); tok != "key-3" {
		t.Fatalf("after the second reload: token %q; connections: %s", tok, p.describe())
	}
	// No message ever went on a session opened with a token the file no
	// longer held when the session was handed out.
	for _, m := range []string{"after the reload", "warm with key-2", "warm with key-3"} {
		if _, tok := p.carrying(m); tok == "key-1" {
			t.Fatalf("%q went on a key-1 session", m)
		}
	}
}

// handedTotal is the warm sessions handed to clients so far.
func handedTotal(t *testing.T, n *node) float64 {
	t.Helper()
	m, err := n.Metric("caddy_browser_failover_warm_handed_total")
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, v := range m {
		total += v
	}
	return total
}
