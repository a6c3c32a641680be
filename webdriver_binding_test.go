package browserfailover_test

// A WebDriver session answers only its own client: the ID in its paths is
// a secret made for it, not the ID operators see, and it serves only the
// handler that created it (or the one a reload put in its place) and the
// client key it was made with. And nothing of the provider reaches a
// WebDriver client.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
)

// bcrypt hashes (cost 4, so that each request's check is quick) of
// alice's and bob's passwords.
const (
	alicePW   = "alice-pw"
	aliceHash = "$2a$04$87QNeZQu8KwWlQzRILgZ5ufZtkZe7mAZCYLZVyAVt9glYkzLnM8mO"
	bobPW     = "bob-pw"
	bobHash   = "$2a$04$hDIxnyQZ5ozFTSgI9vKCpOjN.zNVDlVA1YfH1kKDP105yftTeGMl."
)

// basicAuth is the header of user's credentials.
func basicAuth(user, pw string) http.Header {
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	r.SetBasicAuth(user, pw)
	return http.Header{"Authorization": r.Header["Authorization"]}
}

// loadCaddyfile adapts cf with Caddy's own adapter and loads it.
func loadCaddyfile(t *testing.T, cf string) []byte {
	t.Helper()
	out, err := adapt(t, cf)
	if err != nil {
		t.Fatalf("adapt: %v\n%s", err, cf)
	}
	return out
}

// docsAccessLog is the access log block docs/securing.md gives for sites
// with WebDriver clients, writing to file.
func docsAccessLog(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile("docs/securing.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## WebDriver sessions\n")
	_, block, ok2 := strings.Cut(sec, "```caddyfile\n")
	block, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 || !strings.Contains(block, "/var/log/caddy/browsers.access.log") {
		t.Fatal("no access log block in docs/securing.md's WebDriver sessions")
	}
	return strings.ReplaceAll(strings.Replace(block, "/var/log/caddy/browsers.access.log", file, 1), "\n", "\n\t")
}

// bindingCaddyfile is two sites on one fake WebDriver provider: the
// first behind basic_auth with a client_limit keyed on the user, and the
// access log docs/securing.md gives (accessLog), the second open (its own
// browser_failover, no key). extra goes into the first site's
// browser_failover block.
func bindingCaddyfile(admin, storage, gwLog, site1, site2, accessLog, provider, extra string) string {
	return fmt.Sprintf(`{
	admin %[1]s
	persist_config off
	storage file_system %[2]s
	log {
		output file %[3]s
		format json
		level DEBUG
	}
}

http://%[4]s {
	%[6]s
	log_append session_id {http.browser_failover.session_id}
	basic_auth {
		alice %[8]s
		bob %[9]s
	}
	browser_failover {
		client_limit {http.auth.user.id} 1
		provider wd-bind %[7]s {
			protocol webdriver
		}%[10]s
	}
}

http://%[5]s {
	browser_failover {
		provider wd-bind %[7]s {
			protocol webdriver
		}
	}
}
`, admin, storage, gwLog, site1, site2, accessLog, provider, aliceHash, bobHash, extra)
}

// oneShot sends each request on a connection of its own: across a
// reload, the old config's server may take a connection and close it
// after one answer, or close it unanswered as it stops listening
// (Caddy's own shutdown); wdStatus sends such a request again. A
// request the old server reads is served as the new handler would
// (pool's TestHandlerSuccession).
var oneShot = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// wdStatus sends one request and returns its status and WebDriver error
// code ("" when none).
func wdStatus(t *testing.T, method, url string, hdr http.Header) (int, string) {
	t.Helper()
	var resp *http.Response
	var err error
	for range 5 {
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader(`{"url":"about:blank"}`)
		}
		req, _ := http.NewRequest(method, url, body)
		for k, vs := range hdr {
			req.Header[k] = vs
		}
		if resp, err = oneShot.Do(req); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	var v struct {
		Value struct {
			Error string `json:"error"`
		} `json:"value"`
	}
	json.NewDecoder(resp.Body).Decode(&v)
	return resp.StatusCode, v.Value.Error
}

// TestWebDriverSessionBinding: alice's session, through the site behind
// basic_auth with client_limit {http.auth.user.id}, is hers alone. Bob,
// through the same site, gets invalid session id (404) for her path ID
// on a command, a DELETE and her BiDi socket; so does anyone through the
// other site (its own browser_failover, no auth); so does alice with the
// operator's ID (from the sessions list and Browser-Failover-Session) in
// the path. The provider hears none of it, and alice's session goes on. A
// reload that changes the first site's block keeps her session hers
// through its new handler, and still no one else's. Neither Caddy's log
// (the session ended entry names the operator's ID) nor the access log
// with the filter docs/securing.md gives (its Caddyfile block, adapted by
// Caddy's own adapter) holds her path ID; log_append tells her requests
// by the operator's ID.
func TestWebDriverSessionBinding(t *testing.T) {
	f := fakes.NewWebDriver("")
	defer f.Close()
	dir := t.TempDir()
	admin, site1, site2 := testgw.FreePort(t), testgw.FreePort(t), testgw.FreePort(t)
	gwLog, access, storage := filepath.Join(dir, "caddy.log"), filepath.Join(dir, "access.log"), filepath.Join(dir, "storage")
	cf := func(extra string) []byte {
		return loadCaddyfile(t, bindingCaddyfile(admin, storage, gwLog, site1, site2, docsAccessLog(t, access), f.URL(), extra))
	}
	if err := caddy.Load(cf(""), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddy.Stop() })
	g := &testgw.Gateway{Addr: site1, Admin: admin, LogPath: gwLog}
	alice, bob := basicAuth("alice", alicePW), basicAuth("bob", bobPW)

	code, v, hdr := wdCall(t, http.MethodPost, "http://"+site1+"/session", newSession("chrome", true), alice)
	if code != 200 {
		t.Fatalf("alice's create: %d %v", code, v)
	}
	path, op := v["sessionId"].(string), hdr.Get("Browser-Failover-Session")
	if len(path) < 22 || op == "" || path == op {
		t.Fatalf("path ID %q, operator's ID %q", path, op)
	}
	if l := sessionsList(t, g); len(l) != 1 || l[0].ID != op {
		t.Fatalf("sessions list %+v, want the operator's ID %s", l, op)
	}
	ws := v["capabilities"].(map[string]any)["webSocketUrl"].(string)
	if !strings.HasSuffix(ws, "/session/"+path) {
		t.Fatalf("webSocketUrl %s", ws)
	}
	mine := "http://" + site1 + "/session/" + path
	if code, _ := wdStatus(t, http.MethodPost, mine+"/url", alice); code != 200 {
		t.Fatalf("alice's command: %d", code)
	}

	// refused checks that every way to her session through base with
	// id and hdr is an unknown session, and the provider hears nothing.
	refused := func(who, base, id string, hdr http.Header) {
		t.Helper()
		heard := len(f.Requests())
		for _, m := range []string{http.MethodGet, http.MethodPost} {
			if code, e := wdStatus(t, m, base+"/session/"+id+"/url", hdr); code != 404 || e != "invalid session id" {
				t.Errorf("%s: %s command: %d %q", who, m, code, e)
			}
		}
		if code, e := wdStatus(t, http.MethodDelete, base+"/session/"+id, hdr); code != 404 || e != "invalid session id" {
			t.Errorf("%s: DELETE: %d %q", who, code, e)
		}
		for _, sock := range []string{"/session/" + id, "/session/" + id + "/se/cdp"} {
			url := strings.Replace(base, "http://", "ws://", 1) + sock
			c, resp, err := dial(t, url, &websocket.DialOptions{HTTPHeader: hdr})
			if err == nil {
				c.CloseNow()
			}
			if resp == nil || resp.StatusCode != 404 {
				t.Errorf("%s: socket %s: %v %v", who, sock, resp, err)
			}
		}
		if n := len(f.Requests()); n != heard {
			t.Errorf("%s: the provider heard %d requests", who, n-heard)
		}
	}
	refused("bob", "http://"+site1, path, bob)
	refused("the open site", "http://"+site2, path, nil)
	refused("the open site with alice's credentials", "http://"+site2, path, alice)
	refused("alice with the operator's ID", "http://"+site1, op, alice)

	// Hers still, socket included.
	if code, _ := wdStatus(t, http.MethodGet, mine+"/title", alice); code != 200 {
		t.Fatalf("alice's command after the others': %d", code)
	}
	c, _, err := dial(t, ws, &websocket.DialOptions{HTTPHeader: alice})
	if err != nil {
		t.Fatalf("alice's socket: %v", err)
	}
	echoOnce(t, c, []byte(`{"id":1,"method":"session.status","params":{}}`))
	c.CloseNow()

	// A reload that changes her site's block: the new handler has a new
	// key, and her session moves to it.
	if err := g.Load(cf("\n\t\tconnect_timeout 20s")); err != nil {
		t.Fatal(err)
	}
	if code, _ := wdStatus(t, http.MethodGet, mine+"/title", alice); code != 200 {
		t.Fatalf("alice's command after the reload: %d", code)
	}
	refused("bob after the reload", "http://"+site1, path, bob)
	refused("the open site after the reload", "http://"+site2, path, nil)

	if code, _ := wdStatus(t, http.MethodDelete, mine, alice); code != 200 {
		t.Fatalf("alice's DELETE: %d", code)
	}
	if n := len(f.Live()); n != 0 {
		t.Fatalf("%d provider sessions left", n)
	}
	if e := endedEntry(t, g, op); e["close_reason"] != "client deleted the session" {
		t.Fatalf("session ended %v", e)
	}
	testgw.Eventually(t, 5*time.Second, "the access log written", func() bool {
		b, _ := os.ReadFile(access)
		return bytes.Contains(b, []byte(`"uri":"/session/-"`)) && bytes.Contains(b, []byte(`"uri":"/session/-/title"`))
	})
	// Alice's requests are told apart by the operator's ID.
	b, _ := os.ReadFile(access)
	mineLogged := 0
	for _, line := range bytes.Split(b, []byte("\n")) {
		var e struct {
			Request struct {
				URI     string              `json:"uri"`
				Headers map[string][]string `json:"headers"`
			} `json:"request"`
			Status    int    `json:"status"`
			SessionID string `json:"session_id"`
		}
		if json.Unmarshal(line, &e) != nil || e.Status != 200 || !strings.HasPrefix(e.Request.URI, "/session") {
			continue
		}
		if e.SessionID != op {
			t.Errorf("access log entry of %s (%d): session_id %q, want %q", e.Request.URI, e.Status, e.SessionID, op)
		}
		mineLogged++
	}
	if mineLogged < 4 {
		t.Errorf("%d of alice's requests in the access log", mineLogged)
	}
	for name, file := range map[string]string{"Caddy's log": gwLog, "the access log": access} {
		b, _ := os.ReadFile(file)
		if bytes.Contains(b, []byte(path)) {
			t.Errorf("%s holds the path ID", name)
		}
	}
}

// TestWebDriverNothingOfTheProvider: a Grid-shaped create answer reaches
// the client without its VNC, node, container, profile directory or
// process ID; command answers, errors and a relayed socket refusal name
// the client's path ID where the provider named its own session ID, a
// large answer streamed (its Content-Length dropped, as the IDs differ in
// length).
func TestWebDriverNothingOfTheProvider(t *testing.T) {
	f := fakes.NewWebDriver("/wd/hub")
	defer f.Close()
	f.Grid, f.CDP = true, true
	g := testgw.Start(t, handler("", wdProvider("wd-grid", f.URL(), "")))
	base := g.HTTP("/wd/hub")
	req, _ := http.NewRequest(http.MethodPost, base+"/session", strings.NewReader(`{"capabilities":{"alwaysMatch":{"browserName":"chrome","webSocketUrl":true}}}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	live := f.Live()
	if resp.StatusCode != 200 || len(live) != 1 {
		t.Fatalf("create: %d %s", resp.StatusCode, raw)
	}
	pid := live[0]
	var doc struct {
		Value struct {
			SessionID    string         `json:"sessionId"`
			Capabilities map[string]any `json:"capabilities"`
		} `json:"value"`
	}
	json.Unmarshal(raw, &doc)
	path := doc.Value.SessionID
	for _, leak := range []string{pid, fakes.GridNode, "se:vnc", "se:noVncPort", "se:nodeHost", "se:gridWebSocketUrl",
		"se:containerName", "userDataDir", "goog:processID", "Chromium.fake"} {
		if bytes.Contains(raw, []byte(leak)) {
			t.Errorf("the create answer holds %q: %s", leak, raw)
		}
	}
	if cr, _ := doc.Value.Capabilities["chrome"].(map[string]any); cr["chromedriverVersion"] == nil {
		t.Errorf("chromedriverVersion lost: %s", raw)
	}

	// chromedriver's answer to a plain HTTP request on se/cdp names its
	// session.
	code, v, _ := wdCall(t, http.MethodGet, base+"/session/"+path+"/se/cdp", nil, nil)
	if msg, _ := v["message"].(string); code != 404 || msg != "unknown command: session/"+path+"/se/cdp" {
		t.Fatalf("error answer: %d %v", code, v)
	}

	// A large answer naming the provider's session here and there.
	chunk := strings.Repeat("x", 4093) + pid
	body, _ := json.Marshal(map[string]string{"text": strings.Repeat(chunk, 256)})
	req, _ = http.NewRequest(http.MethodPost, base+"/session/"+path+"/element/e1/value", bytes.NewReader(body))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ContentLength != -1 || bytes.Contains(raw, []byte(pid)) || bytes.Count(raw, []byte(path)) != 256+1 {
		t.Fatalf("large answer: %d, Content-Length %d, %d bytes, provider's ID %d times, path ID %d times",
			resp.StatusCode, resp.ContentLength, len(raw), bytes.Count(raw, []byte(pid)), bytes.Count(raw, []byte(path)))
	}
	var echoed struct {
		Value struct {
			Body string `json:"body"`
		} `json:"value"`
	}
	if err := json.Unmarshal(raw, &echoed); err != nil || !strings.Contains(echoed.Value.Body, strings.Repeat("x", 4093)+path) {
		t.Fatalf("large answer not JSON, or not the provider's: %v", err)
	}

	// A socket the provider refuses: its answer, relayed, names the
	// client's ID.
	f.RefuseSockets = true
	ws := doc.Value.Capabilities["webSocketUrl"].(string)
	_, sresp, err := dial(t, ws, nil)
	if err == nil || sresp == nil || sresp.StatusCode != 400 {
		t.Fatalf("refused socket: %v %v", sresp, err)
	}
	b, _ := io.ReadAll(sresp.Body)
	if bytes.Contains(b, []byte(pid)) || !bytes.Contains(b, []byte("no socket for session "+path)) {
		t.Fatalf("relayed refusal: %s", b)
	}
	wdCall(t, http.MethodDelete, base+"/session/"+path, nil, nil)
}
