package queue

import "time"

// Clock is the time source of a Queue; tests use a fake one.
//
// AfterFunc must not call f synchronously from within AfterFunc (the Queue
// may hold its lock while scheduling), and Timer.Stop must not wait for a
// running f.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine (or from a fake clock's
	// Advance) once d has elapsed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending call scheduled by Clock.AfterFunc.
type Timer interface {
	// Stop prevents the call from running; it reports whether it did so.
	Stop() bool
}

// RealClock returns a Clock backed by package time.
func RealClock() Clock { return realClock{} }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
