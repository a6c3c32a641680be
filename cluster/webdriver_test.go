package cluster

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// stepClock is a node clock that moves only when told.
type stepClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *stepClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func testRoute() Route {
	return Route{
		Provider:   `cloud "eu"`,
		ProviderID: "4f1c9a0e2b7d4c55a1e3f00d9c8b7a61",
		SocketURL:  "ws://127.0.0.1:9515/session/4f1c9a0e2b7d4c55a1e3f00d9c8b7a61",
		CDPURL:     "wss://hub.example:443/session/4f1c9a0e2b7d4c55a1e3f00d9c8b7a61/se/cdp?a=1&b=2",
		Session:    "Sd9v2m0b1xYqk4w7cZt3Ag",
		Handlers:   []string{"0a1b2c3d4e5f60718293a4b5-1", "5b4a3e2d1c0b9a8f7e6d5c4b-0"},
		Keys:       []string{"{http.auth.user.id}", "{http.request.header.X-Team}"},
		Client:     "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
	}
}

// TestRoutes: a route one node puts is read by another as it was put,
// with the putting node as its owner and an expiry; it is gone once
// dropped; what is not a route is refused before anything is written.
func TestRoutes(t *testing.T) {
	r := startRedis(t)
	a := open(t, r, "a", nil)
	b := open(t, r, "b", nil)
	ctx := context.Background()
	const id = "Sd9v2m0b1xYqk4w7cZt3Ag"
	rt := testRoute()
	if err := a.Routes().Put(ctx, id, rt, time.Minute); err != nil {
		t.Fatalf("Put: %v", err)
	}
	want := rt
	want.Node = "a"
	if got, ok, err := b.Routes().Get(ctx, id); err != nil || !ok || !reflect.DeepEqual(got, want) {
		t.Fatalf("Get on b = %+v, %v, %v; want %+v", got, ok, err, want)
	}
	key := a.c.routeKey(id)
	if !strings.Contains(key, "{"+id+"}") {
		t.Fatalf("key %q does not carry the session ID as its hash tag", key)
	}
	if ttl := a.c.rdb.PTTL(ctx, key).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("PTTL = %v, want within a minute", ttl)
	}
	// A route put for another owner keeps it.
	other := rt
	other.Node = "c"
	if err := a.Routes().Put(ctx, "other", other, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := b.Routes().Get(ctx, "other"); err != nil || !ok || got.Node != "c" {
		t.Fatalf("Get(other) = %+v, %v, %v", got, ok, err)
	}
	if got, ok, err := b.Routes().Get(ctx, "unknown"); err != nil || ok || !reflect.DeepEqual(got, Route{}) {
		t.Fatalf("Get(unknown) = %+v, %v, %v; want not found", got, ok, err)
	}
	if err := b.Routes().Drop(ctx, id); err != nil {
		t.Fatalf("Drop: %v", err)
	}
	if _, ok, err := a.Routes().Get(ctx, id); err != nil || ok {
		t.Fatalf("Get after Drop: %v, %v", ok, err)
	}
	if err := a.Routes().Drop(ctx, id); err != nil {
		t.Fatalf("Drop again: %v", err)
	}

	// Bad input: refused, nothing written.
	with := func(f func(*Route)) Route { r := testRoute(); f(&r); return r }
	long := strings.Repeat("x", 300)
	for _, c := range []struct {
		name, id string
		rt       Route
		ttl      time.Duration
	}{
		{"empty id", "", rt, time.Minute},
		{"id with a space", "a b", rt, time.Minute},
		{"id with a brace", "a{b}", rt, time.Minute},
		{"id with a newline", "a\nb", rt, time.Minute},
		{"long id", long, rt, time.Minute},
		{"no ttl", "s", rt, 0},
		{"no provider", "s", with(func(r *Route) { r.Provider = "" }), time.Minute},
		{"no provider ID", "s", with(func(r *Route) { r.ProviderID = "" }), time.Minute},
		{"provider with CR LF", "s", with(func(r *Route) { r.Provider = "p\r\nX: y" }), time.Minute},
		{"provider ID with a space", "s", with(func(r *Route) { r.ProviderID = "a b" }), time.Minute},
		{"provider ID with a NUL", "s", with(func(r *Route) { r.ProviderID = "a\x00" }), time.Minute},
		{"long provider ID", "s", with(func(r *Route) { r.ProviderID = long }), time.Minute},
		{"node with a tab", "s", with(func(r *Route) { r.Node = "n\t1" }), time.Minute},
		{"invalid UTF-8", "s", with(func(r *Route) { r.Provider = "p\xff" }), time.Minute},
		{"credential in the socket URL", "s", with(func(r *Route) { r.SocketURL = "wss://user:key@hub.example/x" }), time.Minute},
		{"user in the CDP URL", "s", with(func(r *Route) { r.CDPURL = "ws://user@hub.example/x" }), time.Minute},
		{"HTTP socket URL", "s", with(func(r *Route) { r.SocketURL = "http://hub.example/x" }), time.Minute},
		{"socket URL without host", "s", with(func(r *Route) { r.SocketURL = "ws:///x" }), time.Minute},
		{"socket URL with a space", "s", with(func(r *Route) { r.CDPURL = "ws://h/a b" }), time.Minute},
		{"session ID with a space", "s", with(func(r *Route) { r.Session = "a b" }), time.Minute},
		{"handler key with a brace", "s", with(func(r *Route) { r.Handlers = []string{"k{1}"} }), time.Minute},
		{"an empty handler key", "s", with(func(r *Route) { r.Handlers = []string{"k", ""} }), time.Minute},
		{"too many handler keys", "s", with(func(r *Route) { r.Handlers = []string{"a", "b", "c", "d", "e"} }), time.Minute},
		{"long client hash", "s", with(func(r *Route) { r.Client = long }), time.Minute},
		{"client hash without keys", "s", with(func(r *Route) { r.Keys = nil }), time.Minute},
		{"keys without a client hash", "s", with(func(r *Route) { r.Client = "" }), time.Minute},
		{"an empty key", "s", with(func(r *Route) { r.Keys = []string{""} }), time.Minute},
		{"a key with CR LF", "s", with(func(r *Route) { r.Keys = []string{"{a}\r\nX: y"} }), time.Minute},
		{"too many keys", "s", with(func(r *Route) { r.Keys = []string{"a", "b", "c", "d", "e"} }), time.Minute},
		{"long socket URL", "s", with(func(r *Route) { r.SocketURL = "ws://h/" + strings.Repeat("a", maxRouteURL) }), time.Minute},
		{"over 8 KiB escaped", "s", with(func(r *Route) {
			r.SocketURL = "ws://h/?" + strings.Repeat("&", maxRouteURL-10)
			r.CDPURL = r.SocketURL
		}), time.Minute},
	} {
		err := a.Routes().Put(ctx, c.id, c.rt, c.ttl)
		if !errors.Is(err, ErrBadRoute) || errors.Is(err, ErrUnavailable) {
			t.Errorf("%s: Put = %v, want ErrBadRoute", c.name, err)
		}
		if err != nil && (strings.Contains(err.Error(), "key@") || strings.Contains(err.Error(), "X: y")) {
			t.Errorf("%s: the error echoes the value: %v", c.name, err)
		}
		if c.id == "s" {
			if n := a.c.rdb.Exists(ctx, a.c.routeKey("s")).Val(); n != 0 {
				t.Fatalf("%s: written", c.name)
			}
		}
	}
	// The largest route each field allows, unescaped, fits.
	big := Route{Provider: strings.Repeat("p", maxRouteName), ProviderID: strings.Repeat("i", maxRouteName),
		Node: strings.Repeat("n", maxRouteName), SocketURL: "ws://h/" + strings.Repeat("s", maxRouteURL-7),
		CDPURL: "ws://h/" + strings.Repeat("c", maxRouteURL-7)}
	if err := a.Routes().Put(ctx, "big", big, time.Minute); err != nil {
		t.Fatalf("Put(big): %v", err)
	}
	if got, ok, err := b.Routes().Get(ctx, "big"); err != nil || !ok || !reflect.DeepEqual(got, big) {
		t.Fatalf("Get(big): %v, %v", ok, err)
	}
	// Calls after Close fail as unavailable.
	c := open(t, r, "c", nil)
	_ = c.Close()
	if err := c.Routes().Put(ctx, "s", rt, time.Minute); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Put after Close: %v", err)
	}
	if _, _, err := c.Routes().Get(ctx, "s"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Get after Close: %v", err)
	}
}

// TestRouteHasNoCredential: a route is the provider's name, its session
// ID, its socket URLs (never with user info, as TestRoutes shows), the
// owner, the operator's session ID, the handler key, the client key
// placeholders (configuration, not their values) and a keyed hash of
// their values: nothing that could hold a credential, nor the ID a
// client names the session by (the route's key is a keyed hash of it). A field added to
// Route must be added here, after asking whether it may be in Redis.
func TestRouteHasNoCredential(t *testing.T) {
	var got []string
	rt := reflect.TypeOf(Route{})
	for i := range rt.NumField() {
		got = append(got, rt.Field(i).Name+":"+rt.Field(i).Tag.Get("json"))
	}
	want := []string{"Provider:provider", "ProviderID:provider_id", "SocketURL:socket_url,omitempty", "CDPURL:cdp_url,omitempty", "Node:node",
		"Session:session", "Handlers:handlers", "Keys:keys,omitempty", "Client:client,omitempty"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Route's fields are %v, want %v", got, want)
	}
}

// hsetCalls reads how many HSET commands r's server ran (scripts'
// included).
func hsetCalls(t *testing.T, s *Store) int {
	t.Helper()
	info := s.c.rdb.Info(context.Background(), "commandstats").Val()
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_hset:calls="); ok {
			n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// TestRouteTouchThrottled: Touch writes a session's activity at most
// once a second per session on this node's clock, whatever the number of
// calls; a write refreshes the expiry; a failed write does not hold the
// next one off; a route that is gone is not brought back.
func TestRouteTouchThrottled(t *testing.T) {
	r := startRedis(t) // its own: the test counts the server's HSETs
	clk := &stepClock{t: time.Unix(1_900_000_000, 0)}
	a := open(t, r, "a", func(c *Config) { c.Clock = clk })
	ctx := context.Background()
	rdb := a.c.rdb
	// mark sets the activity to 1 and the expiry to 5 s, so that a
	// write shows.
	mark := func(id string) {
		rdb.HSet(ctx, a.c.routeKey(id), "at", "1")
		rdb.PExpire(ctx, a.c.routeKey(id), 5*time.Second)
	}
	written := func(id string) bool {
		return rdb.HGet(ctx, a.c.routeKey(id), "at").Val() != "1" && rdb.PTTL(ctx, a.c.routeKey(id)).Val() > 5*time.Second
	}
	touch := func(id string) {
		t.Helper()
		if err := a.Routes().Touch(ctx, id, time.Minute); err != nil {
			t.Fatalf("Touch(%s): %v", id, err)
		}
	}
	for _, id := range []string{"s1", "s2"} {
		if err := a.Routes().Put(ctx, id, testRoute(), time.Minute); err != nil {
			t.Fatal(err)
		}
		mark(id)
	}
	// The Put was this second's write.
	touch("s1")
	clk.add(999 * time.Millisecond)
	touch("s1")
	if written("s1") {
		t.Fatal("Touch wrote within the second of the Put")
	}
	clk.add(time.Millisecond)
	touch("s1")
	if !written("s1") {
		t.Fatal("Touch did not write a second after the Put")
	}
	// Each session has its own second.
	touch("s2")
	if !written("s2") {
		t.Fatal("s2's Touch was held off by s1's")
	}
	mark("s1")
	touch("s1")
	if written("s1") {
		t.Fatal("Touch wrote twice in a second")
	}

	// Many calls at once, one write.
	clk.add(time.Second)
	before := hsetCalls(t, a)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() { _ = a.Routes().Touch(ctx, "s1", time.Minute) })
	}
	wg.Wait()
	if n := hsetCalls(t, a) - before; n != 1 {
		t.Fatalf("32 Touch calls in one second made %d writes, want 1", n)
	}

	// A failed write: the next call writes.
	clk.add(time.Second)
	mark("s1")
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := a.Routes().Touch(cancelled, "s1", time.Minute); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Touch with a cancelled context: %v", err)
	}
	touch("s1")
	if !written("s1") {
		t.Fatal("the Touch after a failed one did not write")
	}

	// Gone stays gone.
	touch("ghost")
	if n := rdb.Exists(ctx, a.c.routeKey("ghost")).Val(); n != 0 {
		t.Fatal("Touch made a route")
	}
	if err := a.Routes().Drop(ctx, "s2"); err != nil {
		t.Fatal(err)
	}
	clk.add(time.Second)
	touch("s2")
	if n := rdb.Exists(ctx, a.c.routeKey("s2")).Val(); n != 0 {
		t.Fatal("Touch brought a dropped route back")
	}

	// The notes are pruned: only the sessions written within the last
	// second are kept.
	clk.add(2 * time.Second)
	touch("s1")
	a.Routes().mu.Lock()
	n := len(a.Routes().touched)
	a.Routes().mu.Unlock()
	if n != 1 {
		t.Fatalf("%d sessions noted, want 1", n)
	}
}

// TestRouteIdle: how long a session is idle is read on Redis' clock,
// whatever the clocks of the nodes that put, touch and ask (here 2 h
// apart); a Touch by another node counts.
func TestRouteIdle(t *testing.T) {
	r := startRedis(t)
	a := open(t, r, "a", func(c *Config) { c.Clock = offClock{time.Hour} })
	b := open(t, r, "b", func(c *Config) { c.Clock = offClock{-time.Hour} })
	ctx := context.Background()
	const id = "s1"
	if err := a.Routes().Put(ctx, id, testRoute(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if idle, ok, err := b.Routes().Idle(ctx, id); err != nil || !ok || idle < 0 || idle > time.Minute {
		t.Fatalf("Idle on b just after a's Put = %v, %v, %v", idle, ok, err)
	}
	// The activity written is Redis' time, not a node's.
	key := a.c.routeKey(id)
	at, _ := a.c.rdb.HGet(ctx, key, "at").Int64()
	redisNow := a.c.rdb.Time(ctx).Val()
	if d := redisNow.Sub(time.UnixMilli(at)); d < 0 || d > time.Minute {
		t.Fatalf("activity %v is %v from Redis' time", time.UnixMilli(at), d)
	}
	// Idle for an hour, on Redis' clock.
	a.c.rdb.HSet(ctx, key, "at", redisNow.Add(-time.Hour).UnixMilli())
	if idle, ok, err := a.Routes().Idle(ctx, id); err != nil || !ok || idle < time.Hour || idle > time.Hour+time.Minute {
		t.Fatalf("Idle after an hour = %v, %v, %v", idle, ok, err)
	}
	// b serves a command.
	if err := b.Routes().Touch(ctx, id, time.Hour); err != nil {
		t.Fatal(err)
	}
	if idle, ok, err := a.Routes().Idle(ctx, id); err != nil || !ok || idle > time.Minute {
		t.Fatalf("Idle on a after b's Touch = %v, %v, %v", idle, ok, err)
	}
	// Ahead of Redis' clock (a failover to a server behind): not idle.
	a.c.rdb.HSet(ctx, key, "at", redisNow.Add(time.Hour).UnixMilli())
	if idle, ok, err := a.Routes().Idle(ctx, id); err != nil || !ok || idle != 0 {
		t.Fatalf("Idle with an activity ahead = %v, %v, %v", idle, ok, err)
	}
	if err := a.Routes().Drop(ctx, id); err != nil {
		t.Fatal(err)
	}
	if idle, ok, err := b.Routes().Idle(ctx, id); err != nil || ok || idle != 0 {
		t.Fatalf("Idle after Drop = %v, %v, %v", idle, ok, err)
	}
}

// TestRouteCorrupt: a value that is not a route this version wrote
// (foreign, corrupt, too large, with control bytes or a credential) is
// not found, with an error that is not an outage and does not echo the
// value; it is left as it is.
func TestRouteCorrupt(t *testing.T) {
	r := startRedis(t)
	a := open(t, r, "a", nil)
	ctx := context.Background()
	rdb := a.c.rdb
	route := func(v string) func(string) {
		return func(key string) { rdb.HSet(ctx, key, "route", v, "at", "1") }
	}
	for _, c := range []struct {
		name string
		set  func(key string)
	}{
		{"not JSON", route("{")},
		{"JSON null", route("null")},
		{"JSON of another shape", route(`{"provider":1}`)},
		{"no node", route(`{"provider":"p","provider_id":"x"}`)},
		{"CR LF in the provider ID", route(`{"provider":"p","provider_id":"x\r\nSet-Cookie: y","node":"a"}`)},
		{"a space in the provider ID", route(`{"provider":"p","provider_id":"x y","node":"a"}`)},
		{"a credential in the socket URL", route(`{"provider":"p","provider_id":"x","node":"a","socket_url":"wss://u:secretkey@h/x"}`)},
		{"an HTTP socket URL", route(`{"provider":"p","provider_id":"x","node":"a","cdp_url":"https://h/x"}`)},
		{"over 8 KiB", route(`{"provider":"p","node":"a","provider_id":"` + strings.Repeat("x", maxRouteBytes) + `"}`)},
		{"a string", func(key string) { rdb.Set(ctx, key, `{"provider":"p","provider_id":"x","node":"a"}`, 0) }},
		{"a hash of something else", func(key string) { rdb.HSet(ctx, key, "foo", "bar") }},
		{"a list", func(key string) { rdb.RPush(ctx, key, "x") }},
	} {
		id := "corrupt-" + strings.ReplaceAll(c.name, " ", "-")
		key := a.c.routeKey(id)
		c.set(key)
		dump := rdb.Dump(ctx, key).Val()
		got, ok, err := a.Routes().Get(ctx, id)
		if ok || !reflect.DeepEqual(got, Route{}) || !errors.Is(err, ErrBadRoute) || errors.Is(err, ErrUnavailable) {
			t.Errorf("%s: Get = %+v, %v, %v; want not found and ErrBadRoute", c.name, got, ok, err)
		}
		if err != nil && (strings.Contains(err.Error(), "secretkey") || strings.Contains(err.Error(), "Set-Cookie")) {
			t.Errorf("%s: the error echoes the value: %v", c.name, err)
		}
		if c.name == "a string" || c.name == "a hash of something else" || c.name == "a list" {
			if _, ok, err := a.Routes().Idle(ctx, id); ok || !errors.Is(err, ErrBadRoute) {
				t.Errorf("%s: Idle = %v, %v; want ErrBadRoute", c.name, ok, err)
			}
			if err := a.Routes().Touch(ctx, id, time.Minute); err != nil {
				t.Errorf("%s: Touch = %v", c.name, err)
			}
		}
		if rdb.Dump(ctx, key).Val() != dump {
			t.Errorf("%s: the value was changed", c.name)
		}
	}
	if a.c.stale.Load() {
		t.Fatal("a corrupt value was taken for an outage")
	}
	// A corrupt activity.
	if err := a.Routes().Put(ctx, "s", testRoute(), time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, at := range []string{"x", "-5", "1e3", "", "99999999999999999999"} {
		rdb.HSet(ctx, a.c.routeKey("s"), "at", at)
		if _, ok, err := a.Routes().Idle(ctx, "s"); ok || !errors.Is(err, ErrBadRoute) {
			t.Errorf("activity %q: Idle = %v, %v; want ErrBadRoute", at, ok, err)
		}
	}
}

// TestWebDriverEndEvents: the news of a WebDriver session's end, sent to
// its owner, and of its end by its owner, reach the other node's
// subscriber, naming the session and the sender.
func TestWebDriverEndEvents(t *testing.T) {
	r := startRedis(t)
	a := open(t, r, "a", nil)
	b := open(t, r, "b", nil)
	recA, recB := subscribe(t, a), subscribe(t, b)
	ctx := context.Background()
	if err := b.News().AnnounceWebDriverEnd(ctx, "s1"); err != nil {
		t.Fatalf("AnnounceWebDriverEnd: %v", err)
	}
	eventually(t, 10*time.Second, "a hears b's end of s1", func() bool {
		_, ok := recA.find(func(ev Event) bool {
			return ev.Kind == EventWebDriverEnd && ev.Session == "s1" && ev.Node == "b" && ev.Provider == ""
		})
		return ok
	})
	if err := a.News().AnnounceWebDriverEnded(ctx, "s1"); err != nil {
		t.Fatalf("AnnounceWebDriverEnded: %v", err)
	}
	eventually(t, 10*time.Second, "b hears a ended s1", func() bool {
		_, ok := recB.find(func(ev Event) bool {
			return ev.Kind == EventWebDriverEnded && ev.Session == "s1" && ev.Node == "a"
		})
		return ok
	})
	for _, bad := range []string{"", "a b", "a\r\nb"} {
		if err := a.News().AnnounceWebDriverEnd(ctx, bad); !errors.Is(err, ErrBadRoute) {
			t.Errorf("AnnounceWebDriverEnd(%q) = %v", bad, err)
		}
		if err := a.News().AnnounceWebDriverEnded(ctx, bad); !errors.Is(err, ErrBadRoute) {
			t.Errorf("AnnounceWebDriverEnded(%q) = %v", bad, err)
		}
	}
}

func TestWebDriverEventCodec(t *testing.T) {
	at := time.Unix(1_900_000_000, 0)
	for _, kind := range []string{EventWebDriverEnd, EventWebDriverEnded} {
		ev, ok := decodeEvent(`{"kind":"`+kind+`","node":"n","session":"s1"}`, at)
		if !ok || ev.Kind != kind || ev.Session != "s1" || ev.Node != "n" || ev.Provider != "" || !ev.Until.IsZero() {
			t.Fatalf("%s: %+v %v", kind, ev, ok)
		}
		for _, bad := range []string{`{"kind":"` + kind + `","node":"n"}`, `{"kind":"` + kind + `","session":"a\nb"}`} {
			if _, ok := decodeEvent(bad, at); ok {
				t.Fatalf("decoded %s", bad)
			}
		}
	}
	// The other kinds still need their provider.
	if _, ok := decodeEvent(`{"kind":"resumed","session":"s1"}`, at); ok {
		t.Fatal("decoded a resumed event without its provider")
	}
}
