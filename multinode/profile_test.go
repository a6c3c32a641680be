package multinode_test

// Browser profiles across nodes: two Caddy processes on one real
// redis-server and one storage share each profile's lock (a second
// client of a profile in use on one node gets 409 on the other) and its
// stored blob (a login saved through one node is restored through the
// other, at another real Chromium).

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/e2e"
	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
)

// cookieSite sets an HttpOnly session cookie at /login and counts the
// requests to /whoami that carry it.
type cookieSite struct {
	URL, Cookie string
	seen        atomic.Int64
}

func startCookieSite(t *testing.T) *cookieSite {
	t.Helper()
	b := make([]byte, 16)
	rand.Read(b)
	s := &cookieSite{Cookie: hex.EncodeToString(b)}
	mux := http.NewServeMux()
	mux.HandleFunc("/login", func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "sid", Value: s.Cookie, Path: "/", HttpOnly: true, Expires: time.Now().Add(time.Hour)})
		io.WriteString(w, "<!doctype html><title>login</title>logged in")
	})
	mux.HandleFunc("/whoami", func(w http.ResponseWriter, r *http.Request) {
		if c, err := r.Cookie("sid"); err == nil && c.Value == s.Cookie {
			s.seen.Add(1)
		}
		io.WriteString(w, "<!doctype html><title>whoami</title>")
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// cdpDo sends one command on c and returns its answer's result.
func cdpDo(t *testing.T, c *websocket.Conn, id int, method string, params any) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	msg, _ := json.Marshal(map[string]any{"id": id, "method": method, "params": params})
	if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		var m struct {
			ID     int             `json:"id"`
			Result json.RawMessage `json:"result"`
		}
		if json.Unmarshal(b, &m) == nil && m.ID == id {
			return string(m.Result)
		}
	}
}

// dialProfile opens a session with profile id at n: the connection, or
// the refusal's status and body.
func dialProfile(t *testing.T, n *node, id string) (*websocket.Conn, int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, n.WS()+"?bf_profile="+id, nil)
	if err != nil {
		if resp == nil {
			t.Fatalf("dial %s: %v", n.Name, err)
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, resp.StatusCode, string(b)
	}
	c.SetReadLimit(16 << 20)
	return c, 101, ""
}

// TestProfileTwoNodes: a client of profile "shared" through node 1 holds
// it on every node: through node 2 the same profile gets 409 naming it
// while another profile is served. The first client logs in at a local
// site and leaves; its profile is saved, and through node 2 (its first
// browser drained there) it lands on the second browser logged in. No
// key or value in Redis, nor in the nodes' logs, has the cookie.
func TestProfileTwoNodes(t *testing.T) {
	e2e.Require(t, false)
	r := testredis.Start(t)
	a, b := e2e.StartChromium(t), e2e.StartChromium(t)
	site := startCookieSite(t)
	key := make([]byte, 32)
	rand.Read(key)
	storage := t.TempDir()
	cc := clusterConfig{providers: []map[string]any{{"name": "a", "url": a.WSURL()}, {"name": "b", "url": b.WSURL()}}}
	var nodes []*node
	for _, name := range []string{"gw-1", "gw-2"} {
		h := cc.handler(t, r, name)
		h["profiles"] = map[string]any{"key": base64.StdEncoding.EncodeToString(key)}
		nodes = append(nodes, startNodeOn(t, name, h, storage))
	}
	n1, n2 := nodes[0], nodes[1]

	first, code, _ := dialProfile(t, n1, "shared")
	if code != 101 {
		t.Fatalf("first client through gw-1: %d", code)
	}
	cdpDo(t, first, 1, "Target.createTarget", map[string]any{"url": site.URL + "/login"})
	waitUntil(t, 20*time.Second, "the login's cookie in the browser", func() bool {
		return strings.Contains(cdpDo(t, first, 2, "Storage.getCookies", nil), site.Cookie)
	})
	_, code, body := dialProfile(t, n2, "shared")
	if code != http.StatusConflict || !strings.Contains(body, `"profile":"shared"`) || !strings.Contains(body, `"error"`) {
		t.Fatalf("second client of the profile through gw-2: %d %s", code, body)
	}
	other, code, _ := dialProfile(t, n2, "other")
	if code != 101 {
		t.Fatalf("another profile through gw-2: %d", code)
	}
	other.Close(websocket.StatusNormalClosure, "")

	first.Close(websocket.StatusNormalClosure, "")
	waitUntil(t, 20*time.Second, "gw-1 saved the profile", func() bool {
		for _, e := range n1.LogEntries("profile saved") {
			if e["profile"] == "shared" {
				return true
			}
		}
		return false
	})
	if code, b, err := nodeDo(n2, http.MethodPost, "/browser_failover/providers/a/drain"); err != nil || code != 200 {
		t.Fatalf("drain a at gw-2: %d %s %v", code, b, err)
	}
	// Free on every node once given back: gw-2 takes it, at b.
	var again *websocket.Conn
	waitUntil(t, 20*time.Second, "the profile free through gw-2", func() bool {
		c, code, _ := dialProfile(t, n2, "shared")
		again = c
		return code == 101
	})
	cdpDo(t, again, 1, "Target.createTarget", map[string]any{"url": site.URL + "/whoami"})
	waitUntil(t, 20*time.Second, "the site seeing the session cookie through gw-2", func() bool { return site.seen.Load() > 0 })
	again.Close(websocket.StatusNormalClosure, "")
	waitUntil(t, 20*time.Second, "gw-2 saved the profile", func() bool { return len(n2.LogEntries("profile saved")) > 0 })
	for _, e := range n2.LogEntries("session ended") {
		if e["options"] != nil && fmt.Sprint(e["options"]) == "map[profile:shared]" && e["provider"] != "b" {
			t.Fatalf("the profile's session through gw-2 at %v, want b", e["provider"])
		}
	}

	// Nothing of the cookie in Redis (keys and values), the logs, or any
	// file but the sealed blob's (which is not readable).
	dump := redisDump(t, r)
	if dump == "" {
		t.Fatal("nothing in Redis")
	}
	places := map[string]string{"redis": dump}
	for _, n := range nodes {
		l, _ := os.ReadFile(n.LogPath)
		places[n.Name+" log"] = string(l)
	}
	filepath.WalkDir(storage, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := os.ReadFile(p)
			places[p] = string(b)
		}
		return nil
	})
	for where, text := range places {
		if strings.Contains(text, site.Cookie) {
			t.Fatalf("the cookie's value is in %s", where)
		}
	}
}

// nodeDo sends an admin request to n.
func nodeDo(n *node, method, path string) (int, []byte, error) {
	req, err := http.NewRequest(method, "http://"+n.Admin+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// TestProfileSavedAtShutdown: a Caddy process stopped while a session with
// a profile is live saves the profile within its grace, before the
// provider's connection closes: the process that starts next on the same
// storage restores it, at another browser.
func TestProfileSavedAtShutdown(t *testing.T) {
	e2e.Require(t, false)
	a, b := e2e.StartChromium(t), e2e.StartChromium(t)
	site := startCookieSite(t)
	key := make([]byte, 32)
	rand.Read(key)
	storage := t.TempDir()
	h := func(url string) map[string]any {
		return map[string]any{"handler": "browser_failover", "providers": []map[string]any{{"name": "p", "url": url}},
			"profiles": map[string]any{"key": base64.StdEncoding.EncodeToString(key)}}
	}
	n1 := startNodeOn(t, "gw-1", h(a.WSURL()), storage)
	c, code, _ := dialProfile(t, n1, "stopped")
	if code != 101 {
		t.Fatalf("connect: %d", code)
	}
	defer c.CloseNow()
	cdpDo(t, c, 1, "Target.createTarget", map[string]any{"url": site.URL + "/login"})
	waitUntil(t, 20*time.Second, "the login's cookie in the browser", func() bool {
		return strings.Contains(cdpDo(t, c, 2, "Storage.getCookies", nil), site.Cookie)
	})
	n1.Stop()
	saved := n1.LogEntries("profile saved")
	if len(saved) != 1 || saved[0]["session_end"] != "server shutting down" {
		t.Fatalf("profile saved at shutdown: %v", saved)
	}

	n2 := startNodeOn(t, "gw-2", h(b.WSURL()), storage)
	again, code, _ := dialProfile(t, n2, "stopped")
	if code != 101 {
		t.Fatalf("connect after the restart: %d", code)
	}
	defer again.CloseNow()
	cdpDo(t, again, 1, "Target.createTarget", map[string]any{"url": site.URL + "/whoami"})
	waitUntil(t, 20*time.Second, "the site seeing the session cookie at the other browser", func() bool { return site.seen.Load() > 0 })
}
