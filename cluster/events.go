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

// The kinds of Event.
const (
	// EventReleased: slots of the provider were freed (a lease released,
	// or dead leases dropped); a node waiting for room may try again.
	EventReleased = "released"
	// EventCooldown: a shared failure cooldown of the provider was set,
	// until Event.Until, with doubling count Event.Streak.
	EventCooldown = "cooldown"
	// EventSkip: a shared 408/429 skip of the provider was set, until
	// Event.Until: a skip on every node, with no trial after it.
	EventSkip = "skip"
	// EventRecovered: the provider's shared cooldown and skip were cleared.
	EventRecovered = "recovered"
	// EventResumed: the parked session named by Event.Session (the
	// caller's key of it, such as a keyed hash of its resume token) was
	// taken back (through the node that published it), or ended by an
	// operator: other nodes forget their own entry of it.
	EventResumed = "resumed"
	// EventWanted: a node found the provider full; nodes keeping spare
	// slots of it (see Lease.Release) give them back at once.
	EventWanted = "wanted"
)

// Event is a change of the shared state, as announced by a node.
type Event struct {
	// Kind is EventReleased, EventCooldown, EventSkip or EventRecovered.
	Kind string
	// Provider is the provider's name.
	Provider string
	// Until is the end of the cooldown or skip on the receiving node's
	// clock; zero for other kinds.
	Until time.Time
	// Streak is the cooldown's doubling count.
	Streak int
	// Node is the node that published the event.
	Node string
	// Session names the parked session of an EventResumed, as the
	// caller keyed it in ParkResume.
	Session string
}

// wireEvent is Event on the channel. A cooldown or skip travels as its
// length from the moment it was published, never as a time of the
// publishing node's clock: the receiver adds it to its own.
type wireEvent struct {
	Kind     string `json:"kind"`
	Provider string `json:"provider"`
	ForMS    int64  `json:"for_ms,omitempty"`
	Streak   int    `json:"streak,omitempty"`
	Node     string `json:"node"`
	Session  string `json:"session,omitempty"`
}

// event encodes an event published by this node; d is how long a
// cooldown or skip lasts from now.
func (s *Store) event(kind, provider string, d time.Duration, streak int) string {
	w := wireEvent{Kind: kind, Provider: provider, Node: s.node, ForMS: d.Milliseconds(), Streak: streak}
	b, _ := json.Marshal(w)
	return string(b)
}

// providerNews are the events of a provider that carry nothing but its
// name and this node's: encoded once, not on every connect.
type providerNews struct{ released, wanted string }

// newsOf returns provider's news, encoding them the first time.
func (s *Store) newsOf(provider string) providerNews {
	if v, ok := s.news.Load(provider); ok {
		return v.(providerNews)
	}
	n := providerNews{released: s.event(EventReleased, provider, 0, 0), wanted: s.event(EventWanted, provider, 0, 0)}
	s.news.Store(provider, n)
	return n
}

// decodeEvent parses a message of the channel received at now (this
// node's clock).
func decodeEvent(payload string, now time.Time) (Event, bool) {
	var w wireEvent
	if err := json.Unmarshal([]byte(payload), &w); err != nil || w.Kind == "" || w.Provider == "" {
		return Event{}, false
	}
	ev := Event{Kind: w.Kind, Provider: w.Provider, Node: w.Node, Streak: w.Streak, Session: w.Session}
	if w.ForMS > 0 {
		ev.Until = now.Add(time.Duration(w.ForMS) * time.Millisecond)
	}
	return ev, true
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
// cancel is idempotent and may be called from fn. Close cancels every
// subscription.
func (s *Store) Subscribe(fn func(Event)) (cancel func()) {
	ctx, stop := context.WithCancel(context.Background())
	sub := &subscription{cancel: stop}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		stop()
		return func() {}
	}
	s.subs[sub] = struct{}{}
	s.subWG.Add(1)
	s.mu.Unlock()

	go func() {
		defer s.subWG.Done()
		s.subscribeLoop(ctx, sub, fn)
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			sub.stop()
			s.mu.Lock()
			delete(s.subs, sub)
			s.mu.Unlock()
		})
	}
}

// Backoff between reconnections of a subscription.
const (
	minSubscribeBackoff = 100 * time.Millisecond
	maxSubscribeBackoff = 5 * time.Second
)

// subscribeLoop (re)subscribes until ctx ends.
func (s *Store) subscribeLoop(ctx context.Context, sub *subscription, fn func(Event)) {
	backoff := minSubscribeBackoff
	failing := false
	for ctx.Err() == nil {
		ps := s.rdb.Subscribe(ctx, s.channel())
		subscribed, err := s.receive(ctx, ps, sub, fn)
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
			s.log.Warn("shared state: event subscription lost; reconnecting",
				zap.Error(s.fail("receive events", err)))
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
func (s *Store) catchUp(ctx context.Context, sub *subscription, fn func(Event)) bool {
	s.mu.Lock()
	providers := make([]string, 0, len(s.watched))
	for p := range s.watched {
		providers = append(providers, p)
	}
	s.mu.Unlock()
	for _, p := range providers {
		h, err := s.Hold(ctx, p)
		if err != nil {
			s.log.Debug("shared state: holds not read after subscribing", zap.Error(err))
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
func (s *Store) Hearing() bool { return s.hearing.Load() > 0 && !s.stale.Load() }

// receive delivers the messages of ps until an error. subscribed reports
// whether Redis confirmed the subscription.
func (s *Store) receive(ctx context.Context, ps *redis.PubSub, sub *subscription, fn func(Event)) (subscribed bool, err error) {
	// Closing ps interrupts a blocked read when ctx ends.
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer stop()
	// Idle this long and the connection is pinged; idle twice and it is
	// taken for dead.
	idle := max(time.Duration(s.cfg.LeaseTTL)/3, time.Second)
	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(ctx, idle)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !pinged && ctx.Err() == nil {
				pctx, cancel := s.ctx(ctx)
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
				if s.catchUp(ctx, sub, fn) {
					s.hearing.Add(1)
					defer s.hearing.Add(-1)
				}
			}
		case *redis.Message:
			ev, ok := decodeEvent(m.Payload, s.now())
			if ok && ev.Kind == EventWanted && ev.Node != s.node {
				s.noteWanted(ev.Provider)
			}
			if ok && !sub.stopped.Load() {
				fn(ev)
			}
		}
	}
}
