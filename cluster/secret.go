package cluster

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
)

// AgreeSecret returns the deployment's secret called name as every node
// sees it: the one already kept in Redis, or else proposed, which is then
// kept for the others (the first node's wins). Secrets are stored hex
// encoded under <prefix>secret:<name>, with no expiry. Errors wrap
// ErrUnavailable.
func (s *Store) AgreeSecret(ctx context.Context, name string, proposed []byte) ([]byte, error) {
	if name == "" || len(proposed) == 0 {
		return nil, errors.New("agree on a secret: empty name or value")
	}
	c := s.c
	op := fmt.Sprintf("agree on the secret %q", name)
	if c.closed.Load() {
		return nil, c.fail(op, errClosed)
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	v, err := secretScript.Run(ctx, c.rdb, []string{c.cfg.KeyPrefix + "secret:" + name}, hex.EncodeToString(proposed)).Text()
	if err != nil {
		return nil, c.fail(op, err)
	}
	b, err := hex.DecodeString(v)
	if err != nil || len(b) == 0 {
		return nil, c.fail(op, errors.New("the stored secret is not hex"))
	}
	return b, nil
}
