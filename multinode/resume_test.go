package multinode_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/redis/go-redis/v9"

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
	query  string
	heads  []http.Header
}

func (p *stateProvider) lastQuery() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.query
}

// sawHeader tells whether any upgrade request carried the field.
func (p *stateProvider) sawHeader(field string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, h := range p.heads {
		if h.Get(field) != "" {
			return true
		}
	}
	return false
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
	p.query = r.URL.RawQuery
	p.heads = append(p.heads, r.Header.Clone())
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
// its session ID and resume token (as the 101 gives them), and the
// answer's status when refused.
func connectAs(t *testing.T, url, user string) (*websocket.Conn, session, int) {
	t.Helper()
	ctx, cancel := withTimeout(10 * time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"X-User": {user}}})
	if err != nil {
		if resp == nil {
			t.Fatalf("dial %s: %v", url, err)
		}
		return nil, session{}, resp.StatusCode
	}
	return c, session{id: resp.Header.Get("Browser-Failover-Session"), token: resp.Header.Get("Browser-Failover-Resume-Token")}, 101
}

// session is what a client learns of its session from the 101.
type session struct{ id, token string }

// providerSecret is in every provider URL's query: it must never reach
// the shared state.
const providerSecret = "pRoViDeR-sEcReT-7"

// TestClusterResume: a session parked on one node (its client dropped) is
// resumed through another with its token, at the same provider and URL
// (the provider's own query put back by that node) though that node's
// strategy points elsewhere; nodes refuse it afterwards (nothing parked);
// a resume with another resume_key value, or by session ID, is refused
// everywhere, the nodes hashing keys alike. The shared state never holds
// the provider's secret, the token, or the session ID as a key.
func TestClusterResume(t *testing.T) {
	r := testredis.Start(t)
	p1, p2 := startState(t, "p1"), startState(t, "p2")
	providers := []map[string]any{
		{"name": "p1", "url": "ws://" + p1.addr + "/browser/one?token=" + providerSecret},
		{"name": "p2", "url": "ws://" + p2.addr + "/browser/two?token=" + providerSecret},
	}
	nodes := startCluster(t, r, clusterConfig{providers: providers}, func(_ string, h map[string]any) {
		h["strategy"] = "round_robin"
		h["resume"] = map[string]any{"window": "1m"}
		h["resume_key"] = "{http.request.header.X-User}"
	})
	gw1, gw2, gw3 := nodes[0], nodes[1], nodes[2]

	c, s1, _ := connectAs(t, gw1.WS(), "alice")
	first := talk(t, c, "who")
	talk(t, c, "set 42")
	c.CloseNow()
	eventually(t, 10*time.Second, "parked on gw-1", func() (bool, string) {
		return len(gw1.LogEntries("session parked")) == 1, ""
	})
	if dump := redisDump(t, r); strings.Contains(dump, providerSecret) || strings.Contains(dump, s1.token) ||
		!strings.Contains(dump, "/browser/") {
		t.Fatalf("the shared state holds %q", dump)
	}

	// gw-2's round robin: a fresh client takes the first provider, so the
	// next pick would be the other one.
	fresh, _, _ := connectAs(t, gw2.WS(), "carol")
	if got := talk(t, fresh, "who"); got != first {
		t.Logf("gw-2's first pick: %s", got)
	}
	fresh.Close(websocket.StatusNormalClosure, "")
	before1, before2 := p1.Hits(), p2.Hits()

	if _, _, code := connectAs(t, gw2.WS()+"?bf_resume="+s1.token, "bob"); code != http.StatusGone {
		t.Fatalf("bob's resume on gw-2: %d, want 410", code)
	}
	if _, _, code := connectAs(t, gw2.WS()+"?bf_resume="+s1.id, "alice"); code != http.StatusGone {
		t.Fatalf("a resume by session ID on gw-2: %d, want 410", code)
	}
	c2, s2, code := connectAs(t, gw2.WS()+"?bf_resume="+s1.token, "alice")
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
	for _, p := range []*stateProvider{p1, p2} {
		if q := p.lastQuery(); q != "" && q != "token="+providerSecret {
			t.Fatalf("%s was dialled with the query %q, want its own token", p.name, q)
		}
	}
	res := gw2.LogEntries("session resumed")
	if len(res) != 1 || res[0]["resumed_from"] != s1.id || res[0]["session_id"] != s2.id {
		t.Fatalf("gw-2's session resumed log: %v", res)
	}
	// gw-1 heard of it, and no longer lists it as parked.
	eventually(t, 10*time.Second, "gw-1 to forget the session resumed elsewhere", func() (bool, string) {
		b, err := gw1.get("/browser_failover/status")
		return err == nil && strings.Contains(string(b), `"parked":{"sessions":0,`), string(b)
	})
	if _, _, code := connectAs(t, gw3.WS()+"?bf_resume="+s1.token, "alice"); code != http.StatusGone {
		t.Fatalf("a resume on gw-3 of a session connected on gw-2: %d, want 410", code)
	}
	if _, _, code := connectAs(t, gw1.WS()+"?bf_resume="+s1.token, "alice"); code != http.StatusGone {
		t.Fatalf("a resume on gw-1, which parked it, of a session connected on gw-2: %d, want 410", code)
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

// TestClusterResumeStateChecked: what a node reads back from the shared
// state is checked before use: an entry someone rewrote in Redis to inject
// a header into the upgrade request is refused (410), and the provider
// never sees the request. And while Redis cannot be asked, a resume is
// refused with 503 and Retry-After, even on the node that parked the
// session (another node may have taken it); the session is still there
// once Redis is back.
func TestClusterResumeStateChecked(t *testing.T) {
	r := testredis.Start(t)
	p1 := startState(t, "p1")
	providers := []map[string]any{{"name": "p1", "url": "ws://" + p1.addr + "/browser/one?token=" + providerSecret}}
	nodes := startCluster(t, r, clusterConfig{providers: providers}, func(_ string, h map[string]any) {
		h["resume"] = map[string]any{"window": "1m"}
	})
	gw1, gw2 := nodes[0], nodes[1]
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	park := func(gw *node) session {
		t.Helper()
		n := len(gw.LogEntries("session parked"))
		c, s, _ := connectAs(t, gw.WS(), "alice")
		talk(t, c, "set 7")
		c.CloseNow()
		eventually(t, 10*time.Second, "parked", func() (bool, string) {
			return len(gw.LogEntries("session parked")) == n+1, ""
		})
		return s
	}
	resumeKeys := func() []string {
		ctx, cancel := withTimeout(5 * time.Second)
		defer cancel()
		keys, err := rdb.Keys(ctx, "multinode:"+t.Name()+":resume:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}

	// A poisoned entry.
	s := park(gw1)
	keys := resumeKeys()
	if len(keys) != 1 {
		t.Fatalf("resume entries in Redis: %v", keys)
	}
	ctx, cancel := withTimeout(5 * time.Second)
	v, err := rdb.Get(ctx, keys[0]).Result()
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	var entry map[string]any
	if err := json.Unmarshal([]byte(v), &entry); err != nil {
		t.Fatalf("entry %q: %v", v, err)
	}
	entry["point"].(map[string]any)["host"] = p1.addr + "\r\nX-Injected: 1"
	poisoned, _ := json.Marshal(entry)
	ctx, cancel = withTimeout(5 * time.Second)
	rdb.Set(ctx, keys[0], poisoned, time.Minute)
	cancel()
	hits := p1.Hits()
	if _, _, code := connectAs(t, gw2.WS()+"?bf_resume="+s.token, "alice"); code != http.StatusGone {
		t.Fatalf("resume of a poisoned entry: %d, want 410", code)
	}
	if p1.Hits() != hits || p1.sawHeader("X-Injected") {
		t.Fatal("the provider was dialled for a poisoned entry")
	}
	eventually(t, 10*time.Second, "gw-2 to log the refused entry", func() (bool, string) {
		return len(gw2.LogEntries("resume entry from the shared state refused")) == 1, ""
	})

	// Redis cannot be asked: 503, on the parking node too. (gw-1 learns
	// by itself that Redis is away, from its lease renewals; a fresh
	// client's connect goes on locally, and the resume then does not ask
	// at all. A claim that timed out could have reached Redis, and the
	// session would be gone.)
	s = park(gw1)
	r.Pause()
	eventually(t, 15*time.Second, "gw-1 to see Redis away", metricIs(gw1, upMetric, 0))
	fresh, _, code := connectAs(t, gw1.WS(), "dave")
	if code != 101 {
		t.Fatalf("a fresh client while Redis is away: %d", code)
	}
	fresh.CloseNow()
	code, retryAfter := refusalOf(t, gw1.WS()+"?bf_resume="+s.token)
	r.Resume()
	if code != http.StatusServiceUnavailable || retryAfter == "" {
		t.Fatalf("resume while Redis is away: %d (Retry-After %q), want 503", code, retryAfter)
	}
	var c *websocket.Conn
	eventually(t, 15*time.Second, "the resume to work again once Redis is back", func() (bool, string) {
		var code int
		c, _, code = connectAs(t, gw2.WS()+"?bf_resume="+s.token, "alice")
		return code == 101, ""
	})
	if got := talk(t, c, "get"); got != "7" {
		t.Fatalf("state after the resume: %q", got)
	}
	c.Close(websocket.StatusNormalClosure, "")
}

// refusalOf dials url and returns the refusal's status and Retry-After.
func refusalOf(t *testing.T, url string) (int, string) {
	t.Helper()
	ctx, cancel := withTimeout(10 * time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, url, nil)
	if err == nil {
		c.CloseNow()
		return 101, ""
	}
	if resp == nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// redisDump is every key and string value of r, one per line.
func redisDump(t *testing.T, r *testredis.Server) string {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	ctx, cancel := withTimeout(5 * time.Second)
	defer cancel()
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k)
		typ, _ := rdb.Type(ctx, k).Result()
		switch typ {
		case "string":
			v, _ := rdb.Get(ctx, k).Result()
			b.WriteString(" = " + v)
		case "hash":
			v, _ := rdb.HGetAll(ctx, k).Result()
			fmt.Fprintf(&b, " = %v", v)
		case "zset":
			v, _ := rdb.ZRange(ctx, k, 0, -1).Result()
			fmt.Fprintf(&b, " = %v", v)
		case "set":
			v, _ := rdb.SMembers(ctx, k).Result()
			fmt.Fprintf(&b, " = %v", v)
		}
		b.WriteByte('\n')
	}
	return b.String()
}
