package upstreams

import (
	"fmt"
	"slices"
	"sync"
	"testing"
)

// stratCands builds candidates in config order from priorities; Weight 1.
func stratCands(prios ...int) []Candidate {
	cs := make([]Candidate, len(prios))
	for i, p := range prios {
		cs[i] = Candidate{Index: i, Priority: p, Weight: 1}
	}
	return cs
}

func mustStrategy(t *testing.T, name string) Strategy {
	t.Helper()
	s, err := NewStrategy(name)
	if err != nil {
		t.Fatalf("NewStrategy(%q): %v", name, err)
	}
	return s
}

func TestNewStrategyNames(t *testing.T) {
	for _, name := range []string{"", StrategyPriority, StrategyRoundRobin, StrategyLeastConn, StrategyWeighted, StrategyRandom, StrategyLatency} {
		s, err := NewStrategy(name)
		if err != nil || s == nil {
			t.Errorf("NewStrategy(%q) = %v, %v", name, s, err)
		}
	}
	if _, err := NewStrategy("fastest"); err == nil {
		t.Error("NewStrategy(fastest): want error")
	}
}

func TestStrategyEmptyCandidates(t *testing.T) {
	for _, name := range []string{StrategyPriority, StrategyRoundRobin, StrategyLeastConn, StrategyWeighted, StrategyRandom, StrategyLatency} {
		s := mustStrategy(t, name)
		for _, adv := range []bool{true, false} {
			if got := s.Order(nil, adv, nil); len(got) != 0 {
				t.Errorf("%s: Order(nil) = %v", name, got)
			}
		}
		// dst's existing contents are kept.
		got := s.Order(stratCands(0, 0), true, []int{42})
		if len(got) != 3 || got[0] != 42 {
			t.Errorf("%s: Order with dst = %v", name, got)
		}
	}
}

// TestStrategyPermutation checks every strategy returns each index once.
func TestStrategyPermutation(t *testing.T) {
	cands := stratCands(3, -1, 0, 3, 2)
	cands[2].Weight = 5
	cands[1].Active = 4
	cands[4].HasLatency, cands[4].LatencyMS = true, 12
	for _, name := range []string{StrategyPriority, StrategyRoundRobin, StrategyLeastConn, StrategyWeighted, StrategyRandom, StrategyLatency} {
		s := mustStrategy(t, name)
		for i := range 50 {
			got := s.Order(cands, i%2 == 0, nil)
			sorted := slices.Sorted(slices.Values(got))
			if !slices.Equal(sorted, []int{0, 1, 2, 3, 4}) {
				t.Fatalf("%s: Order = %v, not a permutation", name, got)
			}
		}
	}
}

func TestPriorityOrder(t *testing.T) {
	tests := []struct {
		name  string
		prios []int
		want  []int
	}{
		{"config order on all ties", []int{0, 0, 0}, []int{0, 1, 2}},
		{"by priority", []int{2, 0, 1}, []int{1, 2, 0}},
		{"ties keep config order", []int{1, 0, 1, 0}, []int{1, 3, 0, 2}},
		{"negative first", []int{0, -5, 3, -1}, []int{1, 3, 0, 2}},
		{"single", []int{7}, []int{0}},
	}
	s := mustStrategy(t, StrategyPriority)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := s.Order(stratCands(tt.prios...), true, nil); !slices.Equal(got, tt.want) {
				t.Errorf("Order = %v, want %v", got, tt.want)
			}
		})
	}
	if got := mustStrategy(t, "").Order(stratCands(1, 0), true, nil); !slices.Equal(got, []int{1, 0}) {
		t.Errorf(`"" strategy Order = %v, want [1 0]`, got)
	}
}

func TestRoundRobinOrder(t *testing.T) {
	s := mustStrategy(t, StrategyRoundRobin)
	// Priority order: 1, 2, 0.
	cands := stratCands(5, 0, 1)
	wantSeq := [][]int{{1, 2, 0}, {2, 0, 1}, {0, 1, 2}, {1, 2, 0}}
	for i, want := range wantSeq {
		// advance=false shows the same order the next advancing call
		// uses and does not move the rotation.
		for range 3 {
			if got := s.Order(cands, false, nil); !slices.Equal(got, want) {
				t.Fatalf("step %d: Order(advance=false) = %v, want %v", i, got, want)
			}
		}
		if got := s.Order(cands, true, nil); !slices.Equal(got, want) {
			t.Fatalf("step %d: Order = %v, want %v", i, got, want)
		}
	}
}

func TestRoundRobinEvenSpread(t *testing.T) {
	s := mustStrategy(t, StrategyRoundRobin)
	cands := stratCands(0, 1, 0)
	counts := map[int]int{}
	for range 3000 {
		counts[s.Order(cands, true, nil)[0]]++
		s.Order(cands, false, nil) // must not move the rotation
	}
	for i := range 3 {
		if counts[i] != 1000 {
			t.Errorf("provider %d first %d times, want 1000 (%v)", i, counts[i], counts)
		}
	}
}

func TestRoundRobinCandidateSetChanges(t *testing.T) {
	s := mustStrategy(t, StrategyRoundRobin)
	for i := range 100 {
		n := i%5 + 1
		got := s.Order(stratCands(make([]int, n)...), i%3 != 0, nil)
		if len(got) != n {
			t.Fatalf("Order over %d = %v", n, got)
		}
	}
}

func TestLeastConnOrder(t *testing.T) {
	tests := []struct {
		name   string
		prios  []int
		active []int64
		want   []int
	}{
		{"fewest first", []int{0, 0, 0}, []int64{5, 1, 3}, []int{1, 2, 0}},
		{"ties by priority", []int{2, 0, 1}, []int64{1, 1, 1}, []int{1, 2, 0}},
		{"ties by config order", []int{0, 0, 0}, []int64{2, 0, 2}, []int{1, 0, 2}},
		{"active beats priority", []int{0, 9, 0}, []int64{3, 0, 3}, []int{1, 0, 2}},
		{"mixed", []int{1, 0, 0, 1}, []int64{2, 2, 0, 0}, []int{2, 3, 1, 0}},
	}
	s := mustStrategy(t, StrategyLeastConn)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cands := stratCands(tt.prios...)
			for i := range cands {
				cands[i].Active = tt.active[i]
			}
			for _, adv := range []bool{true, false} {
				if got := s.Order(cands, adv, nil); !slices.Equal(got, tt.want) {
					t.Errorf("Order(advance=%v) = %v, want %v", adv, got, tt.want)
				}
			}
		})
	}
}

func TestLatencyOrder(t *testing.T) {
	type sample struct {
		has bool
		ms  float64
	}
	tests := []struct {
		name    string
		prios   []int
		samples []sample
		want    []int
	}{
		{
			"new first, slow last",
			[]int{0, 0, 0, 0},
			[]sample{{true, 80}, {true, 900}, {false, 0}, {true, 40}},
			[]int{2, 3, 0, 1},
		},
		{
			"no samples in priority order",
			[]int{1, 0, 1},
			[]sample{{false, 0}, {false, 0}, {false, 0}},
			[]int{1, 0, 2},
		},
		{
			"several new first in priority order, then by latency",
			[]int{0, 2, 1, 0},
			[]sample{{true, 10}, {false, 0}, {false, 0}, {true, 5}},
			[]int{2, 1, 3, 0},
		},
		{
			"latency ties by priority then config order",
			[]int{1, 0, 1, 0},
			[]sample{{true, 50}, {true, 50}, {true, 50}, {true, 20}},
			[]int{3, 1, 0, 2},
		},
	}
	s := mustStrategy(t, StrategyLatency)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cands := stratCands(tt.prios...)
			for i := range cands {
				cands[i].HasLatency, cands[i].LatencyMS = tt.samples[i].has, tt.samples[i].ms
			}
			if got := s.Order(cands, true, nil); !slices.Equal(got, tt.want) {
				t.Errorf("Order = %v, want %v", got, tt.want)
			}
		})
	}
}

func weightedCands(weights ...int) []Candidate {
	cs := make([]Candidate, len(weights))
	for i, w := range weights {
		cs[i] = Candidate{Index: i, Weight: w}
	}
	return cs
}

func TestWeightedExactAndSmooth(t *testing.T) {
	s := mustStrategy(t, StrategyWeighted)
	cands := weightedCands(3, 1)
	counts := map[int]int{}
	run, maxRun := 0, 0
	for i := range 4000 {
		peek := s.Order(cands, false, nil)
		got := s.Order(cands, true, nil)
		if !slices.Equal(peek, got) {
			t.Fatalf("pick %d: advance=false gave %v, next advancing call %v", i, peek, got)
		}
		if len(got) != 2 || got[0] == got[1] {
			t.Fatalf("Order = %v", got)
		}
		counts[got[0]]++
		if got[0] == 0 {
			run++
			maxRun = max(maxRun, run)
		} else {
			run = 0
		}
	}
	if counts[0] != 3000 || counts[1] != 1000 {
		t.Errorf("first picks = %v, want 3000/1000", counts)
	}
	if maxRun > 3 {
		t.Errorf("heavy provider first %d times in a row, want <= 3", maxRun)
	}
}

func TestWeightedSequence(t *testing.T) {
	tests := []struct {
		name    string
		weights []int
		prios   []int
		want    []int // first picks of consecutive advancing calls
		rest    []int // the full order of the first call
	}{
		// nginx's classic example: a=5, b=1, c=1 gives a a b a c a a.
		{"nginx 5:1:1", []int{5, 1, 1}, []int{0, 0, 0}, []int{0, 0, 1, 0, 2, 0, 0, 0, 0, 1}, []int{0, 1, 2}},
		{"equal weights rotate", []int{1, 1, 1}, []int{0, 0, 0}, []int{0, 1, 2, 0, 1, 2}, []int{0, 1, 2}},
		{"weight below 1 is 1", []int{0, -3, 1}, []int{0, 0, 0}, []int{0, 1, 2, 0, 1, 2}, []int{0, 1, 2}},
		{"ties go to priority, rest in priority order", []int{1, 1, 1}, []int{2, 0, 1}, []int{1, 2, 0, 1}, []int{1, 2, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := mustStrategy(t, StrategyWeighted)
			cands := weightedCands(tt.weights...)
			for i := range cands {
				cands[i].Priority = tt.prios[i]
			}
			var firsts []int
			for i := range tt.want {
				got := s.Order(cands, true, nil)
				if i == 0 && !slices.Equal(got, tt.rest) {
					t.Errorf("first Order = %v, want %v", got, tt.rest)
				}
				firsts = append(firsts, got[0])
			}
			if !slices.Equal(firsts, tt.want) {
				t.Errorf("first picks = %v, want %v", firsts, tt.want)
			}
		})
	}
}

func TestWeightedRestInPriorityOrder(t *testing.T) {
	s := mustStrategy(t, StrategyWeighted)
	cands := weightedCands(1, 1, 10, 1)
	cands[0].Priority, cands[1].Priority, cands[2].Priority, cands[3].Priority = 3, 1, 2, 0
	// Provider 2 (weight 10) wins the first pick.
	if got, want := s.Order(cands, true, nil), []int{2, 3, 1, 0}; !slices.Equal(got, want) {
		t.Errorf("Order = %v, want %v", got, want)
	}
}

func TestWeightedAdvanceFalseKeepsState(t *testing.T) {
	s := mustStrategy(t, StrategyWeighted)
	cands := weightedCands(2, 1)
	// Sequence with advance: 0 1 0 0 1 0 ...
	want := []int{0, 1, 0, 0, 1, 0}
	for i, w := range want {
		for range 5 {
			if got := s.Order(cands, false, nil)[0]; got != w {
				t.Fatalf("step %d: advance=false first = %d, want %d", i, got, w)
			}
		}
		if got := s.Order(cands, true, nil)[0]; got != w {
			t.Fatalf("step %d: first = %d, want %d", i, got, w)
		}
	}
}

func TestWeightedCandidateSetChanges(t *testing.T) {
	s := mustStrategy(t, StrategyWeighted)
	sets := [][]Candidate{
		weightedCands(3, 1),
		weightedCands(3, 1, 2),
		weightedCands(5),
		nil,
		{{Index: 4, Weight: 2}, {Index: 7, Weight: 1}},
		weightedCands(3, 1),
		weightedCands(1, 3), // same indices, new weights
	}
	for i := range 200 {
		cands := sets[i%len(sets)]
		for _, adv := range []bool{false, true} {
			got := s.Order(cands, adv, nil)
			if len(got) != len(cands) {
				t.Fatalf("Order(%v) = %v", cands, got)
			}
		}
	}
	// After a change, the state starts over: the heaviest goes first.
	s.Order(weightedCands(1, 1, 1), true, nil)
	if got := s.Order(weightedCands(1, 4), false, nil)[0]; got != 1 {
		t.Errorf("after set change, advance=false first = %d, want 1", got)
	}
	if got := s.Order(weightedCands(1, 4), true, nil)[0]; got != 1 {
		t.Errorf("after set change, first = %d, want 1", got)
	}
}

func TestRandomSpread(t *testing.T) {
	s := mustStrategy(t, StrategyRandom)
	cands := stratCands(2, 0, 1, 0)
	const calls = 10000
	counts := map[int]int{}
	for range calls {
		got := s.Order(cands, true, nil)
		counts[got[0]]++
		// The rest follow in priority order (1, 3, 2, 0) without the first.
		rest := slices.DeleteFunc([]int{1, 3, 2, 0}, func(i int) bool { return i == got[0] })
		if !slices.Equal(got[1:], rest) {
			t.Fatalf("Order = %v, want %d then %v", got, got[0], rest)
		}
	}
	want := calls / len(cands)
	for i := range cands {
		if c := counts[i]; c < want*85/100 || c > want*115/100 {
			t.Errorf("provider %d first %d times, want %d ±15%% (%v)", i, c, want, counts)
		}
	}
}

func TestStrategyConcurrentOrder(t *testing.T) {
	for _, name := range []string{StrategyPriority, StrategyRoundRobin, StrategyLeastConn, StrategyWeighted, StrategyRandom, StrategyLatency} {
		t.Run(name, func(t *testing.T) {
			s := mustStrategy(t, name)
			sets := [][]Candidate{weightedCands(3, 1), weightedCands(1, 2, 3), weightedCands(4)}
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var dst []int
					for i := range 500 {
						cands := sets[(g+i/50)%len(sets)]
						dst = s.Order(cands, (g+i)%3 != 0, dst[:0])
						if len(dst) != len(cands) {
							t.Errorf("Order = %v", dst)
							return
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}

func TestWeightedConcurrentExact(t *testing.T) {
	s := mustStrategy(t, StrategyWeighted)
	cands := weightedCands(3, 1)
	var mu sync.Mutex
	counts := map[int]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := map[int]int{}
			for range 500 {
				local[s.Order(cands, true, nil)[0]]++
				s.Order(cands, false, nil)
			}
			mu.Lock()
			for k, v := range local {
				counts[k] += v
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if counts[0] != 3000 || counts[1] != 1000 {
		t.Errorf("first picks = %v, want 3000/1000", counts)
	}
}

func TestCheapestOrder(t *testing.T) {
	s, err := NewStrategy(StrategyCheapest)
	if err != nil {
		t.Fatal(err)
	}
	cands := []Candidate{
		{Index: 0, Priority: 1, Cost: 1.0},
		{Index: 1, Priority: 3, Cost: 0.2},
		{Index: 2, Priority: 2, Cost: 0.2 * (1 + 1e-12)}, // a tie with 1: priority decides
		{Index: 3, Priority: 9, Cost: 0},                 // no cost: free
		{Index: 4, Priority: 1, Cost: 0.3},
	}
	if got := s.Order(cands, true, nil); fmt.Sprint(got) != "[3 2 1 4 0]" {
		t.Fatalf("order %v", got)
	}
}
