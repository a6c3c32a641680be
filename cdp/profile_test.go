package cdp

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/browserfailover/caddy-browser-failover/profiles"
)

// fakeBrowser answers the commands a profile conversation sends the way
// Chrome does, from a cookie jar and localStorage of its own: enough of
// Target, Fetch, Page, Storage and DOMStorage. Messages it sends go to
// the talk at once (in order), as the relay would hand them.
type fakeBrowser struct {
	t       *testing.T
	cookies []map[string]any
	storage map[string][][2]string
	// holdPages: another attachment of the connection holds new pages
	// for its debugger (a client's auto-attach that outlived it).
	holdPages bool
	// holdTabs: the client's attachment holds the tab a new page opens
	// in (Chrome's tab target), which keeps the page from loading.
	holdTabs bool
	paused   map[string]bool
	// page state
	pages    map[string]string // target → origin loaded
	sessions map[string]string // session → target
	nav      map[string]json.RawMessage
	closed   []string
	// sent is every command received; toClient the messages the talk
	// did not take.
	sent     []string
	toClient []string
	out      []string // queued messages to deliver
	hear     func([]byte) (bool, bool)
	over     bool
}

func newFakeBrowser(t *testing.T) *fakeBrowser {
	return &fakeBrowser{t: t, storage: map[string][][2]string{}, pages: map[string]string{}, sessions: map[string]string{},
		nav: map[string]json.RawMessage{}, paused: map[string]bool{}}
}

// run talks with talk until it is over.
func (b *fakeBrowser) run(begin func(func([]byte) bool), hear func([]byte) (bool, bool)) {
	b.hear = hear
	begin(b.receive)
	for i := 0; len(b.out) > 0 && !b.over; i++ {
		if i > 10000 {
			b.t.Fatal("the conversation does not end")
		}
		m := b.out[0]
		b.out = b.out[1:]
		mine, over := b.hear([]byte(m))
		if !mine {
			b.toClient = append(b.toClient, m)
		}
		b.over = over
	}
}

func (b *fakeBrowser) emit(v any) {
	m, _ := json.Marshal(v)
	b.out = append(b.out, string(m))
}

type cmd struct {
	ID        int64           `json:"id"`
	Method    string          `json:"method"`
	Params    json.RawMessage `json:"params"`
	SessionID string          `json:"sessionId"`
}

func (b *fakeBrowser) reply(c cmd, result any) {
	m := map[string]any{"id": c.ID, "result": result}
	if c.SessionID != "" {
		m["sessionId"] = c.SessionID
	}
	b.emit(m)
}

func (b *fakeBrowser) replyErr(c cmd, msg string) {
	m := map[string]any{"id": c.ID, "error": map[string]any{"code": -32000, "message": msg}}
	if c.SessionID != "" {
		m["sessionId"] = c.SessionID
	}
	b.emit(m)
}

// receive is the browser's end of the talk's send.
func (b *fakeBrowser) receive(msg []byte) bool {
	var c cmd
	if err := json.Unmarshal(msg, &c); err != nil {
		b.t.Fatalf("not JSON: %s", msg)
	}
	if c.ID < talkBase || c.ID >= talkBase+idSpan+10000 {
		b.t.Fatalf("ID %d outside the conversation's range", c.ID)
	}
	b.sent = append(b.sent, c.Method)
	var p map[string]json.RawMessage
	json.Unmarshal(c.Params, &p)
	str := func(k string) string { var s string; json.Unmarshal(p[k], &s); return s }
	switch c.Method {
	case "Storage.setCookies":
		var cs []map[string]any
		json.Unmarshal(p["cookies"], &cs)
		for _, ck := range cs {
			out := map[string]any{}
			for k, v := range ck {
				out[k] = v
			}
			if _, ok := ck["expires"]; !ok {
				out["expires"], out["session"] = -1, true
			} else {
				out["session"] = false
			}
			out["size"] = len(ck["name"].(string)) + len(ck["value"].(string))
			for _, k := range []string{"httpOnly", "secure"} {
				if _, ok := out[k]; !ok {
					out[k] = false
				}
			}
			b.cookies = append(b.cookies, out)
		}
		b.reply(c, map[string]any{})
	case "Storage.getCookies":
		b.reply(c, map[string]any{"cookies": b.cookies})
	case "Target.createTarget":
		id := fmt.Sprintf("T%d", len(b.pages)+1)
		b.pages[id] = ""
		if b.holdPages {
			// Another session auto-attaches it, waiting, before the
			// answer comes.
			b.paused[id] = true
			b.emit(map[string]any{"method": "Target.attachedToTarget", "params": map[string]any{"sessionId": "CLIENT-" + id,
				"targetInfo": map[string]any{"targetId": id, "type": "page", "url": "about:blank"}, "waitingForDebugger": true}})
		}
		if b.holdTabs {
			tab := "TAB-" + id
			b.paused[id] = true
			b.emit(map[string]any{"method": "Target.attachedToTarget", "params": map[string]any{"sessionId": "CLIENT-" + tab,
				"targetInfo": map[string]any{"targetId": tab, "type": "tab", "url": ""}, "waitingForDebugger": true}})
		}
		b.reply(c, map[string]any{"targetId": id})
	case "Runtime.runIfWaitingForDebugger":
		target := b.sessionTarget(c.SessionID)
		delete(b.paused, target)
		delete(b.paused, strings.TrimPrefix(target, "TAB-"))
		b.reply(c, map[string]any{})
	case "Target.attachToTarget":
		id := str("targetId")
		s := "S-" + id
		b.sessions[s] = id
		b.emit(map[string]any{"method": "Target.attachedToTarget", "params": map[string]any{"sessionId": s,
			"targetInfo": map[string]any{"targetId": id, "type": "page", "url": "about:blank"}, "waitingForDebugger": false}})
		b.reply(c, map[string]any{"sessionId": s})
	case "Fetch.enable", "Network.setBypassServiceWorker":
		b.reply(c, map[string]any{})
	case "Page.navigate":
		target := b.sessions[c.SessionID]
		if b.paused[target] {
			b.replyErr(c, "the page is held for a debugger")
			return true
		}
		b.nav[c.SessionID] = msg
		b.emit(map[string]any{"method": "Fetch.requestPaused", "params": map[string]any{"requestId": "R1", "request": map[string]any{"url": str("url")}}, "sessionId": c.SessionID})
	case "Fetch.fulfillRequest":
		nav := b.nav[c.SessionID]
		var n cmd
		json.Unmarshal(nav, &n)
		var np map[string]string
		json.Unmarshal(n.Params, &np)
		u := np["url"]
		b.pages[b.sessions[c.SessionID]] = strings.TrimSuffix(u, "/")
		b.reply(c, map[string]any{})
		b.reply(n, map[string]any{"frameId": "F", "loaderId": "L"})
	case "DOMStorage.setDOMStorageItem", "DOMStorage.getDOMStorageItems":
		var sid struct {
			SecurityOrigin string `json:"securityOrigin"`
		}
		json.Unmarshal(p["storageId"], &sid)
		if b.pages[b.sessions[c.SessionID]] != sid.SecurityOrigin {
			b.replyErr(c, "Frame not found for the given storage id")
			return true
		}
		if c.Method == "DOMStorage.getDOMStorageItems" {
			entries := [][]string{}
			for _, it := range b.storage[sid.SecurityOrigin] {
				entries = append(entries, []string{it[0], it[1]})
			}
			b.reply(c, map[string]any{"entries": entries})
			return true
		}
		b.storage[sid.SecurityOrigin] = append(b.storage[sid.SecurityOrigin], [2]string{str("key"), str("value")})
		b.reply(c, map[string]any{})
	case "Target.closeTarget":
		id := str("targetId")
		b.closed = append(b.closed, id)
		for s, t := range b.sessions {
			if t == id {
				b.emit(map[string]any{"method": "Target.detachedFromTarget", "params": map[string]any{"sessionId": s, "targetId": id}})
			}
		}
		b.reply(c, map[string]any{"success": true})
	default:
		b.t.Fatalf("unexpected command %s", c.Method)
	}
	return true
}

func (b *fakeBrowser) sessionTarget(s string) string { return strings.TrimPrefix(s, "CLIENT-") }

func profile() *profiles.Profile {
	return &profiles.Profile{
		Cookies: []profiles.Cookie{
			{Name: "sid", Value: "s3cret", Domain: "127.0.0.1", Path: "/", Session: true, HTTPOnly: true, SameSite: "Lax", Priority: "Medium", SourceScheme: "NonSecure", SourcePort: 8080},
			{Name: "pref", Value: "dark", Domain: ".example.com", Path: "/app", Expires: 1796536392.865, Secure: true, SameSite: "Strict", Priority: "High", SourceScheme: "Secure", SourcePort: 443},
			{Name: "chip", Value: "c", Domain: "embed.example", Path: "/", Secure: true, SameSite: "None", Session: true,
				PartitionKey: json.RawMessage(`{"topLevelSite":"https://top.example","hasCrossSiteAncestor":false}`)},
		},
		Origins: []profiles.Origin{
			{Origin: "http://127.0.0.1:8080", Items: [][2]string{{"token", "tok-1"}, {"user", "alice"}}},
			{Origin: "https://example.com", Items: [][2]string{{"theme", "dark"}}},
		},
	}
}

// TestProfileRoundTrip: a profile restored into a browser and saved back
// is the same profile: every cookie attribute (HttpOnly, Secure,
// SameSite, expiry, priority, source, partition; a session cookie stays
// one), and each origin's localStorage; the conversation's page is closed
// and nothing it heard reaches the client.
func TestProfileRoundTrip(t *testing.T) {
	b := newFakeBrowser(t)
	r := NewRestore(profile())
	b.run(r.Begin, r.Heard)
	if err := r.Err(); err != "" {
		t.Fatalf("restore: %s (sent %v)", err, b.sent)
	}
	if len(b.toClient) != 0 {
		t.Fatalf("the client would get %v", b.toClient)
	}
	if len(b.closed) != 1 {
		t.Fatalf("pages closed: %v", b.closed)
	}
	// The origins to read: the stored ones, and one the session visited
	// without storage.
	s := NewSave([]string{"http://127.0.0.1:8080", "https://example.com", "https://visited.example"})
	b.over = false
	b.run(s.Begin, s.Heard)
	got, err := s.Result()
	if err != nil {
		t.Fatal(err)
	}
	want := profile()
	sortCookies := func(p *profiles.Profile) {
		sort.Slice(p.Cookies, func(i, j int) bool { return p.Cookies[i].Name < p.Cookies[j].Name })
	}
	sortCookies(got)
	sortCookies(want)
	gj, _ := json.Marshal(got)
	wj, _ := json.Marshal(want)
	var ga, wa any
	json.Unmarshal(gj, &ga)
	json.Unmarshal(wj, &wa)
	if !reflect.DeepEqual(got.Origins, want.Origins) || !reflect.DeepEqual(ga, wa) {
		t.Fatalf("saved\n%s\nwant\n%s", gj, wj)
	}
	if len(b.toClient) != 0 || len(b.closed) != 2 {
		t.Fatalf("client %v, closed %v", b.toClient, b.closed)
	}
}

// TestProfileHeldPage: a page another attachment holds for its debugger
// (its hold announced before the page's creation is answered) is let run.
func TestProfileHeldPage(t *testing.T) {
	b := newFakeBrowser(t)
	b.holdPages = true
	r := NewRestore(profile())
	b.run(r.Begin, r.Heard)
	if err := r.Err(); err != "" {
		t.Fatalf("restore: %s (sent %v)", err, b.sent)
	}
	if !strings.Contains(strings.Join(b.sent, " "), "Runtime.runIfWaitingForDebugger") {
		t.Fatalf("sent %v", b.sent)
	}
}

// TestProfileHeldTab: the tab a new page opens in, held by the client's
// attachment waiting for its debugger (as Chrome holds it after a
// Puppeteer client left), is let run, so the page loads; its
// announcement is the conversation's.
func TestProfileHeldTab(t *testing.T) {
	b := newFakeBrowser(t)
	b.holdTabs = true
	r := NewRestore(profile())
	b.run(r.Begin, r.Heard)
	if err := r.Err(); err != "" {
		t.Fatalf("restore: %s (sent %v)", err, b.sent)
	}
	if len(b.toClient) != 0 {
		t.Fatalf("the client would get %v", b.toClient)
	}
}

// TestProfileRefusals: a browser that refuses fails the conversation,
// and says why; a profile without cookies or storage asks nothing but
// what it needs; messages that are not the conversation's are not taken.
func TestProfileRefusals(t *testing.T) {
	s := NewSave(nil)
	var sent []string
	s.Begin(func(m []byte) bool { sent = append(sent, string(m)); return true })
	var c cmd
	json.Unmarshal([]byte(sent[0]), &c)
	if mine, over := s.Heard([]byte(fmt.Sprintf(`{"id":%d,"error":{"code":-32601,"message":"'Storage.getCookies' wasn't found"}}`, c.ID))); !mine || !over {
		t.Fatal("the refusal was not taken")
	}
	if _, err := s.Result(); err == nil || !strings.Contains(err.Error(), "wasn't found") {
		t.Fatalf("result: %v", err)
	}
	for _, m := range []string{`{"id":1,"result":{}}`, `{"method":"Page.loadEventFired","params":{},"sessionId":"CLIENT"}`, `{"method":"Target.targetCreated","params":{"targetInfo":{"targetId":"X","type":"page"}}}`} {
		if mine, _ := s.Heard([]byte(m)); mine {
			t.Errorf("took %s", m)
		}
	}
	empty := NewRestore(&profiles.Profile{})
	done := false
	empty.Begin(func([]byte) bool { t.Fatal("an empty profile sent something"); return false })
	if _, over := empty.Heard([]byte(`{"id":1,"result":{}}`)); over {
		done = true
	}
	if !done || empty.Err() != "" {
		t.Fatalf("empty restore: %q", empty.Err())
	}
	unanswered := NewSave(nil)
	unanswered.Begin(func([]byte) bool { return true })
	if _, err := unanswered.Result(); err == nil {
		t.Fatal("an unfinished save has a result")
	}
}

// TestWatcher: a watcher attaches to the browser target and discovers
// targets (no auto-attach, no screencast), hands on the URL of every page
// and frame it learns of, and takes out its own messages only.
func TestWatcher(t *testing.T) {
	var urls []string
	var out []sent
	p := NewWatcher(func(u string) { urls = append(urls, u) })
	p.Start(func(b []byte) bool {
		var s sent
		json.Unmarshal(b, &s)
		out = append(out, s)
		return true
	})
	if len(out) != 1 || out[0].Method != "Target.attachToBrowserTarget" {
		t.Fatalf("%+v", out)
	}
	if p.Message(true, []byte(fmt.Sprintf(`{"id":%d,"result":{"sessionId":"GWB"}}`, out[0].ID))) {
		t.Fatal("its answer went to the client")
	}
	if len(out) != 2 || out[1].Method != "Target.setDiscoverTargets" || out[1].SessionID != "GWB" {
		t.Fatalf("after the attachment: %+v", out)
	}
	for _, m := range []string{
		`{"method":"Target.targetCreated","params":{"targetInfo":{"targetId":"T1","type":"page","url":"http://127.0.0.1:8080/login"}},"sessionId":"GWB"}`,
		`{"method":"Target.targetInfoChanged","params":{"targetInfo":{"targetId":"T1","type":"page","url":"https://example.com/x"}},"sessionId":"GWB"}`,
		`{"method":"Target.targetCreated","params":{"targetInfo":{"targetId":"F1","type":"iframe","url":"https://frame.example/"}},"sessionId":"GWB"}`,
		`{"method":"Target.targetCreated","params":{"targetInfo":{"targetId":"W1","type":"service_worker","url":"https://sw.example/sw.js"}},"sessionId":"GWB"}`,
	} {
		if p.Message(true, []byte(m)) {
			t.Fatalf("%s went to the client", m)
		}
	}
	if strings.Join(urls, " ") != "http://127.0.0.1:8080/login https://example.com/x https://frame.example/" {
		t.Fatalf("urls %v", urls)
	}
	if !p.Message(true, []byte(`{"method":"Target.targetCreated","params":{"targetInfo":{"targetId":"T2","type":"page","url":"https://client.example/"}}}`)) {
		t.Fatal("the client's own event was taken")
	}
	if p.Stopped() != "" {
		t.Fatal(p.Stopped())
	}
}
