package upstreams

// What every way of creating a provider session shares: the outcome
// words of a create, the bounds of its answer and of a session ID, and
// the books its sessions are counted in.

import (
	"errors"
	"fmt"
)

// Outcome words of a provider session API's create call.
const (
	// WordCreateFailed: create answered a status other than 2xx, 408 or
	// 429.
	WordCreateFailed = "create_failed"
	// WordBadCreate: create answered 2xx with a body that is not JSON, is
	// larger than MaxCreateAnswer, or lacks the connect URL or session ID.
	WordBadCreate = "bad_create"
	// WordBadConnectURL: the connect URL of a create answer points to a
	// host the gateway does not dial with the provider's headers (not the
	// create call's host, not under its registrable domain, not named in
	// ConnectHosts), or is plain (ws://, http://) after a create call over
	// https without InsecureConnect.
	WordBadConnectURL = "bad_connect_url"
	// WordBadSessionID: the session ID of a create answer is refused (see
	// CheckSessionID).
	WordBadSessionID = "bad_session_id"
	// WordLedger: the session created could not be written to the
	// ledger; it was released, not dialed.
	WordLedger = "ledger_failed"
)

// MaxCreateAnswer bounds the create answer the gateway reads. A larger
// answer is a failure (WordBadCreate); the session it names is still
// released when its ID lies within the first MaxCreateAnswer bytes.
const MaxCreateAnswer = 1 << 20

// MaxSessionID bounds a provider's session ID, in bytes. Real IDs are
// UUIDs or alike (36 bytes); 1 KiB leaves room for any provider's own
// scheme while keeping a release URL well inside what servers accept
// (8 KiB request lines) and ledger entries and log lines small.
const MaxSessionID = 1024

var (
	errBadCreate     = errors.New("bad create answer")
	errBadConnectURL = errors.New("connect URL refused")
	errBadSessionID  = errors.New("session ID refused")
)

// CheckSessionID refuses a session ID that cannot be trusted to name one
// session in a release call: "." or ".." (a URL path resolves them, so the
// release would go to the sessions collection or the level above it, with
// the API key), one holding a control byte, and one longer than
// MaxSessionID. The error describes the ID without showing it.
func CheckSessionID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: it is empty", errBadSessionID)
	case id == "." || id == "..":
		return fmt.Errorf("%w: it is %q, a URL path's dot segment", errBadSessionID, id)
	case len(id) > MaxSessionID:
		return fmt.Errorf("%w: it is longer than %d bytes", errBadSessionID, MaxSessionID)
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x20 || id[i] == 0x7f {
			return fmt.Errorf("%w: it holds a control byte", errBadSessionID)
		}
	}
	return nil
}

// Books are a provider's session API counts. They outlive a config load:
// the caller keeps them by provider name (Defaults.Books).
type Books struct {
	// Created: sessions the provider created whose ID the gateway read.
	Created counter
	// Released: sessions whose release the provider accepted (2xx, or 404
	// and 410: already gone).
	Released counter
	// ReleaseFailures: release calls that failed (each retry counts).
	ReleaseFailures counter
	// Orphans: sessions a create answer may have made that the gateway
	// cannot release (a 2xx answer whose session ID could not be read:
	// none at the pointer, not JSON, over MaxCreateAnswer, cut short; or
	// one whose ID CheckSessionID refused while the release URL holds it
	// in its path).
	Orphans counter
	// Reaped: sessions another process created and left behind (their
	// ledger entries adopted) whose release the provider accepted; not in
	// Created nor Released.
	Reaped counter
}

// Unreleased is the number of sessions created and not released yet.
func (b *Books) Unreleased() int64 { return b.Created.Load() - b.Released.Load() }
