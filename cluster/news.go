package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// News is what the nodes tell each other through the shared state: the
// events on the pub/sub channel (Subscribe, and whether this node hears
// them: Hearing), and the providers' shared cooldowns and skips, which
// are set, read and cleared here and announced as they change
// (cooldown.go).
type News struct {
	c       *conn
	watched *watchList // the providers whose holds a new subscription reads
	// onWanted is told that another node waits for a slot of a provider
	// (the spares of it are given back); set before the first call.
	onWanted func(provider string)

	// mu guards subs; a subscription is added under it only before
	// Close began (conn.closed), so close finds every one.
	mu    sync.Mutex
	subs  map[*subscription]struct{}
	subWG sync.WaitGroup
	// hearing counts the subscriptions up and caught up (Hearing).
	hearing atomic.Int32
	// encoded holds each provider's encoded news (of), by name.
	encoded sync.Map
}

func newNews(c *conn, watched *watchList) *News {
	return &News{c: c, watched: watched, subs: map[*subscription]struct{}{}}
}

// event encodes an event published by this node; d is how long a
// cooldown or skip lasts from now.
func (n *News) event(kind, provider string, d time.Duration, streak int) string {
	w := wireEvent{Kind: kind, Provider: provider, Node: n.c.node, ForMS: d.Milliseconds(), Streak: streak}
	b, _ := json.Marshal(w)
	return string(b)
}

// publish publishes w on the events channel now, within ctx; op names
// the call in its error, which wraps ErrUnavailable.
func (n *News) publish(ctx context.Context, op string, w wireEvent) error {
	c := n.c
	if c.closed.Load() {
		return c.fail(op, errClosed)
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	b, _ := json.Marshal(w)
	if err := c.rdb.Publish(ctx, c.channel(), string(b)).Err(); err != nil {
		return c.fail(op, err)
	}
	return nil
}

// providerNews are the events of a provider that carry nothing but its
// name and this node's: encoded once, not on every connect.
type providerNews struct{ released, wanted string }

// of returns provider's news, encoding them the first time.
func (n *News) of(provider string) providerNews {
	if v, ok := n.encoded.Load(provider); ok {
		return v.(providerNews)
	}
	pn := providerNews{released: n.event(EventReleased, provider, 0, 0), wanted: n.event(EventWanted, provider, 0, 0)}
	n.encoded.Store(provider, pn)
	return pn
}

// subscription is one Subscribe call.
type subscription struct {
	cancel  context.CancelFunc
	stopped atomic.Bool
}

func (sub *subscription) stop() {
	sub.stopped.Store(true)
	sub.cancel()
}

// Subscribe calls fn with every Event published by any node, this one
// included, through Redis pub/sub, in order, from one goroutine. It
// reconnects after an outage, with backoff; events published while
// disconnected are lost, so a consumer must not rely on them alone (for
// instance, also retry on a timer). cancel stops the subscription: fn is
// not called once cancel has returned, except for a call already running.
// cancel is idempotent and may be called from fn. Store.Close cancels
// every subscription.
func (n *News) Subscribe(fn func(Event)) (cancel func()) {
	ctx, stop := context.WithCancel(context.Background())
	sub := &subscription{cancel: stop}
	n.mu.Lock()
	if n.c.closed.Load() {
		n.mu.Unlock()
		stop()
		return func() {}
	}
	n.subs[sub] = struct{}{}
	n.subWG.Add(1)
	n.mu.Unlock()

	go func() {
		defer n.subWG.Done()
		n.subscribeLoop(ctx, sub, fn)
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			sub.stop()
			n.mu.Lock()
			delete(n.subs, sub)
			n.mu.Unlock()
		})
	}
}

// close cancels every subscription and waits for their goroutines.
func (n *News) close() {
	n.mu.Lock()
	subs := n.subs
	n.subs = map[*subscription]struct{}{}
	n.mu.Unlock()
	for sub := range subs {
		sub.stop()
	}
	n.subWG.Wait()
}

// Backoff between reconnections of a subscription.
const (
	minSubscribeBackoff = 100 * time.Millisecond
	maxSubscribeBackoff = 5 * time.Second
)

// subscribeLoop (re)subscribes until ctx ends.
func (n *News) subscribeLoop(ctx context.Context, sub *subscription, fn func(Event)) {
	backoff := minSubscribeBackoff
	failing := false
	for ctx.Err() == nil {
		ps := n.c.rdb.Subscribe(ctx, n.c.channel())
		subscribed, err := n.receive(ctx, ps, sub, fn)
		_ = ps.Close()
		if ctx.Err() != nil {
			return
		}
		if subscribed {
			// It worked, then broke: a new outage.
			backoff = minSubscribeBackoff
			failing = false
		}
		if !failing {
			n.c.log.Warn("shared state: event subscription lost; reconnecting",
				zap.Error(n.c.fail("receive events", err)))
			failing = true
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, maxSubscribeBackoff)
	}
}

// catchUp reads the shared cooldown and skip of every watched provider
// and gives those in force to fn as events (from no node), so that a news
// published before the subscription was up is not lost. It reports
// whether every one was read.
func (n *News) catchUp(ctx context.Context, sub *subscription, fn func(Event)) bool {
	for _, p := range n.watched.list() {
		h, err := n.Hold(ctx, p)
		if err != nil {
			n.c.log.Debug("shared state: holds not read after subscribing", zap.Error(err))
			return false
		}
		if sub.stopped.Load() {
			return false
		}
		if !h.CooldownUntil.IsZero() {
			fn(Event{Kind: EventCooldown, Provider: p, Until: h.CooldownUntil, Streak: h.Streak})
		}
		if !h.SkipUntil.IsZero() {
			fn(Event{Kind: EventSkip, Provider: p, Until: h.SkipUntil})
		}
	}
	return true
}

// Hearing reports whether this store hears the other nodes' news and
// Redis answers: a subscription is up, it read the holds in force when it
// came up, and no call failed since the last one that worked. While it
// does, a shared cooldown or skip reaches this node as news.
func (n *News) Hearing() bool { return n.hearing.Load() > 0 && !n.c.stale.Load() }

// receive delivers the messages of ps until an error. subscribed reports
// whether Redis confirmed the subscription.
func (n *News) receive(ctx context.Context, ps *redis.PubSub, sub *subscription, fn func(Event)) (subscribed bool, err error) {
	// Closing ps interrupts a blocked read when ctx ends.
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer stop()
	// Idle this long and the connection is pinged; idle twice and it is
	// taken for dead.
	idle := max(time.Duration(n.c.cfg.LeaseTTL)/3, time.Second)
	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(ctx, idle)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !pinged && ctx.Err() == nil {
				pctx, cancel := n.c.ctx(ctx)
				err = ps.Ping(pctx)
				cancel()
				if err != nil {
					return subscribed, err
				}
				pinged = true
				continue
			}
			return subscribed, err
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" && !subscribed {
				subscribed = true
				// What was published before this subscription heard
				// anything: the holds in force now.
				if n.catchUp(ctx, sub, fn) {
					n.hearing.Add(1)
					defer n.hearing.Add(-1)
				}
			}
		case *redis.Message:
			ev, ok := decodeEvent(m.Payload, n.c.now())
			if ok && ev.Kind == EventWanted && ev.Node != n.c.node && n.onWanted != nil {
				n.onWanted(ev.Provider)
			}
			if ok && !sub.stopped.Load() {
				fn(ev)
			}
		}
	}
}
