package upstreams

import "slices"

// AffinityOrder appends the indices of names to dst in the order to try
// them for key, by rendezvous (highest random weight) hashing: each provider
// scores hash(key, name) and the highest score goes first (ties by index).
// A key keeps its first provider while that provider is in names, and
// removing a provider moves only the keys whose first choice it was.
func AffinityOrder(key string, names []string, dst []int) []int {
	type scored struct {
		score uint64
		index int
	}
	var buf [16]scored
	s := buf[:0]
	for i, name := range names {
		s = append(s, scored{affinityScore(key, name), i})
	}
	slices.SortFunc(s, func(a, b scored) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		}
		return a.index - b.index
	})
	for _, e := range s {
		dst = append(dst, e.index)
	}
	return dst
}

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// affinityScore is FNV-1a 64 over name + 0x00 + key, finished with the
// splitmix64 mixer to spread the bits.
func affinityScore(key, name string) uint64 {
	h := uint64(fnvOffset64)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= fnvPrime64
	}
	h *= fnvPrime64 // the 0x00 separator (xor with 0 is a no-op)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= fnvPrime64
	}
	return splitmix64(h)
}

// splitmix64 is the finaliser of the SplitMix64 generator.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
