package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
)

// bcrypt hashes (cost 4, so that each request's check is quick) of
// alice's and bob's passwords.
const (
	aliceHash = "$2a$04$87QNeZQu8KwWlQzRILgZ5ufZtkZe7mAZCYLZVyAVt9glYkzLnM8mO" // alice-pw
	bobHash   = "$2a$04$hDIxnyQZ5ozFTSgI9vKCpOjN.zNVDlVA1YfH1kKDP105yftTeGMl." // bob-pw
)

// wdReq sends one WebDriver request as user (none when "") and returns
// its status, its raw body and its decoded value.
func wdReq(t *testing.T, method, url, user, body string) (int, []byte, map[string]any, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, url, rd)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if user != "" {
		req.SetBasicAuth(user, user+"-pw")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
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
	json.Unmarshal(raw, &v)
	m, _ := v.Value.(map[string]any)
	if m == nil {
		m = map[string]any{"value": v.Value}
	}
	return resp.StatusCode, raw, m, resp.Header
}

// providerSessions lists chromedriver's own session IDs (its GET
// /sessions).
func (c *Chromedriver) providerSessions(t *testing.T) []string {
	t.Helper()
	resp, err := http.Get(c.URL() + "/sessions")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Value []struct {
			ID string `json:"id"`
		} `json:"value"`
	}
	json.NewDecoder(resp.Body).Decode(&v)
	var out []string
	for _, s := range v.Value {
		out = append(out, s.ID)
	}
	return out
}

// TestWebDriverSessionIsTheClients: through real chromedriver, alice's
// session (a site behind basic_auth with client_limit
// {http.auth.user.id}) is hers alone. Bob's command, DELETE and BiDi
// socket with her path ID get invalid session id (404); so do those sent
// through a second site with its own browser_failover and no auth; so
// does the operator's ID (the sessions API's, Browser-Failover-Session)
// used as a path ID. chromedriver hears none of it: her page is the one
// she opened, her session and BiDi socket go on. Neither her create
// answer nor chromedriver's own error for a command names chromedriver's
// session ID, its profile directory or its process ID.
func TestWebDriverSessionIsTheClients(t *testing.T) {
	Require(t, false)
	RequireChromedriver(t)
	cd := StartChromedriver(t)
	profile := filepath.Join(t.TempDir(), "wd-bind-profile")
	caps := ChromeCapabilities(profile)
	site1, site2, admin := testgw.FreePort(t), testgw.FreePort(t), testgw.FreePort(t)
	logPath := filepath.Join(t.TempDir(), "caddy.log")
	provider := fmt.Sprintf("provider chromedriver %s {\n\t\t\tprotocol webdriver\n\t\t\tconnect_timeout 30s\n\t\t\tcapabilities `%s`\n\t\t}", cd.URL(), caps)
	cf := fmt.Sprintf(`{
	admin %[1]s
	persist_config off
	storage file_system %[2]s
	log {
		output file %[3]s
		format json
	}
}

http://%[4]s {
	basic_auth {
		alice %[6]s
		bob %[7]s
	}
	browser_failover {
		client_limit {http.auth.user.id} 1
		%[8]s
	}
}

http://%[5]s {
	browser_failover {
		%[8]s
	}
}
`, admin, t.TempDir(), logPath, site1, site2, aliceHash, bobHash, provider)
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddy.Stop() })
	g := &testgw.Gateway{Addr: site1, Admin: admin, LogPath: logPath}

	code, raw, v, hdr := wdReq(t, http.MethodPost, "http://"+site1+"/session", "alice", `{"capabilities":{"alwaysMatch":{"browserName":"chrome","webSocketUrl":true}}}`)
	if code != 200 {
		t.Fatalf("alice's create: %d %s", code, raw)
	}
	path, op := v["sessionId"].(string), hdr.Get("Browser-Failover-Session")
	pids := cd.providerSessions(t)
	if len(pids) != 1 || path == "" || op == "" || path == op || path == pids[0] {
		t.Fatalf("path ID %q, operator's ID %q, chromedriver's %v", path, op, pids)
	}
	pid := pids[0]
	capsOf, _ := v["capabilities"].(map[string]any)
	wsURL, _ := capsOf["webSocketUrl"].(string)
	if wsURL != "ws://"+site1+"/session/"+path {
		t.Fatalf("webSocketUrl %q", wsURL)
	}
	for _, leak := range []string{pid, profile, "userDataDir", "goog:processID", "debuggerAddress", cd.Addr} {
		if bytes.Contains(raw, []byte(leak)) {
			t.Errorf("the create answer holds %q: %s", leak, raw)
		}
	}
	if ls := pool.Current().Sessions.List(); len(ls) != 1 || ls[0].ID != op {
		t.Fatalf("sessions %+v, want the operator's ID %s", ls, op)
	}
	mine := "http://" + site1 + "/session/" + path
	if code, raw, _, _ := wdReq(t, http.MethodPost, mine+"/url", "alice", `{"url":"data:text/html,<title>alice</title>"}`); code != 200 {
		t.Fatalf("alice's navigation: %d %s", code, raw)
	}

	refused := func(who, site, user, id string) {
		t.Helper()
		base := "http://" + site + "/session/" + id
		if code, _, v, _ := wdReq(t, http.MethodPost, base+"/url", user, `{"url":"data:text/html,<title>not alice</title>"}`); code != 404 || v["error"] != "invalid session id" {
			t.Errorf("%s: command: %d %v", who, code, v)
		}
		if code, _, v, _ := wdReq(t, http.MethodDelete, base, user, ""); code != 404 || v["error"] != "invalid session id" {
			t.Errorf("%s: DELETE: %d %v", who, code, v)
		}
		hd := http.Header{}
		if user != "" {
			r, _ := http.NewRequest(http.MethodGet, "/", nil)
			r.SetBasicAuth(user, user+"-pw")
			hd = r.Header
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, resp, err := websocket.Dial(ctx, "ws://"+site+"/session/"+id, &websocket.DialOptions{HTTPHeader: hd})
		if err == nil {
			c.CloseNow()
		}
		if resp == nil || resp.StatusCode != 404 {
			t.Errorf("%s: BiDi socket: %v %v", who, resp, err)
		}
	}
	refused("bob", site1, "bob", path)
	refused("the open site", site2, "", path)
	refused("alice with the operator's ID", site1, "alice", op)

	// Hers, as she left it.
	if code, _, v, _ := wdReq(t, http.MethodGet, mine+"/title", "alice", ""); code != 200 || v["value"] != "alice" {
		t.Fatalf("alice's title: %d %v", code, v)
	}
	if alive, err := cd.SessionAlive(pid); !alive || err != nil {
		t.Fatalf("chromedriver's session alive %v (%v)", alive, err)
	}
	// chromedriver's own error names its session: alice reads her ID.
	code, raw, v, _ = wdReq(t, http.MethodGet, mine+"/se/cdp", "alice", "")
	if msg, _ := v["message"].(string); code != 404 || v["error"] != "unknown command" || !strings.Contains(msg, "session/"+path+"/se/cdp") || bytes.Contains(raw, []byte(pid)) {
		t.Fatalf("chromedriver's error: %d %s", code, raw)
	}
	// Her BiDi socket.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	r.SetBasicAuth("alice", "alice-pw")
	ws, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: r.Header})
	if err != nil {
		t.Fatalf("alice's BiDi socket: %v", err)
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
			if !bytes.Contains(msg, []byte(`"contexts"`)) || bytes.Contains(msg, []byte(pid)) {
				t.Fatalf("BiDi answer %s", msg)
			}
			break
		}
	}
	ws.Close(websocket.StatusNormalClosure, "")

	if code, raw, _, _ := wdReq(t, http.MethodDelete, mine, "alice", ""); code != 200 {
		t.Fatalf("alice's DELETE: %d %s", code, raw)
	}
	testgw.Eventually(t, 20*time.Second, "chromedriver's session ended", func() bool { return len(cd.providerSessions(t)) == 0 })
	if strings.Contains(g.Logs(), path) {
		t.Error("Caddy's log holds the path ID")
	}
}
