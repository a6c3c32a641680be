package pool

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// Sessions named by their client's secret: a WebDriver client sends its
// session's ID in every request's path, so that ID is a credential. The
// registry never keeps it; it keeps a hash of it (PathHash), and with it
// whom the session answers to (Bound): the handler that made it (its key,
// moved to its successor when a reload replaces that handler) and the
// client key its create was made with. Under shared state the session's
// route is kept under a keyed hash of the ID (RouteKey), with the same
// binding, so no value read from Redis names a session a client could
// use.

// Bound is whom a session named by its client's secret answers to. None
// of it is shown.
type Bound struct {
	// Path is PathHash of the secret that names the session in its
	// client's requests; "" when none does (the session is listed by
	// its operator's ID only).
	Path string
	// Handler is the key of the handler whose requests may use it (see
	// Handlers.Retire: a reload moves it to the handler that replaces
	// that one).
	Handler string
	// Keys are the client key placeholders of that handler when the
	// session was made (client_limit's, then client_budget's when it
	// differs); nil without one.
	Keys []string
	// Client is ClientHash of what Keys resolved to for the client that
	// made it; "" without Keys.
	Client string
}

// PathHash is how a session's path secret is kept: its SHA-256, hex. The
// secret has at least 128 random bits, so the hash cannot be turned back
// into it, and it needs no key (which a reload or the shared state's
// agreement could change under a live session).
func PathHash(secret string) string {
	sum := sha256.Sum256([]byte("session path\x00" + secret))
	return hex.EncodeToString(sum[:])
}

// ClientHash is how the client key values of a bound session are kept in
// this process: a SHA-256 of the values, never the values.
func ClientHash(values []string) string {
	sum := sha256.Sum256([]byte("client key\x00" + joinValues(values)))
	return hex.EncodeToString(sum[:])
}

// joinValues joins values so that no two lists join alike: each is
// preceded by its length.
func joinValues(values []string) string {
	var b strings.Builder
	for _, v := range values {
		b.WriteString(strconv.Itoa(len(v)))
		b.WriteByte(':')
		b.WriteString(v)
	}
	return b.String()
}

// ByPath finds the live session whose path secret hashes to path
// (PathHash), with its binding as it is now.
func (l *LiveSessions) ByPath(path string) (LiveSession, bool) {
	if path == "" {
		return LiveSession{}, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.byPath[path]
	if !ok {
		return LiveSession{}, false
	}
	return *e, true
}

// rebind moves the live sessions bound to handler key from to key to,
// and returns them.
func (l *LiveSessions) rebind(from, to string) []Live {
	l.mu.Lock()
	defer l.mu.Unlock()
	var moved []Live
	for _, e := range l.byPath {
		if e.Bound.Handler == from {
			e.Bound.Handler = to
			moved = append(moved, e.Session)
		}
	}
	return moved
}
