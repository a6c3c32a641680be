package multinode_test

// A WebDriver command's body costs the gateway process little memory,
// whatever its size and however slowly it comes: measured on a real Caddy
// process (its resident memory), in front of a fake WebDriver provider
// that reads bodies as they come.

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
)

// TestWebDriverCommandBodiesBounded: eight clients each send a 24 MiB
// command body slowly and never finish it — six chunked, two with a
// Content-Length — to one gateway process. The provider receives each as
// it comes, and the gateway's resident memory grows by far less than the
// bodies (the bound, 64 MiB, is under half of what the chunked ones
// alone hold when read whole), while they are open and after they close.
// A chunked body over the gateway's 1 MiB buffer, sent whole, reaches the
// provider intact and chunked; one over 64 MiB is refused as invalid
// argument.
func TestWebDriverCommandBodiesBounded(t *testing.T) {
	f := fakes.NewWebDriver("")
	defer f.Close()
	var received, ended atomic.Int64
	f.OnCommand = func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, "/se/file") {
			return false
		}
		defer ended.Add(1)
		h := sha256.New()
		n, err := io.Copy(h, countingReader{r.Body, &received})
		if err != nil {
			fakes.WriteError(w, http.StatusBadRequest, "invalid argument", "the body broke off")
			return true
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		json.NewEncoder(w).Encode(map[string]any{"value": map[string]any{"n": n, "sha256": hex.EncodeToString(h.Sum(nil)), "length": r.ContentLength}})
		return true
	}
	gw := startNode(t, "gw-1", map[string]any{
		"handler":   "browser_failover",
		"providers": []map[string]any{{"name": "wd", "url": f.URL(), "protocol": "webdriver"}},
	})
	code, v := wdDo(t, http.MethodPost, "http://"+gw.Addr+"/session", `{"capabilities":{"alwaysMatch":{"browserName":"chrome"}}}`)
	if code != 200 {
		t.Fatalf("create: %d %v", code, v)
	}
	cmd := "http://" + gw.Addr + "/session/" + v["sessionId"].(string) + "/se/file"

	// A chunked body over the buffer, whole: it arrives intact (and
	// warms the process up for the measure).
	chunk := []byte(strings.Repeat(`{"file":"UEsDBBQAAAAIAA"}`, 64<<10/25+1))[:64<<10]
	const whole = 5 << 20
	sum := sha256.New()
	for range whole / len(chunk) {
		sum.Write(chunk)
	}
	req, _ := http.NewRequest(http.MethodPost, cmd, repeatReader(chunk, whole))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Value struct {
			N      int64  `json:"n"`
			SHA256 string `json:"sha256"`
			Length int64  `json:"length"`
		} `json:"value"`
	}
	err = json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || got.Value.N != whole || got.Value.SHA256 != hex.EncodeToString(sum.Sum(nil)) || got.Value.Length != -1 {
		t.Fatalf("a %d-byte chunked body: %d %+v %v", whole, resp.StatusCode, got.Value, err)
	}

	pid := gw.cmd.Process.Pid
	before := rssOf(t, pid)
	const (
		clients = 8
		sized   = 2 // of them, with a Content-Length
		each    = 24 << 20
	)
	start := received.Load()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range clients {
		c, err := net.Dial("tcp", gw.Addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		head := "POST " + strings.TrimPrefix(cmd, "http://"+gw.Addr) + " HTTP/1.1\r\nHost: " + gw.Addr + "\r\nContent-Type: application/json\r\n"
		if i < sized {
			head += "Content-Length: " + strconv.Itoa(each+1) + "\r\n\r\n"
		} else {
			head += "Transfer-Encoding: chunked\r\n\r\n"
		}
		if _, err := io.WriteString(c, head); err != nil {
			t.Fatal(err)
		}
	}
	// Slowly, a chunk at a time on each, none finished.
	chunked := append(append([]byte(fmt.Sprintf("%x\r\n", len(chunk))), chunk...), "\r\n"...)
	for range each / len(chunk) {
		for i, c := range conns {
			b := chunked
			if i < sized {
				b = chunk
			}
			c.SetWriteDeadline(time.Now().Add(30 * time.Second))
			if _, err := c.Write(b); err != nil {
				t.Fatalf("client %d: %v", i, err)
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	sent := int64(clients * each)
	// Let the provider get what the gateway passed on: all but what the
	// sockets and the gateway's buffers hold (up to 30 s: the old way
	// passed nothing on until a body ended).
	deadline := time.Now().Add(30 * time.Second)
	for received.Load()-start < sent-clients*(8<<20) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	open := rssOf(t, pid)
	t.Logf("gateway RSS %.1f MiB before, %.1f MiB with %d bodies of %d MiB open (%.1f MiB sent, %.1f MiB at the provider)",
		mibOf(before), mibOf(open), clients, each>>20, mibOf(sent), mibOf(received.Load()-start))
	const bound = 64 << 20
	if open-before > bound {
		t.Errorf("the gateway's RSS grew by %.1f MiB with %d unfinished %d MiB bodies open, want at most %d MiB", mibOf(open-before), clients, each>>20, bound>>20)
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	waitUntil(t, 30*time.Second, "the end of each body at the provider", func() bool { return ended.Load() == clients+1 })
	closed := rssOf(t, pid)
	t.Logf("gateway RSS %.1f MiB after they closed", mibOf(closed))
	if closed-before > bound {
		t.Errorf("the gateway's RSS grew by %.1f MiB after the bodies closed, want at most %d MiB", mibOf(closed-before), bound>>20)
	}
	// A chunked body over 64 MiB is refused as it passes the bound: the
	// provider's request fails, the client gets invalid argument.
	// (Over a connection of its own: the answer may come while the
	// client still writes, and a write may then fail.)
	c, err := net.Dial("tcp", gw.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() {
		io.WriteString(c, "POST "+strings.TrimPrefix(cmd, "http://"+gw.Addr)+" HTTP/1.1\r\nHost: "+gw.Addr+"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
		for range (64<<20)/len(chunk) + 1 {
			if _, err := c.Write(chunked); err != nil {
				return
			}
		}
		io.WriteString(c, "0\r\n\r\n")
	}()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err = http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), `"error":"invalid argument"`) {
		t.Fatalf("a body over 64 MiB: %d %s", resp.StatusCode, raw)
	}
	waitUntil(t, 30*time.Second, "the end of that body at the provider", func() bool { return ended.Load() == clients+2 })
	// The gateway still serves commands.
	if code, v := wdDo(t, http.MethodGet, strings.TrimSuffix(cmd, "/se/file")+"/url", ""); code != 200 {
		t.Fatalf("a command after: %d %v", code, v)
	}
}

// countingReader adds what it reads to n.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n.Add(int64(k))
	return k, err
}

// repeatReader reads chunk over and over, n bytes in all, as a reader of
// unknown length (the client sends it chunked).
func repeatReader(chunk []byte, n int) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		for left := n; left > 0; left -= len(chunk) {
			if _, err := pw.Write(chunk[:min(len(chunk), left)]); err != nil {
				return
			}
		}
		pw.Close()
	}()
	return pr
}

// rssOf is process pid's resident memory in bytes.
func rssOf(t *testing.T, pid int) int64 {
	t.Helper()
	fh, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc to read the gateway's memory: %v", err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q", rest)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/<pid>/status")
	return 0
}

func mibOf(b int64) float64 { return float64(b) / (1 << 20) }
