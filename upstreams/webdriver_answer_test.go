package upstreams

import (
	"bytes"
	"encoding/json"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestIDRewriter: the provider's session ID is replaced wherever it is in
// an answer, however the answer is cut into writes (an ID split over
// two, three or more writes, one right after another, at either end);
// what is held back is never more than the ID less a byte; a short ID is
// replaced only as a whole JSON string.
func TestIDRewriter(t *testing.T) {
	const pid, cid = "4f1c9a0e2b7d4c55a1e3f00d9c8b7a61", "client-secret-Id-of-32-chars-xyZ"
	s := &WebDriverSession{ID: pid}
	answers := []string{
		`{"value":{"error":"unknown command","message":"unknown command: session/` + pid + `/se/cdp","stacktrace":""}}`,
		pid + pid + "x" + pid,
		"4f1c9a0e" + pid[:31] + " " + pid[:5],
		strings.Repeat("A", 100000) + pid + strings.Repeat("B", 3),
		"",
		"no ID at all",
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i, a := range answers {
		want := strings.ReplaceAll(a, pid, cid)
		for try := range 50 {
			var out bytes.Buffer
			r := s.Rewriter(&out, cid)
			rest := []byte(a)
			for len(rest) > 0 {
				n := 1 + rng.IntN(min(len(rest), 40))
				if try == 0 {
					n = len(rest) // one write
				}
				if w, err := r.Write(rest[:n]); err != nil || w != n {
					t.Fatalf("answer %d: Write = %d, %v", i, w, err)
				}
				if len(r.held) >= len(pid) {
					t.Fatalf("answer %d: %d bytes held back", i, len(r.held))
				}
				rest = rest[n:]
			}
			if err := r.Flush(); err != nil {
				t.Fatal(err)
			}
			if out.String() != want {
				t.Fatalf("answer %d, try %d:\n got %q\nwant %q", i, try, out.String(), want)
			}
			if r.Written() != int64(len(want)) || !r.SameLength() {
				t.Fatalf("answer %d: written %d of %d, same length %v", i, r.Written(), len(want), r.SameLength())
			}
		}
	}
	// A short ID: only where it is a whole JSON string.
	short := &WebDriverSession{ID: "7"}
	got := short.Rewrite([]byte(`{"value":{"sessionId":"7","data":"iVBORw07x7"}}`), cid)
	if string(got) != `{"value":{"sessionId":"`+cid+`","data":"iVBORw07x7"}}` {
		t.Fatalf("short ID: %s", got)
	}
	if short.Rewriter(&bytes.Buffer{}, cid).SameLength() {
		t.Fatal("IDs of different lengths said to keep the length")
	}
}

// TestStripInternals: a create answer loses what tells where the
// provider runs — Grid's VNC (any se:vnc… and se:noVnc…), its node's and
// its own addresses, the container, profile directories, process IDs,
// debugger addresses — and keeps the rest, chromedriverVersion beside
// userDataDir included.
func TestStripInternals(t *testing.T) {
	var caps map[string]any
	json.Unmarshal([]byte(`{"browserName":"chrome","se:vnc":"ws://10.1.2.3:7900/x","se:vncEnabled":true,
		"se:vncLocalAddress":"ws://10.1.2.3:7900","SE:VNCPASSWORD":"x","se:noVncPort":7900,"se:nodeHost":"10.1.2.3",
		"se:gridWebSocketUrl":"ws://10.1.2.3:4444","se:containerName":"node-7","se:cdpVersion":"120",
		"moz:profile":"/tmp/rust_mozprofile","moz:processID":42,"goog:processID":43,
		"chrome":{"chromedriverVersion":"120.0","userDataDir":"/tmp/.org.chromium.Chromium.x"},
		"msedge":{"msedgedriverVersion":"120.0","userDataDir":"C:\\x"},
		"goog:chromeOptions":{"debuggerAddress":"localhost:1","x":1},"ms:edgeOptions":{"debuggerAddress":"localhost:2"},
		"moz:debuggerAddress":"127.0.0.1:9222","vncish":1}`), &caps)
	stripInternals(caps)
	b, _ := json.Marshal(caps)
	want := `{"browserName":"chrome","chrome":{"chromedriverVersion":"120.0"},"goog:chromeOptions":{"x":1},"ms:edgeOptions":{},` +
		`"msedge":{"msedgedriverVersion":"120.0"},"se:cdpVersion":"120","vncish":1}`
	if string(b) != want {
		t.Fatalf("stripped:\n got %s\nwant %s", b, want)
	}
	stripInternals(nil) // an answer without capabilities
}

// BenchmarkIDRewriter: a screenshot-sized answer (8 MiB of base64, the
// provider's ID once) through the rewriter in io.Copy's 32 KiB writes.
func BenchmarkIDRewriter(b *testing.B) {
	const pid = "4f1c9a0e2b7d4c55a1e3f00d9c8b7a61"
	s := &WebDriverSession{ID: pid}
	answer := []byte(`{"value":"` + strings.Repeat("iVBORw0KGgoAAAANSUhEUgAA", 8<<20/24) + `","id":"` + pid + `"}`)
	b.SetBytes(int64(len(answer)))
	for b.Loop() {
		r := s.Rewriter(io.Discard, "client-secret-Id-of-32-chars-xyZ")
		for rest := answer; len(rest) > 0; {
			n := min(len(rest), 32<<10)
			r.Write(rest[:n])
			rest = rest[n:]
		}
		r.Flush()
	}
}
