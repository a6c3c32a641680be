package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
)

// WebDriver routes: a WebDriver session is driven by one HTTP request per
// command, which a load balancer may send to any node. Each session's
// route (where it lives at its provider, and whom it answers to) and its
// last activity are kept under <prefix>wd:{<key>}, a hash {route, at}:
// route is the Route as JSON, at the last activity in Unix milliseconds of
// Redis' clock (TIME). The key is the caller's name of the session: a
// keyed hash of the secret its client names it by, never the secret, so
// what Redis holds drives no session. It is the key's hash tag, so every
// call touches one slot. The key expires one ttl after the last Put or
// written Touch. The node that created the session owns its slot and its
// end; the others serve its commands and sockets (after checking, from
// the route, that the request may use it), and tell the owner
// (EventWebDriverEnd) when they saw it end.

// Route is where a WebDriver session lives, and which node owns it. It
// holds no credential: the provider's user, key and headers stay in each
// node's config, found by the provider's name, and a socket URL carrying
// user info is refused.
type Route struct {
	// Provider is the provider's name.
	Provider string `json:"provider"`
	// ProviderID is the provider's own ID of the session.
	ProviderID string `json:"provider_id"`
	// SocketURL is the provider-side BiDi WebSocket URL (its
	// webSocketUrl), if any.
	SocketURL string `json:"socket_url,omitempty"`
	// CDPURL is the provider-side CDP WebSocket URL (its se:cdp), if any.
	CDPURL string `json:"cdp_url,omitempty"`
	// Node is the node that created the session: it owns its slot and its
	// end.
	Node string `json:"node"`
	// Session is the session's ID as operators see it (logs, headers),
	// which never names it in a client's request.
	Session string `json:"session"`
	// Handlers are the keys of the handlers whose requests may use the
	// session: the one that made it, then those that reloads moved it to
	// (the last few).
	Handlers []string `json:"handlers"`
	// Keys are the client key placeholders the session is bound to
	// (none: any client of that handler), and Client a keyed hash of
	// what they resolved to for the client that made it.
	Keys   []string `json:"keys,omitempty"`
	Client string   `json:"client,omitempty"`
}

// Bounds of what a route holds, written and read back.
const (
	maxRouteBytes = 8 << 10 // a route's JSON
	maxRouteID    = 128     // the route's key, the operator's session ID, a handler key, a client hash
	maxRouteName  = 256     // a provider's name, a node's name, a provider's session ID
	maxRouteURL   = 2048    // a socket URL
	maxRouteKeys  = 4       // client key placeholders, handler keys
	maxRouteKey   = 512     // one placeholder
)

// touchEvery is the granularity of the last activity: Touch writes at
// most once per this per session.
const touchEvery = time.Second

// ErrBadRoute is wrapped by the errors of a route that is not one: given
// to Put, or found in Redis (foreign or corrupt). The error names the
// field and the problem, never the value.
var ErrBadRoute = errors.New("not a WebDriver route")

// Routes are the WebDriver sessions' routes kept in Redis, for every node
// to serve any session's commands and sockets, and their last activity,
// on Redis' clock. It is safe for concurrent use.
type Routes struct {
	c *conn
	// mu guards touched (when this node last wrote each session's
	// activity, on its clock) and swept (when touched was last pruned).
	mu      sync.Mutex
	touched map[string]time.Time
	swept   time.Time
}

func newRoutes(c *conn) *Routes { return &Routes{c: c, touched: map[string]time.Time{}} }

func (c *conn) routeKey(id string) string { return c.cfg.KeyPrefix + "wd:{" + id + "}" }

// Put keeps rt as the route of the session id (the caller's key of it)
// for ttl, refreshed by Touch, and notes the session active now. An empty
// rt.Node is this node. A bad id or route is refused (ErrBadRoute);
// errors from Redis wrap ErrUnavailable.
func (r *Routes) Put(ctx context.Context, id string, rt Route, ttl time.Duration) error {
	const op = "keep a WebDriver route"
	if rt.Node == "" {
		rt.Node = r.c.node
	}
	if err := checkRouteID(id); err != nil {
		return err
	}
	if err := rt.check(); err != nil {
		return err
	}
	if ttl < time.Millisecond {
		return fmt.Errorf("%w: ttl %v is not positive", ErrBadRoute, ttl)
	}
	// Escaped, the fields may outgrow the bound on read.
	b, _ := json.Marshal(rt)
	if len(b) > maxRouteBytes {
		return fmt.Errorf("%w: %d bytes of JSON, over %d", ErrBadRoute, len(b), maxRouteBytes)
	}
	c := r.c
	if c.closed.Load() {
		return c.fail(op, errClosed)
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	if err := putRouteScript.Run(ctx, c.rdb, []string{c.routeKey(id)}, string(b), ttl.Milliseconds()).Err(); err != nil {
		return c.fail(op, err)
	}
	// Written as active now: no Touch needed for a second.
	r.mu.Lock()
	r.touched[id] = c.now()
	r.mu.Unlock()
	return nil
}

// Get returns the route of the session id. ok is false when there is
// none. Fields this version does not know are ignored; a value that is not a route (foreign, corrupt, too large) is not
// found either, with an error wrapping ErrBadRoute for the caller to log,
// and is left as it is. Errors from Redis wrap ErrUnavailable.
func (r *Routes) Get(ctx context.Context, id string) (rt Route, ok bool, err error) {
	const op = "read a WebDriver route"
	if err := checkRouteID(id); err != nil {
		return Route{}, false, err
	}
	c := r.c
	if c.closed.Load() {
		return Route{}, false, c.fail(op, errClosed)
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	res, err := getRouteScript.Run(ctx, c.rdb, []string{c.routeKey(id)}, maxRouteBytes).Slice()
	if errors.Is(err, redis.Nil) {
		return Route{}, false, nil
	}
	if err != nil {
		return Route{}, false, c.fail(op, err)
	}
	code, v := scriptAnswer(res)
	switch code {
	case answerValue:
	case answerTooLarge:
		return Route{}, false, fmt.Errorf("%w: the route of session %q is over %d bytes", ErrBadRoute, id, maxRouteBytes)
	default:
		return Route{}, false, fmt.Errorf("%w: the key of session %q holds something else", ErrBadRoute, id)
	}
	if err := json.Unmarshal([]byte(v), &rt); err != nil {
		return Route{}, false, fmt.Errorf("%w: the route of session %q is not JSON", ErrBadRoute, id)
	}
	if err := rt.check(); err != nil {
		return Route{}, false, fmt.Errorf("session %q: %w", id, err)
	}
	return rt, true, nil
}

// Touch notes activity on the session id (a command or a socket served)
// and extends its route to ttl from now. It is cheap to call on every
// command: it writes at most once a second per session on this node (by
// Config.Clock), and returns nil at once otherwise. A route that is gone
// is not brought back. A write that failed is tried again at the next
// call. Errors from Redis wrap ErrUnavailable.
func (r *Routes) Touch(ctx context.Context, id string, ttl time.Duration) error {
	const op = "note a WebDriver session's activity"
	if err := checkRouteID(id); err != nil {
		return err
	}
	if ttl < time.Millisecond {
		return fmt.Errorf("%w: ttl %v is not positive", ErrBadRoute, ttl)
	}
	c := r.c
	if c.closed.Load() {
		return c.fail(op, errClosed)
	}
	now := c.now()
	if !r.due(id, now) {
		return nil
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	if err := touchRouteScript.Run(ctx, c.rdb, []string{c.routeKey(id)}, ttl.Milliseconds()).Err(); err != nil {
		r.mu.Lock()
		if r.touched[id].Equal(now) {
			delete(r.touched, id) // not written: the next call tries
		}
		r.mu.Unlock()
		return c.fail(op, err)
	}
	return nil
}

// due reports whether the activity of id is to be written at now, and if
// so notes it written. What was written over a second ago is forgotten
// (once a second), so the notes are of the sessions served lately only.
func (r *Routes) due(id string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if last, ok := r.touched[id]; ok {
		// A clock that went back does not hold the writes off.
		if d := now.Sub(last); d >= 0 && d < touchEvery {
			return false
		}
	}
	if d := now.Sub(r.swept); d >= touchEvery || d < 0 {
		for k, t := range r.touched {
			if d := now.Sub(t); d >= touchEvery || d < 0 {
				delete(r.touched, k)
			}
		}
		r.swept = now
	}
	r.touched[id] = now
	return true
}

// Idle returns how long the session id has had no activity (since its
// Put or the last written Touch), measured on Redis' clock, so that the
// owner's idle timer never compares two nodes' clocks. As Touch writes
// once a second, it may be up to about a second more than the truth. ok
// is false when the session has no route; a corrupt activity is not found
// either, with an error wrapping ErrBadRoute. Errors from Redis wrap
// ErrUnavailable.
func (r *Routes) Idle(ctx context.Context, id string) (idle time.Duration, ok bool, err error) {
	const op = "read a WebDriver session's activity"
	if err := checkRouteID(id); err != nil {
		return 0, false, err
	}
	c := r.c
	if c.closed.Load() {
		return 0, false, c.fail(op, errClosed)
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	res, err := idleRouteScript.Run(ctx, c.rdb, []string{c.routeKey(id)}).Slice()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, c.fail(op, err)
	}
	code, v := scriptAnswer(res)
	ms, perr := strconv.ParseInt(v, 10, 64)
	if code != answerValue || perr != nil || ms < 0 {
		return 0, false, fmt.Errorf("%w: the activity of session %q is unreadable", ErrBadRoute, id)
	}
	return time.Duration(ms) * time.Millisecond, true, nil
}

// Drop deletes the route of the session id, once it ended. Errors from
// Redis wrap ErrUnavailable.
func (r *Routes) Drop(ctx context.Context, id string) error {
	const op = "drop a WebDriver route"
	if err := checkRouteID(id); err != nil {
		return err
	}
	r.mu.Lock()
	delete(r.touched, id)
	r.mu.Unlock()
	c := r.c
	if c.closed.Load() {
		return c.fail(op, errClosed)
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	if err := c.rdb.Del(ctx, c.routeKey(id)).Err(); err != nil {
		return c.fail(op, err)
	}
	return nil
}

// AnnounceWebDriverEnd tells every node that the WebDriver session id
// (its route's key) ended as seen here, a node that does not own it (the client's DELETE
// forwarded, or the provider's "invalid session id"):
// EventWebDriverEnd, on which the owner ends it. Errors wrap
// ErrUnavailable.
func (n *News) AnnounceWebDriverEnd(ctx context.Context, id string) error {
	if err := checkRouteID(id); err != nil {
		return err
	}
	return n.publish(ctx, "announce a WebDriver session's end", wireEvent{Kind: EventWebDriverEnd, Node: n.c.node, Session: id})
}

// AnnounceWebDriverEnded tells every node that the WebDriver session id,
// owned here, has ended: EventWebDriverEnded, on which the nodes serving
// its sockets close them. Errors wrap ErrUnavailable.
func (n *News) AnnounceWebDriverEnded(ctx context.Context, id string) error {
	if err := checkRouteID(id); err != nil {
		return err
	}
	return n.publish(ctx, "announce a WebDriver session ended", wireEvent{Kind: EventWebDriverEnded, Node: n.c.node, Session: id})
}

// The codes of the route scripts' answers, {code, value}.
const (
	answerForeign  = 0 // the key holds something else
	answerValue    = 1 // value is what was asked for
	answerTooLarge = 2 // the route is over the bound: not sent
)

// scriptAnswer reads the {code, value} answer of the route scripts.
func scriptAnswer(res []any) (code int64, v string) {
	if len(res) != 2 {
		return answerForeign, ""
	}
	code, _ = res[0].(int64)
	switch x := res[1].(type) {
	case string:
		return code, x
	case int64:
		return code, strconv.FormatInt(x, 10)
	}
	return answerForeign, ""
}

// checkRouteID checks a route's key (or another ID a route holds):
// printable ASCII without spaces, and no braces, so that it is the key's
// hash tag as a whole.
func checkRouteID(id string) error {
	if id == "" || len(id) > maxRouteID {
		return fmt.Errorf("%w: a session ID has 1 to %d bytes", ErrBadRoute, maxRouteID)
	}
	for i := 0; i < len(id); i++ {
		if b := id[i]; b <= ' ' || b >= 0x7f || b == '{' || b == '}' {
			return fmt.Errorf("%w: a session ID is printable ASCII without spaces or braces", ErrBadRoute)
		}
	}
	return nil
}

// check checks a route as it is written and as it is read back: names
// without control bytes, an ID without spaces either, WebSocket URLs
// without user info, every size bounded.
func (rt Route) check() error {
	bad := func(field, problem string) error { return fmt.Errorf("%w: %s %s", ErrBadRoute, field, problem) }
	ids := []struct{ name, v string }{{"session", rt.Session}, {"client", rt.Client}}
	if len(rt.Handlers) > maxRouteKeys {
		return bad("handlers", fmt.Sprintf("has over %d keys", maxRouteKeys))
	}
	for _, k := range rt.Handlers {
		if k == "" {
			return bad("handlers", "has an empty key")
		}
		ids = append(ids, struct{ name, v string }{"handlers", k})
	}
	for _, f := range ids {
		if f.v == "" {
			continue // the caller's to require
		}
		if err := checkRouteID(f.v); err != nil {
			return bad(f.name, "is not 1 to "+strconv.Itoa(maxRouteID)+" bytes of printable ASCII without spaces or braces")
		}
	}
	if len(rt.Keys) > maxRouteKeys {
		return bad("keys", fmt.Sprintf("has over %d placeholders", maxRouteKeys))
	}
	if (len(rt.Keys) == 0) != (rt.Client == "") {
		return bad("client", "and keys are not given together")
	}
	for _, k := range rt.Keys {
		if k == "" || len(k) > maxRouteKey || !cleanText(k, true) {
			return bad("keys", fmt.Sprintf("has a placeholder that is empty, over %d bytes or with control bytes", maxRouteKey))
		}
	}
	for _, f := range []struct {
		name, v string
		spaces  bool
	}{{"provider", rt.Provider, true}, {"provider_id", rt.ProviderID, false}, {"node", rt.Node, true}} {
		switch {
		case f.v == "":
			return bad(f.name, "is empty")
		case len(f.v) > maxRouteName:
			return bad(f.name, fmt.Sprintf("is over %d bytes", maxRouteName))
		case !cleanText(f.v, f.spaces):
			return bad(f.name, "has control bytes, spaces or invalid UTF-8")
		}
	}
	for _, f := range []struct{ name, v string }{{"socket_url", rt.SocketURL}, {"cdp_url", rt.CDPURL}} {
		if f.v == "" {
			continue
		}
		if len(f.v) > maxRouteURL {
			return bad(f.name, fmt.Sprintf("is over %d bytes", maxRouteURL))
		}
		if !cleanText(f.v, false) {
			return bad(f.name, "has control bytes, spaces or invalid UTF-8")
		}
		u, err := url.Parse(f.v)
		switch {
		case err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "":
			return bad(f.name, "is not a ws:// or wss:// URL")
		case u.User != nil:
			// Credentials are never kept in Redis.
			return bad(f.name, "has user info")
		}
	}
	return nil
}

// cleanText reports whether s is valid UTF-8 without control characters,
// and without spaces unless spaces.
func cleanText(s string, spaces bool) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < ' ' || (r >= 0x7f && r < 0xa0) || (r == ' ' && !spaces) || r == '\u2028' || r == '\u2029' {
			return false
		}
	}
	return true
}

// putRouteScript writes the route ARGV[1] of KEYS[1], active now, to
// expire in ARGV[2] ms.
var putRouteScript = redis.NewScript(luaNow + `
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'route', ARGV[1], 'at', now)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

// touchRouteScript notes KEYS[1] active now and has it expire in ARGV[1]
// ms, if it is a route.
var touchRouteScript = redis.NewScript(luaNow + `
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' or redis.call('HEXISTS', KEYS[1], 'route') == 0 then return 0 end
redis.call('HSET', KEYS[1], 'at', now)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
`)

// getRouteScript returns {1, route} of KEYS[1], {2, 0} when it is over
// ARGV[1] bytes (not sent), {0, 0} when the key holds something else, or
// nil when there is none.
var getRouteScript = redis.NewScript(`
local t = redis.call('TYPE', KEYS[1]).ok
if t == 'none' then return false end
if t ~= 'hash' or redis.call('HEXISTS', KEYS[1], 'route') == 0 then return {0, 0} end
local n = redis.call('HSTRLEN', KEYS[1], 'route')
if n > tonumber(ARGV[1]) then return {2, 0} end
return {1, redis.call('HGET', KEYS[1], 'route')}
`)

// idleRouteScript returns {1, ms} since the last activity of KEYS[1] on
// Redis' clock (0 if that is ahead, after a failover), {0, 0} when the key
// holds something else, or nil when there is none.
var idleRouteScript = redis.NewScript(luaNow + `
local t = redis.call('TYPE', KEYS[1]).ok
if t == 'none' then return false end
if t ~= 'hash' or redis.call('HEXISTS', KEYS[1], 'route') == 0 then return {0, 0} end
local at = redis.call('HGET', KEYS[1], 'at')
if not at or #at > 15 or not string.match(at, '^%d+$') then return {0, 0} end
local idle = now - tonumber(at)
if idle < 0 then idle = 0 end
return {1, idle}
`)
