package observe

import (
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// The metrics are process-wide, like the pool: counters keep counting across
// config reloads, and every new config load's registry (Caddy makes one per
// load and serves it on the admin /metrics endpoint) gets the same
// collectors registered once. Labels hold provider names and fixed words
// only.
const (
	namespace = "caddy"
	subsystem = "browser_failover"
)

var (
	attempts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: subsystem,
		Name: "attempts_total",
		Help: "Connection attempts to providers, by provider and outcome word.",
	}, []string{"provider", "outcome"})

	failovers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: subsystem,
		Name: "failovers_total",
		Help: "Failovers: a client's attempt failed (failure, 408/429, 428) and its next attempt went straight to another provider, by the provider that failed.",
	}, []string{"provider"})

	rejections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: subsystem,
		Name: "rejections_total",
		Help: "Clients that got no session, by reason: queue_full, queue_timeout, no_provider, relayed (a provider's 4xx passed on).",
	}, []string{"reason"})

	queueWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace, Subsystem: subsystem,
		Name:    "queue_wait_seconds",
		Help:    "Time clients spent in a wait queue.",
		Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120},
	})

	handshake = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Subsystem: subsystem,
		Name:    "handshake_seconds",
		Help:    "Duration of successful upstream handshakes (TCP, TLS, discovery and upgrade), by provider.",
		Buckets: prometheus.DefBuckets,
	}, []string{"provider"})

	sessionDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Subsystem: subsystem,
		Name:    "session_seconds",
		Help:    "Duration of relayed sessions, by provider.",
		Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400},
	}, []string{"provider"})

	hedgesStarted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: subsystem, Name: "hedges_started_total",
		Help: "Hedged attempts started beside a slower one (hedge_after), by the provider they went to.",
	}, []string{"provider"})
	hedgesWon = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: subsystem, Name: "hedges_won_total",
		Help: "Hedged attempts whose 101 came first, by provider.",
	}, []string{"provider"})
	hedgesWasted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: subsystem, Name: "hedges_wasted_total",
		Help: "Attempts given up because another provider answered 101 first (cancelled, or closed with 1000 \"hedge lost\"), by provider.",
	}, []string{"provider"})
	sharedErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: subsystem, Name: "shared_state_errors_total",
		Help: "Calls to the shared state that failed, by operation.",
	}, []string{"op"})
	eventDrops = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: subsystem,
		Name: "event_drops_total",
		Help: "Events dropped because a queue was full, by sink: events_app or webhook.",
	}, []string{"sink"})

	probes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: subsystem,
		Name: "probes_total",
		Help: "Active health check probes, by provider and outcome word (ok, refused, timeout, status_<code> …).",
	}, []string{"provider", "outcome"})

	webhookDeliveries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: subsystem,
		Name: "webhook_deliveries_total",
		Help: "Webhook deliveries by result: ok, or failed after every retry.",
	}, []string{"result"})
)

// poolCollector reads the registry at scrape time: live sessions and
// health per provider, and the clients waiting in every queue.
type poolCollector struct{ reg *pool.Registry }

var (
	activeDesc = prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, "active_sessions"),
		"Live relayed sessions, by provider.", []string{"provider"}, nil)
	healthyDesc = prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, "provider_healthy"),
		"1 when the provider may be tried, 0 during a cooldown, a 408/429 skip or a trial.", []string{"provider"}, nil)
	sharedUpDesc = prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, "shared_state_up"),
		"1 while the shared state (state redis) answers, 0 after a call failed; absent without state.", nil, nil)
	overLimitDesc = prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, "shared_over_limit"),
		"Live sessions above max_concurrent over every node (state redis), by provider; 0 within the limit. Above 0 only after a node was cut off from Redis longer than lease_ttl; no session is admitted until it is 0 again. Absent while this node has no recent count.", []string{"provider"}, nil)
	waitingDesc = prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, "queue_waiting"),
		"Clients waiting in the wait queues of every handler.", nil, nil)
	clientKeysDesc = prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, "client_keys_active"),
		"client_limit key values holding live sessions.", nil, nil)
	clientSessionsDesc = prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, "client_sessions_active"),
		"Live sessions counted under client_limit, over every key.", nil, nil)
	clientWaitingDesc = prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, "client_limit_waiting"),
		"Clients waiting because their key is at its client_limit.", nil, nil)
)

func (poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- activeDesc
	ch <- healthyDesc
	ch <- waitingDesc
	ch <- sharedUpDesc
	ch <- overLimitDesc
	ch <- clientKeysDesc
	ch <- clientSessionsDesc
	ch <- clientWaitingDesc
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.reg.All() {
		ch <- prometheus.MustNewConstMetric(activeDesc, prometheus.GaugeValue, float64(p.Active()), p.Name())
		healthy := 0.0
		if p.Health.Available() {
			healthy = 1
		}
		ch <- prometheus.MustNewConstMetric(healthyDesc, prometheus.GaugeValue, healthy, p.Name())
		if v := p.Cluster(); v != nil {
			if live, ok := v.ClusterActive(p.Name()); ok {
				over := float64(cluster.OverLimit(live, p.MaxConcurrent()))
				ch <- prometheus.MustNewConstMetric(overLimitDesc, prometheus.GaugeValue, over, p.Name())
			}
		}
	}
	waiting := 0
	for _, q := range c.reg.Queues() {
		waiting += q.Waiting
	}
	ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(waiting))
	keys, live, keyWaiting := 0, 0, 0
	for _, k := range c.reg.Clients() {
		if k.Active > 0 {
			keys++
		}
		live += k.Active
		keyWaiting += k.Waiting
	}
	ch <- prometheus.MustNewConstMetric(clientKeysDesc, prometheus.GaugeValue, float64(keys))
	ch <- prometheus.MustNewConstMetric(clientSessionsDesc, prometheus.GaugeValue, float64(live))
	ch <- prometheus.MustNewConstMetric(clientWaitingDesc, prometheus.GaugeValue, float64(keyWaiting))
	if sharedStores.Load() > 0 {
		up := 0.0
		if sharedUp.Load() {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(sharedUpDesc, prometheus.GaugeValue, up)
	}
}

// orphanCollector reads the registry's session API books at scrape time:
// the provider sessions a create answer may have made that nobody can
// release.
type orphanCollector struct{ reg *pool.Registry }

var orphansDesc = prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, "session_orphans_total"),
	"Provider sessions a 2xx create answer may have made that cannot be released, their ID unreadable (none at session_id, not JSON, over the read limit, cut short), by provider.",
	[]string{"provider"}, nil)

func (orphanCollector) Describe(ch chan<- *prometheus.Desc) { ch <- orphansDesc }

func (c orphanCollector) Collect(ch chan<- prometheus.Metric) {
	names, books := c.reg.AllBooks()
	for i, n := range names {
		ch <- prometheus.MustNewConstMetric(orphansDesc, prometheus.CounterValue, float64(books[i].Orphans.Load()), n)
	}
}

// counters are the process's counters and histograms.
var counters = []prometheus.Collector{
	attempts, failovers, rejections, queueWait, handshake, sessionDuration,
	eventDrops, webhookDeliveries, hedgesStarted, hedgesWon, hedgesWasted, sharedErrors, probes, resumes,
}

// Register adds the counters, and the gauges read from the gateway's
// registry reg at scrape time, to prom (a config load's metrics registry,
// ctx.GetMetricsRegistry()). Registering again with the same metrics
// registry, as every handler of one config does, is not an error.
func Register(prom *prometheus.Registry, reg *pool.Registry) error {
	if prom == nil {
		return nil
	}
	collectors := append(counters[:len(counters):len(counters)],
		poolCollector{reg}, orphanCollector{reg}, sessionAPICollector{reg}, parkedCollector{reg})
	for _, c := range collectors {
		if err := prom.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				continue
			}
			return err
		}
	}
	return nil
}

// Attempt counts one attempt at provider: its outcome and the handshake
// time of a success.
func Attempt(provider string, o upstreams.Outcome) {
	attempts.WithLabelValues(provider, OutcomeLabel(o.Word)).Inc()
	if o.Kind == upstreams.Success {
		handshake.WithLabelValues(provider).Observe(o.Elapsed.Seconds())
	}
}

// Failover counts a failover from provider: its attempt failed and the
// same client's next attempt, right after it, went to another provider.
func Failover(provider string) {
	failovers.WithLabelValues(provider).Inc()
}

// Probe counts one active health check probe of provider and its outcome
// word.
func Probe(provider, outcome string) {
	probes.WithLabelValues(provider, OutcomeLabel(outcome)).Inc()
}

// ProbeCounter is Probe for one provider, with the counter of passing
// probes (the usual outcome) looked up once.
func ProbeCounter(provider string) func(outcome string) {
	ok := probes.WithLabelValues(provider, upstreams.WordOK)
	return func(outcome string) {
		if outcome == upstreams.WordOK {
			ok.Inc()
			return
		}
		Probe(provider, outcome)
	}
}

// HedgeStarted counts a hedged attempt started at provider.
func HedgeStarted(provider string) { hedgesStarted.WithLabelValues(provider).Inc() }

// HedgeWon counts a hedged attempt at provider that won its race.
func HedgeWon(provider string) { hedgesWon.WithLabelValues(provider).Inc() }

// HedgeWasted counts an attempt at provider given up for another's 101.
func HedgeWasted(provider string) { hedgesWasted.WithLabelValues(provider).Inc() }

// The shared state's gauge: shown only while some handler uses a store.
var (
	sharedStores atomic.Int64
	sharedUp     atomic.Bool
)

// SharedStateOpened and SharedStateClosed count the open shared-state
// stores; shared_state_up is shown while there is one.
func SharedStateOpened() { sharedStores.Add(1) }

// SharedStateClosed undoes SharedStateOpened.
func SharedStateClosed() { sharedStores.Add(-1) }

// SharedStateUp records whether the shared state answered its last call.
func SharedStateUp(up bool) { sharedUp.Store(up) }

// SharedStateError counts a failed call to the shared state; op is a fixed
// word (acquire, publish, status, ping, reset).
func SharedStateError(op string) { sharedErrors.WithLabelValues(op).Inc() }

// QueueWait measures one client's time in a wait queue.
func QueueWait(d time.Duration) {
	queueWait.Observe(d.Seconds())
}

// SessionEnded measures a relayed session that ended.
func SessionEnded(provider string, d time.Duration) {
	sessionDuration.WithLabelValues(provider).Observe(d.Seconds())
}

// outcomeWords are the outcome words used as labels as they are.
var outcomeWords = map[string]bool{
	upstreams.WordOK: true, upstreams.WordRefused: true, upstreams.WordTimeout: true,
	upstreams.WordDNS: true, upstreams.WordTLS: true, upstreams.WordReset: true,
	upstreams.WordBadHandshake: true, upstreams.WordBadDiscovery: true,
	upstreams.WordClientGone: true, upstreams.WordBadConnectURL: true,
}

// statusCodes are the answer statuses kept exact in labels: the ones the
// failover chain treats specially (401, 403, 408, 428, 429), the common 404
// and the usual 5xx. Others become status_4xx, status_5xx or status_other
// so the label set stays small.
var statusCodes = map[int]bool{401: true, 403: true, 404: true, 408: true, 428: true, 429: true,
	500: true, 501: true, 502: true, 503: true, 504: true}

// OutcomeLabel maps an outcome word to its metric label: a fixed word,
// status_<code> for the common codes, status_4xx / status_5xx /
// status_other for the rest, and "other" for anything unknown.
func OutcomeLabel(word string) string {
	if outcomeWords[word] {
		return word
	}
	if rest, ok := strings.CutPrefix(word, "status_"); ok {
		code, err := strconv.Atoi(rest)
		switch {
		case err != nil:
		case statusCodes[code]:
			return word
		case code >= 400 && code < 500:
			return "status_4xx"
		case code >= 500 && code < 600:
			return "status_5xx"
		}
		return "status_other"
	}
	return "other"
}

// Rejection reasons (metric label and event reason).
const (
	ReasonQueueFull    = "queue_full"
	ReasonQueueTimeout = "queue_timeout"
	ReasonNoProvider   = "no_provider"
	ReasonRelayed      = "relayed"
	ReasonUnservable   = "unservable"
	ReasonClientLimit  = "client_limit"
	// ReasonResume: a resume that could not be served (410, 409).
	ReasonResume = "resume"
	// ReasonOrigin: an upgrade a web page opened from an origin that
	// allowed_origins does not name (403).
	ReasonOrigin = "origin"
	// ReasonShutdown: the process is exiting (503).
	ReasonShutdown = "shutdown"
	reasonOther    = "other"
)

// ReasonWord maps why a client was rejected, as the handler words it in its
// logs ("queue full", "queue timeout", "no provider available") or already
// as a reason word, to a fixed reason word.
func ReasonWord(why string) string {
	switch why {
	case "queue full", ReasonQueueFull:
		return ReasonQueueFull
	case "queue timeout", ReasonQueueTimeout:
		return ReasonQueueTimeout
	case "no provider available", ReasonNoProvider:
		return ReasonNoProvider
	case ReasonRelayed, ReasonUnservable, ReasonClientLimit, ReasonOrigin, ReasonShutdown:
		return why
	}
	if strings.HasPrefix(why, ReasonResume) {
		return ReasonResume
	}
	return reasonOther
}

// Interface guards.
var (
	_ prometheus.Collector = poolCollector{}
	_ prometheus.Collector = orphanCollector{}
)
