package profiles

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/certmagic"
)

// Prefix is where profiles are kept in the storage.
const Prefix = "browser_failover/profiles"

// NoScope is the folder of the profiles of handlers without a scope.
const NoScope = "_"

// ErrTooLarge is Save's error for a profile over its store's max_size:
// nothing is written, the stored profile stays as it was.
var ErrTooLarge = errors.New("the profile is over max_size")

// ErrNotFound is the error of a profile that is not stored.
var ErrNotFound = errors.New("no such profile")

// Name is where a profile is kept: its scope's folder (NoScope, or the
// hex of the keyed hash of its scope value) and its ID.
type Name struct {
	Scope string
	ID    string
}

// Shown is the scope as status shows it: "hmac:<hex>", or "" for no
// scope.
func (n Name) Shown() string {
	if n.Scope == NoScope {
		return ""
	}
	return "hmac:" + n.Scope
}

// ScopeFolder is the folder of a scope as status shows it (Shown): ok
// false when shown is no scope's form.
func ScopeFolder(shown string) (string, bool) {
	if shown == "" {
		return NoScope, true
	}
	h, ok := strings.CutPrefix(shown, "hmac:")
	if !ok || !validHex(h) {
		return "", false
	}
	return h, true
}

// validHex reports whether h is a hashed scope's folder: 16 lowercase hex
// digits.
func validHex(h string) bool {
	if len(h) != 16 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil && strings.ToLower(h) == h
}

// ValidID reports whether id may name a profile: 1–64 ASCII letters,
// digits, '.', '_' or '-', and neither "." nor "..".
func ValidID(id string) bool {
	if id == "" || len(id) > 64 || id == "." || id == ".." {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func (n Name) valid() bool {
	return ValidID(n.ID) && (n.Scope == NoScope || validHex(n.Scope))
}

// Key is the storage key of profile n.
func Key(n Name) string { return path.Join(Prefix, n.Scope, n.ID) }

// Store is the profiles of one storage under one key.
type Store struct {
	st      certmagic.Storage
	seal    *Sealer
	maxSize int64
}

// NewStore is the store of profiles in st, sealed by seal, each at most
// maxSize bytes of JSON.
func NewStore(st certmagic.Storage, seal *Sealer, maxSize int64) *Store {
	return &Store{st: st, seal: seal, maxSize: maxSize}
}

// Storage is where the store keeps its profiles.
func (s *Store) Storage() certmagic.Storage { return s.st }

// Load reads profile n: nil without error when it is not stored;
// ErrCannotOpen (the blob left as it is) when the key does not open it.
func (s *Store) Load(ctx context.Context, n Name) (*Profile, error) {
	if !n.valid() {
		return nil, fmt.Errorf("profile %q: not a profile name", n.ID)
	}
	blob, err := s.st.Load(ctx, Key(n))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("profile %q: reading it: %w", n.ID, err)
	}
	plain, err := s.seal.Open(n.Scope, n.ID, blob)
	if err != nil {
		return nil, err
	}
	p := &Profile{}
	if err := json.Unmarshal(plain, p); err != nil {
		return nil, ErrCannotOpen
	}
	return p, nil
}

// Save seals p and writes it as profile n, replacing what was stored; it
// returns the bytes written. A profile whose JSON is over the store's
// max_size is not written (ErrTooLarge).
func (s *Store) Save(ctx context.Context, n Name, p *Profile) (int, error) {
	if !n.valid() {
		return 0, fmt.Errorf("profile %q: not a profile name", n.ID)
	}
	if p == nil {
		p = &Profile{}
	}
	if p.Cookies == nil {
		p.Cookies = []Cookie{}
	}
	if p.Origins == nil {
		p.Origins = []Origin{}
	}
	plain, err := json.Marshal(p)
	if err != nil {
		return 0, err
	}
	if s.maxSize > 0 && int64(len(plain)) > s.maxSize {
		return 0, fmt.Errorf("%w (%d bytes, max_size %d)", ErrTooLarge, len(plain), s.maxSize)
	}
	blob, err := s.seal.Seal(n.Scope, n.ID, plain)
	clear(plain)
	if err != nil {
		return 0, err
	}
	if err := s.st.Store(ctx, Key(n), blob); err != nil {
		return 0, fmt.Errorf("profile %q: writing it: %w", n.ID, err)
	}
	return len(blob), nil
}

// Entry is a stored profile as a listing shows it: never its content.
type Entry struct {
	Name
	Size    int64
	Updated time.Time
}

// List lists the profiles stored in st, by scope then ID.
func List(ctx context.Context, st certmagic.Storage) ([]Entry, error) {
	scopes, err := st.List(ctx, Prefix, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, sk := range scopes {
		scope := path.Base(sk)
		if scope != NoScope && !validHex(scope) {
			continue
		}
		keys, err := st.List(ctx, path.Join(Prefix, scope), false)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, err
		}
		for _, k := range keys {
			n := Name{Scope: scope, ID: path.Base(k)}
			if !n.valid() {
				continue
			}
			info, err := st.Stat(ctx, Key(n))
			if err != nil || !info.IsTerminal {
				continue
			}
			out = append(out, Entry{Name: n, Size: info.Size, Updated: info.Modified})
		}
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if c := strings.Compare(a.Scope, b.Scope); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// Delete removes profile n from st (ErrNotFound when it is not there).
func Delete(ctx context.Context, st certmagic.Storage, n Name) error {
	if !n.valid() {
		return ErrNotFound
	}
	if !st.Exists(ctx, Key(n)) {
		return ErrNotFound
	}
	return st.Delete(ctx, Key(n))
}
