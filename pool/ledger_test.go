package pool

import (
	"sync/atomic"

	"context"
	"os"
	"testing"

	"github.com/caddyserver/certmagic"
)

// TestReassertLedger: once the shared store has put this node's leases
// back after it lost writes, the registry writes its ledger's heartbeat
// and entries again.
func TestReassertLedger(t *testing.T) {
	r := NewRegistry(nil)
	defer r.closeLedger()
	st := &certmagic.FileStorage{Path: t.TempDir()}
	r.ReassertLedger() // no ledger open: nothing to do
	if !r.OpenLedger(LedgerOptions{Store: st, Node: "n1"}) {
		t.Fatal("the ledger did not open")
	}
	ctx := context.Background()
	l := r.Ledger()
	if err := l.Record(ctx, "cloud", "s1"); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(st.Path); err != nil {
		t.Fatal(err)
	}
	r.ReassertLedger()
	known, err := l.Known(ctx, "cloud")
	if err != nil || !known["s1"] {
		t.Fatalf("after the reassert the ledger knows %v (%v), want s1", known, err)
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
	defer r.closeLedger()
	st := &refusing{FileStorage: &certmagic.FileStorage{Path: t.TempDir()}}
	r.OpenLedger(LedgerOptions{Store: st, Node: "n1"})
	ctx := context.Background()
	l := r.Ledger()
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
	if n, _ := r.LedgerPending("cloud"); n != 0 {
		t.Fatalf("pending %d, want 0", n)
	}
}
