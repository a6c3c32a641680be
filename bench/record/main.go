// Command record measures what recording a CDP session costs, through a
// real Caddy in front of a real headless Chromium whose page animates (so
// screencast frames flow the whole time): the round trip of a small CDP
// command (Browser.getVersion) on a recorded session against an
// unrecorded one, and against an unrecorded one while the browser runs
// the same screencast for a connection of the bench's own (the browser's
// encoding on the same cores, without the gateway's part), in alternating
// rounds of the same length; the gateway's CPU time per stored frame (its
// CPU while a recorded session is quiet,
// less its CPU while an unrecorded one is, over the frames stored in that
// time); and the memory a recorded session holds (the gateway's RSS with
// -sessions recorded sessions open, less with as many unrecorded ones).
//
//	go run ./bench/record [-caddy <caddy>] [-rounds 5] [-window 3s] [-sessions 20]
//
// Every load is bounded in count and time and stops by itself.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/caddybin"
)

var (
	caddyBin = flag.String("caddy", "", "Caddy binary (default: build ./cmd/caddy)")
	chromium = flag.String("chromium", "/usr/bin/chromium", "the browser")
	rounds   = flag.Int("rounds", 5, "rounds; each measures a recorded and an unrecorded session in turn")
	window   = flag.Duration("window", 3*time.Second, "how long each session sends round trips")
	sessions = flag.Int("sessions", 20, "sessions held open for the memory figure")
)

// page is the page the bench repaints.
const page = `data:text/html,<title>bench</title><body style="margin:0"><h1 id="n" style="font-size:200px">0</h1></body>`

func main() {
	flag.Parse()
	caddybin.RaiseFileLimit()
	tmp, bin, err := caddybin.Workdir("bf-bench-record", *caddyBin)
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(tmp)
	browser, ws, err := caddybin.StartChromium(*chromium, tmp)
	if err != nil {
		fail(err)
	}
	defer func() { syscall.Kill(-browser.Process.Pid, syscall.SIGKILL); browser.Wait() }()

	admin, plainAddr, recAddr := caddybin.FreeAddr(), caddybin.FreeAddr(), caddybin.FreeAddr()
	site := func(addr, extra string) string {
		return fmt.Sprintf("http://%s {\n\tbind 127.0.0.1\n\tbrowser_failover {\n\t\tprovider chrome %s\n%s\t}\n}\n", addr, ws, extra)
	}
	cfg := fmt.Sprintf("{\n\tadmin %s\n\tstorage file_system %s\n}\n", admin, filepath.Join(tmp, "storage")) +
		site(plainAddr, "") +
		site(recAddr, "\t\trecording {\n\t\t\tsessions all\n\t\t}\n")
	gw, err := caddybin.StartCaddy(bin, tmp, "gw", cfg, nil)
	if err != nil {
		fail(err)
	}
	defer func() { gw.Process.Kill(); gw.Wait() }()
	for _, a := range []string{plainAddr, recAddr} {
		if err := caddybin.WaitListening(a); err != nil {
			fail(err)
		}
	}
	pid := gw.Process.Pid

	// The page, opened straight at the browser, and repainted 30 times a
	// second from there (a headless page's own timers may be paused).
	setup := dial(ws)
	target := answer(setup, 1, "Target.createTarget", `{"url":`+strconv.Quote(page)+`}`, "targetId")
	answer(setup, 2, "Target.activateTarget", `{"targetId":"`+target+`"}`, "")
	session := answer(setup, 3, "Target.attachToTarget", `{"targetId":"`+target+`","flatten":true}`, "sessionId")
	stopPaint := paint(setup, session)
	defer stopPaint()

	// Three kinds of round: an unrecorded session; an unrecorded one
	// while the browser runs the same screencast for another connection
	// (the browser's share of a recording: its encoding, on the same
	// cores); a recorded one.
	var p50, p99, cpuPerSec, quiet [3][]float64
	var perFrame []float64
	var fps, frameKB []float64
	for range *rounds {
		for i, addr := range []string{plainAddr, plainAddr, recAddr} {
			stopCast := func() {}
			if i == 1 {
				stopCast = screencast(ws, target)
			}
			c := dial("ws://" + addr + "/")
			if i == 2 {
				waitFrames(admin, 3)
			}
			f0, b0, c0, t0 := stored(admin, "frames"), stored(admin, "bytes"), caddybin.CPUTime(pid), time.Now()
			rtts := roundTrips(c, *window)
			f1, b1, c1, t1 := stored(admin, "frames"), stored(admin, "bytes"), caddybin.CPUTime(pid), time.Now()
			// The same session quiet for as long: the gateway's CPU
			// then is the frames' alone (none for an unrecorded one).
			q0, qc0, qt0 := stored(admin, "frames"), caddybin.CPUTime(pid), time.Now()
			time.Sleep(*window)
			q1, qc1, qt1 := stored(admin, "frames"), caddybin.CPUTime(pid), time.Now()
			c.Close(websocket.StatusNormalClosure, "")
			stopCast()
			a, b := caddybin.Percentiles(rtts)
			p50[i], p99[i] = append(p50[i], a), append(p99[i], b)
			secs := t1.Sub(t0).Seconds()
			cpuPerSec[i] = append(cpuPerSec[i], (c1-c0).Seconds()/secs)
			quiet[i] = append(quiet[i], (qc1-qc0).Seconds()/qt1.Sub(qt0).Seconds())
			if i == 2 && f1 > f0 && q1 > q0 {
				frames := f1 - f0
				fps = append(fps, frames/secs)
				frameKB = append(frameKB, (b1-b0)/frames/1024)
				extra := quiet[2][len(quiet[2])-1] - quiet[0][len(quiet[0])-1]
				perFrame = append(perFrame, extra*qt1.Sub(qt0).Seconds()/(q1-q0)*1e6)
			}
		}
		time.Sleep(500 * time.Millisecond) // the recorded session's end written
	}
	fmt.Printf("Browser.getVersion round trips through the gateway, %v per session, %d rounds (medians of the rounds; ms)\n", *window, *rounds)
	fmt.Printf("%-34s %9s %9s %12s\n", "", "p50", "p99", "CPU (ms/s)")
	names := []string{"unrecorded session", "unrecorded, browser screencasting", "recorded session, frames flowing"}
	for i := range 3 {
		fmt.Printf("%-34s %9.3f %9.3f %12.1f\n", names[i], caddybin.Median(p50[i]), caddybin.Median(p99[i]), caddybin.Median(cpuPerSec[i])*1000)
	}
	fmt.Printf("recorded / unrecorded p50: %.2fx; p99: %.2fx\n", caddybin.Median(p50[2])/caddybin.Median(p50[0]), caddybin.Median(p99[2])/caddybin.Median(p99[0]))
	fmt.Printf("recorded / unrecorded with the browser screencasting p50: %.2fx; p99: %.2fx\n", caddybin.Median(p50[2])/caddybin.Median(p50[1]), caddybin.Median(p99[2])/caddybin.Median(p99[1]))
	fmt.Printf("frames stored: %.1f per second, %.1f KiB each (%.0f MiB a minute)\n",
		caddybin.Median(fps), caddybin.Median(frameKB), caddybin.Median(fps)*caddybin.Median(frameKB)*60/1024)
	fmt.Printf("gateway CPU with the session quiet: unrecorded %.1f ms/s, recorded %.1f ms/s: %.0f µs per stored frame\n",
		caddybin.Median(quiet[0])*1000, caddybin.Median(quiet[2])*1000, caddybin.Median(perFrame))

	// Memory: sessions held open, unrecorded then recorded, the page
	// still repainted.
	held := func(addr string, recorded bool) int64 {
		var cs []*websocket.Conn
		for range *sessions {
			cs = append(cs, dial("ws://"+addr+"/"))
		}
		if recorded {
			waitFrames(admin, float64(*sessions))
		}
		time.Sleep(2 * time.Second)
		r := caddybin.RSS(pid)
		for _, c := range cs {
			c.Close(websocket.StatusNormalClosure, "")
		}
		time.Sleep(2 * time.Second)
		return r
	}
	base := held(plainAddr, false)
	rec := held(recAddr, true)
	fmt.Printf("gateway RSS with %d sessions open: unrecorded %.1f MiB, recorded %.1f MiB: %.0f KiB per recorded session\n",
		*sessions, float64(base)/(1<<20), float64(rec)/(1<<20), float64(rec-base)/float64(*sessions)/1024)
}

func dial(u string) *websocket.Conn {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		fail(err)
	}
	c.SetReadLimit(64 << 20)
	return c
}

// answer sends a command straight to the browser and returns the string
// member key of its result ("" when key is "").
func answer(c *websocket.Conn, id int, method, params, key string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte(fmt.Sprintf(`{"id":%d,"method":%q,"params":%s}`, id, method, params))); err != nil {
		fail(err)
	}
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			fail(fmt.Errorf("%s: %w", method, err))
		}
		var m struct {
			ID     int                       `json:"id"`
			Result map[string]any            `json:"result"`
			Error  *struct{ Message string } `json:"error"`
		}
		if json.Unmarshal(b, &m) != nil || m.ID != id {
			continue
		}
		if m.Error != nil {
			fail(fmt.Errorf("%s: %s", method, m.Error.Message))
		}
		if key == "" {
			return ""
		}
		return fmt.Sprint(m.Result[key])
	}
}

// paint repaints the page of the browser's session 30 times a second
// until stopped (its answers read and dropped).
func paint(c *websocket.Conn, session string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for {
			if _, _, err := c.Read(ctx); err != nil {
				return
			}
		}
	}()
	go func() {
		t := time.NewTicker(time.Second / 30)
		defer t.Stop()
		for n := 100; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			msg := fmt.Sprintf(`{"id":%d,"method":"Runtime.evaluate","params":{"expression":"document.getElementById('n').textContent='%d';document.body.style.background='hsl(%d,80%%,60%%)'"},"sessionId":%q}`, n, n, n%360, session)
			if c.Write(ctx, websocket.MessageText, []byte(msg)) != nil {
				return
			}
		}
	}()
	return func() { cancel(); c.CloseNow() }
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
			return
		}
	}
}

// roundTrips sends Browser.getVersion one after the other for d and
// returns each round trip (ms).
func roundTrips(c *websocket.Conn, d time.Duration) []float64 {
	var out []float64
	end := time.Now().Add(d)
	for id := 1; time.Now().Before(end); id++ {
		t0 := time.Now()
		call(c, id, "Browser.getVersion", "{}")
		out = append(out, float64(time.Since(t0).Microseconds())/1000)
	}
	return out
}

// stored reads recording_<what>_total from the metrics.
func stored(admin, what string) float64 {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		fail(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	total := 0.0
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "caddy_browser_failover_recording_"+what+"_total{") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			total += v
		}
	}
	return total
}

// waitFrames waits until the live sessions' recordings hold n frames
// together.
func waitFrames(admin string, n float64) {
	deadline := time.Now().Add(30 * time.Second)
	var last []byte
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + admin + "/browser_failover/sessions")
		if err == nil {
			last, _ = io.ReadAll(resp.Body)
			var list struct {
				Sessions []struct {
					Recording map[string]any `json:"recording"`
				} `json:"sessions"`
			}
			json.Unmarshal(last, &list)
			resp.Body.Close()
			got := 0.0
			for _, s := range list.Sessions {
				if f, ok := s.Recording["frames"].(float64); ok {
					got += f
				}
			}
			if got >= n {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	fail(fmt.Errorf("the recorded sessions stored no %v frames within 30s: %s", n, last))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "record:", err)
	os.Exit(1)
}

// screencast runs the page's screencast, with the recording's default
// settings, for a connection of its own straight to the browser, each
// frame acknowledged, until stopped.
func screencast(ws, target string) (stop func()) {
	c := dial(ws)
	session := answer(c, 1, "Target.attachToTarget", `{"targetId":"`+target+`","flatten":true}`, "sessionId")
	ctx, cancel := context.WithCancel(context.Background())
	start := fmt.Sprintf(`{"id":2,"method":"Page.startScreencast","params":{"format":"jpeg","quality":70,"maxWidth":1280,"maxHeight":800},"sessionId":%q}`, session)
	if err := c.Write(ctx, websocket.MessageText, []byte(start)); err != nil {
		fail(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for id := 3; ; id++ {
			_, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			var m struct {
				Method string `json:"method"`
				Params struct {
					SessionID int `json:"sessionId"`
				} `json:"params"`
			}
			if json.Unmarshal(b, &m) != nil || m.Method != "Page.screencastFrame" {
				continue
			}
			ack := fmt.Sprintf(`{"id":%d,"method":"Page.screencastFrameAck","params":{"sessionId":%d},"sessionId":%q}`, id, m.Params.SessionID, session)
			if c.Write(ctx, websocket.MessageText, []byte(ack)) != nil {
				return
			}
		}
	}()
	return func() { cancel(); c.CloseNow(); <-done }
}
