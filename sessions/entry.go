package sessions

import (
	"math"
	"time"

	"go.uber.org/zap"
)

// log writes the session's end entry: what every session says (its ID,
// provider, the client's attempts and wait, its duration, bytes, why it
// ended and what it cost), then what the client's way adds (entry.Fields)
// and what its body adds (Fielder).
func (s *Session) log(body Body, entry Entry, reason string, d time.Duration, cost float64) {
	fields := make([]zap.Field, 0, 12+len(entry.Fields))
	fields = append(fields,
		zap.String("session_id", entry.ID),
		zap.String("provider", entry.Provider),
	)
	if entry.Attempts != nil {
		fields = append(fields, zap.Array("attempts", entry.Attempts))
	}
	fields = append(fields,
		zap.Float64("queue_wait_ms", RoundMS(entry.Waited)),
		zap.Float64("duration_ms", RoundMS(d)),
		zap.Int64("bytes_up", body.BytesUp()),
		zap.Int64("bytes_down", body.BytesDown()),
		zap.String("close_reason", reason),
		zap.Float64("cost", RoundCost(cost)),
	)
	fields = append(fields, entry.Fields...)
	if f, ok := body.(Fielder); ok {
		fields = append(fields, f.EndFields()...)
	}
	s.deps.Logger.Info("session ended", fields...)
}

// RoundMS is d in milliseconds, to a tenth.
func RoundMS(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Millisecond)*10) / 10
}

// RoundCost rounds a cost to 1e-9 of a unit, so a log or a status shows
// 0.3 rather than 0.30000000000000004.
func RoundCost(v float64) float64 { return math.Round(v*1e9) / 1e9 }
