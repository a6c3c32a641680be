package upstreams

import (
	"bufio"
	"strings"
	"testing"
	"time"
)

func TestReadAnswer(t *testing.T) {
	cases := []struct {
		name   string
		in     string
		status int
		err    bool
	}{
		{"101", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", 101, false},
		{"LF only", "HTTP/1.1 404 Not Found\nX-A: b\n\n", 404, false},
		{"no reason", "HTTP/1.0 503\r\n\r\n", 503, false},
		{"HTTP/2 line", "HTTP/2 200 OK\r\n\r\n", 0, true},
		{"garbage", "hello there\r\n\r\n", 0, true},
		{"short code", "HTTP/1.1 20 OK\r\n\r\n", 0, true},
		{"letters", "HTTP/1.1 abc OK\r\n\r\n", 0, true},
		{"folded", "HTTP/1.1 200 OK\r\nX-A: b\r\n c\r\n\r\n", 0, true},
		{"no colon", "HTTP/1.1 200 OK\r\nX-A b\r\n\r\n", 0, true},
		{"space in name", "HTTP/1.1 200 OK\r\nX A: b\r\n\r\n", 0, true},
		{"eof in headers", "HTTP/1.1 200 OK\r\nX-A: b\r\n", 0, true},
		{"huge header", "HTTP/1.1 200 OK\r\nX-A: " + strings.Repeat("a", MaxAnswerHeader) + "\r\n\r\n", 0, true},
		{"too many fields", "HTTP/1.1 200 OK\r\n" + strings.Repeat("X-A: b\r\n", maxAnswerFields+1) + "\r\n", 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := ReadAnswer(bufio.NewReaderSize(strings.NewReader(tc.in), 4096), MaxAnswerHeader)
			if tc.err {
				if err == nil {
					t.Fatalf("parsed %v, want an error", a)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if a.Status != tc.status || string(a.Raw) != tc.in {
				t.Fatalf("status %d raw %q", a.Status, a.Raw)
			}
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		in   string
		want time.Duration
	}{
		{"2", 2 * time.Second},
		{" 120 ", 2 * time.Minute},
		{"0", 0},
		{"-5", 0},
		{"soon", 0},
		{"", 0},
		{"Sun, 29 Nov 2026 12:00:30 GMT", 30 * time.Second},
		{"Sun, 29 Nov 2026 11:00:00 GMT", 0},
		{"99999999999999", 365 * 24 * time.Hour},
	}
	for _, tc := range cases {
		if got := ParseRetryAfter(tc.in, now); got != tc.want {
			t.Errorf("ParseRetryAfter(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// FuzzReadAnswer: no panic, no hang, never more than the limit read into
// the answer.
func FuzzReadAnswer(f *testing.F) {
	f.Add([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: x\r\n\r\n\x81\x05hello"))
	f.Add([]byte("HTTP/1.1 429 Too Many\r\nRetry-After: 3\r\n\r\n"))
	f.Add([]byte("HTTP/1.0 200\n\n"))
	f.Add([]byte("HTTP/1.1 101\r\nA:\r\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		const limit = 1024
		a, err := ReadAnswer(bufio.NewReaderSize(strings.NewReader(string(in)), 64), limit)
		if err != nil {
			return
		}
		if len(a.Raw) > limit {
			t.Fatalf("raw of %d bytes beyond the limit", len(a.Raw))
		}
		if a.Status < 100 || a.Status > 999 {
			t.Fatalf("status %d", a.Status)
		}
		ParseRetryAfter(a.Header.Get("Retry-After"), time.Now())
	})
}

// TestRawWithHeaders: the gateway's header goes in as the last header line
// with the answer's own line ending, replaces a provider's line of the
// same field, and the result parses back to the same answer plus it.
func TestRawWithHeaders(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"crlf",
			"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
			"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nBrowser-Failover-Session: abc\r\n\r\n"},
		{"lf",
			"HTTP/1.1 101 Switching Protocols\nUpgrade: websocket\n\n",
			"HTTP/1.1 101 Switching Protocols\nUpgrade: websocket\nBrowser-Failover-Session: abc\n\n"},
		{"replaces the provider's",
			"HTTP/1.1 101 Switching Protocols\r\nbrowser-failover-session: theirs\r\nUpgrade: websocket\r\nBROWSER-FAILOVER-SESSION:x\r\n\r\n",
			"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nBrowser-Failover-Session: abc\r\n\r\n"},
		{"no headers", "HTTP/1.1 101 OK\r\n\r\n", "HTTP/1.1 101 OK\r\nBrowser-Failover-Session: abc\r\n\r\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := ReadAnswer(bufio.NewReader(strings.NewReader(tc.in)), MaxAnswerHeader)
			if err != nil {
				t.Fatal(err)
			}
			got := a.RawWithHeaders(HeaderField{"Browser-Failover-Session", "abc"})
			if string(got) != tc.want {
				t.Fatalf("got %q\nwant %q", got, tc.want)
			}
			if string(a.Raw) != tc.in {
				t.Fatal("Raw was changed")
			}
			b, err := ReadAnswer(bufio.NewReader(strings.NewReader(string(got)+"rest")), MaxAnswerHeader)
			if err != nil {
				t.Fatal(err)
			}
			if v := b.Header.Values("Browser-Failover-Session"); len(v) != 1 || v[0] != "abc" || b.Status != a.Status {
				t.Fatalf("parsed back: %d %v", b.Status, b.Header)
			}
		})
	}
}
