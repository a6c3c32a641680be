package browserfailover_test

// Status hygiene: client_limit keys shown as an HMAC keyed with the
// deployment's secret (kept in Caddy's storage, agreed on through Redis
// under state redis), and a query item without "=" shown as REDACTED.

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
	"github.com/browserfailover/caddy-browser-failover/pool"
)

// hmacKey is what the status should show of value under secret.
func hmacKey(secret []byte, value string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(value))
	return "hmac:" + hex.EncodeToString(m.Sum(nil)[:8])
}

// statusKeys opens a session under key through g and returns the client
// keys the status shows meanwhile.
func statusKeys(t *testing.T, g *testgw.Gateway, key string) []string {
	t.Helper()
	c, _, err := dial(t, g.WS("/"), &websocket.DialOptions{HTTPHeader: http.Header{"X-Api-Key": {key}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(websocket.StatusNormalClosure, "")
	_, raw := opAdmin(t, g, http.MethodGet, "/browser_failover/status")
	if strings.Contains(string(raw), key) {
		t.Fatalf("the status shows the key: %s", raw)
	}
	var st struct {
		Clients []struct {
			Key string `json:"key"`
		} `json:"clients"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, cl := range st.Clients {
		keys = append(keys, cl.Key)
	}
	return keys
}

// storedKeySecret reads the client key secret from g's storage.
func storedKeySecret(t *testing.T, g *testgw.Gateway) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(g.Storage, "browser_failover", "client_key_secret"))
	if err != nil {
		t.Fatalf("client key secret not in the storage: %v", err)
	}
	secret, err := hex.DecodeString(string(b))
	if err != nil || len(secret) < 16 {
		t.Fatalf("stored secret %q: %v", b, err)
	}
	return secret
}

// TestClientKeysKeyedAndStable: the status shows a client key as the HMAC
// keyed with the secret in Caddy's storage, not as anything computable from
// the value alone; a restart (a fresh process secret, the same storage)
// shows the same key again.
func TestClientKeysKeyedAndStable(t *testing.T) {
	echo := fakes.Echo("ck-echo", nil)
	defer echo.Close()
	h := handler(`"client_limit":{"key":"{http.request.header.X-Api-Key}","limit":3}`, provider("ck-echo", echo.URL(), ""))
	g := testgw.Start(t, h)
	const key = "user-4711"
	secret := storedKeySecret(t, g)
	want := hmacKey(secret, key)
	if got := statusKeys(t, g, key); len(got) != 1 || got[0] != want {
		t.Fatalf("status keys %v, want [%s]", got, want)
	}
	unkeyed := sha256.Sum256([]byte(key))
	if strings.Contains(want, hex.EncodeToString(unkeyed[:6])) {
		t.Fatal("the shown key is the unkeyed hash")
	}

	// A new process would start with a secret of its own until it loads
	// the stored one.
	fresh := make([]byte, 32)
	_, _ = rand.Read(fresh)
	pool.Current().Hashes.SetSecret(fresh)
	if pool.Current().Hashes.ShownKey(key) == want {
		t.Fatal("the process secret did not change")
	}
	if err := g.Reload(handler(`"max_attempts":3,"client_limit":{"key":"{http.request.header.X-Api-Key}","limit":3}`, provider("ck-echo", echo.URL(), ""))); err != nil {
		t.Fatal(err)
	}
	if got := statusKeys(t, g, key); len(got) != 1 || got[0] != want {
		t.Fatalf("after a restart: status keys %v, want the same %s", got, want)
	}
}

// TestClientKeysSharedSecret: under state redis the secret another node
// already keeps in Redis wins over this node's stored one, and is then
// kept in this node's storage too: every node shows the same keys.
func TestClientKeysSharedSecret(t *testing.T) {
	rs := testredis.Start(t)
	other := otherNode(t, rs.Addr())
	theirs := make([]byte, 32)
	_, _ = rand.Read(theirs)
	agreed, err := other.AgreeSecret(context.Background(), "client_key", theirs)
	if err != nil || hex.EncodeToString(agreed) != hex.EncodeToString(theirs) {
		t.Fatalf("AgreeSecret: %x %v", agreed, err)
	}
	echo := fakes.Echo("cks-echo", nil)
	defer echo.Close()
	g := testgw.Start(t, handler(`"client_limit":{"key":"{http.request.header.X-Api-Key}","limit":3},`+stateJSON(rs.Addr(), "local"),
		provider("cks-echo", echo.URL(), "")))
	const key = "10.1.2.3"
	if got := statusKeys(t, g, key); len(got) != 1 || got[0] != hmacKey(theirs, key) {
		t.Fatalf("status keys %v, want the HMAC with the cluster's secret %s", got, hmacKey(theirs, key))
	}
	if got := storedKeySecret(t, g); hex.EncodeToString(got) != hex.EncodeToString(theirs) {
		t.Fatal("the cluster's secret was not kept in the storage")
	}
	// A second AgreeSecret proposing another value gets the kept one.
	again, err := other.AgreeSecret(context.Background(), "client_key", []byte("something else entirely"))
	if err != nil || hex.EncodeToString(again) != hex.EncodeToString(theirs) {
		t.Fatalf("AgreeSecret again: %x %v", again, err)
	}
}

// TestQueryItemWithoutValueRedacted: a provider URL whose query holds an
// item without "=" (a bare token) shows it as REDACTED, not as a key.
func TestQueryItemWithoutValueRedacted(t *testing.T) {
	echo := fakes.Echo("qr-echo", nil)
	defer echo.Close()
	const secret = "s3cr3tT0k3n"
	g := testgw.Start(t, handler("", provider("qr-echo", echo.URL()+"?"+secret+"&region=eu", "")))
	st, raw := opStatus(t, g)
	if got := st.provider(t, "qr-echo").URL; got != echo.URL()+"?REDACTED&region=REDACTED" {
		t.Fatalf("shown URL %q", got)
	}
	if strings.Contains(string(raw), secret) {
		t.Fatalf("status shows the bare query item: %s", raw)
	}
}
