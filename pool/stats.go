package pool

import (
	"sync"
	"time"
)

// Stats are what status shows of a provider's recent attempts besides its
// health: the last failure, and the moving average of its handshake
// times. A Reset clears them.
type Stats struct {
	mu         sync.Mutex
	lastError  string
	latencyMS  float64
	hasLatency bool
}

// SetLastError records the last failure, already free of secrets.
func (s *Stats) SetLastError(e string) {
	s.mu.Lock()
	s.lastError = e
	s.mu.Unlock()
}

// LastError is the last failure recorded.
func (s *Stats) LastError() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastError
}

// latencyWeight is the weight of a new sample in the handshake-time moving
// average.
const latencyWeight = 0.3

// ObserveHandshake adds a successful handshake's duration to the moving
// average.
func (s *Stats) ObserveHandshake(d time.Duration) {
	ms := float64(d) / float64(time.Millisecond)
	s.mu.Lock()
	if !s.hasLatency {
		s.latencyMS, s.hasLatency = ms, true
	} else {
		s.latencyMS += latencyWeight * (ms - s.latencyMS)
	}
	s.mu.Unlock()
}

// HandshakeMS returns the moving average of handshake times and whether
// there is any sample.
func (s *Stats) HandshakeMS() (float64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.latencyMS, s.hasLatency
}

// clear forgets the last error and the handshake times (Reset).
func (s *Stats) clear() {
	s.mu.Lock()
	s.lastError = ""
	s.latencyMS, s.hasLatency = 0, false
	s.mu.Unlock()
}
