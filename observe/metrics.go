package observe

import (
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Namespace and Subsystem prefix every metric's name:
// caddy_browser_failover_….
const (
	Namespace = "caddy"
	Subsystem = "browser_failover"
)

// Metrics are the gateway's counters and histograms. The registry holds
// one value, so they keep counting across config reloads (the registry
// outlives them) and start from zero with a new registry: a test's own, or
// the process's once no config uses the gateway. Every config load's
// metrics registry (Caddy makes one per load and serves it on the admin
// /metrics endpoint) gets the same collectors. Labels hold provider names
// and fixed words only. Its methods are safe for concurrent use.
type Metrics struct {
	attempts          *prometheus.CounterVec
	failovers         *prometheus.CounterVec
	rejections        *prometheus.CounterVec
	queueWait         prometheus.Histogram
	handshake         *prometheus.HistogramVec
	sessionDuration   *prometheus.HistogramVec
	hedgesStarted     *prometheus.CounterVec
	hedgesWon         *prometheus.CounterVec
	hedgesWasted      *prometheus.CounterVec
	sharedErrors      *prometheus.CounterVec
	eventDrops        *prometheus.CounterVec
	probes            *prometheus.CounterVec
	webhookDeliveries *prometheus.CounterVec
	resumes           *prometheus.CounterVec
	spent             *prometheus.CounterVec
	webdriverCommands *prometheus.CounterVec
	warmHanded        *prometheus.CounterVec
	lookupFailures    *prometheus.CounterVec
	recFrames         *prometheus.CounterVec
	recBytes          *prometheus.CounterVec
	recDropped        *prometheus.CounterVec
	sharedFailovers   prometheus.Counter

	// The shared state's gauge: shown only while some handler uses a
	// store.
	sharedStores atomic.Int64
	sharedUp     atomic.Bool
}

func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: Subsystem, Name: name, Help: help}, labels)
}

// NewMetrics makes a registry's metrics, every count at zero.
func NewMetrics() *Metrics {
	return &Metrics{
		attempts:          counterVec("attempts_total", "Connection attempts to providers, by provider and outcome word.", "provider", "outcome"),
		webdriverCommands: counterVec("webdriver_commands_total", "WebDriver commands forwarded to providers (HTTP requests to a session), by provider.", "provider"),
		warmHanded:        counterVec("warm_handed_total", "Warm sessions (opened ahead of demand) handed to clients, by provider.", "provider"),
		lookupFailures:    counterVec("provider_lookup_failures_total", "Lookups of a providers block's source that failed or gave no address (the providers found before were kept), by providers block.", "providers"),
		recFrames:         counterVec("recording_frames_total", "Screencast frames of recorded sessions stored, by provider.", "provider"),
		recBytes:          counterVec("recording_bytes_total", "Bytes of the screencast frames of recorded sessions stored, by provider.", "provider"),
		recDropped:        counterVec("recording_dropped_total", "Screencast frames of recorded sessions dropped because the storage could not keep up, by provider.", "provider"),
		failovers:         counterVec("failovers_total", "Failovers: a client's attempt failed (failure, 408/429, 428) and its next attempt went straight to another provider, by the provider that failed.", "provider"),
		rejections:        counterVec("rejections_total", "Clients that got no session, by reason: queue_full, queue_timeout, no_provider, relayed (a provider's 4xx passed on), client_limit, client_budget, and the others the reference lists.", "reason"),
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: Subsystem,
			Name:    "queue_wait_seconds",
			Help:    "Time clients spent in a wait queue.",
			Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120},
		}),
		handshake: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: Subsystem,
			Name:    "handshake_seconds",
			Help:    "Duration of successful upstream handshakes (TCP, TLS, discovery and upgrade), by provider.",
			Buckets: prometheus.DefBuckets,
		}, []string{"provider"}),
		sessionDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: Subsystem,
			Name:    "session_seconds",
			Help:    "Duration of relayed sessions, by provider.",
			Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400},
		}, []string{"provider"}),
		hedgesStarted:     counterVec("hedges_started_total", "Hedged attempts started beside a slower one (hedge_after), by the provider they went to.", "provider"),
		hedgesWon:         counterVec("hedges_won_total", "Hedged attempts whose 101 came first, by provider.", "provider"),
		hedgesWasted:      counterVec("hedges_wasted_total", "Attempts given up because another provider answered 101 first (cancelled, or closed with 1000 \"hedge lost\"), by provider.", "provider"),
		sharedErrors:      counterVec("shared_state_errors_total", "Calls to the shared state that failed, by operation.", "op"),
		eventDrops:        counterVec("event_drops_total", "Events dropped because a queue was full, by sink: events_app or webhook.", "sink"),
		probes:            counterVec("probes_total", "Active health check probes, by provider and outcome word (ok, refused, timeout, status_<code> …).", "provider", "outcome"),
		webhookDeliveries: counterVec("webhook_deliveries_total", "Webhook deliveries by result: ok, or failed after every retry.", "result"),
		resumes:           counterVec("resumes_total", "Clients that asked to resume a session, by result: resumed, unknown, unavailable, refused, conflict, not_resumable.", "result"),
		sharedFailovers: prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Subsystem: Subsystem,
			Name: "shared_state_failovers_total", Help: "Changes of Redis master the shared state followed (a Sentinel promoting a replica), not counting the first discovery."}),
		spent: counterVec("spend_total", "What the sessions that ended here cost, in the units of the providers' cost option, by provider (hedge losers that created a session included).", "provider"),
	}
}

var sharedUpDesc = prometheus.NewDesc(prometheus.BuildFQName(Namespace, Subsystem, "shared_state_up"),
	"1 while the shared state (state redis) answers, 0 after a call failed; absent without state.", nil, nil)

// Describe and Collect make the metrics one collector: its counters, and
// the shared state's gauge while a store is open.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.counters() {
		c.Describe(ch)
	}
	ch <- sharedUpDesc
}

// Collect: see Describe.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.counters() {
		c.Collect(ch)
	}
	if m.sharedStores.Load() > 0 {
		up := 0.0
		if m.sharedUp.Load() {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(sharedUpDesc, prometheus.GaugeValue, up)
	}
}

func (m *Metrics) counters() []prometheus.Collector {
	return []prometheus.Collector{
		m.attempts, m.failovers, m.rejections, m.webdriverCommands, m.warmHanded, m.recFrames, m.recBytes, m.recDropped, m.queueWait, m.handshake, m.sessionDuration,
		m.eventDrops, m.webhookDeliveries, m.hedgesStarted, m.hedgesWon, m.hedgesWasted, m.sharedErrors, m.probes, m.resumes, m.spent,
		m.lookupFailures, m.sharedFailovers,
	}
}

// Register adds collectors (the registry's metrics, and the gauges read
// from the registry at scrape time) to prom, a config load's metrics
// registry (ctx.GetMetricsRegistry()). Registering again with the same
// metrics registry, as every handler of one config does, is not an error.
func Register(prom *prometheus.Registry, collectors ...prometheus.Collector) error {
	if prom == nil {
		return nil
	}
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
func (m *Metrics) Attempt(provider string, o upstreams.Outcome) {
	m.attempts.WithLabelValues(provider, OutcomeLabel(o.Word)).Inc()
	if o.Kind == upstreams.Success {
		m.handshake.WithLabelValues(provider).Observe(o.Elapsed.Seconds())
	}
}

// WarmHanded counts one warm session of provider handed to a client.
func (m *Metrics) WarmHanded(provider string) {
	if m == nil {
		return
	}
	m.warmHanded.WithLabelValues(provider).Inc()
}

// RecordingStored counts one frame of a session at provider stored, of
// n bytes.
func (m *Metrics) RecordingStored(provider string, n int) {
	m.recFrames.WithLabelValues(provider).Inc()
	m.recBytes.WithLabelValues(provider).Add(float64(n))
}

// RecordingDropped counts one frame of a session at provider dropped.
func (m *Metrics) RecordingDropped(provider string) { m.recDropped.WithLabelValues(provider).Inc() }

// WebDriverCommand counts one WebDriver command forwarded to provider.
func (m *Metrics) WebDriverCommand(provider string) {
	m.webdriverCommands.WithLabelValues(provider).Inc()
}

// Failover counts a failover from provider: its attempt failed and the
// same client's next attempt, right after it, went to another provider.
func (m *Metrics) Failover(provider string) {
	m.failovers.WithLabelValues(provider).Inc()
}

// Probe counts one active health check probe of provider and its outcome
// word.
func (m *Metrics) Probe(provider, outcome string) {
	m.probes.WithLabelValues(provider, OutcomeLabel(outcome)).Inc()
}

// ProbeCounter is Probe for one provider, with the counter of passing
// probes (the usual outcome) looked up once.
func (m *Metrics) ProbeCounter(provider string) func(outcome string) {
	ok := m.probes.WithLabelValues(provider, upstreams.WordOK)
	return func(outcome string) {
		if outcome == upstreams.WordOK {
			ok.Inc()
			return
		}
		m.Probe(provider, outcome)
	}
}

// HedgeStarted counts a hedged attempt started at provider.
func (m *Metrics) HedgeStarted(provider string) { m.hedgesStarted.WithLabelValues(provider).Inc() }

// HedgeWon counts a hedged attempt at provider that won its race.
func (m *Metrics) HedgeWon(provider string) { m.hedgesWon.WithLabelValues(provider).Inc() }

// HedgeWasted counts an attempt at provider given up for another's 101.
func (m *Metrics) HedgeWasted(provider string) { m.hedgesWasted.WithLabelValues(provider).Inc() }

// SharedStateOpened counts an open shared-state store; shared_state_up is
// shown while there is one.
func (m *Metrics) SharedStateOpened() { m.sharedStores.Add(1) }

// SharedStateClosed undoes SharedStateOpened.
func (m *Metrics) SharedStateClosed() { m.sharedStores.Add(-1) }

// SharedStateUp records whether the shared state answered its last call.
func (m *Metrics) SharedStateUp(up bool) { m.sharedUp.Store(up) }

// SharedStateFailover counts a change of master the shared state
// followed.
func (m *Metrics) SharedStateFailover() { m.sharedFailovers.Inc() }

// SharedStateError counts a failed call to the shared state; op is a fixed
// word (acquire, publish, status, ping, reset).
func (m *Metrics) SharedStateError(op string) { m.sharedErrors.WithLabelValues(op).Inc() }

// QueueWait measures one client's time in a wait queue.
func (m *Metrics) QueueWait(d time.Duration) {
	m.queueWait.Observe(d.Seconds())
}

// SessionEnded measures a relayed session that ended.
func (m *Metrics) SessionEnded(provider string, d time.Duration) {
	m.sessionDuration.WithLabelValues(provider).Observe(d.Seconds())
}

// Spent adds what a session cost to its provider's spend.
func (m *Metrics) Spent(provider string, cost float64) {
	if cost > 0 {
		m.spent.WithLabelValues(provider).Add(cost)
	}
}

// LookupFailed counts a failed lookup of the providers block called
// block.
func (m *Metrics) LookupFailed(block string) { m.lookupFailures.WithLabelValues(block).Inc() }

// Resume counts a resume request's result.
func (m *Metrics) Resume(result string) { m.resumes.WithLabelValues(result).Inc() }

// outcomeWords are the outcome words used as labels as they are.
var outcomeWords = map[string]bool{
	upstreams.WordOK: true, upstreams.WordRefused: true, upstreams.WordTimeout: true,
	upstreams.WordDNS: true, upstreams.WordTLS: true, upstreams.WordReset: true,
	upstreams.WordBadHandshake: true, upstreams.WordBadDiscovery: true,
	upstreams.WordClientGone: true, upstreams.WordBadConnectURL: true,
	upstreams.WordCreateFailed: true, upstreams.WordBadCreate: true,
	upstreams.WordBadSessionID: true, upstreams.WordNotCreated: true,
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
	// ReasonClientBudget: the client key's budget for its window is spent.
	ReasonClientBudget = "client_budget"
	// ReasonResume: a resume that could not be served (410, 409).
	ReasonResume = "resume"
	// ReasonOrigin: an upgrade a web page opened from an origin that
	// allowed_origins does not name (403).
	ReasonOrigin = "origin"
	// ReasonShutdown: the process is exiting (503).
	ReasonShutdown = "shutdown"
	// ReasonBadOptions: the client's session options could not be read
	// (400).
	ReasonBadOptions = "bad_options"
	// ReasonProfile: the client's profile could not be had: in use by
	// another session (409), not readable with the key (500), or its
	// lock not askable (503).
	ReasonProfile = "profile"
	reasonOther   = "other"
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
	case ReasonRelayed, ReasonUnservable, ReasonClientLimit, ReasonClientBudget, ReasonOrigin, ReasonShutdown, ReasonBadOptions, ReasonProfile:
		return why
	}
	if strings.HasPrefix(why, ReasonResume) {
		return ReasonResume
	}
	return reasonOther
}

// Interface guard.
var _ prometheus.Collector = (*Metrics)(nil)
