package profiles

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
)

// ErrCannotOpen is the error of a blob the key cannot open: sealed under
// another key, tampered with, moved to another ID or scope, or not a
// profile at all.
var ErrCannotOpen = errors.New("the profile cannot be read with the configured key (the key changed, or the stored profile was altered)")

// magic starts every blob: its format's name and version.
const magic = "BFP1"

// Sealer seals and opens profiles with one AES-256-GCM key.
type Sealer struct {
	aead cipher.AEAD
}

// NewSealer is a sealer with key, 32 bytes.
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) != 32 {
		return nil, fmt.Errorf("a profile key is 32 bytes, got %d", len(key))
	}
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(b)
	if err != nil {
		return nil, err
	}
	return &Sealer{aead: aead}, nil
}

// additional is the additional data of profile id in scope: a blob
// opens only under the name it was sealed for.
func additional(scope, id string) []byte {
	return []byte("browser_failover profile\x00" + scope + "\x00" + id)
}

// Seal is plain sealed for profile id in scope, under a fresh random
// nonce.
func (s *Sealer) Seal(scope, id string, plain []byte) ([]byte, error) {
	ns := s.aead.NonceSize()
	out := make([]byte, len(magic)+ns, len(magic)+ns+len(plain)+s.aead.Overhead())
	copy(out, magic)
	if _, err := rand.Read(out[len(magic):]); err != nil {
		return nil, err
	}
	return s.aead.Seal(out, out[len(magic):], plain, additional(scope, id)), nil
}

// Open is blob opened as profile id in scope; ErrCannotOpen when it does
// not open.
func (s *Sealer) Open(scope, id string, blob []byte) ([]byte, error) {
	ns := s.aead.NonceSize()
	if len(blob) < len(magic)+ns+s.aead.Overhead() || string(blob[:len(magic)]) != magic {
		return nil, ErrCannotOpen
	}
	nonce := blob[len(magic) : len(magic)+ns]
	plain, err := s.aead.Open(nil, nonce, blob[len(magic)+ns:], additional(scope, id))
	if err != nil {
		return nil, ErrCannotOpen
	}
	return plain, nil
}
