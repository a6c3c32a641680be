package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// ChromedriverPath is Debian's chromium-driver, or E2E_CHROMEDRIVER.
func ChromedriverPath() string {
	if p := os.Getenv("E2E_CHROMEDRIVER"); p != "" {
		return p
	}
	return "/usr/bin/chromedriver"
}

// RequireChromedriver skips the test, with what to install, when
// chromedriver or Chromium is missing (scripts/test.sh installs both, so
// CI never skips).
func RequireChromedriver(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(ChromedriverPath()); err != nil {
		t.Skipf("no chromedriver at %s: apt-get install chromium-driver (or e2e/setup.sh)", ChromedriverPath())
	}
	if _, err := os.Stat(ChromiumPath()); err != nil {
		t.Skipf("no chromium at %s: apt-get install chromium (or e2e/setup.sh)", ChromiumPath())
	}
}

// Chromedriver is a running chromedriver on 127.0.0.1.
type Chromedriver struct {
	Addr string
	p    *proc
}

// URL is its WebDriver base, http://127.0.0.1:<port>.
func (c *Chromedriver) URL() string { return "http://" + c.Addr }

// Kill ends it (and the browsers it started) at once.
func (c *Chromedriver) Kill() { c.p.kill() }

// Output is the tail of what it wrote.
func (c *Chromedriver) Output() string { return c.p.Output() }

// StartChromedriver starts chromedriver on a free loopback port and waits
// until its /status answers; it is killed, with its browsers, at cleanup.
func StartChromedriver(t testing.TB) *Chromedriver {
	t.Helper()
	RequireChromedriver(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(ChromedriverPath(), "--port="+port, "--allowed-ips=127.0.0.1", "--log-level=WARNING")
	c := &Chromedriver{Addr: addr, p: startProc(t, cmd, nil)}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(c.URL() + "/status")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return c
			}
		}
		if c.p.exited() || time.Now().After(deadline) {
			t.Fatalf("chromedriver did not answer /status (%v):\n%s", err, c.p.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ChromeCapabilities is a provider's capabilities JSON that starts
// Debian's chromium headless with a fresh profile under dir: what an
// operator puts in a chromedriver provider's capabilities so that every
// client's session starts the same browser.
func ChromeCapabilities(dir string) string {
	b, _ := json.Marshal(map[string]any{"goog:chromeOptions": map[string]any{
		"binary": ChromiumPath(),
		"args": []string{"--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
			"--disable-background-networking", "--disable-component-update", "--disable-sync",
			"--user-data-dir=" + dir},
	}})
	return string(b)
}

// SessionAlive reports whether chromedriver still has the provider
// session id (its browser open): a command on it is not answered
// "invalid session id".
func (c *Chromedriver) SessionAlive(id string) (bool, error) {
	resp, err := http.Get(c.URL() + "/session/" + id + "/url")
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	var v struct {
		Value struct {
			Error string `json:"error"`
		} `json:"value"`
	}
	json.NewDecoder(resp.Body).Decode(&v)
	switch {
	case resp.StatusCode == 200:
		return true, nil
	case v.Value.Error == "invalid session id":
		return false, nil
	}
	return false, fmt.Errorf("chromedriver answered %d %s", resp.StatusCode, v.Value.Error)
}

// BrowsersUnder counts the processes whose command line names dir (a
// browser started with a user data dir under it).
func BrowsersUnder(dir string) int {
	out, _ := exec.Command("pgrep", "-f", "--", "user-data-dir="+dir).Output()
	return len(strings.Fields(string(out)))
}
