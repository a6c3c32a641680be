package browserfailover_test

// Session options: a client states a region, a proxy country, stealth…
// once; the gateway offers it only providers that honour them, its first
// region's first, and sends each one the options in its own words.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/options"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// optionsGateway runs three providers: us-plain (us-east, honours no
// other option, tried first), eu-api (eu-central over a session API
// whose create body and URL translate the options, as Browserbase's
// would) and eu-ws (eu-central, its URL query and headers translate them,
// as Steel's and browserless's would).
func optionsGateway(t *testing.T) (g *testgw.Gateway, us, euWS, apiEcho *fakes.Server, api *fakes.REST) {
	us = fakes.Echo("us-plain", nil)
	t.Cleanup(us.Close)
	euWS = fakes.Echo("eu-ws", nil)
	t.Cleanup(euWS.Close)
	api, apiEcho = echoREST(t)
	body := `{"projectId":"p1","region":"{bf.option.region}","browserSettings":{"advancedStealth":"{bf.option.stealth}","solveCaptchas":"{bf.option.solve_captchas}"},` +
		`"proxies":"{bf.option.proxy_country}","timeout":"{bf.option.timeout}","note":"in {bf.option.region}"}`
	apiJSON := fmt.Sprintf(`{"name":"eu-api","url":%q,"priority":2,"region":["eu-central"],"supports":["stealth","proxy_country","timeout"],`+
		`"option_map":{"region":{"eu-central":"eu-central-1"}},`+
		`"session_api":{"create_method":"POST","create_url":"/v1/sessions?country={bf.option.proxy_country}&rec={bf.option.record}&k=1",`+
		`"body":%q,"connect_url":"/connectUrl","session_id":"/id","release_method":"POST","release_url":"/v1/sessions/{session_id}/release"}}`, api.URL(), body)
	wsJSON := fmt.Sprintf(`{"name":"eu-ws","url":%q,"priority":3,"region":["eu-central","eu-west"],"supports":["stealth","proxy_country","solve_captchas"],`+
		`"option_map":{"region":{"eu-central":"ams"},"stealth":{"true":"advanced"}},`+
		`"headers_up":[{"op":"set","field":"X-Region","value":"{bf.option.region}"},{"op":"set","field":"X-Captcha","value":"{bf.option.solve_captchas}"}]}`,
		euWS.URL()+"?token=t1&region={bf.option.region}&stealth={bf.option.stealth}&useProxy={bf.option.proxy_country}")
	usJSON := fmt.Sprintf(`{"name":"us-plain","url":%q,"priority":1,"region":["us-east"],"pass_query":true}`, us.URL())
	g = testgw.Start(t, handler(`"queue":{"size":0},"forward_headers":["*"]`, usJSON, apiJSON, wsJSON))
	return g, us, euWS, apiEcho, api
}

// apiBody is eu-api's create body, parsed back.
type apiBody struct {
	ProjectID       string `json:"projectId"`
	Region          any    `json:"region"`
	BrowserSettings struct {
		AdvancedStealth any `json:"advancedStealth"`
		SolveCaptchas   any `json:"solveCaptchas"`
	} `json:"browserSettings"`
	Proxies any    `json:"proxies"`
	Timeout any    `json:"timeout"`
	Note    string `json:"note"`
}

func TestSessionOptionsRouteAndTranslate(t *testing.T) {
	g, us, euWS, apiEcho, api := optionsGateway(t)

	// An EU browser, stealthy, with a German proxy: us-plain is tried
	// first otherwise, but runs in the US; eu-api comes first in the EU.
	c, _, err := dial(t, g.WS("/?a=1&bf_region=eu-central,us-east&bf_stealth=true&bf_proxy_country=DE&bf_timeout=10m"), nil)
	if err != nil {
		t.Fatal(err)
	}
	echoOnce(t, c, []byte("eu"))
	if us.Hits.Load() != 0 || euWS.Hits.Load() != 0 {
		t.Fatalf("us-plain %d, eu-ws %d contacts: only eu-api honours all", us.Hits.Load(), euWS.Hits.Load())
	}
	var b apiBody
	if err := json.Unmarshal(api.CreateBodies()[0], &b); err != nil {
		t.Fatalf("create body %s: %v", api.CreateBodies()[0], err)
	}
	if b.Region != "eu-central-1" || b.BrowserSettings.AdvancedStealth != true || b.Proxies != "de" || b.Timeout != float64(600) ||
		b.BrowserSettings.SolveCaptchas != nil || b.Note != "in eu-central-1" || b.ProjectID != "p1" {
		t.Fatalf("create body in the provider's words: %s", api.CreateBodies()[0])
	}
	reqs := api.Requests()
	if len(reqs) == 0 || reqs[0] != "POST /v1/sessions?country=de&k=1" {
		t.Fatalf("create call %q: the country rendered, the unset record left out", reqs)
	}
	// Nothing of the options reaches the browser itself.
	if h := apiEcho.LastHeader(); h.Get("Browser-Failover-Options") != "" {
		t.Fatalf("the options header went on: %v", h)
	}
	// The session's entry and its end say what it was asked for.
	sessions := listSessions(t, g.Admin)
	if len(sessions) != 1 || sessions[0].Options["proxy_country"] != "de" || sessions[0].Options["stealth"] != true ||
		fmt.Sprint(sessions[0].Options["region"]) != "[eu-central us-east]" || sessions[0].Options["timeout"] != "10m0s" {
		t.Fatalf("the session's options: %+v", sessions)
	}
	c.Close(websocket.StatusNormalClosure, "")
	entry := sessionEntry(t, g, "eu-api")
	if o, _ := entry["options"].(map[string]any); o["proxy_country"] != "de" || o["stealth"] != true {
		t.Fatalf("session ended entry options: %v", entry["options"])
	}

	// The same in the header, eu-api failing: failover to eu-ws, which
	// gets them in its words, in its query and its headers.
	api.OnCreate = func(w http.ResponseWriter, r *http.Request) bool {
		http.Error(w, "down", http.StatusInternalServerError)
		return true
	}
	c, _, err = dial(t, g.WS("/"), &websocket.DialOptions{HTTPHeader: http.Header{"Browser-Failover-Options": {"region=eu-central us-east, stealth=1", "proxy_country=de"}}})
	if err != nil {
		t.Fatal(err)
	}
	echoOnce(t, c, []byte("eu-ws"))
	q := queryOf(t, euWS.LastURI())
	if q.Get("region") != "ams" || q.Get("stealth") != "advanced" || q.Get("useProxy") != "de" || q.Get("token") != "t1" {
		t.Fatalf("eu-ws query %q", euWS.LastURI())
	}
	h := euWS.LastHeader()
	if h.Get("X-Region") != "ams" || h.Values("X-Captcha") != nil || h.Get("Browser-Failover-Options") != "" {
		t.Fatalf("eu-ws headers %v: region in its words, the unset captcha header not sent, the options header not passed on", h)
	}
	c.Close(websocket.StatusNormalClosure, "")

	// Only a region, eu-api still failing: eu-ws gets no item for what
	// was not asked; eu-api's body had null for it.
	c, _, err = dial(t, g.WS("/?bf_region=eu-central"), nil)
	if err != nil {
		t.Fatal(err)
	}
	echoOnce(t, c, []byte("eu-ws"))
	q = queryOf(t, euWS.LastURI())
	if q.Get("region") != "ams" || q.Has("stealth") || q.Has("useProxy") {
		t.Fatalf("eu-ws query %q: unset options are left out", euWS.LastURI())
	}
	bodies := api.CreateBodies()
	var nb apiBody
	if err := json.Unmarshal(bodies[len(bodies)-1], &nb); err != nil || nb.Region != "eu-central-1" || nb.BrowserSettings.AdvancedStealth != nil || nb.Proxies != nil || nb.Timeout != nil {
		t.Fatalf("create body with only a region: %s (%v)", bodies[len(bodies)-1], err)
	}
	c.Close(websocket.StatusNormalClosure, "")

	// Regions in order: us-east first now, and us-plain takes it (its
	// client query passes on without the bf_ items).
	c, _, err = dial(t, g.WS("/?x=2&bf_region=us-east,eu-central&bf_record=false"), nil)
	if err != nil {
		t.Fatal(err)
	}
	echoOnce(t, c, []byte("us"))
	if us.Hits.Load() != 1 || us.LastURI() != "/?x=2" {
		t.Fatalf("us-plain contacts %d, URI %q", us.Hits.Load(), us.LastURI())
	}
	c.Close(websocket.StatusNormalClosure, "")
}

func TestSessionOptionsRefused(t *testing.T) {
	g, us, euWS, _, api := optionsGateway(t)
	contacts := func() int64 { return us.Hits.Load() + euWS.Hits.Load() + int64(len(api.Requests())) }

	// Bad options: 400 naming the option, before any provider.
	for _, tc := range []struct {
		path   string
		header string
		option string
	}{
		{"/?bf_colour=red", "", "bf_colour"},
		{"/?bf_stealth=yes", "", "bf_stealth"},
		{"/?bf_proxy_country=xx", "", "bf_proxy_country"},
		{"/?bf_timeout=48h", "", "bf_timeout"},
		{"/?bf_stealth=1", "stealth=0", "stealth"},
		{"/", "region", "region"},
		{"/", "stealth=1," + strings.Repeat("x", 2000), ""},
	} {
		hd := http.Header{}
		if tc.header != "" {
			hd.Set("Browser-Failover-Options", tc.header)
		}
		code, body := upgradeAnswer(t, g, tc.path, hd)
		var b struct {
			Error  string `json:"error"`
			Option string `json:"option"`
		}
		json.Unmarshal(body, &b)
		if code != http.StatusBadRequest || b.Option != tc.option || b.Error == "" {
			t.Errorf("%s %q: %d %s, want 400 naming %q", tc.path, tc.header, code, body, tc.option)
		}
	}
	// The discovery answer refuses them too, and hands good ones on.
	resp, err := http.Get(g.HTTP("/json/version?bf_stealth=maybe"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("discovery with a bad option: %d", resp.StatusCode)
	}
	resp, err = http.Get(g.HTTP("/json/version?bf_stealth=1"))
	if err != nil {
		t.Fatal(err)
	}
	var dv struct {
		URL string `json:"webSocketDebuggerUrl"`
	}
	json.NewDecoder(resp.Body).Decode(&dv)
	resp.Body.Close()
	if !strings.HasSuffix(dv.URL, "/?bf_stealth=1") {
		t.Fatalf("discovery URL %q", dv.URL)
	}

	// Options no provider could ever honour: 502 at once, naming them
	// and listing what each provider lacks.
	code, body := upgradeAnswer(t, g, "/?bf_region=ap-south&bf_record=1", nil)
	var b struct {
		Error       string `json:"error"`
		Unsupported []struct {
			Provider string   `json:"provider"`
			Lacks    []string `json:"lacks"`
		} `json:"unsupported"`
	}
	json.Unmarshal(body, &b)
	if code != http.StatusBadGateway || !strings.Contains(b.Error, "region, record") || len(b.Unsupported) != 3 {
		t.Fatalf("unservable options: %d %s", code, body)
	}
	if n := contacts(); n != 0 {
		t.Fatalf("%d provider contacts for refused clients", n)
	}

	// Providers that could honour them all failing: 503, the others
	// listed as unsupported.
	api.OnCreate = func(w http.ResponseWriter, r *http.Request) bool {
		http.Error(w, "down", http.StatusInternalServerError)
		return true
	}
	euWS.Close()
	code, body = upgradeAnswer(t, g, "/?bf_stealth=1", nil)
	json.Unmarshal(body, &b)
	if code != http.StatusServiceUnavailable || len(b.Unsupported) != 1 || b.Unsupported[0].Provider != "us-plain" || fmt.Sprint(b.Unsupported[0].Lacks) != "[stealth]" {
		t.Fatalf("503 with options: %d %s", code, body)
	}
	if us.Hits.Load() != 0 {
		t.Fatal("us-plain was tried for a stealth client")
	}
}

// upgradeAnswer sends an upgrade to path and returns the status and body
// of the answer.
func upgradeAnswer(t *testing.T, g *testgw.Gateway, path string, h http.Header) (int, []byte) {
	t.Helper()
	_, resp, err := dial(t, g.WS(path), &websocket.DialOptions{HTTPHeader: h})
	if err == nil {
		t.Fatalf("%s: upgraded", path)
	}
	if resp == nil {
		t.Fatalf("%s: %v", path, err)
	}
	var buf strings.Builder
	if resp.Body != nil {
		b := make([]byte, 64<<10)
		for {
			n, err := resp.Body.Read(b)
			buf.Write(b[:n])
			if err != nil {
				break
			}
		}
	}
	return resp.StatusCode, []byte(buf.String())
}

// queryOf parses a request URI's query.
func queryOf(t *testing.T, uri string) url.Values {
	t.Helper()
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		t.Fatal(err)
	}
	return u.Query()
}

// A WebDriver create states its options as the bf:options capability (or
// as query items and the header); a webdriver provider gets them in its
// capabilities template, and never the capability itself.
func TestSessionOptionsWebDriver(t *testing.T) {
	us := fakes.NewWebDriver("")
	defer us.Close()
	eu := fakes.NewWebDriver("")
	defer eu.Close()
	g := testgw.Start(t, handler("",
		wdProvider("wd-us", us.URL(), `"priority":1,"region":["us-east"]`),
		wdProvider("wd-eu", eu.URL(), `"priority":2,"region":["eu-central"],"supports":["stealth","record"],"option_map":{"region":{"eu-central":"eu-central-1"}},`+
			`"capabilities":{"cloud:options":{"region":"{bf.option.region}","stealth":"{bf.option.stealth}","video":"{bf.option.record}","captchas":"{bf.option.solve_captchas}"}}`)))
	body := newSession("chrome", false)
	always := body["capabilities"].(map[string]any)["alwaysMatch"].(map[string]any)
	always["bf:options"] = map[string]any{"region": []string{"eu-central"}, "stealth": true, "record": "1"}
	code, v, _ := wdCall(t, http.MethodPost, g.HTTP("/session"), body, nil)
	if code != 200 {
		t.Fatalf("create: %d %v", code, v)
	}
	if len(us.Requests()) != 0 {
		t.Fatal("wd-us was asked for an EU browser")
	}
	reqs := eu.Requests()
	if len(reqs) != 1 || strings.Contains(string(reqs[0].Body), "bf:options") {
		t.Fatalf("create at wd-eu: %+v", reqs)
	}
	var sent struct {
		Capabilities struct {
			AlwaysMatch map[string]json.RawMessage `json:"alwaysMatch"`
		} `json:"capabilities"`
	}
	json.Unmarshal(reqs[0].Body, &sent)
	if got := string(sent.Capabilities.AlwaysMatch["cloud:options"]); got != `{"captchas":null,"region":"eu-central-1","stealth":true,"video":true}` {
		t.Fatalf("the provider's capabilities: %s", got)
	}
	id, _ := v["sessionId"].(string)
	if ss := sessionsList(t, g); len(ss) != 1 || ss[0].Options["stealth"] != true {
		t.Fatalf("sessions %+v", ss)
	}
	wdCall(t, http.MethodDelete, g.HTTP("/session/"+id), nil, nil)

	// A bad capability, or one stated twice: invalid argument, 400,
	// before any provider.
	for _, opts := range []any{map[string]any{"stealth": "sometimes"}, []int{1}, map[string]any{"colour": "red"}} {
		always["bf:options"] = opts
		code, v, _ = wdCall(t, http.MethodPost, g.HTTP("/session"), body, nil)
		if code != http.StatusBadRequest || v["error"] != "invalid argument" {
			t.Errorf("bf:options %v: %d %v", opts, code, v)
		}
	}
	always["bf:options"] = map[string]any{"stealth": true}
	code, v, _ = wdCall(t, http.MethodPost, g.HTTP("/session?bf_stealth=0"), body, nil)
	if code != http.StatusBadRequest || !strings.Contains(v["message"].(string), "stealth given twice") {
		t.Errorf("stated twice: %d %v", code, v)
	}
	if n := len(us.Requests()) + len(eu.Requests()); n != 2 {
		t.Fatalf("%d provider requests, want only the first create and its delete", n)
	}
	// Nothing here records video in the US.
	delete(always, "bf:options")
	code, v, _ = wdCall(t, http.MethodPost, g.HTTP("/session?bf_region=us-east&bf_record=true"), body, nil)
	if code != http.StatusInternalServerError || v["error"] != "session not created" || !strings.Contains(v["message"].(string), "record") {
		t.Fatalf("unservable options: %d %v", code, v)
	}
}

// A resumed session keeps its provider and the options it was made with,
// whatever the resuming client states.
func TestSessionOptionsResume(t *testing.T) {
	a := startFakeBrowser(t, "ro-eu", nil, false)
	b := startFakeBrowser(t, "ro-us", nil, false)
	g := testgw.Start(t, handler(`"resume":{"window":"1m"}`,
		provider("ro-us", b.url(), `"priority":1,"region":["us-east"]`),
		provider("ro-eu", a.url(), `"priority":2,"region":["eu-central"],"supports":["stealth"]`)))
	c, id, tok := resumeConnect(t, g.WS("/?bf_region=eu-central&bf_stealth=1"), nil)
	if got := ask(t, c, "who"); got != "ro-eu" {
		t.Fatalf("served by %s", got)
	}
	c.CloseNow()
	waitParked(t, g, id)
	if ss := listSessions(t, g.Admin); len(ss) != 1 || !ss[0].Parked || ss[0].Options["stealth"] != true {
		t.Fatalf("the parked session: %+v", ss)
	}
	c2, id2, _ := resumeConnect(t, g.WS("/?bf_resume="+tok), nil)
	if got := ask(t, c2, "who"); got != "ro-eu" {
		t.Fatalf("resumed at %s", got)
	}
	ss := listSessions(t, g.Admin)
	if len(ss) != 1 || ss[0].ID != id2 || ss[0].Options["stealth"] != true || fmt.Sprint(ss[0].Options["region"]) != "[eu-central]" {
		t.Fatalf("the resumed session: %+v", ss)
	}
	c2.Close(websocket.StatusNormalClosure, "")
}

// TestRegionsExampleChoice: the providers examples/regions.Caddyfile
// declares, and who of them may serve the clients docs/providers.md
// describes.
func TestRegionsExampleChoice(t *testing.T) {
	b, err := os.ReadFile("examples/regions.Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	out, err := adapt(t, string(b))
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		Providers []upstreams.Config `json:"providers"`
	}
	if err := json.Unmarshal([]byte(handlerIn(t, out)), &h); err != nil {
		t.Fatal(err)
	}
	providers := h.Providers
	if len(providers) != 5 {
		t.Fatalf("%d providers", len(providers))
	}
	may := func(q string) []string {
		s, _, err := options.FromRequest(q, nil)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range providers {
			h := p.Honours()
			if len(h.Lacks(s)) == 0 {
				names = append(names, p.Name)
			}
		}
		return names
	}
	if got := fmt.Sprint(may("bf_region=eu-central,us-east&bf_stealth=true&bf_proxy_country=de")); got != "[hyperbrowser]" {
		t.Errorf("EU, German proxy, stealth: %s", got)
	}
	if got := fmt.Sprint(may("bf_region=eu-central,us-east&bf_stealth=true")); got != "[browserbase hyperbrowser browserless-ams]" {
		t.Errorf("stealth in eu-central or us-east: %s", got)
	}
	if got := fmt.Sprint(may("")); got != "[browserbase steel hyperbrowser browserless-ams local]" {
		t.Errorf("no options: %s", got)
	}
}

// A WebDriver session's BiDi socket is opened with its provider's
// header_up rendering the options its create stated, as the create's was.
func TestSessionOptionsWebDriverSocket(t *testing.T) {
	f := fakes.NewWebDriver("")
	defer f.Close()
	g := testgw.Start(t, handler("", wdProvider("wd-opt", f.URL(), `"supports":["stealth"],`+
		`"headers_up":[{"op":"set","field":"X-Stealth","value":"{bf.option.stealth}"}]`)))
	body := newSession("chrome", true)
	body["capabilities"].(map[string]any)["alwaysMatch"].(map[string]any)["bf:options"] = map[string]any{"stealth": true}
	code, v, _ := wdCall(t, http.MethodPost, g.HTTP("/session"), body, nil)
	if code != 200 {
		t.Fatalf("create: %d %v", code, v)
	}
	url, _ := v["capabilities"].(map[string]any)["webSocketUrl"].(string)
	c, _, err := dial(t, url, nil)
	if err != nil {
		t.Fatalf("socket %s: %v", url, err)
	}
	echoOnce(t, c, []byte(`{"id":1,"method":"session.status","params":{}}`))
	c.Close(websocket.StatusNormalClosure, "")
	var create, socket string
	for _, r := range f.Requests() {
		switch {
		case r.Method == http.MethodPost && r.URI == "/session":
			create = r.Header.Get("X-Stealth")
		case r.Header.Get("Upgrade") != "":
			socket = r.Header.Get("X-Stealth")
		}
	}
	if create != "true" || socket != "true" {
		t.Fatalf("X-Stealth at the create %q, at the socket %q: want true at both", create, socket)
	}
	wdCall(t, http.MethodDelete, g.HTTP("/session/"+v["sessionId"].(string)), nil, nil)
}
