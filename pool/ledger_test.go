package pool

import (
	"context"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/ledger"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// TestReassertLedger: once the shared store has put this node's leases
// back after it lost writes, the registry writes its ledger's heartbeat
// and entries again.
func TestReassertLedger(t *testing.T) {
	r := NewRegistry(nil)
	defer r.Ledger.close()
	st := &certmagic.FileStorage{Path: t.TempDir()}
	r.Ledger.Reassert() // no ledger open: nothing to do
	if !r.Ledger.Open(LedgerOptions{Store: st, Node: "n1"}) {
		t.Fatal("the ledger did not open")
	}
	ctx := context.Background()
	l := r.Ledger.Opened()
	if err := l.Record(ctx, "cloud", "s1"); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(st.Path); err != nil {
		t.Fatal(err)
	}
	r.Ledger.Reassert()
	known, err := l.Known(ctx, "cloud")
	if err != nil || !known["s1"] {
		t.Fatalf("after the reassert the ledger knows %v (%v), want s1", known, err)
	}
}

// TestReapRefusesBadSessionID: a gone owner's ledger entry whose session
// ID no create answer is let give (a dot segment, a control byte: written
// by an older version, or by hand) is never released: its release call
// would go elsewhere. It is reported, kept and counted as pending; the
// owner's good entry is released as usual.
func TestReapRefusesBadSessionID(t *testing.T) {
	f := fakes.NewREST(nil)
	defer f.Close()
	f.Plant("s-good")
	st := &certmagic.FileStorage{Path: t.TempDir()}
	ctx := context.Background()
	// The gone process never beat; its entries are oldest first.
	t0, n := time.Now().Add(-time.Hour), 0
	gone := ledger.New(st, "old", func() time.Time { n++; return t0.Add(time.Duration(n) * time.Second) })
	for _, id := range []string{"..", "s\n1", "s-good"} {
		if err := gone.Record(ctx, "cloud", id); err != nil {
			t.Fatal(err)
		}
	}
	r, clock := fakeRegistry(t, true)
	defer r.Ledger.close()
	up, err := upstreams.New(upstreams.Config{Name: "cloud", URL: f.URL(), SessionAPI: &upstreams.SessionAPI{
		CreateMethod: "POST", CreateURL: "/v1/sessions", ConnectURL: "/connectUrl", SessionID: "/id",
		ReleaseMethod: "POST", ReleaseURL: "/v1/sessions/{session_id}/release",
	}}, upstreams.Defaults{Releaser: r.Releaser()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var errs []string
	r.Ledger.Open(LedgerOptions{Store: st, Node: "n1", OnError: func(op string, err error) { errs = append(errs, op+": "+err.Error()) }})
	r.Ledger.SetAdopter("cloud", Adopter{Adopt: func(id, from string) *upstreams.Remote { return up.Adopt(id, from, nil) }})
	clock.Advance(0) // the first reap, in place
	if !r.Releaser().Wait(time.Now().Add(10 * time.Second)) {
		t.Fatal("releases still pending")
	}
	if got, want := f.Requests(), []string{"POST /v1/sessions/s-good/release"}; !slices.Equal(got, want) {
		t.Fatalf("requests %q, want %q", got, want)
	}
	if len(errs) != 2 {
		t.Fatalf("errors %q: want the 2 refused entries reported", errs)
	}
	for _, e := range errs {
		if !strings.HasPrefix(e, "reap: ") || !strings.Contains(e, `provider "cloud"`) || strings.Contains(e, "\n") {
			t.Fatalf("report %q: want the provider named, never the ID's control byte", e)
		}
	}
	if n, _ := r.Ledger.Pending("cloud"); n != 2 {
		t.Fatalf("pending %d, want the 2 refused entries", n)
	}
}

// refusing is a store whose deletes fail while refuse is set.
type refusing struct {
	*certmagic.FileStorage
	refuse atomic.Bool
}

func (s *refusing) Delete(ctx context.Context, key string) error {
	if s.refuse.Load() {
		return os.ErrDeadlineExceeded
	}
	return s.FileStorage.Delete(ctx, key)
}

// TestLedgerRetriesRefusedRemoval: the removal of a released session's
// entry that the store refused is made again at a later heartbeat: the
// entry does not stay in the store, nor pending, for the life of the
// process.
func TestLedgerRetriesRefusedRemoval(t *testing.T) {
	r, clk := fakeRegistry(t, true)
	defer r.Ledger.close()
	st := &refusing{FileStorage: &certmagic.FileStorage{Path: t.TempDir()}}
	r.Ledger.Open(LedgerOptions{Store: st, Node: "n1"})
	ctx := context.Background()
	l := r.Ledger.Opened()
	if err := l.Record(ctx, "cloud", "s1"); err != nil {
		t.Fatal(err)
	}
	st.refuse.Store(true)
	if err := l.Remove(ctx, "cloud", "s1"); err == nil {
		t.Fatal("the refused removal reported no error")
	}
	st.refuse.Store(false)
	clk.Advance(2 * l.HeartbeatEvery())
	if known, err := l.Known(ctx, "cloud"); err != nil || len(known) != 0 {
		t.Fatalf("the store still names %v (%v)", known, err)
	}
	if n, _ := r.Ledger.Pending("cloud"); n != 0 {
		t.Fatalf("pending %d, want 0", n)
	}
}

// TestLedgerMovesLegacy: entries a gone owner left in the ledger's old
// layout are moved into the ledger after a reap and found by the next
// one at once; once the old layout holds nothing more, it is not read
// again.
func TestLedgerMovesLegacy(t *testing.T) {
	r, clk := fakeRegistry(t, true)
	defer r.Ledger.close()
	ctx := context.Background()
	old := &certmagic.FileStorage{Path: t.TempDir()}
	dead := ledger.New(old, "dead", clk.Now)
	if err := dead.Record(ctx, "cloud", "s1"); err != nil {
		t.Fatal(err)
	}
	reads := &countingLegacy{Legacy: old}
	r.Ledger.Open(LedgerOptions{Store: &certmagic.FileStorage{Path: t.TempDir()}, Node: "n1", Legacy: reads})
	clk.Advance(time.Second)
	// No adopter for the provider: the entry waits, counted as pending.
	if n, _ := r.Ledger.Pending("cloud"); n != 1 {
		t.Fatalf("pending %d, want the moved entry", n)
	}
	if old.Exists(ctx, "browser_failover/ledger/owners/"+dead.Owner()) || len(mustList(t, old)) != 0 {
		t.Fatalf("the old layout still holds %v", mustList(t, old))
	}
	n := reads.lists.Load()
	clk.Advance(2 * DefaultReapInterval)
	if reads.lists.Load() != n {
		t.Fatal("the old layout was read again after it held nothing more")
	}
}

type countingLegacy struct {
	ledger.Legacy
	lists atomic.Int64
}

func (c *countingLegacy) List(ctx context.Context, prefix string, recursive bool) ([]string, error) {
	c.lists.Add(1)
	return c.Legacy.List(ctx, prefix, recursive)
}

// mustList is every file under the ledger in st.
func mustList(t *testing.T, st *certmagic.FileStorage) []string {
	t.Helper()
	keys, err := st.List(context.Background(), "browser_failover/ledger/entries", true)
	if err != nil {
		return nil
	}
	var files []string
	for _, k := range keys {
		if info, err := st.Stat(context.Background(), k); err == nil && info.IsTerminal {
			files = append(files, k)
		}
	}
	return files
}
