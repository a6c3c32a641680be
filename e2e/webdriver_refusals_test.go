package e2e

// A client's own mistakes in a WebDriver create cost others nothing, with
// real chromedrivers: capabilities chromedriver refuses with invalid
// argument give back their create_rate start, and ones it answers
// session not created for cool no provider down.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
)

// wdCreate posts a create body to the gateway: its status and body.
func wdCreate(t *testing.T, g *testgw.Gateway, body string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.HTTP("/session"), strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

// wdError is a WebDriver error answer's code and message.
func wdError(raw []byte) (code, msg string) {
	var v struct {
		Value struct {
			Error   string `json:"error"`
			Message string `json:"message"`
		} `json:"value"`
	}
	json.Unmarshal(raw, &v)
	return v.Value.Error, v.Value.Message
}

// wdDelete ends a session created through the gateway.
func wdDelete(t *testing.T, g *testgw.Gateway, raw []byte) {
	t.Helper()
	var v struct {
		Value struct {
			SessionID string `json:"sessionId"`
		} `json:"value"`
	}
	if json.Unmarshal(raw, &v) != nil || v.Value.SessionID == "" {
		t.Fatalf("no session in %s", raw)
	}
	req, _ := http.NewRequest(http.MethodDelete, g.HTTP("/session/"+v.Value.SessionID), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// badArgument is a create chromedriver refuses with invalid argument
// (400): a pageLoadStrategy WebDriver does not know.
const badArgument = `{"capabilities":{"alwaysMatch":{"browserName":"chrome","pageLoadStrategy":"bogus"}}}`

// TestWebDriverRefusedCreatesGiveBackRate: with create_rate 3 per minute,
// three creates chromedriver refuses with invalid argument (relayed to
// their clients as they are) leave the window as they found it: the next
// create gets a session at once, its only attempt ok, the window holding
// its start alone.
func TestWebDriverRefusedCreatesGiveBackRate(t *testing.T) {
	RequireChromedriver(t)
	cd := StartChromedriver(t)
	profiles := filepath.Join(t.TempDir(), "wd-rate")
	g := testgw.Start(t, handler(`"connect_timeout":"30s","queue":{"size":10,"timeout":"5s"}`,
		provider("cd-rate", cd.URL(), `"protocol":"webdriver","create_rate":{"n":3,"per":"minute"},"capabilities":`+ChromeCapabilities(profiles))))
	for i := range 3 {
		code, raw := wdCreate(t, g, badArgument)
		if c, msg := wdError(raw); code != http.StatusBadRequest || c != "invalid argument" || !strings.Contains(msg, "pageLoadStrategy") {
			t.Fatalf("refused create %d: %d %s", i+1, code, raw)
		}
	}
	code, raw := wdCreate(t, g, `{"capabilities":{"alwaysMatch":{"browserName":"chrome"}}}`)
	if code != http.StatusOK {
		t.Fatalf("a valid create after three refused ones: %d %s", code, raw)
	}
	defer wdDelete(t, g, raw)
	testgw.Eventually(t, 10*time.Second, "the create's attempt in the log", func() bool { return len(attemptsOf(g, "cd-rate")) == 4 })
	if a := attemptsOf(g, "cd-rate"); strings.Join(a, " ") != "status_400 status_400 status_400 ok" {
		t.Fatalf("attempts %v, want three status_400 then ok (no rate skip)", a)
	}
	p := providerStatus(t, g, "cd-rate")
	if p.CreateRate == nil || p.CreateRate.Used != 1 || !p.Healthy || p.Failures != 0 {
		t.Fatalf("status %+v, create_rate %+v: want the one start in the window", p, p.CreateRate)
	}
	if bytes.Contains(raw, []byte(cd.Addr)) {
		t.Fatal("the create answer names chromedriver's address")
	}
}

// TestWebDriverSessionNotCreatedCoolsNothing: two chromedrivers, and a
// client asking for a Windows browser, five times: each create tries both
// and gets chromedriver's own session not created answer; neither
// provider counts a failure or cools down, and a create they can serve,
// right after, gets a session.
func TestWebDriverSessionNotCreatedCoolsNothing(t *testing.T) {
	RequireChromedriver(t)
	cdA, cdB := StartChromedriver(t), StartChromedriver(t)
	profiles := filepath.Join(t.TempDir(), "wd-nc")
	caps := `"capabilities":` + ChromeCapabilities(profiles)
	g := testgw.Start(t, handler(`"connect_timeout":"30s","queue":{"size":10,"timeout":"5s"},"cooldown":{"min_requests":2}`,
		provider("cd-a", cdA.URL(), `"protocol":"webdriver","priority":1,`+caps),
		provider("cd-b", cdB.URL(), `"protocol":"webdriver","priority":2,`+caps)))
	const windows = `{"capabilities":{"alwaysMatch":{"browserName":"chrome","platformName":"windows"}}}`
	for i := range 5 {
		code, raw := wdCreate(t, g, windows)
		c, msg := wdError(raw)
		if code != http.StatusInternalServerError || c != "session not created" || !strings.Contains(msg, "No matching capabilities found") {
			t.Fatalf("create %d for windows: %d %s", i+1, code, raw)
		}
	}
	for _, name := range []string{"cd-a", "cd-b"} {
		if a := attemptsOf(g, name); strings.Join(a, " ") != strings.TrimSpace(strings.Repeat("not_created ", 5)) {
			t.Fatalf("%s's attempts: %v, want five not_created", name, a)
		}
		if p := providerStatus(t, g, name); !p.Healthy || p.CooldownUntil != nil || p.Failures != 0 || p.LastError != "" {
			t.Fatalf("%s after the declined creates: %+v", name, p)
		}
	}
	code, raw := wdCreate(t, g, `{"capabilities":{"alwaysMatch":{"browserName":"chrome"}}}`)
	if code != http.StatusOK {
		t.Fatalf("a create right after: %d %s", code, raw)
	}
	wdDelete(t, g, raw)
}
