package multinode_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
)

// leaseTTL is the lease_ttl of every node: short, so a dead node's slots
// come back quickly.
const leaseTTL = time.Second

// clusterConfig is the handler config shared by the nodes of one test.
type clusterConfig struct {
	// providers are the handler's provider objects, the same on every
	// node.
	providers []map[string]any
	// queueSize is the queue's size (0: off).
	queueSize int
	// onUnavailable is state.on_unavailable; empty leaves it out (the
	// default, local).
	onUnavailable string
}

// handler returns the handler JSON object of node.
func (cc clusterConfig) handler(t *testing.T, r *testredis.Server, node string) map[string]any {
	state := map[string]any{
		"redis": map[string]any{
			"address":    r.Addr(),
			"key_prefix": "multinode:" + t.Name() + ":",
			"lease_ttl":  leaseTTL.String(),
			"timeout":    "300ms",
		},
		"node": node,
	}
	if cc.onUnavailable != "" {
		state["on_unavailable"] = cc.onUnavailable
	}
	return map[string]any{
		"handler":   "browser_failover",
		"providers": cc.providers,
		"queue":     map[string]any{"size": cc.queueSize, "timeout": "30s"},
		"state":     state,
	}
}

// startCluster starts nodes gw-1, gw-2 and gw-3 on r with cc; tweak, when
// not nil, may change one node's handler JSON before it starts.
func startCluster(t *testing.T, r *testredis.Server, cc clusterConfig, tweak func(node string, h map[string]any)) []*node {
	t.Helper()
	var nodes []*node
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("gw-%d", i)
		h := cc.handler(t, r, name)
		if tweak != nil {
			tweak(name, h)
		}
		nodes = append(nodes, startNode(t, name, h))
	}
	return nodes
}

// node is one Caddy process with a browser_failover route.
type node struct {
	t       *testing.T
	Name    string
	Addr    string // the HTTP server's host:port
	Admin   string // the admin API's host:port
	LogPath string // Caddy's JSON log
	OutPath string // the process' stdout and stderr

	cmd    *exec.Cmd
	exited chan struct{}
	once   sync.Once
	// cfg is the config it runs (Reload changes its route's handler).
	cfg map[string]any
}

// freeAddr returns a 127.0.0.1 address nothing listens on (yet).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startNode runs `caddy run` on a JSON config whose only route is handler,
// waits until it serves, and kills it when the test ends. When the test
// fails, the end of the node's logs and its status go to the test log.
func startNode(t *testing.T, name string, handler map[string]any) *node {
	t.Helper()
	return startNodeOn(t, name, handler, "")
}

// startNodeOn is startNode with Caddy's storage at storage (a file system
// root; "" leaves Caddy's default, private to the node).
func startNodeOn(t *testing.T, name string, handler map[string]any, storage string) *node {
	t.Helper()
	bin := caddyBin(t)
	dir := t.TempDir()
	n := &node{
		t: t, Name: name, Addr: freeAddr(t), Admin: freeAddr(t),
		LogPath: filepath.Join(dir, "caddy.log"), OutPath: filepath.Join(dir, "out.log"),
		exited: make(chan struct{}),
	}
	cfg := map[string]any{
		"admin": map[string]any{"listen": n.Admin, "config": map[string]any{"persist": false}},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{
			"level":   "DEBUG",
			"encoder": map[string]any{"format": "json"},
			"writer":  map[string]any{"output": "file", "filename": n.LogPath},
		}}},
		"apps": map[string]any{"http": map[string]any{"servers": map[string]any{"gw": map[string]any{
			"listen":          []string{n.Addr},
			"automatic_https": map[string]any{"disable": true},
			"routes":          []any{map[string]any{"handle": []any{handler}}},
		}}}},
	}
	if storage != "" {
		cfg["storage"] = map[string]any{"module": "file_system", "root": storage}
	}
	n.cfg = cfg
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "caddy.json")
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := os.Create(n.OutPath)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	n.cmd = exec.Command(bin, "run", "--config", cfgPath)
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

	deadline := time.Now().Add(20 * time.Second)
	for {
		_, serr := n.Status()
		c, derr := net.DialTimeout("tcp", n.Addr, time.Second)
		if derr == nil {
			c.Close()
		}
		if serr == nil && derr == nil {
			return n
		}
		select {
		case <-n.exited:
			t.Fatalf("%s exited at start:\n%s\n%s", name, tail(n.OutPath, 30), tail(n.LogPath, 30))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not serving after 20s (status: %v, dial: %v):\n%s\n%s", name, serr, derr, tail(n.OutPath, 30), tail(n.LogPath, 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill ends the process with SIGKILL (kill -9) and waits for it. It is
// idempotent.
func (n *node) Kill() {
	n.once.Do(func() {
		_ = n.cmd.Process.Kill()
		<-n.exited
	})
}

// Stop ends the process as an operator would (the admin API's /stop) and
// waits for it to exit.
func (n *node) Stop() {
	n.once.Do(func() {
		resp, err := adminClient.Post("http://"+n.Admin+"/stop", "application/json", nil)
		if err == nil {
			resp.Body.Close()
		}
		select {
		case <-n.exited:
		case <-time.After(30 * time.Second):
			n.t.Errorf("%s did not exit after /stop", n.Name)
			_ = n.cmd.Process.Kill()
			<-n.exited
		}
	})
}

// WS is the gateway's WebSocket URL.
func (n *node) WS() string { return "ws://" + n.Addr + "/" }

// dump writes the end of the node's logs and its status to the test log.
func (n *node) dump() {
	st := "(no status: the process is gone)"
	select {
	case <-n.exited:
	default:
		if b, err := n.get("/browser_failover/status"); err == nil {
			st = string(b)
		} else {
			st = "(status: " + err.Error() + ")"
		}
	}
	n.t.Logf("--- %s: status\n%s\n--- %s: stdout/stderr (end)\n%s\n--- %s: log (end)\n%s",
		n.Name, st, n.Name, tail(n.OutPath, 20), n.Name, tail(n.LogPath, 60))
}

// tail returns the last lines of a file.
func tail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

var adminClient = &http.Client{Timeout: 5 * time.Second}

// Reload loads the node's config again with handler as its route's, as an
// operator's POST /load does.
func (n *node) Reload(handler map[string]any) error {
	n.cfg["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["gw"].(map[string]any)["routes"] =
		[]any{map[string]any{"handle": []any{handler}}}
	b, err := json.Marshal(n.cfg)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Post("http://"+n.Admin+"/load", "application/json", strings.NewReader(string(b)))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("load: %s: %s", resp.Status, body)
	}
	// The config before closes its servers' kept-alive connections.
	http.DefaultClient.CloseIdleConnections()
	return nil
}

// get reads an admin API path.
func (n *node) get(path string) ([]byte, error) {
	resp, err := adminClient.Get("http://" + n.Admin + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", path, resp.Status, b)
	}
	return b, nil
}

// status is the part of the admin status document the tests read.
type status struct {
	Providers []providerStatus `json:"providers"`
}

// providerStatus is one provider's status object.
type providerStatus struct {
	Name          string         `json:"name"`
	Active        int64          `json:"active"`
	MaxConcurrent int64          `json:"max_concurrent"`
	CooldownUntil *time.Time     `json:"cooldown_until"`
	Cluster       *clusterStatus `json:"cluster"`
	// MaxConcurrentLearned is set with max_concurrent auto once learnt.
	MaxConcurrentLearned *int64 `json:"max_concurrent_learned"`
	Spend                struct {
		Spent   float64  `json:"spent"`
		Accrued float64  `json:"accrued"`
		Budget  *float64 `json:"budget"`
	} `json:"spend"`
}

// clusterStatus is the "cluster" object of a provider's status.
type clusterStatus struct {
	Node          string         `json:"node"`
	Active        int            `json:"active"`
	Nodes         map[string]int `json:"nodes"`
	CooldownUntil *time.Time     `json:"cooldown_until"`
	Error         string         `json:"error"`
}

// Status reads GET /browser_failover/status.
func (n *node) Status() (status, error) {
	var st status
	b, err := n.get("/browser_failover/status")
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("status JSON: %w: %s", err, b)
	}
	return st, nil
}

// Provider returns the status object of one provider, with the raw JSON
// of the whole document for messages.
func (n *node) Provider(name string) (providerStatus, string, error) {
	b, err := n.get("/browser_failover/status")
	if err != nil {
		return providerStatus{}, "", err
	}
	var st status
	if err := json.Unmarshal(b, &st); err != nil {
		return providerStatus{}, string(b), fmt.Errorf("status JSON: %w", err)
	}
	for _, p := range st.Providers {
		if p.Name == name {
			return p, string(b), nil
		}
	}
	return providerStatus{}, string(b), fmt.Errorf("no provider %q in the status", name)
}

// Metric returns every series of the named metric on the admin /metrics
// endpoint: labels (as written, without braces) → value. A metric that is
// not exposed gives an empty map.
func (n *node) Metric(name string) (map[string]float64, error) {
	b, err := n.get("/metrics")
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		labels := ""
		if rest[0] == '{' {
			l, r, ok := strings.Cut(rest[1:], "}")
			if !ok {
				continue
			}
			labels, rest = l, r
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			continue
		}
		out[labels] = v
	}
	return out, sc.Err()
}

// LogEntries returns the node's JSON log entries whose msg is msg.
func (n *node) LogEntries(msg string) []map[string]any {
	b, _ := os.ReadFile(n.LogPath)
	var out []map[string]any
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, msg) {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// eventually polls cond until it holds, failing the test at once after
// wait with what and the last state cond described.
func eventually(t *testing.T, wait time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	if ok, last := waitFor(wait, cond); !ok {
		t.Fatalf("timed out after %v waiting for %s; last seen: %s", wait, what, last)
	}
}

// eventuallyOrError is eventually, but the test goes on after a timeout
// (marked failed), so that the checks after it still run.
func eventuallyOrError(t *testing.T, wait time.Duration, what string, cond func() (bool, string)) bool {
	t.Helper()
	ok, last := waitFor(wait, cond)
	if !ok {
		t.Errorf("timed out after %v waiting for %s; last seen: %s", wait, what, last)
	}
	return ok
}

// waitFor polls cond every 100 ms until it holds or wait has passed; it
// returns the last description cond gave.
func waitFor(wait time.Duration, cond func() (bool, string)) (bool, string) {
	deadline := time.Now().Add(wait)
	for {
		ok, last := cond()
		if ok || time.Now().After(deadline) {
			return ok, last
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// clusterIs is an eventually condition: the cluster object of provider on
// n shows active live leases held as nodes says (nodes absent or 0 hold
// none), with no error.
func clusterIs(n *node, provider string, active int, nodes map[string]int) func() (bool, string) {
	return func() (bool, string) {
		p, raw, err := n.Provider(provider)
		if err != nil {
			return false, err.Error()
		}
		c := p.Cluster
		if c == nil || c.Error != "" || c.Node != n.Name || c.Active != active {
			return false, raw
		}
		for _, name := range []string{"gw-1", "gw-2", "gw-3"} {
			if c.Nodes[name] != nodes[name] {
				return false, raw
			}
		}
		return true, raw
	}
}

// metricIs is an eventually condition: every series of the named metric
// on n has value v (and there is at least one).
func metricIs(n *node, name string, v float64) func() (bool, string) {
	return func() (bool, string) {
		m, err := n.Metric(name)
		if err != nil {
			return false, err.Error()
		}
		if len(m) == 0 {
			return false, name + " not exposed"
		}
		for _, got := range m {
			if got != v {
				return false, fmt.Sprintf("%s = %v", name, m)
			}
		}
		return true, ""
	}
}

// onEvery is an eventually condition that holds when cond holds on every
// node; it describes each node's state.
func onEvery(nodes []*node, cond func(*node) func() (bool, string)) func() (bool, string) {
	return func() (bool, string) {
		all := true
		var seen []string
		for _, g := range nodes {
			ok, last := cond(g)()
			all = all && ok
			seen = append(seen, g.Name+": "+last)
		}
		return all, strings.Join(seen, "; ")
	}
}

// withTimeout is a context bounded by d, for one client.
func withTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}
