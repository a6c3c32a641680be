package browserfailover_test

// Sessions an operator can see, name and end: session IDs on the client's
// answer, in the logs and in Caddy's access log through placeholders; the
// admin API's sessions list and DELETE, over HTTP/1.1 and HTTP/2.

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/gateway"
	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/status"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// sessionIDForm is what a session ID looks like: URL-safe base64 of at
// least 64 bits.
var sessionIDForm = regexp.MustCompile(`^[A-Za-z0-9_-]{22}$`)

func checkID(t *testing.T, id string) {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(id)
	if !sessionIDForm.MatchString(id) || err != nil || len(b) < 8 {
		t.Fatalf("session ID %q: not URL-safe base64 of at least 64 bits (%v)", id, err)
	}
}

// listSessions reads the admin API's sessions list.
func listSessions(t *testing.T, admin string) []status.Session {
	t.Helper()
	resp, err := http.Get("http://" + admin + status.SessionsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out status.Sessions
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("sessions list: %d %v", resp.StatusCode, err)
	}
	return out.Sessions
}

// deleteSession ends a session through the admin API.
func deleteSession(t *testing.T, admin, id string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodDelete, "http://"+admin+status.SessionsPath+"/"+id, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestSessionIDs: every accepted client gets its own ID, on its 101 and on
// its "session ended" entry; a rejected client gets one on its answer and
// on its "rejected" entry; the sessions list names each live session.
func TestSessionIDs(t *testing.T) {
	echo := fakes.Echo("sid-echo", nil)
	defer echo.Close()
	g := testgw.Start(t, handler(`"queue":{"size":0}`, provider("sid-echo", echo.URL(), "")))

	ids := map[string]bool{}
	var conns []*websocket.Conn
	for range 5 {
		c, resp, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		id := resp.Header.Get(gateway.SessionHeader)
		checkID(t, id)
		if ids[id] {
			t.Fatalf("session ID %q given twice", id)
		}
		ids[id] = true
		echoOnce(t, c, []byte("hello "+id))
	}
	listed := map[string]bool{}
	for _, s := range listSessions(t, g.Admin) {
		listed[s.ID] = true
		if s.Provider != "sid-echo" || s.Protocol != "cdp" || s.RemoteIP != "127.0.0.1" || s.Attempts != 1 || s.Client != nil {
			t.Fatalf("listed %+v", s)
		}
	}
	for id := range ids {
		if !listed[id] {
			t.Fatalf("session %s is not listed", id)
		}
	}
	for _, c := range conns {
		c.Close(websocket.StatusNormalClosure, "")
	}
	logged := map[string]bool{}
	for _, e := range waitSessionLogs(t, g, 5) {
		logged[fmt.Sprint(e["session_id"])] = true
	}
	for id := range ids {
		if !logged[id] {
			t.Fatalf("no session ended entry for %s", id)
		}
	}

	// A rejected client is named too.
	if code, body := opAdmin(t, g, http.MethodPost, "/browser_failover/providers/sid-echo/drain"); code != 200 {
		t.Fatalf("drain: %d %s", code, body)
	}
	resp, err := http.DefaultClient.Do(upgradeRequest(t, g.HTTP("/")))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	id := resp.Header.Get(gateway.SessionHeader)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("drained: %d", resp.StatusCode)
	}
	checkID(t, id)
	testgw.Eventually(t, 5*time.Second, "the rejected entry", func() bool {
		for _, e := range g.LogEntries("rejected") {
			if e["session_id"] == id {
				return true
			}
		}
		return false
	})
}

// TestSessionPlaceholdersInAccessLog: Caddy's access log, with log_append
// fields from the placeholders (the recipe the README shows), says for
// each client which session it was, which provider served it, how many
// attempts it took and how long it waited; for a rejected client, no
// provider.
func TestSessionPlaceholdersInAccessLog(t *testing.T) {
	echo := fakes.Echo("ph-echo", nil)
	defer echo.Close()
	refused := fakes.Refused("ph-down")
	defer refused.Close()
	dir := t.TempDir()
	access := filepath.Join(dir, "access.log")
	addr, admin := testgw.FreePort(t), testgw.FreePort(t)
	caddyfile := fmt.Sprintf(`{
	admin %s
}

http://%s {
	log {
		output file %s
		format json
	}
	log_append session_id {http.browser_failover.session_id}
	log_append provider {http.browser_failover.provider}
	log_append attempts {http.browser_failover.attempts}
	log_append queue_wait_ms {http.browser_failover.queue_wait_ms}
	header {
		defer
		X-Served-By "provider={http.browser_failover.provider} attempts={http.browser_failover.attempts}"
	}

	browser_failover {
		queue {
			size 0
		}
		provider ph-down %s {
			priority 1
		}
		provider ph-echo %s {
			priority 2
		}
	}
}
`, admin, addr, access, refused.URL(), echo.URL())
	cfg, err := adapt(t, caddyfile)
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddy.Stop() })

	c, resp, err := dial(t, "ws://"+addr+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Header.Get(gateway.SessionHeader)
	checkID(t, id)
	echoOnce(t, c, []byte("logged"))
	c.Close(websocket.StatusNormalClosure, "")

	// Every provider drained: a rejection.
	for _, n := range []string{"ph-down", "ph-echo"} {
		if _, err := status.Act(pool.Current(), n, "drain"); err != nil {
			t.Fatal(err)
		}
	}
	rresp, err := http.DefaultClient.Do(upgradeRequest(t, "http://"+addr+"/"))
	if err != nil {
		t.Fatal(err)
	}
	rresp.Body.Close()
	rid := rresp.Header.Get(gateway.SessionHeader)
	checkID(t, rid)
	// A deferred header op sees the placeholders on a rejection.
	if v := rresp.Header.Get("X-Served-By"); v != "provider= attempts=0" {
		t.Fatalf("X-Served-By %q on the rejection", v)
	}

	entries := func() map[string]map[string]any {
		b, _ := os.ReadFile(access)
		out := map[string]map[string]any{}
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "handled request" {
				out[fmt.Sprint(m["session_id"])] = m
			}
		}
		return out
	}
	var got map[string]map[string]any
	testgw.Eventually(t, 10*time.Second, "two access log lines", func() bool {
		got = entries()
		return got[id] != nil && got[rid] != nil
	})
	s, r := got[id], got[rid]
	if s["provider"] != "ph-echo" || s["attempts"] != float64(2) || s["queue_wait_ms"] != float64(0) {
		t.Fatalf("the session's access log line: %v", s)
	}
	if r["provider"] != "" || r["attempts"] != float64(0) || r["status"] != float64(503) {
		t.Fatalf("the rejection's access log line: %v", r)
	}
}

// TestEndSession: DELETE on the admin API ends a live session: both sides
// get close 1000 "closed by operator", the log says so, and what the
// session held (its provider slot, its client_limit share) serves the
// client waiting for it. The list shows the session until then, and the
// waiter's session after.
func TestEndSession(t *testing.T) {
	rec := newRecorder(t)
	g := testgw.Start(t, handler(`"queue":{"size":10,"timeout":"30s"},"client_limit":{"key":"{http.request.header.X-Team}","limit":1}`,
		provider("end-rec", rec.url, `"max_concurrent":1`)))
	team := http.Header{"X-Team": {"team-blue"}}

	first, resp, err := dial(t, g.WS("/"), &websocket.DialOptions{HTTPHeader: team})
	if err != nil {
		t.Fatal(err)
	}
	defer first.CloseNow()
	firstID := resp.Header.Get(gateway.SessionHeader)
	echoOnce(t, first, []byte("first session"))

	// The same team's next client (a Playwright one) waits: its key is at
	// its limit and the provider is full.
	type dialed struct {
		c    *websocket.Conn
		resp *http.Response
		err  error
	}
	waiter := make(chan dialed, 1)
	go func() {
		h := team.Clone()
		h.Set("X-Playwright-Browser", "chromium")
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		defer cancel()
		c, resp, err := websocket.Dial(ctx, g.WS("/"), &websocket.DialOptions{HTTPHeader: h})
		waiter <- dialed{c, resp, err}
	}()
	testgw.Eventually(t, 10*time.Second, "the second client to wait", func() bool {
		return pool.Current().Waiting.Len() == 1
	})

	list := listSessions(t, g.Admin)
	if len(list) != 1 || list[0].ID != firstID {
		t.Fatalf("sessions %+v, want only %s", list, firstID)
	}
	s := list[0]
	if s.Provider != "end-rec" || s.Protocol != "cdp" || s.Client == nil || *s.Client != pool.Current().Hashes.ShownKey("team-blue") ||
		s.BytesUp < int64(len("first session")) || s.BytesDown < int64(len("first session")) ||
		time.Since(s.Started) > time.Minute || s.Started.After(time.Now()) {
		t.Fatalf("listed %+v", s)
	}

	code, body := deleteSession(t, g.Admin, firstID)
	var ended status.Session
	if code != 200 || json.Unmarshal(body, &ended) != nil || ended.ID != firstID || ended.Provider != "end-rec" {
		t.Fatalf("DELETE: %d %s", code, body)
	}
	if c, _ := readEnd(first, 10*time.Second); !c.is(websocket.StatusNormalClosure, upstreams.EndOperator) {
		t.Fatalf("the client saw %v", c)
	}
	if c := rec.next(t, 10*time.Second); !c.is(websocket.StatusNormalClosure, upstreams.EndOperator) {
		t.Fatalf("the provider saw %v", c)
	}

	// The waiter takes the freed slot and quota share.
	var w dialed
	select {
	case w = <-waiter:
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting client was not served after the session ended")
	}
	if w.err != nil {
		t.Fatalf("the waiting client: %v", w.err)
	}
	defer w.c.CloseNow()
	w.c.SetReadLimit(-1)
	echoOnce(t, w.c, []byte("the waiter's session"))
	wid := w.resp.Header.Get(gateway.SessionHeader)
	list = listSessions(t, g.Admin)
	if len(list) != 1 || list[0].ID != wid || list[0].Protocol != "playwright" {
		t.Fatalf("sessions after the end: %+v, want only %s (playwright)", list, wid)
	}
	if n := pool.Current().Quotas.Active(pool.QuotaKey{Template: "{http.request.header.X-Team}", Value: "team-blue"}); n != 1 {
		t.Fatalf("team-blue holds %d sessions, want 1", n)
	}
	var e map[string]any
	testgw.Eventually(t, 5*time.Second, "the ended session's log entry", func() bool {
		for _, x := range g.LogEntries("session ended") {
			if x["session_id"] == firstID {
				e = x
				return true
			}
		}
		return false
	})
	if e["close_reason"] != upstreams.EndOperator || e["provider"] != "end-rec" {
		t.Fatalf("log entry %v", e)
	}
	if code, _ := deleteSession(t, g.Admin, firstID); code != 404 {
		t.Fatalf("DELETE of an ended session: %d", code)
	}
	w.c.Close(websocket.StatusNormalClosure, "")
	testgw.Eventually(t, 5*time.Second, "every slot freed", func() bool { return active("end-rec") == 0 })
}

// TestHTTP2SessionEnd: a session over HTTP/2 extended CONNECT is named on
// its 200, listed, and ended by DELETE: the client reads close 1000
// "closed by operator" and its stream ends, the provider gets the same
// close, and the slot is free.
func TestHTTP2SessionEnd(t *testing.T) {
	rec := newRecorder(t)
	g, tr := startH2(t, handler(``, provider("h2end-rec", rec.url, "")))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := dialH2(ctx, tr, "https://"+g.addr+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	id := c.resp.Header.Get(gateway.SessionHeader)
	checkID(t, id)
	c.echo(t, 0x1, []byte("over h2"))
	list := listSessions(t, g.admin)
	if len(list) != 1 || list[0].ID != id || list[0].Provider != "h2end-rec" {
		t.Fatalf("sessions %+v", list)
	}
	if code, body := deleteSession(t, g.admin, id); code != 200 {
		t.Fatalf("DELETE: %d %s", code, body)
	}
	op, p, err := c.readFrame()
	if err != nil || op != 0x8 {
		t.Fatalf("want a close frame, got op %d %q %v", op, p, err)
	}
	if code, reason := binary.BigEndian.Uint16(p), string(p[2:]); code != 1000 || reason != upstreams.EndOperator {
		t.Fatalf("close %d %q", code, reason)
	}
	if cl := rec.next(t, 10*time.Second); !cl.is(websocket.StatusNormalClosure, upstreams.EndOperator) {
		t.Fatalf("the provider saw %v", cl)
	}
	c.closeFrame(1000, "")
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, c.br)
		done <- err
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end after the close")
	}
	testgw.Eventually(t, 5*time.Second, "the slot freed", func() bool { return active("h2end-rec") == 0 })
	if l := listSessions(t, g.admin); len(l) != 0 {
		t.Fatalf("still listed: %+v", l)
	}
	testgw.Eventually(t, 5*time.Second, "the log entry", func() bool {
		for _, e := range logEntries(g.logPath, "session ended") {
			if e["session_id"] == id && e["close_reason"] == upstreams.EndOperator {
				return true
			}
		}
		return false
	})
}

// TestDashboardDirectiveOrder: in a site block, basic_auth runs before the
// dashboard and the dashboard before browser_failover, so a dashboard under
// a path matcher sits beside the gateway without a route block.
func TestDashboardDirectiveOrder(t *testing.T) {
	cfg, err := adapt(t, `http://127.0.0.1:8080 {
	browser_failover {
		provider a ws://127.0.0.1:9/
	}
	browser_failover_dashboard /dash/* {
		controls on
	}
	basic_auth /dash/* {
		ops $2a$14$Zkx19XLiW6VYouLHR5NmfOFU0z2GTNmpkT/5qqR7hx4IjWJPDhjvG
	}
}`)
	if err != nil {
		t.Fatal(err)
	}
	js := string(cfg)
	auth, dash, gw := strings.Index(js, `"authentication"`), strings.Index(js, `"browser_failover_dashboard"`), strings.Index(js, `"handler":"browser_failover"`)
	if auth < 0 || dash < 0 || gw < 0 || !(auth < dash && dash < gw) {
		t.Fatalf("handler order: basic_auth at %d, dashboard at %d, browser_failover at %d in %s", auth, dash, gw, js)
	}
	if !strings.Contains(js, `"controls":true`) {
		t.Fatalf("controls lost: %s", js)
	}
}
