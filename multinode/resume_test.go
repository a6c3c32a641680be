package multinode_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
)

// stateProvider keeps one value per URL path, across connections, like a
// browser that outlives a DevTools connection: "set <v>" stores, "get"
// reads, "who" names the provider.
type stateProvider struct {
	name   string
	addr   string
	mu     sync.Mutex
	values map[string]string
	hits   int
}

func startState(t *testing.T, name string) *stateProvider {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stateProvider{name: name, addr: ln.Addr().String(), values: map[string]string{}}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return p
}

func (p *stateProvider) Hits() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hits
}

func (p *stateProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	p.hits++
	p.mu.Unlock()
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return
	}
	defer c.CloseNow()
	ctx := context.Background()
	for {
		_, msg, err := c.Read(ctx)
		if err != nil {
			return
		}
		reply := p.name
		p.mu.Lock()
		switch m := string(msg); {
		case strings.HasPrefix(m, "set "):
			p.values[r.URL.Path] = strings.TrimPrefix(m, "set ")
			reply = "ok"
		case m == "get":
			reply = p.values[r.URL.Path]
		}
		p.mu.Unlock()
		if err := c.Write(ctx, websocket.MessageText, []byte(reply)); err != nil {
			return
		}
	}
}

// talk sends msg on c and returns the answer.
func talk(t *testing.T, c *websocket.Conn, msg string) string {
	t.Helper()
	ctx, cancel := withTimeout(10 * time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	_, b, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return string(b)
}

// connectAs dials url with the X-User header and returns the connection,
// its session ID, and the answer's status when refused.
func connectAs(t *testing.T, url, user string) (*websocket.Conn, string, int) {
	t.Helper()
	ctx, cancel := withTimeout(10 * time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"X-User": {user}}})
	if err != nil {
		if resp == nil {
			t.Fatalf("dial %s: %v", url, err)
		}
		return nil, "", resp.StatusCode
	}
	return c, resp.Header.Get("Browser-Failover-Session"), 101
}

// TestClusterResume: a session parked on one node (its client dropped) is
// resumed through another, at the same provider and URL though that
// node's strategy points elsewhere; a third node refuses it afterwards
// (each ID once, across nodes); a resume with another resume_key value is
// refused everywhere, the nodes hashing keys alike.
func TestClusterResume(t *testing.T) {
	r := testredis.Start(t)
	p1, p2 := startState(t, "p1"), startState(t, "p2")
	providers := []map[string]any{
		{"name": "p1", "url": "ws://" + p1.addr + "/browser/one"},
		{"name": "p2", "url": "ws://" + p2.addr + "/browser/two"},
	}
	nodes := startCluster(t, r, clusterConfig{providers: providers}, func(_ string, h map[string]any) {
		h["strategy"] = "round_robin"
		h["resume"] = map[string]any{"window": "1m"}
		h["resume_key"] = "{http.request.header.X-User}"
	})
	gw1, gw2, gw3 := nodes[0], nodes[1], nodes[2]

	c, id, _ := connectAs(t, gw1.WS(), "alice")
	first := talk(t, c, "who")
	talk(t, c, "set 42")
	c.CloseNow()
	eventually(t, 10*time.Second, "parked on gw-1", func() (bool, string) {
		return len(gw1.LogEntries("session parked")) == 1, ""
	})

	// gw-2's round robin: a fresh client takes the first provider, so the
	// next pick would be the other one.
	fresh, _, _ := connectAs(t, gw2.WS(), "carol")
	if got := talk(t, fresh, "who"); got != first {
		t.Logf("gw-2's first pick: %s", got)
	}
	fresh.Close(websocket.StatusNormalClosure, "")
	before1, before2 := p1.Hits(), p2.Hits()

	if _, _, code := connectAs(t, gw2.WS()+"?bf_resume="+id, "bob"); code != http.StatusGone {
		t.Fatalf("bob's resume on gw-2: %d, want 410", code)
	}
	c2, id2, code := connectAs(t, gw2.WS()+"?bf_resume="+id, "alice")
	if code != 101 {
		t.Fatalf("alice's resume on gw-2: %d", code)
	}
	if got := talk(t, c2, "who"); got != first {
		t.Fatalf("resumed at %s, want %s", got, first)
	}
	if got := talk(t, c2, "get"); got != "42" {
		t.Fatalf("state after resume through another node: %q", got)
	}
	if d1, d2 := p1.Hits()-before1, p2.Hits()-before2; d1+d2 != 1 {
		t.Fatalf("providers contacted for the resumes: p1 %d, p2 %d; want the one", d1, d2)
	}
	res := gw2.LogEntries("session resumed")
	if len(res) != 1 || res[0]["resumed_from"] != id || res[0]["session_id"] != id2 {
		t.Fatalf("gw-2's session resumed log: %v", res)
	}
	// gw-1 heard of it, and no longer lists it as parked.
	eventually(t, 10*time.Second, "gw-1 to forget the session resumed elsewhere", func() (bool, string) {
		b, err := gw1.get("/browser_failover/status")
		return err == nil && strings.Contains(string(b), `"parked":{"sessions":0,`), string(b)
	})
	if _, _, code := connectAs(t, gw3.WS()+"?bf_resume="+id, "alice"); code != http.StatusGone {
		t.Fatalf("second resume on gw-3: %d, want 410", code)
	}
	if _, _, code := connectAs(t, gw1.WS()+"?bf_resume="+id, "alice"); code != http.StatusGone {
		t.Fatalf("second resume on gw-1, which parked it: %d, want 410", code)
	}
	c2.Close(websocket.StatusNormalClosure, "")

	m, err := gw2.Metric("caddy_browser_failover_resumes_total")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(m)
	if !strings.Contains(string(b), `resumed`) {
		t.Fatalf("gw-2 resumes_total: %s", b)
	}
}
