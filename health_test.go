package browserfailover_test

// End-to-end tests of provider health (cooldown, trials, capacity skips,
// single provider protection), of the strategies and of operator drain,
// through an in-process Caddy, with real time and fake providers. Provider names are unique per test: their state is
// process-wide.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
)

// step is how a scripted provider answers one request: status 0 accepts the
// WebSocket and echoes; delay comes before the answer.
type step struct {
	status int
	header http.Header
	delay  time.Duration
}

// scripted is a fake provider whose answer to its n-th request (1-based) is
// behave(n): it can switch from failing to serving, or answer slowly.
type scripted struct {
	Name string
	Addr string
	Hits atomic.Int64
}

func (s *scripted) URL() string { return "ws://" + s.Addr + "/" }

func newScripted(t testing.TB, name string, contacts *fakes.Contacts, behave func(n int64) step) *scripted {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &scripted{Name: name, Addr: ln.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := s.Hits.Add(1)
		contacts.Add(name)
		st := behave(n)
		if st.delay > 0 {
			time.Sleep(st.delay)
		}
		if st.status != 0 {
			for k, v := range st.header {
				w.Header()[k] = v
			}
			w.WriteHeader(st.status)
			fmt.Fprintf(w, "%s says %d", name, st.status)
			return
		}
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: websocket.CompressionDisabled})
		if err != nil {
			return
		}
		fakes.EchoMessages(c)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return s
}

// always answers every request the same way.
func always(st step) func(int64) step { return func(int64) step { return st } }

// echoStep accepts and echoes after delay.
func echoAfter(delay time.Duration) func(int64) step {
	return always(step{delay: delay})
}

// session dials the gateway (with extra headers), checks one echo and
// returns the open connection.
func session(ctx context.Context, url string, hdr http.Header) (*websocket.Conn, *http.Response, error) {
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: hdr})
	if err != nil {
		return nil, resp, err
	}
	if err := c.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		c.CloseNow()
		return nil, resp, err
	}
	if _, msg, err := c.Read(ctx); err != nil || string(msg) != "ping" {
		c.CloseNow()
		return nil, resp, fmt.Errorf("echo: %q %v", msg, err)
	}
	return c, resp, nil
}

// roundTrip opens a session, checks one echo and closes it. Safe to call
// from any goroutine.
func roundTrip(url string, hdr http.Header) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := session(ctx, url, hdr)
	if err != nil {
		return err
	}
	return c.Close(websocket.StatusNormalClosure, "")
}

func mustRoundTrip(t *testing.T, g *testgw.Gateway, hdr http.Header) {
	t.Helper()
	for try := 0; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, resp, err := session(ctx, g.WS("/"), hdr)
		cancel()
		if err != nil && resp == nil && try < 2 && resetBeforeAnswer(err) {
			// Right after a reload, the listener's swap can reset a
			// connection before any answer: nothing reached the
			// handler, so it is made again.
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		if err := c.Close(websocket.StatusNormalClosure, ""); err != nil {
			t.Fatalf("close: %v", err)
		}
		return
	}
}

// hold opens a session and keeps it; the test closes it.
func hold(t *testing.T, g *testgw.Gateway) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := session(ctx, g.WS("/"), nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

func state(t testing.TB, name string) *pool.ProviderState {
	t.Helper()
	p, ok := pool.Current().Lookup(name)
	if !ok {
		t.Fatalf("provider %q not in the pool", name)
	}
	return p
}

func health(t testing.TB, name string) cooldown.Snapshot {
	t.Helper()
	return state(t, name).Health.Snapshot()
}

// rejection is a decoded 503 answer.
type rejection struct {
	Status     int
	RetryAfter string
	Body       struct {
		Error    string `json:"error"`
		Attempts []struct {
			Provider string  `json:"provider"`
			Outcome  string  `json:"outcome"`
			MS       float64 `json:"ms"`
		} `json:"attempts"`
		RetryAfterS int `json:"retry_after_s"`
	}
	Raw string
}

// words renders the attempts as provider:outcome.
func (r *rejection) words() []string {
	var out []string
	for _, a := range r.Body.Attempts {
		out = append(out, a.Provider+":"+a.Outcome)
	}
	return out
}

// rawUpgrade sends a plain upgrade request and decodes a non-101 answer.
func rawUpgrade(ctx context.Context, url string) (*rejection, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := &rejection{Status: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After"), Raw: string(b)}
	if resp.StatusCode == http.StatusServiceUnavailable {
		if err := json.Unmarshal(b, &r.Body); err != nil {
			return r, fmt.Errorf("503 body %q: %v", b, err)
		}
	}
	return r, nil
}

func must503(t *testing.T, g *testgw.Gateway) *rejection {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := rawUpgrade(ctx, g.HTTP("/"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503: %s", r.Status, r.Raw)
	}
	if r.RetryAfter == "" || r.RetryAfter != strconv.Itoa(r.Body.RetryAfterS) {
		t.Fatalf("Retry-After %q vs retry_after_s %d", r.RetryAfter, r.Body.RetryAfterS)
	}
	return r
}

// attemptWords renders a log entry's attempts as provider:outcome.
func attemptWords(entry map[string]any) []string {
	var out []string
	as, _ := entry["attempts"].([]any)
	for _, a := range as {
		m := a.(map[string]any)
		out = append(out, fmt.Sprint(m["provider"], ":", m["outcome"]))
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// waitLogs waits until n "session ended" entries are logged and returns
// them.
func waitSessionLogs(t *testing.T, g *testgw.Gateway, n int) []map[string]any {
	t.Helper()
	testgw.Eventually(t, 10*time.Second, fmt.Sprintf("%d session ended entries", n), func() bool {
		return len(g.LogEntries("session ended")) >= n
	})
	return g.LogEntries("session ended")
}

// TestCooldownTrialAndDoubling: a provider answering 500 cools down after
// min_requests failures, is not contacted while a second provider serves,
// gets exactly one trial when the cooldown ends (a concurrent connect
// skips it), and a failed trial doubles the next cooldown.
func TestCooldownTrialAndDoubling(t *testing.T) {
	// The 500 comes after a short delay so that the trial is still in
	// flight when the concurrent connect looks at the provider.
	bad := newScripted(t, "cd-bad", nil, always(step{status: 500, delay: 150 * time.Millisecond}))
	good := fakes.Echo("cd-good", nil)
	defer good.Close()
	g := testgw.Start(t, handler(`"queue":{"size":0},"cooldown":{"duration":"1s","max_duration":"1m","min_requests":3}`,
		provider("cd-bad", bad.URL(), `"priority":1`),
		provider("cd-good", good.URL(), `"priority":2`)))

	for i := 1; i <= 3; i++ {
		if s := health(t, "cd-bad"); s.Cooldowns != 0 {
			t.Fatalf("cooled down after %d failures, want after 3: %+v", i-1, s)
		}
		mustRoundTrip(t, g, nil)
	}
	if n := bad.Hits.Load(); n != 3 {
		t.Fatalf("bad contacted %d times, want 3", n)
	}
	s := health(t, "cd-bad")
	if s.Healthy || s.Cooldowns != 1 || s.Streak != 1 || s.Until.IsZero() || s.Failures != 3 {
		t.Fatalf("after 3 failures: %+v", s)
	}
	until := s.Until

	// While cooling down it is never contacted; the second provider serves.
	served := 0
	for time.Until(until) > 200*time.Millisecond {
		mustRoundTrip(t, g, nil)
		served++
	}
	if n := bad.Hits.Load(); n != 3 {
		t.Fatalf("bad contacted %d times during its cooldown", n-3)
	}
	if served == 0 || good.Hits.Load() != int64(3+served) {
		t.Fatalf("good served %d of %d", good.Hits.Load(), 3+served)
	}

	// The cooldown ends: two concurrent connects, exactly one trial.
	time.Sleep(time.Until(until) + 30*time.Millisecond)
	before := len(g.LogEntries("session ended"))
	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- roundTrip(g.WS("/"), nil)
		}()
	}
	wg.Wait()
	t1 := time.Now()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("connect after the cooldown: %v", err)
		}
	}
	if n := bad.Hits.Load(); n != 4 {
		t.Fatalf("bad contacted %d times after its cooldown, want exactly 1 trial", n-3)
	}
	entries := waitSessionLogs(t, g, before+2)[before:]
	var trials, skips int
	for _, e := range entries {
		w := attemptWords(e)
		switch {
		case contains(w, "cd-bad:status_500"):
			trials++
		case contains(w, "cd-bad:cooldown"):
			skips++
		}
		if e["provider"] != "cd-good" {
			t.Fatalf("served by %v", e["provider"])
		}
	}
	if trials != 1 || skips != 1 {
		t.Fatalf("want one trial and one skip, got %d and %d: %v", trials, skips, entries)
	}

	// The failed trial started a doubled cooldown (2s from the trial's end).
	s = health(t, "cd-bad")
	if s.Healthy || s.Streak != 2 || s.Cooldowns != 2 || s.TrialInFlight {
		t.Fatalf("after the failed trial: %+v", s)
	}
	if lo, hi := t0.Add(2*time.Second), t1.Add(2*time.Second); s.Until.Before(lo) || s.Until.After(hi) {
		t.Fatalf("second cooldown ends %v, want between %v and %v (doubled)", s.Until, lo, hi)
	}
	if st := state(t, "cd-bad"); st.Stats.LastError() != "status_500" {
		t.Fatalf("last error %q", st.Stats.LastError())
	}
}

// TestCapacitySkip: 429 with Retry-After and 408 without skip the provider
// for Retry-After or duration, not counted as failures.
func TestCapacitySkip(t *testing.T) {
	cases := []struct {
		name   string
		status int
		header http.Header
		quiet  time.Duration // surely inside the skip, from before the answer
		after  time.Duration // surely past the skip, from after the answer
	}{
		{"429 Retry-After 2", 429, http.Header{"Retry-After": {"2"}}, 1500 * time.Millisecond, 2200 * time.Millisecond},
		{"408 for duration", 408, nil, 700 * time.Millisecond, 1300 * time.Millisecond},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			busyName, goodName := fmt.Sprintf("cap%d-busy", i), fmt.Sprintf("cap%d-good", i)
			busy := newScripted(t, busyName, nil, always(step{status: tc.status, header: tc.header}))
			good := fakes.Echo(goodName, nil)
			defer good.Close()
			g := testgw.Start(t, handler(`"queue":{"size":0},"cooldown":{"duration":"1s","max_duration":"1m"}`,
				provider(busyName, busy.URL(), `"priority":1`),
				provider(goodName, good.URL(), `"priority":2`)))

			start := time.Now()
			mustRoundTrip(t, g, nil)
			answered := time.Now()
			if n := busy.Hits.Load(); n != 1 {
				t.Fatalf("busy contacted %d times", n)
			}
			s := health(t, busyName)
			if s.Healthy || s.Until.IsZero() || s.Attempts != 0 || s.Failures != 0 || s.Cooldowns != 0 || s.Streak != 0 {
				t.Fatalf("after %d: %+v", tc.status, s)
			}
			if st := state(t, busyName); st.Stats.LastError() != fmt.Sprintf("status_%d", tc.status) {
				t.Fatalf("last error %q", st.Stats.LastError())
			}
			for time.Since(start) < tc.quiet {
				mustRoundTrip(t, g, nil)
				time.Sleep(20 * time.Millisecond)
			}
			if n := busy.Hits.Load(); n != 1 {
				t.Fatalf("busy contacted %d times during its skip", n-1)
			}
			time.Sleep(time.Until(answered.Add(tc.after)))
			mustRoundTrip(t, g, nil)
			if n := busy.Hits.Load(); n != 2 {
				t.Fatalf("busy contacted %d times after its skip, want 1", n-1)
			}
			if s := health(t, busyName); s.Attempts != 0 || s.Cooldowns != 0 {
				t.Fatalf("a capacity answer counted as an attempt: %+v", s)
			}
		})
	}
}

// TestSingleProviderProtection: a handler's only provider is not cooled
// down after 4 failures (min_requests 3), only after the 5th.
func TestSingleProviderProtection(t *testing.T) {
	bad := newScripted(t, "sp-bad", nil, always(step{status: 500}))
	g := testgw.Start(t, handler(`"queue":{"size":0},"cooldown":{"duration":"30s","min_requests":3}`,
		provider("sp-bad", bad.URL(), "")))
	for i := 1; i <= 5; i++ {
		r := must503(t, g)
		if w := r.words(); len(w) != 1 || w[0] != "sp-bad:status_500" {
			t.Fatalf("connect %d: attempts %v", i, w)
		}
		s := health(t, "sp-bad")
		if i < 5 && (s.Cooldowns != 0 || !s.Healthy) {
			t.Fatalf("cooled down after %d failures: %+v", i, s)
		}
		if i == 5 && (s.Cooldowns != 1 || s.Healthy) {
			t.Fatalf("not cooled down after 5 failures: %+v", s)
		}
	}
	// In cooldown: skipped, and Retry-After tells when it ends.
	r := must503(t, g)
	if w := r.words(); len(w) != 1 || w[0] != "sp-bad:cooldown" || r.Body.Attempts[0].MS != 0 {
		t.Fatalf("attempts %v", r.Raw)
	}
	if r.Body.RetryAfterS < 25 || r.Body.RetryAfterS > 30 {
		t.Fatalf("retry_after_s %d, want about 30", r.Body.RetryAfterS)
	}
	if n := bad.Hits.Load(); n != 5 {
		t.Fatalf("contacted %d times, want 5", n)
	}
}

// countHits returns each server's hits.
func countHits(ss ...*fakes.Server) []int64 {
	out := make([]int64, len(ss))
	for i, s := range ss {
		out[i] = s.Hits.Load()
	}
	return out
}

// TestStrategyRoundRobin: 30 sequential connects over 3 providers, 10 each,
// rotating.
func TestStrategyRoundRobin(t *testing.T) {
	var contacts fakes.Contacts
	a, b, c := fakes.Echo("rr-a", &contacts), fakes.Echo("rr-b", &contacts), fakes.Echo("rr-c", &contacts)
	defer a.Close()
	defer b.Close()
	defer c.Close()
	g := testgw.Start(t, handler(`"strategy":"round_robin"`,
		provider("rr-a", a.URL(), ""), provider("rr-b", b.URL(), ""), provider("rr-c", c.URL(), "")))
	for range 30 {
		mustRoundTrip(t, g, nil)
	}
	if got := countHits(a, b, c); got[0] != 10 || got[1] != 10 || got[2] != 10 {
		t.Fatalf("hits %v, want 10 each", got)
	}
	l := contacts.List()
	for i := 3; i < len(l); i++ {
		if l[i] != l[i-3] || l[i] == l[i-1] {
			t.Fatalf("not rotating: %v", l)
		}
	}
}

// TestStrategyWeighted: weights 3:1 over 40 connects give 30/10.
func TestStrategyWeighted(t *testing.T) {
	a, b := fakes.Echo("wt-a", nil), fakes.Echo("wt-b", nil)
	defer a.Close()
	defer b.Close()
	g := testgw.Start(t, handler(`"strategy":"weighted"`,
		provider("wt-a", a.URL(), `"weight":3`), provider("wt-b", b.URL(), `"weight":1`)))
	for range 40 {
		mustRoundTrip(t, g, nil)
	}
	if got := countHits(a, b); got[0] != 30 || got[1] != 10 {
		t.Fatalf("hits %v, want [30 10]", got)
	}
}

// TestStrategyLeastConn: with 2 sessions held on A and 1 on B, the next
// goes to C, then B (tie with C, B first by config order), then C.
func TestStrategyLeastConn(t *testing.T) {
	var contacts fakes.Contacts
	a, b, c := fakes.Echo("lc-a", &contacts), fakes.Echo("lc-b", &contacts), fakes.Echo("lc-c", &contacts)
	defer a.Close()
	defer b.Close()
	defer c.Close()
	g := testgw.Start(t, handler(`"strategy":"least_conn"`,
		provider("lc-a", a.URL(), ""), provider("lc-b", b.URL(), ""), provider("lc-c", c.URL(), "")))
	var held []*websocket.Conn
	for range 4 {
		held = append(held, hold(t, g))
	}
	if got := strings.Join(contacts.List(), ","); got != "lc-a,lc-b,lc-c,lc-a" {
		t.Fatalf("held sessions went to %s", got)
	}
	// Free C: A holds 2, B 1, C 0.
	held[2].Close(websocket.StatusNormalClosure, "")
	testgw.Eventually(t, 5*time.Second, "lc-c's slot to free", func() bool { return state(t, "lc-c").Slots.Reserved() == 0 })
	contacts.Reset()
	for range 3 {
		hold(t, g)
	}
	if got := strings.Join(contacts.List(), ","); got != "lc-c,lc-b,lc-c" {
		t.Fatalf("with A=2 B=1 C=0 the next sessions went to %s, want lc-c,lc-b,lc-c", got)
	}
	if a, b, c := state(t, "lc-a").Slots.Active(), state(t, "lc-b").Slots.Active(), state(t, "lc-c").Slots.Active(); a != 2 || b != 2 || c != 2 {
		t.Fatalf("active %d %d %d", a, b, c)
	}
}

// TestStrategyLatency: providers without a sample are tried first; then
// the fastest is preferred; a provider added by a reload is tried first.
func TestStrategyLatency(t *testing.T) {
	var contacts fakes.Contacts
	slow := newScripted(t, "lat-slow", &contacts, echoAfter(250*time.Millisecond))
	fast := newScripted(t, "lat-fast", &contacts, echoAfter(0))
	fresh := newScripted(t, "lat-new", &contacts, echoAfter(120*time.Millisecond))
	ps := []string{provider("lat-slow", slow.URL(), ""), provider("lat-fast", fast.URL(), `"priority":2`)}
	g := testgw.Start(t, handler(`"strategy":"latency"`, ps...))
	for range 6 {
		mustRoundTrip(t, g, nil)
	}
	if got := strings.Join(contacts.List(), ","); got != "lat-slow,lat-fast,lat-fast,lat-fast,lat-fast,lat-fast" {
		t.Fatalf("contacts %s", got)
	}
	slowMS, _ := state(t, "lat-slow").Stats.HandshakeMS()
	fastMS, _ := state(t, "lat-fast").Stats.HandshakeMS()
	if slowMS < 200 || fastMS >= slowMS {
		t.Fatalf("handshake averages slow %.1f fast %.1f", slowMS, fastMS)
	}

	ps = append(ps, provider("lat-new", fresh.URL(), `"priority":3`))
	if err := g.Reload(handler(`"strategy":"latency"`, ps...)); err != nil {
		t.Fatal(err)
	}
	contacts.Reset()
	for range 3 {
		mustRoundTrip(t, g, nil)
	}
	if got := strings.Join(contacts.List(), ","); got != "lat-new,lat-fast,lat-fast" {
		t.Fatalf("after adding lat-new: contacts %s, want lat-new first then lat-fast", got)
	}
}

// TestAffinity: the same X-Session key lands on the same provider across
// 20 connects, and still after a reload removed another provider.
func TestAffinity(t *testing.T) {
	var contacts fakes.Contacts
	names := []string{"af-1", "af-2", "af-3", "af-4"}
	var ps []string
	for _, n := range names {
		s := fakes.Echo(n, &contacts)
		defer s.Close()
		ps = append(ps, provider(n, s.URL(), ""))
	}
	const aff = `"strategy":"round_robin","affinity":{"source":"header","name":"X-Session"}`
	g := testgw.Start(t, handler(aff, ps...))
	hdr := http.Header{"X-Session": {"customer-42"}}
	for range 20 {
		mustRoundTrip(t, g, hdr)
	}
	l := contacts.List()
	chosen := l[0]
	for _, n := range l {
		if n != chosen {
			t.Fatalf("key moved between providers: %v", l)
		}
	}
	if len(l) != 20 {
		t.Fatalf("%d contacts", len(l))
	}

	// Remove a provider that is not the key's.
	var kept []string
	removed := ""
	for i, n := range names {
		if n != chosen && removed == "" {
			removed = n
			continue
		}
		kept = append(kept, ps[i])
	}
	if err := g.Reload(handler(aff, kept...)); err != nil {
		t.Fatal(err)
	}
	contacts.Reset()
	for range 20 {
		mustRoundTrip(t, g, hdr)
	}
	for _, n := range contacts.List() {
		if n != chosen {
			t.Fatalf("after removing %s the key moved from %s: %v", removed, chosen, contacts.List())
		}
	}
}

// TestDrain: a drained provider gets no new session; its live one goes on.
func TestDrain(t *testing.T) {
	var contacts fakes.Contacts
	a, b := fakes.Echo("dr-a", &contacts), fakes.Echo("dr-b", &contacts)
	defer a.Close()
	defer b.Close()
	g := testgw.Start(t, handler("", provider("dr-a", a.URL(), ""), provider("dr-b", b.URL(), `"priority":2`)))
	live := hold(t, g)
	st := state(t, "dr-a")
	st.SetDraining(true)
	defer st.SetDraining(false)
	for range 5 {
		mustRoundTrip(t, g, nil)
	}
	if got := strings.Join(contacts.List(), ","); got != "dr-a,dr-b,dr-b,dr-b,dr-b,dr-b" {
		t.Fatalf("contacts %s", got)
	}
	echoOnce(t, live, []byte("still here"))
	if st.Slots.Active() != 1 {
		t.Fatalf("dr-a active %d", st.Slots.Active())
	}
	live.Close(websocket.StatusNormalClosure, "")
	testgw.Eventually(t, 5*time.Second, "dr-a's slot to free", func() bool { return st.Slots.Active() == 0 && st.Slots.Reserved() == 0 })
	st.SetDraining(false)
	contacts.Reset()
	mustRoundTrip(t, g, nil)
	if got := strings.Join(contacts.List(), ","); got != "dr-a" {
		t.Fatalf("after undrain: %s", got)
	}
}
