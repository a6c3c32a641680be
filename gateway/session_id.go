package gateway

import (
	"crypto/rand"
	"encoding/base64"
	"net"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Session IDs and placeholders: every client the chain accepts is named at
// join by a random, URL-safe ID. The ID is on the client's 101 (or its
// extended CONNECT's 200, or its rejection) as SessionHeader, on the
// "session ended" and "rejected" log entries as session_id, in the session
// registry (the admin API's sessions list and DELETE), and, with what the
// chain learnt, in placeholders for the rest of the route and Caddy's
// access log.

// SessionHeader names the session on the answer to the client.
const SessionHeader = "Browser-Failover-Session"

// Placeholders the chain sets on the request's replacer.
const (
	// PlaceholderSessionID is the client's session ID, set at join.
	PlaceholderSessionID = "http.browser_failover.session_id"
	// PlaceholderProvider is the provider that served the client, or
	// whose answer it got; empty when none.
	PlaceholderProvider = "http.browser_failover.provider"
	// PlaceholderAttempts counts the provider attempts of the client's way
	// (providers passed over without an attempt are not counted).
	PlaceholderAttempts = "http.browser_failover.attempts"
	// PlaceholderQueueWaitMS is the client's time in the wait queue in
	// milliseconds (0 when it did not wait).
	PlaceholderQueueWaitMS = "http.browser_failover.queue_wait_ms"
)

// sessionIDBytes is the randomness of a session ID: 128 bits, 22
// characters of URL-safe base64. An ID only names a session (a resume
// needs the client's token), but IDs are unguessable all the same.
const sessionIDBytes = 16

// newSessionID returns a fresh random session ID.
func newSessionID() string {
	var b [sessionIDBytes]byte
	rand.Read(b[:]) // never fails (crypto/rand aborts the process instead)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// validSessionID reports whether id has the form of a session ID.
func validSessionID(id string) bool {
	b, err := base64.RawURLEncoding.DecodeString(id)
	return err == nil && len(b) == sessionIDBytes
}

// A WebDriver client names its session in every request's path (and its
// sockets' URLs), so that ID is the client's secret, not the session ID
// operators see: a path ID is made for each WebDriver session, 192 random
// bits (32 characters of URL-safe base64), shown to its client only, in
// its create answer. The gateway keeps only hashes of it
// (pool.PathHash, and pool.Hashes.RouteKey under shared state). It has
// a length of its own, so an operator's session ID never even has its
// form.
const pathIDBytes = 24

// newPathID returns a fresh random path ID.
func newPathID() string {
	var b [pathIDBytes]byte
	rand.Read(b[:]) // never fails (crypto/rand aborts the process instead)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// validPathID reports whether id has the form of a path ID.
func validPathID(id string) bool {
	if len(id) != base64.RawURLEncoding.EncodedLen(pathIDBytes) {
		return false
	}
	_, err := base64.RawURLEncoding.DecodeString(id)
	return err == nil
}

// learnt sets the placeholders of what the chain learnt about the client:
// provider is the one that served it (or whose answer it got), "" when
// none.
func (c *connect) learnt(provider string) {
	if c.repl == nil {
		return
	}
	c.repl.Set(PlaceholderProvider, provider)
	c.repl.Set(PlaceholderAttempts, c.tries)
	c.repl.Set(PlaceholderQueueWaitMS, roundMS(c.waited))
}

// remoteIP is the client's IP as Caddy saw it: its client_ip, which
// applies trusted_proxies, else the connection's peer.
func remoteIP(r *http.Request) string {
	if ip, ok := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string); ok && ip != "" {
		return ip
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// Where a client names the session it resumes, with its token.
const (
	ResumeQuery  = "bf_resume"
	ResumeHeader = "Browser-Failover-Resume"
)

// Where a client brings its own resume token on its first connect, and
// where the gateway hands one out on the 101 when the client brought none.
const (
	ResumeTokenQuery  = "bf_resume_token"
	ResumeTokenHeader = "Browser-Failover-Resume-Token"
)
