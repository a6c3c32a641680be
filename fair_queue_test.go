package browserfailover_test

// End-to-end tests of the fair queue through a real Caddy: a freed slot,
// an ended trial, a drain and a reload each reach a waiter that can use
// them, and only such a waiter; pools of one handler never block each
// other, in the queue or in their rotation.

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
)

// dialWith starts a client with extra handshake headers whose dial may
// wait in the queue.
func dialWith(ctx context.Context, url string, hdr http.Header) <-chan dialResult {
	ch := make(chan dialResult, 1)
	go func() {
		start := time.Now()
		c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: hdr})
		r := dialResult{conn: c, err: err, elapsed: time.Since(start)}
		if resp != nil {
			r.status = resp.StatusCode
			r.session = resp.Header.Get("Browser-Failover-Session")
		}
		ch <- r
	}()
	return ch
}

// mustServe receives a queued client's result and requires a session.
func mustServe(t *testing.T, ch <-chan dialResult, within time.Duration, what string) *websocket.Conn {
	t.Helper()
	r := receive(t, ch, within, what)
	if r.err != nil {
		t.Fatalf("%s: %v (status %d) after %v", what, r.err, r.status, r.elapsed)
	}
	return r.conn
}

// pending requires that a queued client has no answer yet.
func pending(t *testing.T, ch <-chan dialResult, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: answered (status %d, err %v), want still waiting", what, r.status, r.err)
	case <-time.After(100 * time.Millisecond):
	}
}

// mixedPools is a handler with one CDP and one Playwright provider, each
// taking one session, and a queue of 15 s.
func mixedPools(t *testing.T, prefix string, contacts *fakes.Contacts) (*testgw.Gateway, string) {
	t.Helper()
	cdp := fakes.Echo(prefix+"-cdp", contacts)
	t.Cleanup(cdp.Close)
	pw := fakes.Echo(prefix+"-pw", contacts)
	t.Cleanup(pw.Close)
	h := handler(`"queue":{"size":10,"timeout":"15s"}`,
		provider(prefix+"-cdp", cdp.URL(), `"max_concurrent":1,"protocol":"cdp"`),
		provider(prefix+"-pw", pw.URL(), `"max_concurrent":1,"protocol":"playwright"`))
	return testgw.Start(t, h), h
}

// TestPoolsDoNotBlockEachOther: a Playwright client that arrives while a
// CDP client waits is served at once by its idle provider; when the
// Playwright slot frees, the Playwright waiter behind a CDP waiter gets it
// and the CDP waiter is not woken (its provider sees no attempt).
func TestPoolsDoNotBlockEachOther(t *testing.T) {
	contacts := &fakes.Contacts{}
	g, _ := mixedPools(t, "fq1", contacts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	cdpHeld := mustServe(t, dialWith(ctx, g.WS("/"), nil), 10*time.Second, "first CDP client")
	defer cdpHeld.CloseNow()
	cdpWaiter := dialWith(ctx, g.WS("/"), nil)
	waitWaiting(t, "fq1-cdp", 1)

	// Its own provider is idle: served at once, not queued behind.
	pwHeld := mustServe(t, dialWith(ctx, g.WS("/"), playwrightHeaders("1.65.1")), 5*time.Second, "Playwright client behind a CDP waiter")
	pwWaiter := dialWith(ctx, g.WS("/"), playwrightHeaders("1.65.1"))
	waitWaiting(t, "fq1-cdp", 2)

	contacts.Reset()
	pwHeld.Close(websocket.StatusNormalClosure, "")
	c := mustServe(t, pwWaiter, 10*time.Second, "Playwright waiter behind the CDP waiter")
	defer c.CloseNow()
	echoOnce(t, c, []byte("pw"))
	pending(t, cdpWaiter, "CDP waiter")
	if l := contacts.List(); len(l) != 1 || l[0] != "fq1-pw" {
		t.Fatalf("providers contacted after the Playwright slot freed: %v (the CDP waiter must not be woken)", l)
	}
	cdpHeld.Close(websocket.StatusNormalClosure, "")
	c2 := mustServe(t, cdpWaiter, 10*time.Second, "CDP waiter")
	c2.CloseNow()
	testgw.Eventually(t, 10*time.Second, "every session to end", func() bool {
		return state(t, "fq1-cdp").Slots.Active()+state(t, "fq1-pw").Slots.Active() == 1 // c still open
	})
}

// TestReloadKeepsWaiters: a config reload neither answers nor reorders the
// waiters; a reload that raises max_concurrent serves them at once, in
// arrival order.
func TestReloadKeepsWaiters(t *testing.T) {
	p := fakes.Echo("fq2", nil)
	defer p.Close()
	cfg := func(max string) string {
		return handler(`"queue":{"size":10,"timeout":"20s"}`, provider("fq2", p.URL(), `"max_concurrent":`+max))
	}
	g := testgw.Start(t, cfg("1"))
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	held := mustServe(t, dialWith(ctx, g.WS("/"), nil), 10*time.Second, "first client")
	defer held.CloseNow()
	w1 := dialWith(ctx, g.WS("/"), nil)
	waitWaiting(t, "fq2", 1)
	w2 := dialWith(ctx, g.WS("/"), nil)
	waitWaiting(t, "fq2", 2)

	// The same limit: the waiters stay, unanswered, under the new config.
	if err := g.Reload(cfg("1")); err != nil {
		t.Fatal(err)
	}
	pending(t, w1, "first waiter after a reload")
	pending(t, w2, "second waiter after a reload")
	waitWaiting(t, "fq2", 2)
	if n := len(g.LogEntries("rejected")); n != 0 {
		t.Fatalf("a reload rejected %d waiters", n)
	}

	// Room for one more: the first waiter is served, the second waits.
	if err := g.Reload(cfg("2")); err != nil {
		t.Fatal(err)
	}
	c1 := mustServe(t, w1, 5*time.Second, "first waiter once the limit grew")
	defer c1.CloseNow()
	pending(t, w2, "second waiter")
	// Room for all: served at once.
	if err := g.Reload(cfg("3")); err != nil {
		t.Fatal(err)
	}
	c2 := mustServe(t, w2, 5*time.Second, "second waiter once the limit grew again")
	c2.CloseNow()
}

// TestReloadRemovingProvidersEndsWaiters: waiters whose every provider a
// reload removed are answered 503 at once.
func TestReloadRemovingProvidersEndsWaiters(t *testing.T) {
	a := fakes.Echo("fq3-a", nil)
	defer a.Close()
	b := fakes.Echo("fq3-b", nil)
	defer b.Close()
	g := testgw.Start(t, handler(`"queue":{"size":10,"timeout":"20s"}`, provider("fq3-a", a.URL(), `"max_concurrent":1`)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held := mustServe(t, dialWith(ctx, g.WS("/"), nil), 10*time.Second, "first client")
	defer held.CloseNow()
	w := dialWith(ctx, g.WS("/"), nil)
	waitWaiting(t, "fq3-a", 1)
	// The new config shares nothing with the old one: nowhere to wait.
	if err := g.Reload(handler(`"queue":{"size":10,"timeout":"20s"}`, provider("fq3-b", b.URL(), `"max_concurrent":1`))); err != nil {
		t.Fatal(err)
	}
	r := receive(t, w, 5*time.Second, "waiter of a removed provider")
	if r.err == nil || r.status != http.StatusServiceUnavailable {
		t.Fatalf("waiter of a removed provider: status %d err %v, want 503", r.status, r.err)
	}
}

// TestDrainEndsWaiters: draining every provider a waiter could use
// answers it 503 at once; a waiter that can still use another provider
// keeps waiting; undraining serves it.
func TestDrainEndsWaiters(t *testing.T) {
	a := fakes.Echo("fq4-a", nil)
	defer a.Close()
	g := testgw.Start(t, handler(`"queue":{"size":10,"timeout":"20s"}`, provider("fq4-a", a.URL(), `"max_concurrent":1`)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held := mustServe(t, dialWith(ctx, g.WS("/"), nil), 10*time.Second, "first client")
	defer held.CloseNow()
	w := dialWith(ctx, g.WS("/"), nil)
	waitWaiting(t, "fq4-a", 1)
	start := time.Now()
	if code, body, err := g.AdminDo("POST", "/browser_failover/providers/fq4-a/drain", nil); err != nil || code != 200 {
		t.Fatalf("drain: %d %s %v", code, body, err)
	}
	defer state(t, "fq4-a").SetDraining(false)
	r := receive(t, w, 5*time.Second, "waiter of a drained provider")
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("waiter of a drained provider: status %d err %v", r.status, r.err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("answered after %v: at its queue timeout, not at the drain", d)
	}
}

// TestTrialWithoutVerdictWakesNext: a trial that ends without a state
// change (a 428 answer) lets the next waiter try at once instead of
// leaving it to its timeout.
func TestTrialWithoutVerdictWakesNext(t *testing.T) {
	// Fails five times (a single provider's cooldown), answers 428 to the
	// trial, then serves.
	p := newScripted(t, "fq5", nil, func(n int64) step {
		switch {
		case n <= 5:
			return step{status: 500}
		case n == 6:
			return step{status: 428}
		}
		return step{}
	})
	cd := `"cooldown":{"duration":"3s","min_requests":5}`
	g := testgw.Start(t, handler(`"queue":{"size":0},`+cd, provider("fq5", p.URL(), "")))
	for range 5 {
		must503(t, g)
	}
	until := health(t, "fq5").Until
	if !until.After(time.Now()) {
		t.Fatal("not cooling down")
	}
	if err := g.Reload(handler(`"queue":{"size":10,"timeout":"15s"},`+cd, provider("fq5", p.URL(), ""))); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := dialWith(ctx, g.WS("/"), nil)
	waitWaiting(t, "fq5", 1)
	second := dialWith(ctx, g.WS("/"), nil)
	waitWaiting(t, "fq5", 2)
	if !time.Now().Before(until) {
		t.Skip("the machine was too slow to queue both clients within the cooldown")
	}
	// The first waiter's trial gets 428: its only provider serves another
	// Playwright version, so it is answered 502. The second must then
	// try, at once.
	r := receive(t, first, 10*time.Second, "the trial's client")
	if r.status != http.StatusBadGateway {
		t.Fatalf("trial's client: status %d err %v, want 502", r.status, r.err)
	}
	start := time.Now()
	c := mustServe(t, second, 10*time.Second, "the waiter after a trial without verdict")
	defer c.CloseNow()
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("second waiter served %v after the trial, want at once", d)
	}
	if n := p.Hits.Load(); n != 7 {
		t.Fatalf("provider hits %d, want 7 (5 failures, the 428 trial, the next waiter's trial)", n)
	}
}

// TestRotationPerPool: round_robin rotates among the providers that can
// serve a client, so one pool's share does not depend on the other's
// traffic.
func TestRotationPerPool(t *testing.T) {
	contacts := &fakes.Contacts{}
	var ps []string
	for _, n := range []string{"fq6-c1", "fq6-c2", "fq6-p1", "fq6-p2"} {
		s := fakes.Echo(n, contacts)
		defer s.Close()
		proto := "cdp"
		if n[4] == 'p' {
			proto = "playwright"
		}
		ps = append(ps, provider(n, s.URL(), `"protocol":"`+proto+`"`))
	}
	g := testgw.Start(t, handler(`"strategy":"round_robin"`, ps...))
	var cdp, pw []string
	for i := range 8 {
		// Playwright traffic between CDP clients, twice as much.
		pw = append(pw, landed(t, g, contacts, playwrightHeaders("1.65.1")))
		pw = append(pw, landed(t, g, contacts, playwrightHeaders("1.65.1")))
		cdp = append(cdp, landed(t, g, contacts, nil))
		_ = i
	}
	count := func(l []string, name string) int {
		n := 0
		for _, x := range l {
			if x == name {
				n++
			}
		}
		return n
	}
	if count(cdp, "fq6-c1") != 4 || count(cdp, "fq6-c2") != 4 {
		t.Fatalf("CDP clients landed %v, want 4 and 4", cdp)
	}
	if count(pw, "fq6-p1") != 8 || count(pw, "fq6-p2") != 8 {
		t.Fatalf("Playwright clients landed %v, want 8 and 8", pw)
	}
}

// TestRegionWaiterHoldsBackNoOneElse: providers us and eu, each taking one
// session, the queue on. A holds eu, B waits for eu: C, who asks for
// us-east, is served by us at once, B waiting for nothing C could use.
// D, who asks for eu-central, is a newcomer B could hold back: it waits
// behind B (eu is left to B, not taken from it), and gets eu after B.
func TestRegionWaiterHoldsBackNoOneElse(t *testing.T) {
	us := fakes.Echo("rw-us", nil)
	defer us.Close()
	eu := fakes.Echo("rw-eu", nil)
	defer eu.Close()
	cfg := func(timeout string) string {
		return handler(`"queue":{"size":10,"timeout":"`+timeout+`"}`,
			provider("rw-us", us.URL(), `"max_concurrent":1,"region":["us-east"]`),
			provider("rw-eu", eu.URL(), `"max_concurrent":1,"region":["eu-central"]`))
	}
	g := testgw.Start(t, cfg("15s"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	a := mustServe(t, dialWith(ctx, g.WS("/?bf_region=eu-central"), nil), 10*time.Second, "A (eu)")
	defer a.CloseNow()
	b := dialWith(ctx, g.WS("/?bf_region=eu-central"), nil)
	waitWaiting(t, "rw-eu", 1)
	// B waits for eu only, and still does once a reload has moved it to
	// the new config's handler.
	contends := func(when string) {
		t.Helper()
		if q := pool.Current().Waiting; !q.Contended(pool.Resource("rw-eu")) || q.Contended(pool.Resource("rw-us")) {
			t.Fatalf("%s: B holds back newcomers for eu %v, for us %v: want eu only", when,
				q.Contended(pool.Resource("rw-eu")), q.Contended(pool.Resource("rw-us")))
		}
	}
	contends("B waiting")
	if err := g.Reload(cfg("16s")); err != nil {
		t.Fatal(err)
	}
	pending(t, b, "B after a reload")
	contends("B moved by a reload")

	// The issue: C waited behind B until the queue timeout, with us
	// listed as queued, although us was free.
	r := receive(t, dialWith(ctx, g.WS("/?bf_region=us-east"), nil), 30*time.Second, "C (us)")
	if r.err != nil {
		t.Fatalf("C (us) behind a waiter for eu: %v (status %d)", r.err, r.status)
	}
	defer r.conn.CloseNow()
	echoOnce(t, r.conn, []byte("us"))
	if us.Hits.Load() != 1 {
		t.Fatalf("us upgraded %d times, want C's", us.Hits.Load())
	}
	pending(t, b, "B")

	// The reverse: D could use eu, so B holds it back.
	d := dialWith(ctx, g.WS("/?bf_region=eu-central"), nil)
	waitWaiting(t, "rw-eu", 2)
	a.Close(websocket.StatusNormalClosure, "")
	bc := mustServe(t, b, 10*time.Second, "B, once A is gone")
	defer bc.CloseNow()
	echoOnce(t, bc, []byte("b"))
	pending(t, d, "D behind B")
	bc.Close(websocket.StatusNormalClosure, "")
	dr := receive(t, d, 10*time.Second, "D, once B is gone")
	if dr.err != nil {
		t.Fatalf("D, once B is gone: %v (status %d)", dr.err, dr.status)
	}
	echoOnce(t, dr.conn, []byte("d"))
	dr.conn.Close(websocket.StatusNormalClosure, "")
	// D's first pass left eu to B: its way begins with eu skipped as
	// queued (not as full, which it also was).
	var dEntry map[string]any
	testgw.Eventually(t, 10*time.Second, "D's session ended", func() bool {
		for _, e := range g.LogEntries("session ended") {
			if e["session_id"] == dr.session {
				dEntry = e
			}
		}
		return dEntry != nil
	})
	as, _ := dEntry["attempts"].([]any)
	if len(as) == 0 || as[0].(map[string]any)["provider"] != "rw-eu" || as[0].(map[string]any)["outcome"] != "queued" {
		t.Fatalf("D's attempts %v: want eu skipped as queued first", as)
	}
}

// TestBrowserWaiterHoldsBackNoOneElse: WebDriver providers for chrome and
// for firefox, each taking one session. A WebDriver create for chrome
// waiting for the chrome provider does not hold back a create for
// firefox, whose provider is free.
func TestBrowserWaiterHoldsBackNoOneElse(t *testing.T) {
	chrome := fakes.NewWebDriver("/")
	defer chrome.Close()
	firefox := fakes.NewWebDriver("/")
	defer firefox.Close()
	g := testgw.Start(t, handler(`"queue":{"size":10,"timeout":"15s"}`,
		wdProvider("bw-chrome", chrome.URL(), `"max_concurrent":1,"browsers":["chrome"]`),
		wdProvider("bw-firefox", firefox.URL(), `"max_concurrent":1,"browsers":["firefox"]`)))
	code, v, _ := wdCall(t, http.MethodPost, g.HTTP("/session"), newSession("chrome", false), nil)
	if code != 200 {
		t.Fatalf("first chrome create: %d %v", code, v)
	}
	first, _ := v["sessionId"].(string)
	waiter := make(chan int, 1)
	go func() {
		b, _ := json.Marshal(newSession("chrome", false))
		resp, err := http.Post(g.HTTP("/session"), "application/json", bytes.NewReader(b))
		if err != nil {
			waiter <- 0
			return
		}
		resp.Body.Close()
		waiter <- resp.StatusCode
	}()
	waitWaiting(t, "bw-chrome", 1)
	if q := pool.Current().Waiting; !q.Contended(pool.Resource("bw-chrome")) || q.Contended(pool.Resource("bw-firefox")) {
		t.Fatalf("the chrome waiter holds back newcomers for chrome %v, for firefox %v: want chrome only",
			q.Contended(pool.Resource("bw-chrome")), q.Contended(pool.Resource("bw-firefox")))
	}
	if code, v, _ := wdCall(t, http.MethodPost, g.HTTP("/session"), newSession("firefox", false), nil); code != 200 {
		t.Fatalf("a firefox create behind a chrome waiter: %d %v", code, v)
	}
	select {
	case code := <-waiter:
		t.Fatalf("the chrome waiter answered %d, want still waiting", code)
	default:
	}
	// The chrome session ends: the waiter gets the chrome provider.
	if code, _, _ := wdCall(t, http.MethodDelete, g.HTTP("/session/"+first), nil, nil); code != 200 {
		t.Fatalf("delete: %d", code)
	}
	if code := <-waiter; code != 200 {
		t.Fatalf("the chrome waiter, once chrome was free: %d", code)
	}
}
