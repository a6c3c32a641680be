package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// provisionKey names the handler (pool.Registry.HandlerKey): a hash of its
// configuration as loaded (placeholders unresolved, so a secret's value is
// never part of it) and its place among the handlers of its config load
// with the same configuration. What the handler makes for its clients
// carries the key, and serves only clients of a handler with the same key.
func (h *Gateway) provisionKey() {
	b, _ := json.Marshal(h) // its configuration: the runtime is unexported
	sum := sha256.Sum256(b)
	h.key = h.reg.HandlerKey(h.gen, hex.EncodeToString(sum[:12]))
}
