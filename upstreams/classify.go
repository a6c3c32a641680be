package upstreams

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"
)

// Errors of an attempt that ClassifyError tells apart.
var (
	errBadHandshake = errors.New("bad handshake")
	errBadDiscovery = errors.New("bad discovery answer")
	errTLS          = errors.New("TLS handshake failed")
)

// Kind is what an attempt's outcome means for the failover chain (go on to
// the next provider or not) and for the provider's health (a success, a
// failure, a capacity skip, or nothing at all).
type Kind int

const (
	// Success: 101 with a valid Sec-WebSocket-Accept. Relay.
	Success Kind = iota + 1
	// Failure: try the next provider and count a failure.
	Failure
	// Capacity (408, 429): try the next provider; skip this one until
	// Retry-After or for its cooldown duration; not a failure.
	Capacity
	// Incompatible (428, a Playwright server of another version): try the
	// next provider; nothing recorded, not skipped.
	Incompatible
	// Relay (any other 4xx): the answer goes to the client as it is; no
	// next provider; neither success nor failure.
	Relay
	// ClientGone: the client went away; stop, record nothing.
	ClientGone
	// Gateway: the gateway itself cannot go on with this provider (the
	// ledger of created sessions could not be written); try the next
	// provider; nothing recorded against this one.
	Gateway
	// Declined (a WebDriver "session not created", other than one
	// saying the provider is full): the provider's word on what the
	// client asked for, not on its health. Try the next provider; nothing
	// recorded, not skipped; when no provider is left, the last such
	// answer (Result.Answer, Result.Body) goes to the client as it is.
	Declined
)

// String names the kind for logs.
func (k Kind) String() string {
	switch k {
	case Success:
		return "success"
	case Failure:
		return "failure"
	case Capacity:
		return "capacity"
	case Incompatible:
		return "incompatible"
	case Relay:
		return "relay"
	case ClientGone:
		return "client_gone"
	case Gateway:
		return "gateway"
	case Declined:
		return "declined"
	}
	return "unknown"
}

// Outcome words for failures that are not an HTTP status, as they appear in
// 503 bodies, logs and metric labels.
const (
	WordOK           = "ok"
	WordRefused      = "refused"
	WordTimeout      = "timeout"
	WordDNS          = "dns_error"
	WordTLS          = "tls_error"
	WordReset        = "reset"
	WordBadHandshake = "bad_handshake"
	WordBadDiscovery = "bad_discovery"
	WordClientGone   = "client_gone"
	// Skips: providers passed over without an attempt.
	WordCooldown = "cooldown"
	WordFull     = "full"
	WordDrained  = "drained"
	// WordBudget: the provider's budget for the current window is spent.
	WordBudget = "budget"
	// WordRate: the provider was asked to start as many sessions as its
	// create_rate allows in the sliding window; not a failure.
	WordRate = "rate"
	// WordHedgeLost marks an attempt given up because a hedged attempt
	// at another provider won the race.
	WordHedgeLost = "hedge_lost"
	// WordNotCreated: a WebDriver provider answered "session not
	// created" for another reason than being full: it will not start
	// what the client asked for (Declined).
	WordNotCreated = "not_created"
)

// StatusWord is the outcome word of an HTTP status: status_<code>.
func StatusWord(code int) string { return "status_" + strconv.Itoa(code) }

// ClassifyStatus maps a provider's HTTP answer status to its outcome, for an
// answer other than a valid 101. A 101 that reached this function failed
// validation.
func ClassifyStatus(code int) (word string, kind Kind) {
	switch {
	case code < 400:
		// Any 1xx/2xx/3xx, or a 101 with a wrong accept or upgrade.
		return WordBadHandshake, Failure
	case code == 401, code == 403:
		return StatusWord(code), Failure
	case code == 408, code == 429:
		return StatusWord(code), Capacity
	case code == 428:
		return StatusWord(code), Incompatible
	case code < 500:
		return StatusWord(code), Relay
	default:
		return StatusWord(code), Failure
	}
}

// refusedWith is the Outcome.Refused of an answer of status code: the
// code when it is a 4xx, else 0.
func refusedWith(code int) int {
	if code >= 400 && code < 500 {
		return code
	}
	return 0
}

// ClassifyError maps a transport error of an attempt to its outcome.
// clientGone tells whether the client's own context ended.
func ClassifyError(err error, clientGone bool) (word string, kind Kind) {
	if clientGone {
		return WordClientGone, ClientGone
	}
	var dnsErr *net.DNSError
	var recErr tls.RecordHeaderError
	var alertErr tls.AlertError
	var certErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var invalidErr x509.CertificateInvalidError
	switch {
	case errors.Is(err, errBadDiscovery):
		return WordBadDiscovery, Failure
	case errors.Is(err, errBadHandshake), errors.Is(err, errMalformed):
		return WordBadHandshake, Failure
	case errors.As(err, &dnsErr):
		return WordDNS, Failure
	case errors.As(err, &recErr), errors.As(err, &alertErr), errors.As(err, &certErr),
		errors.As(err, &unknownAuth), errors.As(err, &hostErr), errors.As(err, &invalidErr),
		errors.Is(err, errTLS):
		return WordTLS, Failure
	case errors.Is(err, syscall.ECONNREFUSED):
		return WordRefused, Failure
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded), isTimeout(err):
		return WordTimeout, Failure
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return WordReset, Failure
	}
	// Anything else the network says (unreachable host, no route …) is a
	// failed connection.
	return WordRefused, Failure
}

func isTimeout(err error) bool {
	if err == io.EOF {
		return false // how most reads end: no walk of a chain
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Outcome is how one attempt ended.
type Outcome struct {
	Word string
	Kind Kind
	// RetryAfter is the provider's Retry-After for Capacity answers (0 when
	// absent).
	RetryAfter time.Duration
	// Refused is the 4xx status the provider refused the attempt with
	// before starting anything (0: it did not): its answer to the upgrade
	// at its own URL, to a discovery GET, or to a session API or
	// WebDriver create call. A session API's upgrade after a create that
	// worked leaves it 0: a session was started.
	Refused int
	// Elapsed is the attempt's duration.
	Elapsed time.Duration
	// Err is the cause, for logs; it never holds a URL.
	Err error
}
