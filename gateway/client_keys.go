package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// The status shows each client_limit key value as a keyed hash
// (pool.Hashes.ShownKey): HMAC-SHA256 with a random secret of the deployment,
// made once and kept in Caddy's storage, so the shown keys stay the same
// across restarts; under state redis every node agrees on one secret
// through Redis, so they are the same on every node. Without the secret a
// shown key cannot be tested against likely values (user ids, IP
// addresses).

// Where the secret is kept.
const (
	clientKeySecretStorageKey = "browser_failover/client_key_secret"
	clientKeySecretLock       = "browser_failover_client_key_secret"
	clientKeySecretName       = "client_key"
	clientKeySecretSize       = 32
)

// clientKeyRetry is how often a node that could not reach Redis for the
// secret asks again.
const clientKeyRetry = 5 * time.Second

// provisionClientKeys sets the secret the client keys are hashed with.
// Trouble is logged, never fatal: a node then hashes with a secret of its
// own, and the status' keys differ from the other nodes' until it has
// the shared one.
func (h *Gateway) provisionClientKeys(ctx caddy.Context) {
	if h.ClientLimit == nil && h.Resume == nil && !h.webdriver {
		// Nothing is hashed with it: no client keys, no resume tokens
		// or resume keys, no WebDriver session's route (whose key and
		// client are hashed with it, the same on every node).
		return
	}
	secret, err := storedSecret(ctx)
	if err != nil {
		h.logger.Warn("client key secret not kept in storage; client keys in the status change on restart",
			zap.Error(err))
	}
	h.reg.Hashes.SetSecret(secret)
	sh := h.shared
	if sh == nil {
		return
	}
	if secret == nil {
		secret = randomSecret()
	}
	agree := func() bool {
		c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		agreed, err := sh.s.Store().AgreeSecret(c, clientKeySecretName, secret)
		if err != nil {
			return false
		}
		h.reg.Hashes.SetSecret(agreed)
		if !equalBytes(agreed, secret) {
			// Kept here too, so a restart without Redis keeps it.
			if err := storeSecret(ctx, agreed); err != nil {
				h.logger.Debug("shared client key secret not kept in storage", zap.Error(err))
			}
		}
		return true
	}
	if sh.s.Usable() && agree() {
		return
	}
	h.logger.Warn("shared state unavailable: client keys in the status are hashed with this node's own secret until Redis answers")
	stop := sh.stop
	go func() {
		t := time.NewTicker(clientKeyRetry)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if agree() {
					h.logger.Info("client key secret agreed through the shared state")
					return
				}
			}
		}
	}()
}

// storedSecret loads the secret from Caddy's storage, making it on first
// use (under the storage's lock, so processes sharing a storage make one).
func storedSecret(ctx caddy.Context) ([]byte, error) {
	st := ctx.Storage()
	if st == nil {
		return nil, errors.New("no storage")
	}
	c, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	load := func() ([]byte, error) {
		b, err := st.Load(c, clientKeySecretStorageKey)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, nil
			}
			return nil, fmt.Errorf("loading %s: %w", clientKeySecretStorageKey, err)
		}
		if secret, err := hex.DecodeString(string(b)); err == nil && len(secret) >= 16 {
			return secret, nil
		}
		return nil, nil // unreadable: made anew
	}
	if secret, err := load(); secret != nil || err != nil {
		return secret, err
	}
	if err := st.Lock(c, clientKeySecretLock); err != nil {
		return nil, fmt.Errorf("locking the storage: %w", err)
	}
	defer func() { _ = st.Unlock(context.Background(), clientKeySecretLock) }()
	// Another process may have made it meanwhile.
	if secret, err := load(); secret != nil || err != nil {
		return secret, err
	}
	secret := randomSecret()
	if err := st.Store(c, clientKeySecretStorageKey, []byte(hex.EncodeToString(secret))); err != nil {
		return nil, fmt.Errorf("storing %s: %w", clientKeySecretStorageKey, err)
	}
	return secret, nil
}

// storeSecret replaces the stored secret.
func storeSecret(ctx caddy.Context, secret []byte) error {
	st := ctx.Storage()
	if st == nil {
		return errors.New("no storage")
	}
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return st.Store(c, clientKeySecretStorageKey, []byte(hex.EncodeToString(secret)))
}

func randomSecret() []byte {
	b := make([]byte, clientKeySecretSize)
	_, _ = rand.Read(b)
	return b
}

func equalBytes(a, b []byte) bool { return string(a) == string(b) }
