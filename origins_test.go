package browserfailover_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
)

// TestForeignOriginRefused: through a real gateway, an upgrade carrying an
// Origin header (a web page opened it) is answered 403 with a JSON error
// and no provider is contacted, unless allowed_origins names that origin
// (case and the scheme's default port do not matter; null is an origin
// like any other; * allows any). Clients without Origin are unaffected.
// The rejection is logged and counted under the reason origin.
func TestForeignOriginRefused(t *testing.T) {
	contacts := &fakes.Contacts{}
	echo := fakes.Echo("or-echo", contacts)
	defer echo.Close()

	refused := func(t *testing.T, g *testgw.Gateway, origin []string) {
		t.Helper()
		contacts.Reset()
		hd := http.Header{}
		for _, o := range origin {
			hd.Add("Origin", o)
		}
		c, resp, err := dial(t, g.WS("/devtools/browser/x"), &websocket.DialOptions{HTTPHeader: hd})
		if err == nil {
			c.CloseNow()
			t.Fatalf("Origin %q: the upgrade was served", origin)
		}
		if resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Fatalf("Origin %q: %v %v, want 403", origin, err, resp)
		}
		var body struct {
			Error string `json:"error"`
		}
		b, _ := io.ReadAll(resp.Body)
		if json.Unmarshal(b, &body) != nil || !strings.Contains(body.Error, "allowed_origins") {
			t.Fatalf("Origin %q: body %s", origin, b)
		}
		if resp.Header.Get("Browser-Failover-Session") == "" {
			t.Fatalf("Origin %q: the 403 names no session", origin)
		}
		if got := contacts.List(); len(got) != 0 {
			t.Fatalf("Origin %q: providers contacted: %v", origin, got)
		}
	}
	served := func(t *testing.T, g *testgw.Gateway, origin string) {
		t.Helper()
		var opts *websocket.DialOptions
		if origin != "" {
			opts = &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {origin}}}
		}
		c, _, err := dial(t, g.WS("/"), opts)
		if err != nil {
			t.Fatalf("Origin %q: %v", origin, err)
		}
		defer c.CloseNow()
		echoOnce(t, c, []byte("hello"))
		if got := echo.LastHeader().Get("Origin"); got != "" {
			t.Fatalf("the provider got Origin %q", got)
		}
		c.Close(websocket.StatusNormalClosure, "")
	}

	g := testgw.Start(t, handler("", provider("or-echo", echo.URL(), "")))
	t.Run("default", func(t *testing.T) {
		for _, o := range [][]string{{"http://evil.example"}, {"null"}, {""}, {"http://127.0.0.1:" + strings.Split(g.Addr, ":")[1]}, {"not an origin"}} {
			refused(t, g, o)
		}
		served(t, g, "")
		// HTTP requests are not upgrades: discovery still answers.
		req, _ := http.NewRequest(http.MethodGet, g.HTTP("/json/version"), nil)
		req.Header.Set("Origin", "http://evil.example")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("discovery with an Origin: %v %v", err, resp)
		}
		resp.Body.Close()
	})

	t.Run("logged and counted", func(t *testing.T) {
		var entry map[string]any
		testgw.Eventually(t, 5*time.Second, "the rejected log entry", func() bool {
			for _, e := range g.LogEntries("rejected") {
				if e["close_reason"] == "origin" {
					entry = e
					return true
				}
			}
			return false
		})
		if entry["status"] != float64(http.StatusForbidden) || entry["session_id"] == "" {
			t.Fatalf("rejected entry %v", entry)
		}
		series, _ := opScrape(t, g)
		if n := series.get("caddy_browser_failover_rejections_total", "reason=origin"); n < 5 {
			t.Fatalf("rejections_total{reason=origin} = %v, want at least the 5 refusals above", n)
		}
	})

	t.Run("allowed_origins", func(t *testing.T) {
		if err := g.Reload(handler(`"allowed_origins":["https://app.example.com","null"]`, provider("or-echo", echo.URL(), ""))); err != nil {
			t.Fatal(err)
		}
		served(t, g, "https://app.example.com")
		served(t, g, "HTTPS://APP.example.com:443")
		served(t, g, "null")
		served(t, g, "")
		refused(t, g, []string{"https://app.example.com:8443"})
		refused(t, g, []string{"http://app.example.com"})
		refused(t, g, []string{"https://evil.example"})
		refused(t, g, []string{"https://app.example.com", "https://evil.example"})
	})

	t.Run("any", func(t *testing.T) {
		cfg := handlerOf(t, "browser_failover {\n allowed_origins *\n provider or-echo "+echo.URL()+"\n}")
		if err := g.Reload(cfg); err != nil {
			t.Fatal(err)
		}
		served(t, g, "https://evil.example")
		served(t, g, "null")
	})
}

// TestForeignOriginRefusedHTTP2: an extended CONNECT upgrade (HTTP/2)
// carrying Origin is refused the same way.
func TestForeignOriginRefusedHTTP2(t *testing.T) {
	contacts := &fakes.Contacts{}
	echo := fakes.Echo("or2-echo", contacts)
	defer echo.Close()
	g, tr := startH2(t, handler("", provider("or2-echo", echo.URL(), "")))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c, err := dialH2(ctx, tr, "https://"+g.addr+"/", http.Header{"Origin": {"https://evil.example"}}); err == nil {
		c.close()
		t.Fatal("an HTTP/2 upgrade with a foreign Origin was served")
	} else if !strings.Contains(err.Error(), "answered 403") {
		t.Fatalf("HTTP/2 upgrade with Origin: %v, want 403", err)
	}
	if got := contacts.List(); len(got) != 0 {
		t.Fatalf("providers contacted: %v", got)
	}
	c, err := dialH2(ctx, tr, "https://"+g.addr+"/", nil)
	if err != nil {
		t.Fatalf("HTTP/2 upgrade without Origin: %v", err)
	}
	c.echo(t, 2, []byte("hi"))
	c.close()
}
