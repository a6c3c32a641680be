package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// provisionKey names the handler (pool.Handlers.Key): a hash of its
// configuration as loaded (placeholders unresolved, so a secret's value is
// never part of it) and its place among the handlers of its config load
// with the same configuration. What the handler makes for its clients
// carries the key, and serves only clients of a handler with the same key.
// The shared state's node name is not part of it: it names the node, not
// the handler, and nodes of one deployment each have their own.
func (h *Gateway) provisionKey() {
	b, _ := json.Marshal(h) // its configuration: the runtime is unexported
	var cfg map[string]any
	if json.Unmarshal(b, &cfg) == nil {
		if st, ok := cfg["state"].(map[string]any); ok {
			delete(st, "node")
		}
		b, _ = json.Marshal(cfg) // object keys in order: the same bytes for the same config
	}
	sum := sha256.Sum256(b)
	h.key = h.reg.Handlers.Key(h.gen, hex.EncodeToString(sum[:12]))
}

// retireKey takes the handler off the registry's live handlers (its
// Cleanup). When the reload gave its block a new key, the WebDriver
// sessions bound to its key move to the handler that replaces it (the
// registry's Retired), and those whose route is in the shared state have
// it written again with the new key.
func (h *Gateway) retireKey() {
	ret, ok := h.reg.Handlers.Retire(h)
	if !ok || ret.Successor == "" {
		return
	}
	for _, l := range ret.Moved {
		if s, ok := l.(*wdSession); ok {
			s.rebind(ret.Successor)
		}
	}
}
