package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// FirefoxPath is the Firefox the BiDi tests start ($E2E_FIREFOX
// overrides): Debian's firefox-esr.
func FirefoxPath() string {
	if p := os.Getenv("E2E_FIREFOX"); p != "" {
		return p
	}
	return "/usr/bin/firefox-esr"
}

// RequireFirefox is Require for the WebDriver BiDi tests: it also needs
// Firefox, and skips without it (setup.sh installs it), or fails under
// CI=true.
func RequireFirefox(t testing.TB) {
	t.Helper()
	Require(t, true)
	if _, err := os.Stat(FirefoxPath()); err != nil {
		msg := fmt.Sprintf("WebDriver BiDi e2e tests: missing %s; run e2e/setup.sh", FirefoxPath())
		if os.Getenv("CI") == "true" {
			t.Fatal(msg + " (CI=true: not skipping)")
		}
		t.Skip(msg)
	}
}

// Firefox is a headless Firefox serving WebDriver BiDi on a loopback port.
type Firefox struct {
	// Addr is 127.0.0.1:port of its remote agent.
	Addr string
	p    *proc
}

// WSURL is its WebDriver BiDi endpoint, ws://127.0.0.1:port/session.
func (f *Firefox) WSURL() string { return "ws://" + f.Addr + "/session" }

// HTTPURL is its remote agent's http:// URL.
func (f *Firefox) HTTPURL() string { return "http://" + f.Addr }

// Kill ends the browser at once (SIGKILL to its whole process group).
func (f *Firefox) Kill() { f.p.kill() }

// Output is the tail of the browser's output.
func (f *Firefox) Output() string { return f.p.Output() }

// StartFirefox starts a headless Firefox with a fresh profile, its remote
// agent on a port of its choosing (--remote-debugging-port 0, read back
// from the profile's WebDriverBiDiServer.json), waits until the agent
// answers GET /, and kills it at cleanup.
func StartFirefox(t testing.TB) *Firefox {
	t.Helper()
	profile, err := os.MkdirTemp("", "e2e-firefox-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := 0; i < 20 && os.RemoveAll(profile) != nil; i++ {
			time.Sleep(50 * time.Millisecond)
		}
	})
	// Nothing to fetch: the machine may have no network.
	prefs := `user_pref("app.update.enabled", false);
user_pref("browser.shell.checkDefaultBrowser", false);
user_pref("datareporting.policy.dataSubmissionEnabled", false);
user_pref("toolkit.telemetry.enabled", false);
user_pref("network.captive-portal-service.enabled", false);
user_pref("browser.safebrowsing.malware.enabled", false);
user_pref("browser.safebrowsing.phishing.enabled", false);
`
	if err := os.WriteFile(filepath.Join(profile, "user.js"), []byte(prefs), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(FirefoxPath(), "--headless", "--remote-debugging-port", "0", "--profile", profile, "-no-remote")
	cmd.Env = append(os.Environ(), "MOZ_CRASHREPORTER_DISABLE=1")
	p := startProc(t, cmd, nil)
	f := &Firefox{p: p}
	deadline := time.Now().Add(60 * time.Second)
	for f.Addr == "" {
		var srv struct {
			Host string `json:"ws_host"`
			Port int    `json:"ws_port"`
		}
		if b, err := os.ReadFile(filepath.Join(profile, "WebDriverBiDiServer.json")); err == nil && json.Unmarshal(b, &srv) == nil && srv.Port > 0 {
			f.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(srv.Port))
			break
		}
		if p.exited() {
			t.Fatalf("firefox exited (%v) before serving WebDriver BiDi:\n%s", p.err, p.Output())
		}
		if time.Now().After(deadline) {
			t.Fatalf("firefox did not serve WebDriver BiDi within 60s:\n%s", p.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	c := http.Client{Timeout: 5 * time.Second}
	for {
		resp, err := c.Get(f.HTTPURL() + "/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return f
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		if p.exited() {
			t.Fatalf("firefox exited (%v) before answering GET /:\n%s", p.err, p.Output())
		}
		if time.Now().After(deadline) {
			t.Fatalf("firefox's GET / did not answer 200 within 60s (%v):\n%s", err, p.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
