package upstreams

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Candidate is what a strategy knows of one provider when it orders them.
type Candidate struct {
	// Index is the provider's position in the handler's config.
	Index    int
	Priority int
	Weight   int
	// Active counts live sessions (and attempts in flight).
	Active int64
	// LatencyMS is the moving average of handshake times; HasLatency is
	// false while there is no sample yet.
	LatencyMS  float64
	HasLatency bool
	// Cost is what a session of the expected duration costs there (0
	// when the provider states no cost), for the cheapest strategy.
	Cost float64
}

// Strategy orders the candidates of one pass. Order appends the indices
// (Candidate.Index) in the order to try them to dst and returns it. advance
// is true only on a client's first pass: only then may the strategy move its
// own state (a queue wake-up or a status read must not).
//
// Every strategy here is safe for concurrent use and tolerates the set of
// candidates changing between calls.
type Strategy interface {
	Order(cands []Candidate, advance bool, dst []int) []int
}

// Strategy names.
const (
	StrategyPriority   = "priority"
	StrategyRoundRobin = "round_robin"
	StrategyLeastConn  = "least_conn"
	StrategyWeighted   = "weighted"
	StrategyRandom     = "random"
	StrategyLatency    = "latency"
	StrategyCheapest   = "cheapest"
)

// StrategyNames lists every strategy NewStrategy knows, the default
// (priority) first. Config validation and the Caddyfile parser use it.
var StrategyNames = []string{
	StrategyPriority, StrategyRoundRobin, StrategyLeastConn,
	StrategyWeighted, StrategyRandom, StrategyLatency, StrategyCheapest,
}

// NewStrategy returns the strategy of that name ("" is priority). Each call
// returns a fresh strategy with its own state.
func NewStrategy(name string) (Strategy, error) {
	switch name {
	case "", StrategyPriority:
		return priorityStrategy{}, nil
	case StrategyRoundRobin:
		return &roundRobinStrategy{}, nil
	case StrategyLeastConn:
		return leastConnStrategy{}, nil
	case StrategyWeighted:
		return &weightedStrategy{}, nil
	case StrategyRandom:
		return randomStrategy{}, nil
	case StrategyLatency:
		return latencyStrategy{}, nil
	case StrategyCheapest:
		return cheapestStrategy{}, nil
	}
	return nil, fmt.Errorf("unknown strategy %q (want one of %s)", name, strings.Join(StrategyNames, ", "))
}

// cmpPriority orders by priority (lower first), ties in config order.
func cmpPriority(a, b Candidate) int {
	if c := cmp.Compare(a.Priority, b.Priority); c != 0 {
		return c
	}
	return cmp.Compare(a.Index, b.Index)
}

// sortedCands returns a copy of cands sorted by cmpFn (stable).
func sortedCands(cands []Candidate, cmpFn func(a, b Candidate) int) []Candidate {
	s := slices.Clone(cands)
	slices.SortStableFunc(s, cmpFn)
	return s
}

// appendIndices appends the Index of each of cs to dst.
func appendIndices(dst []int, cs []Candidate) []int {
	for _, c := range cs {
		dst = append(dst, c.Index)
	}
	return dst
}

// appendFirstThenRest appends cs[first] and then the others of cs in their
// order.
func appendFirstThenRest(dst []int, cs []Candidate, first int) []int {
	dst = append(dst, cs[first].Index)
	for i, c := range cs {
		if i != first {
			dst = append(dst, c.Index)
		}
	}
	return dst
}

// effWeight is a candidate's weight; below 1 counts as 1.
func effWeight(c Candidate) int64 {
	if c.Weight < 1 {
		return 1
	}
	return int64(c.Weight)
}

// byPriority appends cands' indices sorted by priority, ties in config
// order.
func byPriority(cands []Candidate, dst []int) []int {
	return appendIndices(dst, sortedCands(cands, cmpPriority))
}

// priorityStrategy: by priority, ties in config order.
type priorityStrategy struct{}

func (priorityStrategy) Order(cands []Candidate, _ bool, dst []int) []int {
	return byPriority(cands, dst)
}

// roundRobinStrategy rotates the first provider on each advancing call over
// the providers in priority order; the rest follow in that rotated order.
type roundRobinStrategy struct {
	pos atomic.Uint64
}

func (s *roundRobinStrategy) Order(cands []Candidate, advance bool, dst []int) []int {
	n := len(cands)
	if n == 0 {
		return dst
	}
	sorted := sortedCands(cands, cmpPriority)
	var p uint64
	if advance {
		p = s.pos.Add(1) - 1
	} else {
		p = s.pos.Load()
	}
	start := int(p % uint64(n))
	for k := range n {
		dst = append(dst, sorted[(start+k)%n].Index)
	}
	return dst
}

// leastConnStrategy: fewest Active first, ties by priority then config
// order.
type leastConnStrategy struct{}

func (leastConnStrategy) Order(cands []Candidate, _ bool, dst []int) []int {
	return appendIndices(dst, sortedCands(cands, func(a, b Candidate) int {
		if c := cmp.Compare(a.Active, b.Active); c != 0 {
			return c
		}
		return cmpPriority(a, b)
	}))
}

// weightedStrategy picks the first provider by smooth weighted round robin
// (nginx's algorithm); the rest follow in priority order.
type weightedStrategy struct {
	mu sync.Mutex
	// sig is the (Index, Weight) set the state below was built for; when
	// the candidates differ, the state starts over.
	sig []weightedKey
	// cur is the current weight of each provider, by Index.
	cur map[int]int64
}

type weightedKey struct {
	index  int
	weight int64
}

// sameSet reports whether sorted (by priority) matches the recorded set.
func (s *weightedStrategy) sameSet(sorted []Candidate) bool {
	if len(s.sig) != len(sorted) || s.cur == nil {
		return false
	}
	for i, c := range sorted {
		if s.sig[i] != (weightedKey{c.Index, effWeight(c)}) {
			return false
		}
	}
	return true
}

func (s *weightedStrategy) Order(cands []Candidate, advance bool, dst []int) []int {
	n := len(cands)
	if n == 0 {
		return dst
	}
	sorted := sortedCands(cands, cmpPriority)

	s.mu.Lock()
	same := s.sameSet(sorted)
	if advance && !same {
		s.sig = s.sig[:0]
		s.cur = make(map[int]int64, n)
		for _, c := range sorted {
			s.sig = append(s.sig, weightedKey{c.Index, effWeight(c)})
		}
		same = true
	}
	// Add each weight to its current weight and pick the largest (ties to
	// the earlier in priority order). Without advance, compute what the
	// next advancing call would pick (from zero if the set changed).
	best := -1
	var bestCur, total int64
	for i, c := range sorted {
		w := effWeight(c)
		total += w
		var cw int64
		if same {
			cw = s.cur[c.Index]
		}
		cw += w
		if best < 0 || cw > bestCur {
			best, bestCur = i, cw
		}
	}
	if advance {
		for _, c := range sorted {
			s.cur[c.Index] += effWeight(c)
		}
		s.cur[sorted[best].Index] -= total
	}
	s.mu.Unlock()

	return appendFirstThenRest(dst, sorted, best)
}

// randomStrategy: a uniformly random first provider, the rest in priority
// order.
type randomStrategy struct{}

func (randomStrategy) Order(cands []Candidate, _ bool, dst []int) []int {
	n := len(cands)
	if n == 0 {
		return dst
	}
	sorted := sortedCands(cands, cmpPriority)
	return appendFirstThenRest(dst, sorted, rand.IntN(n))
}

// latencyStrategy: providers without a sample first (in priority order),
// then by ascending latency, ties by priority then config order.
type latencyStrategy struct{}

func (latencyStrategy) Order(cands []Candidate, _ bool, dst []int) []int {
	return appendIndices(dst, sortedCands(cands, func(a, b Candidate) int {
		if a.HasLatency != b.HasLatency {
			if !a.HasLatency {
				return -1
			}
			return 1
		}
		if a.HasLatency {
			if c := cmp.Compare(a.LatencyMS, b.LatencyMS); c != 0 {
				return c
			}
		}
		return cmpPriority(a, b)
	}))
}

// cheapestStrategy: by the cost of an expected session (Candidate.Cost),
// lower first; costs within a relative 1e-9 of each other tie, and ties
// go by priority, then config order.
type cheapestStrategy struct{}

func (cheapestStrategy) Order(cands []Candidate, _ bool, dst []int) []int {
	return appendIndices(dst, sortedCands(cands, func(a, b Candidate) int {
		if !sameCost(a.Cost, b.Cost) {
			return cmp.Compare(a.Cost, b.Cost)
		}
		return cmpPriority(a, b)
	}))
}

// sameCost reports whether two costs tie: within 1e-9 of the larger.
func sameCost(a, b float64) bool {
	d := math.Abs(a - b)
	return d <= 1e-9*math.Max(math.Abs(a), math.Abs(b))
}
