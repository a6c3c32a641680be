package multinode_test

// No billed browser left behind: a gateway killed with kill -9 leaves its
// created provider sessions in the ledger, on Caddy's storage, and the
// process that starts next on that storage releases each of them once.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
)

// ledgerHandler is a handler whose one provider creates its sessions over
// the fake REST API f.
func ledgerHandler(f *fakes.REST) map[string]any {
	return map[string]any{
		"handler": "browser_failover",
		"providers": []map[string]any{{
			"name": "cloud", "url": f.URL(), "connect_timeout": "60s",
			"session_api": map[string]any{
				"create_method": "POST", "create_url": "/v1/sessions",
				"connect_url": "/connectUrl", "session_id": "/id",
				"release_method": "POST", "release_url": "/v1/sessions/{session_id}/release",
			},
		}},
		"try_duration": "60s",
	}
}

// ledgerEntries lists the entry files under the storage's ledger.
func ledgerEntries(t *testing.T, storage string) []string {
	t.Helper()
	var out []string
	filepath.Walk(filepath.Join(storage, "browser_failover", "ledger", "entries"), func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// TestLedgerReapsAfterKill: three live sessions and one created whose
// connect URL hangs (the crash comes between create and dial); kill -9;
// a restart on the same storage releases all four, each once, and says
// so in its status and log. A normal end after that leaves nothing for
// the next start to release again.
func TestLedgerReapsAfterKill(t *testing.T) {
	echo := fakes.Echo("browser", nil)
	defer echo.Close()
	hang := fakes.Hang("hang", nil)
	defer hang.Close()
	var f *fakes.REST
	f = fakes.NewREST(func(id string) string {
		if id == "s4" {
			return "ws://" + hang.Addr + "/"
		}
		return echo.URL()
	})
	defer f.Close()
	storage := t.TempDir()

	gw := startNodeOn(t, "gw-1", ledgerHandler(f), storage)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 3 {
		c, err := openSession(ctx, gw.WS())
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
	}
	// The fourth client waits on a connect URL that never answers.
	go func() {
		c, _, err := websocket.Dial(ctx, gw.WS(), nil)
		if err == nil {
			c.CloseNow()
		}
	}()
	waitUntil(t, 10*time.Second, "four sessions created", func() bool { return len(f.Books().Created) == 4 })
	waitUntil(t, 10*time.Second, "four ledger entries", func() bool { return len(ledgerEntries(t, storage)) == 4 })
	// The count follows the entry's write.
	waitUntil(t, 5*time.Second, "status pending 4 before the kill", func() bool {
		raw, err := gw.get("/browser_failover/status")
		return err == nil && strings.Contains(string(raw), `"ledger":{"pending":4,"reaped":0}`)
	})
	gw.Kill()
	if b := f.Books(); len(b.Released) != 0 {
		t.Fatalf("released before the restart: %+v", b)
	}

	restarted := time.Now()
	gw2 := startNodeOn(t, "gw-1", ledgerHandler(f), storage)
	waitUntil(t, 30*time.Second, "the four sessions released", func() bool { return len(f.Books().Released) == 4 })
	t.Logf("released %v after the restart", time.Since(restarted).Round(100*time.Millisecond))
	// Each exactly once, and nothing left in the ledger.
	time.Sleep(500 * time.Millisecond)
	b := f.Books()
	if err := b.Balanced(); err != nil || len(b.Created) != 4 {
		t.Fatalf("books %+v: %v", b, err)
	}
	waitUntil(t, 5*time.Second, "an empty ledger", func() bool { return len(ledgerEntries(t, storage)) == 0 })
	raw, err := gw2.get("/browser_failover/status")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"ledger":{"pending":0,"reaped":4}`) {
		t.Fatalf("status: %s", raw)
	}
	logs, _ := os.ReadFile(gw2.LogPath)
	if n := strings.Count(string(logs), `"msg":"session reaped"`); n != 4 {
		t.Fatalf("%d 'session reaped' lines, want 4", n)
	}
	for _, id := range []string{"s1", "s2", "s3", "s4"} {
		if !strings.Contains(string(logs), fmt.Sprintf(`"provider_session_id":%q`, id)) {
			t.Fatalf("no reaped line for %s", id)
		}
	}

	// A session that ends normally, then a clean exit: nothing is left
	// for the next process to release.
	c, err := openSession(ctx, gw2.WS())
	if err != nil {
		t.Fatal(err)
	}
	c.Close(websocket.StatusNormalClosure, "")
	waitUntil(t, 10*time.Second, "the fifth session released", func() bool { return f.Books().Released["s5"] == 1 })
	gw2.Stop()
	if left := ledgerEntries(t, storage); len(left) != 0 {
		t.Fatalf("entries left after a clean exit: %v", left)
	}
	if owners, _ := os.ReadDir(filepath.Join(storage, "browser_failover", "ledger", "owners")); len(owners) != 0 {
		t.Fatalf("owners left after a clean exit: %d", len(owners))
	}
	// And a start after that releases nothing again.
	startNodeOn(t, "gw-1", ledgerHandler(f), storage)
	time.Sleep(time.Second) // its reap at start has run
	if b := f.Books(); b.Balanced() != nil || len(b.Created) != 5 {
		t.Fatalf("books after the next start: %+v: %v", b, b.Balanced())
	}
}

// waitUntil polls cond until it holds, failing the test after d.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after %v", what, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ledgerClusterHandler is ledgerHandler under state redis on r, as node,
// with an API key in the session API's headers (which must never reach
// Redis).
func ledgerClusterHandler(t *testing.T, r *testredis.Server, f *fakes.REST, node string) map[string]any {
	h := ledgerHandler(f)
	p := h["providers"].([]map[string]any)[0]
	api := p["session_api"].(map[string]any)
	api["headers"] = []map[string]any{{"field": "X-Api-Key", "value": ledgerAPIKey}}
	h["state"] = map[string]any{
		"redis": map[string]any{
			"address":    r.Addr(),
			"key_prefix": "multinode:" + t.Name() + ":",
			"lease_ttl":  leaseTTL.String(),
			"timeout":    "300ms",
		},
		"node": node,
	}
	h["reap_interval"] = ledgerReap.String()
	return h
}

// ledgerReap is the reap_interval of the cluster test's nodes.
const ledgerReap = 2 * time.Second

const ledgerAPIKey = "ledger-api-key-5e1f"

// TestLedgerClusterReapsDeadNode: under state redis the ledger is in
// Redis; a node killed with two live sessions has them released by the
// other node within lease_ttl + reap_interval, each once. Then both nodes
// die with sessions and restart together: each entry is released once.
func TestLedgerClusterReapsDeadNode(t *testing.T) {
	r := testredis.Start(t)
	echo := fakes.Echo("browser", nil)
	defer echo.Close()
	f := fakes.NewREST(func(string) string { return echo.URL() })
	defer f.Close()
	gw1 := startNode(t, "gw-1", ledgerClusterHandler(t, r, f, "gw-1"))
	gw2 := startNode(t, "gw-2", ledgerClusterHandler(t, r, f, "gw-2"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for range 2 {
		c, err := openSession(ctx, gw1.WS())
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
	}
	waitUntil(t, 10*time.Second, "two sessions created", func() bool { return len(f.Books().Created) == 2 })
	if dump := redisDump(t, r); !strings.Contains(dump, "{ledger}:") || strings.Contains(dump, ledgerAPIKey) {
		t.Fatalf("Redis holds no ledger entry, or the API key:\n%s", dump)
	}
	gw1.Kill()
	killed := time.Now()
	waitUntil(t, leaseTTL+ledgerReap+5*time.Second, "gw-2 released gw-1's sessions", func() bool { return len(f.Books().Released) == 2 })
	t.Logf("released %v after the kill (lease_ttl %v, reap_interval %v)", time.Since(killed).Round(100*time.Millisecond), leaseTTL, ledgerReap)
	waitUntil(t, 5*time.Second, "gw-2 shows them reaped", func() bool {
		raw, err := gw2.get("/browser_failover/status")
		return err == nil && strings.Contains(string(raw), `"ledger":{"pending":0,"reaped":2}`)
	})

	// Both die with sessions; both restart together.
	gw3 := startNode(t, "gw-3", ledgerClusterHandler(t, r, f, "gw-3"))
	for _, g := range []*node{gw2, gw3} {
		for range 2 {
			c, err := openSession(ctx, g.WS())
			if err != nil {
				t.Fatal(err)
			}
			defer c.CloseNow()
		}
	}
	waitUntil(t, 10*time.Second, "six sessions created", func() bool { return len(f.Books().Created) == 6 })
	gw2.Kill()
	gw3.Kill()
	startNode(t, "gw-4", ledgerClusterHandler(t, r, f, "gw-4"))
	startNode(t, "gw-5", ledgerClusterHandler(t, r, f, "gw-5"))
	waitUntil(t, leaseTTL+10*time.Second, "every session released", func() bool { return len(f.Books().Released) == 6 })
	time.Sleep(leaseTTL)
	if err := f.Books().Balanced(); err != nil {
		t.Fatal(err)
	}
}
