package pool

import (
	"sort"
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
	Waiting   int
	Size      int
	Timeout   time.Duration
	Providers []string
}

// Queues are the handlers' lines of the wait queue as status lists them:
// each handler registers its own on Provision and removes it on Cleanup.
type Queues struct {
	mu      sync.Mutex
	entries map[any]queueEntry
	seq     uint64
}

func newQueues() *Queues { return &Queues{entries: map[any]queueEntry{}} }

type queueEntry struct {
	q         QueueInfo
	providers []string
	order     uint64
}

// Register lists a handler's queue (q may report size 0 when the queue
// is off) under owner until Unregister.
func (s *Queues) Register(owner any, q QueueInfo, providers []string) {
	s.mu.Lock()
	s.seq++
	s.entries[owner] = queueEntry{q: q, providers: providers, order: s.seq}
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
		entries = append(entries, e)
	}
	s.mu.Unlock()
	sort.Slice(entries, func(i, j int) bool { return entries[i].order < entries[j].order })
	out := make([]QueueCount, 0, len(entries))
	for _, e := range entries {
		out = append(out, QueueCount{
			Waiting:   e.q.Len(),
			Size:      e.q.Size(),
			Timeout:   e.q.Timeout(),
			Providers: append([]string(nil), e.providers...),
		})
	}
	return out
}

// A line of the queue is what the status shows of a handler's queue.
var _ QueueInfo = (*queue.Line)(nil)
