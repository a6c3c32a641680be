package pool

import (
	"slices"
	"sync"

	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// APIBooks are the session API counts of each provider that has a session
// API (upstreams.Books), by provider name. A provider's counts are made on
// its first use and live as long as the registry, so a reload keeps them.
type APIBooks struct {
	mu    sync.Mutex
	books map[string]*upstreams.Books
}

func newAPIBooks() *APIBooks {
	return &APIBooks{books: map[string]*upstreams.Books{}}
}

// Of returns the session API counts of the provider name, made on first
// use.
func (b *APIBooks) Of(name string) *upstreams.Books {
	b.mu.Lock()
	defer b.mu.Unlock()
	k, ok := b.books[name]
	if !ok {
		k = &upstreams.Books{}
		b.books[name] = k
	}
	return k
}

// All returns the names of the providers with session API counts, in
// order, and their counts.
func (b *APIBooks) All() ([]string, []*upstreams.Books) {
	b.mu.Lock()
	defer b.mu.Unlock()
	names := make([]string, 0, len(b.books))
	for n := range b.books {
		names = append(names, n)
	}
	slices.Sort(names)
	out := make([]*upstreams.Books, len(names))
	for i, n := range names {
		out[i] = b.books[n]
	}
	return names, out
}

// Lookup returns the counts of provider name, if it has a session API.
func (b *APIBooks) Lookup(name string) (*upstreams.Books, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k, ok := b.books[name]
	return k, ok
}
