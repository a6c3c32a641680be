package cdp

import (
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/browserfailover/caddy-browser-failover/profiles"
)

// Browser profiles: the gateway puts a client's profile into the browser
// before the client's first message (Restore), and reads it back at the
// session's end (Save), each a conversation of its own on the session's
// connection while no client hears it (upstreams.Talk: Converse before
// the relay, the session's last word at its end).
//
// Cookies go in and out of the browser's default context whole, every
// attribute as the browser has it (Storage.setCookies and
// Storage.getCookies on the root session, which speaks for the browser
// target: HttpOnly, Secure, SameSite, expiry, priority, source scheme and
// port, partition; session cookies too).
//
// localStorage is the page's: the browser serves an origin's storage
// (DOMStorage.setDOMStorageItem, getDOMStorageItems) only to a frame of
// that origin. So the conversation opens a page of its own
// (Target.createTarget, in the background), attached in a flat session
// of its own, whose every request it answers itself (Fetch.enable on
// that page only: Fetch.fulfillRequest with an empty document, service
// workers bypassed), and navigates it to each origin in turn: no request
// reaches the site, nothing of the site runs, and no page of the
// client's is touched. The page is closed at the end. A page created
// while another session of the connection auto-attaches new targets and
// holds them for its debugger (a client's setAutoAttach with
// waitForDebuggerOnStart, kept after the client left) is let run
// (Runtime.runIfWaitingForDebugger in that session).

// talkBase is where a profile conversation's IDs start (a random offset is
// added): above the participant's range, below the IDs a resume's reset
// uses (2147480001 on).
const talkBase = idBase + 2*idSpan

// emptyDocument is what the conversation's page gets for every request.
var emptyDocument = base64.StdEncoding.EncodeToString([]byte("<!doctype html><title></title>"))

// conversation is the machinery of one Restore or Save: its own IDs and
// flat sessions, and its page.
type conversation struct {
	send func([]byte) bool
	commands
	ours map[string]bool
	// page is its page's target ID ("" before it has one), session its
	// flat session on it; held are the sessions of other attachments
	// holding a page for their debugger, by target.
	page, session string
	held          map[string]string
	// opening: its page is being made; tabs are the tabs made for it.
	opening bool
	tabs    map[string]bool
	// done: it is over; err says why it failed ("": it did not).
	done bool
	err  string
}

func newConversation() conversation {
	return conversation{commands: newCommands(talkBase), ours: map[string]bool{}, held: map[string]string{}, tabs: map[string]bool{}}
}

// call sends a command in session ("": the root session); then is handed
// its answer.
func (c *conversation) call(session, method string, params any, then func(answer)) {
	p, _ := json.Marshal(params)
	id, b := c.command(session, method, p)
	if then == nil {
		then = func(answer) {}
	}
	c.calls[id] = then
	if !c.send(b) {
		delete(c.calls, id)
		c.fail("the provider's connection could not be written")
	}
}

// fail ends the conversation, unfinished, for why.
func (c *conversation) fail(why string) {
	if !c.done {
		c.done, c.err = true, why
	}
}

// finish ends the conversation, its work done.
func (c *conversation) finish() { c.done = true }

// failed reports a's error as the conversation's failure (true when a
// is one).
func (c *conversation) failed(a answer, what string) bool {
	if a.Error != nil {
		c.fail(what + ": " + clip(a.Error.Message))
		return true
	}
	return false
}

// heard takes one of the provider's messages: mine reports whether it was
// the conversation's (an answer to it, an event of its sessions or of its
// page).
func (c *conversation) heard(msg []byte, event func(method string, msg []byte)) (mine bool) {
	e, ok := readEnvelope(msg)
	if !ok {
		return false
	}
	if e.hasID {
		if !c.sent(e.id) {
			return false
		}
		c.answered(e.id, msg)
		return true
	}
	if e.sessionID != "" && c.ours[e.sessionID] {
		event(e.method, msg)
		return true
	}
	switch e.method {
	case "Target.attachedToTarget", "Target.detachedFromTarget", "Target.targetCreated", "Target.targetInfoChanged",
		"Target.targetDestroyed", "Target.targetCrashed":
		return c.targetEvent(e, msg)
	}
	return false
}

// targetEvent takes the Target events of the conversation's page, in any
// session: another attachment holding it for its debugger is told to let
// it run.
func (c *conversation) targetEvent(e envelope, msg []byte) bool {
	var ev struct {
		Params struct {
			SessionID          string     `json:"sessionId"`
			TargetID           string     `json:"targetId"`
			TargetInfo         targetInfo `json:"targetInfo"`
			WaitingForDebugger bool       `json:"waitingForDebugger"`
		} `json:"params"`
	}
	if json.Unmarshal(msg, &ev) != nil {
		return false
	}
	target := ev.Params.TargetInfo.TargetID
	if target == "" {
		target = ev.Params.TargetID
	}
	if c.ours[ev.Params.SessionID] {
		return true
	}
	if e.method == "Target.attachedToTarget" && ev.Params.WaitingForDebugger && ev.Params.SessionID != "" {
		switch {
		case c.opening && ev.Params.TargetInfo.Type == "tab":
			// The tab its page opens in (Chrome makes one for each new
			// page): held, it keeps the page from loading. No client
			// hears the connection meanwhile, so no other tab is made.
			c.tabs[target] = true
			c.call(ev.Params.SessionID, "Runtime.runIfWaitingForDebugger", struct{}{}, nil)
		case c.page == "" || target == c.page:
			// Perhaps its page, whose creation is not answered yet.
			c.held[target] = ev.Params.SessionID
			c.release(target)
		}
	}
	return c.page != "" && target == c.page || c.tabs[target]
}

// release lets the conversation's page run when another attachment holds
// it.
func (c *conversation) release(target string) {
	if c.page == "" || target != c.page {
		return
	}
	if s, ok := c.held[target]; ok {
		delete(c.held, target)
		c.call(s, "Runtime.runIfWaitingForDebugger", struct{}{}, nil)
	}
}

// openPage opens the conversation's page and attaches to it, answering
// every request it makes; then runs ready.
func (c *conversation) openPage(ready func()) {
	c.opening = true
	c.call("", "Target.createTarget", map[string]any{"url": "about:blank", "background": true}, func(a answer) {
		var r struct {
			TargetID string `json:"targetId"`
		}
		if c.failed(a, "opening a page") {
			return
		}
		if json.Unmarshal(a.Result, &r) != nil || r.TargetID == "" {
			c.fail("opening a page: the browser named no target")
			return
		}
		c.page = r.TargetID
		c.release(c.page)
		c.call("", "Target.attachToTarget", map[string]any{"targetId": c.page, "flatten": true}, func(a answer) {
			var r struct {
				SessionID string `json:"sessionId"`
			}
			if c.failed(a, "attaching to its page") {
				return
			}
			if json.Unmarshal(a.Result, &r) != nil || r.SessionID == "" {
				c.fail("attaching to its page: the browser named no session")
				return
			}
			c.session = r.SessionID
			c.ours[c.session] = true
			c.call(c.session, "Network.setBypassServiceWorker", map[string]any{"bypass": true}, nil)
			c.call(c.session, "Fetch.enable", map[string]any{"patterns": []map[string]string{{"urlPattern": "*", "requestStage": "Request"}}}, func(a answer) {
				if c.failed(a, "answering its page's requests") {
					return
				}
				ready()
			})
		})
	})
}

// pageEvent answers the requests of the conversation's page.
func (c *conversation) pageEvent(method string, msg []byte) {
	if method != "Fetch.requestPaused" {
		return
	}
	var ev struct {
		Params struct {
			RequestID string `json:"requestId"`
		} `json:"params"`
	}
	if json.Unmarshal(msg, &ev) != nil || ev.Params.RequestID == "" {
		return
	}
	c.call(c.session, "Fetch.fulfillRequest", map[string]any{
		"requestId": ev.Params.RequestID, "responseCode": 200,
		"responseHeaders": []map[string]string{{"name": "Content-Type", "value": "text/html; charset=utf-8"}, {"name": "Cache-Control", "value": "no-store"}},
		"body":            emptyDocument,
	}, nil)
}

// visit navigates the page to origin; then runs once it is there.
func (c *conversation) visit(origin string, then func()) {
	c.call(c.session, "Page.navigate", map[string]any{"url": origin + "/"}, func(a answer) {
		var r struct {
			ErrorText string `json:"errorText"`
		}
		if c.failed(a, "opening "+origin+" in its page") {
			return
		}
		if json.Unmarshal(a.Result, &r) == nil && r.ErrorText != "" {
			c.fail("opening " + origin + " in its page: " + clip(r.ErrorText))
			return
		}
		then()
	})
}

// closePage closes the conversation's page (if it has one); then ends
// the conversation.
func (c *conversation) closePage() {
	if c.page == "" {
		c.finish()
		return
	}
	c.call("", "Target.closeTarget", map[string]any{"targetId": c.page}, func(answer) { c.finish() })
}

// storageID is the DOMStorage ID of origin's localStorage.
func storageID(origin string) map[string]any {
	return map[string]any{"securityOrigin": origin, "isLocalStorage": true}
}

// Restore is the conversation that puts profile p into the browser's
// default context: its cookies, then each origin's localStorage. Use it
// as an upstreams.Talk once; Err says how it went.
type Restore struct {
	conversation
	p *profiles.Profile
}

// NewRestore is the restore of p.
func NewRestore(p *profiles.Profile) *Restore { return &Restore{conversation: newConversation(), p: p} }

// Begin starts it (upstreams.Talk).
func (r *Restore) Begin(send func([]byte) bool) {
	r.send = send
	if len(r.p.Cookies) == 0 {
		r.storage()
		return
	}
	params := make([]map[string]any, 0, len(r.p.Cookies))
	for _, ck := range r.p.Cookies {
		params = append(params, cookieParam(ck))
	}
	r.call("", "Storage.setCookies", map[string]any{"cookies": params}, func(a answer) {
		if !r.failed(a, "setting the cookies") {
			r.storage()
		}
	})
}

// storage puts each origin's localStorage in, through the page.
func (r *Restore) storage() {
	var todo []profiles.Origin
	for _, o := range r.p.Origins {
		if len(o.Items) > 0 && profiles.OriginOf(o.Origin) == o.Origin {
			todo = append(todo, o)
		}
	}
	if len(todo) == 0 {
		r.finish()
		return
	}
	r.openPage(func() { r.origin(todo, 0) })
}

// origin restores todo[i], then the next.
func (r *Restore) origin(todo []profiles.Origin, i int) {
	if i == len(todo) {
		r.closePage()
		return
	}
	o := todo[i]
	r.visit(o.Origin, func() {
		left := len(o.Items)
		for _, it := range o.Items {
			r.call(r.session, "DOMStorage.setDOMStorageItem", map[string]any{"storageId": storageID(o.Origin), "key": it[0], "value": it[1]}, func(a answer) {
				if r.failed(a, "restoring the localStorage of "+o.Origin) {
					return
				}
				if left--; left == 0 {
					r.origin(todo, i+1)
				}
			})
		}
	})
}

// Heard takes a message of the provider's (upstreams.Talk).
func (r *Restore) Heard(msg []byte) (mine, over bool) {
	mine = r.heard(msg, r.pageEvent)
	return mine, r.done
}

// Err is why the restore failed ("" when it is done, or under way).
func (r *Restore) Err() string {
	if !r.done {
		return "not finished"
	}
	return r.err
}

// cookieParam is cookie ck as Storage.setCookies takes it: every
// attribute the browser gave, a session cookie without an expiry.
func cookieParam(ck profiles.Cookie) map[string]any {
	m := map[string]any{"name": ck.Name, "value": ck.Value, "domain": ck.Domain, "path": ck.Path,
		"secure": ck.Secure, "httpOnly": ck.HTTPOnly}
	if !ck.Session && ck.Expires > 0 {
		m["expires"] = ck.Expires
	}
	if ck.SameSite != "" {
		m["sameSite"] = ck.SameSite
	}
	if ck.Priority != "" {
		m["priority"] = ck.Priority
	}
	if ck.SourceScheme != "" {
		m["sourceScheme"] = ck.SourceScheme
	}
	if ck.SourcePort > 0 {
		m["sourcePort"] = ck.SourcePort
	}
	if len(ck.PartitionKey) > 0 && string(ck.PartitionKey) != "null" {
		m["partitionKey"] = ck.PartitionKey
	}
	return m
}

// Save is the conversation that reads the browser's default context back
// into a profile: every cookie, and the localStorage of each origin it is
// given. Use it as an upstreams.Talk once; Result says how it went.
type Save struct {
	conversation
	origins []string
	p       profiles.Profile
}

// NewSave is the save of the cookies and of origins' localStorage.
func NewSave(origins []string) *Save {
	return &Save{conversation: newConversation(), origins: origins}
}

// Begin starts it (upstreams.Talk).
func (s *Save) Begin(send func([]byte) bool) {
	s.send = send
	s.call("", "Storage.getCookies", struct{}{}, func(a answer) {
		var r struct {
			Cookies []profiles.Cookie `json:"cookies"`
		}
		if s.failed(a, "reading the cookies") {
			return
		}
		if err := json.Unmarshal(a.Result, &r); err != nil {
			s.fail(fmt.Sprintf("reading the cookies: %v", err))
			return
		}
		s.p.Cookies = r.Cookies
		if s.p.Cookies == nil {
			s.p.Cookies = []profiles.Cookie{}
		}
		for i := range s.p.Cookies {
			if s.p.Cookies[i].Session {
				s.p.Cookies[i].Expires = 0
			}
		}
		s.storage()
	})
}

// storage reads each origin's localStorage, through the page.
func (s *Save) storage() {
	s.p.Origins = []profiles.Origin{}
	var todo []string
	for _, o := range s.origins {
		if profiles.OriginOf(o) == o {
			todo = append(todo, o)
		}
	}
	if len(todo) == 0 {
		s.finish()
		return
	}
	s.openPage(func() { s.origin(todo, 0) })
}

// origin reads todo[i], then the next.
func (s *Save) origin(todo []string, i int) {
	if i == len(todo) {
		s.closePage()
		return
	}
	o := todo[i]
	s.visit(o, func() {
		s.call(s.session, "DOMStorage.getDOMStorageItems", map[string]any{"storageId": storageID(o)}, func(a answer) {
			var r struct {
				Entries [][]string `json:"entries"`
			}
			if s.failed(a, "reading the localStorage of "+o) {
				return
			}
			if err := json.Unmarshal(a.Result, &r); err != nil {
				s.fail(fmt.Sprintf("reading the localStorage of %s: %v", o, err))
				return
			}
			if len(r.Entries) > 0 {
				or := profiles.Origin{Origin: o, Items: make([][2]string, 0, len(r.Entries))}
				for _, e := range r.Entries {
					if len(e) == 2 {
						or.Items = append(or.Items, [2]string{e[0], e[1]})
					}
				}
				s.p.Origins = append(s.p.Origins, or)
			}
			s.origin(todo, i+1)
		})
	})
}

// Heard takes a message of the provider's (upstreams.Talk).
func (s *Save) Heard(msg []byte) (mine, over bool) {
	mine = s.heard(msg, s.pageEvent)
	return mine, s.done
}

// Result is the profile read, or why it could not be read (the stored
// profile is then left as it is): the wait ended first, or the browser
// refused.
func (s *Save) Result() (*profiles.Profile, error) {
	switch {
	case !s.done:
		return nil, fmt.Errorf("the browser's profile was not read within the wait")
	case s.err != "":
		return nil, fmt.Errorf("the browser's profile could not be read: %s", s.err)
	}
	p := s.p
	return &p, nil
}
