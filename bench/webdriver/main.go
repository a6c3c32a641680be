// Command webdriver measures what the gateway adds to a WebDriver session:
// small commands (GET /session/<id>/title) sent to a real chromedriver
// straight and through the gateway, interleaved one by one in the same run
// so both see the same machine; the wall time of a real WebdriverIO flow
// (node e2e/js/webdriver.mjs: create, navigate, title, script, delete)
// straight and through the gateway, alternating; and the gateway's memory
// per idle WebDriver session (the process's resident memory with n
// sessions held open at a fake WebDriver server, against before).
//
//	go run ./bench/webdriver [-caddy <caddy>] [-commands 1000] [-flows 5] [-held 1000]
//
// It needs Debian's chromium and chromium-driver, and node with the e2e
// npm packages for the flows (-flows 0 skips them). Every load is bounded
// in count and time and stops by itself.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/browserfailover/caddy-browser-failover/internal/caddybin"
	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
)

var (
	caddyBin     = flag.String("caddy", "", "Caddy binary (default: build ./cmd/caddy)")
	commands     = flag.Int("commands", 1000, "small commands per target")
	flows        = flag.Int("flows", 5, "WebdriverIO flows per target (0: skip)")
	held         = flag.Int("held", 1000, "idle WebDriver sessions held for the memory figure (0: skip)")
	chromedriver = flag.String("chromedriver", "/usr/bin/chromedriver", "chromedriver")
	chromium     = flag.String("chromium", "/usr/bin/chromium", "chromium")
)

func main() {
	flag.Parse()
	caddybin.RaiseFileLimit()
	tmp, bin, err := caddybin.Workdir("bf-bench-webdriver", *caddyBin)
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(tmp)

	cdAddr := caddybin.FreeAddr()
	_, port, _ := strings.Cut(cdAddr, ":")
	cd := exec.Command(*chromedriver, "--port="+port, "--allowed-ips=127.0.0.1", "--log-level=SEVERE")
	if err := cd.Start(); err != nil {
		fail(err)
	}
	defer func() { cd.Process.Kill(); cd.Wait() }()
	if err := caddybin.WaitListening(cdAddr); err != nil {
		fail(err)
	}
	gwAddr := caddybin.FreeAddr()
	gw, err := startGateway(bin, tmp, "gw", gwAddr, "http://"+cdAddr)
	if err != nil {
		fail(err)
	}
	defer func() { gw.Process.Kill(); gw.Wait() }()
	if err := caddybin.WaitListening(gwAddr); err != nil {
		fail(err)
	}

	// Small commands, one straight and one through the gateway in turn.
	direct, err := create("http://"+cdAddr, capabilities(filepath.Join(tmp, "profile-direct")))
	if err != nil {
		fail(fmt.Errorf("create at chromedriver: %w", err))
	}
	viaGW, err := create("http://"+gwAddr, capabilities(filepath.Join(tmp, "profile-gateway")))
	if err != nil {
		fail(fmt.Errorf("create through the gateway: %w", err))
	}
	commandTimes("chromedriver", "straight", "http://"+cdAddr, direct, "http://"+gwAddr, viaGW)
	del("http://"+cdAddr, direct)
	del("http://"+gwAddr, viaGW)

	// The same against a fake WebDriver server that answers at once: what
	// the gateway itself adds, without the browser's own time.
	fake := fakes.NewWebDriver("")
	fakeGW := caddybin.FreeAddr()
	fg, err := startGateway(bin, tmp, "fake", fakeGW, fake.URL())
	if err != nil {
		fail(err)
	}
	if err := caddybin.WaitListening(fakeGW); err != nil {
		fail(err)
	}
	fd, err := create(fake.URL(), `{"capabilities":{}}`)
	if err != nil {
		fail(err)
	}
	fgid, err := create("http://"+fakeGW, `{"capabilities":{}}`)
	if err != nil {
		fail(err)
	}
	commandTimes("an instant fake", "straight", fake.URL(), fd, "http://"+fakeGW, fgid)
	// Caddy's own reverse_proxy in front of the same fake: the least a
	// Caddy handler adds per HTTP request on this machine.
	rpAddr := caddybin.FreeAddr()
	rp, err := startProxy(bin, tmp, rpAddr, strings.TrimPrefix(fake.URL(), "http://"))
	if err != nil {
		fail(err)
	}
	if err := caddybin.WaitListening(rpAddr); err != nil {
		fail(err)
	}
	commandTimes("the fake, reverse_proxy beside the gateway", "reverse_proxy", "http://"+rpAddr, fd, "http://"+fakeGW, fgid)
	rp.Process.Kill()
	rp.Wait()
	fg.Process.Kill()
	fg.Wait()
	fake.Close()

	if *flows > 0 {
		root, _ := os.Getwd()
		script := filepath.Join(root, "e2e", "js", "webdriver.mjs")
		var dWall, gWall []float64
		for i := 0; i < *flows; i++ {
			for _, s := range []struct {
				url string
				to  *[]float64
			}{{"http://" + cdAddr + "/", &dWall}, {"http://" + gwAddr + "/", &gWall}} {
				d, err := flow(script, s.url)
				if err != nil {
					fail(err)
				}
				*s.to = append(*s.to, d)
			}
		}
		fmt.Printf("WebdriverIO flow (create, navigate, title, script, delete), %d each, alternating: median wall time\n", *flows)
		fmt.Printf("%-22s %8.0f ms\n", "chromedriver", caddybin.Median(dWall))
		fmt.Printf("%-22s %8.0f ms\n", "through the gateway", caddybin.Median(gWall))
		fmt.Printf("%-22s %8.3f×\n", "ratio", caddybin.Median(gWall)/caddybin.Median(dWall))
	}

	if *held > 0 {
		memory(bin, tmp)
	}
}

// memory holds n idle WebDriver sessions through a gateway of their own at
// a fake WebDriver server and prints the gateway's resident memory per
// session (after − before).
func memory(bin, tmp string) {
	f := fakes.NewWebDriver("")
	defer f.Close()
	addr := caddybin.FreeAddr()
	gw, err := startGateway(bin, tmp, "mem", addr, f.URL())
	if err != nil {
		fail(err)
	}
	defer func() { gw.Process.Kill(); gw.Wait() }()
	if err := caddybin.WaitListening(addr); err != nil {
		fail(err)
	}
	// A first session warms the process up.
	if _, err := create("http://"+addr, `{"capabilities":{}}`); err != nil {
		fail(err)
	}
	time.Sleep(time.Second)
	before := caddybin.RSS(gw.Process.Pid)
	for i := 0; i < *held; i++ {
		if _, err := create("http://"+addr, `{"capabilities":{}}`); err != nil {
			fail(err)
		}
	}
	time.Sleep(2 * time.Second)
	after := caddybin.RSS(gw.Process.Pid)
	fmt.Printf("memory per idle WebDriver session (%d held, the gateway's RSS after − before): %.2f KiB\n",
		*held, float64(after-before)/1024/float64(*held))
}

// startGateway runs bin serving addr with one webdriver provider at url.
func startGateway(bin, tmp, name, addr, url string) (*exec.Cmd, error) {
	dir := filepath.Join(tmp, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	cfg := fmt.Sprintf(`{
	admin off
	storage file_system %s
}
http://%s {
	bind 127.0.0.1
	browser_failover {
		connect_timeout 30s
		provider wd %s {
			protocol webdriver
		}
		session {
			idle_timeout 1h
		}
	}
}
`, filepath.Join(dir, "storage"), addr, url)
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "run", "--config", path, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	logf, err := os.Create(filepath.Join(dir, "caddy.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	return cmd, cmd.Start()
}

// startProxy runs bin as Caddy's reverse_proxy to upstream on addr.
func startProxy(bin, tmp, addr, upstream string) (*exec.Cmd, error) {
	dir := filepath.Join(tmp, "rp")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	cfg := fmt.Sprintf("{\n\tadmin off\n}\nhttp://%s {\n\tbind 127.0.0.1\n\treverse_proxy %s\n}\n", addr, upstream)
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "run", "--config", path, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	return cmd, cmd.Start()
}

// capabilities is a create's body that starts chromium headless.
func capabilities(profile string) string {
	b, _ := json.Marshal(map[string]any{"capabilities": map[string]any{"alwaysMatch": map[string]any{
		"browserName": "chrome",
		"goog:chromeOptions": map[string]any{"binary": *chromium, "args": []string{"--headless=new", "--no-sandbox",
			"--disable-gpu", "--no-first-run", "--disable-background-networking", "--user-data-dir=" + profile}},
	}}})
	return string(b)
}

var client = &http.Client{Timeout: 60 * time.Second}

// create makes a session at base and returns its ID.
func create(base, body string) (string, error) {
	resp, err := client.Post(base+"/session", "application/json", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var v struct {
		Value struct {
			SessionID string `json:"sessionId"`
		} `json:"value"`
	}
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &v); err != nil || v.Value.SessionID == "" {
		return "", fmt.Errorf("create: %d %s", resp.StatusCode, raw)
	}
	return v.Value.SessionID, nil
}

// commandTimes sends *commands small commands to session id at base and
// to gid through the gateway at gw, one after the other in turn, and
// prints their p50 and p99; label names the baseline at base.
func commandTimes(name, label, base, id, gw, gid string) {
	var dTimes, gTimes []float64
	for i := 0; i < *commands; i++ {
		d, err := command(base, id)
		if err != nil {
			fail(err)
		}
		g, err := command(gw, gid)
		if err != nil {
			fail(err)
		}
		dTimes, gTimes = append(dTimes, d), append(gTimes, g)
	}
	dp50, dp99 := caddybin.Percentiles(dTimes)
	gp50, gp99 := caddybin.Percentiles(gTimes)
	fmt.Printf("GET /session/<id>/title at %s, %d each, interleaved (ms)\n", name, *commands)
	fmt.Printf("%-22s %8s %8s\n", "", "p50", "p99")
	fmt.Printf("%-22s %8.3f %8.3f\n", label, dp50, dp99)
	fmt.Printf("%-22s %8.3f %8.3f\n", "through the gateway", gp50, gp99)
	fmt.Printf("%-22s %+8.3f %+8.3f\n", "added", gp50-dp50, gp99-dp99)
}

// command sends one small command and returns its time in ms.
func command(base, id string) (float64, error) {
	t0 := time.Now()
	resp, err := client.Get(base + "/session/" + id + "/title")
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return 0, fmt.Errorf("title: %d", resp.StatusCode)
	}
	return float64(time.Since(t0).Microseconds()) / 1000, err
}

func del(base, id string) {
	req, _ := http.NewRequest(http.MethodDelete, base+"/session/"+id, nil)
	if resp, err := client.Do(req); err == nil {
		resp.Body.Close()
	}
}

// flow runs one WebdriverIO flow against url and returns its wall time in
// ms.
func flow(script, url string) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script, "wdio", url)
	cmd.Dir = filepath.Dir(filepath.Dir(script))
	cmd.Env = append(os.Environ(), "E2E_CHROMIUM="+*chromium)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	t0 := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("flow at %s: %v\n%s", url, err, out.String())
	}
	return float64(time.Since(t0).Milliseconds()), nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "webdriver:", err)
	os.Exit(1)
}
