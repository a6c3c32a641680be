package cluster

import (
	"errors"
	"strings"
)

// ErrUnavailable is wrapped by every error that comes from talking to Redis:
// network errors, timeouts, authentication failures, a closed Store.
// Callers test it with errors.Is and fall back to node-local state.
var ErrUnavailable = errors.New("shared state unavailable")

// unavailableError is an error of a Redis call: its text is scrubbed of the
// password; it unwraps to ErrUnavailable and to the cause.
type unavailableError struct {
	msg   string
	cause error
}

func (e *unavailableError) Error() string { return e.msg }

func (e *unavailableError) Unwrap() []error {
	if e.cause == nil {
		return []error{ErrUnavailable}
	}
	return []error{ErrUnavailable, e.cause}
}

// fail wraps err, the failure of operation op, in ErrUnavailable. The text
// never contains the password, even if a server or library echoed it.
func (c *conn) fail(op string, err error) error {
	// Redis may have lost this node's leases meanwhile (a restart, a
	// failover): they are put back before the next admission.
	c.stale.Store(true)
	msg := ErrUnavailable.Error() + ": " + op
	if err != nil {
		msg += ": " + err.Error()
	}
	for _, pw := range []string{c.cfg.Password, c.cfg.SentinelPassword} {
		if pw != "" {
			msg = strings.ReplaceAll(msg, pw, "[REDACTED]")
		}
	}
	return &unavailableError{msg: msg, cause: err}
}
