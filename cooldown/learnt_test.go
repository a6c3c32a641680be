package cooldown

import (
	"testing"
	"time"
)

func TestLearntCap(t *testing.T) {
	clk := &fakeClock{}
	l := NewLearntCap(30*time.Second, clk.Now)
	if l.Cap() != 0 {
		t.Fatal("a cap before any refusal")
	}
	// A refusal with nothing live teaches nothing.
	if l.Refused(0) || l.Cap() != 0 {
		t.Fatal("learnt from a refusal at 0 live")
	}
	// A 429 while 18 are live: the cap is 18.
	if !l.NextRise().IsZero() {
		t.Fatal("a rise time before any cap")
	}
	if !l.Refused(18) || l.Cap() != 18 {
		t.Fatalf("cap %d, want 18", l.Cap())
	}
	if !l.NextRise().Equal(clk.Now().Add(30 * time.Second)) {
		t.Fatalf("next rise %v, want one interval after the refusal", l.NextRise())
	}
	// Quiet without reaching the cap: no rise.
	clk.advance(time.Minute)
	l.Reached(17)
	if l.Cap() != 18 {
		t.Fatalf("rose without being reached: %d", l.Cap())
	}
	// Reached, and the interval counted from the refusal has passed: +1.
	l.Reached(18)
	if l.Cap() != 19 {
		t.Fatalf("cap %d, want 19", l.Cap())
	}
	// At most one rise per interval, counted from the rise.
	l.Reached(19)
	clk.advance(29 * time.Second)
	if l.Cap() != 19 {
		t.Fatalf("rose twice in one interval: %d", l.Cap())
	}
	clk.advance(time.Second)
	if l.Cap() != 20 {
		t.Fatalf("cap %d, want 20", l.Cap())
	}
	// A new 429 sets it back to the live count, and restarts the interval.
	l.Refused(16)
	l.Reached(16)
	clk.advance(29 * time.Second)
	if l.Cap() != 16 {
		t.Fatalf("cap %d, want 16", l.Cap())
	}
	clk.advance(time.Second)
	if l.Cap() != 17 || l.Learnt() != 17 {
		t.Fatalf("cap %d, want 17", l.Cap())
	}
	// Another node's cap is adopted with its time.
	l.Adopt(12, clk.Now())
	l.Reached(12)
	if l.Cap() != 12 {
		t.Fatalf("adopted %d", l.Cap())
	}
	clk.advance(30 * time.Second)
	if l.Cap() != 13 {
		t.Fatalf("after the adopted cap's interval: %d", l.Cap())
	}
}
