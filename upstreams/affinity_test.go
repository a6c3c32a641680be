package upstreams

import (
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"testing"
)

func affinityNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("provider-%d", i)
	}
	return names
}

func affinityFirst(key string, names []string) string {
	return names[AffinityOrder(key, names, nil)[0]]
}

func TestAffinityOrderPermutationAndStable(t *testing.T) {
	names := affinityNames(5)
	for i := range 1000 {
		key := fmt.Sprintf("session-%d", i)
		got := AffinityOrder(key, names, nil)
		if !slices.Equal(slices.Sorted(slices.Values(got)), []int{0, 1, 2, 3, 4}) {
			t.Fatalf("AffinityOrder(%q) = %v, not a permutation", key, got)
		}
		if again := AffinityOrder(key, names, nil); !slices.Equal(got, again) {
			t.Fatalf("AffinityOrder(%q) not stable: %v then %v", key, got, again)
		}
	}
}

func TestAffinityOrderEdgeCases(t *testing.T) {
	tests := []struct {
		name  string
		key   string
		names []string
		dst   []int
		want  []int
	}{
		{"no providers", "k", nil, nil, nil},
		{"one provider", "k", []string{"a"}, nil, []int{0}},
		{"empty key", "", []string{"a"}, nil, []int{0}},
		{"dst kept", "k", []string{"a"}, []int{9}, []int{9, 0}},
		{"duplicate names tie by index", "k", []string{"a", "a", "a"}, nil, []int{0, 1, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := AffinityOrder(tt.key, tt.names, tt.dst); !slices.Equal(got, tt.want) {
				t.Errorf("AffinityOrder = %v, want %v", got, tt.want)
			}
		})
	}
}

// Known values pin the hash so the mapping does not change silently
// between releases (which would move every client).
func TestAffinityOrderPinned(t *testing.T) {
	names := []string{"alpha", "beta", "gamma"}
	pinned := map[string][]int{
		"":        {2, 1, 0},
		"a":       {0, 1, 2},
		"user-42": {1, 0, 2},
	}
	for key, want := range pinned {
		if got := AffinityOrder(key, names, nil); !slices.Equal(got, want) {
			t.Errorf("AffinityOrder(%q) = %v, want %v", key, got, want)
		}
	}
	// The score is FNV-1a 64 over name + 0x00 + key, then splitmix64.
	for _, tc := range [][2]string{{"", ""}, {"alpha", "user-42"}, {"provider-3", "x"}} {
		h := fnv.New64a()
		h.Write([]byte(tc[0] + "\x00" + tc[1]))
		if got, want := affinityScore(tc[1], tc[0]), splitmix64(h.Sum64()); got != want {
			t.Errorf("affinityScore(%q, %q) = %#x, want %#x", tc[1], tc[0], got, want)
		}
	}
	// The score must not depend on where a name sits in the list.
	rev := []string{"gamma", "beta", "alpha"}
	for key, order := range pinned {
		if f, r := names[order[0]], affinityFirst(key, rev); f != r {
			t.Errorf("key %q: first %q, with list reversed %q", key, f, r)
		}
	}
	// name + 0x00 + key: ("ab","c") and ("a","bc") must score differently.
	if affinityScore("c", "ab") == affinityScore("bc", "a") {
		t.Error("separator does not separate name and key")
	}
}

func TestAffinityOrderRemoveProvider(t *testing.T) {
	names := affinityNames(5)
	for removed := range names {
		smaller := slices.Delete(slices.Clone(names), removed, removed+1)
		moved := 0
		for i := range 10000 {
			key := fmt.Sprintf("key-%d", i)
			full := AffinityOrder(key, names, nil)
			before := names[full[0]]
			after := affinityFirst(key, smaller)
			if before != names[removed] {
				if after != before {
					t.Fatalf("remove %s: key %q moved %s -> %s", names[removed], key, before, after)
				}
				continue
			}
			moved++
			// Keys of the removed provider go to their second choice.
			if second := names[full[1]]; after != second {
				t.Fatalf("remove %s: key %q went to %s, want its second choice %s", names[removed], key, after, second)
			}
		}
		if moved == 0 {
			t.Errorf("remove %s: no key had it first", names[removed])
		}
	}
}

func TestAffinityOrderAddProvider(t *testing.T) {
	const keys = 10000
	names := affinityNames(4)
	bigger := append(slices.Clone(names), "provider-new")
	moved := 0
	for i := range keys {
		key := fmt.Sprintf("key-%d", i)
		before, after := affinityFirst(key, names), affinityFirst(key, bigger)
		if before != after {
			if after != "provider-new" {
				t.Fatalf("key %q moved %s -> %s, not to the new provider", key, before, after)
			}
			moved++
		}
	}
	// Roughly 1/5 of keys move to the new provider.
	want := keys / len(bigger)
	if moved < want*80/100 || moved > want*120/100 {
		t.Errorf("%d keys moved, want about %d", moved, want)
	}
}

func TestAffinityOrderDistribution(t *testing.T) {
	for _, n := range []int{2, 3, 5, 8} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			const keys = 10000
			names := affinityNames(n)
			counts := make([]int, n)
			for i := range keys {
				counts[AffinityOrder(fmt.Sprintf("client-%d", i), names, nil)[0]]++
			}
			want := keys / n
			for i, c := range counts {
				if c < want*85/100 || c > want*115/100 {
					t.Errorf("%s first for %d keys, want %d ±15%% (%v)", names[i], c, want, counts)
				}
			}
		})
	}
}

func TestAffinityOrderConcurrent(t *testing.T) {
	names := affinityNames(6)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst []int
			for i := range 500 {
				key := fmt.Sprintf("k-%d-%d", g, i)
				dst = AffinityOrder(key, names, dst[:0])
				if len(dst) != len(names) || names[dst[0]] != affinityFirst(key, names) {
					t.Errorf("AffinityOrder(%q) = %v", key, dst)
					return
				}
			}
		}()
	}
	wg.Wait()
}
