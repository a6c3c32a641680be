package pool

import "slices"

// Handler succession: what a handler made for its clients (a WebDriver
// session) serves only requests through a handler with the same key
// (handlers.go). A reload that leaves a handler's block as it was gives
// the new handler the same key, so nothing changes; one that changes the
// block gives a new key, and the sessions bound to the old key move to
// the handler of the new config that replaces it. That is the one the
// queue's Retire hands waiters to: of the live handlers of another config
// load (those of its own load go with it), the one sharing the most
// providers with it, a handler of a later load first among equals, then
// one whose key is new in that load (a handler whose block stayed as it
// was kept its key, so it replaces nothing), then the first registered.
//
// Sessions of this process are moved at once. A route another node
// shares names the handler key its owner bound it to; the owner moves it
// when its own reload retires that key, and until then this node follows
// the successions it saw itself (Serves), a few of them kept.

// maxSuccessions bounds the successions kept for other nodes' routes:
// one per reload that changed a handler's block.
const maxSuccessions = 64

// succession is the live handlers and the successions seen (under
// Handlers.mu).
type succession struct {
	live []*handlerEntry
	seq  uint64
	// next holds, for a key no live handler has, its successor's key,
	// oldest first.
	next  map[string]string
	order []string
	// gone holds, for a retired handler, its key, oldest first: Caddy
	// lets the servers of a config on its way out finish the requests
	// they read after its Cleanup, and a command on a kept-alive
	// connection can be one of them.
	gone      map[any]string
	goneOrder []any
}

// handlerEntry is one live handler.
type handlerEntry struct {
	owner     any
	load      any
	key       string
	providers []string
	seq       uint64
	// fresh: no live handler had its key when it was registered.
	fresh bool
}

// Register lists owner, a handler of config load load with key and
// providers (their names), until Retire.
func (h *Handlers) Register(owner, load any, key string, providers []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := &h.succession
	s.seq++
	e := &handlerEntry{owner: owner, load: load, key: key, providers: slices.Clone(providers), seq: s.seq, fresh: true}
	for _, o := range s.live {
		if o.key == key {
			e.fresh = false
		}
	}
	s.live = append(s.live, e)
	// A key in use again serves its own sessions.
	if _, ok := s.next[key]; ok {
		delete(s.next, key)
		s.order = slices.DeleteFunc(s.order, func(k string) bool { return k == key })
	}
}

// Retired is what Retire did: the key that no live handler has any
// more, its successor's key ("" when no live handler shares a provider
// with it) and the live sessions moved to it.
type Retired struct {
	Key, Successor string
	// SuccessorOwner is the successor's owner (nil: none).
	SuccessorOwner any
	Moved          []Live
}

// Retire takes owner off the live handlers (its Cleanup). When no other
// live handler has its key, the sessions bound to the key move to its
// successor, and ok is true.
func (h *Handlers) Retire(owner any) (ret Retired, ok bool) {
	h.mu.Lock()
	s := &h.succession
	i := slices.IndexFunc(s.live, func(e *handlerEntry) bool { return e.owner == owner })
	if i < 0 {
		h.mu.Unlock()
		return Retired{}, false
	}
	gone := s.live[i]
	s.live = slices.Delete(s.live, i, i+1)
	if s.gone == nil {
		s.gone = map[any]string{}
	}
	s.gone[owner] = gone.key
	s.goneOrder = append(s.goneOrder, owner)
	if len(s.goneOrder) > maxSuccessions {
		delete(s.gone, s.goneOrder[0])
		s.goneOrder = s.goneOrder[1:]
	}
	for _, e := range s.live {
		if e.key == gone.key {
			h.mu.Unlock()
			return Retired{}, false // the same handler, in a config still live
		}
	}
	ret.Key = gone.key
	if next := successorOf(gone, s.live); next != nil {
		ret.Successor, ret.SuccessorOwner = next.key, next.owner
		if s.next == nil {
			s.next = map[string]string{}
		}
		s.next[gone.key] = next.key
		s.order = append(s.order, gone.key)
		if len(s.order) > maxSuccessions {
			delete(s.next, s.order[0])
			s.order = s.order[1:]
		}
	}
	h.mu.Unlock()
	if ret.Successor != "" {
		ret.Moved = h.sessions.rebind(gone.key, ret.Successor)
	}
	return ret, true
}

// successorOf picks gone's successor among live (see the top of the
// file); nil when none shares a provider with it.
func successorOf(gone *handlerEntry, live []*handlerEntry) *handlerEntry {
	var best *handlerEntry
	var bestScore [3]int
	for _, c := range live {
		if c.load == gone.load {
			continue // going with it (or never served: a load that failed)
		}
		shared := 0
		for _, p := range c.providers {
			if slices.Contains(gone.providers, p) {
				shared++
			}
		}
		if shared == 0 {
			continue
		}
		later := 0
		if c.seq > gone.seq {
			later = 1
		}
		fresh := 0
		if c.fresh {
			fresh = 1
		}
		score := [3]int{shared, later, fresh}
		if best == nil || greater(score, bestScore) {
			best, bestScore = c, score
		}
	}
	return best
}

// greater compares scores in order of their parts.
func greater(a, b [3]int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] > b[i]
		}
	}
	return false
}

// Serves reports whether a request through owner (a registered handler)
// may use something bound to the handler key bound: owner has that key;
// or no handler of owner's config load has it, every handler that still
// has it belongs to an earlier load (the config owner's replaces, on its
// way out: a request through owner means its config is the running one),
// and owner is the one Retire will move it to; or, when no live handler
// has it, owner's key follows it in the successions this process saw (a
// route another node bound before its own reload). A retired owner (a
// request its server read before the reload closed it) serves what the
// live handler standing for it now serves: the one with its key, or its
// successor.
func (h *Handlers) Serves(bound string, owner any) bool {
	if bound == "" {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	s := &h.succession
	me := s.standingFor(owner)
	if me == nil {
		return false
	}
	cur := bound
	for range len(s.order) + 1 {
		if cur == me.key {
			return true
		}
		var holder *handlerEntry
		for _, e := range s.live {
			if e.key != cur {
				continue
			}
			if e.load == me.load || e.seq > me.seq {
				return false // another handler of the running config
			}
			if holder == nil {
				holder = e
			}
		}
		if holder != nil {
			next := successorOf(holder, s.live)
			return next != nil && next.key == me.key
		}
		next, ok := s.next[cur]
		if !ok {
			return false
		}
		cur = next
	}
	return false
}

// standingFor is the live handler that serves for owner: owner itself
// while live; for a retired one, the newest live handler with its key,
// else the live one its succession leads to; nil when none.
func (s *succession) standingFor(owner any) *handlerEntry {
	if i := slices.IndexFunc(s.live, func(e *handlerEntry) bool { return e.owner == owner }); i >= 0 {
		return s.live[i]
	}
	key, ok := s.gone[owner]
	for range len(s.order) + 1 {
		if !ok {
			return nil
		}
		var newest *handlerEntry
		for _, e := range s.live {
			if e.key == key && (newest == nil || e.seq > newest.seq) {
				newest = e
			}
		}
		if newest != nil {
			return newest
		}
		key, ok = s.next[key]
	}
	return nil
}
