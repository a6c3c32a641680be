package browserfailover_test

// A WebDriver provider's "session not created" is its word on the
// client's capabilities: the create goes on to the next provider, nothing
// counts against the one that said it, and when every provider said it
// the client gets the last answer as it is.

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
)

// windowsCreate asks for a platform the fakes below do not run.
const windowsCreate = `{"capabilities":{"alwaysMatch":{"browserName":"chrome","platformName":"windows"}}}`

// declineWindows makes f answer a create asking for windows with session
// not created, its message naming f's name; other creates go on.
func declineWindows(f *fakes.WebDriver, name string) {
	f.OnCreate = func(w http.ResponseWriter, _ *http.Request, body []byte) bool {
		if !bytes.Contains(body, []byte(`"windows"`)) {
			return false
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, `{"value":{"error":"session not created","message":"session not created: No matching capabilities found (`+name+`)","stacktrace":"#0 0x55 <unknown>"}}`)
		return true
	}
}

// postCreate sends a create body and returns the answer's status and
// body.
func postCreate(t *testing.T, g *testgw.Gateway, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(g.HTTP("/session"), "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestWebDriverSessionNotCreated: two providers that say session not
// created to a client's capabilities, again and again: each create tries
// both and gets the second one's answer as it is; neither provider counts
// a failure or cools down, and a create they can serve gets a session at
// once. With the second provider full instead, the client waits for it
// alone (a newcomer who can use the first is not held back) and, when the
// second says session not created too, gets its answer.
func TestWebDriverSessionNotCreated(t *testing.T) {
	a, b := fakes.NewWebDriver(""), fakes.NewWebDriver("")
	defer a.Close()
	defer b.Close()
	declineWindows(a, "wd-a")
	declineWindows(b, "wd-b")
	g := testgw.Start(t, handler(`"queue":{"size":5,"timeout":"20s"},"cooldown":{"min_requests":2,"failure_threshold":0.5}`,
		wdProvider("wd-a", a.URL(), `"priority":1`),
		wdProvider("wd-b", b.URL(), `"priority":2,"max_concurrent":1`)))
	for i := range 6 {
		code, body := postCreate(t, g, windowsCreate)
		if code != http.StatusInternalServerError || !strings.Contains(body, `No matching capabilities found (wd-b)","stacktrace":"#0 0x55 <unknown>"`) {
			t.Fatalf("create %d: %d %s", i+1, code, body)
		}
	}
	testgw.Eventually(t, 5*time.Second, "six rejected entries", func() bool { return len(g.LogEntries("rejected")) == 6 })
	for _, e := range g.LogEntries("rejected") {
		if got := strings.Join(outcomes(e), " "); got != "wd-a:not_created wd-b:not_created" || e["status"] != float64(500) {
			t.Fatalf("a declined create's entry: %s %v", got, e)
		}
	}
	for _, name := range []string{"wd-a", "wd-b"} {
		if p := providerStatus(t, g, name); !p.Healthy || p.Failures != 0 || p.CooldownUntil != nil || p.LastError != "" {
			t.Fatalf("%s after six declined creates: %+v", name, p)
		}
	}
	code, v, _ := wdCall(t, http.MethodPost, g.HTTP("/session"), newSession("chrome", false), nil)
	if code != 200 {
		t.Fatalf("a create they serve: %d %v", code, v)
	}
	if len(a.Live()) != 1 {
		t.Fatal("the session is not at wd-a")
	}
	wdCall(t, http.MethodDelete, g.HTTP("/session/"+v["sessionId"].(string)), nil, nil)

	// wd-b full (wd-a declining every create for a moment): a client
	// that wd-a declines waits for wd-b alone.
	a.OnCreate = func(w http.ResponseWriter, _ *http.Request, _ []byte) bool {
		fakes.WriteError(w, http.StatusInternalServerError, "session not created", "not now")
		return true
	}
	code, v, _ = wdCall(t, http.MethodPost, g.HTTP("/session"), newSession("chrome", false), nil)
	if code != 200 || len(b.Live()) != 1 {
		t.Fatalf("a create at wd-b: %d %v", code, v)
	}
	atB := v["sessionId"].(string)
	declineWindows(a, "wd-a")
	type answer struct {
		code int
		body string
	}
	waiting := make(chan answer, 1)
	go func() {
		code, body := postCreate(t, g, windowsCreate)
		waiting <- answer{code, body}
	}()
	testgw.Eventually(t, 5*time.Second, "the declined create waiting for wd-b", func() bool {
		st := readStatus(t, g)
		return len(st.Queues) > 0 && st.Queues[0].Waiting == 1
	})
	// A newcomer wd-a serves takes it at once: the waiter does not want
	// it.
	code, v, _ = wdCall(t, http.MethodPost, g.HTTP("/session"), newSession("chrome", false), nil)
	if code != 200 || len(a.Live()) != 1 {
		t.Fatalf("a newcomer for wd-a while the declined client waits: %d %v", code, v)
	}
	wdCall(t, http.MethodDelete, g.HTTP("/session/"+v["sessionId"].(string)), nil, nil)
	select {
	case ans := <-waiting:
		t.Fatalf("the waiting client was answered while wd-b is full: %d %s", ans.code, ans.body)
	default:
	}
	wdCall(t, http.MethodDelete, g.HTTP("/session/"+atB), nil, nil)
	select {
	case ans := <-waiting:
		if ans.code != http.StatusInternalServerError || !strings.Contains(ans.body, "No matching capabilities found (wd-b)") {
			t.Fatalf("the waiting client: %d %s", ans.code, ans.body)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the waiting client got no answer once wd-b had room")
	}
	testgw.Eventually(t, 5*time.Second, "its rejected entry", func() bool { return len(g.LogEntries("rejected")) == 7 })
	e := g.LogEntries("rejected")[6]
	if got := strings.Join(outcomes(e), " "); got != "wd-a:not_created wd-b:full wd-b:not_created" {
		t.Fatalf("the waiting client's attempts: %s", got)
	}
	for _, name := range []string{"wd-a", "wd-b"} {
		if p := providerStatus(t, g, name); !p.Healthy || p.Failures != 0 || p.CooldownUntil != nil {
			t.Fatalf("%s at the end: %+v", name, p)
		}
	}
}

// TestWebDriverDeclinedGivesRateBack: a create the provider declines
// with session not created started no browser, so it gives its
// create_rate start back: with one start a minute, three declined creates
// leave the window to a create the provider serves.
func TestWebDriverDeclinedGivesRateBack(t *testing.T) {
	a := fakes.NewWebDriver("")
	defer a.Close()
	declineWindows(a, "wd-a")
	g := testgw.Start(t, handler(`"queue":{"size":0}`,
		wdProvider("wd-a", a.URL(), `"create_rate":{"n":1,"per":"minute"}`)))
	for i := range 3 {
		if code, body := postCreate(t, g, windowsCreate); code != http.StatusInternalServerError || !strings.Contains(body, "No matching capabilities found") {
			t.Fatalf("declined create %d: %d %s", i+1, code, body)
		}
	}
	code, v, _ := wdCall(t, http.MethodPost, g.HTTP("/session"), newSession("chrome", false), nil)
	if code != 200 {
		t.Fatalf("a create after three declined ones, with one start a minute: %d %v", code, v)
	}
	wdCall(t, http.MethodDelete, g.HTTP("/session/"+v["sessionId"].(string)), nil, nil)
}
