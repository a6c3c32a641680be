package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/spend"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Parking: what a session that may be resumed carries while it is live,
// and what happens when its client leaves: the session's resume entry is
// made (kept by the keyed hash of its token, and in Redis when nothing of
// it is local), and its holds wait for the window's end or a resume. The
// relay's step calls it; taking a parked session back is resume.go's.

// parking is what a resumable session needs to be parked when its client
// ends it: where its browser is, and under which token and key.
type parking struct {
	h        *Gateway
	window   time.Duration
	hold     bool
	token    string // hashed resume token
	key      string // hashed resume key ("" when none)
	provider string
	up       *upstreams.Provider
	proto    string
	point    upstreams.ResumePoint
	answer   *upstreams.Answer // the provider's 101 (its subprotocol, extensions)
	started  time.Time
	client   string
	store    *cluster.Shared // set when the resume registry is shared
	bytesUp  int64
	bytesDn  int64
	remoteIP string
	meter    *spend.Meter // the session's cost
	options  string       // its session options as bf_ query items
	// recording is the recording a resume goes on with ("": none).
	recording string

	mu sync.Mutex
	id string // the session's current ID
	// joined is closed when the client joined now leaves (the session is
	// parked, or ends): an extended CONNECT client's handler returns then.
	joined chan struct{}
	// kept is the ticket of a parked session that holds a created
	// provider session (no hold): its slot, client_limit share,
	// cluster-wide slot, meter and provider session stay counted while it
	// is parked; or, for another parked session with a browser profile
	// (no hold), a ticket that holds only the profile, in use while it is
	// parked. nil otherwise, and once a resume took it.
	kept *pool.Ticket
}

// newParking prepares the parking of the session c establishes with up at
// m under ticket t, or returns nil when it cannot be resumed.
func (c *connect) newParking(m *member, up *upstreams.Conn, t *pool.Ticket) *parking {
	h := c.h
	if h.Resume == nil || c.token == "" || !c.cls.proto.Resumable() || up.Point.IsZero() {
		return nil
	}
	pk := &parking{
		h:        h,
		window:   time.Duration(h.Resume.Window),
		hold:     h.Resume.Hold,
		token:    c.h.reg.Hashes.ResumeToken(c.token),
		key:      c.resumeKey(),
		provider: m.up.Name,
		up:       m.up,
		proto:    string(c.cls.proto),
		point:    up.Point,
		answer:   up.Answer,
		started:  time.Now(),
		remoteIP: remoteIP(c.r),
		options:  c.opts.Query(),
		id:       c.id,
		joined:   make(chan struct{}),
	}
	if k, ok := t.Share(); ok {
		pk.client = c.h.reg.Hashes.ShownKey(k.Value)
	}
	if h.shared != nil {
		pk.store = h.shared.s
	}
	return pk
}

func (pk *parking) currentID() string {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	return pk.id
}

// left marks the joined client gone.
func (pk *parking) left() {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	select {
	case <-pk.joined:
	default:
		close(pk.joined)
	}
}

// compressed reports whether the session negotiated a WebSocket extension
// (compression): a new connection cannot share its state, so it is never
// held.
func (pk *parking) compressed() bool {
	return pk.answer.Header.Get("Sec-Websocket-Extensions") != ""
}

// ended is called when a session that was not held has ended, with its
// ticket: a session its client ended is parked. A parked session whose
// provider session lives on (created over a session API) keeps its
// ticket, and what it holds counted, until its window ends or a resume
// takes it; ended then reports true, and the caller releases nothing. A
// session that negotiated compression under hold is parked only to
// answer its resume 409.
func (pk *parking) ended(s *upstreams.Session, t *pool.Ticket) bool {
	if pk == nil || (pk.hold && !pk.compressed()) || !s.ClientEnded() {
		return false
	}
	pk.bytesUp, pk.bytesDn = s.BytesUp(), s.BytesDown()
	if pk.hold {
		// Nothing to go back to: a provider session created for it is
		// released now, with the ticket.
		pk.park(nil, s.ClientCloseCode())
		return false
	}
	keep := t.HoldsProviderSession()
	if keep {
		t.Park()
		pk.mu.Lock()
		pk.kept = t
		pk.mu.Unlock()
	} else if p := t.KeepProfile(); p != nil {
		// Its browser profile stays in use for the window: a ticket of
		// its own, which the resume takes on (the rest is given back).
		pk.mu.Lock()
		pk.kept = p
		pk.mu.Unlock()
	}
	pk.park(nil, s.ClientCloseCode())
	return keep
}

// takeKept takes the ticket a parked session keeps (nil when none).
func (pk *parking) takeKept() *pool.Ticket {
	if pk == nil {
		return nil
	}
	pk.mu.Lock()
	defer pk.mu.Unlock()
	k := pk.kept
	pk.kept = nil
	return k
}

// putKept gives it back to the parked session (a resume that could not
// go on), parked again.
func (pk *parking) putKept(k *pool.Ticket) {
	if pk == nil || k == nil {
		return
	}
	k.Repark()
	pk.mu.Lock()
	pk.kept = k
	pk.mu.Unlock()
}

// keeps is the ticket the parked session keeps, left in place (nil when
// none).
func (pk *parking) keeps() *pool.Ticket {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	return pk.kept
}

// onPark is the held session's OnPark: its client left, its provider
// connection stays open for the window.
func (pk *parking) onPark(s *upstreams.Session) {
	pk.left()
	pk.park(s, s.ClientCloseCode())
}

// park registers the session for the window.
func (pk *parking) park(held *upstreams.Session, code int) {
	now := pk.h.reg.Now()
	e := &pool.Parked{
		ID:        pk.currentID(),
		Token:     pk.token,
		Provider:  pk.provider,
		Protocol:  pk.proto,
		Point:     pk.point,
		Key:       pk.key,
		Started:   pk.started,
		Parked:    now,
		Until:     now.Add(pk.window),
		Client:    pk.client,
		RemoteIP:  pk.remoteIP,
		BytesUp:   pk.bytesUp,
		BytesDown: pk.bytesDn,
		Meter:     pk.meter,
		CloseCode: code,
		Held:      held,
		Options:   pk.options,
		Recording: pk.recording,
		Data:      pk,
	}
	if pk.hold && held == nil {
		// Under hold, a session that is not held has nothing to go back
		// to (its provider ends the browser with the connection).
		e.Refuse = "the session negotiated a WebSocket extension (" + extensionNames(pk.answer.Header.Get("Sec-Websocket-Extensions")) +
			"): it could not be held, and a new connection cannot join it"
	}
	if held != nil {
		e.BytesUp, e.BytesDown = held.BytesUp(), held.BytesDown()
	}
	// Another node may take it back only when nothing of it lives here:
	// no open connection, no provider session to release. What the
	// shared store keeps holds no secret of the provider's.
	if pk.store != nil && held == nil && pk.keeps() == nil && e.Refuse == "" && pk.store.Usable() {
		if sp, ok := pk.up.Share(pk.point); ok {
			v, _ := json.Marshal(sharedParked{ID: e.ID, Provider: pk.provider, Point: sp, Started: pk.started, Options: pk.options, Recording: pk.recording})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if err := pk.store.Store().ParkResume(ctx, pk.token, pk.key, v, pk.window); err != nil {
				pk.store.Failed("park resume", err)
			} else {
				pk.store.Worked()
				e.Shared = true
			}
			cancel()
		}
	}
	logger := pk.h.logger
	store := pk.store
	pk.h.reg.Parked.Add(e, func(e *pool.Parked) {

		if e.Shared && store != nil && store.Usable() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			store.Store().DropResume(ctx, e.Token, e.Key)
			cancel()
		}
		if e.Held != nil {
			e.Held.Close(e.CloseCode, EndResumeWindow)
		} else {
			pk.takeKept().Release()
		}
		logger.Info("resume window over", zap.String("session_id", e.ID), zap.String("provider", e.Provider),
			zap.Bool("held", e.Held != nil))
	})

	logger.Info("session parked",
		zap.String("session_id", e.ID),
		zap.String("provider", e.Provider),
		zap.Bool("held", held != nil),
		zap.Int("close_code", code),
		zap.Time("resumable_until", e.Until),
	)
}

// resumeFailure is why a resume is refused: its metric label and message.
type resumeFailure struct {
	result string
	status int
	msg    string
}

// resumeRetryAfter is the Retry-After of a resume refused while the shared
// registry cannot be asked: about when the shared state is tried again.
const resumeRetryAfter = 2

// EndResumeWindow is the close reason a held session's provider side gets
// when its window ends without a resume.
const EndResumeWindow = "resume window over"

// resumeKey is the hashed value of the client's resume_key ("" without
// one).
func (c *connect) resumeKey() string {
	if c.h.ResumeKey == "" {
		return ""
	}
	return c.h.reg.Hashes.ResumeKey(c.resumeKeyValue())
}

// resumeKeyValue is the client's resume_key value ("" without one, or
// when the placeholder has no value for it).
func (c *connect) resumeKeyValue() string {
	if c.h.ResumeKey == "" || c.replace == nil {
		return ""
	}
	return c.replace(c.h.ResumeKey)
}

// sharedParked is what the shared registry keeps of a parked session,
// under its token's hash: names and a point without secrets, each
// checked when read back.
type sharedParked struct {
	ID       string                `json:"id"`
	Provider string                `json:"provider"`
	Point    upstreams.SharedPoint `json:"point"`
	Started  time.Time             `json:"started"`
	Options  string                `json:"options,omitempty"`
	// Recording is the ID of the session's recording (a session ID),
	// which a resume goes on with where the storage is shared.
	Recording string `json:"recording,omitempty"`
}

// decodeSharedParked reads an entry of the shared registry, refusing one
// whose names are not what this gateway writes.
func decodeSharedParked(v []byte) (sharedParked, error) {
	var sp sharedParked
	if err := json.Unmarshal(v, &sp); err != nil {
		return sp, errors.New("not JSON")
	}
	if !validSessionID(sp.ID) {
		return sp, errors.New("not a session ID")
	}
	if sp.Recording != "" && !validSessionID(sp.Recording) {
		return sp, errors.New("not a recording ID")
	}
	if sp.Provider == "" || strings.IndexFunc(sp.Provider, func(r rune) bool { return r < ' ' || r == 0x7f }) >= 0 {
		return sp, errors.New("not a provider name")
	}
	return sp, nil
}

// extensionNames lists the extension names of a Sec-WebSocket-Extensions
// value, without their parameters.
func extensionNames(v string) string {
	var names []string
	for _, ext := range strings.Split(v, ",") {
		name, _, _ := strings.Cut(ext, ";")
		if name = strings.TrimSpace(name); name != "" {
			names = append(names, name)
		}
	}
	return strings.Join(names, ", ")
}

// prepareResume readies the resume token of a client whose session may be
// resumed (resume on, CDP, a resume_key value when one is set): the token
// it brought, which must have a token's form, or one the gateway hands out
// on the 101. Other clients' tokens are ignored. It reports false when the
// client got its answer (400 for a malformed token).
func (c *connect) prepareResume() bool {
	h := c.h
	if h.Resume == nil || !c.cls.proto.Resumable() || (h.ResumeKey != "" && c.resumeKeyValue() == "") {
		c.token = ""
		return true
	}
	if c.token == "" {
		c.token, c.handOut = newResumeToken(), true
		return true
	}
	if !validResumeToken(c.token) {
		c.finish(&refusal{status: http.StatusBadRequest, reason: "resume bad_token", msg: fmt.Sprintf(
			"%s must be %d to %d URL-safe characters (A-Z, a-z, 0-9, - and _), such as 16 random bytes in base64url",
			ResumeTokenQuery, minResumeToken, maxResumeToken)})
		return false
	}
	return true
}

// A resume token is minResumeToken to maxResumeToken URL-safe characters
// (A-Z, a-z, 0-9, - and _): at least 128 bits of a client's randomness in
// base64url.
const (
	minResumeToken = 22
	maxResumeToken = 256
)

// validResumeToken reports whether t has a token's form.
func validResumeToken(t string) bool {
	if len(t) < minResumeToken || len(t) > maxResumeToken {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// newResumeToken is a token the gateway makes for a client that brought
// none: as random as a session ID, and never one.
func newResumeToken() string { return newSessionID() }
