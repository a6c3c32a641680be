package status

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/pool"
)

// Gauges is the metrics' view of the registry reg, read at scrape time
// like the status: live sessions and health per provider, the clients
// waiting, client_limit's keys, the session API books, parked sessions.
func Gauges(reg *pool.Registry) prometheus.Collector { return gauges{reg} }

type gauges struct{ reg *pool.Registry }

func gaugeDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(observe.Namespace, observe.Subsystem, name), help, labels, nil)
}

var (
	activeDesc  = gaugeDesc("active_sessions", "Live relayed sessions, by provider.", "provider")
	healthyDesc = gaugeDesc("provider_healthy",
		"1 when the provider may be tried, 0 during a cooldown, a 408/429 skip or a trial.", "provider")
	overLimitDesc = gaugeDesc("shared_over_limit",
		"Live sessions above max_concurrent over every node (state redis), by provider; 0 within the limit. Above 0 only after a node was cut off from Redis longer than lease_ttl; no session is admitted until it is 0 again. Absent while this node has no recent count.", "provider")
	waitingDesc        = gaugeDesc("queue_waiting", "Clients waiting in a handler's wait queue, by handler (its providers blocks' and providers' names).", "handler")
	handlerActiveDesc  = gaugeDesc("sessions_active", "Live sessions on a handler's providers (found ones leaving included; warm sessions no client holds are not), by handler.", "handler")
	capacityDesc       = gaugeDesc("capacity", "The sum of the limits of a handler's providers that take clients (not drained, leaving or cooling down; a provider without a limit adds nothing), by handler.", "handler")
	clientKeysDesc     = gaugeDesc("client_keys_active", "client_limit key values holding live sessions.")
	clientSessionsDesc = gaugeDesc("client_sessions_active", "Live sessions counted under client_limit, over every key.")
	clientWaitingDesc  = gaugeDesc("client_limit_waiting", "Clients waiting because their key is at its client_limit.")
	orphansDesc        = gaugeDesc("session_orphans_total",
		"Provider sessions a 2xx create answer may have made that cannot be released, their ID unreadable (none at session_id, not JSON, over the read limit, cut short) or refused (a dot segment, a control byte, over 1 KiB) where the release URL holds it in its path, by provider.", "provider")
	sessionsCreatedDesc  = gaugeDesc("sessions_created_total", "Provider sessions created over a session API, by provider.", "provider")
	sessionsReleasedDesc = gaugeDesc("sessions_released_total", "Provider sessions released over a session API, by provider.", "provider")
	releaseFailuresDesc  = gaugeDesc("session_release_failures_total", "Release calls that failed (each retry counts), by provider.", "provider")
	unreleasedDesc       = gaugeDesc("sessions_unreleased", "Provider sessions created and not released yet, by provider.", "provider")
	sessionsReapedDesc   = gaugeDesc("sessions_reaped_total", "Provider sessions a gone process left behind (found in the ledger) that this process released, by provider.", "provider")
	ledgerPendingDesc    = gaugeDesc("ledger_pending", "Ledger entries not confirmed released (live sessions included), by provider.", "provider")
	warmDesc             = gaugeDesc("warm_sessions", "Warm sessions (opened ahead of demand) ready for a client, by provider.", "provider")
	parkedDesc           = gaugeDesc("parked_sessions",
		"Sessions ended by their client that may still be resumed; held: those whose provider connection is kept open.", "held")
)

func (gauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{activeDesc, healthyDesc, overLimitDesc, waitingDesc, handlerActiveDesc, capacityDesc, clientKeysDesc,
		clientSessionsDesc, clientWaitingDesc, orphansDesc, sessionsCreatedDesc, sessionsReleasedDesc,
		releaseFailuresDesc, unreleasedDesc, sessionsReapedDesc, ledgerPendingDesc, parkedDesc, warmDesc} {
		ch <- d
	}
}

func (g gauges) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v int, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for _, p := range g.reg.All() {
		gauge(activeDesc, int(p.Slots.Active()), p.Name())
		healthy := 0
		if p.Health.Available() {
			healthy = 1
		}
		gauge(healthyDesc, healthy, p.Name())
		if ready, target := p.Warm(); target > 0 || ready > 0 {
			gauge(warmDesc, int(ready), p.Name())
		}
		if v := p.Cluster(); v != nil {
			if live, ok := v.ClusterActive(p.Name()); ok {
				gauge(overLimitDesc, cluster.OverLimit(live, p.Slots.MaxConcurrent()), p.Name())
			}
		}
	}
	for _, q := range g.reg.Queues.Counts() {
		sc := ScalingOf(q)
		gauge(waitingDesc, sc.Waiting, q.Handler)
		gauge(handlerActiveDesc, int(sc.Active), q.Handler)
		gauge(capacityDesc, int(sc.Capacity), q.Handler)
	}
	keys, live, keyWaiting := 0, 0, 0
	for _, k := range g.reg.Quotas.Counts() {
		if k.Active > 0 {
			keys++
		}
		live += k.Active
		keyWaiting += k.Waiting
	}
	gauge(clientKeysDesc, keys)
	gauge(clientSessionsDesc, live)
	gauge(clientWaitingDesc, keyWaiting)
	names, books := g.reg.Books.All()
	for i, n := range names {
		b := books[i]
		counter(orphansDesc, b.Orphans.Load(), n)
		counter(sessionsCreatedDesc, b.Created.Load(), n)
		counter(sessionsReleasedDesc, b.Released.Load(), n)
		counter(releaseFailuresDesc, b.ReleaseFailures.Load(), n)
		gauge(unreleasedDesc, int(b.Unreleased()), n)
		counter(sessionsReapedDesc, b.Reaped.Load(), n)
		if pending, ok := g.reg.Ledger.Pending(n); ok {
			gauge(ledgerPendingDesc, pending, n)
		}
	}
	all, held := g.reg.Parked.Count()
	gauge(parkedDesc, all-held, "false")
	gauge(parkedDesc, held, "true")
}
