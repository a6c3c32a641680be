package multinode_test

// WebDriver sessions across gateway processes, against a real
// chromedriver: a gateway killed with kill -9 leaves its sessions'
// browsers open only until it starts again (the ledger has them, and the
// reaper sends DELETE); two nodes sharing a real redis-server serve one
// session's commands, its BiDi socket and its DELETE from either node,
// while the creating node keeps its slot; without Redis, the other node
// knows no such session.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/e2e"
	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
)

// wdHandler is a handler whose one provider is the chromedriver cd, with
// the capabilities that start Debian's chromium under profiles.
func wdHandler(cd *e2e.Chromedriver, profiles string) map[string]any {
	return map[string]any{
		"handler": "browser_failover",
		"providers": []map[string]any{{
			"name": "chromedriver", "url": cd.URL(), "protocol": "webdriver", "connect_timeout": "30s",
			"capabilities": json.RawMessage(e2e.ChromeCapabilities(profiles)),
		}},
	}
}

// wdDo sends one WebDriver request to a node and decodes its value.
func wdDo(t *testing.T, method, url string, body string) (int, map[string]any) {
	t.Helper()
	return wdDoAs(t, "", method, url, body)
}

// wdDoAs is wdDo with X-User: user ("": none).
func wdDoAs(t *testing.T, user, method, url string, body string) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Content-Type", "application/json")
	if user != "" {
		req.Header.Set("X-User", user)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var v struct {
		Value any `json:"value"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s %s: %d %s", method, url, resp.StatusCode, raw)
	}
	m, _ := v.Value.(map[string]any)
	if m == nil {
		m = map[string]any{"value": v.Value}
	}
	return resp.StatusCode, m
}

// createdAt creates a session through n, and counts the browsers then
// open under profiles.
func createdAt(t *testing.T, n *node, profiles string) (id string, browsers int) {
	t.Helper()
	return createdAs(t, "", n, profiles)
}

// createdAs is createdAt with X-User: user ("": none).
func createdAs(t *testing.T, user string, n *node, profiles string) (id string, browsers int) {
	t.Helper()
	code, v := wdDoAs(t, user, http.MethodPost, "http://"+n.Addr+"/session", `{"capabilities":{"alwaysMatch":{"browserName":"chrome","webSocketUrl":true}}}`)
	if code != 200 {
		t.Fatalf("create through %s: %d %v", n.Name, code, v)
	}
	return v["sessionId"].(string), e2e.BrowsersUnder(profiles)
}

// TestWebDriverReapedAfterKill: a gateway holding a chromedriver session
// is killed with kill -9; chromedriver keeps the browser open; the
// restarted gateway (same storage) sends DELETE for it, and the browser is
// gone.
func TestWebDriverReapedAfterKill(t *testing.T) {
	e2e.RequireChromedriver(t)
	cd := e2e.StartChromedriver(t)
	profiles := t.TempDir() + "/wd-profile"
	storage := t.TempDir()
	gw := startNodeOn(t, "gw-1", wdHandler(cd, profiles), storage)
	id, browsers := createdAt(t, gw, profiles)
	if browsers == 0 {
		t.Fatal("no browser started")
	}
	if code, v := wdDo(t, http.MethodPost, "http://"+gw.Addr+"/session/"+id+"/url", `{"url":"about:blank"}`); code != 200 {
		t.Fatalf("a command: %d %v", code, v)
	}
	gw.Kill()
	time.Sleep(500 * time.Millisecond)
	if e2e.BrowsersUnder(profiles) == 0 {
		t.Fatal("the browser closed with the gateway: nothing to reap")
	}
	gw2 := startNodeOn(t, "gw-1", wdHandler(cd, profiles), storage)
	waitUntil(t, 30*time.Second, "the browser deleted after the restart", func() bool { return e2e.BrowsersUnder(profiles) == 0 })
	waitUntil(t, 10*time.Second, "the reap in the log", func() bool {
		logs, _ := os.ReadFile(gw2.LogPath)
		return bytes.Contains(logs, []byte(`"msg":"session reaped"`))
	})
	raw, err := gw2.get("/browser_failover/status")
	if err != nil || !strings.Contains(string(raw), `"ledger":{"pending":0,"reaped":1}`) {
		t.Fatalf("status %s %v", raw, err)
	}
}

// TestWebDriverTwoNodes: a session created through one node is served by
// the other (commands, its BiDi socket, its DELETE) through a shared
// redis-server; the creating node's slot is freed by the DELETE sent to
// the other node. The route in Redis is under a keyed hash of the
// session's path ID, which Redis never holds, and binds it: the other
// node refuses it (invalid session id) to another client key, and a node
// whose handler has another block refuses it to anyone. Without Redis
// the other node answers invalid session id.
func TestWebDriverTwoNodes(t *testing.T) {
	e2e.RequireChromedriver(t)
	r := testredis.Start(t)
	cd := e2e.StartChromedriver(t)
	profiles := t.TempDir() + "/wd-profile"
	cc := clusterConfig{}
	keyed := func(name string, limit int) map[string]any {
		h := wdHandler(cd, profiles)
		h["state"] = cc.handler(t, r, name)["state"]
		h["client_limit"] = map[string]any{"key": "{http.request.header.X-User}", "limit": limit}
		return h
	}
	var nodes []*node
	for _, name := range []string{"gw-1", "gw-2"} {
		nodes = append(nodes, startNode(t, name, keyed(name, 2)))
	}
	a, b := nodes[0], nodes[1]
	// Another block (its limit): another handler key, on the same Redis.
	c3 := startNode(t, "gw-other", keyed("gw-other", 3))
	id, _ := createdAs(t, "alice", a, profiles)
	other := "http://" + b.Addr + "/session/" + id
	if code, v := wdDoAs(t, "alice", http.MethodPost, other+"/url", `{"url":"data:text/html,<title>two nodes</title>"}`); code != 200 {
		t.Fatalf("navigate through the other node: %d %v", code, v)
	}
	if code, v := wdDoAs(t, "alice", http.MethodGet, other+"/title", ""); code != 200 || v["value"] != "two nodes" {
		t.Fatalf("title through the other node: %d %v", code, v)
	}
	// Another client key through the other node, anyone through the
	// other handler: an unknown session, and the page is as alice left
	// it.
	for _, c := range []struct{ who, user, url string }{
		{"bob through the other node", "bob", other},
		{"no key through the other node", "", other},
		{"alice through another handler", "alice", "http://" + c3.Addr + "/session/" + id},
	} {
		if code, v := wdDoAs(t, c.user, http.MethodPost, c.url+"/url", `{"url":"data:text/html,<title>not alice</title>"}`); code != 404 || v["error"] != "invalid session id" {
			t.Errorf("%s: command: %d %v", c.who, code, v)
		}
		if code, v := wdDoAs(t, c.user, http.MethodDelete, c.url, ""); code != 404 || v["error"] != "invalid session id" {
			t.Errorf("%s: DELETE: %d %v", c.who, code, v)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		ws, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(c.url, "http"), &websocket.DialOptions{HTTPHeader: http.Header{"X-User": {c.user}}})
		cancel()
		if err == nil {
			ws.CloseNow()
		}
		if resp == nil || resp.StatusCode != 404 {
			t.Errorf("%s: BiDi socket: %v %v", c.who, resp, err)
		}
	}
	if code, v := wdDoAs(t, "alice", http.MethodGet, other+"/title", ""); code != 200 || v["value"] != "two nodes" {
		t.Fatalf("title after the others': %d %v", code, v)
	}
	// A reload that changes the block (the limit), on the creating node
	// first, then on the other: the session is alice's through both all
	// along, and the other handler's still not.
	for _, n := range []*node{a, b} {
		if err := n.Reload(keyed(n.Name, 4)); err != nil {
			t.Fatalf("reload %s: %v", n.Name, err)
		}
		for _, m := range []*node{a, b} {
			if code, v := wdDoAs(t, "alice", http.MethodGet, "http://"+m.Addr+"/session/"+id+"/title", ""); code != 200 || v["value"] != "two nodes" {
				t.Fatalf("after %s's reload, title through %s: %d %v", n.Name, m.Name, code, v)
			}
			if code, v := wdDoAs(t, "bob", http.MethodGet, "http://"+m.Addr+"/session/"+id+"/title", ""); code != 404 {
				t.Fatalf("after %s's reload, bob through %s: %d %v", n.Name, m.Name, code, v)
			}
		}
		if code, v := wdDoAs(t, "alice", http.MethodGet, "http://"+c3.Addr+"/session/"+id+"/title", ""); code != 404 {
			t.Fatalf("after %s's reload, through another handler: %d %v", n.Name, code, v)
		}
	}
	// What Redis holds never names the path ID.
	keys := testredis.Cmd(t, r.Addr(), "KEYS", "*")
	if strings.Contains(keys, id) || !strings.Contains(keys, "wd:{") {
		t.Fatalf("Redis keys %s", keys)
	}
	for _, k := range strings.Fields(keys) {
		if strings.Contains(k, "wd:{") && strings.Contains(testredis.Cmd(t, r.Addr(), "HGETALL", k), id) {
			t.Fatalf("the route %s holds the path ID", k)
		}
	}
	// The BiDi socket through the other node.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://"+b.Addr+"/session/"+id, &websocket.DialOptions{HTTPHeader: http.Header{"X-User": {"alice"}}})
	if err != nil {
		t.Fatalf("BiDi socket through the other node: %v", err)
	}
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"id":1,"method":"browsingContext.getTree","params":{}}`)); err != nil {
		t.Fatal(err)
	}
	for {
		_, msg, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("BiDi answer: %v", err)
		}
		if bytes.Contains(msg, []byte(`"id":1`)) {
			if !bytes.Contains(msg, []byte(`"contexts"`)) {
				t.Fatalf("BiDi answer %s", msg)
			}
			break
		}
	}
	ws.Close(websocket.StatusNormalClosure, "")
	// The slot is the creating node's.
	if st, err := a.Status(); err != nil || st.Providers[0].Active != 1 {
		t.Fatalf("creating node's status %+v %v", st, err)
	}
	if code, _ := wdDoAs(t, "alice", http.MethodDelete, other, ""); code != 200 {
		t.Fatalf("delete through the other node: %d", code)
	}
	eventually(t, 10*time.Second, "the creating node's slot freed", func() (bool, string) {
		st, err := a.Status()
		if err != nil {
			return false, err.Error()
		}
		return st.Providers[0].Active == 0, "active " + strings.Repeat("1", int(st.Providers[0].Active))
	})
	waitUntil(t, 15*time.Second, "the browser closed", func() bool { return e2e.BrowsersUnder(profiles) == 0 })
	if code, v := wdDoAs(t, "alice", http.MethodGet, "http://"+a.Addr+"/session/"+id+"/title", ""); code != 404 || v["error"] != "invalid session id" {
		t.Fatalf("after the delete: %d %v", code, v)
	}

	// Without shared state the other node does not know the session.
	c := startNode(t, "gw-3", wdHandler(cd, profiles))
	d := startNode(t, "gw-4", wdHandler(cd, profiles))
	id, _ = createdAt(t, c, profiles)
	if code, v := wdDo(t, http.MethodGet, "http://"+d.Addr+"/session/"+id+"/title", ""); code != 404 || v["error"] != "invalid session id" {
		t.Fatalf("another node without shared state: %d %v", code, v)
	}
	if code, _ := wdDo(t, http.MethodDelete, "http://"+c.Addr+"/session/"+id, ""); code != 200 {
		t.Fatalf("delete: %d", code)
	}
}

// TestWebDriverShutdownDeletes: a gateway that stops (an operator's
// /stop) sends DELETE for its live WebDriver sessions before it exits:
// the browser is gone without a restart, and the ledger is empty.
func TestWebDriverShutdownDeletes(t *testing.T) {
	e2e.RequireChromedriver(t)
	cd := e2e.StartChromedriver(t)
	profiles := t.TempDir() + "/wd-profile"
	storage := t.TempDir()
	gw := startNodeOn(t, "gw-1", wdHandler(cd, profiles), storage)
	if _, browsers := createdAt(t, gw, profiles); browsers == 0 {
		t.Fatal("no browser started")
	}
	waitUntil(t, 5*time.Second, "the session in the ledger", func() bool { return len(ledgerEntries(t, storage)) == 1 })
	gw.Stop()
	waitUntil(t, 15*time.Second, "the browser deleted at shutdown", func() bool { return e2e.BrowsersUnder(profiles) == 0 })
	if n := len(ledgerEntries(t, storage)); n != 0 {
		t.Fatalf("%d ledger entries left after a clean stop", n)
	}
}
