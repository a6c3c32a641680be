package cluster

import "time"

// Spare slots: a slot of a capped provider released on this node is kept
// for spareKeep, for this node's next connect (see Lease.Release), unless
// another node said it waits for one (EventWanted).

// spareKeep is how long a released slot of a capped provider is kept for
// this node's next connect; wantedFor is how long none is kept once
// another node said it waits for one.
const (
	spareKeep = 100 * time.Millisecond
	wantedFor = 2 * time.Second
)

// spare is a slot kept after its session ended (see Release), since at.
type spare struct {
	l  *Lease
	at time.Time
}

// spares are the slots kept, by provider, oldest first, and until when
// another node waits for a slot of a provider (none is kept meanwhile).
// Its methods run under Leases.mu; a kept slot is among the leases held
// (renewed, and given back at Close, like the others).
type spares struct {
	kept   map[string][]spare
	wanted map[string]time.Time
}

// mayKeep reports whether a slot of provider released at now may be
// kept: no other node waits for one.
func (s *spares) mayKeep(provider string, now time.Time) bool {
	return !now.Before(s.wanted[provider])
}

// keep keeps l, released at now.
func (s *spares) keep(l *Lease, now time.Time) {
	s.kept[l.provider] = append(s.kept[l.provider], spare{l: l, at: now})
}

// take hands out the newest kept slot of provider, or nil.
func (s *spares) take(provider string) *Lease {
	kept := s.kept[provider]
	if len(kept) == 0 {
		return nil
	}
	sp := kept[len(kept)-1].l
	s.kept[provider] = kept[:len(kept)-1]
	if len(kept) == 1 {
		delete(s.kept, provider)
	}
	return sp
}

// drop forgets every kept slot of provider and returns them, to be given
// back.
func (s *spares) drop(provider string) []spare {
	kept := s.kept[provider]
	delete(s.kept, provider)
	return kept
}

// expire forgets the slots kept spareKeep at now and returns them, to be
// given back.
func (s *spares) expire(now time.Time) []spare {
	var out []spare
	for p, kept := range s.kept {
		n := 0
		for n < len(kept) && now.Sub(kept[n].at) >= spareKeep {
			out = append(out, kept[n])
			n++
		}
		if n == len(kept) {
			delete(s.kept, p)
		} else {
			s.kept[p] = kept[n:]
		}
	}
	return out
}

// nextEnd is when the oldest kept slot is due to be given back; false
// when none is kept.
func (s *spares) nextEnd() (time.Time, bool) {
	var next time.Time
	for _, kept := range s.kept {
		if len(kept) > 0 && (next.IsZero() || kept[0].at.Before(next)) {
			next = kept[0].at
		}
	}
	return next.Add(spareKeep), !next.IsZero()
}

// clear forgets every kept slot (Close gives them back with the held
// leases).
func (s *spares) clear() { s.kept = map[string][]spare{} }

// takeSpareLocked hands out a spare slot of provider, the newest, or nil.
// Spares are not used while the provider's live leases, as last read, are
// above max (max lowered by a reload): they are given back instead. Under
// ls.mu.
func (ls *Leases) takeSpareLocked(provider string, max int) *Lease {
	if len(ls.spares.kept[provider]) == 0 {
		return nil
	}
	if seen, ok := ls.live[provider]; ok && seen.n > max {
		ls.dropSparesLocked(provider)
		return nil
	}
	return ls.spares.take(provider)
}

// dropSparesLocked gives back every spare of provider. Under ls.mu.
func (ls *Leases) dropSparesLocked(provider string) {
	ls.w.giveBackLocked(ls.spares.drop(provider))
	ls.w.startLocked()
}

// noteWanted: another node waits for a slot of provider. Its spares here
// are given back, and none is kept for wantedFor.
func (ls *Leases) noteWanted(provider string) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed {
		return
	}
	ls.spares.wanted[provider] = time.Now().Add(wantedFor)
	if len(ls.spares.kept[provider]) > 0 {
		ls.dropSparesLocked(provider)
	}
}
