package cluster

import (
	"slices"
	"testing"
)

// TestWatchList: a provider this node let go of (found at run time, then
// gone) is no longer watched; the others are.
func TestWatchList(t *testing.T) {
	w := &watchList{set: map[string]struct{}{}}
	w.add("a", "", "br/10.0.0.1:9222", "br/10.0.0.2:9222")
	w.remove("br/10.0.0.1:9222", "unknown")
	got := w.list()
	slices.Sort(got)
	if !slices.Equal(got, []string{"a", "br/10.0.0.2:9222"}) {
		t.Fatalf("watched %v", got)
	}
}
