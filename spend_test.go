package browserfailover_test

// Spend and learnt caps through a real Caddy: costs on the session ended
// entry, in status and the sessions list; a provider's budget skipping it
// with the word budget; a client key's budget answering 429 to that key
// only; the cheapest strategy and its fallback; a cap learnt from a
// provider's 429s and raised again after a quiet cooldown.

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/spend"
	"github.com/browserfailover/caddy-browser-failover/status"
)

// readStatus reads the whole status document.
func readStatus(t *testing.T, g *testgw.Gateway) status.Status {
	t.Helper()
	code, b, err := g.AdminDo(http.MethodGet, status.StatusPath, nil)
	if err != nil || code != 200 {
		t.Fatalf("status: %d %v", code, err)
	}
	var st status.Status
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// endedEntry waits for the session ended entry of the session named id.
func endedEntry(t *testing.T, g *testgw.Gateway, id string) map[string]any {
	t.Helper()
	var found map[string]any
	testgw.Eventually(t, 5*time.Second, "session ended of "+id, func() bool {
		for _, e := range g.LogEntries("session ended") {
			if e["session_id"] == id {
				found = e
				return true
			}
		}
		return false
	})
	return found
}

// outcomes lists an entry's attempts as provider:outcome.
func outcomes(e map[string]any) []string {
	var out []string
	list, _ := e["attempts"].([]any)
	for _, a := range list {
		m, _ := a.(map[string]any)
		out = append(out, m["provider"].(string)+":"+m["outcome"].(string))
	}
	return out
}

func nearly(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

func TestBudgetSkipsProvider(t *testing.T) {
	var contacts fakes.Contacts
	pricey := fakes.Echo("bud-pricey", &contacts)
	defer pricey.Close()
	spare := fakes.Echo("bud-spare", &contacts)
	defer spare.Close()
	g := testgw.Start(t, handler(`"queue":{"size":0}`,
		provider("bud-pricey", pricey.URL(), `"priority":1,"cost":{"amount":1.5,"per":"session"},"budget":{"amount":3,"per":"day"}`),
		provider("bud-spare", spare.URL(), `"priority":2`)))

	// Two sessions at 1.5 each reach the budget of 3 while they live.
	var open []*websocket.Conn
	for i := 0; i < 2; i++ {
		c, resp, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
		open = append(open, c)
		if i == 0 {
			// Accrued in full at the 101, shown on the live session.
			id := resp.Header.Get("Browser-Failover-Session")
			code, b, _ := g.AdminDo(http.MethodGet, status.SessionsPath, nil)
			var list status.Sessions
			if code != 200 || json.Unmarshal(b, &list) != nil {
				t.Fatalf("sessions: %d %s", code, b)
			}
			if len(list.Sessions) != 1 || list.Sessions[0].ID != id || !nearly(list.Sessions[0].Cost, 1.5) {
				t.Fatalf("the live session's cost: %s", b)
			}
		}
	}
	if got := pricey.Hits.Load(); got != 2 {
		t.Fatalf("pricey served %d", got)
	}
	p := providerStatus(t, g, "bud-pricey")
	start, _ := spend.Window(spend.PerDay, time.Now())
	if p.Spend.Budget == nil || *p.Spend.Budget != 3 || !nearly(p.Spend.Accrued, 3) || p.Spend.Spent != 0 || !p.Spend.WindowStart.Equal(start) {
		t.Fatalf("spend while live: %+v", p.Spend)
	}

	// The third client is sent on without an attempt at the spent one.
	c, resp, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Header.Get("Browser-Failover-Session")
	c.Close(websocket.StatusNormalClosure, "")
	if pricey.Hits.Load() != 2 {
		t.Fatal("a client was sent to a provider over its budget")
	}
	e := endedEntry(t, g, id)
	if got := strings.Join(outcomes(e), " "); got != "bud-pricey:budget bud-spare:ok" {
		t.Fatalf("attempts %q", got)
	}
	if cost, ok := e["cost"].(float64); !ok || cost != 0 {
		t.Fatalf("a free provider's session cost %v", e["cost"])
	}

	// Live sessions are never cut; once they end, their cost is spent.
	for _, c := range open {
		echoOnce(t, c, []byte("still here"))
		c.Close(websocket.StatusNormalClosure, "")
	}
	testgw.Eventually(t, 5*time.Second, "the sessions' costs spent", func() bool {
		p := providerStatus(t, g, "bud-pricey")
		return nearly(p.Spend.Spent, 3) && p.Spend.Accrued == 0
	})
	// A session's log entry follows its charge: both sessions' entries
	// are awaited.
	costs := 0.0
	testgw.Eventually(t, 5*time.Second, "both sessions' log entries", func() bool {
		n := 0
		for _, e := range g.LogEntries("session ended") {
			if e["provider"] == "bud-pricey" {
				n++
			}
		}
		return n == 2
	})
	for _, e := range g.LogEntries("session ended") {
		if e["provider"] == "bud-pricey" {
			costs += e["cost"].(float64)
		}
	}
	if !nearly(costs, 3) {
		t.Fatalf("session ended costs add up to %v", costs)
	}
	if _, m := opAdmin(t, g, http.MethodGet, "/metrics"); !strings.Contains(string(m), `caddy_browser_failover_spend_total{provider="bud-pricey"} 3`) {
		t.Fatal("no spend_total of 3 for the provider in /metrics")
	}

	// With the spare drained nothing is left: 503 until the day turns.
	if code, _, err := g.AdminDo(http.MethodPost, "/browser_failover/providers/bud-spare/drain", nil); err != nil || code != 200 {
		t.Fatalf("drain: %d %v", code, err)
	}
	_, resp, err = dial(t, g.WS("/"), nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("want 503, got %v %v", resp, err)
	}
	retry, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	_, end := spend.Window(spend.PerDay, time.Now())
	if want := time.Until(end).Seconds(); math.Abs(float64(retry)-want) > 5 {
		t.Fatalf("Retry-After %d, want the day's end in %.0fs", retry, want)
	}
}

func TestClientBudget(t *testing.T) {
	var contacts fakes.Contacts
	e := fakes.Echo("cb-echo", &contacts)
	defer e.Close()
	g := testgw.Start(t, handler(`"client_budget":{"key":"{http.request.header.X-Tenant}","amount":1,"per":"hour"}`,
		provider("cb-echo", e.URL(), `"cost":{"amount":0.6,"per":"session"}`)))
	tenant := func(name string) *websocket.DialOptions {
		return &websocket.DialOptions{HTTPHeader: http.Header{"X-Tenant": {name}}}
	}
	// 0.6, then 1.2: the second session of tenant a goes over its budget
	// while it lives, which is allowed (live sessions are never cut).
	var open []*websocket.Conn
	for i := 0; i < 2; i++ {
		c, _, err := dial(t, g.WS("/"), tenant("acme-secret-key"))
		if err != nil {
			t.Fatalf("tenant a, session %d: %v", i, err)
		}
		open = append(open, c)
	}
	// Now it is over: 429 with Retry-After at the hour's end, never the
	// queue.
	_, resp, err := dial(t, g.WS("/"), tenant("acme-secret-key"))
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("want 429 for the spent key, got %v %v", resp, err)
	}
	retry, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	_, end := spend.Window(spend.PerHour, time.Now())
	if want := time.Until(end).Seconds(); math.Abs(float64(retry)-want) > 5 {
		t.Fatalf("Retry-After %d, want the hour's end in %.0fs", retry, want)
	}
	// Another tenant is served.
	c, _, err := dial(t, g.WS("/"), tenant("globex"))
	if err != nil {
		t.Fatalf("another tenant: %v", err)
	}
	open = append(open, c)
	if e.Hits.Load() != 3 {
		t.Fatalf("the provider saw %d upgrades, want 3", e.Hits.Load())
	}
	rejected := g.LogEntries("rejected")
	if len(rejected) != 1 || rejected[0]["close_reason"] != "client_budget" || rejected[0]["status"].(float64) != 429 {
		t.Fatalf("rejected entries: %v", rejected)
	}

	st := readStatus(t, g)
	if len(st.Clients) != 2 {
		t.Fatalf("clients %+v", st.Clients)
	}
	spent := map[float64]bool{}
	for _, cl := range st.Clients {
		if !strings.HasPrefix(cl.Key, "hmac:") || cl.Spent == nil || cl.Budget == nil || *cl.Budget != 1 {
			t.Fatalf("client %+v", cl)
		}
		spent[*cl.Spent] = true
	}
	if !spent[1.2] || !spent[0.6] {
		t.Fatalf("client spends %v", spent)
	}
	code, b, _ := g.AdminDo(http.MethodGet, status.StatusPath, nil)
	if code != 200 || strings.Contains(string(b), "acme-secret-key") || strings.Contains(g.Logs(), "acme-secret-key") {
		t.Fatal("a client key shows in status or logs")
	}
	for _, c := range open {
		c.Close(websocket.StatusNormalClosure, "")
	}
}

func TestCheapestStrategy(t *testing.T) {
	var contacts fakes.Contacts
	dear := fakes.Echo("ch-dear", &contacts)
	defer dear.Close()
	cheap := fakes.Echo("ch-cheap", &contacts)
	defer cheap.Close()
	twin := fakes.Echo("ch-twin", &contacts)
	defer twin.Close()
	// A session of 10 minutes costs 1.0 at dear, 0.2 at cheap and 0.2 at
	// twin: cheap and twin tie, and cheap's priority breaks the tie.
	g := testgw.Start(t, handler(`"strategy":"cheapest","expected_duration":"10m"`,
		provider("ch-dear", dear.URL(), `"priority":1,"cost":{"amount":6,"per":"hour"}`),
		provider("ch-twin", twin.URL(), `"priority":3,"cost":{"amount":0.2,"per":"session"}`),
		provider("ch-cheap", cheap.URL(), `"priority":2,"cost":{"amount":0.02,"per":"minute"}`)))
	use := func() string {
		t.Helper()
		contacts.Reset()
		c, _, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatal(err)
		}
		c.Close(websocket.StatusNormalClosure, "")
		got := contacts.List()
		if len(got) != 1 {
			t.Fatalf("contacts %v", got)
		}
		return got[0]
	}
	for i := 0; i < 3; i++ {
		if got := use(); got != "ch-cheap" {
			t.Fatalf("pass %d went to %s, want the cheapest (tie by priority)", i, got)
		}
	}
	// The cheapest drained: the next cheapest, then the dear one.
	g.AdminDo(http.MethodPost, "/browser_failover/providers/ch-cheap/drain", nil)
	if got := use(); got != "ch-twin" {
		t.Fatalf("drained cheapest: went to %s", got)
	}
	g.AdminDo(http.MethodPost, "/browser_failover/providers/ch-twin/drain", nil)
	if got := use(); got != "ch-dear" {
		t.Fatalf("both cheap ones drained: went to %s", got)
	}
}

func TestLearntCap(t *testing.T) {
	var contacts fakes.Contacts
	capped := fakes.NewCapped("lc-capped", &contacts, 2)
	defer capped.Close()
	spare := fakes.Echo("lc-spare", &contacts)
	defer spare.Close()
	g := testgw.Start(t, handler(`"queue":{"size":0}`,
		provider("lc-capped", capped.URL(), `"priority":1,"max_concurrent":"auto","cooldown":{"duration":"1s"}`),
		provider("lc-spare", spare.URL(), `"priority":2`)))
	learnt := func() any { return providerStatus(t, g, "lc-capped").MaxConcurrentLearned }
	// null before the first 429; absent for a provider without auto.
	_, raw := opAdmin(t, g, http.MethodGet, status.StatusPath)
	if strings.Count(string(raw), `"max_concurrent_learned":null`) != 1 {
		t.Fatalf("max_concurrent_learned before any 429: %s", raw)
	}
	var open []*websocket.Conn
	connect := func() string {
		t.Helper()
		c, resp, err := dial(t, g.WS("/"), nil)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
		return resp.Header.Get("Browser-Failover-Session")
	}
	connect()
	connect()
	// The third: the provider answers 429 with two live, and its cap is
	// learnt as 2; the client fails over.
	id := connect()
	if capped.Refused.Load() != 1 {
		t.Fatalf("refused %d", capped.Refused.Load())
	}
	if v := learnt(); v != float64(2) {
		t.Fatalf("learnt %v, want 2", v)
	}
	if p := providerStatus(t, g, "lc-capped"); p.MaxConcurrent != 0 || p.CooldownUntil != nil {
		t.Fatalf("a learnt cap is not a skip: %+v", p)
	}
	// The fourth skips it as full, without an attempt.
	hits := capped.Hits.Load()
	id4 := connect()
	if capped.Hits.Load() != hits {
		t.Fatal("a client beyond the learnt cap was sent to the provider")
	}
	open[2].Close(websocket.StatusNormalClosure, "")
	open[3].Close(websocket.StatusNormalClosure, "")
	if got := strings.Join(outcomes(endedEntry(t, g, id)), " "); got != "lc-capped:status_429 lc-spare:ok" {
		t.Fatalf("third client's attempts %q", got)
	}
	if got := strings.Join(outcomes(endedEntry(t, g, id4)), " "); got != "lc-capped:full lc-spare:ok" {
		t.Fatalf("fourth client's attempts %q", got)
	}
	open = open[:2]

	// The provider's real cap grew: after a quiet cooldown with the cap
	// reached, the learnt cap rises by one, and a third session goes to
	// it.
	capped.SetCap(3)
	testgw.Eventually(t, 10*time.Second, "the learnt cap to rise to 3", func() bool { return learnt() == float64(3) })
	connect()
	if capped.Live() != 3 {
		t.Fatalf("the provider holds %d, want 3", capped.Live())
	}
	// At the cap again, and quiet: it rises to 4, above the provider's
	// real cap, whose next 429 sets it back to the live count.
	testgw.Eventually(t, 10*time.Second, "the learnt cap to rise to 4", func() bool { return learnt() == float64(4) })
	connect()
	if v := learnt(); v != float64(3) || capped.Refused.Load() != 2 {
		t.Fatalf("learnt %v after the second 429 (refused %d)", v, capped.Refused.Load())
	}
	for _, c := range open {
		c.Close(websocket.StatusNormalClosure, "")
	}
}

// TestBudgetsHoldUnderConcurrency: clients connecting at once cannot
// together overshoot a budget. Ten clients whose budget pays for one
// session connect together to a provider that takes its time to answer:
// one gets the session, the other nine are answered at once (429 for a
// client key's budget, 503 for a provider's), and none reaches the
// provider. Each admission holds its session's cost from the moment it is
// admitted, not from its 101.
func TestBudgetsHoldUnderConcurrency(t *testing.T) {
	for _, tc := range []struct {
		name, extra, costs string
		refused            int
	}{
		{"client_budget", `"queue":{"size":0},"client_budget":{"key":"{http.request.header.X-Tenant}","amount":1,"per":"day"}`,
			`"cost":{"amount":1,"per":"session"}`, http.StatusTooManyRequests},
		{"budget", `"queue":{"size":0}`,
			`"cost":{"amount":1,"per":"session"},"budget":{"amount":1,"per":"day"}`, http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gate := make(chan time.Time)
			var contacts fakes.Contacts
			slow := fakes.Slow("hold-"+tc.name, &contacts, func() <-chan time.Time { return gate })
			defer slow.Close()
			g := testgw.Start(t, handler(tc.extra, provider("hold-"+tc.name, slow.URL(), tc.costs)))

			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			results := make([]<-chan dialResult, 10)
			for i := range results {
				results[i] = dialWith(ctx, g.WS("/"), http.Header{"X-Tenant": {"tenant-a"}})
			}
			// Each client is either at the provider, held by the gate,
			// or answered already.
			var answered []dialResult
			testgw.Eventually(t, 10*time.Second, "every client at the provider or answered", func() bool {
				for i, ch := range results {
					if ch == nil {
						continue
					}
					select {
					case r := <-ch:
						answered = append(answered, r)
						results[i] = nil
					default:
					}
				}
				return int(slow.Hits.Load())+len(answered) == len(results)
			})
			close(gate)
			for _, ch := range results {
				if ch != nil {
					answered = append(answered, receive(t, ch, 10*time.Second, "a held client"))
				}
			}
			sessions, refused := 0, 0
			for _, r := range answered {
				switch {
				case r.err == nil:
					sessions++
					r.conn.Close(websocket.StatusNormalClosure, "")
				case r.status == tc.refused:
					refused++
				default:
					t.Errorf("a client got %d: %v", r.status, r.err)
				}
			}
			if sessions != 1 || refused != 9 || slow.Hits.Load() != 1 {
				t.Fatalf("a budget of one session: %d sessions, %d refused with %d, %d upgrades at the provider",
					sessions, refused, tc.refused, slow.Hits.Load())
			}
			testgw.Eventually(t, 5*time.Second, "the session's end", func() bool {
				p := providerStatus(t, g, "hold-"+tc.name)
				return p.Active == 0 && nearly(p.Spend.Spent, 1)
			})
		})
	}
}

// TestClientBudgetsOfTwoHandlers: two handlers with different
// client_budget settings for the same key keep their own books: a connect
// through one never resets or raises what the other counted.
func TestClientBudgetsOfTwoHandlers(t *testing.T) {
	var contacts fakes.Contacts
	e := fakes.Echo("cb2-echo", &contacts)
	defer e.Close()
	p := provider("cb2-echo", e.URL(), `"cost":{"amount":0.6,"per":"session"}`)
	daily := handler(`"client_budget":{"key":"{http.request.header.X-Tenant}","amount":1,"per":"day"}`, p)
	hourly := handler(`"client_budget":{"key":"{http.request.header.X-Tenant}","amount":5,"per":"hour"}`, p)
	g := testgw.Start(t, `{"handler":"subroute","routes":[
		{"match":[{"path":["/daily"]}],"handle":[`+daily+`]},
		{"match":[{"path":["/hourly"]}],"handle":[`+hourly+`]}]}`)
	tenant := &websocket.DialOptions{HTTPHeader: http.Header{"X-Tenant": {"tenant-a"}}}
	session := func(path string) int {
		c, resp, err := dial(t, g.WS(path), tenant)
		if err != nil {
			if resp == nil {
				t.Fatalf("%s: %v", path, err)
			}
			return resp.StatusCode
		}
		c.Close(websocket.StatusNormalClosure, "")
		return http.StatusSwitchingProtocols
	}
	// 0.6 and 1.2 of the day's 1: the third is refused.
	for i := 0; i < 2; i++ {
		if code := session("/daily"); code != http.StatusSwitchingProtocols {
			t.Fatalf("daily session %d: %d", i, code)
		}
	}
	testgw.Eventually(t, 5*time.Second, "both daily sessions counted", func() bool {
		for _, cl := range readStatus(t, g).Clients {
			if cl.Spent != nil && nearly(*cl.Spent, 1.2) {
				return true
			}
		}
		return false
	})
	if code := session("/daily"); code != http.StatusTooManyRequests {
		t.Fatalf("the spent daily budget answered %d", code)
	}
	// The hourly handler's book is its own: served, and the daily one
	// stays spent.
	if code := session("/hourly"); code != http.StatusSwitchingProtocols {
		t.Fatalf("hourly: %d", code)
	}
	if code := session("/daily"); code != http.StatusTooManyRequests {
		t.Fatalf("after a session through the hourly handler, the daily budget answered %d", code)
	}
}
