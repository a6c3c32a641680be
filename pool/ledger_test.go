package pool

import (
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
