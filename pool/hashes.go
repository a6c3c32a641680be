package pool

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"sync/atomic"
)

// Hashes are how what could serve as a credential is kept and shown: a
// client key's value in status, a resume key, a resume token, a
// WebDriver session's path secret in the shared state, the client key
// values a WebDriver session is bound to there. Each is an HMAC-SHA256
// keyed with the deployment's secret (SetSecret): the same on every node
// and across restarts, and no likely value can be tried against it
// without the secret. Until a handler sets it, the secret is random.
type Hashes struct {
	secret atomic.Pointer[[]byte]
}

func newHashes() *Hashes {
	h := &Hashes{}
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	h.secret.Store(&secret)
	return h
}

// SetSecret sets the secret the hashes are keyed with: the deployment's,
// kept in Caddy's storage (and agreed on through the shared state by
// every node), so the shown keys are the same on every node and across
// restarts. An empty secret changes nothing.
func (h *Hashes) SetSecret(secret []byte) {
	if len(secret) == 0 {
		return
	}
	b := append([]byte(nil), secret...)
	h.secret.Store(&b)
}

// ShownKey is how a key value appears in status: "hmac:" and 16 hex
// digits of its HMAC-SHA256 keyed with the deployment's secret, never the
// value itself (it may be an API key or a user id). Without the secret,
// likely values cannot be tried against it.
func (h *Hashes) ShownKey(value string) string {
	if value == "" {
		return "(empty)"
	}
	m := hmac.New(sha256.New, *h.secret.Load())
	m.Write([]byte(value))
	return "hmac:" + hex.EncodeToString(m.Sum(nil)[:8])
}

// ResumeKey is how a resume key value is kept: the whole HMAC-SHA256
// keyed with the deployment's secret, hex (the same on every node). The
// value itself (a user id, a token) is never kept.
func (h *Hashes) ResumeKey(value string) string {
	return h.keyed("resume\x00", value)
}

// ResumeToken is how a resume token is kept: like ResumeKey, under a
// label of its own. Knowing the hash does not help to present the token.
func (h *Hashes) ResumeToken(token string) string {
	return h.keyed("resume token\x00", token)
}

// RouteKey is the name of a session's route in the shared state: the
// HMAC-SHA256 of its path secret keyed with the deployment's secret (the
// one every node agrees on through the shared state), hex. Another node
// finds the route from the secret a client sends; whoever reads Redis
// cannot send it.
func (h *Hashes) RouteKey(secret string) string {
	return h.keyed("webdriver session\x00", secret)
}

// SharedClient is how the client key values of a bound session are kept
// in its route in the shared state: keyed like RouteKey, so that likely
// values (user names, API keys) cannot be tried against it.
func (h *Hashes) SharedClient(values []string) string {
	return h.keyed("webdriver client\x00", joinValues(values))
}

func (h *Hashes) keyed(label, value string) string {
	m := hmac.New(sha256.New, *h.secret.Load())
	m.Write([]byte(label))
	m.Write([]byte(value))
	return hex.EncodeToString(m.Sum(nil))
}
