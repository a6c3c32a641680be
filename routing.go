package browserfailover

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/queue"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Who may go where (SPEC 11): protocol-aware pools and per-client quotas.

// serves tells whether m can ever serve this client.
func (c *connect) serves(m *member) bool {
	return upstreams.Serves(m.proto, m.pwVersion, c.proto, c.pwVersion)
}

// fit keeps, in order, the providers that can serve the client, those that
// declare the client's exact Playwright version first.
func (c *connect) fit(order []int) []int {
	h := c.h
	if !h.routed {
		return order
	}
	c.later = c.later[:0]
	out := order[:0]
	for _, i := range order {
		m := h.members[i]
		switch {
		case !c.serves(m):
		case upstreams.Prefers(m.proto, m.pwVersion, c.proto, c.pwVersion):
			out = append(out, i)
		default:
			c.later = append(c.later, i)
		}
	}
	return append(out, c.later...)
}

// anyServes tells whether some provider of the handler could ever serve the
// client.
func (c *connect) anyServes() bool {
	for _, m := range c.h.members {
		if c.serves(m) {
			return true
		}
	}
	return false
}

// clientKind names what the client speaks, for messages.
func (c *connect) clientKind() string {
	if c.proto != upstreams.ProtocolPlaywright {
		return "CDP"
	}
	if c.pwVersion == "" {
		return "Playwright"
	}
	return "Playwright " + c.pwVersion
}

// unservable answers 502 at once: no provider could ever serve the client.
func (c *connect) unservable(why string) {
	writeJSON(c.w, http.StatusBadGateway, map[string]string{"error": why}, nil)
	c.observeWait()
	c.h.obs.Rejected(http.StatusBadGateway, observe.ReasonUnservable, len(c.attempts))
	c.logRejected(http.StatusBadGateway, "", observe.ReasonUnservable)
}

// noProviderServes is the 502 message when no configured provider speaks
// the client's protocol.
func (c *connect) noProviderServes() string {
	kinds := make([]string, 0, len(c.h.members))
	for _, m := range c.h.members {
		k := string(m.proto)
		if m.pwVersion != "" {
			k += " " + m.pwVersion
		}
		kinds = append(kinds, m.up.Name+" ("+k+")")
	}
	return fmt.Sprintf("no provider here serves %s clients; providers: %s", c.clientKind(), strings.Join(kinds, ", "))
}

// quotaRetryAfter is the Retry-After of a 429 for client_limit: sessions
// are long and their end unknown, so a fixed, modest hint.
const quotaRetryAfter = 5

// keyQueue is a handler's wait line for one client key value: FIFO within
// the key, so a key at its limit never holds back other keys.
type keyQueue struct {
	q       *queue.Queue
	users   int
	unwatch func()
}

// keyQueue returns (creating) the handler's queue for k; doneKeyQueue must
// follow.
func (h *Handler) keyQueue(k pool.QuotaKey) *keyQueue {
	h.kmu.Lock()
	defer h.kmu.Unlock()
	kq := h.keyQueues[k.Value]
	if kq == nil {
		kq = &keyQueue{q: queue.New(h.queueSize, h.queueTimeout, queue.RealClock())}
		// Watching before anyone reads Gen: a session of k that ends
		// between a client's failed TakeQuota and its Join is not missed.
		kq.unwatch = pool.WatchQuota(k, kq.q)
		h.keyQueues[k.Value] = kq
	}
	kq.users++
	return kq
}

func (h *Handler) doneKeyQueue(k pool.QuotaKey, kq *keyQueue) {
	h.kmu.Lock()
	defer h.kmu.Unlock()
	if kq.users--; kq.users == 0 {
		delete(h.keyQueues, k.Value)
		kq.unwatch()
		kq.q.Close()
	}
}

// quotaGate takes one of the client key's client_limit sessions, waiting
// in the key's queue when it may. It reports false when the client got an
// answer (429) or went away.
func (c *connect) quotaGate() bool {
	h := c.h
	cl := h.ClientLimit
	k := pool.QuotaKey{Template: cl.Key}
	if c.replace != nil {
		k.Value = c.replace(cl.Key)
	}
	kq := h.keyQueue(k)
	defer h.doneKeyQueue(k, kq)
	gen := kq.q.Gen()
	if kq.q.Len() == 0 && pool.TakeQuota(k, cl.Limit) {
		c.quota = &k
		return true
	}
	w, err := kq.q.Join(gen)
	if err != nil {
		c.overLimit(cl.Limit)
		return false
	}
	pool.AddQuotaWaiting(k, 1)
	defer pool.AddQuotaWaiting(k, -1)
	ctx := c.r.Context()
	for {
		err := w.Wait(ctx, time.Time{})
		c.quotaWaited = time.Since(w.Joined())
		c.waited = c.quotaWaited
		switch {
		case err == nil:
		case errors.Is(err, queue.ErrTimeout), errors.Is(err, queue.ErrClosed):
			c.overLimit(cl.Limit)
			return false
		default:
			c.logGone()
			return false
		}
		if pool.TakeQuota(k, cl.Limit) {
			w.Leave()
			c.quota = &k
			c.deadline = w.Deadline()
			return true
		}
	}
}

// releaseQuota gives back the client's quota session, once.
func (c *connect) releaseQuota() {
	if c.quota != nil {
		pool.ReleaseQuota(*c.quota)
		c.quota = nil
	}
}

// overLimit answers 429: the client's key holds client_limit sessions.
func (c *connect) overLimit(limit int) {
	body := map[string]any{
		"error":         "client limit reached: this key already holds " + strconv.Itoa(limit) + " live sessions",
		"limit":         limit,
		"retry_after_s": quotaRetryAfter,
	}
	writeJSON(c.w, http.StatusTooManyRequests, body, func(hd http.Header) {
		hd.Set("Retry-After", strconv.Itoa(quotaRetryAfter))
	})
	c.observeWait()
	c.h.obs.Rejected(http.StatusTooManyRequests, observe.ReasonClientLimit, len(c.attempts))
	c.logRejected(http.StatusTooManyRequests, "", observe.ReasonClientLimit)
}

// quotaState is a handler's per-key wait lines.
type quotaState struct {
	kmu       sync.Mutex
	keyQueues map[string]*keyQueue
}
