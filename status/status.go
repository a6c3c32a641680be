// Package status owns what operators see and do: the admin API of
// browser_failover (module admin.api.browser_failover on Caddy's admin
// endpoint) with the status JSON of every provider and queue, the
// operator's drain, undrain and reset, the live sessions list and ending a
// session; and the dashboard page (module
// http.handlers.browser_failover_dashboard), which serves the same JSON and
// actions on a site. It reads and changes only the process-wide pool, never
// a handler: the admin server is rebuilt before the apps of a new config
// are provisioned.
package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/spend"
)

func init() {
	caddy.RegisterModule(Admin{})
}

// Admin is the admin API module admin.api.browser_failover.
type Admin struct {
	// reg is the registry it serves; nil: the process's (pool.Current),
	// as when Caddy loads the module.
	reg *pool.Registry
}

// registry is the registry the admin API serves now.
func (a Admin) registry() *pool.Registry {
	if a.reg != nil {
		return a.reg
	}
	return pool.Current()
}

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
	// SessionsPath lists the live sessions; SessionsPath + "/<id>" is one.
	SessionsPath = "/browser_failover/sessions"
)

// Routes serves GET /browser_failover/status,
// POST /browser_failover/providers/<name>/{drain,undrain,reset},
// GET /browser_failover/sessions and DELETE /browser_failover/sessions/<id>,
// and the recordings (recordings.go): GET /browser_failover/recordings,
// GET and DELETE /browser_failover/recordings/<id>, and GET of its frames
// and videos; and the browser profiles (profiles.go): GET
// /browser_failover/profiles and DELETE /browser_failover/profiles/<id>.
func (a Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: StatusPath, Handler: caddy.AdminHandlerFunc(a.handleStatus)},
		{Pattern: ProvidersPath, Handler: caddy.AdminHandlerFunc(a.handleProvider)},
		{Pattern: SessionsPath, Handler: caddy.AdminHandlerFunc(a.handleSessions)},
		{Pattern: SessionsPath + "/", Handler: caddy.AdminHandlerFunc(a.handleSession)},
		{Pattern: RecordingsPath, Handler: caddy.AdminHandlerFunc(a.handleRecordings)},
		{Pattern: RecordingsPath + "/", Handler: caddy.AdminHandlerFunc(a.handleRecordings)},
		{Pattern: ProfilesPath, Handler: caddy.AdminHandlerFunc(a.handleProfiles)},
		{Pattern: ProfilesPath + "/", Handler: caddy.AdminHandlerFunc(a.handleProfiles)},
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
	// SharedStateUp is, when some provider's state is shared (state
	// redis), whether the shared state answered this read; absent
	// otherwise. While it is down the status still answers at once, with
	// the local figures.
	SharedStateUp *bool `json:"shared_state_up,omitempty"`
	// SharedState is, with shared state, how it is reached: its mode
	// (standalone, sentinel or cluster) and the address in use (the
	// master a Sentinel named; a cluster's seed addresses).
	SharedState *cluster.Endpoint `json:"shared_state,omitempty"`
	// Parked counts the sessions that may be resumed now (their clients
	// left them within the resume window), and Held those of them whose
	// provider connection is kept open.
	Parked Parked `json:"parked"`
}

// Parked counts this node's resumable sessions.
type Parked struct {
	Sessions int `json:"sessions"`
	Held     int `json:"held"`
}

// Client is one client_limit key value in use, counted over every handler
// and config load.
type Client struct {
	// Key is a keyed hash of the value (pool.Hashes.ShownKey: HMAC-SHA256 with
	// the deployment's own random secret), never the value itself: it may
	// be an API key.
	Key string `json:"key"`
	// Active is the value's live sessions.
	Active int `json:"active"`
	// Waiting is the value's clients queued because it is at its limit.
	Waiting int `json:"waiting"`
	// Spent is, under client_budget, what the key's sessions cost in its
	// window (ended ones, and this node's live ones so far), and Budget
	// that budget; both absent without client_budget.
	Spent  *float64 `json:"spent,omitempty"`
	Budget *float64 `json:"budget,omitempty"`
}

// Clients lists the client_limit key values with live sessions or waiters,
// ordered by key; never nil.
func Clients(reg *pool.Registry) []Client {
	if reg == nil {
		return []Client{}
	}
	rows := reg.Quotas.Counts()
	out := make([]Client, 0, len(rows))
	at := map[string]int{}
	for _, r := range rows {
		at[r.Key] = len(out)
		out = append(out, Client{Key: r.Key, Active: r.Active, Waiting: r.Waiting})
	}
	spends := reg.ClientBooks.Spends()
	for _, cs := range spends {
		spent, budget := roundCost(cs.Spent+cs.Accrued), cs.Budget
		i, ok := at[cs.Key]
		if !ok {
			if cs.Live == 0 && cs.Spent == 0 {
				continue
			}
			i = len(out)
			out = append(out, Client{Key: cs.Key, Active: cs.Live})
		}
		out[i].Spent, out[i].Budget = &spent, &budget
	}
	if len(spends) > 0 {
		sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	}
	return out
}

// Queue is one handler's line in the wait queue, and what an autoscaler
// reads of the handler.
type Queue struct {
	// Handler names the handler: its providers blocks' and providers'
	// names, joined by commas (#2, #3… after a name another handler has
	// too).
	Handler string `json:"handler"`
	// Waiting counts its clients waiting now (including those of an
	// older config moved here by a reload).
	Waiting int `json:"waiting"`
	// Size is the most that may wait; 0 means the queue is off.
	Size      int   `json:"size"`
	TimeoutMS int64 `json:"timeout_ms"`
	// Providers are the handler's providers: those that take new
	// sessions, then the found ones leaving.
	Providers []string `json:"providers"`
	// Scaling is the handler's load, for an autoscaler.
	Scaling Scaling `json:"scaling"`
}

// Scaling is one handler's load as an autoscaler reads it: clients
// waiting, live sessions, and the room its providers have.
type Scaling struct {
	// Waiting counts the handler's clients waiting in its queue.
	Waiting int `json:"waiting"`
	// Active counts the live sessions on the handler's providers, found
	// ones leaving included (warm sessions no client holds yet are not
	// counted).
	Active int64 `json:"active"`
	// Capacity is the sum of the limits of the handler's providers that
	// take clients (not drained, not leaving, not in a cooldown or
	// skip): max_concurrent, the cap learnt under max_concurrent auto,
	// or what a capacity probe read. A provider without a limit adds
	// nothing.
	Capacity int64 `json:"capacity"`
	// Utilization is (Active + Waiting) / Capacity; null when Capacity
	// is 0.
	Utilization *float64 `json:"utilization"`
}

// ScalingOf is the load of the handler whose queue is q.
func ScalingOf(q pool.QueueCount) Scaling {
	out := Scaling{Waiting: q.Waiting}
	for _, p := range q.Taking {
		out.Active += p.Slots.Active()
		if !p.Draining() && p.Health.Until().IsZero() {
			out.Capacity += p.Slots.Limit()
		}
	}
	for _, p := range q.Leaving {
		out.Active += p.Slots.Active()
	}
	if out.Capacity > 0 {
		u := math.Round(float64(out.Active+int64(out.Waiting))/float64(out.Capacity)*1e4) / 1e4
		out.Utilization = &u
	}
	return out
}

// Queues lists every handler's line, oldest handler first.
func Queues(reg *pool.Registry) []Queue {
	out := []Queue{}
	if reg == nil {
		return out
	}
	for _, q := range reg.Queues.Counts() {
		ps := q.Providers
		if ps == nil {
			ps = []string{}
		}
		out = append(out, Queue{Handler: q.Handler, Waiting: q.Waiting, Size: q.Size, TimeoutMS: q.Timeout.Milliseconds(),
			Providers: ps, Scaling: ScalingOf(q)})
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
	// FoundBy names the providers block that found the provider at run
	// time; absent for a configured provider.
	FoundBy string `json:"found_by,omitempty"`
	// Leaving: a found provider whose address left its source: it takes
	// no new session, and leaves the status once its last one ended.
	Leaving bool  `json:"leaving,omitempty"`
	Active  int64 `json:"active"`
	// MaxConcurrent 0 is unlimited (and with max_concurrent auto).
	MaxConcurrent int64 `json:"max_concurrent"`
	// MaxConcurrentLearned is, with max_concurrent auto, the cap learnt
	// from the provider's refusals (an *int64: null before the first);
	// absent for other providers.
	MaxConcurrentLearned any `json:"max_concurrent_learned,omitempty"`
	// Spend is what the provider's sessions cost in the current window.
	Spend Spend `json:"spend"`
	// CreateRate is the provider's create_rate and the starts this node
	// counted in its window; absent without one.
	CreateRate *CreateRate `json:"create_rate,omitempty"`
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
	// shared state could not be read, built from what the provider's
	// pool.ClusterView returns; absent when the state is not shared.
	Cluster any `json:"cluster,omitempty"`
	// Unreleased is, for a provider with a session API, the sessions it
	// created that are not released yet; absent for other providers.
	Unreleased *int64 `json:"unreleased,omitempty"`
	// Ledger is, for a provider with a session API once the ledger is
	// open, what the ledger of created sessions holds for it.
	Ledger *Ledger `json:"ledger,omitempty"`
	// Warm is, for a provider with warm sessions, how many are ready for
	// a client and how many are wanted; absent otherwise.
	Warm *Warm `json:"warm,omitempty"`
}

// Warm is a provider's warm sessions: ready now, and the target.
type Warm struct {
	Ready  int64 `json:"ready"`
	Target int64 `json:"target"`
}

// CreateRate is a provider's create_rate: at most N sessions started per
// second or minute (a sliding window), and Used, the starts this node
// counted in the window now (under state redis the window over every
// node decides; Used is this node's share of it).
type CreateRate struct {
	N    int    `json:"n"`
	Per  string `json:"per"`
	Used int    `json:"used"`
}

// Spend is what a provider's (or a client key's) sessions cost in the
// current calendar window (UTC): the window of its budget, or a day.
type Spend struct {
	// WindowStart is when the window began.
	WindowStart time.Time `json:"window_start"`
	// Spent is what the sessions that ended in the window cost (over
	// every node under shared state).
	Spent float64 `json:"spent"`
	// Accrued is what this node's live sessions cost so far.
	Accrued float64 `json:"accrued"`
	// Budget is the window's budget; null without one.
	Budget *float64 `json:"budget"`
}

// spendOf is a book's state as status shows it.
func spendOf(st spend.State) Spend {
	out := Spend{WindowStart: st.WindowStart.UTC(), Spent: roundCost(st.Spent), Accrued: roundCost(st.Accrued)}
	if st.Budget > 0 {
		b := st.Budget
		out.Budget = &b
	}
	return out
}

// roundCost rounds a cost to 1e-9 of a unit (0.3, not
// 0.30000000000000004).
func roundCost(v float64) float64 { return math.Round(v*1e9) / 1e9 }

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
	// CooldownUntil is the end of the shared cooldown or 408/429 skip, in
	// UTC; null when none runs.
	CooldownUntil *time.Time `json:"cooldown_until"`
	// OverLimit is how many live sessions the provider has above its
	// max_concurrent over every node (0 when within it, or unlimited).
	// Only after a node was cut off from the shared state longer than
	// its lease_ttl can it be above 0; no new session is admitted
	// anywhere until it is back at 0.
	OverLimit int `json:"over_limit"`
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

// clusterObject builds the "cluster" object of a provider limited to max
// live sessions from its state: a ClusterUnavailable when the shared state
// could not be read, else a Cluster, whose nil nodes map shows as {} and
// zero cooldown and skip ends as null.
func clusterObject(st cluster.ProviderState, max int64) any {
	if !st.Up {
		return ClusterUnavailable{Error: SharedStateUnavailable, Node: st.Node}
	}
	out := Cluster{Node: st.Node, Active: st.Active, Nodes: st.Nodes, OverLimit: cluster.OverLimit(st.Active, max)}
	if out.Nodes == nil {
		out.Nodes = map[string]int{}
	}
	if u := st.Hold.Until(); !u.IsZero() {
		u = u.UTC()
		out.CooldownUntil = &u
	}
	return out
}

// clusterReadTimeout bounds the status' read of the shared state: one
// call per store, whatever the number of providers.
const clusterReadTimeout = time.Second

// Snapshot returns the status of every provider (sorted by name) and queue
// of the registry reg (nil: none, an empty document).
func Snapshot(reg *pool.Registry) Status {
	st := Status{Providers: []Provider{}, Queues: Queues(reg), Clients: Clients(reg)}
	if reg == nil {
		return st
	}
	all := reg.All()
	clusters, up := readClusters(all)
	for _, p := range all {
		st.Providers = append(st.Providers, local(p, clusters))
	}
	st.SharedStateUp = up
	st.SharedState = endpoint(all)
	st.Parked.Sessions, st.Parked.Held = reg.Parked.Count()
	return st
}

// Of returns one provider's status object.
func Of(p *pool.ProviderState) Provider {
	clusters, _ := readClusters([]*pool.ProviderState{p})
	return local(p, clusters)
}

// readClusters reads the cluster-wide state of every provider whose state
// is shared: one bounded call per store, the stores at once. up is nil
// when no provider's state is shared, else whether every store answered.
func readClusters(ps []*pool.ProviderState) (map[string]cluster.ProviderState, *bool) {
	byView := map[pool.ClusterView][]string{}
	for _, p := range ps {
		if v := p.Cluster(); v != nil {
			byView[v] = append(byView[v], p.Name())
		}
	}
	if len(byView) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterReadTimeout)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := map[string]cluster.ProviderState{}
	allUp := true
	for v, names := range byView {
		wg.Go(func() {
			states, up := v.ClusterStates(ctx, names)
			mu.Lock()
			defer mu.Unlock()
			allUp = allUp && up
			for k, st := range states {
				out[k] = st
			}
		})
	}
	wg.Wait()
	return out, &allUp
}

// endpoint is how the first provider with shared state reaches it (every
// provider of a handler shares one store); nil without shared state.
func endpoint(ps []*pool.ProviderState) *cluster.Endpoint {
	for _, p := range ps {
		if v := p.Cluster(); v != nil {
			e := v.Endpoint()
			return &e
		}
	}
	return nil
}

// local builds a provider's status object from this node's figures, and
// its cluster object from clusters.
func local(p *pool.ProviderState, clusters map[string]cluster.ProviderState) Provider {
	snap := p.Health.Snapshot()
	out := Provider{
		Name:          p.Name(),
		URL:           p.URL(),
		Healthy:       snap.Healthy,
		Draining:      p.Draining(),
		FoundBy:       p.FoundBy(),
		Leaving:       p.Leaving(),
		Active:        p.Slots.Active(),
		MaxConcurrent: p.Slots.MaxConcurrent(),
		Attempts:      snap.Attempts,
		Failures:      snap.Failures,
		LastError:     p.Stats.LastError(),
		Spend:         spendOf(p.Spend.Book().Read()),
	}
	if r := p.Starts.Rate(); r.N > 0 {
		per := "minute"
		if r.Window == time.Second {
			per = "second"
		}
		out.CreateRate = &CreateRate{N: r.N, Per: per, Used: p.Starts.InWindow()}
	}
	if l := p.Slots.LearntCap(); l != nil {
		var learnt *int64
		if n := l.Cap(); n > 0 {
			learnt = &n
		}
		out.MaxConcurrentLearned = learnt
	}
	if !snap.Until.IsZero() {
		u := snap.Until.UTC()
		out.CooldownUntil = &u
	}
	if ms, ok := p.Stats.HandshakeMS(); ok {
		out.HandshakeMS = math.Round(ms*10) / 10
	}
	if r, ok := p.Probes.Last(); ok {
		out.LastProbe = &Probe{At: r.At.UTC(), Outcome: r.Outcome, MS: math.Round(r.MS*10) / 10}
	}
	if p.Probes.ReadsCapacity() {
		var c *Capacity
		if r, ok := p.Probes.Capacity(); ok {
			c = &Capacity{Running: r.Running, Max: r.Max, Queued: r.Queued, Full: r.Full}
		}
		out.Capacity = c
	}
	if ready, target := p.Warm(); target > 0 || ready > 0 {
		out.Warm = &Warm{Ready: ready, Target: target}
	}
	if b, ok := p.Books(); ok {
		n := b.Unreleased()
		out.Unreleased = &n
		if pending, ok := p.LedgerPending(); ok {
			out.Ledger = &Ledger{Pending: pending, Reaped: b.Reaped.Load()}
		}
	}
	if st, ok := clusters[p.Name()]; ok {
		out.Cluster = clusterObject(st, p.Slots.MaxConcurrent())
	}
	return out
}

func (a Admin) handleStatus(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return methodNotAllowed(w, "GET, HEAD")
	}
	return writeJSON(w, r, Snapshot(a.registry()))
}

// Ledger is a provider's part of the ledger of created sessions.
type Ledger struct {
	// Pending: entries not confirmed released, live sessions included,
	// and those a gone process left that this one has not taken yet.
	Pending int `json:"pending"`
	// Reaped: sessions a gone process left that this one released since
	// it started.
	Reaped int64 `json:"reaped"`
}

// actions are what POST /browser_failover/providers/<name>/<action> does.
var actions = map[string]func(*pool.ProviderState){
	"drain":   func(p *pool.ProviderState) { p.SetDraining(true) },
	"undrain": func(p *pool.ProviderState) { p.SetDraining(false) },
	"reset": func(p *pool.ProviderState) {
		p.Reset()
		if v := p.Cluster(); v != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			v.ResetShared(ctx, p.Name())
			cancel()
		}
	},
}

func (a Admin) handleProvider(w http.ResponseWriter, r *http.Request) error {
	rest := strings.TrimPrefix(r.URL.Path, ProvidersPath)
	i := strings.LastIndexByte(rest, '/')
	if i <= 0 {
		return notFound("want /browser_failover/providers/<name>/drain, undrain or reset")
	}
	name, action := rest[:i], rest[i+1:]
	if !IsAction(action) {
		return notFound(unknownAction(action))
	}
	if r.Method != http.MethodPost {
		return methodNotAllowed(w, "POST")
	}
	out, err := Act(a.registry(), name, action)
	if err != nil {
		return notFound(err.Error())
	}
	return writeJSON(w, r, out)
}

// ErrNotFound marks an unknown provider, action or session.
var ErrNotFound = errors.New("not found")

// IsAction tells whether action is one of drain, undrain and reset.
func IsAction(action string) bool {
	_, ok := actions[action]
	return ok
}

func unknownAction(action string) string {
	return fmt.Sprintf("unknown action %q: want drain, undrain or reset", action)
}

// Act runs an operator's action (drain, undrain or reset) on the provider
// called name and returns the provider's status object after it. An
// unknown action or provider is an ErrNotFound.
func Act(reg *pool.Registry, name, action string) (Provider, error) {
	do, ok := actions[action]
	if !ok {
		return Provider{}, fmt.Errorf("%w: %s", ErrNotFound, unknownAction(action))
	}
	var p *pool.ProviderState
	if reg != nil {
		p, ok = reg.Lookup(name)
	} else {
		ok = false
	}
	if !ok {
		return Provider{}, fmt.Errorf("%w: no provider named %q", ErrNotFound, name)
	}
	do(p)
	return Of(p), nil
}

// notFound is the admin API's 404; msg drops a leading "not found: ".
func notFound(msg string) error {
	msg = strings.TrimPrefix(msg, ErrNotFound.Error()+": ")
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
