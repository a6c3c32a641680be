package observe

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Counts of provider sessions created and released over session APIs,
// read from the registry's books.
var (
	sessionsCreatedDesc = prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, "sessions_created_total"),
		"Provider sessions created over a session API, by provider.", []string{"provider"}, nil)
	sessionsReleasedDesc = prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, "sessions_released_total"),
		"Provider sessions released over a session API, by provider.", []string{"provider"}, nil)
	releaseFailuresDesc = prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, "session_release_failures_total"),
		"Release calls that failed (each retry counts), by provider.", []string{"provider"}, nil)
	unreleasedDesc = prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, "sessions_unreleased"),
		"Provider sessions created and not released yet, by provider.", []string{"provider"}, nil)
)

type sessionAPICollector struct{ reg *pool.Registry }

func (sessionAPICollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sessionsCreatedDesc
	ch <- sessionsReleasedDesc
	ch <- releaseFailuresDesc
	ch <- unreleasedDesc
}

func (c sessionAPICollector) Collect(ch chan<- prometheus.Metric) {
	names, books := c.reg.AllBooks()
	for i, n := range names {
		b := books[i]
		ch <- prometheus.MustNewConstMetric(sessionsCreatedDesc, prometheus.CounterValue, float64(b.Created.Load()), n)
		ch <- prometheus.MustNewConstMetric(sessionsReleasedDesc, prometheus.CounterValue, float64(b.Released.Load()), n)
		ch <- prometheus.MustNewConstMetric(releaseFailuresDesc, prometheus.CounterValue, float64(b.ReleaseFailures.Load()), n)
		ch <- prometheus.MustNewConstMetric(unreleasedDesc, prometheus.GaugeValue, float64(b.Unreleased()), n)
	}
}

func init() {
	outcomeWords[upstreams.WordCreateFailed] = true
	outcomeWords[upstreams.WordBadCreate] = true
}
