package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/caddyauth"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// TestDashboardInChromium: the dashboard page in real headless Chromium,
// on the same site as the gateway behind basic_auth (controls off), and on
// a localhost-only site under a stripped prefix (controls on). The page
// shows every provider and a live Puppeteer session (on a provider that
// creates its browsers over REST: the row says the session is created and
// not released, until the session ends), a provider's warm session and
// another's creation rate; its Drain button
// drains a provider (the status JSON says so) and its End button ends the
// session (the Puppeteer client sees the disconnect). A screenshot is
// saved and must not be blank (DASHBOARD_SCREENSHOT=<file> copies it
// there, as docs/dashboard.png was made); no secret of the providers is in
// anything the browser loaded.
func TestDashboardInChromium(t *testing.T) {
	Require(t, true)
	const (
		user        = "ops"
		pass        = "dAsHbOaRd-pw7"
		secretUser  = "e2eUsEr5"
		secretPass  = "e2ePaSs9x"
		secretQuery = "e2eQuErY-t0ken"
		secretHdr   = "e2eHeAdEr-k3y"
		secretAPI   = "e2eApIkEy-0q8"
	)
	bs := StartChromiums(t, 2)
	// A provider that creates each browser over REST; its sessions are the
	// first Chromium.
	rest := fakes.NewREST(func(string) string { return bs[0].WSURL() })
	defer rest.Close()
	dead := testgw.FreePort(t) // nothing listens there

	hash, err := caddyauth.BcryptHash{}.Hash([]byte(pass))
	if err != nil {
		t.Fatal(err)
	}
	addr, ops, admin := testgw.FreePort(t), testgw.FreePort(t), testgw.FreePort(t)
	logPath := filepath.Join(t.TempDir(), "caddy.log")
	withUser := strings.Replace(bs[0].HTTPURL(), "http://", "http://"+secretUser+":"+secretPass+"@", 1)
	caddyfile := fmt.Sprintf(`{
	admin %[1]s
	log {
		output file %[2]s
		format json
	}
}

http://%[3]s {
	basic_auth /dash/* {
		%[4]s %[5]s
	}
	browser_failover_dashboard /dash/*
	browser_failover {
		client_limit {http.request.remote.host} 10
		provider dash-down ws://%[6]s/?token=%[7]s {
			priority 1
			cooldown {
				min_requests 1
				duration 5m
			}
		}
		provider dash-api %[12]s {
			priority 2
			max_concurrent 4
			session_api {
				create POST /v1/sessions
				header X-BB-API-Key %[13]s
				connect_url /connectUrl
				session_id /id
				release POST /v1/sessions/{session_id}/release
			}
		}
		provider dash-a %[8]s {
			priority 3
			max_concurrent 4
			warm 1
		}
		provider dash-b %[9]s {
			priority 4
			max_concurrent 4
			create_rate 30 per minute
			header_up X-Api-Key %[10]s
		}
	}
}

http://%[11]s {
	bind 127.0.0.1
	handle_path /ops/* {
		browser_failover_dashboard {
			controls on
		}
	}
}
`, admin, logPath, addr, user, hash, dead, secretQuery, withUser, bs[1].HTTPURL(), secretHdr, ops, rest.URL(), secretAPI)
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddy.Stop() })

	// A live Puppeteer session: dash-down fails (and cools down), dash-api
	// creates the browser and serves.
	n := StartNode(t, "client.mjs", "puppeteer-hold", "ws://"+addr+"/")
	n.Expect(t, "READY", 60*time.Second)
	sessions := pool.Current().Sessions.List()
	if len(sessions) != 1 || sessions[0].Provider != "dash-api" {
		t.Fatalf("live sessions %+v, want one on dash-api", sessions)
	}
	id := sessions[0].ID

	dir := t.TempDir()
	shot, bodies := filepath.Join(dir, "dashboard.png"), filepath.Join(dir, "loaded.txt")
	arg, _ := json.Marshal(map[string]any{
		"authURL": "http://" + addr + "/dash/", "user": user, "pass": pass,
		"controlsURL": "http://" + ops + "/ops/",
		"providers":   []string{"dash-down", "dash-api", "dash-a", "dash-b"},
		"session":     id, "drain": "dash-b", "unreleased": "dash-api",
		"warm": "dash-a", "rate": "dash-b", "rateSays": "0 of 30 started this minute",
		"screenshot": shot, "bodies": bodies,
	})
	RunNode(t, "dashboard.mjs", string(arg))

	// The Puppeteer client saw its session end.
	n.Expect(t, "DISCONNECTED", 20*time.Second)
	if err := n.Wait(t, 15*time.Second); err != nil {
		t.Fatalf("client exit: %v\n%s", err, n.Output())
	}
	testgw.Eventually(t, 10*time.Second, "the session's end in the log", func() bool {
		for _, line := range strings.Split(readFile(t, logPath), "\n") {
			var e map[string]any
			if json.Unmarshal([]byte(line), &e) == nil && e["msg"] == "session ended" && e["session_id"] == id {
				if e["close_reason"] != upstreams.EndOperator {
					t.Fatalf("session ended with %v", e["close_reason"])
				}
				return true
			}
		}
		return false
	})
	waitIdle(t, "dash-api")
	testgw.Eventually(t, 15*time.Second, "the ended session released", func() bool {
		b := rest.Books()
		return len(b.Created) == 1 && b.Balanced() == nil
	})

	// The admin API agrees that dash-b is drained.
	resp, err := http.Get("http://" + admin + "/browser_failover/status")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Providers []struct {
			Name     string `json:"name"`
			Draining bool   `json:"draining"`
		} `json:"providers"`
	}
	json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	for _, p := range st.Providers {
		if p.Draining != (p.Name == "dash-b") {
			t.Fatalf("status after the page's drain: %+v", st.Providers)
		}
	}

	// The screenshot is a real picture of the page.
	checkScreenshot(t, shot)
	if to := os.Getenv("DASHBOARD_SCREENSHOT"); to != "" {
		b, _ := os.ReadFile(shot)
		if err := os.WriteFile(to, b, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot copied to %s", to)
	}

	// Nothing the browser loaded holds a secret.
	loaded := readFile(t, bodies)
	for _, want := range []string{"<!DOCTYPE html>", `"providers":[`, `"sessions":[`, `"draining":true`, "REDACTED"} {
		if !strings.Contains(loaded, want) {
			t.Fatalf("the browser's loads do not hold %q: the secret search would prove little", want)
		}
	}
	for _, s := range []string{secretUser, secretPass, secretQuery, secretHdr, secretAPI, pass, string(hash)} {
		for _, f := range []string{s, url.QueryEscape(s), base64.StdEncoding.EncodeToString([]byte(s)), base64.StdEncoding.EncodeToString([]byte(secretUser + ":" + secretPass))} {
			if i := strings.Index(loaded, f); i >= 0 {
				t.Errorf("the dashboard showed a secret %q: …%s…", f, loaded[max(0, i-120):min(len(loaded), i+60)])
			}
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkScreenshot fails unless path is a PNG of a page with content:
// large, many colours, and no single colour covering nearly all of it.
func checkScreenshot(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	r := img.Bounds()
	if r.Dx() < 800 || r.Dy() < 400 {
		t.Fatalf("screenshot of %v", r)
	}
	counts := map[[3]uint32]int{}
	total := 0
	for y := r.Min.Y; y < r.Max.Y; y += 2 {
		for x := r.Min.X; x < r.Max.X; x += 2 {
			cr, cg, cb, _ := img.At(x, y).RGBA()
			counts[[3]uint32{cr >> 8, cg >> 8, cb >> 8}]++
			total++
		}
	}
	most := 0
	for _, c := range counts {
		most = max(most, c)
	}
	if len(counts) < 50 || most > total*95/100 {
		t.Fatalf("the screenshot looks blank: %d colours, the commonest covers %d of %d samples", len(counts), most, total)
	}
	t.Logf("screenshot %v, %d bytes, %d colours, the commonest on %d%%", r.Size(), len(b), len(counts), most*100/total)
}

// TestDashboardRecordingsInChromium: the dashboard's live view and
// recordings in real headless Chromium (js/dashboard-record.mjs, with
// Playwright), while a Puppeteer client's session through a gateway that
// records every CDP session goes on: the live view shows the client's
// page and follows its navigation and its popup; once the client has left
// the Recordings list shows the recording and its player plays, pauses,
// scrubs and switches page, and links a video; every table fits a
// 1280 px window; with controls off there is no Delete button and a
// deletion is refused, with controls on Delete deletes. A page of another
// name (DNS rebinding) is refused every one of the new documents.
func TestDashboardRecordingsInChromium(t *testing.T) {
	Require(t, true)
	chr := StartChromium(t)
	addr, ops, ro, admin := testgw.FreePort(t), testgw.FreePort(t), testgw.FreePort(t), testgw.FreePort(t)
	dead := testgw.FreePort(t) // nothing listens there
	store := t.TempDir()
	// The controls site has no host matcher: the dashboard itself judges
	// each request's Host.
	_, opsPort, _ := net.SplitHostPort(ops)
	caddyfile := fmt.Sprintf(`{
	admin %[1]s
}

http://%[2]s {
	browser_failover {
		provider rec-down ws://%[3]s/devtools/browser/a-long-path-as-providers-give-them?token=e2e-secret-t0ken {
			priority 1
			cooldown {
				min_requests 1
				duration 5m
			}
		}
		provider rec-local %[4]s {
			priority 2
			max_concurrent 4
		}
		recording {
			sessions all
			storage file_system %[5]s
		}
	}
}

http://:%[8]s {
	bind 127.0.0.1
	handle_path /ops/* {
		browser_failover_dashboard {
			controls on
		}
	}
}

http://%[7]s {
	bind 127.0.0.1
	browser_failover_dashboard /ro/*
}
`, admin, addr, dead, chr.WSURL(), store, ops, ro, opsPort)
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddy.Stop() })

	shots := t.TempDir()
	if dir := os.Getenv("DASHBOARD_SHOTS"); dir != "" {
		shots = dir
	}
	arg, _ := json.Marshal(map[string]any{
		"gateway": "ws://" + addr + "/", "controlsURL": "http://" + ops + "/ops/",
		"readonlyURL": "http://" + ro + "/ro/", "shots": shots,
	})
	out := RunNode(t, "dashboard-record.mjs", string(arg))
	_, rest, ok := strings.Cut(out, "RECORDING ")
	id, _, _ := strings.Cut(rest, "\n")
	if !ok || id == "" {
		t.Fatalf("no recording named:\n%s", out)
	}

	// A page of another name reaching this listener gets 403, and nothing
	// of a recording.
	for _, path := range []string{"/ops/live.json", "/ops/live/" + id + "/targets/0/frame", "/ops/recordings.json",
		"/ops/recordings/" + id, "/ops/recordings/" + id + "/targets/0/frames/0", "/ops/recordings/" + id + "/targets/0/video.mp4"} {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			req, _ := http.NewRequest(method, "http://"+ops+path, nil)
			req.Host = "rebound.example"
			req.Header.Set("X-Browser-Failover-Dashboard", "1")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var body struct {
				Error string `json:"error"`
			}
			json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if resp.StatusCode != 403 || !strings.Contains(body.Error, `"rebound.example"`) {
				t.Fatalf("%s %s from another name: %d %q", method, path, resp.StatusCode, body.Error)
			}
		}
	}
	// The same paths are the dashboard's for its own names: the list
	// answers (the recording is deleted by now).
	resp, err := http.Get("http://" + ops + "/ops/recordings.json")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.TrimSpace(string(b)) != `{"recordings":[]}` {
		t.Fatalf("the list after the deletion: %d %s", resp.StatusCode, b)
	}
}
