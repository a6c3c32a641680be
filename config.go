package browserfailover

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Handler is the browser_failover HTTP handler. Its exported fields are the
// configuration (JSON and Caddyfile); docs/reference.md lists every option.
type Handler struct {
	// Strategy orders the providers: priority (default), round_robin,
	// least_conn, weighted, random or latency.
	Strategy string `json:"strategy,omitempty"`
	// ConnectTimeout bounds one attempt: TCP, TLS and the upgrade answer.
	// Default 10s.
	ConnectTimeout caddy.Duration `json:"connect_timeout,omitempty"`
	// TryDuration is the budget for all attempts of one pass; 0 is none.
	TryDuration caddy.Duration `json:"try_duration,omitempty"`
	// MaxAttempts is how many providers one pass tries; 0 is all.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// Providers in config order.
	Providers []*ProviderConfig `json:"providers,omitempty"`
	// Cooldown is the handler's health settings.
	Cooldown *CooldownConfig `json:"cooldown,omitempty"`
	// Queue is the wait queue.
	Queue *QueueConfig `json:"queue,omitempty"`
	// Session bounds sessions.
	Session *SessionConfig `json:"session,omitempty"`
	// Affinity sends the same key to the same provider.
	Affinity *AffinityConfig `json:"affinity,omitempty"`
	// Discovery answers /json/version for CDP clients; default on.
	Discovery *bool `json:"discovery,omitempty"`
	// Webhooks receive the handler's events as signed JSON POSTs.
	Webhooks []*observe.WebhookConfig `json:"webhooks,omitempty"`
	// ClientLimit caps the live sessions per client key.
	ClientLimit *ClientLimitConfig `json:"client_limit,omitempty"`
	// HedgeAfter starts the next candidate in parallel when the current
	// attempt has not answered within it; 0 (default) is off.
	HedgeAfter caddy.Duration `json:"hedge_after,omitempty"`
	// HedgeMax is the most attempts in flight at once while hedging;
	// default 2.
	HedgeMax int `json:"hedge_max,omitempty"`
	// State shares slots and cooldowns with other gateway nodes.
	State *StateConfig `json:"state,omitempty"`
	// HealthCheck probes every provider (a provider's own health_check
	// overrides it, or turns it off).
	HealthCheck *HealthCheckConfig `json:"health_check,omitempty"`
	// Keepalive pings a side of a session that has been sent nothing for
	// this long, and ends the session when that side answers none of two
	// pings; 0 (default) is off.
	Keepalive caddy.Duration `json:"keepalive,omitempty"`

	// handlerRuntime is what Provision builds; nothing of it is config.
	handlerRuntime
}

// ProviderConfig is one provider as configured (JSON key "providers").
type ProviderConfig struct {
	// Name is unique in the handler and keys the provider's state.
	Name string `json:"name"`
	// URL is ws://, wss://, http:// or https://; it may hold {env.X}
	// placeholders, resolved when the config is loaded.
	URL string `json:"url"`
	// Priority: lower is tried first; default 1; ties keep config order.
	Priority *int `json:"priority,omitempty"`
	// Weight for the weighted strategy; default 1.
	Weight int `json:"weight,omitempty"`
	// MaxConcurrent live sessions; 0 is unlimited.
	MaxConcurrent int `json:"max_concurrent,omitempty"`
	// ConnectTimeout overrides the handler's for this provider.
	ConnectTimeout caddy.Duration `json:"connect_timeout,omitempty"`
	// HeadersUp are header_up operations, applied in order.
	HeadersUp []HeaderOpConfig `json:"headers_up,omitempty"`
	// PassQuery merges the client's query into the provider URL's (the
	// provider's keys win).
	PassQuery bool `json:"pass_query,omitempty"`
	// Discover reads <url>/json/version on each connect and dials its
	// webSocketDebuggerUrl; default on for http(s) URLs.
	Discover *bool `json:"discover,omitempty"`
	// TLS options for wss:// and https:// URLs.
	TLS *TLSConfig `json:"tls,omitempty"`
	// Cooldown overrides the handler's cooldown settings.
	Cooldown *CooldownConfig `json:"cooldown,omitempty"`
	// Protocol is what the provider serves: cdp, playwright or any
	// (default). Clients are offered only providers that can serve them.
	Protocol string `json:"protocol,omitempty"`
	// PlaywrightVersion (major.minor) of a playwright provider; empty
	// serves any Playwright client version.
	PlaywrightVersion string `json:"playwright_version,omitempty"`
	// HealthCheck overrides the handler's health check, setting by
	// setting; {"off":true} turns it off for this provider.
	HealthCheck *HealthCheckConfig `json:"health_check,omitempty"`
}

// ClientLimitConfig caps the live sessions of one client key (JSON key
// "client_limit").
type ClientLimitConfig struct {
	// Key is a Caddy placeholder evaluated per request, typically
	// {http.auth.user.id} or {http.request.header.X-Api-Key}.
	Key string `json:"key"`
	// Limit is the most live sessions one key value may hold, at least 1.
	Limit int `json:"limit"`
}

// StateConfig makes several gateway nodes share provider state (JSON key
// "state"): live-session slots and cooldowns.
type StateConfig struct {
	// Redis is the shared store.
	Redis *RedisConfig `json:"redis,omitempty"`
	// Node names this gateway in the shared state and status; default
	// <hostname>-<pid>.
	Node string `json:"node,omitempty"`
	// OnUnavailable is what happens while the store cannot be reached:
	// "local" (default) falls back to this node's own limits, "reject"
	// refuses new sessions (503).
	OnUnavailable string `json:"on_unavailable,omitempty"`
}

// RedisConfig is how to reach the Redis server of the shared state.
type RedisConfig struct {
	// Address is host:port.
	Address string `json:"address"`
	// Username is the ACL user; empty for the default user.
	Username string `json:"username,omitempty"`
	// Password may hold {env.X}; never logged or shown.
	Password string `json:"password,omitempty"`
	// DB is the database number.
	DB int `json:"db,omitempty"`
	// KeyPrefix goes before every key; nodes sharing state use the same.
	// Default "browser_failover:".
	KeyPrefix string `json:"key_prefix,omitempty"`
	// TLS connects with TLS when set.
	TLS *TLSConfig `json:"tls,omitempty"`
	// LeaseTTL is how long a slot outlives a node that died; default 15s.
	LeaseTTL caddy.Duration `json:"lease_ttl,omitempty"`
	// Timeout bounds every Redis call; default 500ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`
}

// HeaderOpConfig is one header_up operation: op "set", "add" or "delete".
// Values may hold request placeholders.
type HeaderOpConfig struct {
	Op    string `json:"op"`
	Field string `json:"field"`
	Value string `json:"value,omitempty"`
}

// TLSConfig holds a provider's TLS options.
type TLSConfig struct {
	// InsecureSkipVerify accepts any certificate (tls_insecure_skip_verify).
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
	// ServerName is sent in SNI and verified (tls_server_name).
	ServerName string `json:"server_name,omitempty"`
	// TrustedCACertFiles are PEM files of the CAs to trust
	// (tls_trusted_ca_certs).
	TrustedCACertFiles []string `json:"trusted_ca_certs,omitempty"`
}

// CooldownConfig is the cooldown block (SPEC section 5); zero fields take
// the handler's value, then the defaults.
type CooldownConfig struct {
	// Duration is the first cooldown; default 30s.
	Duration caddy.Duration `json:"duration,omitempty"`
	// MaxDuration caps the doubling; default 5m.
	MaxDuration caddy.Duration `json:"max_duration,omitempty"`
	// Window is the failure-rate window; default 60s.
	Window caddy.Duration `json:"window,omitempty"`
	// FailureThreshold: cool down when failures/attempts exceed it, in
	// (0,1]; default 0.5.
	FailureThreshold float64 `json:"failure_threshold,omitempty"`
	// MinRequests is the attempts in the window before judging; default 3.
	MinRequests int `json:"min_requests,omitempty"`
}

func (c *CooldownConfig) toConfig() cooldown.Config {
	if c == nil {
		return cooldown.Config{}
	}
	return cooldown.Config{
		Duration:         time.Duration(c.Duration),
		MaxDuration:      time.Duration(c.MaxDuration),
		Window:           time.Duration(c.Window),
		FailureThreshold: c.FailureThreshold,
		MinRequests:      c.MinRequests,
	}
}

// QueueConfig is the wait queue (SPEC section 6).
type QueueConfig struct {
	// Size is how many clients may wait; default 100; 0 turns the queue
	// off (503 at once).
	Size *int `json:"size,omitempty"`
	// Timeout is the longest wait; default 30s.
	Timeout caddy.Duration `json:"timeout,omitempty"`
}

// SessionConfig bounds sessions (SPEC section 7).
type SessionConfig struct {
	// IdleTimeout closes a session without bytes either way for this
	// long; 0 is off.
	IdleTimeout caddy.Duration `json:"idle_timeout,omitempty"`
	// MaxDuration closes a session at this age; 0 is off.
	MaxDuration caddy.Duration `json:"max_duration,omitempty"`
}

// AffinityConfig sends the same key to the same provider while it can take
// it.
type AffinityConfig struct {
	// Source is header, query or cookie.
	Source string `json:"source"`
	// Name of the header, query parameter or cookie.
	Name string `json:"name"`
}

// Defaults.
const (
	defaultQueueSize    = 100
	defaultQueueTimeout = 30 * time.Second
	defaultPriority     = 1
)

var strategies = []string{
	upstreams.StrategyPriority, upstreams.StrategyRoundRobin, upstreams.StrategyLeastConn,
	upstreams.StrategyWeighted, upstreams.StrategyRandom, upstreams.StrategyLatency,
}

// check validates the configuration as loaded (JSON or Caddyfile). Every
// message names the provider and the problem, never a URL's secrets.
func (h *Handler) check() error {
	var errs []error
	if h.Strategy != "" && !contains(strategies, h.Strategy) {
		errs = append(errs, fmt.Errorf("unknown strategy %q (want one of %s)", h.Strategy, strings.Join(strategies, ", ")))
	}
	if h.ConnectTimeout < 0 {
		errs = append(errs, fmt.Errorf("connect_timeout must not be negative"))
	}
	if h.TryDuration < 0 {
		errs = append(errs, fmt.Errorf("try_duration must not be negative"))
	}
	if h.MaxAttempts < 0 {
		errs = append(errs, fmt.Errorf("max_attempts must not be negative, got %d", h.MaxAttempts))
	}
	if len(h.Providers) == 0 {
		errs = append(errs, errors.New("no providers: declare at least one provider"))
	}
	if err := checkCooldown("cooldown", h.Cooldown); err != nil {
		errs = append(errs, err)
	}
	if q := h.Queue; q != nil {
		if q.Size != nil && *q.Size < 0 {
			errs = append(errs, fmt.Errorf("queue size must not be negative, got %d", *q.Size))
		}
		if q.Timeout < 0 {
			errs = append(errs, fmt.Errorf("queue timeout must not be negative"))
		}
	}
	if s := h.Session; s != nil {
		if s.IdleTimeout < 0 || s.MaxDuration < 0 {
			errs = append(errs, fmt.Errorf("session idle_timeout and max_duration must not be negative"))
		}
	}
	if a := h.Affinity; a != nil {
		switch a.Source {
		case "header", "query", "cookie":
		default:
			errs = append(errs, fmt.Errorf("affinity source %q: want header, query or cookie", a.Source))
		}
		if a.Name == "" {
			errs = append(errs, fmt.Errorf("affinity needs a name"))
		}
	}
	if cl := h.ClientLimit; cl != nil {
		if !strings.Contains(cl.Key, "{") {
			errs = append(errs, fmt.Errorf("client_limit key %q: want a placeholder such as {http.auth.user.id}", cl.Key))
		}
		if cl.Limit < 1 {
			errs = append(errs, fmt.Errorf("client_limit must be at least 1, got %d", cl.Limit))
		}
	}
	if st := h.State; st != nil {
		switch {
		case st.Redis == nil:
			errs = append(errs, errors.New("state needs a backend: redis"))
		case st.Redis.Address == "":
			errs = append(errs, errors.New("state redis needs an address (host:port)"))
		case st.Redis.DB < 0:
			errs = append(errs, fmt.Errorf("state redis db must not be negative, got %d", st.Redis.DB))
		case st.Redis.LeaseTTL < 0 || st.Redis.Timeout < 0:
			errs = append(errs, errors.New("state redis lease_ttl and timeout must not be negative"))
		case st.Redis.LeaseTTL > 0 && st.Redis.Timeout > 0 && time.Duration(st.Redis.Timeout) >= time.Duration(st.Redis.LeaseTTL):
			errs = append(errs, errors.New("state redis timeout must be shorter than lease_ttl"))
		}
		switch st.OnUnavailable {
		case "", "local", "reject":
		default:
			errs = append(errs, fmt.Errorf("state on_unavailable %q: want local or reject", st.OnUnavailable))
		}
	}
	if h.HedgeAfter < 0 {
		errs = append(errs, fmt.Errorf("hedge_after must not be negative"))
	}
	if h.HedgeMax < 0 || h.HedgeMax == 1 {
		errs = append(errs, fmt.Errorf("hedge_max must be at least 2 (attempts in flight at once), got %d", h.HedgeMax))
	}
	if err := h.checkHealthChecks(); err != nil {
		errs = append(errs, err)
	}
	for i, wh := range h.Webhooks {
		if err := wh.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("webhook %d: %w", i+1, err))
		}
	}
	seen := map[string]bool{}
	for i, p := range h.Providers {
		if p == nil {
			errs = append(errs, fmt.Errorf("provider %d is empty", i))
			continue
		}
		if p.Name == "" {
			errs = append(errs, fmt.Errorf("provider %d has no name", i))
			continue
		}
		if seen[p.Name] {
			errs = append(errs, fmt.Errorf("duplicate provider name %q", p.Name))
		}
		seen[p.Name] = true
		if err := checkURL(p); err != nil {
			errs = append(errs, err)
		}
		if p.Weight < 0 {
			errs = append(errs, fmt.Errorf("provider %q: weight must be at least 1, got %d", p.Name, p.Weight))
		}
		if p.MaxConcurrent < 0 {
			errs = append(errs, fmt.Errorf("provider %q: max_concurrent must not be negative, got %d", p.Name, p.MaxConcurrent))
		}
		if p.ConnectTimeout < 0 {
			errs = append(errs, fmt.Errorf("provider %q: connect_timeout must not be negative", p.Name))
		}
		for _, op := range p.HeadersUp {
			switch op.Op {
			case "set", "add", "delete":
			default:
				errs = append(errs, fmt.Errorf("provider %q: header_up op %q: want set, add or delete", p.Name, op.Op))
			}
			if op.Field == "" {
				errs = append(errs, fmt.Errorf("provider %q: header_up needs a field name", p.Name))
			}
		}
		if err := checkCooldown(fmt.Sprintf("provider %q: cooldown", p.Name), p.Cooldown); err != nil {
			errs = append(errs, err)
		}
		proto, err := upstreams.ParseProtocol(p.Protocol)
		if err != nil {
			errs = append(errs, fmt.Errorf("provider %q: %w", p.Name, err))
		}
		if p.PlaywrightVersion != "" {
			if _, err := upstreams.ParsePlaywrightVersion(p.PlaywrightVersion); err != nil {
				errs = append(errs, fmt.Errorf("provider %q: %w", p.Name, err))
			} else if proto != upstreams.ProtocolPlaywright {
				errs = append(errs, fmt.Errorf("provider %q: playwright_version needs protocol playwright", p.Name))
			}
		}
	}
	return errors.Join(errs...)
}

func checkCooldown(where string, c *CooldownConfig) error {
	if c == nil {
		return nil
	}
	if math.IsNaN(c.FailureThreshold) || c.FailureThreshold < 0 || c.FailureThreshold > 1 {
		return fmt.Errorf("%s: failure_threshold must be in (0,1], got %v", where, c.FailureThreshold)
	}
	if c.MinRequests < 0 {
		return fmt.Errorf("%s: min_requests must not be negative, got %d", where, c.MinRequests)
	}
	if err := c.toConfig().Validate(); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	return nil
}

// checkURL checks a provider URL's form without resolving placeholders.
func checkURL(p *ProviderConfig) error {
	if p.URL == "" {
		return fmt.Errorf("provider %q: no URL", p.Name)
	}
	scheme, _, ok := strings.Cut(p.URL, "://")
	if !ok {
		return fmt.Errorf("provider %q: URL must start with ws://, wss://, http:// or https://", p.Name)
	}
	switch strings.ToLower(scheme) {
	case "ws", "wss":
		if p.Discover != nil && *p.Discover {
			return fmt.Errorf("provider %q: discover on needs an http:// or https:// URL", p.Name)
		}
	case "http", "https":
	default:
		return fmt.Errorf("provider %q: URL scheme %q is not one of ws, wss, http, https", p.Name, scheme)
	}
	if !strings.Contains(p.URL, "{") {
		if _, err := url.Parse(p.URL); err != nil {
			return fmt.Errorf("provider %q: invalid URL", p.Name)
		}
	}
	if p.TLS != nil && (strings.EqualFold(scheme, "ws") || strings.EqualFold(scheme, "http")) &&
		(p.TLS.InsecureSkipVerify || p.TLS.ServerName != "" || len(p.TLS.TrustedCACertFiles) > 0) {
		return fmt.Errorf("provider %q: TLS options need a wss:// or https:// URL", p.Name)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
