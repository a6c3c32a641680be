package profiles

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/certmagic"
)

func key(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

func sealer(t *testing.T, b byte) *Sealer {
	t.Helper()
	s, err := NewSealer(key(b))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSeal: a blob opens under its own key, scope and ID only; every
// sealing has a fresh nonce; a tampered or truncated blob does not open.
func TestSeal(t *testing.T) {
	s := sealer(t, 1)
	plain := []byte(`{"cookies":[{"name":"sid","value":"s3cret"}]}`)
	a, err := s.Seal("_", "alice", plain)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := s.Seal("_", "alice", plain)
	if bytes.Equal(a, b) || bytes.Equal(a[4:16], b[4:16]) {
		t.Fatal("two sealings share a nonce")
	}
	if bytes.Contains(a, []byte("s3cret")) {
		t.Fatal("the value is readable in the blob")
	}
	if got, err := s.Open("_", "alice", a); err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("open: %q %v", got, err)
	}
	for name, open := range map[string]func() ([]byte, error){
		"another key":   func() ([]byte, error) { return sealer(t, 2).Open("_", "alice", a) },
		"another ID":    func() ([]byte, error) { return s.Open("_", "bob", a) },
		"another scope": func() ([]byte, error) { return s.Open("0123456789abcdef", "alice", a) },
		"tampered": func() ([]byte, error) {
			c := bytes.Clone(a)
			c[len(c)-20] ^= 1
			return s.Open("_", "alice", c)
		},
		"truncated":  func() ([]byte, error) { return s.Open("_", "alice", a[:20]) },
		"not a blob": func() ([]byte, error) { return s.Open("_", "alice", []byte("{}")) },
	} {
		if got, err := open(); !errors.Is(err, ErrCannotOpen) || got != nil {
			t.Errorf("%s: %q %v, want ErrCannotOpen", name, got, err)
		}
	}
	if _, err := NewSealer(key(1)[:16]); err == nil {
		t.Error("a 16-byte key was taken")
	}
}

func storage(t *testing.T) *certmagic.FileStorage {
	return &certmagic.FileStorage{Path: t.TempDir()}
}

func sample() *Profile {
	return &Profile{
		Cookies: []Cookie{
			{Name: "sid", Value: "s3cret-session", Domain: "127.0.0.1", Path: "/", Session: true, HTTPOnly: true, SameSite: "Lax", Priority: "Medium", SourceScheme: "NonSecure", SourcePort: 80},
			{Name: "p", Value: "v", Domain: ".example.com", Path: "/a", Expires: 1796536392.865, Secure: true, SameSite: "None",
				PartitionKey: json.RawMessage(`{"topLevelSite":"https://top.example","hasCrossSiteAncestor":false}`)},
		},
		Origins: []Origin{{Origin: "http://127.0.0.1:8080", Items: [][2]string{{"token", "tok-s3cret"}, {"b", ""}}}},
	}
}

// TestStoreRoundTrip: a profile saved is loaded back the same, every
// attribute kept; the file holds none of its values; a profile not
// stored loads as nil.
func TestStoreRoundTrip(t *testing.T) {
	ctx := context.Background()
	st := storage(t)
	s := NewStore(st, sealer(t, 1), 1<<20)
	n := Name{Scope: NoScope, ID: "alice"}
	if p, err := s.Load(ctx, n); p != nil || err != nil {
		t.Fatalf("nothing stored: %v %v", p, err)
	}
	size, err := s.Save(ctx, n, sample())
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Load(ctx, n)
	if err != nil || !reflect.DeepEqual(got, sample()) {
		t.Fatalf("loaded %+v %v", got, err)
	}
	raw, err := os.ReadFile(filepath.Join(st.Path, "browser_failover", "profiles", "_", "alice"))
	if err != nil || len(raw) != size {
		t.Fatalf("the file: %d bytes %v, Save said %d", len(raw), err, size)
	}
	for _, v := range []string{"s3cret", "tok-", "sid", "127.0.0.1"} {
		if bytes.Contains(raw, []byte(v)) {
			t.Errorf("the stored blob shows %q", v)
		}
	}
	// An empty profile is stored too.
	e := Name{Scope: "0123456789abcdef", ID: "empty"}
	if _, err := s.Save(ctx, e, &Profile{}); err != nil {
		t.Fatal(err)
	}
	if p, err := s.Load(ctx, e); err != nil || p == nil || !p.Empty() {
		t.Fatalf("empty profile: %+v %v", p, err)
	}
}

// TestStoreKeyChange: under another key a stored profile cannot be read,
// and stays as it was; a blob renamed to another ID does not open.
func TestStoreKeyChange(t *testing.T) {
	ctx := context.Background()
	st := storage(t)
	n := Name{Scope: NoScope, ID: "alice"}
	if _, err := NewStore(st, sealer(t, 1), 0).Save(ctx, n, sample()); err != nil {
		t.Fatal(err)
	}
	before, _ := st.Load(ctx, Key(n))
	if _, err := NewStore(st, sealer(t, 2), 0).Load(ctx, n); !errors.Is(err, ErrCannotOpen) {
		t.Fatalf("another key: %v", err)
	}
	after, _ := st.Load(ctx, Key(n))
	if !bytes.Equal(before, after) {
		t.Fatal("a failed read changed the blob")
	}
	moved := Name{Scope: NoScope, ID: "mallory"}
	if err := st.Store(ctx, Key(moved), before); err != nil {
		t.Fatal(err)
	}
	if _, err := NewStore(st, sealer(t, 1), 0).Load(ctx, moved); !errors.Is(err, ErrCannotOpen) {
		t.Fatalf("a blob renamed to another ID: %v", err)
	}
	if p, err := NewStore(st, sealer(t, 1), 0).Load(ctx, n); err != nil || p == nil {
		t.Fatalf("the old key again: %v", err)
	}
}

// TestStoreMaxSize: a profile over max_size is not written, and the one
// stored stays.
func TestStoreMaxSize(t *testing.T) {
	ctx := context.Background()
	st := storage(t)
	s := NewStore(st, sealer(t, 1), 2048)
	n := Name{Scope: NoScope, ID: "alice"}
	if _, err := s.Save(ctx, n, sample()); err != nil {
		t.Fatal(err)
	}
	big := sample()
	big.Origins[0].Items = append(big.Origins[0].Items, [2]string{"blob", strings.Repeat("x", 4096)})
	if _, err := s.Save(ctx, n, big); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over max_size: %v", err)
	}
	if p, err := s.Load(ctx, n); err != nil || !reflect.DeepEqual(p, sample()) {
		t.Fatalf("the stored profile changed: %+v %v", p, err)
	}
}

// TestListAndDelete: listings show names, hashed scopes, sizes and
// times; a bad name is never a path.
func TestListAndDelete(t *testing.T) {
	ctx := context.Background()
	st := storage(t)
	s := NewStore(st, sealer(t, 1), 0)
	for _, n := range []Name{{NoScope, "b"}, {NoScope, "a"}, {"0123456789abcdef", "a"}} {
		if _, err := s.Save(ctx, n, sample()); err != nil {
			t.Fatal(err)
		}
	}
	list, err := List(ctx, st)
	if err != nil || len(list) != 3 {
		t.Fatalf("%+v %v", list, err)
	}
	if list[0].Scope != "0123456789abcdef" || list[0].Shown() != "hmac:0123456789abcdef" || list[1].ID != "a" || list[1].Shown() != "" || list[0].Size == 0 || list[0].Updated.IsZero() {
		t.Fatalf("%+v", list)
	}
	if err := Delete(ctx, st, Name{NoScope, "a"}); err != nil {
		t.Fatal(err)
	}
	if err := Delete(ctx, st, Name{NoScope, "a"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("twice: %v", err)
	}
	for _, n := range []Name{{NoScope, ".."}, {"..", "a"}, {NoScope, "a/b"}, {"XYZ", "a"}} {
		if err := Delete(ctx, st, n); !errors.Is(err, ErrNotFound) {
			t.Errorf("%+v: %v", n, err)
		}
		if _, err := s.Save(ctx, n, sample()); err == nil {
			t.Errorf("saved as %+v", n)
		}
	}
	if f, ok := ScopeFolder("hmac:0123456789abcdef"); !ok || f != "0123456789abcdef" {
		t.Fatal(f)
	}
	if _, ok := ScopeFolder("hmac:../x"); ok {
		t.Fatal("a bad scope")
	}
}

func TestOriginOf(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8080/login?x=1": "http://127.0.0.1:8080",
		"https://Example.com:443/":        "https://example.com",
		"http://example.com:80":           "http://example.com",
		"http://[::1]:9/x":                "http://[::1]:9",
		"about:blank":                     "",
		"data:text/html,x":                "",
		"chrome://newtab/":                "",
		"https://u:p@example.com/":        "",
	} {
		if got := OriginOf(in); got != want {
			t.Errorf("%s: %q, want %q", in, got, want)
		}
	}
}
