package observe

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// WebhookConfig is one webhook of a handler (JSON key "webhooks";
// Caddyfile `webhook <url> { events <names...>; secret <value> }`).
type WebhookConfig struct {
	// URL receives a POST with a JSON body for each event; http:// or
	// https://, may hold {env.X} placeholders. Its user info and query
	// are never logged.
	URL string `json:"url"`
	// Events to send: browser_failover.cooldown, browser_failover.recovered,
	// browser_failover.rejected (the part after "browser_failover." alone
	// is accepted too). Default: all of them.
	Events []string `json:"events,omitempty"`
	// Secret signs each delivery: header X-Browser-Failover-Signature is
	// "sha256=" and the hex HMAC-SHA256, keyed with it, of the delivery's
	// X-Browser-Failover-Timestamp, a dot and the body. May hold {env.X}
	// placeholders; one that resolves to nothing is an error, never an
	// unsigned delivery.
	Secret string `json:"secret,omitempty"`
}

// Webhook delivery headers.
const (
	// SignatureHeader carries a delivery's signature (see Sign).
	SignatureHeader = "X-Browser-Failover-Signature"
	// TimestampHeader carries the delivery's time in Unix seconds; the
	// signature covers it, so a receiver that rejects old timestamps
	// rejects replays.
	TimestampHeader = "X-Browser-Failover-Timestamp"
)

// EventName returns the full name of a known event given in full or
// without its "browser_failover." prefix, and whether it is known.
func EventName(name string) (string, bool) {
	full := name
	if !strings.HasPrefix(name, "browser_failover.") {
		full = "browser_failover." + name
	}
	for _, n := range EventNames {
		if n == full {
			return full, true
		}
	}
	return "", false
}

// Validate checks a webhook's form without resolving placeholders. Its
// messages never hold the URL.
func (c *WebhookConfig) Validate() error {
	if c == nil {
		return errors.New("empty webhook")
	}
	if c.URL == "" {
		return errors.New("webhook needs a URL")
	}
	scheme, _, ok := strings.Cut(c.URL, "://")
	if !ok {
		return errors.New("webhook URL must start with http:// or https://")
	}
	switch strings.ToLower(scheme) {
	case "http", "https":
	default:
		return fmt.Errorf("webhook URL scheme %q is not http or https", scheme)
	}
	if !strings.Contains(c.URL, "{") {
		if u, err := url.Parse(c.URL); err != nil || u.Host == "" {
			return errors.New("webhook URL is invalid")
		}
	}
	for _, e := range c.Events {
		if _, ok := EventName(e); !ok {
			return fmt.Errorf("webhook: unknown event %q (want %s)", e, strings.Join(EventNames, ", "))
		}
	}
	return nil
}

// pacing is how a webhook delivers: how many events it holds (when full,
// the oldest is dropped, and counted), the wait before each retry of a
// failed delivery, the bound of one POST, and how long a closed webhook
// keeps delivering what it still holds. Tests shorten it.
type pacing struct {
	queue   int
	backoff []time.Duration
	timeout time.Duration
	grace   time.Duration
}

func defaultPacing() pacing {
	return pacing{
		queue:   1000,
		backoff: []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second},
		timeout: 5 * time.Second,
		grace:   5 * time.Second,
	}
}

// delivery is one event body for one webhook.
type delivery struct {
	event string
	body  []byte
}

// webhook sends one handler's events to one URL, from its own goroutine.
type webhook struct {
	url    string
	shown  string // redacted, for logs
	secret []byte
	events map[string]bool // nil: all
	client *http.Client
	logger *zap.Logger
	now    func() time.Time // the deliveries' timestamps
	pace   pacing
	counts *Metrics

	queue     chan delivery
	stopping  chan struct{}
	ctx       context.Context
	cancel    context.CancelFunc
	closeOnce sync.Once
}

func newWebhook(c *WebhookConfig, repl *caddy.Replacer, logger *zap.Logger, m *Metrics, pace pacing) (*webhook, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	raw := repl.ReplaceKnown(c.URL, "")
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, errors.New("webhook URL is invalid once its placeholders are resolved")
	}
	secret := repl.ReplaceKnown(c.Secret, "")
	if c.Secret != "" && secret == "" {
		return nil, errors.New("webhook secret is empty once its placeholders are resolved (is the environment variable set?): deliveries would go out unsigned")
	}
	w := &webhook{
		url:    raw,
		shown:  upstreams.Redact(u),
		secret: []byte(secret),
		logger: logger,
		client: &http.Client{
			// A redirect is an answer, not something to follow with the
			// signature and body.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		queue:    make(chan delivery, pace.queue),
		stopping: make(chan struct{}),
		now:      time.Now,
		pace:     pace,
		counts:   m,
	}
	if len(c.Events) > 0 {
		w.events = map[string]bool{}
		for _, e := range c.Events {
			full, _ := EventName(e)
			w.events[full] = true
		}
	}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	return w, nil
}

func (w *webhook) wants(event string) bool {
	return w.events == nil || w.events[event]
}

func (w *webhook) start() { go w.run() }

// close stops taking events; what is queued is delivered for at most
// its pacing's grace.
func (w *webhook) close() {
	w.closeOnce.Do(func() {
		close(w.stopping)
		time.AfterFunc(w.pace.grace, w.cancel)
	})
}

// enqueue queues d without blocking, dropping the oldest event when full.
func (w *webhook) enqueue(d delivery) {
	for {
		select {
		case w.queue <- d:
			return
		default:
		}
		select {
		case <-w.queue:
			w.counts.eventDrops.WithLabelValues("webhook").Inc()
		default:
		}
	}
}

func (w *webhook) run() {
	defer w.cancel()
	for {
		select {
		case d := <-w.queue:
			w.deliver(d)
		case <-w.stopping:
			for {
				select {
				case d := <-w.queue:
					w.deliver(d)
				default:
					return
				}
			}
		}
	}
}

// deliver posts d, retrying with backoff on transport errors, 408, 429 and
// 5xx.
func (w *webhook) deliver(d delivery) {
	var cause error
	tries := 0
	for i := 0; i <= len(w.pace.backoff); i++ {
		if i > 0 {
			t := time.NewTimer(w.pace.backoff[i-1])
			select {
			case <-t.C:
			case <-w.ctx.Done():
				t.Stop()
			}
		}
		if w.ctx.Err() != nil {
			if cause == nil {
				cause = errors.New("webhook stopped")
			}
			break
		}
		tries++
		retry, err := w.post(d)
		if err == nil {
			w.counts.webhookDeliveries.WithLabelValues("ok").Inc()
			return
		}
		cause = err
		if !retry {
			break
		}
	}
	w.counts.webhookDeliveries.WithLabelValues("failed").Inc()
	w.logger.Warn("webhook delivery failed",
		zap.String("webhook", w.shown),
		zap.String("event", d.event),
		zap.Int("tries", tries),
		zap.String("cause", cause.Error()))
}

// post makes one delivery attempt. The error never holds the URL.
func (w *webhook) post(d delivery) (retry bool, err error) {
	ctx, cancel := context.WithTimeout(w.ctx, w.pace.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(d.body))
	if err != nil {
		return false, errors.New("cannot build the request")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "caddy-browser-failover")
	req.Header.Set("X-Browser-Failover-Event", d.event)
	ts := strconv.FormatInt(w.now().Unix(), 10)
	req.Header.Set(TimestampHeader, ts)
	if len(w.secret) > 0 {
		req.Header.Set(SignatureHeader, Sign(w.secret, ts, d.body))
	}
	resp, err := w.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return true, errors.New(err.Error())
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		return false, nil
	case code == http.StatusRequestTimeout, code == http.StatusTooManyRequests, code >= 500:
		return true, errors.New("answered " + strconv.Itoa(code))
	default:
		return false, errors.New("answered " + strconv.Itoa(code))
	}
}

// Sign returns the signature header value of a delivery sent at
// timestamp (Unix seconds, as in TimestampHeader): "sha256=" and the hex
// HMAC-SHA256, keyed with secret, of timestamp + "." + body.
func Sign(secret []byte, timestamp string, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(timestamp))
	m.Write([]byte{'.'})
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// envelope is a webhook body.
type envelope struct {
	Event string         `json:"event"`
	Time  string         `json:"time"`
	Data  map[string]any `json:"data"`
}

func encodeEvent(ev event) ([]byte, error) {
	return json.Marshal(envelope{Event: ev.name, Time: ev.at.UTC().Format(time.RFC3339Nano), Data: ev.data})
}

// Interface guards.
var _ caddy.Validator = (*WebhookConfig)(nil)
