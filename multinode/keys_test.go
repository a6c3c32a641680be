package multinode_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/testredis"
)

// TestClusterClientKeysAgree: every node, each with its own storage,
// shows a client_limit key value as the same keyed hash (the nodes agree
// on one secret through Redis), never as the value or its plain SHA-256.
func TestClusterClientKeysAgree(t *testing.T) {
	r := testredis.Start(t)
	echo := startEcho(t)
	nodes := startCluster(t, r, clusterConfig{providers: []map[string]any{echoJSON(echo, 1)}, queueSize: 10},
		func(_ string, h map[string]any) {
			h["client_limit"] = map[string]any{"key": "{http.request.header.X-Api-Key}", "limit": 5}
		})
	const key = "203.0.113.7"
	shown := map[string]string{}
	for _, g := range nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		c, _, err := websocket.Dial(ctx, g.WS(), &websocket.DialOptions{HTTPHeader: http.Header{"X-Api-Key": {key}}})
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", g.Name, err)
		}
		b, err := g.get("/browser_failover/status")
		c.CloseNow()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), key) {
			t.Fatalf("%s shows the key: %s", g.Name, b)
		}
		var st struct {
			Clients []struct {
				Key string `json:"key"`
			} `json:"clients"`
		}
		if err := json.Unmarshal(b, &st); err != nil || len(st.Clients) != 1 || !strings.HasPrefix(st.Clients[0].Key, "hmac:") {
			t.Fatalf("%s: clients %s %v", g.Name, b, err)
		}
		shown[g.Name] = st.Clients[0].Key
	}
	if shown["gw-1"] != shown["gw-2"] || shown["gw-2"] != shown["gw-3"] {
		t.Fatalf("the nodes show one key value differently: %v", shown)
	}
	t.Logf("every node shows %s", shown["gw-1"])
}
