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

// Status is the whole status document (SPEC section 8).
type Status struct {
	Providers []Provider         `json:"providers"`
	Queues    []pool.QueueStatus `json:"queues"`
	// Clients are the client_limit keys with live sessions or waiters,
	// each shown hashed, never as its value.
	Clients []pool.ClientStatus `json:"clients"`
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
	// Cluster is the provider's cluster-wide state when gateway nodes
	// share it (state redis): live sessions over every node and per node.
	Cluster any `json:"cluster,omitempty"`
}

// Snapshot returns the status of every provider (sorted by name) and queue.
func Snapshot() Status {
	st := Status{Providers: []Provider{}, Queues: pool.Queues(), Clients: pool.Clients()}
	for _, p := range pool.All() {
		st.Providers = append(st.Providers, Of(p))
	}
	if st.Queues == nil {
		st.Queues = []pool.QueueStatus{}
	}
	for i := range st.Queues {
		if st.Queues[i].Providers == nil {
			st.Queues[i].Providers = []string{}
		}
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

// Interface guard.
var _ caddy.AdminRouter = Admin{}
