package observe

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/browserfailover/caddy-browser-failover/pool"
)

// Results of a resume, the label of resumes_total.
const (
	// ResumeOK: the client got its session back.
	ResumeOK = "resumed"
	// ResumeUnknown: no resumable session under that ID and key (never
	// parked, window over, already resumed, bound to another key).
	ResumeUnknown = "unknown"
	// ResumeUnavailable: the session's provider could not take it back
	// (drained, in cooldown, full, no longer configured).
	ResumeUnavailable = "unavailable"
	// ResumeRefused: the provider did not give the same browser back.
	ResumeRefused = "refused"
	// ResumeConflict: a held session the client cannot join (another
	// subprotocol, compression).
	ResumeConflict = "conflict"
	// ResumeNotResumable: a Playwright-protocol client, or a route
	// without resume.
	ResumeNotResumable = "not_resumable"
)

var (
	resumes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: subsystem, Name: "resumes_total",
		Help: "Clients that asked to resume a session, by result: resumed, unknown, unavailable, refused, conflict, not_resumable.",
	}, []string{"result"})
	parkedDesc = prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, "parked_sessions"),
		"Sessions ended by their client that may still be resumed; held: those whose provider connection is kept open.",
		[]string{"held"}, nil)
)

// Resume counts a resume request's result.
func Resume(result string) { resumes.WithLabelValues(result).Inc() }

type parkedCollector struct{ reg *pool.Registry }

func (parkedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- parkedDesc }

func (c parkedCollector) Collect(ch chan<- prometheus.Metric) {
	all, held := c.reg.ParkedCount()
	ch <- prometheus.MustNewConstMetric(parkedDesc, prometheus.GaugeValue, float64(all-held), "false")
	ch <- prometheus.MustNewConstMetric(parkedDesc, prometheus.GaugeValue, float64(held), "true")
}
