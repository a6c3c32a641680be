package pool

import (
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/browserfailover/caddy-browser-failover/queue"
)

// QueueInfo is what the status shows of one handler's wait queue.
type QueueInfo interface {
	Len() int
	Size() int
	Timeout() time.Duration
}

// QueueCount is one handler's line in the wait queue: how many wait in it,
// its size and timeout, and the providers of its handler.
type QueueCount struct {
	// Handler names the handler: the names of its providers blocks and
	// providers, in config order, joined by commas; a second handler
	// of the same name is told apart by "#2" after it, a third by "#3",
	// in the order they were registered.
	Handler string
	Waiting int
	Size    int
	Timeout time.Duration
	// Providers are the names of the handler's providers: those that
	// take new sessions, then the found ones leaving.
	Providers []string
	// Taking are the handler's providers that take new sessions; Leaving
	// are the providers it found whose address left their source (no
	// new session; their live ones go on).
	Taking, Leaving []*ProviderState
}

// Queues are the handlers' lines of the wait queue as status lists them:
// each handler registers its own on Provision and removes it on Cleanup.
type Queues struct {
	mu      sync.Mutex
	entries map[any]*queueEntry
	seq     uint64
}

func newQueues() *Queues { return &Queues{entries: map[any]*queueEntry{}} }

type queueEntry struct {
	q               QueueInfo
	name            string
	taking, leaving []*ProviderState
	order           uint64
}

// Register lists a handler's queue (q may report size 0 when the queue
// is off) under owner, with the handler's name, until Unregister.
func (s *Queues) Register(owner any, q QueueInfo, name string) {
	s.mu.Lock()
	s.seq++
	s.entries[owner] = &queueEntry{q: q, name: name, order: s.seq}
	s.mu.Unlock()
}

// SetProviders sets the providers of owner's handler: those that take
// new sessions, and those it found that are leaving. A handler sets them
// on Provision and each time a providers block changes them.
func (s *Queues) SetProviders(owner any, taking, leaving []*ProviderState) {
	s.mu.Lock()
	if e := s.entries[owner]; e != nil {
		e.taking, e.leaving = slices.Clone(taking), slices.Clone(leaving)
	}
	s.mu.Unlock()
}

// Unregister removes owner's queue.
func (s *Queues) Unregister(owner any) {
	s.mu.Lock()
	delete(s.entries, owner)
	s.mu.Unlock()
}

// Counts lists the registered queues in registration order.
func (s *Queues) Counts() []QueueCount {
	s.mu.Lock()
	entries := make([]queueEntry, 0, len(s.entries))
	for _, e := range s.entries {
		entries = append(entries, *e)
	}
	s.mu.Unlock()
	sort.Slice(entries, func(i, j int) bool { return entries[i].order < entries[j].order })
	out := make([]QueueCount, 0, len(entries))
	seen := map[string]int{}
	for _, e := range entries {
		name := e.name
		if seen[e.name]++; seen[e.name] > 1 {
			name += "#" + strconv.Itoa(seen[e.name])
		}
		names := make([]string, 0, len(e.taking)+len(e.leaving))
		for _, p := range slices.Concat(e.taking, e.leaving) {
			names = append(names, p.Name())
		}
		out = append(out, QueueCount{
			Handler:   name,
			Waiting:   e.q.Len(),
			Size:      e.q.Size(),
			Timeout:   e.q.Timeout(),
			Providers: names,
			Taking:    e.taking,
			Leaving:   e.leaving,
		})
	}
	return out
}

// A line of the queue is what the status shows of a handler's queue.
var _ QueueInfo = (*queue.Line)(nil)
