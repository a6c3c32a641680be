package browserfailover_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
)

// waitExit waits for a Caddy process sent SIGTERM to exit cleanly.
func waitExit(t *testing.T, p *caddyProc) {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Fatalf("caddy exited with %v", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("caddy did not exit after SIGTERM")
	}
}

// shutdownAnswer is what a client got from the gateway while it exited.
type shutdownAnswer struct {
	status     int
	retryAfter string
	body       string
	err        error
}

// dialDuringShutdown dials url and reports the HTTP answer it got (0 for
// a session, which it closes at once).
func dialDuringShutdown(url string) shutdownAnswer {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, url, nil)
	if err == nil {
		c.CloseNow()
		return shutdownAnswer{status: http.StatusSwitchingProtocols}
	}
	if resp == nil {
		return shutdownAnswer{err: err}
	}
	b, _ := io.ReadAll(resp.Body)
	return shutdownAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(b)}
}

// TestShutdownServesNoWaiter: a client waiting in the queue when the
// process begins to exit gets 503 with Retry-After, not a session that
// shutdown would end at once: the slot shutdown frees is given to nobody,
// and the provider is contacted only for the session that was live.
func TestShutdownServesNoWaiter(t *testing.T) {
	var contacts fakes.Contacts
	echo := fakes.Echo("sd-echo", &contacts)
	defer echo.Close()
	addr, admin := testgw.FreePort(t), testgw.FreePort(t)
	p := startCaddy(t, fmt.Sprintf(`{
	admin %s
	auto_https off
}

http://%s {
	browser_failover {
		provider sd-echo %s {
			max_concurrent 1
		}
		queue {
			size 5
			timeout 30s
		}
	}
}
`, admin, addr, echo.URL()), func() bool {
		resp, err := http.Get("http://" + addr + "/json/version")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
	live, _, err := dial(t, "ws://"+addr+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer live.CloseNow()
	echoOnce(t, live, []byte("hi"))
	go live.Read(context.Background())

	answer := make(chan shutdownAnswer, 1)
	go func() { answer <- dialDuringShutdown("ws://" + addr + "/") }()
	testgw.Eventually(t, 10*time.Second, "the second client waiting", func() bool {
		resp, err := http.Get("http://" + admin + "/browser_failover/status")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var st struct {
			Queues []struct {
				Waiting int `json:"waiting"`
			} `json:"queues"`
		}
		return json.NewDecoder(resp.Body).Decode(&st) == nil && len(st.Queues) == 1 && st.Queues[0].Waiting == 1
	})
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	a := <-answer
	if a.status != http.StatusServiceUnavailable || a.retryAfter == "" || !strings.Contains(a.body, "shutting down") {
		t.Fatalf("the waiter got %+v, want 503 with Retry-After", a)
	}
	waitExit(t, p)
	if l := contacts.List(); len(l) != 1 {
		t.Fatalf("the provider was contacted %d times, want once (the live session's)", len(l))
	}
}

// TestShutdownMidCreate: a create call in flight when the process begins
// to exit is waited for, and the session it creates is released, whether
// its client is still there (it gets 503) or already gone, with and
// without a shutdown grace period; no session is dialed, and the process
// exits.
func TestShutdownMidCreate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		grace string
		stay  bool
	}{
		{"client waits", "", true},
		{"client gone", "", false},
		{"client gone, grace_period", "grace_period 10s", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			echo := fakes.Echo("smc-echo", nil)
			defer echo.Close()
			f := fakes.NewREST(func(id string) string { return echo.URL() + "devtools/browser/" + id })
			defer f.Close()
			started := make(chan struct{}, 1)
			f.OnCreate = func(http.ResponseWriter, *http.Request) bool {
				started <- struct{}{}
				time.Sleep(4 * time.Second) // a slow create, answered after the exit began
				return false
			}
			addr, admin := testgw.FreePort(t), testgw.FreePort(t)
			p := startCaddy(t, fmt.Sprintf(`{
	admin %s
	auto_https off
	%s
}

http://%s {
	browser_failover {
		provider bb %s {
			session_api {
				create POST /v1/sessions
				connect_url /connectUrl
				session_id /id
				release POST /v1/sessions/{session_id}/release
			}
		}
	}
}
`, admin, tc.grace, addr, f.URL()), func() bool {
				resp, err := http.Get("http://" + addr + "/json/version")
				if err != nil {
					return false
				}
				resp.Body.Close()
				return true
			})
			answer := make(chan shutdownAnswer, 1)
			if tc.stay {
				go func() { answer <- dialDuringShutdown("ws://" + addr + "/") }()
			} else {
				// A client that sends its upgrade and leaves.
				conn, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
					"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", addr)
				<-started
				conn.Close()
			}
			if tc.stay {
				select {
				case <-started:
				case <-time.After(10 * time.Second):
					t.Fatal("no create call")
				}
			}
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if tc.stay {
				if a := <-answer; a.status != http.StatusServiceUnavailable || a.retryAfter == "" {
					t.Fatalf("the client got %+v, want 503 with Retry-After", a)
				}
			}
			waitExit(t, p)
			b := f.Books()
			if err := b.Balanced(); err != nil || len(b.Created) != 1 {
				t.Fatalf("after the exit: %v, created %d: want 1, released once", err, len(b.Created))
			}
			if echo.Hits.Load() != 0 {
				t.Fatalf("a session was dialed during shutdown (%d)", echo.Hits.Load())
			}
		})
	}
}
