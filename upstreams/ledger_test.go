package upstreams

// The ledger of created sessions, as the session API uses it: an entry
// before the dial, never a dial without one, removed once the release is
// confirmed, kept (and tried again later) while the release fails.

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/ledger"
)

// orderedLedger is the real ledger, telling contacts when it records, so
// that a test sees the record and the dial in order; failing makes Record
// fail.
type orderedLedger struct {
	*ledger.Ledger
	contacts *fakes.Contacts
	failing  bool
}

func (o *orderedLedger) Record(ctx context.Context, provider, id string) error {
	o.contacts.Add("record")
	if o.failing {
		return errors.New("disk full")
	}
	return o.Ledger.Record(ctx, provider, id)
}

// ledgerProvider is a provider with a session API on f, whose releaser
// keeps its sessions in a ledger of its own on a file storage.
func ledgerProvider(t *testing.T, f *fakes.REST, contacts *fakes.Contacts) (*Provider, *Releaser, *orderedLedger) {
	t.Helper()
	rel := NewReleaser()
	rel.Sleep = func(time.Duration) {}
	l := &orderedLedger{Ledger: ledger.New(&certmagic.FileStorage{Path: t.TempDir()}, "n1", nil), contacts: contacts}
	rel.Ledger = l
	p, err := New(Config{
		Name: "api", URL: f.URL(), ConnectTimeout: caddy.Duration(3 * time.Second),
		SessionAPI: &SessionAPI{
			CreateMethod: "POST", CreateURL: "/v1/sessions",
			ConnectURL: "/connectUrl", SessionID: "/id",
			ReleaseMethod: "POST", ReleaseURL: "/v1/sessions/{session_id}/release",
		},
	}, Defaults{Releaser: rel, Books: &Books{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p, rel, l
}

func TestLedgerRecordsBeforeDial(t *testing.T) {
	contacts := &fakes.Contacts{}
	echo := fakes.Echo("dial", contacts)
	defer echo.Close()
	f := fakes.NewREST(func(string) string { return echo.URL() })
	defer f.Close()
	p, rel, l := ledgerProvider(t, f, contacts)
	res := p.Connect(context.Background(), testHandshake(), nil)
	if res.Outcome.Kind != Success {
		t.Fatalf("outcome %+v", res.Outcome)
	}
	if got := contacts.List(); len(got) != 2 || got[0] != "record" || got[1] != "dial" {
		t.Fatalf("order %v, want record then dial", got)
	}
	if n := l.Pending()["api"]; n != 1 {
		t.Fatalf("pending %d while live", n)
	}
	res.Conn.Close() // ends it: the session is released
	if !rel.Wait(time.Now().Add(10 * time.Second)) {
		t.Fatal("release still pending")
	}
	if n := l.Pending()["api"]; n != 0 {
		t.Fatalf("pending %d after the release", n)
	}
	if err := f.Books().Balanced(); err != nil {
		t.Fatal(err)
	}
}

// TestLedgerWriteFailure: an entry that cannot be written fails the
// attempt before the dial, as the gateway's own trouble; the session is
// released at once.
func TestLedgerWriteFailure(t *testing.T) {
	contacts := &fakes.Contacts{}
	echo := fakes.Echo("dial", contacts)
	defer echo.Close()
	f := fakes.NewREST(func(string) string { return echo.URL() })
	defer f.Close()
	p, rel, l := ledgerProvider(t, f, contacts)
	var errs []string
	rel.OnLedgerError = func(provider string, err error) { errs = append(errs, provider+": "+err.Error()) }
	l.failing = true
	res := p.Connect(context.Background(), testHandshake(), nil)
	if res.Outcome.Kind != Gateway || res.Outcome.Word != WordLedger {
		t.Fatalf("outcome %+v, want %s/%s", res.Outcome, Gateway, WordLedger)
	}
	if got := contacts.List(); len(got) != 1 || got[0] != "record" {
		t.Fatalf("contacts %v: the connect URL was dialed", got)
	}
	if !rel.Wait(time.Now().Add(10 * time.Second)) {
		t.Fatal("release still pending")
	}
	b := f.Books()
	if err := b.Balanced(); err != nil || len(b.Created) != 1 {
		t.Fatalf("books %+v: %v", b, err)
	}
	if len(errs) != 1 || errs[0] != "api: disk full" {
		t.Fatalf("ledger errors %v", errs)
	}
}

// TestLedgerKeepsFailedReleases: a release that keeps failing leaves the
// entry, and its session gets another round of tries later; once the
// provider accepts, the entry goes.
func TestLedgerKeepsFailedReleases(t *testing.T) {
	echo := fakes.Echo("dial", nil)
	defer echo.Close()
	f := fakes.NewREST(func(string) string { return echo.URL() })
	defer f.Close()
	var mu sync.Mutex
	refuse := true
	f.OnRelease = func(w http.ResponseWriter, r *http.Request, id string) bool {
		mu.Lock()
		defer mu.Unlock()
		if refuse {
			http.Error(w, "try later", http.StatusBadGateway)
		}
		return refuse
	}
	p, rel, l := ledgerProvider(t, f, &fakes.Contacts{})
	rounds := make(chan func(), 4)
	var waits []time.Duration
	rel.Later = func(d time.Duration, fn func()) *time.Timer {
		waits = append(waits, d)
		rounds <- fn
		return nil
	}
	res := p.Connect(context.Background(), testHandshake(), nil)
	if res.Outcome.Kind != Success {
		t.Fatalf("outcome %+v", res.Outcome)
	}
	res.Conn.Close()
	next := func() func() {
		select {
		case fn := <-rounds:
			return fn
		case <-time.After(10 * time.Second):
			t.Fatal("no later round was scheduled")
			return nil
		}
	}
	next()() // the second round fails too
	retry := next()
	if n := l.Pending()["api"]; n != 1 {
		t.Fatalf("pending %d while the release fails", n)
	}
	if len(waits) != 2 || waits[0] != 10*time.Second || waits[1] != 20*time.Second {
		t.Fatalf("waits %v", waits)
	}
	mu.Lock()
	refuse = false
	mu.Unlock()
	retry()
	if !rel.Wait(time.Now().Add(10 * time.Second)) {
		t.Fatal("release still pending")
	}
	if n := l.Pending()["api"]; n != 0 {
		t.Fatalf("pending %d after the release was accepted", n)
	}
	if err := f.Books().Balanced(); err != nil {
		t.Fatal(err)
	}
}

// TestAdoptedRelease: a session another process left (an adopted ledger
// entry) is released with the provider's own release call, counted as
// reaped, and its entry removed; a provider that no longer knows it (404)
// has released it.
func TestAdoptedRelease(t *testing.T) {
	f := fakes.NewREST(nil)
	defer f.Close()
	p, rel, l := ledgerProvider(t, f, &fakes.Contacts{})
	ctx := context.Background()
	if err := l.Ledger.Record(ctx, "api", "s-of-the-gone-process"); err != nil {
		t.Fatal(err)
	}
	var reaped []string
	rel.OnReaped = func(provider, id, from string) { reaped = append(reaped, provider+"/"+id+"/"+from) }
	p.Adopt("s-of-the-gone-process", "gone-owner", nil).Release()
	if !rel.Wait(time.Now().Add(10 * time.Second)) {
		t.Fatal("release still pending")
	}
	if b := f.Books(); b.Unknown != 1 {
		t.Fatalf("release calls for the session: %+v", b)
	}
	if len(reaped) != 1 || reaped[0] != "api/s-of-the-gone-process/gone-owner" {
		t.Fatalf("reaped %v", reaped)
	}
	if n := l.Pending()["api"]; n != 0 {
		t.Fatalf("pending %d", n)
	}
	if b := p.api.books; b.Reaped.Load() != 1 || b.Released.Load() != 0 {
		t.Fatalf("books reaped %d released %d", b.Reaped.Load(), b.Released.Load())
	}
}
