// Package status owns the admin API of browser_failover (module
// admin.api.browser_failover on Caddy's admin endpoint): the status JSON of
// every provider and queue, and the operator's drain, undrain and reset.
// It reads and changes only the process-wide pool, never a handler: the
// admin server is rebuilt before the apps of a new config are provisioned.
package status

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/pool"
)

func init() {
	caddy.RegisterModule(Admin{})
}

// Admin is the admin API module admin.api.browser_failover.
type Admin struct{}

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.browser_failover",
		New: func() caddy.Module { return new(Admin) },
	}
}

// Route patterns.
const (
	StatusPath    = "/browser_failover/status"
	ProvidersPath = "/browser_failover/providers/"
)

// Routes serves GET /browser_failover/status and
// POST /browser_failover/providers/<name>/{drain,undrain,reset}.
func (a Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: StatusPath, Handler: caddy.AdminHandlerFunc(a.handleStatus)},
		{Pattern: ProvidersPath, Handler: caddy.AdminHandlerFunc(a.handleProvider)},
	}
}

// Status is the whole status document served at StatusPath: every
// configured provider, the wait queue of every handler, and the client_limit
// keys in use.
type Status struct {
	Providers []Provider `json:"providers"`
	Queues    []Queue    `json:"queues"`
	// Clients are the client_limit keys with live sessions or waiters,
	// each shown hashed, never as its value.
	Clients []Client `json:"clients"`
}

// Client is one client_limit key value in use, counted over every handler
// and config load.
type Client struct {
	// Key is a short SHA-256 prefix of the value (pool.ShownKey), never
	// the value itself: it may be an API key.
	Key string `json:"key"`
	// Active is the value's live sessions.
	Active int `json:"active"`
	// Waiting is the value's clients queued because it is at its limit.
	Waiting int `json:"waiting"`
}

// Clients lists the client_limit key values with live sessions or waiters,
// ordered by key; never nil.
func Clients() []Client {
	rows := pool.Clients()
	out := make([]Client, 0, len(rows))
	for _, r := range rows {
		out = append(out, Client{Key: r.Key, Active: r.Active, Waiting: r.Waiting})
	}
	return out
}

// Queue is one handler's line in the wait queue.
type Queue struct {
	// Waiting counts its clients waiting now (including those of an
	// older config moved here by a reload).
	Waiting int `json:"waiting"`
	// Size is the most that may wait; 0 means the queue is off.
	Size      int      `json:"size"`
	TimeoutMS int64    `json:"timeout_ms"`
	Providers []string `json:"providers"`
}

// Queues lists every handler's line, oldest handler first.
func Queues() []Queue {
	out := []Queue{}
	for _, q := range pool.Queues() {
		ps := q.Providers
		if ps == nil {
			ps = []string{}
		}
		out = append(out, Queue{Waiting: q.Waiting, Size: q.Size, TimeoutMS: q.Timeout.Milliseconds(), Providers: ps})
	}
	return out
}

// Provider is one provider's status object.
type Provider struct {
	Name string `json:"name"`
	// URL is redacted: user info REDACTED@, query values REDACTED.
	URL      string `json:"url"`
	Healthy  bool   `json:"healthy"`
	Draining bool   `json:"draining"`
	Active   int64  `json:"active"`
	// MaxConcurrent 0 is unlimited.
	MaxConcurrent int64 `json:"max_concurrent"`
	// CooldownUntil is the end of the running cooldown or 408/429 skip,
	// null when none.
	CooldownUntil *time.Time `json:"cooldown_until"`
	// Attempts and Failures are totals since start or the last reset.
	Attempts int64 `json:"attempts"`
	Failures int64 `json:"failures"`
	// HandshakeMS is the moving average of handshake times (0: no sample).
	HandshakeMS float64 `json:"handshake_ms"`
	LastError   string  `json:"last_error"`
	// LastProbe is the provider's last active health check probe; null
	// when it was never probed.
	LastProbe *Probe `json:"last_probe"`
	// Capacity is what the last capacity probe said (a *Capacity, null
	// when its last probe failed or could not be read); absent when the
	// provider's health check reads no capacity.
	Capacity any `json:"capacity,omitempty"`
	// Cluster is the provider's cluster-wide state when gateway nodes
	// share it (state redis): a Cluster, or a ClusterUnavailable when the
	// shared state could not be read. It is what the provider's
	// pool.ClusterView returns; absent when the state is not shared.
	Cluster any `json:"cluster,omitempty"`
}

// Probe is the last probe of a provider's active health check.
type Probe struct {
	// At is when it started, in UTC.
	At time.Time `json:"at"`
	// Outcome is its outcome word: ok, refused, timeout, status_503 …
	Outcome string  `json:"outcome"`
	MS      float64 `json:"ms"`
}

// Capacity is what a provider said of its capacity at the last probe
// (browserless's /pressure).
type Capacity struct {
	Running int `json:"running"`
	Max     int `json:"max"`
	Queued  int `json:"queued"`
	// Full: the provider is skipped as full until a probe says otherwise.
	Full bool `json:"full"`
}

// Cluster is the "cluster" object of a provider whose state gateway nodes
// share: its live sessions over every node and per node, and the cooldown
// they all honour.
type Cluster struct {
	// Node is the name of the node that answered.
	Node string `json:"node"`
	// Active is the provider's live sessions, all nodes together.
	Active int `json:"active"`
	// Nodes maps each node holding live sessions of the provider to their
	// number; {} when none does.
	Nodes map[string]int `json:"nodes"`
	// CooldownUntil is the end of the shared cooldown, in UTC; null when
	// none runs.
	CooldownUntil *time.Time `json:"cooldown_until"`
}

// NewCluster builds the Cluster object seen by node: a nil nodes map shows
// as {}, a zero cooldownUntil as null.
func NewCluster(node string, active int, nodes map[string]int, cooldownUntil time.Time) Cluster {
	out := Cluster{Node: node, Active: active, Nodes: nodes}
	if out.Nodes == nil {
		out.Nodes = map[string]int{}
	}
	if !cooldownUntil.IsZero() {
		u := cooldownUntil.UTC()
		out.CooldownUntil = &u
	}
	return out
}

// ClusterUnavailable is the "cluster" object of a provider when node could
// not read the shared state. Error comes first so the object reads as it
// always has: {"error":...,"node":...}.
type ClusterUnavailable struct {
	// Error is always SharedStateUnavailable.
	Error string `json:"error"`
	// Node is the name of the node that answered.
	Node string `json:"node"`
}

// SharedStateUnavailable is the Error of a ClusterUnavailable.
const SharedStateUnavailable = "shared state unavailable"

// NewClusterUnavailable builds the ClusterUnavailable object of node.
func NewClusterUnavailable(node string) ClusterUnavailable {
	return ClusterUnavailable{Error: SharedStateUnavailable, Node: node}
}

// Snapshot returns the status of every provider (sorted by name) and queue.
func Snapshot() Status {
	st := Status{Providers: []Provider{}, Queues: Queues(), Clients: Clients()}
	for _, p := range pool.All() {
		st.Providers = append(st.Providers, Of(p))
	}
	return st
}

// Of returns one provider's status object.
func Of(p *pool.Provider) Provider {
	snap := p.Health.Snapshot()
	out := Provider{
		Name:          p.Name(),
		URL:           p.URL(),
		Healthy:       snap.Healthy,
		Draining:      p.Draining(),
		Active:        p.Active(),
		MaxConcurrent: p.MaxConcurrent(),
		Attempts:      snap.Attempts,
		Failures:      snap.Failures,
		LastError:     p.LastError(),
	}
	if !snap.Until.IsZero() {
		u := snap.Until.UTC()
		out.CooldownUntil = &u
	}
	if ms, ok := p.HandshakeMS(); ok {
		out.HandshakeMS = math.Round(ms*10) / 10
	}
	if r, ok := p.LastProbe(); ok {
		out.LastProbe = &Probe{At: r.At.UTC(), Outcome: r.Outcome, MS: math.Round(r.MS*10) / 10}
	}
	if p.ReadsCapacity() {
		var c *Capacity
		if r, ok := p.Capacity(); ok {
			c = &Capacity{Running: r.Running, Max: r.Max, Queued: r.Queued, Full: r.Full}
		}
		out.Capacity = c
	}
	if v := p.Cluster(); v != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		out.Cluster = v.ClusterStatus(ctx, p.Name())
		cancel()
	}
	return out
}

func (Admin) handleStatus(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return methodNotAllowed(w, "GET, HEAD")
	}
	return writeJSON(w, r, Snapshot())
}

// actions are what POST /browser_failover/providers/<name>/<action> does.
var actions = map[string]func(*pool.Provider){
	"drain":   func(p *pool.Provider) { p.SetDraining(true) },
	"undrain": func(p *pool.Provider) { p.SetDraining(false) },
	"reset": func(p *pool.Provider) {
		p.Reset()
		if v := p.Cluster(); v != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			v.ResetShared(ctx, p.Name())
			cancel()
		}
	},
}

func (Admin) handleProvider(w http.ResponseWriter, r *http.Request) error {
	rest := strings.TrimPrefix(r.URL.Path, ProvidersPath)
	i := strings.LastIndexByte(rest, '/')
	if i <= 0 {
		return notFound("want /browser_failover/providers/<name>/drain, undrain or reset")
	}
	name, action := rest[:i], rest[i+1:]
	do, ok := actions[action]
	if !ok {
		return notFound(fmt.Sprintf("unknown action %q: want drain, undrain or reset", action))
	}
	if r.Method != http.MethodPost {
		return methodNotAllowed(w, "POST")
	}
	p, ok := pool.Lookup(name)
	if !ok {
		return notFound(fmt.Sprintf("no provider named %q", name))
	}
	do(p)
	return writeJSON(w, r, Of(p))
}

func notFound(msg string) error {
	return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("%s", msg)}
}

func methodNotAllowed(w http.ResponseWriter, allow string) error {
	w.Header().Set("Allow", allow)
	return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method not allowed")}
}

func writeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if r.Method == http.MethodHead {
		return nil
	}
	_, err = w.Write(b)
	return err
}

// Interface guards.
var (
	_ caddy.Module      = (*Admin)(nil)
	_ caddy.AdminRouter = (*Admin)(nil)
)
