package upstreams

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
)

// TestRefusedBeforeStart: an attempt the provider turned down with a 4xx
// before starting anything says so (Outcome.Refused), whatever its kind:
// an upgrade at the provider's own URL, a session API's create call; an
// upgrade after a session API create that worked does not (a session was
// started), nor does a 5xx.
func TestRefusedBeforeStart(t *testing.T) {
	for _, code := range []int{400, 401, 403, 404, 408, 428, 429, 500, 503} {
		s := fakes.Status("refusing", nil, code, nil, "no")
		p, err := New(Config{Name: "ws-refusing", URL: "ws://" + s.Addr + "/", ConnectTimeout: caddy.Duration(3 * time.Second)}, Defaults{Releaser: testRel}, nil)
		if err != nil {
			t.Fatal(err)
		}
		o := p.Connect(context.Background(), testHandshake(), nil).Outcome
		s.Close()
		want := code
		if code >= 500 {
			want = 0
		}
		if o.Refused != want || o.Word != StatusWord(code) {
			t.Errorf("upgrade answered %d: refused %d (%s), want %d", code, o.Refused, o.Word, want)
		}
	}

	// A session API's create answered 4xx: nothing started.
	f := fakes.NewREST(func(string) string { return "" })
	defer f.Close()
	f.OnCreate = func(w http.ResponseWriter, r *http.Request) bool {
		http.Error(w, "bad options", http.StatusUnprocessableEntity)
		return true
	}
	o := restProvider(t, "api-refusing", f).Connect(context.Background(), testHandshake(), nil).Outcome
	if o.Refused != http.StatusUnprocessableEntity || o.Word != WordCreateFailed {
		t.Fatalf("create answered 422: refused %d (%s)", o.Refused, o.Word)
	}
	// Created, then its connect URL refuses the upgrade: a session was
	// started (and is released).
	s := fakes.Status("connect-refusing", nil, http.StatusNotFound, nil, "gone")
	defer s.Close()
	g := fakes.NewREST(func(string) string { return "ws://" + s.Addr + "/devtools/browser/x" })
	defer g.Close()
	o = restProvider(t, "api-created", g).Connect(context.Background(), testHandshake(), nil).Outcome
	if o.Refused != 0 || o.Word != StatusWord(http.StatusNotFound) {
		t.Fatalf("created, then the upgrade answered 404: refused %d (%s), want 0", o.Refused, o.Word)
	}
	settle(t, g, 1)
}
