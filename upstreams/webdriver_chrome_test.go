package upstreams

// WebDriver against a real chromedriver driving Chromium: the create, its
// answer rewritten, commands, the BiDi socket, the DELETE, and the health
// check.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

const (
	chromedriverPath = "/usr/bin/chromedriver"
	chromiumPath     = "/usr/bin/chromium"
)

// startChromedriver runs chromedriver on a free port of 127.0.0.1 until
// the test ends, and returns its base URL.
func startChromedriver(t *testing.T) string {
	t.Helper()
	for _, f := range []string{chromedriverPath, chromiumPath} {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("real chromedriver tests need %s (Debian's chromium-driver): %v", f, err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(chromedriverPath, "--port="+strconv.Itoa(port))
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/status")
		if err == nil {
			resp.Body.Close()
			return base
		}
		if time.Now().After(deadline) {
			t.Fatalf("chromedriver did not answer: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// chromeCreateBody asks for headless Chromium with a fresh profile, and a
// BiDi socket.
func chromeCreateBody(t *testing.T) string {
	b, _ := json.Marshal(map[string]any{"capabilities": map[string]any{"alwaysMatch": map[string]any{
		"browserName": "chrome", "webSocketUrl": true,
		"goog:chromeOptions": map[string]any{"binary": chromiumPath, "args": []string{
			"--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=" + t.TempDir(),
			"--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"}},
		"bf:options": map[string]any{"region": "eu"},
	}}})
	return string(b)
}

func TestChromedriverSession(t *testing.T) {
	base := startChromedriver(t)
	port := base[strings.LastIndexByte(base, ':')+1:]
	p, rel := wdProvider(t, base, func(c *Config) {
		c.ConnectTimeout = caddy.Duration(60 * time.Second)
		c.Browsers = []string{"chrome"}
	})
	r := mustCreateRequest(t, chromeCreateBody(t))
	if !p.Accepts(r) {
		t.Fatal("chrome not accepted")
	}
	res := p.CreateWebDriver(context.Background(), r, nil)
	if res.Outcome.Kind != Success {
		t.Fatalf("create: %+v", res.Outcome)
	}
	s := res.WebDriver
	released := false
	defer func() {
		if !released {
			s.Remote.Release()
			rel.Wait(time.Now().Add(30 * time.Second))
		}
	}()
	if want := "ws://127.0.0.1:" + port + "/session/" + s.ID; s.SocketURL() != want || s.SocketError() != nil {
		t.Fatalf("socket %q (%v), want %q", s.SocketURL(), s.SocketError(), want)
	}

	// The answer, as the client gets it.
	b, err := s.Answer("gw-7f3a", "ws://gw.test:8080/wd/hub")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Value struct {
			SessionID    string         `json:"sessionId"`
			Capabilities map[string]any `json:"capabilities"`
		} `json:"value"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	caps := doc.Value.Capabilities
	if doc.Value.SessionID != "gw-7f3a" || caps["webSocketUrl"] != "ws://gw.test:8080/wd/hub/session/gw-7f3a" || caps["browserName"] != "chrome" {
		t.Fatalf("answer %s", b)
	}
	if v, _ := caps["browserVersion"].(string); v == "" {
		t.Fatalf("browserVersion lost: %s", b)
	}
	for _, leak := range []string{s.ID, ":" + port, "127.0.0.1", "localhost", "debuggerAddress"} {
		if strings.Contains(string(b), leak) {
			t.Errorf("the answer holds %q: %s", leak, b)
		}
	}

	// Commands.
	cmd := func(method, rest, body string) (int, []byte) {
		t.Helper()
		var rd io.Reader
		if body != "" {
			rd = CommandBody(strings.NewReader(body), int64(len(body)))
		}
		resp, err := p.WebDriverCommand(context.Background(), s, method, rest, "", rd)
		if err != nil {
			t.Fatalf("%s %s: %v", method, rest, err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Fatalf("%s %s: Content-Type %q", method, rest, ct)
		}
		return resp.StatusCode, out
	}
	if st, out := cmd("POST", "/url", `{"url":"data:text/html,<title>gateway</title>"}`); st != 200 {
		t.Fatalf("navigate: %d %s", st, out)
	}
	if st, out := cmd("GET", "/title", ""); st != 200 || string(out) != `{"value":"gateway"}` {
		t.Fatalf("title: %d %s", st, out)
	}
	if st, out := cmd("POST", "/execute/sync", `{"script":"return arguments[0] * 2","args":[21]}`); st != 200 || string(out) != `{"value":42}` {
		t.Fatalf("script: %d %s", st, out)
	}
	if st, out := cmd("GET", "/element/nope/text", ""); st != 404 || IsInvalidSessionAnswer(st, out) {
		t.Fatalf("no such element: %d %s", st, out)
	}

	// The BiDi socket: 101, then a command answered.
	sock := p.WebDriverSocket(context.Background(), testHandshake(), s, false, nil)
	if sock.Outcome.Kind != Success || sock.Conn.Answer.Status != http.StatusSwitchingProtocols {
		t.Fatalf("socket: %+v", sock.Outcome)
	}
	c := sock.Conn
	if _, err := c.Write(mkFrame(true, 1, []byte(`{"id":1,"method":"session.status","params":{}}`), true, 0)); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	f, err := readFrame(bufio.NewReader(io.MultiReader(bytes.NewReader(c.Leftover), c)))
	if err != nil || !bytes.Contains(f.payload, []byte(`"id":1`)) || !bytes.Contains(f.payload, []byte(`"result"`)) {
		t.Fatalf("BiDi answer %q %v", f.payload, err)
	}
	c.Close()

	// The end: DELETE once, confirmed; the provider no longer knows it.
	s.Remote.Release()
	released = true
	if !rel.Wait(time.Now().Add(60 * time.Second)) {
		t.Fatal("DELETE still pending")
	}
	if b := p.Books(); b.Created.Load() != 1 || b.Released.Load() != 1 || b.ReleaseFailures.Load() != 0 {
		t.Fatalf("books %d created, %d released, %d failures", b.Created.Load(), b.Released.Load(), b.ReleaseFailures.Load())
	}
	resp, err := p.WebDriverCommand(context.Background(), s, "GET", "/url", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	peek, _ := io.ReadAll(io.LimitReader(resp.Body, InvalidSessionPeek))
	resp.Body.Close()
	if !IsInvalidSessionAnswer(resp.StatusCode, peek) {
		t.Fatalf("after DELETE: %d %s", resp.StatusCode, peek)
	}
}

// TestChromedriverCreateAnswers: chromedriver's refusals are classified
// (an invalid argument relayed, a browser it cannot start declined, with
// its answer for the client), and its /status is a passing health check.
func TestChromedriverCreateAnswers(t *testing.T) {
	base := startChromedriver(t)
	p, _ := wdProvider(t, base, func(c *Config) { c.ConnectTimeout = caddy.Duration(60 * time.Second) })
	res := p.CreateWebDriver(context.Background(), mustCreateRequest(t, `{"capabilities":{"alwaysMatch":{"browserName":"chrome","pageLoadStrategy":"sometimes"}}}`), nil)
	if res.Outcome.Kind != Relay || res.Answer.Status != 400 || !strings.HasPrefix(res.Answer.Header.Get("Content-Type"), "application/json") ||
		!bytes.Contains(res.Body, []byte(`"invalid argument"`)) {
		t.Fatalf("invalid argument: %+v %s", res.Outcome, res.Body)
	}
	res = p.CreateWebDriver(context.Background(), mustCreateRequest(t, `{"capabilities":{"alwaysMatch":{"browserName":"firefox"}}}`), nil)
	if res.Outcome.Kind != Declined || res.Outcome.Word != WordNotCreated || !strings.Contains(res.Outcome.Err.Error(), "session not created") ||
		res.Answer == nil || res.Answer.Status != 500 || !bytes.Contains(res.Body, []byte(`"session not created"`)) {
		t.Fatalf("firefox at chromedriver: %+v %s", res.Outcome, res.Body)
	}
	pr, err := p.NewProber(ProbeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	if r := pr.Probe(context.Background()); r.Outcome.Kind != Success || r.Pressure == nil || r.Pressure.Full() {
		t.Fatalf("probe %+v %+v %v", r.Outcome, r.Pressure, r.CapacityErr)
	}
}
