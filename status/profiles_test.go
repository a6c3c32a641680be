package status

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/certmagic"

	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/profiles"
)

// TestAdminProfiles: the list shows each stored profile's ID, hashed
// scope (null without one), size, time and whether a session uses it,
// and nothing of its content; DELETE removes one (409 while in use, 404
// for none, 400 when several scopes hold the ID and none is named).
func TestAdminProfiles(t *testing.T) {
	ctx := context.Background()
	reg := pool.NewRegistry(nil)
	st := &certmagic.FileStorage{Path: t.TempDir()}
	release := reg.Profiles.Open("test", st, nil)
	defer release()
	seal, err := profiles.NewSealer(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	store := profiles.NewStore(st, seal, 0)
	secret := &profiles.Profile{Cookies: []profiles.Cookie{{Name: "sid", Value: "cookie-s3cret", Domain: "a.test", Path: "/", HTTPOnly: true}},
		Origins: []profiles.Origin{{Origin: "https://a.test", Items: [][2]string{{"token", "storage-s3cret"}}}}}
	scoped := profiles.Name{Scope: "0123456789abcdef", ID: "alice"}
	for _, n := range []profiles.Name{{Scope: profiles.NoScope, ID: "alice"}, scoped, {Scope: profiles.NoScope, ID: "bob"}} {
		if _, err := store.Save(ctx, n, secret); err != nil {
			t.Fatal(err)
		}
	}
	busy := reg.NewTicket()
	if err := busy.TakeProfile(ctx, profiles.Name{Scope: profiles.NoScope, ID: "bob"}, 0, nil, false); err != nil {
		t.Fatal(err)
	}
	rec, err := serve(t, reg, http.MethodGet, ProfilesPath)
	if err != nil {
		t.Fatal(err)
	}
	body := rec.Body.String()
	for _, v := range []string{"s3cret", "sid", "a.test", "token"} {
		if strings.Contains(body, v) {
			t.Fatalf("the list shows %q: %s", v, body)
		}
	}
	var list ProfileList
	if err := json.Unmarshal(rec.Body.Bytes(), &list); err != nil || len(list.Profiles) != 3 {
		t.Fatalf("%s %v", body, err)
	}
	var raw struct {
		Profiles []map[string]any `json:"profiles"`
	}
	json.Unmarshal(rec.Body.Bytes(), &raw)
	for _, p := range raw.Profiles {
		for _, k := range []string{"id", "scope", "size", "updated", "in_use"} {
			if _, ok := p[k]; !ok {
				t.Fatalf("%v has no %s", p, k)
			}
		}
	}
	byKey := map[string]Profile{}
	for _, p := range list.Profiles {
		k := p.ID
		if p.Scope != nil {
			k = *p.Scope + "/" + p.ID
		}
		byKey[k] = p
	}
	if p := byKey["hmac:0123456789abcdef/alice"]; p.Size == 0 || p.InUse || p.Updated.IsZero() {
		t.Fatalf("scoped alice: %+v", p)
	}
	if !byKey["bob"].InUse || byKey["alice"].InUse {
		t.Fatalf("in use: %+v", list.Profiles)
	}

	if _, err := serve(t, reg, http.MethodDelete, ProfilesPath+"/alice"); apiStatus(err) != http.StatusBadRequest {
		t.Fatalf("two scopes, none named: %v", err)
	}
	if _, err := serve(t, reg, http.MethodDelete, ProfilesPath+"/bob"); apiStatus(err) != http.StatusConflict {
		t.Fatalf("in use: %v", err)
	}
	if _, err := serve(t, reg, http.MethodDelete, ProfilesPath+"/carol"); apiStatus(err) != http.StatusNotFound {
		t.Fatalf("none: %v", err)
	}
	if _, err := serve(t, reg, http.MethodDelete, ProfilesPath+"/alice?scope=hmac:../x"); apiStatus(err) != http.StatusBadRequest {
		t.Fatalf("bad scope: %v", err)
	}
	if rec, err := serve(t, reg, http.MethodDelete, ProfilesPath+"/alice?scope=hmac:0123456789abcdef"); err != nil || !strings.Contains(rec.Body.String(), `"deleted":"alice"`) {
		t.Fatalf("delete scoped: %v %s", err, rec.Body.String())
	}
	if p, err := store.Load(ctx, scoped); p != nil || err != nil {
		t.Fatalf("still there: %v", err)
	}
	if _, err := serve(t, reg, http.MethodDelete, ProfilesPath+"/alice"); err != nil {
		t.Fatalf("the one scope left: %v", err)
	}
	busy.Release()
	if _, err := serve(t, reg, http.MethodDelete, ProfilesPath+"/bob"); err != nil {
		t.Fatalf("given back: %v", err)
	}
	if _, err := serve(t, reg, http.MethodPost, ProfilesPath); apiStatus(err) != http.StatusMethodNotAllowed && err == nil {
		t.Fatalf("POST: %v", err)
	}
}
