// Package config is the configuration of the browser_failover handler:
// one type per option that is both its JSON form and what the gateway
// runs on, each with its one validator, so that the Caddyfile (which
// calls the same validators at the line of each option) and JSON accept
// and reject exactly the same values.
package config

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/internal/conf"
	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/options"
	"github.com/browserfailover/caddy-browser-failover/spend"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Handler is the browser_failover HTTP handler: one WebSocket endpoint in
// front of several remote-browser providers. Its exported fields are the
// configuration, the same in JSON and in the Caddyfile (UnmarshalCaddyfile
// documents the Caddyfile syntax).
//
// An option left out takes its default. An option that is given must hold
// a valid value, in JSON as in the Caddyfile: where 0 is not a valid
// setting (a weight, a timeout that bounds something, a ratio, hedge_max),
// an explicit 0 is an error rather than a quiet default.
type Handler struct {
	// Strategy orders the providers for each upgrade: "priority" (lower
	// priority first, ties in config order), "round_robin", "least_conn",
	// "weighted", "random", "latency" or "cheapest" (by the cost of a
	// session of expected_duration, ties by priority). Default:
	// "priority".
	Strategy string `json:"strategy,omitempty"`
	// ConnectTimeout bounds one attempt at a provider: TCP connect, TLS
	// handshake, discovery and the upgrade answer. Must be positive.
	// Default: 10s.
	ConnectTimeout caddy.Duration `json:"connect_timeout,omitempty"`
	// TryDuration is the budget for all the attempts of one pass over the
	// providers; a pass stops trying new providers once it is spent.
	// Default: 0, no budget.
	TryDuration caddy.Duration `json:"try_duration,omitempty"`
	// MaxAttempts is how many providers one pass attempts at most
	// (providers skipped without an attempt do not count). Default: 0,
	// every provider.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// Providers are the remote-browser providers, in config order; at
	// least one, with unique names. Required.
	Providers []*ProviderConfig `json:"providers,omitempty"`
	// DynamicProviders are the handler's providers blocks: providers
	// found at run time through one of Caddy's dynamic upstream sources,
	// each address one provider named <name>/<host>:<port> with the
	// block's options. A handler has at least one provider or one
	// block. Default: none.
	DynamicProviders []*ProvidersConfig `json:"dynamic_providers,omitempty"`
	// Cooldown is when a failing provider is set aside, and for how long,
	// for every provider (each may override any of it). Default: the
	// defaults of each of its fields.
	Cooldown *CooldownConfig `json:"cooldown,omitempty"`
	// Queue is where clients wait while no provider can take them.
	// Default: 100 places, 30s longest wait.
	Queue *QueueConfig `json:"queue,omitempty"`
	// Session bounds how long a relayed session may last or stay idle.
	// Default: no bound.
	Session *SessionConfig `json:"session,omitempty"`
	// Affinity sends every upgrade carrying the same key to the same
	// provider while that provider can take it. Default: off.
	Affinity *AffinityConfig `json:"affinity,omitempty"`
	// Discovery answers GET and HEAD of .../json/version for CDP clients,
	// pointing them back at this endpoint. Default: true.
	Discovery *bool `json:"discovery,omitempty"`
	// Webhooks receive the handler's events (cooldown, recovered,
	// rejected) as signed JSON POSTs. Default: none.
	Webhooks []*observe.WebhookConfig `json:"webhooks,omitempty"`
	// ClientLimit caps the live sessions of each client key. Default: no
	// cap.
	ClientLimit *ClientLimitConfig `json:"client_limit,omitempty"`
	// ClientBudget caps what the sessions of each client key may cost in
	// one calendar window (UTC): a key whose ended sessions plus its live
	// ones' accrued cost reach it gets 429 until the window turns.
	// Default: none.
	ClientBudget *ClientBudgetConfig `json:"client_budget,omitempty"`
	// ExpectedDuration is how long a session is expected to last, for
	// the cheapest strategy, which orders providers by the cost of such a
	// session. Must be positive. Default: 5m.
	ExpectedDuration caddy.Duration `json:"expected_duration,omitempty"`
	// HedgeAfter starts the next candidate beside the current attempt when
	// that attempt has not answered within it; the first 101 wins.
	// Default: 0, no hedging.
	HedgeAfter caddy.Duration `json:"hedge_after,omitempty"`
	// HedgeMax is the most attempts in flight at once while hedging; at
	// least 2. Default: 2.
	HedgeMax int `json:"hedge_max,omitempty"`
	// State shares live-session slots and cooldowns with the other gateway
	// nodes using the same store. Default: each node keeps its own.
	State *StateConfig `json:"state,omitempty"`
	// ForwardHeaders names the client's handshake fields that reach the
	// providers besides Sec-WebSocket-Key, -Version, -Protocol,
	// -Extensions, User-Agent and x-playwright-* (case-insensitive; a
	// trailing "*" matches a prefix; hop-by-hop fields never go).
	// Everything else the client sent stays at the gateway. Default: none.
	ForwardHeaders []string `json:"forward_headers,omitempty"`
	// HealthCheck probes every provider (a provider's own health_check
	// overrides it, or turns it off). Default: no probes.
	HealthCheck *HealthCheckConfig `json:"health_check,omitempty"`
	// Keepalive pings a side of a session that has been sent nothing for
	// this long, and ends the session when that side answers none of two
	// pings. Default: 0, off.
	Keepalive caddy.Duration `json:"keepalive,omitempty"`
	// ReapInterval is how often the ledger of created provider sessions
	// is searched for sessions a gone process left behind, which are then
	// released (the process's smallest wins). Default: 1m.
	ReapInterval caddy.Duration `json:"reap_interval,omitempty"`
	// Resume lets a CDP client whose session ended from its side (its
	// close frame, or its connection dropping) take the same browser back
	// within a window, by its resume token. Default: off.
	Resume *ResumeConfig `json:"resume,omitempty"`
	// ResumeKey binds each resumable session to the value this
	// placeholder had for its client (e.g. {http.auth.user.id}): only a
	// client with the same value resumes it. Needs Resume. Default: none,
	// the session ID alone.
	ResumeKey string `json:"resume_key,omitempty"`

	// AllowedOrigins are the web-page origins whose upgrades are served
	// (scheme://host[:port], case-insensitive, the scheme's default port
	// implied; "null" for sandboxed and file:// pages; "*" for any page).
	// An upgrade that carries any other Origin header is refused with 403:
	// a browser sends one for every WebSocket a page opens, automation
	// clients send none. Default: none, every upgrade with an Origin is
	// refused.
	AllowedOrigins []string `json:"allowed_origins,omitempty"`

	// Recording records CDP sessions: those whose client stated the
	// session option record, or all of them. Default: off.
	Recording *RecordingConfig `json:"recording,omitempty"`

	// Profiles keeps each CDP client's browser profile (cookies and
	// localStorage), encrypted, and brings it to whichever provider serves
	// the client next: a client names its profile with the session option
	// profile. Default: off (a client naming a profile gets 400).
	Profiles *ProfilesConfig `json:"profiles,omitempty"`

	// stated holds the options stated explicitly.
	stated
}

// ProviderConfig is one remote-browser provider (JSON key "providers"):
// how to reach it and whom it serves (upstreams.Config: name, URL,
// priority, weight, connect_timeout, headers_up, pass_query, discover,
// tls, session_api, protocol, playwright_version), and what the handler
// does with it.
type ProviderConfig struct {
	upstreams.Config
	// MaxConcurrent is the most live sessions the provider takes; a full
	// provider is skipped without an attempt. A number (0: unlimited), or
	// "auto": the cap is learnt from the provider's own refusals (see
	// Concurrency). Default: 1 for a bidi provider (Firefox runs one
	// WebDriver BiDi session at a time), else 0, unlimited.
	MaxConcurrent Concurrency `json:"max_concurrent,omitzero"`
	// Cost is what the provider charges for a session; it is counted
	// on each session, in status and metrics, and budgets and the
	// cheapest strategy read it. Default: none, a session costs 0.
	Cost *spend.Cost `json:"cost,omitempty"`
	// Budget caps what the provider's sessions may cost in one calendar
	// window (UTC): once ended sessions plus the accrued cost of live
	// ones reach it, the provider is skipped (word "budget") until the
	// window turns; live sessions are never cut. Needs Cost. Default:
	// none.
	Budget *spend.Budget `json:"budget,omitempty"`
	// CreateRate caps how many sessions the gateway asks the provider to
	// start in a sliding window (every attempt that would start one:
	// a new client's, a hedge, a resume that dials again); over it the
	// provider is skipped (word "rate", not a failure) and clients wait
	// in the queue until the window admits one. Under state redis the
	// window is over every node. Default: none.
	CreateRate *CreateRateConfig `json:"create_rate,omitempty"`
	// Cooldown overrides any of the handler's cooldown settings for this
	// provider. Default: the handler's.
	Cooldown *CooldownConfig `json:"cooldown,omitempty"`
	// HealthCheck overrides the handler's health check, setting by
	// setting; {"off":true} turns it off for this provider. Default: the
	// handler's.
	HealthCheck *HealthCheckConfig `json:"health_check,omitempty"`
	// Warm keeps up to this many sessions opened ahead of demand, each
	// handed to a client at once (warm.go). They count as live sessions
	// do: in max_concurrent, leases, the ledger, cost and budget. Not for
	// playwright or webdriver providers. Default: 0, none.
	Warm int `json:"warm,omitempty"`
	// WarmMaxAge is how long a warm session waits for a client before it
	// is closed, released and replaced. Default: 5m.
	WarmMaxAge caddy.Duration `json:"warm_max_age,omitempty"`
	// WarmOptions are the session options the warm sessions are made
	// with, a JSON object of option names as a WebDriver client's
	// bf:options (region a name or list, the booleans true or false,
	// timeout a duration); the provider must honour them. A warm session
	// goes to a client that states no options or exactly these. Needs
	// warm. Default: none.
	WarmOptions json.RawMessage `json:"warm_options,omitempty"`

	stated
}

// CreateRateConfig is a provider's create_rate (JSON key "create_rate"):
// at most N sessions started per second or per minute, in a sliding
// window.
type CreateRateConfig struct {
	// N is the most sessions started in one window; at least 1.
	// Required.
	N int `json:"n"`
	// Per is the window: "second" or "minute". Required.
	Per string `json:"per"`
}

// validate checks the rate's form.
func (r *CreateRateConfig) Validate() error {
	if r == nil {
		return nil
	}
	var errs []error
	if r.N < 1 {
		errs = append(errs, conf.Problemf("create_rate", "create_rate must allow at least 1 session per window, got %d", r.N))
	}
	if r.Window() == 0 {
		errs = append(errs, conf.Problemf("create_rate", "create_rate per %q: want second or minute", r.Per))
	}
	return errors.Join(errs...)
}

// window is the length of the rate's sliding window (0: an unknown
// unit).
func (r *CreateRateConfig) Window() time.Duration {
	switch r.Per {
	case "second":
		return time.Second
	case "minute":
		return time.Minute
	}
	return 0
}

// ClientLimitConfig caps the live sessions of each client key (JSON key
// "client_limit").
type ClientLimitConfig struct {
	// Key is a placeholder evaluated per request whose value identifies
	// the client, such as {http.auth.user.id} or
	// {http.request.header.X-Api-Key}. Required.
	Key string `json:"key"`
	// Limit is the most live sessions one key value may hold; at least 1.
	// Required.
	Limit int `json:"limit"`
}

// ClientBudgetConfig caps what each client key's sessions may cost in one
// calendar window (JSON key "client_budget"): the amount and window of a
// spend.Budget, and the key.
type ClientBudgetConfig struct {
	// Key is a placeholder evaluated per request whose value identifies
	// the client, such as {http.auth.user.id}. Required.
	Key string `json:"key"`
	spend.Budget
}

// validate checks the client_budget option.
func (cb *ClientBudgetConfig) Validate() error {
	if cb == nil {
		return nil
	}
	var errs []error
	if !strings.Contains(cb.Key, "{") {
		errs = append(errs, conf.Problemf("client_budget", "client_budget key %q: want a placeholder such as {http.auth.user.id}", cb.Key))
	}
	if err := cb.Budget.Validate(); err != nil {
		errs = append(errs, conf.Problemf("client_budget", "client_%v", err))
	}
	return errors.Join(errs...)
}

// Concurrency is a provider's max_concurrent: a number of live sessions
// (0: unlimited), or "auto" (Auto), a cap learnt from the provider: a 429
// without Retry-After (or a capacity probe that says full) while n ≥ 1
// sessions are live sets the cap to n, and it rises by one at most once
// per cooldown duration while it is reached and no 429 comes.
type Concurrency struct {
	Limit int
	Auto  bool
}

// MarshalJSON writes the number, or "auto".
func (c Concurrency) MarshalJSON() ([]byte, error) {
	if c.Auto {
		return []byte(`"auto"`), nil
	}
	return json.Marshal(c.Limit)
}

// UnmarshalJSON reads a number, or "auto" (null changes nothing).
func (c *Concurrency) UnmarshalJSON(b []byte) error {
	if string(bytes.TrimSpace(b)) == "null" {
		return nil
	}
	var s string
	if json.Unmarshal(b, &s) == nil {
		if s != "auto" {
			return fmt.Errorf(`max_concurrent %q: want a number or "auto"`, s)
		}
		*c = Concurrency{Auto: true}
		return nil
	}
	var n int
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf(`max_concurrent: want a number or "auto"`)
	}
	*c = Concurrency{Limit: n}
	return nil
}

// StateConfig makes several gateway nodes share provider state (JSON key
// "state"): live-session slots and cooldowns.
type StateConfig struct {
	// Redis is the shared store. Required.
	Redis *RedisConfig `json:"redis,omitempty"`
	// Node names this gateway in the shared state and in status. Default:
	// <hostname>-<pid>.
	Node string `json:"node,omitempty"`
	// OnUnavailable is what happens while the store cannot be reached:
	// "local" falls back to this node's own limits, "reject" refuses new
	// sessions (503). Default: "local".
	OnUnavailable string `json:"on_unavailable,omitempty"`
}

// RedisConfig is how to reach the Redis server of the shared state: the
// settings of cluster.Config (address, username, password, db,
// key_prefix, tls, lease_ttl, timeout), which is also what the store runs
// with once the placeholders are resolved.
type RedisConfig struct {
	cluster.Config

	stated
}

// CooldownConfig is when a failing provider is set aside, and for how long
// (JSON key "cooldown", at handler level and per provider): the settings
// of cooldown.Config (duration, max_duration, window, failure_threshold,
// min_requests), which the provider's health machine runs with. A field
// left out takes the handler's value, then the default.
type CooldownConfig struct {
	cooldown.Config

	stated
}

// settings are the block's settings (none for a nil block).
func (c *CooldownConfig) Settings() cooldown.Config {
	if c == nil {
		return cooldown.Config{}
	}
	return c.Config
}

// QueueConfig is the wait queue (JSON key "queue"): clients that no
// provider can take now wait there, first come first served.
type QueueConfig struct {
	// Size is how many clients may wait; 0 turns the queue off (503 at
	// once). Not negative. Default: 100.
	Size *int `json:"size,omitempty"`
	// Timeout is the longest wait, then 503; must be positive. Default:
	// 30s.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	stated
}

// SessionConfig bounds relayed sessions (JSON key "session").
type SessionConfig struct {
	// IdleTimeout closes a session that carried no bytes either way for
	// this long; 0 is off. Default: 0.
	IdleTimeout caddy.Duration `json:"idle_timeout,omitempty"`
	// MaxDuration closes a session at this age; 0 is off. Default: 0.
	MaxDuration caddy.Duration `json:"max_duration,omitempty"`
}

// AffinityConfig sends every upgrade carrying the same key to the same
// provider while that provider can take it (JSON key "affinity").
type AffinityConfig struct {
	// Source is where the key is read: "header", "query" or "cookie".
	// Required.
	Source string `json:"source"`
	// Name of the header, query parameter or cookie. Required.
	Name string `json:"name"`
}

// Defaults.
const (
	DefaultQueueSize    = 100
	DefaultQueueTimeout = 30 * time.Second
	defaultPriority     = 1
	// DefaultExpectedDuration is the session the cheapest strategy prices.
	DefaultExpectedDuration = 5 * time.Minute
)

// Explicit is the set of options a config object states, by JSON key.
//
// For a number whose 0 is not a valid setting, JSON alone cannot tell
// "weight": 0 from a weight left out. The JSON decoder (from the keys
// present) and the Caddyfile parser (from the options read) both record
// what was stated, so validate rejects a stated 0 the same way in both,
// where a left-out option takes its default.
type Explicit map[string]bool

// has tells whether key was stated.
func (e Explicit) has(key string) bool { return e[key] }

// Add records key as stated.
func (e *Explicit) Add(key string) {
	if *e == nil {
		*e = Explicit{}
	}
	(*e)[key] = true
}

// stated is embedded in each config type whose validation tells a stated
// option from a left-out one: the handler's UnmarshalJSON fills it in
// every such part of the config (noteStated).
type stated struct {
	given Explicit
}

func (s *stated) setGiven(e Explicit) { s.given = e }

// Stated is where the options stated in this part of the config are
// recorded (the Caddyfile parser records each option it reads).
func (s *stated) Stated() *Explicit { return &s.given }

// UnmarshalJSON decodes the handler's config strictly (an unknown field is
// an error, as Caddy decodes module configs), then notes the options each
// of its parts states.
func (h *Handler) UnmarshalJSON(b []byte) error {
	type plain Handler
	if err := caddy.StrictUnmarshalJSON(b, (*plain)(h)); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			te.Struct = "Handler" // not the plain copy's name
		}
		return err
	}
	noteStated(b, reflect.ValueOf(h).Elem())
	return nil
}

// noteStated walks the JSON value b beside v, what it was decoded into:
// each struct that embeds stated gets the keys its object states with a
// value other than null (lowercased: encoding/json matches field names
// case-insensitively), and the walk goes on through its exported fields,
// slices and pointers.
func noteStated(b []byte, v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			noteStated(b, v.Elem())
		}
	case reflect.Slice:
		var items []json.RawMessage
		if json.Unmarshal(b, &items) == nil {
			for i := range min(len(items), v.Len()) {
				noteStated(items[i], v.Index(i))
			}
		}
	case reflect.Struct:
		var fields map[string]json.RawMessage
		if json.Unmarshal(b, &fields) != nil {
			return
		}
		keys := make(map[string]json.RawMessage, len(fields))
		var e Explicit
		for k, raw := range fields {
			if !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
				k = strings.ToLower(k)
				keys[k] = raw
				e.Add(k)
			}
		}
		if s, ok := v.Addr().Interface().(interface{ setGiven(Explicit) }); ok {
			s.setGiven(e)
		}
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			switch {
			case !f.IsExported() || name == "-":
			case f.Anonymous && name == "":
				// Its fields are the object's own.
				noteStated(b, v.Field(i))
			default:
				if name == "" {
					name = f.Name
				}
				if raw, ok := keys[strings.ToLower(name)]; ok {
					noteStated(raw, v.Field(i))
				}
			}
		}
	}
}

// MarshalJSON encodes a provider as the handler's UnmarshalJSON reads it
// back: a max_concurrent stated as 0 (unlimited) stays in the output,
// since left out it would take a bidi provider's default of 1 (the
// Caddyfile is adapted to JSON through this).
func (p *ProviderConfig) MarshalJSON() ([]byte, error) {
	type plain ProviderConfig
	b, err := json.Marshal((*plain)(p))
	if err != nil || p.MaxConcurrent != (Concurrency{}) || !p.given.has("max_concurrent") || len(b) < 2 {
		return b, err
	}
	out := append([]byte(`{"max_concurrent":0`), b[1:]...)
	if len(b) > 2 {
		out = append([]byte(`{"max_concurrent":0,`), b[1:]...)
	}
	return out, nil
}

// maxConcurrent is the provider's max_concurrent, its default applied (0:
// unlimited).
func (p *ProviderConfig) EffectiveMaxConcurrent() int {
	if p.MaxConcurrent == (Concurrency{}) && !p.given.has("max_concurrent") {
		if proto, _ := upstreams.ParseProtocol(p.Protocol); proto == upstreams.ProtocolBiDi {
			return 1
		}
	}
	return p.MaxConcurrent.Limit
}

// problems flattens err into its single problems (errors.Join nests).
func Problems(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, Problems(e)...)
		}
		return out
	}
	return []error{err}
}

// within puts prefix before the message of each problem in err, keeping
// which options are at fault.
func Within(prefix string, err error) error {
	var out []error
	for _, e := range Problems(err) {
		if p, ok := e.(*conf.Problem); ok {
			c := *p
			c.Msg = prefix + c.Msg
			out = append(out, &c)
		} else {
			out = append(out, fmt.Errorf("%s%w", prefix, e))
		}
	}
	return errors.Join(out...)
}

// positive checks a duration that must be positive when given: negative
// is always an error, and 0 is one when the option was stated.
func positive(given Explicit, key string, v caddy.Duration, what string) error {
	if v < 0 || (v == 0 && given[key]) {
		return conf.Problemf(key, "%s must be positive, got %v", what, time.Duration(v))
	}
	return nil
}

// notNegative checks a duration whose 0 means off.
func notNegative(key string, v caddy.Duration, what string) error {
	if v < 0 {
		return conf.Problemf(key, "%s must not be negative, got %v", what, time.Duration(v))
	}
	return nil
}

// Validate validates the configuration as loaded (JSON or Caddyfile): the
// handler's own options, then each part's. Every message names the
// provider and the problem, never a URL's secrets.
func (h *Handler) Validate() error {
	errs := []error{h.ValidateOwn(), h.CheckHealthChecks()}
	for i, p := range h.Providers {
		switch {
		case p == nil:
			errs = append(errs, fmt.Errorf("provider %d is empty", i+1))
		case p.Name == "":
			errs = append(errs, fmt.Errorf("provider %d has no name", i+1))
		default:
			errs = append(errs, p.Validate(), h.Cooldown.Clash(p))
		}
	}
	for i, b := range h.DynamicProviders {
		if b == nil {
			errs = append(errs, fmt.Errorf("providers block %d is empty", i+1))
			continue
		}
		errs = append(errs, b.Validate())
		if b.Name != "" {
			errs = append(errs, h.Cooldown.Clash(&b.ProviderConfig))
		}
	}
	errs = append(errs,
		Within("cooldown: ", h.Cooldown.Validate()),
		h.Queue.Validate(),
		h.Session.Validate(),
		h.Affinity.Validate(),
		h.ClientLimit.Validate(),
		h.ClientBudget.Validate(),
		h.State.Validate(),
		h.Recording.Validate(),
		h.Profiles.Validate(),
	)
	for i, wh := range h.Webhooks {
		if err := wh.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("webhook %d: %w", i+1, err))
		}
	}
	return errors.Join(errs...)
}

// ValidateOwn checks the handler's own options (not those of its parts):
// what the Caddyfile gives as one-line options at the handler's level, and
// the provider list as a whole.
func (h *Handler) ValidateOwn() error {
	var errs []error
	if h.Strategy != "" && !slices.Contains(upstreams.StrategyNames, h.Strategy) {
		errs = append(errs, conf.Problemf("strategy", "unknown strategy %q (want one of %s)",
			h.Strategy, strings.Join(upstreams.StrategyNames, ", ")))
	}
	errs = append(errs,
		positive(h.given, "connect_timeout", h.ConnectTimeout, "connect_timeout"),
		notNegative("try_duration", h.TryDuration, "try_duration"),
		notNegative("hedge_after", h.HedgeAfter, "hedge_after"),
		positive(h.given, "reap_interval", h.ReapInterval, "reap_interval"),
		positive(h.given, "expected_duration", h.ExpectedDuration, "expected_duration"),
	)
	if h.ExpectedDuration != 0 && h.Strategy != upstreams.StrategyCheapest {
		// Judged on the whole block: strategy may come after it.
		errs = append(errs, &conf.Problem{Msg: "expected_duration is for strategy cheapest", Options: []string{"expected_duration"}, Whole: true})
	}
	if h.MaxAttempts < 0 {
		errs = append(errs, conf.Problemf("max_attempts", "max_attempts must not be negative, got %d", h.MaxAttempts))
	}
	if (h.HedgeMax != 0 || h.given["hedge_max"]) && h.HedgeMax < 2 {
		errs = append(errs, conf.Problemf("hedge_max", "hedge_max must be at least 2 (attempts in flight at once), got %d", h.HedgeMax))
	}
	if err := upstreams.CheckForwardHeaders(h.ForwardHeaders); err != nil {
		errs = append(errs, conf.Problemf("forward_headers", "%v", err))
	}
	if err := ValidateOrigins(h.AllowedOrigins); err != nil {
		errs = append(errs, conf.Problemf("allowed_origins", "%v", err))
	}
	errs = append(errs, h.Resume.Validate(), h.ValidateResumeKey())
	if len(h.Providers) == 0 && len(h.DynamicProviders) == 0 {
		errs = append(errs, &conf.Problem{Msg: "no providers: declare at least one provider, or a providers block", Whole: true})
	}
	seen := map[string]bool{}
	for _, p := range h.Providers {
		if p == nil || p.Name == "" {
			continue
		}
		if seen[p.Name] {
			errs = append(errs, conf.Problemf("provider", "duplicate provider name %q", p.Name))
		}
		seen[p.Name] = true
	}
	return errors.Join(append(errs, h.foundNamesClash())...)
}

// foundNamesClash checks the names of the providers blocks: each given
// once, and none the start of a configured provider's name, which a
// provider found by it could then take (<name>/<host>:<port>).
func (h *Handler) foundNamesClash() error {
	var errs []error
	blocks := map[string]bool{}
	for _, b := range h.DynamicProviders {
		if b == nil || b.Name == "" {
			continue
		}
		if blocks[b.Name] {
			errs = append(errs, conf.Problemf("providers", "duplicate providers name %q", b.Name))
		}
		blocks[b.Name] = true
		for _, p := range h.Providers {
			if p != nil && strings.HasPrefix(p.Name, b.Name+"/") {
				errs = append(errs, &conf.Problem{Options: []string{"provider", "providers"},
					Msg: fmt.Sprintf("provider %q: its name clashes with the providers that providers %q finds (named %s/<host>:<port>)", p.Name, b.Name, b.Name)})
			}
		}
	}
	return errors.Join(errs...)
}

// validate checks a provider and its parts; every message starts with the
// provider's name.
func (p *ProviderConfig) Validate() error {
	if p.Name == "" {
		return conf.Problemf("name", "provider has no name")
	}
	return Within(fmt.Sprintf("provider %q: ", p.Name), p.validateOptions())
}

// validateOptions checks a provider's options and parts, its URL
// included; the caller says whose they are (a provider's, a providers
// block's).
func (p *ProviderConfig) validateOptions() error {
	errs := []error{p.Config.Validate(p.given.has)}
	if p.MaxConcurrent.Limit < 0 {
		errs = append(errs, conf.Problemf("max_concurrent", "max_concurrent must not be negative, got %d", p.MaxConcurrent.Limit))
	}
	if err := p.Cost.Validate(); err != nil {
		errs = append(errs, conf.Problemf("cost", "%v", err))
	}
	if err := p.Budget.Validate(); err != nil {
		errs = append(errs, conf.Problemf("budget", "%v", err))
	} else if p.Budget != nil && p.Cost == nil {
		// A cost given after it settles it.
		errs = append(errs, &conf.Problem{Options: []string{"budget"}, Whole: true,
			Msg: "budget needs cost: without a price the provider's sessions cost nothing"})
	}
	errs = append(errs, p.CreateRate.Validate(), Within("cooldown: ", p.Cooldown.Validate()))
	errs = append(errs, p.ValidateWarm())
	return errors.Join(errs...)
}

// clash checks a provider's cooldown override against the handler's
// cooldown c: the two merged must not cap the doubling below the first
// cooldown. (Each block alone is checked by its validate.)
func (c *CooldownConfig) Clash(p *ProviderConfig) error {
	o := p.Cooldown
	if c == nil || o == nil {
		return nil
	}
	d, dOwn := c.Duration, false
	if o.Duration > 0 {
		d, dOwn = o.Duration, true
	}
	m, mOwn := c.MaxDuration, false
	if o.MaxDuration > 0 {
		m, mOwn = o.MaxDuration, true
	}
	if d <= 0 || m <= 0 || m >= d || dOwn == mOwn {
		return nil
	}
	e := &CooldownClash{ownOpt: "duration"}
	if mOwn {
		e.ownOpt = "max_duration"
		e.msg = fmt.Sprintf("provider %q: cooldown: max_duration (%v) is shorter than the handler's cooldown duration (%v)",
			p.Name, time.Duration(m), time.Duration(d))
	} else {
		e.msg = fmt.Sprintf("provider %q: cooldown: duration (%v) is longer than the handler's cooldown max_duration (%v)",
			p.Name, time.Duration(d), time.Duration(m))
	}
	return e
}

// CooldownClash is a provider's cooldown option (ownOpt) that, merged with
// the handler's cooldown, leaves max_duration shorter than duration.
type CooldownClash struct {
	ownOpt string // the provider's option; the handler's is the other one
	msg    string
}

// OwnOpt is the provider's option at fault; the handler's is the other
// one (HandlerOpt).
func (e *CooldownClash) OwnOpt() string { return e.ownOpt }

func (e *CooldownClash) Error() string { return e.msg }

// HandlerOpt is the handler's cooldown option in the clash.
func (e *CooldownClash) HandlerOpt() string {
	if e.ownOpt == "duration" {
		return "max_duration"
	}
	return "duration"
}

// validate checks a cooldown block; messages name the option, the caller
// says whose block it is.
func (c *CooldownConfig) Validate() error {
	if c == nil {
		return nil
	}
	errs := []error{
		positive(c.given, "duration", c.Duration, "duration"),
		positive(c.given, "max_duration", c.MaxDuration, "max_duration"),
		positive(c.given, "window", c.Window, "window"),
	}
	// The negated test also catches NaN.
	if (c.FailureThreshold != 0 || c.given["failure_threshold"]) && !(c.FailureThreshold > 0 && c.FailureThreshold <= 1) {
		errs = append(errs, conf.Problemf("failure_threshold", "failure_threshold must be in (0,1], got %v", c.FailureThreshold))
	}
	if c.MinRequests < 0 {
		errs = append(errs, conf.Problemf("min_requests", "min_requests must not be negative, got %d", c.MinRequests))
	}
	if c.Duration > 0 && c.MaxDuration > 0 && c.MaxDuration < c.Duration {
		errs = append(errs, &conf.Problem{Options: []string{"duration", "max_duration"},
			Msg: fmt.Sprintf("max_duration (%v) is shorter than duration (%v)", time.Duration(c.MaxDuration), time.Duration(c.Duration))})
	}
	return errors.Join(errs...)
}

// validate checks the queue block.
func (q *QueueConfig) Validate() error {
	if q == nil {
		return nil
	}
	var errs []error
	if q.Size != nil && *q.Size < 0 {
		errs = append(errs, conf.Problemf("size", "queue size must not be negative, got %d", *q.Size))
	}
	errs = append(errs, positive(q.given, "timeout", q.Timeout, "queue timeout"))
	return errors.Join(errs...)
}

// validate checks the session block.
func (s *SessionConfig) Validate() error {
	if s == nil {
		return nil
	}
	return errors.Join(
		notNegative("idle_timeout", s.IdleTimeout, "session idle_timeout"),
		notNegative("max_duration", s.MaxDuration, "session max_duration"),
	)
}

// validate checks the affinity option.
func (a *AffinityConfig) Validate() error {
	if a == nil {
		return nil
	}
	var errs []error
	switch a.Source {
	case "header", "query", "cookie":
	default:
		errs = append(errs, conf.Problemf("affinity", "affinity source %q: want header, query or cookie", a.Source))
	}
	if a.Name == "" {
		errs = append(errs, conf.Problemf("affinity", "affinity needs a name"))
	}
	return errors.Join(errs...)
}

// validate checks the client_limit option.
func (cl *ClientLimitConfig) Validate() error {
	if cl == nil {
		return nil
	}
	var errs []error
	if !strings.Contains(cl.Key, "{") {
		errs = append(errs, conf.Problemf("client_limit", "client_limit key %q: want a placeholder such as {http.auth.user.id}", cl.Key))
	}
	if cl.Limit < 1 {
		errs = append(errs, conf.Problemf("client_limit", "client_limit must be at least 1, got %d", cl.Limit))
	}
	return errors.Join(errs...)
}

// validate checks the state block and its store's settings.
func (st *StateConfig) Validate() error {
	if st == nil {
		return nil
	}
	var errs []error
	if st.Redis == nil {
		errs = append(errs, conf.Problemf("state", "state needs a backend: redis"))
	}
	switch st.OnUnavailable {
	case "", "local", "reject":
	default:
		errs = append(errs, conf.Problemf("on_unavailable", "state on_unavailable %q: want local or reject", st.OnUnavailable))
	}
	errs = append(errs, Within("state ", st.Redis.Validate()))
	return errors.Join(errs...)
}

// validate checks the Redis settings without resolving placeholders.
func (r *RedisConfig) Validate() error {
	if r == nil {
		return nil
	}
	return r.Config.Validate(r.given.has)
}

// HealthCheckConfig is an active health check (JSON key "health_check"):
// the handler's, for every provider, and a provider's own, whose settings
// override the handler's one by one. Its settings are upstreams.ProbeOptions
// (uri, interval, timeout, expect_status, capacity).
type HealthCheckConfig struct {
	// Off, in a provider, turns the handler's health check off for it.
	Off bool `json:"off,omitempty"`
	upstreams.ProbeOptions

	// At is the Caddyfile's health_check token, for errors found once the
	// whole handler is read (nil for JSON); not part of the JSON form.
	At *caddyfile.Dispenser `json:"-"`
	stated
}

// validate checks the block's own values, each problem naming its
// setting (the Caddyfile parser reports it at that setting's line).
func (c *HealthCheckConfig) Validate() error {
	if c == nil {
		return nil
	}
	if c.Off {
		if c.ProbeOptions != (upstreams.ProbeOptions{}) || len(c.given) > 1 {
			return &conf.Problem{Msg: "health_check off takes no other setting", Whole: true}
		}
		return nil
	}
	return c.ProbeOptions.Validate(c.given.has)
}

// EffectiveHealthCheck merges a provider's health check over the
// handler's, with defaults; nil when the provider is not probed.
func EffectiveHealthCheck(handler, own *HealthCheckConfig) *HealthCheckConfig {
	if own != nil && own.Off {
		return nil
	}
	if handler == nil && own == nil {
		return nil
	}
	var c HealthCheckConfig
	if handler != nil {
		c = *handler
	}
	if own != nil {
		c.ProbeOptions = c.ProbeOptions.Merge(own.ProbeOptions)
	}
	c.ProbeOptions = c.ProbeOptions.WithDefaults()
	return &c
}

// CheckHealthChecks is check()'s part for health checks and keepalive:
// each block's values, and each provider's merged check against its URL.
func (h *Handler) CheckHealthChecks() error {
	var errs []error
	if h.Keepalive < 0 {
		errs = append(errs, errors.New("keepalive must not be negative"))
	}
	if hc := h.HealthCheck; hc != nil {
		if hc.Off {
			errs = append(errs, errors.New("health_check off is for a provider: it turns the handler's health check off for that provider"))
		} else if err := hc.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range h.Providers {
		if p == nil {
			continue
		}
		if err := p.HealthCheck.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("provider %q: %w", p.Name, err))
			continue
		}
		if err := CheckProbeTarget(p, EffectiveHealthCheck(h.HealthCheck, p.HealthCheck)); err != nil {
			errs = append(errs, err)
		}
	}
	for _, b := range h.DynamicProviders {
		if b == nil || b.Name == "" {
			continue
		}
		if err := b.HealthCheck.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("providers %q: %w", b.Name, err))
			continue
		}
		if b.Validate() != nil {
			continue // its own problems are the block's
		}
		errs = append(errs, b.CheckProbeTarget(EffectiveHealthCheck(h.HealthCheck, b.HealthCheck)))
	}
	return errors.Join(errs...)
}

// CheckProbeTarget checks a provider's merged health check: its settings
// together (a timeout from one block, an interval from the other), and
// that it has something to GET.
func CheckProbeTarget(p *ProviderConfig, hc *HealthCheckConfig) error {
	return Within(fmt.Sprintf("provider %q: ", p.Name), probeTarget(p, hc))
}

// probeTarget is CheckProbeTarget's check, its messages without whose.
func probeTarget(p *ProviderConfig, hc *HealthCheckConfig) error {
	if hc == nil {
		return nil
	}
	return errors.Join(hc.ProbeOptions.Validate(nil), upstreams.CheckProbeTarget(p.URL, p.Protocol, hc.ProbeOptions))
}

// ResumeConfig makes sessions resumable (JSON key "resume").
type ResumeConfig struct {
	// Window is how long a session that its client ended may be resumed.
	// Required, positive.
	Window caddy.Duration `json:"window"`
	// Hold keeps the provider connection open during the window, for
	// providers that end the browser when its connection closes. A held
	// session keeps its slot. Default: false.
	Hold bool `json:"hold,omitempty"`
}

func (rc *ResumeConfig) Validate() error {
	if rc == nil {
		return nil
	}
	if rc.Window <= 0 {
		return conf.Problemf("resume", "resume needs a positive window, got %s", time.Duration(rc.Window))
	}
	return nil
}

// ValidateResumeKey checks resume_key against resume.
func (h *Handler) ValidateResumeKey() error {
	if h.ResumeKey == "" {
		return nil
	}
	if h.Resume == nil {
		// Judged on the whole block: resume may come after it.
		return &conf.Problem{Msg: "resume_key binds resumable sessions to a key: it needs resume", Options: []string{"resume_key"}, Whole: true}
	}
	if !strings.Contains(h.ResumeKey, "{") {
		return conf.Problemf("resume_key", "resume_key must hold a placeholder (e.g. {http.auth.user.id}), got a constant")
	}
	return nil
}

// WarmSet reads warm_options (the zero Set when not given).
func (p *ProviderConfig) WarmSet() (options.Set, error) {
	if len(p.WarmOptions) == 0 {
		return options.Set{}, nil
	}
	return options.FromCapability(p.WarmOptions)
}

// ValidateWarm checks warm, warm_max_age and warm_options.
func (p *ProviderConfig) ValidateWarm() error {
	var errs []error
	if p.Warm < 0 {
		errs = append(errs, conf.Problemf("warm", "warm must not be negative, got %d", p.Warm))
	}
	if p.WarmMaxAge < 0 || (p.WarmMaxAge == 0 && p.given.has("warm_max_age")) {
		errs = append(errs, conf.Problemf("warm_max_age", "warm_max_age must be positive, got %v", time.Duration(p.WarmMaxAge)))
	}
	if len(p.WarmOptions) > 0 {
		if p.Warm <= 0 {
			errs = append(errs, conf.Problemf("warm_options", "warm_options needs warm"))
		} else if set, err := p.WarmSet(); err != nil {
			errs = append(errs, conf.Problemf("warm_options", "warm_options: %v", err))
		} else if set.Profile() != "" {
			errs = append(errs, conf.Problemf("warm_options", "warm_options: profile is a client's own: a warm session takes on the profile of the client it is handed to"))
		} else if lacks := (&options.Honours{Regions: p.Region, Supports: p.Supports}).Lacks(set); len(lacks) > 0 {
			errs = append(errs, &conf.Problem{Options: []string{"warm_options"}, Whole: true,
				Msg: "warm_options asks for what the provider does not honour (" + strings.Join(lacks, ", ") + "): add it to region or supports"})
		}
	}
	if p.Warm <= 0 {
		return errors.Join(errs...)
	}
	if proto, err := upstreams.ParseProtocol(p.Protocol); err == nil && (proto == upstreams.ProtocolPlaywright || proto == upstreams.ProtocolWebDriver) {
		// A protocol option given after it settles it.
		errs = append(errs, &conf.Problem{Options: []string{"warm"}, Whole: true,
			Msg: "warm does not apply to a " + string(proto) + " provider (" + map[upstreams.Protocol]string{
				upstreams.ProtocolPlaywright: "a Playwright client's version is in its own handshake",
				upstreams.ProtocolWebDriver:  "WebDriver sessions are created by the client's own request",
			}[proto] + ")"})
	}
	if m := p.MaxConcurrent.Limit; m > 0 && p.Warm > m {
		errs = append(errs, &conf.Problem{Options: []string{"warm"}, Whole: true,
			Msg: fmt.Sprintf("warm %d is more than max_concurrent %d: warm sessions count toward it", p.Warm, m)})
	}
	return errors.Join(errs...)
}

// RecordingConfig records CDP sessions (JSON key "recording"): the gateway
// takes part in each recorded session on the client's own connection,
// runs the screencast of every page the session opens, and keeps the
// frames in a storage (package recordings).
type RecordingConfig struct {
	// Sessions is which CDP sessions are recorded: "asked", those whose
	// client stated the session option record, or "all". Default:
	// "asked".
	Sessions string `json:"sessions,omitempty"`
	// Format is the frames' format: "jpeg" or "png". Default: "jpeg".
	Format string `json:"format,omitempty"`
	// Quality is the JPEG quality, 1 to 100 (jpeg only). Default: 70.
	Quality int `json:"quality,omitempty"`
	// MaxSize bounds a frame, "<width>x<height>" in pixels (16 to 4096
	// each): a larger page is scaled down to fit. Default: "1280x800".
	MaxSize string `json:"max_size,omitempty"`
	// EveryNthFrame keeps one frame of every n the page draws; at least
	// 1. Default: 1.
	EveryNthFrame int `json:"every_nth_frame,omitempty"`
	// MaxBytes is the most bytes of frames kept per session: capture
	// stops there (the recording says so). Positive. Default: 500 MiB.
	MaxBytes int64 `json:"max_bytes,omitempty"`
	// Retention deletes recordings that ended longer ago than this; 0
	// keeps them. Default: 7 days.
	Retention *caddy.Duration `json:"retention,omitempty"`
	// Storage is where recordings are kept: a Caddy storage module
	// (namespace caddy.storage, e.g. {"module":"file_system","root":…}).
	// Default: Caddy's own storage.
	Storage json.RawMessage `json:"storage,omitempty" caddy:"namespace=caddy.storage inline_key=module"`

	stated
}

// Recording defaults.
const (
	DefaultRecordingQuality   = 70
	DefaultRecordingMaxWidth  = 1280
	DefaultRecordingMaxHeight = 800
	DefaultRecordingMaxBytes  = 500 << 20
	DefaultRecordingRetention = 7 * 24 * time.Hour
)

// ParseSize reads a max_size, "<width>x<height>".
func ParseSize(s string) (w, h int, err error) {
	ws, hs, ok := strings.Cut(strings.ToLower(s), "x")
	if ok {
		w, err = strconv.Atoi(ws)
		if err == nil {
			h, err = strconv.Atoi(hs)
		}
	}
	if !ok || err != nil {
		return 0, 0, fmt.Errorf("max_size %q: want <width>x<height>, like 1280x800", s)
	}
	if w < 16 || h < 16 || w > 4096 || h > 4096 {
		return 0, 0, fmt.Errorf("max_size %q: width and height must be 16 to 4096 pixels", s)
	}
	return w, h, nil
}

// Validate checks the recording block.
func (rc *RecordingConfig) Validate() error {
	if rc == nil {
		return nil
	}
	var errs []error
	switch rc.Sessions {
	case "", "asked", "all":
	default:
		errs = append(errs, conf.Problemf("sessions", "recording sessions %q: want asked or all", rc.Sessions))
	}
	switch rc.Format {
	case "", "jpeg", "png":
	default:
		errs = append(errs, conf.Problemf("format", "recording format %q: want jpeg or png", rc.Format))
	}
	if (rc.Quality != 0 || rc.given.has("quality")) && (rc.Quality < 1 || rc.Quality > 100) {
		errs = append(errs, conf.Problemf("quality", "recording quality must be 1 to 100, got %d", rc.Quality))
	} else if rc.Quality != 0 && rc.Format == "png" {
		// A format given after it settles it.
		errs = append(errs, &conf.Problem{Options: []string{"quality"}, Whole: true,
			Msg: "recording quality is for jpeg frames: png frames are lossless"})
	}
	if rc.MaxSize != "" || rc.given.has("max_size") {
		if _, _, err := ParseSize(rc.MaxSize); err != nil {
			errs = append(errs, conf.Problemf("max_size", "recording %v", err))
		}
	}
	if (rc.EveryNthFrame != 0 || rc.given.has("every_nth_frame")) && rc.EveryNthFrame < 1 {
		errs = append(errs, conf.Problemf("every_nth_frame", "recording every_nth_frame must be at least 1, got %d", rc.EveryNthFrame))
	}
	if rc.MaxBytes < 0 || (rc.MaxBytes == 0 && rc.given.has("max_bytes")) {
		errs = append(errs, conf.Problemf("max_bytes", "recording max_bytes must be positive, got %d", rc.MaxBytes))
	}
	if rc.Retention != nil && *rc.Retention < 0 {
		errs = append(errs, conf.Problemf("retention", "recording retention must not be negative (0 keeps recordings), got %v", time.Duration(*rc.Retention)))
	}
	if len(rc.Storage) > 0 {
		var m struct {
			Module string `json:"module"`
		}
		if json.Unmarshal(rc.Storage, &m) != nil || m.Module == "" {
			errs = append(errs, conf.Problemf("storage", `recording storage: want a storage module object, like {"module":"file_system","root":"/var/lib/recordings"}`))
		}
	}
	return errors.Join(errs...)
}

// RecordsAll reports whether every CDP session is recorded (not only
// those whose client asked).
func (rc *RecordingConfig) RecordsAll() bool { return rc != nil && rc.Sessions == "all" }

// ProfilesConfig keeps browser profiles (JSON key "profiles"): a CDP
// client that names a profile (the session option profile) gets, in the
// browser's default context, the cookies and localStorage that its
// profile's last session left, whichever provider serves it; at the
// session's end they are read back and stored, encrypted, in a storage.
// One session uses a profile at a time.
type ProfilesConfig struct {
	// Key is the AES-256-GCM key the profiles are encrypted with: 32 bytes,
	// base64 (standard alphabet, padded or not). A placeholder such as
	// {env.PROFILES_KEY} is resolved, and checked, at provision. Required.
	Key string `json:"key,omitempty"`
	// Scope is whom a profile ID belongs to: a placeholder (such as
	// {http.auth.user.id}) resolved for each client; a profile is named by
	// its scope's value and its ID, so clients of different scope values
	// never share one. Default: none, one namespace for every client.
	Scope string `json:"scope,omitempty"`
	// Storage is where the profiles are kept: a Caddy storage module
	// (namespace caddy.storage, e.g. {"module":"file_system","root":…}).
	// Default: Caddy's own storage.
	Storage json.RawMessage `json:"storage,omitempty" caddy:"namespace=caddy.storage inline_key=module"`
	// MaxSize is the most bytes one profile may hold (its cookies and
	// storage, before encryption): a session's profile over it is not
	// stored (the profile stays as it was). Positive. Default: 10 MiB.
	MaxSize int64 `json:"max_size,omitempty"`
	// Wait is how long a client waits for its profile while another
	// session uses it; then it gets 409. Default: 0, no wait.
	Wait caddy.Duration `json:"wait,omitempty"`

	stated
}

// DefaultProfileMaxSize is a profile's max_size when not set.
const DefaultProfileMaxSize = 10 << 20

// ProfileKeySize is the size of a profile key: AES-256.
const ProfileKeySize = 32

// ParseProfileKey reads a profile key: base64 (standard alphabet, padded
// or not) of exactly 32 bytes. The error never holds the key.
func ParseProfileKey(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, errors.New("profiles key is empty")
	}
	k, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		k, err = base64.RawStdEncoding.DecodeString(s)
	}
	if err != nil {
		return nil, errors.New("profiles key is not base64 (make one with: openssl rand -base64 32)")
	}
	if len(k) != ProfileKeySize {
		return nil, fmt.Errorf("profiles key is %d bytes: want %d, base64 (make one with: openssl rand -base64 32)", len(k), ProfileKeySize)
	}
	return k, nil
}

// Validate checks the profiles block. A key given as a placeholder is
// checked once resolved, at provision.
func (pc *ProfilesConfig) Validate() error {
	if pc == nil {
		return nil
	}
	var errs []error
	switch {
	case strings.TrimSpace(pc.Key) == "":
		if pc.given.has("key") {
			errs = append(errs, conf.Problemf("key", "profiles key is empty"))
		} else {
			errs = append(errs, &conf.Problem{Options: []string{"key"}, Whole: true,
				Msg: "profiles needs a key: 32 bytes, base64 (make one with: openssl rand -base64 32), or a placeholder such as {env.PROFILES_KEY}"})
		}
	case !strings.Contains(pc.Key, "{"):
		if _, err := ParseProfileKey(pc.Key); err != nil {
			errs = append(errs, conf.Problemf("key", "%v", err))
		}
	}
	if pc.given.has("scope") && strings.TrimSpace(pc.Scope) == "" {
		errs = append(errs, conf.Problemf("scope", "profiles scope is empty: leave it out for one namespace"))
	}
	if pc.MaxSize < 0 || (pc.MaxSize == 0 && pc.given.has("max_size")) {
		errs = append(errs, conf.Problemf("max_size", "profiles max_size must be positive, got %d", pc.MaxSize))
	}
	errs = append(errs, notNegative("wait", pc.Wait, "profiles wait"))
	if len(pc.Storage) > 0 {
		var m struct {
			Module string `json:"module"`
		}
		if json.Unmarshal(pc.Storage, &m) != nil || m.Module == "" {
			errs = append(errs, conf.Problemf("storage", `profiles storage: want a storage module object, like {"module":"file_system","root":"/var/lib/profiles"}`))
		}
	}
	return errors.Join(errs...)
}
