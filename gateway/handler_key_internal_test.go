package gateway

import (
	"testing"

	"github.com/browserfailover/caddy-browser-failover/config"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// TestHandlerKeyOfNodes: two nodes of one deployment, whose configs differ
// only in their node names, give a handler the same key, so that what one
// node's handler made serves the same handler's clients on the other; any
// other change of the block is another key, and so are WebDriver
// clients' path IDs from operators' session IDs in form.
func TestHandlerKeyOfNodes(t *testing.T) {
	reg := pool.NewRegistry(nil)
	key := func(node string, limit int) string {
		h := &Gateway{Handler: &config.Handler{}}
		h.Providers = []*config.ProviderConfig{{Config: upstreams.Config{Name: "cd", URL: "http://127.0.0.1:9515"}}}
		h.State = &config.StateConfig{Node: node}
		h.ClientLimit = &config.ClientLimitConfig{Key: "{http.auth.user.id}", Limit: limit}
		h.reg, h.gen = reg, new(int) // a config load each
		h.provisionKey()
		return h.key
	}
	if a, b := key("gw-1", 1), key("gw-2", 1); a != b {
		t.Fatalf("nodes gw-1 and gw-2: keys %q and %q", a, b)
	}
	if a, b := key("gw-1", 1), key("gw-1", 2); a == b {
		t.Fatalf("another limit kept the key %q", a)
	}
	if p, op := newPathID(), newSessionID(); !validPathID(p) || validPathID(op) || validSessionID(p) || p == newPathID() {
		t.Fatalf("path ID %q, operator's ID %q", p, op)
	}
}
