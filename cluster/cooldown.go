package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// PublishCooldown sets the shared cooldown of provider until the given
// time with the given doubling count, unless a later cooldown is already
// set (then nothing changes). The key expires at until. When it is set,
// every node's subscribers get a "cooldown" Event. An until already past
// changes nothing. Errors wrap ErrUnavailable.
func (s *Store) PublishCooldown(ctx context.Context, provider string, until time.Time, streak int) error {
	if provider == "" {
		return errors.New("publish cooldown: empty provider name")
	}
	op := fmt.Sprintf("publish the cooldown of provider %q", provider)
	if s.isClosed() {
		return s.fail(op, errClosed)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	err := publishCooldownScript.Run(ctx, s.rdb, []string{s.cooldownKey(provider)},
		until.UnixMilli(), streak, s.channel(), s.event(EventCooldown, provider, until),
	).Err()
	if err != nil {
		return s.fail(op, err)
	}
	return nil
}

// ClearCooldown ends the shared cooldown of provider (it recovered, or an
// operator reset it) and sends every node's subscribers a "recovered"
// Event, even when no cooldown was set. Errors wrap ErrUnavailable.
func (s *Store) ClearCooldown(ctx context.Context, provider string) error {
	if provider == "" {
		return errors.New("clear cooldown: empty provider name")
	}
	op := fmt.Sprintf("clear the cooldown of provider %q", provider)
	if s.isClosed() {
		return s.fail(op, errClosed)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	err := clearCooldownScript.Run(ctx, s.rdb, []string{s.cooldownKey(provider)},
		s.channel(), s.event(EventRecovered, provider, time.Time{}),
	).Err()
	if err != nil {
		return s.fail(op, err)
	}
	return nil
}

// Cooldown returns the shared cooldown of provider: its end and doubling
// count, or the zero time when none is running. Errors wrap
// ErrUnavailable.
func (s *Store) Cooldown(ctx context.Context, provider string) (until time.Time, streak int, err error) {
	op := fmt.Sprintf("read the cooldown of provider %q", provider)
	if s.isClosed() {
		return time.Time{}, 0, s.fail(op, errClosed)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	vals, err := s.rdb.HMGet(ctx, s.cooldownKey(provider), "until", "streak").Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return time.Time{}, 0, s.fail(op, err)
	}
	if len(vals) != 2 {
		return time.Time{}, 0, nil
	}
	ms, ok := parseInt(vals[0])
	if !ok || ms <= 0 {
		return time.Time{}, 0, nil
	}
	n, _ := parseInt(vals[1])
	return time.UnixMilli(ms), int(n), nil
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
