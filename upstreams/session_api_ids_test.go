package upstreams

// What a provider's session ID may do to the release call: nothing but
// name the session. The ID is the provider's: it is escaped wherever the
// release URL holds it, and an ID that no escaping makes safe in a path
// (a dot segment) is refused, as are IDs with control bytes and
// unreasonably long ones.

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
)

// idREST is a fake provider whose create answers give the session ID id;
// the release calls it is sent are in its Requests.
func idREST(t *testing.T, id, connectURL string) *fakes.REST {
	t.Helper()
	f := fakes.NewREST(nil)
	t.Cleanup(f.Close)
	f.OnCreate = func(w http.ResponseWriter, _ *http.Request) bool {
		json.NewEncoder(w).Encode(map[string]string{"id": id, "connectUrl": connectURL})
		return true
	}
	return f
}

// idProvider is a provider on f whose release call is POST releaseURL.
func idProvider(t *testing.T, name string, f *fakes.REST, releaseURL string) *Provider {
	t.Helper()
	p, err := New(Config{
		Name: name, URL: f.URL(), ConnectTimeout: caddy.Duration(3 * time.Second),
		SessionAPI: &SessionAPI{
			CreateMethod: "POST", CreateURL: "/v1/sessions",
			Headers:    []Header{{Field: "X-Api-Key", Value: testAPIKey}},
			ConnectURL: "/connectUrl", SessionID: "/id",
			ReleaseMethod: "POST", ReleaseURL: releaseURL,
		},
	}, Defaults{Releaser: testRel, Books: &Books{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// releases waits until testRel is idle and returns the requests f was
// sent after its create call.
func releases(t *testing.T, f *fakes.REST) []string {
	t.Helper()
	if !testRel.Wait(time.Now().Add(10 * time.Second)) {
		t.Fatalf("releases still pending: %d", testRel.Pending())
	}
	got := f.Requests()
	if len(got) == 0 || got[0] != "POST /v1/sessions" {
		t.Fatalf("requests %q: want the create call first", got)
	}
	return got[1:]
}

// TestSessionIDRefused: a create answer whose session ID is a dot segment
// ("." or "..", which a URL resolves: the release would go to the sessions
// collection or the level above), holds a control byte, or is longer than
// MaxSessionID fails the attempt with bad_session_id, and is never dialed.
// The release URL holds the ID in its path, so the session cannot be
// released safely: no call is made, and it is counted as an orphan.
func TestSessionIDRefused(t *testing.T) {
	echo := fakes.Echo("bad-ids", nil)
	defer echo.Close()
	orphans := swapOrphanHook(t)
	long := strings.Repeat("x", MaxSessionID+1)
	for name, id := range map[string]string{
		"dot": ".", "dotdot": "..", "LF": "s\n1", "NUL": "\x00", "DEL": "s\x7f", "tab": "\ts", "long": long,
	} {
		t.Run(name, func(t *testing.T) {
			f := idREST(t, id, echo.URL())
			p := idProvider(t, "api-id-"+name, f, "/v1/projects/p1/sessions/{session_id}/release")
			b := p.Books()
			seen := len(orphans())
			res := p.Connect(context.Background(), testHandshake(), nil)
			if res.Conn != nil {
				res.Conn.Close()
			}
			if res.Outcome.Word != WordBadSessionID || res.Outcome.Kind != Failure {
				t.Fatalf("outcome %q %v (%v), want %s, a failure", res.Outcome.Word, res.Outcome.Kind, res.Outcome.Err, WordBadSessionID)
			}
			if n := echo.Hits.Load(); n != 0 {
				t.Fatalf("the connect URL was dialed (%d)", n)
			}
			if got := releases(t, f); len(got) != 0 {
				t.Fatalf("release calls %q: want none", got)
			}
			if b.Orphans.Load() != 1 || b.Created.Load() != 0 || b.Unreleased() != 0 {
				t.Fatalf("orphans %d, created %d, unreleased %d", b.Orphans.Load(), b.Created.Load(), b.Unreleased())
			}
			got := orphans()[seen:]
			if len(got) != 1 || !strings.HasPrefix(got[0], "api-id-"+name+": ") || strings.Contains(got[0], testAPIKey) ||
				strings.ContainsAny(got[0], "\x00\n\t\x7f") || strings.Contains(got[0], "xxxx") {
				t.Fatalf("orphan reports %q", got)
			}
			if msg := res.Outcome.Err.Error(); strings.ContainsAny(msg, "\x00\n\t\x7f") || strings.Contains(msg, "xxxx") {
				t.Fatalf("error %q shows the ID", msg)
			}
		})
	}
}

// TestSessionIDRefusedReleasedInQuery: a refused ID is still released when
// the release URL holds it only in its query, where it is escaped whole;
// an ID's & or = never add query items.
func TestSessionIDRefusedReleasedInQuery(t *testing.T) {
	echo := fakes.Echo("query-ids", nil)
	defer echo.Close()
	orphans := swapOrphanHook(t)
	const rel = "/v1/release?session={session_id}&force=1"
	for _, tc := range []struct{ name, id, want string }{
		{"dotdot", "..", "POST /v1/release?session=..&force=1"},
		{"LF", "s\n1", "POST /v1/release?session=s%0A1&force=1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := idREST(t, tc.id, echo.URL())
			p := idProvider(t, "api-qid-"+tc.name, f, rel)
			b := p.Books()
			seen := len(orphans())
			res := p.Connect(context.Background(), testHandshake(), nil)
			if res.Conn != nil {
				res.Conn.Close()
			}
			if res.Outcome.Word != WordBadSessionID || res.Outcome.Kind != Failure {
				t.Fatalf("outcome %q %v (%v)", res.Outcome.Word, res.Outcome.Kind, res.Outcome.Err)
			}
			if got := releases(t, f); !slices.Equal(got, []string{tc.want}) {
				t.Fatalf("release calls %q, want %q", got, tc.want)
			}
			if b.Created.Load() != 1 || b.Released.Load() != 1 || b.Orphans.Load() != 0 || len(orphans()) != seen {
				t.Fatalf("created %d, released %d, orphans %d", b.Created.Load(), b.Released.Load(), b.Orphans.Load())
			}
		})
	}
	t.Run("ampersand", func(t *testing.T) {
		f := idREST(t, "s&force=0", echo.URL())
		res := idProvider(t, "api-qid-amp", f, rel).Connect(context.Background(), testHandshake(), nil)
		if res.Outcome.Kind != Success {
			t.Fatalf("outcome %q %v", res.Outcome.Word, res.Outcome.Err)
		}
		res.Conn.Close()
		if got, want := releases(t, f), "POST /v1/release?session=s%26force%3D0&force=1"; !slices.Equal(got, []string{want}) {
			t.Fatalf("release calls %q, want %q", got, want)
		}
	})
}

// TestSessionIDEscapedInPath: IDs that are not dot segments are released
// at exactly the path the release URL names, escaped as one path segment:
// a slash is %2F (Go keeps it so, never resolving "../" inside it), a
// percent sign is %25 (so %2E%2E stays a literal, never read as ".."),
// and "?" and "#" cannot start a query or a fragment.
func TestSessionIDEscapedInPath(t *testing.T) {
	echo := fakes.Echo("path-ids", nil)
	defer echo.Close()
	atLimit := strings.Repeat("y", MaxSessionID)
	for _, tc := range []struct{ name, id, want string }{
		{"pct-dotdot", "%2e%2e", "/v1/sessions/%252e%252e/release"},
		{"pct-DOTDOT", "%2E%2E", "/v1/sessions/%252E%252E/release"},
		{"slashes", "../../admin", "/v1/sessions/..%2F..%2Fadmin/release"},
		{"dot-inside", "a/./b", "/v1/sessions/a%2F.%2Fb/release"},
		{"three-dots", "...", "/v1/sessions/.../release"},
		{"query-fragment", "a?b#c", "/v1/sessions/a%3Fb%23c/release"},
		{"at-limit", atLimit, "/v1/sessions/" + atLimit + "/release"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := idREST(t, tc.id, echo.URL())
			res := idProvider(t, "api-pid-"+tc.name, f, "/v1/sessions/{session_id}/release").Connect(context.Background(), testHandshake(), nil)
			if res.Outcome.Kind != Success {
				t.Fatalf("outcome %q %v", res.Outcome.Word, res.Outcome.Err)
			}
			res.Conn.Close()
			if got := releases(t, f); !slices.Equal(got, []string{"POST " + tc.want}) {
				t.Fatalf("release calls %q, want POST %s", got, tc.want)
			}
		})
	}
}

// TestAdoptedSessionIDRefused: a session ID from elsewhere than a create
// answer (a ledger entry read back from storage) that is a dot segment is
// never sent in a release path: no call, and it is counted as an orphan.
func TestAdoptedSessionIDRefused(t *testing.T) {
	f := fakes.NewREST(nil)
	defer f.Close()
	orphans := swapOrphanHook(t)
	p := idProvider(t, "api-adopt-dotdot", f, "/v1/sessions/{session_id}/release")
	seen := len(orphans())
	p.Adopt("..", "gone-owner", nil).Release()
	if !testRel.Wait(time.Now().Add(10 * time.Second)) {
		t.Fatal("release still pending")
	}
	if got := f.Requests(); len(got) != 0 {
		t.Fatalf("requests %q: want none", got)
	}
	if b := p.Books(); b.Orphans.Load() != 1 || b.ReleaseFailures.Load() != 0 || len(orphans()) != seen+1 {
		t.Fatalf("orphans %d, release failures %d, reports %q", b.Orphans.Load(), b.ReleaseFailures.Load(), orphans()[seen:])
	}
}
