package browserfailover_test

// In-process tests of WebDriver BiDi providers and clients with fake
// providers: BiDi clients (an upgrade on /session) reach only bidi and any
// providers, CDP clients never a bidi one; 503 and 502 as for the other
// protocols; the session.end the gateway sends a provider when a BiDi
// client leaves; resume refused for BiDi sessions.

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/gateway"
	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/status"
)

// landedAt dials path with header and returns which fake provider served
// it.
func landedAt(t *testing.T, g *testgw.Gateway, contacts *fakes.Contacts, path string, header http.Header) string {
	t.Helper()
	contacts.Reset()
	c, resp, err := dial(t, g.WS(path), &websocket.DialOptions{HTTPHeader: header})
	if err != nil {
		code := 0
		if resp != nil {
			code = resp.StatusCode
		}
		t.Fatalf("dial %s: %v (status %d)", path, err, code)
	}
	echoOnce(t, c, []byte("hi"))
	c.Close(websocket.StatusNormalClosure, "")
	list := contacts.List()
	if len(list) == 0 {
		t.Fatal("no provider contacted")
	}
	// A bidi provider takes one session at a time by default: the next
	// client waits for this one's end.
	name := list[len(list)-1]
	testgw.Eventually(t, 10*time.Second, name+"'s session to end", func() bool { return active(name) == 0 })
	return name
}

// refusedAt dials path and returns the status of the refusal.
func refusedAt(t *testing.T, g *testgw.Gateway, path string) int {
	t.Helper()
	// A fresh connection: a refused upgrade's connection may be kept
	// alive, and one kept from before a reload is served by the old
	// config's handler.
	noReuse := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	c, resp, err := dial(t, g.WS(path), &websocket.DialOptions{HTTPClient: noReuse})
	if err == nil {
		c.CloseNow()
		t.Fatalf("dial %s: got a session, want a refusal", path)
	}
	if resp == nil {
		t.Fatalf("dial %s: no answer: %v", path, err)
	}
	return resp.StatusCode
}

// TestBiDiPools: BiDi clients land on bidi providers (or any), whatever the
// priorities and however their /session path is written; CDP and
// Playwright clients never on a bidi provider. With the CDP providers
// drained a CDP client gets 503 at once, and with no provider of its kind
// at all, a client gets 502; the bidi provider is never tried for it.
func TestBiDiPools(t *testing.T) {
	contacts := &fakes.Contacts{}
	ff := fakes.Echo("bd-ff", contacts)
	defer ff.Close()
	cdp := fakes.Echo("bd-cdp", contacts)
	defer cdp.Close()
	anyp := fakes.Echo("bd-any", contacts)
	defer anyp.Close()
	g := testgw.Start(t, handler(`"queue":{"size":10,"timeout":"20s"}`,
		provider("bd-cdp", cdp.URL(), `"priority":1,"protocol":"cdp"`),
		provider("bd-ff", ff.URL(), `"priority":2,"protocol":"bidi"`),
		provider("bd-any", anyp.URL(), `"priority":3`)))

	for _, path := range []string{"/session", "/session/", "/SESSION?x=/devtools", "/firefox/session", "/session/8f1c"} {
		if got := landedAt(t, g, contacts, path, nil); got != "bd-ff" {
			t.Errorf("BiDi client on %s landed on %s, want bd-ff", path, got)
		}
	}
	for _, path := range []string{"/", "/devtools/browser/abc", "/sessions", "/?next=/session"} {
		if got := landedAt(t, g, contacts, path, nil); got != "bd-cdp" {
			t.Errorf("CDP client on %s landed on %s, want bd-cdp", path, got)
		}
	}
	if got := landedAt(t, g, contacts, "/session", playwrightHeaders("1.65.1")); got != "bd-any" {
		t.Errorf("Playwright client on /session landed on %s, want bd-any", got)
	}
	// The bidi provider busy (drained here): a BiDi client goes on to the
	// any provider; a CDP client with its providers drained never gets
	// the bidi one.
	drain(t, g, "bd-ff")
	if got := landedAt(t, g, contacts, "/session", nil); got != "bd-any" {
		t.Errorf("BiDi client with bd-ff drained landed on %s, want bd-any", got)
	}
	drain(t, g, "bd-cdp")
	drain(t, g, "bd-any")
	undrain(t, g, "bd-ff")
	contacts.Reset()
	start := time.Now()
	if code := refusedAt(t, g, "/"); code != http.StatusServiceUnavailable {
		t.Errorf("CDP client with the CDP providers drained got %d, want 503", code)
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Errorf("the CDP client waited %v for an answer", waited)
	}
	if l := contacts.List(); len(l) != 0 {
		t.Errorf("contacted %v", l)
	}
	if got := landedAt(t, g, contacts, "/session", nil); got != "bd-ff" {
		t.Errorf("BiDi client landed on %s, want bd-ff", got)
	}

	// No provider for the client's kind: 502.
	g2 := testgw.Start(t, handler(`"queue":{"size":10,"timeout":"20s"}`,
		provider("bd-cdp", cdp.URL(), `"protocol":"cdp"`)))
	contacts.Reset()
	if code := refusedAt(t, g2, "/session"); code != http.StatusBadGateway {
		t.Errorf("BiDi client without a bidi provider got %d, want 502", code)
	}
	if err := g2.Reload(handler("", provider("bd-ff", ff.URL(), `"protocol":"bidi"`))); err != nil {
		t.Fatal(err)
	}
	if code := refusedAt(t, g2, "/"); code != http.StatusBadGateway {
		t.Errorf("CDP client with only a bidi provider got %d, want 502", code)
	}
	if l := contacts.List(); len(l) != 0 {
		t.Errorf("contacted %v", l)
	}
}

func drain(t *testing.T, g *testgw.Gateway, name string)   { providerAction(t, g, name, "drain") }
func undrain(t *testing.T, g *testgw.Gateway, name string) { providerAction(t, g, name, "undrain") }

func providerAction(t *testing.T, g *testgw.Gateway, name, action string) {
	t.Helper()
	code, b, err := g.AdminDo(http.MethodPost, status.ProvidersPath+name+"/"+action, nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("%s %s: %d %s (%v)", action, name, code, b, err)
	}
}

// bidiFake is a provider that speaks just enough WebDriver BiDi: it answers
// every command with a success of the same ID, and records the commands it
// got and how its connections ended.
type bidiFake struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []string // method and id of each command
	// ended gets the close status of each connection.
	ended chan websocket.StatusCode
}

func newBiDiFake(t *testing.T) *bidiFake {
	f := &bidiFake{ended: make(chan websocket.StatusCode, 10)}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			_, msg, err := c.Read(context.Background())
			if err != nil {
				f.ended <- websocket.CloseStatus(err)
				return
			}
			var cmd struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			json.Unmarshal(msg, &cmd)
			f.mu.Lock()
			f.got = append(f.got, cmd.Method+" "+string(cmd.ID))
			f.mu.Unlock()
			c.Write(context.Background(), websocket.MessageText, []byte(`{"type":"success","id":`+string(cmd.ID)+`,"result":{}}`))
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *bidiFake) URL() string { return "ws" + strings.TrimPrefix(f.srv.URL, "http") + "/session" }

func (f *bidiFake) commands() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.got...)
}

// waitEnded waits for one connection of the fake to end and returns its
// close status.
func (f *bidiFake) waitEnded(t *testing.T) websocket.StatusCode {
	t.Helper()
	select {
	case code := <-f.ended:
		return code
	case <-time.After(10 * time.Second):
		t.Fatal("the provider's connection did not end")
	}
	return 0
}

// TestBiDiSessionEnd: a BiDi client that leaves, by its close frame or by
// dropping its connection, does not leave the provider's session behind:
// the provider gets the gateway's own session.end, then the client's close
// code. A client that ended its session itself gets the same (Firefox
// answers it with an error, harmless). The sessions list shows the
// session's protocol as bidi; a CDP client's provider gets nothing of the
// kind.
func TestBiDiSessionEnd(t *testing.T) {
	ff := newBiDiFake(t)
	g := testgw.Start(t, handler("", provider("se-ff", ff.URL(), `"protocol":"bidi"`)))
	ctx := context.Background()
	farewellIDs := map[string]bool{}
	for _, how := range []string{"close frame", "dropped"} {
		t.Run(how, func(t *testing.T) {
			c, _, err := dial(t, g.WS("/session"), nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Write(ctx, websocket.MessageText, []byte(`{"id":1,"method":"session.new","params":{"capabilities":{}}}`)); err != nil {
				t.Fatal(err)
			}
			if _, msg, err := c.Read(ctx); err != nil || !strings.Contains(string(msg), `"id":1`) {
				t.Fatalf("session.new: %s %v", msg, err)
			}
			ss := sessionsOf(t, g)
			if len(ss) != 1 || ss[0].Protocol != "bidi" {
				t.Fatalf("sessions list %+v, want one bidi session", ss)
			}
			want := websocket.StatusGoingAway
			if how == "close frame" {
				want = websocket.StatusCode(4000)
				c.Close(want, "done")
			} else {
				c.CloseNow()
			}
			if code := ff.waitEnded(t); code != want {
				t.Errorf("the provider's connection ended with %d, want %d", code, want)
			}
			// The gateway's session.end has an ID of its own, in the
			// upper half of those BiDi allows, another for each session.
			cmds := ff.commands()
			if len(cmds) < 2 || cmds[len(cmds)-2] != "session.new 1" {
				t.Fatalf("the provider got %v, want session.new then the gateway's session.end", cmds)
			}
			id, ok := strings.CutPrefix(cmds[len(cmds)-1], "session.end ")
			n, err := strconv.ParseInt(id, 10, 64)
			if !ok || err != nil || n < 1<<52 || n > 1<<53-1 || farewellIDs[id] {
				t.Errorf("the provider got %v, want session.new then the gateway's session.end with an ID of its own", cmds)
			}
			farewellIDs[id] = true
			testgw.Eventually(t, 10*time.Second, "the session to end", func() bool { return len(sessionsOf(t, g)) == 0 })
		})
	}

	// A CDP client's provider gets no session.end.
	cdp := newBiDiFake(t)
	if err := g.Reload(handler("", provider("se-cdp", strings.TrimSuffix(cdp.URL(), "/session")+"/", `"protocol":"cdp"`))); err != nil {
		t.Fatal(err)
	}
	c, _, err := dial(t, g.WS("/devtools/browser/x"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Write(ctx, websocket.MessageText, []byte(`{"id":1,"method":"Browser.getVersion"}`))
	c.Read(ctx)
	c.CloseNow()
	cdp.waitEnded(t)
	if cmds := cdp.commands(); len(cmds) != 1 {
		t.Errorf("a CDP provider got %v, want the client's command only", cmds)
	}
}

// sessionsOf reads the admin API's sessions list.
func sessionsOf(t *testing.T, g *testgw.Gateway) []status.Session {
	t.Helper()
	code, b, err := g.AdminDo(http.MethodGet, status.SessionsPath, nil)
	var l status.Sessions
	if err != nil || code != http.StatusOK || json.Unmarshal(b, &l) != nil {
		t.Fatalf("sessions list: %d %s (%v)", code, b, err)
	}
	return l.Sessions
}

// TestBiDiNotResumable: with resume on, a BiDi client's resume token on its
// first connect is accepted and ignored (its session is not resumable, so
// none is handed out either), and a resume on /session is answered 410.
func TestBiDiNotResumable(t *testing.T) {
	ff := newBiDiFake(t)
	g := testgw.Start(t, handler(`"resume":{"window":"30s"}`, provider("rs-ff", ff.URL(), `"protocol":"bidi"`)))
	token := strings.Repeat("A", 30)
	c, resp, err := dial(t, g.WS("/session?"+gateway.ResumeTokenQuery+"="+token), nil)
	if err != nil {
		t.Fatalf("a BiDi client with a resume token: %v", err)
	}
	if h := resp.Header.Get(gateway.ResumeTokenHeader); h != "" {
		t.Errorf("a BiDi session was handed resume token %q", h)
	}
	c.CloseNow()
	ff.waitEnded(t)
	testgw.Eventually(t, 10*time.Second, "the session to end", func() bool { return len(sessionsOf(t, g)) == 0 })
	if code := refusedAt(t, g, "/session?"+gateway.ResumeQuery+"="+token); code != http.StatusGone {
		t.Errorf("a BiDi resume got %d, want 410", code)
	}
}
