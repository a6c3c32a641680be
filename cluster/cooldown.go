package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Hold is what keeps a provider from being tried across the cluster: a
// failure cooldown (a single trial follows it on each node) and a 408/429
// skip (none follows), each with its end on this node's clock, zero when
// not running.
type Hold struct {
	// CooldownUntil is the end of the shared failure cooldown.
	CooldownUntil time.Time
	// Streak is that cooldown's doubling count.
	Streak int
	// SkipUntil is the end of the shared 408/429 skip.
	SkipUntil time.Time
}

// Until is the later of the two ends, zero when neither runs.
func (h Hold) Until() time.Time {
	if h.SkipUntil.After(h.CooldownUntil) {
		return h.SkipUntil
	}
	return h.CooldownUntil
}

// IsZero reports whether nothing holds the provider.
func (h Hold) IsZero() bool { return h.CooldownUntil.IsZero() && h.SkipUntil.IsZero() }

// Deadlines travel through Redis on Redis' own clock: a node sends how
// long from now (on its clock) a cooldown or skip lasts, the script adds
// that to Redis' TIME, and what comes back is how long is left, which the
// node adds to its own clock. So the nodes' clocks may disagree without
// shortening or lengthening anything, and nothing is dropped as already
// past.

// PublishCooldown sets the shared failure cooldown of provider until the
// given time on this node's clock, with the given doubling count, unless a
// later cooldown is already set (then nothing changes). When it is set,
// every node's subscribers get a "cooldown" Event. An until already past
// changes nothing. Errors wrap ErrUnavailable.
func (n *News) PublishCooldown(ctx context.Context, provider string, until time.Time, streak int) error {
	return n.publishHold(ctx, EventCooldown, provider, until, streak)
}

// PublishSkip sets the shared 408/429 skip of provider until the given
// time on this node's clock, unless a later skip is already set. Every
// node's subscribers get a "skip" Event; they skip the provider too, with
// no trial and nothing counted. Errors wrap ErrUnavailable.
func (n *News) PublishSkip(ctx context.Context, provider string, until time.Time) error {
	return n.publishHold(ctx, EventSkip, provider, until, 0)
}

func (n *News) publishHold(ctx context.Context, kind, provider string, until time.Time, streak int) error {
	if provider == "" {
		return fmt.Errorf("publish %s: empty provider name", kind)
	}
	c := n.c
	op := fmt.Sprintf("publish the %s of provider %q", kind, provider)
	if c.closed.Load() {
		return c.fail(op, errClosed)
	}
	left := until.Sub(c.now()).Milliseconds()
	if left <= 0 {
		return nil
	}
	field := "until"
	if kind == EventSkip {
		field = "skip"
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	err := publishHoldScript.Run(ctx, c.rdb, []string{c.cooldownKey(provider)},
		left, streak, c.channel(), n.event(kind, provider, time.Duration(left)*time.Millisecond, streak), field,
	).Err()
	if err != nil {
		return c.fail(op, err)
	}
	return nil
}

// ClearCooldown ends the shared cooldown and skip of provider (it
// recovered, or an operator reset it) and sends every node's subscribers a
// "recovered" Event, even when none was set. Errors wrap ErrUnavailable.
func (n *News) ClearCooldown(ctx context.Context, provider string) error {
	if provider == "" {
		return errors.New("clear cooldown: empty provider name")
	}
	c := n.c
	op := fmt.Sprintf("clear the cooldown of provider %q", provider)
	if c.closed.Load() {
		return c.fail(op, errClosed)
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	err := clearCooldownScript.Run(ctx, c.rdb, []string{c.cooldownKey(provider)},
		c.channel(), n.event(EventRecovered, provider, 0, 0),
	).Err()
	if err != nil {
		return c.fail(op, err)
	}
	return nil
}

// Hold returns what holds provider across the cluster now: its shared
// cooldown and skip, with their ends on this node's clock. Errors wrap
// ErrUnavailable.
func (n *News) Hold(ctx context.Context, provider string) (Hold, error) {
	c := n.c
	op := fmt.Sprintf("read the cooldown of provider %q", provider)
	if c.closed.Load() {
		return Hold{}, c.fail(op, errClosed)
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	res, err := holdScript.Run(ctx, c.rdb, []string{c.cooldownKey(provider)}).Int64Slice()
	if err != nil {
		return Hold{}, c.fail(op, err)
	}
	if len(res) != 3 {
		return Hold{}, c.fail(op, fmt.Errorf("unexpected reply %v", res))
	}
	return c.hold(res[0], res[1], res[2]), nil
}

// hold builds a Hold from a script's reply: the milliseconds left of the
// cooldown, its streak and the milliseconds left of the skip.
func (c *conn) hold(cooldownLeft, streak, skipLeft int64) Hold {
	now := c.now()
	var h Hold
	if cooldownLeft > 0 {
		h.CooldownUntil = now.Add(time.Duration(cooldownLeft) * time.Millisecond)
		h.Streak = int(streak)
	}
	if skipLeft > 0 {
		h.SkipUntil = now.Add(time.Duration(skipLeft) * time.Millisecond)
	}
	return h
}

// parseInt reads an integer reply element, a string or an int64.
func parseInt(v any) (int64, bool) {
	switch v := v.(type) {
	case int64:
		return v, true
	case string:
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil
	}
	return 0, false
}
