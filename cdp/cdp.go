// Package cdp is the gateway as a participant in a client's CDP session:
// on the client's own WebSocket to the provider it speaks with message IDs
// of its own and flat CDP sessions of its own, and everything the browser
// answers or sends for them is taken out of what the client receives.
// Nothing runs in the pages, and no second connection is opened (a
// provider that starts a browser per connection, like browserless, is
// served the same).
//
// A Participant is the relay's tap (upstreams.Tap) of one session: it
// attaches to the browser target (Target.attachToBrowserTarget, flat), and
// in that session of its own follows every page target the browser has or
// opens (Target.setAutoAttach with flatten, Target.setDiscoverTargets for
// their URLs and titles); in each page's session it runs the screencast
// (Page.startScreencast) and acknowledges every frame. Frames and targets
// go to its Sink. The client's messages are never read (they go to the
// provider as they are); of the browser's, the participant reads only the
// envelope — ID, method, CDP session — of each, and the whole of its own.
//
// The IDs it sends with are in a range no client uses: from 2^31-2^28 up,
// under the 31 bits Chrome accepts and under the IDs a resume's reset
// uses (2147480001 on); CDP clients count theirs up from 1. An answer is
// the gateway's when its ID is one the participant is waiting for, or when
// it comes in one of the participant's CDP sessions; an event is when it
// comes in one of those sessions, or when it tells of one of them on the
// root session (Target.attachedToTarget and Target.detachedFromTarget of
// its attachment to the browser target). Everything else is the client's,
// relayed unchanged and in order.
package cdp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// Screencast is how the pages' screencast runs (Page.startScreencast).
type Screencast struct {
	// Format is "jpeg" or "png".
	Format string
	// Quality is the JPEG quality, 1–100.
	Quality int
	// MaxWidth and MaxHeight bound a frame: it is scaled down to fit.
	MaxWidth, MaxHeight int
	// EveryNthFrame sends one frame of every n the page renders.
	EveryNthFrame int
}

// Sink receives what the participant sees. Its methods are called on the
// relay's goroutine and must not block.
type Sink interface {
	// Target tells of a page target: when it is first followed, and
	// whenever its URL or title change.
	Target(id, url, title string)
	// Frame is one screencast frame of target id: its image, base64 as
	// the browser sent it (a copy the sink owns), and when it was drawn.
	Frame(target string, data []byte, at time.Time)
	// Unavailable tells that the browser cannot be followed (its endpoint
	// refused the attachment): the session goes on unrecorded.
	Unavailable(why string)
}

// idBase is where the participant's IDs start (a random offset is added
// per session).
const idBase = 1<<31 - 1<<28

// idSpan bounds the random offset.
const idSpan = 1 << 26

// maxOurs bounds the CDP sessions of the participant remembered after
// they ended (events of theirs may still come): the oldest are forgotten.
const maxOurs = 4096

// Participant is the gateway in one CDP session (the relay's tap).
// Its methods run on the relay's goroutine toward the client, one at a
// time (Start before the relay runs), so it has no lock.
type Participant struct {
	sc   Screencast
	sink Sink
	send func([]byte) bool
	// screen: it follows the pages' screens (a recording); urls, when
	// set, is handed the URL of every page and frame target it learns of
	// (a browser profile's origins).
	screen bool
	urls   func(url string)

	commands
	// attaching: the attachment to the browser target is asked (its
	// Target.attachedToTarget comes on the root session before its
	// answer).
	attaching bool
	browser   string            // its browser session
	pages     map[string]string // its page sessions: target ID by session
	// asked: per followed target, frames since its info was last asked
	// for (-1: to be asked at its next frame).
	asked     map[string]int
	ours      map[string]bool // every session of its own, ended ones too
	oursOrder []string
	// stopped is why the participant follows nothing ("" while it does).
	stopped string
}

// New makes the participant of one session; Start begins it.
func New(sc Screencast, sink Sink) *Participant {
	return &Participant{
		sc:       sc,
		sink:     sink,
		screen:   true,
		commands: newCommands(idBase),
		pages:    map[string]string{},
		asked:    map[string]int{},
		ours:     map[string]bool{},
	}
}

// NewWatcher makes a participant that follows no page's screen, only the
// URLs of the targets the browser has or opens (Target.setDiscoverTargets
// on its attachment to the browser target), each page's and frame's
// handed to urls as the browser tells it (Target.targetCreated,
// Target.targetInfoChanged). Nothing runs in the pages.
func NewWatcher(urls func(url string)) *Participant {
	p := New(Screencast{}, nil)
	p.screen, p.urls = false, urls
	return p
}

// WatchURLs has the participant also hand urls the URL of every page and
// frame target it learns of (a recorded session whose browser profile is
// kept). Call it before Start.
func (p *Participant) WatchURLs(urls func(url string)) { p.urls = urls }

// Start has the participant attach to the browser target, sending through
// send (the session's upstreams.Session.Send). Call it once, before the
// relay runs.
func (p *Participant) Start(send func([]byte) bool) {
	p.send = send
	p.attach()
}

// Stopped is why the participant follows nothing ("" while it does, or
// before its attachment is answered).
func (p *Participant) Stopped() string { return p.stopped }

// answer is the part of an answer the participant reads.
type answer struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// attach asks for a session of the participant's own on the browser
// target.
func (p *Participant) attach() {
	p.attaching = true
	p.call("", "Target.attachToBrowserTarget", "{}", func(a answer) {
		p.attaching = false
		if a.Error != nil {
			p.stop("unavailable: the browser refused the attachment to its browser target (" + clip(a.Error.Message) + ")")
			return
		}
		var r struct {
			SessionID string `json:"sessionId"`
		}
		if json.Unmarshal(a.Result, &r) != nil || r.SessionID == "" {
			p.stop("unavailable: the browser's answer to the attachment named no session")
			return
		}
		p.browser = r.SessionID
		p.own(r.SessionID)
		// Discovery first: a page's URL or title that changes while it is
		// being attached is told after its attachment, not missed.
		p.call(p.browser, "Target.setDiscoverTargets", `{"discover":true}`, nil)
		if p.screen {
			p.call(p.browser, "Target.setAutoAttach", `{"autoAttach":true,"waitForDebuggerOnStart":false,"flatten":true}`, func(a answer) {
				if a.Error != nil {
					p.stop("unavailable: the browser refused to attach to its pages (" + clip(a.Error.Message) + ")")
				}
			})
		}
	})
}

// stop has the participant follow nothing more, for why.
func (p *Participant) stop(why string) {
	if p.stopped != "" {
		return
	}
	p.stopped = why
	if p.sink != nil {
		p.sink.Unavailable(why)
	}
}

// clip shortens a browser's error text for a log.
func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// own notes a CDP session as the participant's.
func (p *Participant) own(session string) {
	if p.ours[session] {
		return
	}
	p.ours[session] = true
	p.oursOrder = append(p.oursOrder, session)
	if len(p.oursOrder) > maxOurs {
		old := p.oursOrder[0]
		p.oursOrder = p.oursOrder[1:]
		if old != p.browser && p.pages[old] == "" {
			delete(p.ours, old)
		}
	}
}

// call sends a command of the participant's in session ("": the root
// session); then, when not nil, is handed its answer.
func (p *Participant) call(session, method, params string, then func(answer)) {
	id, b := p.command(session, method, []byte(params))
	if p.send == nil || !p.send(b) {
		if method == "Target.attachToBrowserTarget" {
			p.attaching = false
		}
		return
	}
	if then != nil || session == "" {
		// An answer on the root session is known by its ID alone.
		if then == nil {
			then = func(answer) {}
		}
		p.calls[id] = then
	}
}

// Early tells the client's answers by their first bytes: an ID outside
// those the participant has sent with is the client's.
func (p *Participant) Early(text bool, head []byte) (keep, sure bool) {
	if !text {
		return true, true
	}
	if id, ok := leadingID(head); ok && !p.sent(id) {
		return true, true
	}
	return false, false
}

// Message judges a whole message of the browser's: the client gets it
// unless it is the participant's.
func (p *Participant) Message(text bool, msg []byte) bool {
	if !text {
		return true
	}
	e, ok := readEnvelope(msg)
	if !ok {
		return true
	}
	if e.hasID && p.sent(e.id) {
		// An answer to one of its commands, in whichever session it
		// comes (a proxy in front of the browser may answer a command
		// itself, in its own way).
		p.answered(e.id, msg)
		return false
	}
	if e.sessionID != "" {
		if !p.ours[e.sessionID] {
			return true
		}
		p.handle(e, msg)
		return false
	}
	if e.hasID {
		return true
	}
	switch e.method {
	case "Target.attachedToTarget", "Target.detachedFromTarget":
		return !p.rootTargetEvent(e.method, msg)
	}
	return true
}

// rootTargetEvent reports whether an attachment event on the root session
// is of the participant's own attachment to the browser target.
func (p *Participant) rootTargetEvent(method string, msg []byte) bool {
	var ev struct {
		Params struct {
			SessionID  string `json:"sessionId"`
			TargetInfo struct {
				Type string `json:"type"`
			} `json:"targetInfo"`
		} `json:"params"`
	}
	if json.Unmarshal(msg, &ev) != nil || ev.Params.SessionID == "" {
		return false
	}
	if p.ours[ev.Params.SessionID] {
		return true
	}
	if method == "Target.attachedToTarget" && p.attaching && p.browser == "" && ev.Params.TargetInfo.Type == "browser" {
		// The attachment's event comes before its answer.
		p.browser = ev.Params.SessionID
		p.own(ev.Params.SessionID)
		return true
	}
	return false
}

// Joined: a client joined the session after it had none (hold); what the
// browser sent meanwhile was dropped unseen, frames unacknowledged and
// pages attached unannounced among them. The participant lets its
// attachment go and attaches again.
func (p *Participant) Joined() {
	if p.stopped != "" {
		return
	}
	if p.browser != "" {
		p.call("", "Target.detachFromTarget", `{"sessionId":"`+p.browser+`"}`, nil)
	}
	p.browser = ""
	clear(p.pages)
	clear(p.asked)
	p.attach()
}

// targetInfo is a target as Target events describe it.
type targetInfo struct {
	TargetID string `json:"targetId"`
	Type     string `json:"type"`
	URL      string `json:"url"`
	Title    string `json:"title"`
}

// handle acts on a message in one of the participant's sessions.
func (p *Participant) handle(e envelope, msg []byte) {
	if e.hasID {
		p.answered(e.id, msg)
		return
	}
	if p.stopped != "" {
		return
	}
	switch e.method {
	case "Page.screencastFrame":
		p.frame(e.sessionID, msg)
	case "Target.attachedToTarget":
		var ev struct {
			Params struct {
				SessionID  string     `json:"sessionId"`
				TargetInfo targetInfo `json:"targetInfo"`
			} `json:"params"`
		}
		if e.sessionID != p.browser || json.Unmarshal(msg, &ev) != nil || ev.Params.SessionID == "" {
			return
		}
		s, t := ev.Params.SessionID, ev.Params.TargetInfo
		p.own(s)
		if t.Type != "page" {
			// Only pages are recorded: the others are let go.
			p.call(p.browser, "Target.detachFromTarget", `{"sessionId":"`+s+`"}`, nil)
			return
		}
		p.pages[s] = t.TargetID
		p.asked[t.TargetID] = -1
		p.sink.Target(t.TargetID, t.URL, t.Title)
		p.call(s, "Page.startScreencast", p.screencastParams(), nil)
	case "Target.detachedFromTarget":
		var ev struct {
			Params struct {
				SessionID string `json:"sessionId"`
			} `json:"params"`
		}
		if json.Unmarshal(msg, &ev) == nil {
			delete(p.asked, p.pages[ev.Params.SessionID])
			delete(p.pages, ev.Params.SessionID)
		}
	case "Target.targetInfoChanged", "Target.targetCreated":
		var ev struct {
			Params struct {
				TargetInfo targetInfo `json:"targetInfo"`
			} `json:"params"`
		}
		if e.sessionID != p.browser || json.Unmarshal(msg, &ev) != nil {
			return
		}
		if t := ev.Params.TargetInfo; p.urls != nil && (t.Type == "page" || t.Type == "iframe") && t.URL != "" {
			p.urls(t.URL)
		}
		if t := ev.Params.TargetInfo; t.Type == "page" && p.follows(t.TargetID) {
			p.sink.Target(t.TargetID, t.URL, t.Title)
			// A page's title is often not known yet as its URL
			// changes: asked again with its next frame.
			p.asked[t.TargetID] = -1
		}
	}
}

// follows reports whether the participant follows target id.
func (p *Participant) follows(id string) bool {
	for _, t := range p.pages {
		if t == id {
			return true
		}
	}
	return false
}

// infoEvery is how many frames of a page go by before its URL and title
// are asked for again (Target.getTargetInfo: the browser answers from
// what it knows of the page; nothing runs in it).
const infoEvery = 30

// askInfo asks for target's URL and title with one of its frames: the
// first after a URL change, then every infoEvery frames (a title set by a
// page's script is not always announced).
func (p *Participant) askInfo(target string) {
	n := p.asked[target]
	if n >= 0 && n < infoEvery {
		p.asked[target] = n + 1
		return
	}
	p.asked[target] = 0
	p.call(p.browser, "Target.getTargetInfo", `{"targetId":"`+target+`"}`, func(a answer) {
		var r struct {
			TargetInfo targetInfo `json:"targetInfo"`
		}
		if a.Error == nil && json.Unmarshal(a.Result, &r) == nil && r.TargetInfo.TargetID == target && p.follows(target) {
			p.sink.Target(target, r.TargetInfo.URL, r.TargetInfo.Title)
		}
	})
}

// screencastParams are Page.startScreencast's parameters.
func (p *Participant) screencastParams() string {
	sc := p.sc
	if sc.Format == "png" {
		return fmt.Sprintf(`{"format":"png","maxWidth":%d,"maxHeight":%d,"everyNthFrame":%d}`, sc.MaxWidth, sc.MaxHeight, max(sc.EveryNthFrame, 1))
	}
	return fmt.Sprintf(`{"format":"jpeg","quality":%d,"maxWidth":%d,"maxHeight":%d,"everyNthFrame":%d}`, sc.Quality, sc.MaxWidth, sc.MaxHeight, max(sc.EveryNthFrame, 1))
}

var dataKey = []byte(`"data":"`)

// frame acknowledges a screencast frame of the page in session and hands
// it to the sink. The image (base64, with no escape in it) is cut out of
// the message before the rest is decoded.
func (p *Participant) frame(session string, msg []byte) {
	var data []byte
	rest := msg
	if i := bytes.Index(msg, dataKey); i >= 0 {
		start := i + len(dataKey)
		if j := bytes.IndexByte(msg[start:], '"'); j >= 0 {
			data = msg[start : start+j]
			rest = make([]byte, 0, len(msg)-j)
			rest = append(append(rest, msg[:start]...), msg[start+j:]...)
		}
	}
	var ev struct {
		Params struct {
			Data     string `json:"data"`
			Metadata struct {
				Timestamp float64 `json:"timestamp"`
			} `json:"metadata"`
			SessionID int64 `json:"sessionId"`
		} `json:"params"`
	}
	if json.Unmarshal(rest, &ev) != nil {
		return
	}
	if data == nil {
		data = []byte(ev.Params.Data)
	}
	p.call(session, "Page.screencastFrameAck", `{"sessionId":`+strconv.FormatInt(ev.Params.SessionID, 10)+`}`, nil)
	target, ok := p.pages[session]
	if !ok || len(data) == 0 {
		return
	}
	p.askInfo(target)
	at := time.Now()
	if ts := ev.Params.Metadata.Timestamp; ts > 0 {
		sec := int64(ts)
		at = time.Unix(sec, int64((ts-float64(sec))*1e9))
	}
	p.sink.Frame(target, bytes.Clone(data), at)
}
