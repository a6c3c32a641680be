// Command profiles measures what a browser profile costs, through a real
// Caddy in front of a real headless Chromium: the connect time (the
// client's dial to its 101) of a session with a profile of 50 cookies on
// 5 origins (10 each, and 5 localStorage items per origin) against a
// session without one, in alternating connects of the same run; the time
// from the client's close to the profile saved and free again; and the
// bytes the profile takes in the storage.
//
// The profile is made by a first session with it, whose pages load a
// page of the bench's own at each origin (http://o1.localhost:<port>/ …
// o5: Chromium sends *.localhost to the loopback) that sets the cookies
// and the items.
//
//	go run ./bench/profiles [-caddy <caddy>] [-rounds 30]
//
// Every load is bounded in count and time and stops by itself.
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/caddybin"
)

var (
	caddyBin = flag.String("caddy", "", "Caddy binary (default: build ./cmd/caddy)")
	chromium = flag.String("chromium", "/usr/bin/chromium", "the browser")
	rounds   = flag.Int("rounds", 30, "rounds; each connects once without the profile and once with it")
)

const (
	origins          = 5
	cookiesPerOrigin = 10
	itemsPerOrigin   = 5
)

func main() {
	flag.Parse()
	caddybin.RaiseFileLimit()
	tmp, bin, err := caddybin.Workdir("bf-bench-profiles", *caddyBin)
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(tmp)
	browser, ws, err := caddybin.StartChromium(*chromium, tmp)
	if err != nil {
		fail(err)
	}
	defer func() { syscall.Kill(-browser.Process.Pid, syscall.SIGKILL); browser.Wait() }()

	// The site: each origin's page sets its cookies (HttpOnly, a value of
	// 32 random bytes each) and its localStorage items.
	var seeded atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := range cookiesPerOrigin {
			http.SetCookie(w, &http.Cookie{Name: fmt.Sprintf("c%d", i), Value: random(32), Path: "/", HttpOnly: i%2 == 0,
				SameSite: http.SameSiteLaxMode, Expires: time.Now().Add(24 * time.Hour)})
		}
		var sets strings.Builder
		for i := range itemsPerOrigin {
			fmt.Fprintf(&sets, "localStorage.setItem('k%d', %q);", i, random(64))
		}
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, "<!doctype html><title>seed</title><script>%s</script>seeded", sets.String())
		seeded.Add(1)
	}))

	key := make([]byte, 32)
	rand.Read(key)
	admin, addr := caddybin.FreeAddr(), caddybin.FreeAddr()
	cfg := fmt.Sprintf("{\n\tadmin %s\n\tstorage file_system %s\n}\n", admin, filepath.Join(tmp, "storage")) +
		fmt.Sprintf("http://%s {\n\tbind 127.0.0.1\n\tbrowser_failover {\n\t\tprovider chrome %s\n\t\tprofiles {\n\t\t\tkey %s\n\t\t}\n\t}\n}\n",
			addr, ws, base64.StdEncoding.EncodeToString(key))
	gw, err := caddybin.StartCaddy(bin, tmp, "gw", cfg, nil)
	if err != nil {
		fail(err)
	}
	defer func() { gw.Process.Kill(); gw.Wait() }()
	logPath = filepath.Join(tmp, "gw.log")
	if err := caddybin.WaitListening(addr); err != nil {
		fail(err)
	}

	// The profile, made by its first session.
	plain, withProfile := "ws://"+addr+"/", "ws://"+addr+"/?bf_profile=bench"
	c, _ := connect(withProfile)
	for i := 1; i <= origins; i++ {
		call(c, i, "Target.createTarget", fmt.Sprintf(`{"url":"http://o%d.localhost:%d/"}`, i, port))
	}
	deadline := time.Now().Add(30 * time.Second)
	for seeded.Load() < origins {
		if time.Now().After(deadline) {
			fail(fmt.Errorf("the seed pages did not load within 30s"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // their scripts ran
	c.Close(websocket.StatusNormalClosure, "")
	waitFree(admin)
	size, _ := profile(admin)
	if size == 0 {
		fail(fmt.Errorf("the profile was not stored"))
	}

	var without, with, save []float64
	for range *rounds {
		c, d := connect(plain)
		without = append(without, d)
		c.Close(websocket.StatusNormalClosure, "")
		time.Sleep(100 * time.Millisecond)

		c, d = connect(withProfile)
		with = append(with, d)
		t0 := time.Now()
		c.Close(websocket.StatusNormalClosure, "")
		waitFree(admin)
		save = append(save, ms(time.Since(t0)))
		time.Sleep(100 * time.Millisecond)
	}
	size, cookies := profile(admin)
	fmt.Printf("connect (dial to 101) through the gateway, %d connects each, interleaved (ms)\n", *rounds)
	fmt.Printf("%-44s %9s %9s\n", "", "p50", "p99")
	a50, a99 := caddybin.Percentiles(without)
	b50, b99 := caddybin.Percentiles(with)
	s50, s99 := caddybin.Percentiles(save)
	fmt.Printf("%-44s %9.1f %9.1f\n", "without a profile", a50, a99)
	fmt.Printf("%-44s %9.1f %9.1f\n", fmt.Sprintf("with a profile (%d cookies on %d origins)", origins*cookiesPerOrigin, origins), b50, b99)
	fmt.Printf("%-44s %9.1f %9.1f\n", "save: client's close to the profile free", s50, s99)
	fmt.Printf("stored: %d bytes (sealed), %d cookies in the last save\n", size, cookies)
}

// random is n random bytes, base64.
func random(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// connect dials u and returns the connection and the time to its 101.
func connect(u string) (*websocket.Conn, float64) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t0 := time.Now()
	c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		fail(err)
	}
	d := ms(time.Since(t0))
	c.SetReadLimit(64 << 20)
	return c, d
}

// call sends a command and waits for its answer (events skipped).
func call(c *websocket.Conn, id int, method, params string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte(fmt.Sprintf(`{"id":%d,"method":%q,"params":%s}`, id, method, params))); err != nil {
		fail(err)
	}
	want := fmt.Sprintf(`{"id":%d,`, id)
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			fail(fmt.Errorf("%s: %w", method, err))
		}
		if strings.HasPrefix(string(b), want) {
			if strings.Contains(string(b), `"error"`) {
				fail(fmt.Errorf("%s: %s", method, b))
			}
			return
		}
	}
}

// profiles reads the admin API's list.
func profiles(admin string) []map[string]any {
	resp, err := http.Get("http://" + admin + "/browser_failover/profiles")
	if err != nil {
		fail(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var l struct {
		Profiles []map[string]any `json:"profiles"`
	}
	if err := json.Unmarshal(b, &l); err != nil {
		fail(fmt.Errorf("profiles: %s", b))
	}
	return l.Profiles
}

// waitFree waits until profile bench is stored and not in use.
func waitFree(admin string) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, p := range profiles(admin) {
			if p["id"] == "bench" && p["in_use"] == false {
				return
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	fail(fmt.Errorf("the profile was not saved within 30s"))
}

// profile is the stored profile's size, and the cookies its last save
// held (from the gateway's log).
func profile(admin string) (size int64, cookies int) {
	for _, p := range profiles(admin) {
		if p["id"] == "bench" {
			size = int64(p["size"].(float64))
		}
	}
	return size, lastSavedCookies()
}

// logPath is the gateway's log (its output).
var logPath string

// lastSavedCookies reads the cookies of the last "profile saved" entry.
func lastSavedCookies() int {
	b, _ := os.ReadFile(logPath)
	n := -1
	for _, l := range strings.Split(string(b), "\n") {
		var e struct {
			Msg     string `json:"msg"`
			Cookies int    `json:"cookies"`
		}
		if json.Unmarshal([]byte(l), &e) == nil && e.Msg == "profile saved" {
			n = e.Cookies
		}
	}
	return n
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "profiles:", err)
	os.Exit(1)
}
