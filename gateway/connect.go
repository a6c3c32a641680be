package gateway

import (
	"context"
	"math"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/browserfailover/caddy-browser-failover/options"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/queue"
	"github.com/browserfailover/caddy-browser-failover/sessions"
	"github.com/browserfailover/caddy-browser-failover/spend"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// One client's state as the chain's steps see it (connect), the kind of
// client it is (its front), what the queue knows of it (class), and how
// its attempts are recorded for the logs and refusals. Files above this
// one (the fronts, the chain, its steps) act on a connect; the helpers
// below it (handler, session IDs) know nothing of one.

// maxLoggedAttempts bounds the attempts kept for the 503 body and logs.
const maxLoggedAttempts = 50

// A front is one kind of client the chain serves: a WebSocket upgrade
// (front_upgrade.go), a WebDriver create (front_webdriver.go), or a
// warm-up, a session made before any client asks (front_warm.go). The
// chain's steps are the same for every front; what differs, the chain
// asks the client's front.
type front interface {
	// protocol is what the client speaks: its protocol, and for a
	// Playwright client its major.minor.
	protocol() (upstreams.Protocol, string)
	// accepts reports whether provider up may serve the client, beyond
	// its protocol and session options (a WebDriver create: the browser
	// it asks for).
	accepts(up *upstreams.Provider) bool
	// noneAccepts is the 502 message when no provider of the client's
	// pool accepts it.
	noneAccepts() string
	// options reads the session options the client stated (they are not
	// forwarded); an error names the bad one.
	options(c *connect) (options.Set, error)
	// hedged reports whether the client's attempts may run side by side
	// (hedge_after).
	hedged() bool
	// shortcut is offered the pass's ordered candidates before any
	// attempt, and reports whether it served the client (a warm session).
	shortcut(c *connect, order []int) (passEnd, bool)
	// attempt is one attempt at m, through the provider's way of making
	// a session of this kind.
	attempt(ctx context.Context, c *connect, m *member) upstreams.Result
	// establish makes the session of a successful attempt at m live (its
	// ticket now the session's) and tells the client.
	establish(c *connect, m *member, res upstreams.Result) passEnd
	// answer gives the client refusal rf, in its own words.
	answer(c *connect, rf *refusal)
}

// connect is one client's way through the chain. Its methods (about 45,
// more than a type should have) are the chain's steps and what they ask
// of one client's way, in the chain's files: the way itself (chain.go),
// admission and settling (steps.go), the admission's parts (spend.go,
// shared.go, session_options.go, resume_park.go), its refusals
// (refusal.go) and its record of attempts (connect.go). Splitting them
// would split one client's state; the ways beside the chain are types of
// their own (resume, socket), and so is what differs per kind of client
// (its front).
type connect struct {
	h     *Gateway // the handler serving it; a reload may hand it on
	front front
	// ctx is the client's: it ends when the client goes away (a
	// warm-up's never does).
	ctx context.Context
	// w and r are the client's request (nil for a warm-up), hs its
	// WebSocket handshake (nil but for an upgrade, and a warm-up's own).
	w       http.ResponseWriter
	r       *http.Request
	hs      *upstreams.Handshake
	replace func(string) string
	repl    *caddy.Replacer // nil outside Caddy
	start   time.Time
	// id names the client's session (session_id.go).
	id string
	// token is the client's resume token (resume.go): the one it brought,
	// or (handOut) one the gateway made for it and puts on its 101; ""
	// when its session cannot be resumed.
	token   string
	handOut bool

	cls  *class
	pool *poolOf // the handler's members that can serve the client

	attempts                    []attempt
	hedgesStarted, hedgesWasted int
	// tries counts the provider attempts made (skips are not attempts).
	tries int

	// Waiting.
	mark    *queue.Mark // taken before the first pass; ended by Join, served or chain's end
	waiter  *queue.Waiter
	joined  time.Time
	waited  time.Duration
	inQuota bool // waiting for its client_limit share, not a provider

	// ticket is what the client holds (its client_limit share, its
	// client key's book; its provider's part once an attempt won),
	// until its session takes it; given back at the end of its way.
	ticket *pool.Ticket
	// resuming: the client takes back a parked session (resume.go);
	// recording is the recording that session's goes on with ("":
	// none).
	resuming  bool
	recording string
	// opts are the session options the client stated
	// (session_options.go).
	opts options.Set
	// profile is the browser profile it named (nil: none; profiles.go).
	profile *clientProfile
	// unsupported are the providers its options rule out (the last
	// pass's), shown in 503 and 502 bodies.
	unsupported []unsupported
	// warm is the lifecycle of the warm session the client was handed
	// (warm.go), which its session goes on with; nil: none.
	warm *sessions.Session
	// ahead is what the provider's budget must still be able to pay on
	// admission besides this session's first cost: for a warm-up, a
	// session of expected_duration there.
	ahead float64
	// last is the last answer a provider declined the client with
	// (nil: none), given to it when no other provider is left.
	last *declined

	// allIncompatible: the last pass found every provider it could use
	// answering 428 (a Playwright server of another version).
	allIncompatible bool
	finished        bool
	// leftHeld is closed when the client of a held session is let go
	// (resume.go); nil otherwise.
	leftHeld <-chan struct{}
}

// class is what the queue knows of a waiting client: enough for the
// handler of a new config to tell what it can use there.
type class struct {
	proto     upstreams.Protocol
	pwVersion string
	affinity  string
	// quota is the resource of its client_limit key, "" without one.
	quota string
	// quotaTemplate is the client_limit key it was counted under.
	quotaTemplate string
	// opts are the session options it stated, and accepts its front's
	// own choice of providers (nil: any): it waits only for providers
	// that honour the options and that accepts takes (usable).
	opts    options.Set
	accepts func(*upstreams.Provider) bool
	// declined names in the queue the providers that declined what it
	// asked for (chain.go): it waits for none of them. Replaced as it
	// grows, never changed: a reload reads it (usable) while the client
	// runs a pass.
	declined atomic.Pointer[map[string]bool]
}

// declined is a provider's answer declining what the client asked for
// (a WebDriver "session not created"): not a failure, and the client
// gets it when no other provider is left.
type declined struct {
	provider, resource string
	res                upstreams.Result
}

// refusal is the answer of a client that gets no session.
type refusal struct {
	status int
	// reason is the rejection reason of metrics, events and the log.
	reason string
	// provider is the one whose answer the client gets, if any.
	provider string
	// msg says what went wrong.
	msg string
	// attempts are the providers tried and passed over, for a refusal
	// that lists them (a 503's; nil for the others).
	attempts []attempt
	// retryAfter is when to come back, in seconds (0: no Retry-After).
	retryAfter int
	// unsupported are the providers the client's options ruled out.
	unsupported []unsupported
	// more are the other members of a JSON answer (a client limit's, a
	// client budget's, the option at fault).
	more map[string]any
	// relayed is a provider's own answer, which the client gets as it
	// is (nil: none).
	relayed *upstreams.Result
}

// unsupported is a provider the client's options rule out, and what of
// them it cannot honour (the unsupported list of 503 and 502 bodies).
type unsupported struct {
	Provider string   `json:"provider"`
	Lacks    []string `json:"lacks"`
}

// passEnd is how one pass over the candidates ended.
type passEnd int

// passState is one pass's way through the ordered candidates.
type passState struct {
	order       []int
	maxAttempts int // max_attempts (0: all)
	next        int // index in order of the next candidate to look at
	deadline    time.Time
	tried       int
	// Providers that could serve this client later: not drained, and not
	// a Playwright server of another version (428).
	serveable, incompatible int
	// retry: only providers that failed without cooling down stand in
	// the way.
	retry bool
	// stateDown: providers refused because the shared state is
	// unreachable (on_unavailable reject); they cannot be waited for.
	stateDown int
	// overBudget: providers whose budget is spent until their window
	// turns; not waited for either.
	overBudget int
	// clientOver: the client key's budget refused an admission; the
	// client is answered 429.
	clientOver *spend.Over
	// quotaOver: a resume's client_limit share could not be taken.
	quotaOver bool
	// refused: the client's way ends with this answer (its profile could
	// not be had); gone: the client left during the admission.
	refused *refusal
	gone    bool
	// declined: the providers that declined what the client asked for
	// in this pass; not waited for.
	declined []declined
}

// verdict is what an attempt's outcome means for the pass.
type verdict int

// record notes an attempt's outcome in the client's list, the metrics and
// the debug log.
func (c *connect) record(m *member, o upstreams.Outcome) {
	c.add(attempt{Provider: m.up.Name, Outcome: o.Word, MS: roundMS(o.Elapsed)})
	c.tries++
	c.h.reg.Metrics().Attempt(m.up.Name, o)
	if ce := c.h.logger.Check(zap.DebugLevel, "attempt"); ce != nil {
		fields := []zap.Field{
			zap.String("provider", m.up.Name),
			zap.String("outcome", o.Word),
			zap.Float64("ms", roundMS(o.Elapsed)),
		}
		if o.Err != nil {
			fields = append(fields, zap.String("cause", o.Err.Error()))
		}
		ce.Write(fields...)
	}
}

// add keeps the latest maxLoggedAttempts attempts.
func (c *connect) add(a attempt) {
	if len(c.attempts) >= maxLoggedAttempts {
		copy(c.attempts, c.attempts[1:])
		c.attempts = c.attempts[:len(c.attempts)-1]
	}
	c.attempts = append(c.attempts, a)
}

// skip records a provider passed over without an attempt.
func (c *connect) skip(m *member, word string) {
	c.add(attempt{Provider: m.up.Name, Outcome: word})
}

// poolFor returns the pool of clients of class cl in the handler's
// roster now, made once per roster and class.
func (h *Gateway) poolFor(cl *class) *poolOf {
	r := h.current()
	key := ""
	if h.routed {
		key = string(cl.proto) + " " + cl.pwVersion
	}
	if p, ok := r.pools.Load(key); ok {
		return p.(*poolOf)
	}
	serves := func(up *upstreams.Provider) bool {
		return !h.routed || upstreams.Serves(up.Protocol(), up.PlaywrightVersion(), cl.proto, cl.pwVersion)
	}
	p := &poolOf{all: r.members, warm: r.warm}
	for i, m := range r.members {
		if serves(m.up) {
			p.members = append(p.members, i)
		}
	}
	for _, t := range r.templates {
		if serves(t) {
			p.awaits = append(p.awaits, t)
		}
	}
	p.resources = make([]string, len(p.members))
	for j, i := range p.members {
		p.resources[j] = r.members[i].state.Resource()
	}
	// The rotation is the class's, whatever the roster: it goes on
	// across changes of the set (every strategy takes a changing set).
	s, ok := h.strategies.Load(key)
	if !ok {
		fresh, _ := upstreams.NewStrategy(h.Strategy)
		s, _ = h.strategies.LoadOrStore(key, fresh)
	}
	p.strategy = s.(upstreams.Strategy)
	actual, _ := r.pools.LoadOrStore(key, p)
	return actual.(*poolOf)
}

// mayFind reports whether a providers block of the client's handler could
// find a provider for it later (found.go): one whose providers would be
// in its pool, that its front accepts and that honour its session
// options. Such a client waits for it rather than being answered that no
// provider serves it.
func (c *connect) mayFind() bool {
	return slices.ContainsFunc(c.pool.awaits, func(t *upstreams.Provider) bool {
		return c.front.accepts(t) && (c.opts.Empty() || len(c.h.lacks(t, c.opts, c.cls.proto)) == 0)
	})
}

// usable names in the queue the providers of the handler a client of
// class cl can use: those of its pool (its protocol and Playwright
// version) that honour its session options, that its front accepts (a
// WebDriver create: those that start the browser it asks for), and that
// did not decline it. A waiter waits for these only, so it holds back no
// newcomer from a provider it could never take.
func (h *Gateway) usable(cl *class) []string {
	p := h.poolFor(cl)
	declined := cl.declined.Load()
	if cl.opts.Empty() && cl.accepts == nil && declined == nil {
		return p.resources
	}
	out := make([]string, 0, len(p.members))
	for j, i := range p.members {
		up := p.all[i].up
		if cl.accepts != nil && !cl.accepts(up) {
			continue
		}
		if declined != nil && (*declined)[p.resources[j]] {
			continue
		}
		if !cl.opts.Empty() && len(h.lacks(up, cl.opts, cl.proto)) > 0 {
			continue
		}
		out = append(out, p.resources[j])
	}
	return out
}

// wants is the handler's queue.WantsFunc: what a waiter moved here by a
// reload waits for: the providers of this handler it can use, with the
// options it stated (names the client chose, which mean here what this
// handler's providers say they honour; a waiter none of them can serve
// wants nothing, and is answered). One that waited for its client_limit
// share goes on waiting for it when this handler has the same limit;
// otherwise it is woken to go on.
func (h *Gateway) wants(cls any, before []string) ([]string, bool) {
	cl, ok := cls.(*class)
	if !ok {
		return nil, false
	}
	if cl.quota != "" && slices.Contains(before, cl.quota) {
		if h.ClientLimit != nil && h.ClientLimit.Key == cl.quotaTemplate {
			return before, false
		}
		return h.usable(cl), true
	}
	return h.usable(cl), false
}

// quotaKey is the client's client_limit key.
func (h *Gateway) quotaKey(replace func(string) string) pool.QuotaKey {
	k := pool.QuotaKey{Template: h.ClientLimit.Key}
	if replace != nil {
		k.Value = replace(h.ClientLimit.Key)
	}
	return k
}

// clientKind names what the client speaks, for messages.
func (c *connect) clientKind() string {
	return c.cls.kind()
}

func (cl *class) kind() string {
	switch cl.proto {
	case upstreams.ProtocolBiDi:
		return "WebDriver BiDi"
	case upstreams.ProtocolPlaywright:
	default:
		return "CDP"
	}
	if cl.pwVersion == "" {
		return "Playwright"
	}
	return "Playwright " + cl.pwVersion
}

// affinityKey extracts the affinity key of a request ("" when none).
func (h *Gateway) affinityKey(r *http.Request) string {
	a := h.Affinity
	if a == nil {
		return ""
	}
	switch a.Source {
	case "header":
		return r.Header.Get(a.Name)
	case "query":
		return r.URL.Query().Get(a.Name)
	case "cookie":
		if ck, err := r.Cookie(a.Name); err == nil {
			return ck.Value
		}
	}
	return ""
}

// attempt is one line of a client's way through the chain: a provider tried
// (or skipped) and how it went.
type attempt struct {
	Provider string  `json:"provider"`
	Outcome  string  `json:"outcome"`
	MS       float64 `json:"ms"`
}

// attempts renders as a zap array.
type attempts []attempt

func (as attempts) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	for _, a := range as {
		enc.AppendObject(a)
	}
	return nil
}

func (a attempt) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddString("provider", a.Provider)
	enc.AddString("outcome", a.Outcome)
	enc.AddFloat64("ms", a.MS)
	return nil
}

func roundMS(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Millisecond)*10) / 10
}

const (
	passNothing     passEnd = iota // every candidate failed or was skipped
	passEstablished                // a session runs
	passAnswered                   // the client got an answer (relayed 4xx, error)
	passClientGone                 // the client went away (or its wait ran out)
)

const (
	verdictNext    verdict = iota // go on with the next candidate
	verdictSuccess                // a session is to be established
	verdictRelay                  // the provider's answer goes to the client
	verdictGone                   // the client went away
)
