// Package observe owns what the gateway tells the outside world besides its
// logs: the Prometheus metrics it adds to Caddy's registry (metrics.go), the
// events it emits through Caddy's events app, and the webhooks a handler
// posts those events to (webhook.go). Nothing here ever runs on a client's
// path for long: metrics are counters, events and webhooks go through
// bounded queues drained by goroutines, and a full queue drops and counts.
package observe

import (
	"fmt"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"go.uber.org/zap"
)

// Event names, emitted through Caddy's events app and to webhooks.
const (
	EventCooldown  = "browser_failover.cooldown"
	EventRecovered = "browser_failover.recovered"
	EventRejected  = "browser_failover.rejected"
)

// EventNames lists the events, in a stable order.
var EventNames = []string{EventCooldown, EventRecovered, EventRejected}

// eventQueueSize bounds the events waiting for the events app.
const eventQueueSize = 1000

// event is one emitted event: its name, when, and its data (holding only
// provider names, fixed words, numbers and times).
type event struct {
	name string
	at   time.Time
	data map[string]any
}

// Observer emits one handler's events to Caddy's events app and its
// webhooks, and counts what it emits (and drops) in the registry's
// metrics. Its methods are safe for concurrent use and on a nil Observer
// (which does nothing).
type Observer struct {
	ctx     caddy.Context
	app     *caddyevents.App
	logger  *zap.Logger
	hooks   []*webhook
	metrics *Metrics

	mu     sync.Mutex
	closed bool
	queue  chan event
	stop   chan struct{}
	done   chan struct{}
}

// New makes the Observer of a handler being provisioned, counting in m:
// it finds the events app and starts the webhooks' senders (their URL and
// secret may hold placeholders such as {env.X}, resolved here). Close
// stops it.
func New(ctx caddy.Context, logger *zap.Logger, hooks []*WebhookConfig, m *Metrics) (*Observer, error) {
	o := &Observer{
		ctx:     ctx,
		logger:  logger,
		metrics: m,
		queue:   make(chan event, eventQueueSize),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	if ctx.Context != nil {
		// The http app loads the events app whether or not it is
		// configured; without one there is simply nobody listening.
		if app, err := ctx.App("events"); err == nil {
			o.app, _ = app.(*caddyevents.App)
		} else {
			logger.Debug("events app unavailable; events go to webhooks only", zap.Error(err))
		}
	}
	repl := caddy.NewReplacer()
	for i, hc := range hooks {
		if hc == nil {
			continue
		}
		wh, err := newWebhook(hc, repl, logger, m, defaultPacing())
		if err != nil {
			o.closeHooks()
			return nil, fmt.Errorf("webhook %d: %w", i+1, err)
		}
		o.hooks = append(o.hooks, wh)
	}
	for _, wh := range o.hooks {
		wh.start()
	}
	go o.run()
	return o, nil
}

// run hands queued events to the events app, whose handlers run
// synchronously and might be slow.
func (o *Observer) run() {
	defer close(o.done)
	for {
		select {
		case ev := <-o.queue:
			o.emit(ev)
		case <-o.stop:
			return
		}
	}
}

func (o *Observer) emit(ev event) {
	if o.app == nil || o.ctx.Err() != nil || !o.app.ShouldEmit(ev.name) {
		return
	}
	o.app.Emit(o.ctx, ev.name, ev.data)
}

// Close stops the events sender (waiting up to a second for an event being
// handed to the events app, so nothing reads the handler after its
// Cleanup) and lets each webhook sender deliver what it still holds for a
// short while; it does not wait for those.
func (o *Observer) Close() {
	if o == nil {
		return
	}
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return
	}
	o.closed = true
	o.mu.Unlock()
	close(o.stop)
	select {
	case <-o.done:
	case <-time.After(time.Second):
	}
	o.closeHooks()
}

func (o *Observer) closeHooks() {
	for _, wh := range o.hooks {
		wh.close()
	}
}

// publish queues ev for the events app and every webhook that wants it,
// without ever blocking.
func (o *Observer) publish(ev event) {
	if o == nil {
		return
	}
	o.mu.Lock()
	closed := o.closed
	o.mu.Unlock()
	if closed {
		return
	}
	if o.app != nil {
		select {
		case o.queue <- ev:
		default:
			o.metrics.eventDrops.WithLabelValues("events_app").Inc()
		}
	}
	var body []byte
	for _, wh := range o.hooks {
		if !wh.wants(ev.name) {
			continue
		}
		if body == nil {
			var err error
			if body, err = encodeEvent(ev); err != nil {
				o.logger.Error("encoding event", zap.String("event", ev.name), zap.Error(err))
				return
			}
		}
		wh.enqueue(delivery{event: ev.name, body: body})
	}
}

// Cooldown tells that provider is skipped until until: a failure cooldown,
// or a 408/429 skip. reason is the outcome word that caused it.
func (o *Observer) Cooldown(provider string, until time.Time, reason string) {
	o.publish(event{name: EventCooldown, at: time.Now(), data: map[string]any{
		"provider": provider,
		"until":    until.UTC().Format(time.RFC3339Nano),
		"reason":   reason,
	}})
}

// Recovered tells that provider is healthy again.
func (o *Observer) Recovered(provider string) {
	o.publish(event{name: EventRecovered, at: time.Now(), data: map[string]any{
		"provider": provider,
	}})
}

// Rejected counts a client that got no session and tells it: status is the
// answer's status, why the handler's reason (see ReasonWord), attempts the
// number of attempts and skips listed in the answer.
func (o *Observer) Rejected(status int, why string, attempts int) {
	if o == nil {
		return
	}
	reason := ReasonWord(why)
	o.metrics.rejections.WithLabelValues(reason).Inc()
	o.publish(event{name: EventRejected, at: time.Now(), data: map[string]any{
		"status":   status,
		"reason":   reason,
		"attempts": attempts,
	}})
}
