package upstreams

// The common create step, the same for both creators: what an answer cut
// short makes the gateway do, over a session API and over WebDriver.

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
)

// TestCreateAnswerCutShort: a 2xx create answer that ends before its
// stated length fails as its transport does (reset), over a session API
// and over WebDriver alike: a session whose ID was read whole is released,
// and one whose ID cannot be read, or is refused, is an orphan that no
// release call names.
func TestCreateAnswerCutShort(t *testing.T) {
	for _, tc := range []struct {
		name     string
		rest, wd string // the answer's first bytes; 4 KiB more are promised
		released string // the session released ("": none)
		orphans  int64
	}{
		{"after a usable ID", `{"id":"cut-1","connectUrl":"ws://127.0.0.1:1/","padding":"xx`, `{"value":{"sessionId":"cut-1","capabilities":{},"padding":"xx`, "cut-1", 0},
		{"after a refused ID", `{"id":"..","padding":"xx`, `{"value":{"sessionId":"..","padding":"xx`, "", 1},
		{"before any ID", `{"padding":"xx`, `{"value":{"padding":"xx`, "", 1},
	} {
		cut := func(w http.ResponseWriter, body string) {
			w.Header().Set("Content-Length", "4096")
			w.Write([]byte(body))
		}
		check := func(t *testing.T, p *Provider, res Result, rel *Releaser) {
			t.Helper()
			if res.Outcome.Word != WordReset || res.Outcome.Kind != Failure {
				t.Fatalf("outcome %q %v (%v), want %q %v", res.Outcome.Word, res.Outcome.Kind, res.Outcome.Err, WordReset, Failure)
			}
			if !rel.Wait(time.Now().Add(10 * time.Second)) {
				t.Fatal("releases pending")
			}
			b := p.Books()
			created := int64(0)
			if tc.released != "" {
				created = 1
			}
			if b.Created.Load() != created || b.Orphans.Load() != tc.orphans || b.Unreleased() != 0 {
				t.Fatalf("books: created %d, released %d, orphans %d; want %d created and released, %d orphans",
					b.Created.Load(), b.Released.Load(), b.Orphans.Load(), created, tc.orphans)
			}
		}
		t.Run("session API "+tc.name, func(t *testing.T) {
			f := fakes.NewREST(nil)
			defer f.Close()
			f.OnCreate = func(w http.ResponseWriter, _ *http.Request) bool {
				cut(w, tc.rest)
				return true
			}
			p := restProvider(t, "api-cut-short", f)
			check(t, p, p.Connect(context.Background(), testHandshake(), nil), testRel)
			fb := f.Books()
			if tc.released != "" && fb.Unknown != 1 || tc.released == "" && (fb.Unknown != 0 || len(fb.Released) != 0) {
				t.Fatalf("release calls at the provider: %+v", fb)
			}
		})
		t.Run("WebDriver "+tc.name, func(t *testing.T) {
			f := fakes.NewWebDriver("")
			defer f.Close()
			f.OnCreate = func(w http.ResponseWriter, _ *http.Request, _ []byte) bool {
				cut(w, tc.wd)
				return true
			}
			p, rel := wdProvider(t, f.URL())
			check(t, p, p.CreateWebDriver(context.Background(), mustCreateRequest(t, chromeCreate), nil), rel)
			deletes := 0
			for _, r := range f.Requests() {
				if r.Method == http.MethodDelete {
					deletes++
				}
			}
			if tc.released != "" && (deletes != 1 || f.Deleted(tc.released) != 1) || tc.released == "" && deletes != 0 {
				t.Fatalf("%d DELETE calls at the provider", deletes)
			}
		})
	}
}
