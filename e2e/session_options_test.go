package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp/remote"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
)

// TestSessionOptionsRealClients: real clients (Puppeteer, Playwright,
// chromedp) ask once for an EU browser with a German proxy and stealth.
// The first provider by priority is a Chromium in the US; a second runs
// in the EU but honours no proxy; the third, a provider creating each
// browser over REST in the EU (a fake REST API whose sessions are a real
// Chromium), honours all three: every client lands there, its create body
// carrying the options in that provider's words, and works the browser. A
// client that states none goes to the first.
func TestSessionOptionsRealClients(t *testing.T) {
	Require(t, true)
	chromes := StartChromiums(t, 3)
	us, euPlain, euAPI := chromes[0], chromes[1], chromes[2]
	rest := fakes.NewREST(func(string) string { return euAPI.WSURL() })
	defer rest.Close()
	body := `{"projectId":"e2e","region":"{bf.option.region}","browserSettings":{"advancedStealth":"{bf.option.stealth}"},` +
		`"proxies":[{"type":"residential","geolocation":{"country":"{bf.option.proxy_country}"}}]}`
	g := testgw.Start(t, handler(`"queue":{"size":0},"connect_timeout":"15s"`,
		provider("opt-us", us.HTTPURL(), `"priority":1,"region":["us-east"],"supports":["stealth","proxy_country"]`),
		provider("opt-eu-plain", euPlain.HTTPURL(), `"priority":2,"region":["eu-central"],"supports":["stealth"]`),
		provider("opt-eu-api", rest.URL(), fmt.Sprintf(`"priority":3,"region":["eu-central","eu-west"],"supports":["stealth","proxy_country"],`+
			`"option_map":{"region":{"eu-central":"eu-central-1"},"proxy_country":{"de":"DE"}},`+
			`"session_api":{"create_method":"POST","create_url":"/v1/sessions","body":%q,"connect_url":"/connectUrl","session_id":"/id",`+
			`"release_method":"POST","release_url":"/v1/sessions/{session_id}/release"}`, body))))
	q := "/?bf_region=eu-central,us-east&bf_stealth=true&bf_proxy_country=DE"

	checkResult(t, RunNode(t, "client.mjs", "puppeteer-ws", g.WS(q)), "puppeteer-ws")
	checkResult(t, RunNode(t, "client.mjs", "pw-cdp", g.WS(q)), "pw-cdp")
	runChromedp(t, g.WS(q), nil, remote.NoModifyURL)
	// A client with no options: the first provider by priority.
	checkResult(t, RunNode(t, "client.mjs", "puppeteer-ws", g.WS("/")), "puppeteer-ws")
	waitIdle(t, "opt-us", "opt-eu-plain", "opt-eu-api")

	logs := endedAtLeast(t, g, 4)
	if len(logs) != 4 {
		t.Fatalf("%d sessions ended, want 4", len(logs))
	}
	for i, l := range logs[:3] {
		if l.Provider != "opt-eu-api" || len(l.Attempts) != 1 {
			t.Fatalf("client %d: served by %s after %v, want opt-eu-api at once", i, l.Provider, l.Attempts)
		}
	}
	if logs[3].Provider != "opt-us" {
		t.Fatalf("the client without options was served by %s", logs[3].Provider)
	}
	bodies := rest.CreateBodies()
	if len(bodies) != 3 {
		t.Fatalf("%d creates, want 3", len(bodies))
	}
	for _, b := range bodies {
		var v struct {
			Region          string `json:"region"`
			BrowserSettings struct {
				AdvancedStealth any `json:"advancedStealth"`
			} `json:"browserSettings"`
			Proxies []struct {
				Geolocation struct {
					Country string `json:"country"`
				} `json:"geolocation"`
			} `json:"proxies"`
		}
		if err := json.Unmarshal(b, &v); err != nil || v.Region != "eu-central-1" || v.BrowserSettings.AdvancedStealth != true ||
			len(v.Proxies) != 1 || v.Proxies[0].Geolocation.Country != "DE" {
			t.Fatalf("create body %s: the options in the provider's words (%v)", b, err)
		}
	}
	for _, e := range g.LogEntries("session ended")[:3] {
		o, _ := e["options"].(map[string]any)
		if o["proxy_country"] != "de" || o["stealth"] != true {
			t.Fatalf("session ended entry: options %v", e["options"])
		}
	}
	// A bad option stops a real client before any provider.
	resp, err := http.Get(g.HTTP("/json/version?bf_stealth=perhaps"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("discovery with a bad option: %d", resp.StatusCode)
	}
	for _, mode := range []string{"puppeteer-ws", "pw-cdp"} {
		out := RunNodeFail(t, "client.mjs", mode, g.WS("/?bf_proxy_country=atlantis"))
		if !strings.Contains(out, "400") {
			t.Fatalf("%s with a bad option: %s", mode, out)
		}
		t.Logf("%s with a bad option: %s", mode, strings.TrimSpace(out))
	}
	if n := len(rest.CreateBodies()); n != 3 {
		t.Fatalf("%d creates after the refused clients", n)
	}
}
