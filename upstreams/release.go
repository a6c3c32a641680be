package upstreams

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Releases of provider sessions run here, off the request path: a
// process-wide releaser with a bounded number of calls in flight, each
// session tried up to ReleaseTries times, each call bounded by
// ReleaseTimeout. Submitting never blocks.

// Release settings.
var (
	// ReleaseTries is how many calls one release makes at most.
	ReleaseTries = 3
	// ReleaseTimeout bounds one release call.
	ReleaseTimeout = 10 * time.Second
	// ReleaseBackoff is the wait before retry n (1, 2, …): n times it.
	ReleaseBackoff = time.Second
	// ReleaseConcurrency bounds the release calls in flight.
	ReleaseConcurrency = 8
	// ReleaseSleep waits between tries; tests replace it.
	ReleaseSleep = func(d time.Duration) { time.Sleep(d) }
	// OnReleaseFailure, when set, hears of each failed release call
	// (the provider's name and the cause, which never holds a secret).
	OnReleaseFailure func(provider string, err error)
)

type counter = atomic.Int64

// chanOnce is a sync.Once that reports whether this call was the first.
type chanOnce struct{ done atomic.Bool }

func (o *chanOnce) do() bool { return o.done.CompareAndSwap(false, true) }

var (
	booksMu sync.Mutex
	books   = map[string]*Books{}
)

// BooksOf returns the session API counts of the provider name, made on
// first use; they live as long as the process.
func BooksOf(name string) *Books {
	booksMu.Lock()
	defer booksMu.Unlock()
	b, ok := books[name]
	if !ok {
		b = &Books{}
		books[name] = b
	}
	return b
}

// AllBooks returns the names of the providers with session API counts, in
// order, and their counts.
func AllBooks() ([]string, []*Books) {
	booksMu.Lock()
	defer booksMu.Unlock()
	names := make([]string, 0, len(books))
	for n := range books {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]*Books, len(names))
	for i, n := range names {
		out[i] = books[n]
	}
	return names, out
}

// LookupBooks returns the counts of provider name, if it has a session API.
func LookupBooks(name string) (*Books, bool) {
	booksMu.Lock()
	defer booksMu.Unlock()
	b, ok := books[name]
	return b, ok
}

type releaser struct {
	slots   chan struct{}
	mu      sync.Mutex
	pending int
	idle    *sync.Cond
}

var rel = func() *releaser {
	r := &releaser{}
	r.idle = sync.NewCond(&r.mu)
	return r
}()

func (r *releaser) submit(s *Remote) {
	r.mu.Lock()
	if r.slots == nil {
		n := ReleaseConcurrency
		if n < 1 {
			n = 1
		}
		r.slots = make(chan struct{}, n)
	}
	slots := r.slots
	r.pending++
	r.mu.Unlock()
	go func() {
		defer func() {
			r.mu.Lock()
			r.pending--
			if r.pending == 0 {
				r.idle.Broadcast()
			}
			r.mu.Unlock()
		}()
		slots <- struct{}{}
		defer func() { <-slots }()
		s.run()
	}()
}

// run releases s: up to ReleaseTries calls, waiting n×ReleaseBackoff before
// try n+1.
func (s *Remote) run() {
	b := s.api.books
	for try := 1; try <= ReleaseTries; try++ {
		if try > 1 {
			ReleaseSleep(time.Duration(try-1) * ReleaseBackoff)
		}
		ctx, cancel := context.WithTimeout(context.Background(), ReleaseTimeout)
		ok, err := s.release(ctx)
		cancel()
		if ok {
			b.Released.Add(1)
			return
		}
		b.ReleaseFailures.Add(1)
		if f := OnReleaseFailure; f != nil {
			f(s.api.provider, err)
		}
	}
}

// PendingReleases is the number of releases not finished yet.
func PendingReleases() int {
	rel.mu.Lock()
	defer rel.mu.Unlock()
	return rel.pending
}

// WaitReleases waits until every submitted release has finished or the
// deadline passes; it reports whether all finished.
func WaitReleases(deadline time.Time) bool {
	t := time.AfterFunc(time.Until(deadline), func() {
		rel.mu.Lock()
		rel.idle.Broadcast()
		rel.mu.Unlock()
	})
	defer t.Stop()
	rel.mu.Lock()
	defer rel.mu.Unlock()
	for rel.pending > 0 && time.Now().Before(deadline) {
		rel.idle.Wait()
	}
	return rel.pending == 0
}
