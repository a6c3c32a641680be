package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
)

// dialBrowserless opens a CDP session at u and checks that its browser
// answers Browser.getVersion.
func dialBrowserless(t *testing.T, u string, id int) *websocket.Conn {
	t.Helper()
	// A session is a Chromium browserless launches first: bounded
	// generously, the machine may be busy.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, u, nil)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("session %d: dial: %v (status %d)", id, err, status)
	}
	c.SetReadLimit(16 << 20)
	var v struct {
		Product string `json:"product"`
	}
	if err := json.Unmarshal(cdpCall(t, c, id, "Browser.getVersion", nil), &v); err != nil || v.Product == "" {
		t.Fatalf("session %d: Browser.getVersion: %q, %v", id, v.Product, err)
	}
	t.Logf("session %d: %s", id, v.Product)
	return c
}

// refusedBy dials u expecting a refusal and returns the answer, its body
// read.
func refusedBy(t *testing.T, u string) (*http.Response, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, u, nil)
	if err == nil {
		c.CloseNow()
		t.Fatalf("dial %s: got a session, want a refusal", u)
	}
	if resp == nil {
		t.Fatalf("dial %s: no answer: %v", u, err)
	}
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// pressureUntil polls /pressure until cond holds and returns that answer.
func pressureUntil(t *testing.T, s *BrowserlessServer, what string, cond func(BrowserlessPressure) bool) (BrowserlessPressure, string) {
	t.Helper()
	var (
		p   BrowserlessPressure
		raw []byte
		err error
	)
	testgw.Eventually(t, 30*time.Second, "/pressure to say "+what, func() bool {
		p, raw, err = s.Pressure()
		return err == nil && cond(p)
	})
	return p, string(raw)
}

// TestBrowserlessHarness: a real browserless v2 capped at two sessions
// and no queue takes two CDP sessions at once (each browser answers), and
// answers a third upgrade 429; its /pressure says full while both run,
// and once one ends it takes a new session. Without the token it answers
// 401.
func TestBrowserlessHarness(t *testing.T) {
	s := StartBrowserlessServer(t, 2, 0)

	_, raw := pressureUntil(t, s, "available with no session", func(p BrowserlessPressure) bool {
		return p.IsAvailable && p.Running == 0 && p.MaxConcurrent == 2 && p.MaxQueued == 0
	})
	t.Logf("/pressure, idle: %s", compactJSON(raw))

	noToken := strings.TrimSuffix(s.URL, "?token="+BrowserlessToken)
	if resp, body := refusedBy(t, noToken); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("without the token: %d %q, want 401", resp.StatusCode, body)
	}

	first := dialBrowserless(t, s.URL, 1)
	defer first.CloseNow()
	second := dialBrowserless(t, s.URL, 2)
	defer second.CloseNow()

	resp, body := refusedBy(t, s.URL)
	t.Logf("third session: %s %v body %q", resp.Status, resp.Header, body)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third session: %d %q, want 429", resp.StatusCode, body)
	}
	if !strings.Contains(body, "Too many requests") {
		t.Errorf("third session: body %q, want browserless's Too many requests", body)
	}

	p, raw := pressureUntil(t, s, "full", func(p BrowserlessPressure) bool {
		return p.Running == 2
	})
	t.Logf("/pressure, full: %s", compactJSON(raw))
	if p.IsAvailable || p.Reason != "full" || p.Queued != 0 || p.RecentlyRejected < 1 {
		t.Errorf("/pressure with two sessions: %+v, want not available, reason full, none queued, the refusal counted", p)
	}

	// Both browsers still answer.
	cdpCall(t, first, 3, "Browser.getVersion", nil)
	cdpCall(t, second, 4, "Browser.getVersion", nil)

	first.Close(websocket.StatusNormalClosure, "")
	_, raw = pressureUntil(t, s, "available with one session", func(p BrowserlessPressure) bool {
		return p.IsAvailable && p.Running == 1
	})
	t.Logf("/pressure, one session ended: %s", compactJSON(raw))
	third := dialBrowserless(t, s.URL, 5)
	third.Close(websocket.StatusNormalClosure, "")
	second.Close(websocket.StatusNormalClosure, "")
	pressureUntil(t, s, "idle", func(p BrowserlessPressure) bool {
		return p.IsAvailable && p.Running == 0
	})
}

// compactJSON is raw on one line.
func compactJSON(raw string) string {
	var b bytes.Buffer
	if json.Compact(&b, []byte(raw)) != nil {
		return raw
	}
	return b.String()
}
