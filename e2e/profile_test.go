package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/profiles"
	"github.com/browserfailover/caddy-browser-failover/status"
)

// loginSite is a site served by the test on 127.0.0.1: /login sets an
// HttpOnly session cookie and its page a localStorage token; /whoami says
// whether the request carried the session cookie. Its cookie value and
// token are random, so that a grep can look for them anywhere.
type loginSite struct {
	URL           string
	Cookie, Token string
}

func startLoginSite(t *testing.T) *loginSite {
	t.Helper()
	s := &loginSite{Cookie: randomHex(16), Token: randomHex(16)}
	mux := http.NewServeMux()
	mux.HandleFunc("/login", func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "sid", Value: s.Cookie, Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode,
			Expires: time.Now().Add(time.Hour)})
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, "<!doctype html><title>login</title><script>localStorage.setItem('token', %q)</script><body>logged in</body>", s.Token)
	})
	mux.HandleFunc("/whoami", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		if c, err := r.Cookie("sid"); err == nil && c.Value == s.Cookie {
			fmt.Fprint(w, "<!doctype html><title>whoami</title><body>logged in</body>")
			return
		}
		fmt.Fprint(w, "<!doctype html><title>whoami</title><body>anonymous</body>")
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// profilesKey is a fresh profiles key.
func profilesKey() string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}

// profilesOption is the handler's profiles option with key.
func profilesOption(key string) string {
	return fmt.Sprintf(`"profiles":{"key":%q}`, key)
}

// siteSays runs profile.mjs and returns what the site said and the
// page's token.
func siteSays(t *testing.T, mode, url string, site *loginSite, action string) (said, token string) {
	t.Helper()
	out := RunNode(t, "profile.mjs", mode, url, site.URL, action)
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, "SITE "); ok {
			said = v
		}
		if v, ok := strings.CutPrefix(l, "TOKEN "); ok {
			token = v
		}
	}
	return said, token
}

// endedAt waits for the n-th session ended entry and returns its
// provider.
func endedAt(t *testing.T, g *testgw.Gateway, n int) string {
	t.Helper()
	testgw.Eventually(t, 20*time.Second, fmt.Sprintf("%d sessions' end", n), func() bool {
		return len(g.LogEntries("session ended")) >= n
	})
	return fmt.Sprint(g.LogEntries("session ended")[n-1]["provider"])
}

// savedProfiles waits for n profile saved entries and returns the n-th.
func savedProfiles(t *testing.T, g *testgw.Gateway, n int) map[string]any {
	t.Helper()
	return profileEntry(t, g, "profile saved", n)
}

// profileEntry waits for n entries msg and returns the n-th; on a
// timeout the test fails with the log's lines about profiles.
func profileEntry(t *testing.T, g *testgw.Gateway, msg string, n int) map[string]any {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for len(g.LogEntries(msg)) < n {
		if time.Now().After(deadline) {
			var lines []string
			for _, l := range strings.Split(g.Logs(), "\n") {
				if strings.Contains(l, "profile") {
					lines = append(lines, l)
				}
			}
			t.Fatalf("%d entries %q, want %d:\n%s", len(g.LogEntries(msg)), msg, n, strings.Join(lines, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return g.LogEntries(msg)[n-1]
}

// profileList reads the admin API's list of profiles.
func profileList(t *testing.T, g *testgw.Gateway) status.ProfileList {
	t.Helper()
	code, b, err := g.AdminDo(http.MethodGet, status.ProfilesPath, nil)
	var l status.ProfileList
	if err != nil || code != 200 || json.Unmarshal(b, &l) != nil {
		t.Fatalf("profiles: %d %v %s", code, err, b)
	}
	return l
}

// checkProfileSecret checks that neither the site's cookie value nor its
// token is in the gateway's log, status, sessions list, metrics, profiles
// list, or any file of its storage.
func checkProfileSecret(t *testing.T, g *testgw.Gateway, site *loginSite) {
	t.Helper()
	places := map[string]string{"log": g.Logs()}
	for _, path := range []string{status.StatusPath, status.SessionsPath, "/metrics", status.ProfilesPath} {
		_, b, _ := g.AdminDo(http.MethodGet, path, nil)
		places[path] = string(b)
	}
	files := 0
	filepath.WalkDir(g.Storage, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := os.ReadFile(p)
			places[p] = string(b)
			if strings.Contains(p, "browser_failover") {
				files++
			}
		}
		return nil
	})
	if files == 0 {
		t.Fatalf("no profile file in the storage %s", g.Storage)
	}
	for where, text := range places {
		for _, s := range []string{site.Cookie, site.Token} {
			if strings.Contains(text, s) {
				t.Fatalf("a secret of the profile is in %s", where)
			}
		}
	}
}

// TestProfileFailover: Puppeteer and Playwright connectOverCDP, each with
// a profile of its own, log in at a local site through the first of two
// real Chromiums and disconnect; the profile is saved. With the first
// drained, the same profile lands on the second browser, which never saw
// the site, already logged in: the site sees the HttpOnly session cookie
// and the page reads the localStorage token. A client without the profile
// at the second browser is not logged in. Nothing of the cookie or token
// is in the log, status, metrics or the storage's files.
func TestProfileFailover(t *testing.T) {
	Require(t, true)
	site := startLoginSite(t)
	a, b := StartChromium(t), StartChromium(t)
	g := testgw.Start(t, handler(profilesOption(profilesKey()), provider("a", a.WSURL(), ""), provider("b", b.WSURL(), "")))
	sessions := 0
	for _, mode := range []string{"puppeteer", "pw-cdp"} {
		id := "user-" + mode
		url := g.WS("/?bf_profile=" + id)
		if said, token := siteSays(t, mode, url, site, "login"); said != "logged in" || token != site.Token {
			t.Fatalf("%s login: site %q, token %q", mode, said, token)
		}
		sessions++
		if p := endedAt(t, g, sessions); p != "a" {
			t.Fatalf("%s login at %s, want a", mode, p)
		}
		e := savedProfiles(t, g, sessions)
		if e["profile"] != id || e["cookies"].(float64) < 1 || e["origins"].(float64) < 1 {
			t.Fatalf("%s: profile saved entry %v", mode, e)
		}
	}
	l := profileList(t, g)
	if len(l.Profiles) != 2 {
		t.Fatalf("profiles listed: %+v", l)
	}
	for _, p := range l.Profiles {
		if p.InUse || p.Size == 0 || p.Scope != nil {
			t.Fatalf("profile listed: %+v", p)
		}
	}

	drain(t, g, "a")
	// Not logged in at b without the profile.
	if said, token := siteSays(t, "puppeteer", g.WS("/"), site, "check"); said != "anonymous" || token != "none" {
		t.Fatalf("without the profile at b: site %q, token %q", said, token)
	}
	sessions++
	for _, mode := range []string{"puppeteer", "pw-cdp"} {
		url := g.WS("/?bf_profile=user-" + mode)
		said, token := siteSays(t, mode, url, site, "check")
		sessions++
		if p := endedAt(t, g, sessions); p != "b" {
			t.Fatalf("%s check at %s, want b", mode, p)
		}
		if said != "logged in" || token != site.Token {
			t.Fatalf("%s at b with its profile: site %q, token %q", mode, said, token)
		}
	}
	checkProfileSecret(t, g, site)
}

// TestProfileBrowserless: a profile saved at a Chromium is restored into
// real browserless v2, which starts a fresh browser per connection.
func TestProfileBrowserless(t *testing.T) {
	Require(t, true)
	site := startLoginSite(t)
	a := StartChromium(t)
	bl := StartBrowserless(t, 2, 0)
	g := testgw.Start(t, handler(profilesOption(profilesKey()), provider("a", a.WSURL(), ""), provider("bl", bl, "")))
	url := g.WS("/?bf_profile=bl-user")
	if said, token := siteSays(t, "puppeteer", url, site, "login"); said != "logged in" || token != site.Token {
		t.Fatalf("login: site %q, token %q", said, token)
	}
	savedProfiles(t, g, 1)
	drain(t, g, "a")
	said, token := siteSays(t, "puppeteer", url, site, "check")
	if p := endedAt(t, g, 2); p != "bl" {
		t.Fatalf("check at %s, want bl", p)
	}
	if said != "logged in" || token != site.Token {
		t.Fatalf("at browserless with the profile: site %q, token %q", said, token)
	}
	// Its own save there: a fresh browser per connection, the profile
	// still logged in at the next.
	savedProfiles(t, g, 2)
	if said, token := siteSays(t, "pw-cdp", url, site, "check"); said != "logged in" || token != site.Token {
		t.Fatalf("at browserless again: site %q, token %q", said, token)
	}
	savedProfiles(t, g, 3)
}

// dialProfile opens a CDP session with profile id through g: the
// connection, or the refusal's status and body.
func dialProfile(t *testing.T, g *testgw.Gateway, id string) (*websocket.Conn, int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, g.WS("/?bf_profile="+id), nil)
	if err != nil {
		if resp == nil {
			t.Fatalf("dial: %v", err)
		}
		var body strings.Builder
		if resp.Body != nil {
			b := make([]byte, 4096)
			n, _ := resp.Body.Read(b)
			body.Write(b[:n])
		}
		return nil, resp.StatusCode, body.String()
	}
	return c, 101, ""
}

// TestProfileOneAtATimeAndKeyChange: a second client of a profile in use
// gets 409 naming the profile, while another profile is served; once the
// first leaves, the profile is free. A gateway whose key changed answers
// 500 naming the profile, and leaves the stored blob as it was; with the
// old key back, the profile opens again.
func TestProfileOneAtATimeAndKeyChange(t *testing.T) {
	Require(t, true)
	site := startLoginSite(t)
	a := StartChromium(t)
	key := profilesKey()
	g := testgw.Start(t, handler(profilesOption(key), provider("a", a.WSURL(), "")))
	if said, _ := siteSays(t, "puppeteer", g.WS("/?bf_profile=one"), site, "login"); said != "logged in" {
		t.Fatalf("login: %q", said)
	}
	savedProfiles(t, g, 1)

	first, code, _ := dialProfile(t, g, "one")
	if code != 101 {
		t.Fatalf("first client: %d", code)
	}
	_, code, body := dialProfile(t, g, "one")
	if code != http.StatusConflict || !strings.Contains(body, `"profile":"one"`) || !strings.Contains(body, `"error"`) {
		t.Fatalf("second client of the profile: %d %s", code, body)
	}
	other, code, _ := dialProfile(t, g, "two")
	if code != 101 {
		t.Fatalf("another profile: %d", code)
	}
	other.Close(websocket.StatusNormalClosure, "")
	inUse := func() bool {
		for _, p := range profileList(t, g).Profiles {
			if p.ID == "one" {
				return p.InUse
			}
		}
		return false
	}
	if !inUse() {
		t.Fatal("profile one is not listed in use")
	}
	first.Close(websocket.StatusNormalClosure, "")
	testgw.Eventually(t, 20*time.Second, "profile one free", func() bool { return !inUse() })
	savedProfiles(t, g, 3)

	// The key changes: the blob stays, the connect gets 500.
	var blobPath string
	filepath.WalkDir(g.Storage, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Base(p) == "one" {
			blobPath = p
		}
		return nil
	})
	before, err := os.ReadFile(blobPath)
	if err != nil {
		t.Fatalf("the profile's blob: %v", err)
	}
	if err := g.Reload(handler(profilesOption(profilesKey()), provider("a", a.WSURL(), ""))); err != nil {
		t.Fatal(err)
	}
	_, code, body = dialProfile(t, g, "one")
	if code != http.StatusInternalServerError || !strings.Contains(body, `"profile":"one"`) || !strings.Contains(body, "cannot be read") {
		t.Fatalf("with another key: %d %s", code, body)
	}
	after, _ := os.ReadFile(blobPath)
	if string(after) != string(before) {
		t.Fatal("the blob changed after a connect with another key")
	}
	if err := g.Reload(handler(profilesOption(key), provider("a", a.WSURL(), ""))); err != nil {
		t.Fatal(err)
	}
	if said, token := siteSays(t, "puppeteer", g.WS("/?bf_profile=one"), site, "check"); said != "logged in" || token != site.Token {
		t.Fatalf("with the old key back: site %q, token %q", said, token)
	}
	savedProfiles(t, g, 4)
	checkProfileSecret(t, g, site)
}

// drain drains provider name through the admin API.
func drain(t *testing.T, g *testgw.Gateway, name string) {
	t.Helper()
	code, b, err := g.AdminDo(http.MethodPost, status.ProvidersPath+name+"/drain", nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("drain %s: %d %s (%v)", name, code, b, err)
	}
}

// TestProfileSavedAtGatewayEnds: a session the gateway ends — an
// operator's DELETE, max_duration, idle_timeout — saves its profile
// before the provider's connection closes: the page the client opened at
// the site logged in, the profile saved says so, and the next session
// at another browser is logged in.
func TestProfileSavedAtGatewayEnds(t *testing.T) {
	Require(t, true)
	a, b := StartChromium(t), StartChromium(t)
	key := profilesKey()
	ends := []struct {
		name, limits string
		end          func(g *testgw.Gateway, id string)
		reason       string
	}{
		{"operator", "", func(g *testgw.Gateway, id string) {
			if code, body, err := g.AdminDo(http.MethodDelete, status.SessionsPath+"/"+id, nil); err != nil || code != http.StatusOK {
				t.Fatalf("delete: %d %s %v", code, body, err)
			}
		}, "closed by operator"},
		{"max_duration", `"session":{"max_duration":"5s"}`, func(*testgw.Gateway, string) {}, "session time limit"},
		{"idle", `"session":{"idle_timeout":"2s"}`, func(*testgw.Gateway, string) {}, "idle timeout"},
	}
	for i, e := range ends {
		site := startLoginSite(t)
		opt := profilesOption(key)
		if e.limits != "" {
			opt += "," + e.limits
		}
		g := testgw.Start(t, handler(opt, provider("a", a.WSURL(), ""), provider("b", b.WSURL(), "")))
		id := "end-" + e.name
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c, resp, err := websocket.Dial(ctx, g.WS("/?bf_profile="+id), nil)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", e.name, err)
		}
		session := resp.Header.Get("Browser-Failover-Session")
		// A page of the client's own logs in.
		cdpCall(t, c, 1, "Target.createTarget", map[string]any{"url": site.URL + "/login"})
		testgw.Eventually(t, 20*time.Second, "the login's cookie in the browser", func() bool {
			return strings.Contains(string(cdpCall(t, c, 2+i, "Storage.getCookies", nil)), site.Cookie)
		})
		e.end(g, session)
		saved := savedProfiles(t, g, 1)
		if saved["session_end"] != e.reason || saved["cookies"].(float64) < 1 || saved["origins"].(float64) < 1 {
			t.Fatalf("%s: profile saved %v", e.name, saved)
		}
		c.CloseNow()
		drain(t, g, "a")
		if said, token := siteSays(t, "puppeteer", g.WS("/?bf_profile="+id), site, "check"); said != "logged in" || token != site.Token {
			t.Fatalf("%s: at b: site %q, token %q", e.name, said, token)
		}
		savedProfiles(t, g, 2)
		// The next round has a site of its own (another origin), and
		// browsers without its cookie.
		for _, chr := range []*Chromium{a, b} {
			clearBrowser(t, chr)
		}
	}
}

// clearBrowser clears a browser's cookies.
func clearBrowser(t *testing.T, chr *Chromium) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, chr.WSURL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	cdpCall(t, c, 1, "Storage.clearCookies", nil)
}

// TestProfileResumeKeepsIt: a session with a profile that its client may
// take back keeps the profile in use while it waits (without hold: its
// provider connection closed, the profile saved as it closed; with hold:
// its provider connection kept): another client of the profile gets 409;
// the client that takes the session back has it (and its login), and its
// end saves it (with hold, an operator's end of the session parked again).
func TestProfileResumeKeepsIt(t *testing.T) {
	Require(t, false)
	a := StartChromium(t)
	site := startLoginSite(t)
	for _, hold := range []bool{false, true} {
		g := testgw.Start(t, handler(profilesOption(profilesKey())+fmt.Sprintf(`,"resume":{"window":"1m","hold":%v}`, hold),
			provider("a", a.WSURL(), "")))
		id := fmt.Sprintf("resumed-%v", hold)
		tok := resumeToken(t)
		c, code, _ := dialProfile(t, g, id+"&bf_resume_token="+tok)
		if code != 101 {
			t.Fatalf("hold %v: first connect %d", hold, code)
		}
		cdpCall(t, c, 1, "Target.createTarget", map[string]any{"url": site.URL + "/login"})
		testgw.Eventually(t, 20*time.Second, "the login's cookie in the browser", func() bool {
			return strings.Contains(string(cdpCall(t, c, 2, "Storage.getCookies", nil)), site.Cookie)
		})
		c.CloseNow() // dropped: parked
		testgw.Eventually(t, 20*time.Second, "the session parked", func() bool { return len(g.LogEntries("session parked")) == 1 })
		saved := 0
		if !hold {
			// Its provider connection closed as it parked: saved then.
			savedProfiles(t, g, 1)
			saved = 1
		}
		_, code, body := dialProfile(t, g, id)
		if code != http.StatusConflict || !strings.Contains(body, `"profile":"`+id+`"`) {
			t.Fatalf("hold %v: another client of the parked session's profile: %d %s", hold, code, body)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		back, _, err := websocket.Dial(ctx, g.WS("/?bf_resume="+tok), nil)
		cancel()
		if err != nil {
			t.Fatalf("hold %v: resume: %v", hold, err)
		}
		if !strings.Contains(string(cdpCall(t, back, 3, "Storage.getCookies", nil)), site.Cookie) {
			t.Fatalf("hold %v: the resumed session's browser lacks the login", hold)
		}
		_, code, _ = dialProfile(t, g, id)
		if code != http.StatusConflict {
			t.Fatalf("hold %v: another client of the resumed session's profile: %d", hold, code)
		}
		back.Close(websocket.StatusNormalClosure, "")
		if hold {
			// Held, its client's close parks it again, the profile in
			// use; an operator ends it, and the browser is still there.
			testgw.Eventually(t, 20*time.Second, "the session parked again", func() bool { return len(g.LogEntries("session parked")) == 2 })
			if _, code, _ := dialProfile(t, g, id); code != http.StatusConflict {
				t.Fatalf("held again: another client of the profile: %d", code)
			}
			_, b, _ := g.AdminDo(http.MethodGet, status.SessionsPath, nil)
			var list status.Sessions
			json.Unmarshal(b, &list)
			held := ""
			for _, s := range list.Sessions {
				if s.Parked && fmt.Sprint(s.Options["profile"]) == id {
					held = s.ID
				}
			}
			if held == "" {
				t.Fatalf("sessions: %s", b)
			}
			if code, body, err := g.AdminDo(http.MethodDelete, status.SessionsPath+"/"+held, nil); err != nil || code != http.StatusOK {
				t.Fatalf("delete the held session: %d %s %v", code, body, err)
			}
		}
		e := savedProfiles(t, g, saved+1)
		if e["profile"] != id || e["cookies"].(float64) < 1 {
			t.Fatalf("hold %v: profile saved %v", hold, e)
		}
	}
}

// TestProfileLeftAsItWas: a session's profile over max_size is not
// written, and a session whose browser is gone (killed) before its end
// saves nothing: each time the stored blob stays byte for byte as it
// was, a "profile not saved" entry says why, and the profile is free.
func TestProfileLeftAsItWas(t *testing.T) {
	Require(t, true)
	site := startLoginSite(t)
	a := StartChromium(t)
	key := profilesKey()
	g := testgw.Start(t, handler(profilesOption(key), provider("a", a.WSURL(), "")))
	if said, _ := siteSays(t, "puppeteer", g.WS("/?bf_profile=kept"), site, "login"); said != "logged in" {
		t.Fatalf("login: %q", said)
	}
	savedProfiles(t, g, 1)
	var blobPath string
	filepath.WalkDir(g.Storage, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Base(p) == "kept" {
			blobPath = p
		}
		return nil
	})
	before, err := os.ReadFile(blobPath)
	if err != nil {
		t.Fatal(err)
	}
	unchanged := func(what string, n int) {
		t.Helper()
		profileEntry(t, g, "profile not saved", n)
		if after, _ := os.ReadFile(blobPath); string(after) != string(before) {
			t.Fatalf("%s: the blob changed", what)
		}
		for _, p := range profileList(t, g).Profiles {
			if p.InUse {
				t.Fatalf("%s: profile %s still in use", what, p.ID)
			}
		}
	}

	// Over max_size: the session is served (restored), its save refused.
	if err := g.Reload(handler(fmt.Sprintf(`"profiles":{"key":%q,"max_size":64}`, key), provider("a", a.WSURL(), ""))); err != nil {
		t.Fatal(err)
	}
	if said, token := siteSays(t, "puppeteer", g.WS("/?bf_profile=kept"), site, "check"); said != "logged in" || token != site.Token {
		t.Fatalf("over max_size: site %q, token %q", said, token)
	}
	unchanged("over max_size", 1)
	if e := g.LogEntries("profile not saved")[0]; !strings.Contains(fmt.Sprint(e["error"]), "max_size") {
		t.Fatalf("over max_size: %v", e)
	}

	// The browser killed while the session is live.
	b := StartChromium(t)
	if err := g.Reload(handler(profilesOption(key), provider("b", b.WSURL(), ""))); err != nil {
		t.Fatal(err)
	}
	c, code, _ := dialProfile(t, g, "kept")
	if code != 101 {
		t.Fatalf("at b: %d", code)
	}
	defer c.CloseNow()
	b.Kill()
	unchanged("browser gone", 2)
	if len(g.LogEntries("profile saved")) != 1 {
		t.Fatalf("saved %d times", len(g.LogEntries("profile saved")))
	}
}

// TestProfileWarmSession: a client with a profile handed a warm session
// (made before the client came, at a browser that never saw the site)
// has its profile restored in it and saved at its end.
func TestProfileWarmSession(t *testing.T) {
	Require(t, true)
	site := startLoginSite(t)
	a, b := StartChromium(t), StartChromium(t)
	key := profilesKey()
	g := testgw.Start(t, handler(profilesOption(key), provider("a", a.WSURL(), "")))
	if said, _ := siteSays(t, "puppeteer", g.WS("/?bf_profile=warm"), site, "login"); said != "logged in" {
		t.Fatalf("login: %q", said)
	}
	savedProfiles(t, g, 1)
	if err := g.Reload(handler(profilesOption(key)+`,"queue":{"size":0}`, provider("warm-b", b.HTTPURL(), `"warm":1`))); err != nil {
		t.Fatal(err)
	}
	testgw.Eventually(t, 20*time.Second, "a warm session ready", func() bool {
		p, ok := pool.Current().Lookup("warm-b")
		ready, _ := p.Warm()
		return ok && ready == 1
	})
	if said, token := siteSays(t, "pw-cdp", g.WS("/?bf_profile=warm"), site, "check"); said != "logged in" || token != site.Token {
		t.Fatalf("warm session with the profile: site %q, token %q", said, token)
	}
	testgw.Eventually(t, 20*time.Second, "two sessions ended", func() bool { return len(g.LogEntries("session ended")) >= 2 })
	if e := g.LogEntries("session ended")[1]; e["warm"] != true || e["provider"] != "warm-b" {
		t.Fatalf("the client was not handed the warm session: %v", e)
	}
	if e := savedProfiles(t, g, 2); e["profile"] != "warm" || e["cookies"].(float64) < 1 {
		t.Fatalf("saved %v", e)
	}
}

// TestProfileRecorded: a recorded session with a profile: the recording's
// participant watches the origins its pages visit, and the save reads
// their localStorage; the session is recorded as without a profile.
func TestProfileRecorded(t *testing.T) {
	Require(t, true)
	site := startLoginSite(t)
	a, b := StartChromium(t), StartChromium(t)
	key := profilesKey()
	g := testgw.Start(t, handler(profilesOption(key)+","+recordAll, provider("a", a.WSURL(), ""), provider("b", b.WSURL(), "")))
	if said, _ := siteSays(t, "puppeteer", g.WS("/?bf_profile=rec"), site, "login"); said != "logged in" {
		t.Fatalf("login: %q", said)
	}
	if e := savedProfiles(t, g, 1); e["origins"].(float64) != 1 {
		t.Fatalf("saved %v", e)
	}
	if id, _ := recordingOfEnded(t, g, 1); recordingMeta(t, g, id).Frames == 0 {
		t.Fatal("the session's recording has no frame")
	}
	drain(t, g, "a")
	if said, token := siteSays(t, "puppeteer", g.WS("/?bf_profile=rec"), site, "check"); said != "logged in" || token != site.Token {
		t.Fatalf("at b: site %q, token %q", said, token)
	}
	savedProfiles(t, g, 2)
}

// TestProfileRestoreRefused: a provider that does not take the profile
// (an echo that answers no command as a browser would) fails the
// connect: 502 naming the profile, before the client gets a session; the
// profile is free again and its blob as it was.
func TestProfileRestoreRefused(t *testing.T) {
	echo := fakes.Echo("echo", nil)
	defer echo.Close()
	keyB64 := profilesKey()
	g := testgw.Start(t, handler(profilesOption(keyB64), provider("echo", echo.URL(), "")))
	key, _ := base64.StdEncoding.DecodeString(keyB64)
	sealer, err := profiles.NewSealer(key)
	if err != nil {
		t.Fatal(err)
	}
	st := profiles.NewStore(&certmagic.FileStorage{Path: g.Storage}, sealer, 1<<20)
	p := &profiles.Profile{Cookies: []profiles.Cookie{{Name: "sid", Value: "v", Domain: "a.example", Path: "/"}},
		Origins: []profiles.Origin{{Origin: "http://a.example", Items: [][2]string{{"token", "t"}}}}}
	if _, err := st.Save(context.Background(), profiles.Name{Scope: profiles.NoScope, ID: "refused"}, p); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(g.Storage, profiles.Prefix, profiles.NoScope, "refused"))
	_, code, body := dialProfile(t, g, "refused")
	if code != http.StatusBadGateway || !strings.Contains(body, `"profile":"refused"`) || !strings.Contains(body, "could not be put into the browser") {
		t.Fatalf("restore refused: %d %s", code, body)
	}
	if l := profileList(t, g).Profiles; len(l) != 1 || l[0].InUse {
		t.Fatalf("profiles: %+v", l)
	}
	if after, _ := os.ReadFile(filepath.Join(g.Storage, profiles.Prefix, profiles.NoScope, "refused")); len(before) == 0 || string(after) != string(before) {
		t.Fatal("the blob changed")
	}
}
