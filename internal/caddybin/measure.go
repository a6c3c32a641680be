package caddybin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"
)

// Percentiles are the median and the 99th percentile of v (not empty).
func Percentiles(v []float64) (p50, p99 float64) {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2], s[min(len(s)-1, len(s)*99/100)]
}

// RSS is process pid's resident memory in bytes, read from
// /proc/<pid>/status (0 where that cannot be read).
func RSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// StartChromium starts browser (a Chromium) headless, with a fresh
// profile in dir, in a process group of its own (kill -pid ends it with
// its children), and returns it with its browser endpoint once it serves
// DevTools.
func StartChromium(browser, dir string) (*exec.Cmd, string, error) {
	profile := filepath.Join(dir, "chromium")
	cmd := exec.Command(browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-dev-shm-usage",
		"--user-data-dir="+profile, "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "about:blank")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(filepath.Join(profile, "DevToolsActivePort")); err == nil {
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if len(lines) == 2 {
				return cmd, "ws://127.0.0.1:" + strings.TrimSpace(lines[0]) + strings.TrimSpace(lines[1]), nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	cmd.Wait()
	return nil, "", errors.New("chromium did not serve DevTools within 30s")
}

// EchoSession opens a session through the gateway at addr (a provider
// that echoes behind it), timing its 101 in milliseconds, and checks it
// with one echo. The caller closes the connection.
func EchoSession(addr string) (float64, *websocket.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t0 := time.Now()
	c, _, err := websocket.Dial(ctx, "ws://"+addr+"/", &websocket.DialOptions{CompressionMode: websocket.CompressionDisabled})
	ms := float64(time.Since(t0).Microseconds()) / 1000
	if err != nil {
		return ms, nil, err
	}
	if err := c.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		c.CloseNow()
		return ms, nil, err
	}
	if _, _, err := c.Read(ctx); err != nil {
		c.CloseNow()
		return ms, nil, err
	}
	return ms, c, nil
}
