package fakes

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/coder/websocket"
)

// WebDriver is a fake WebDriver server (chromedriver-like) under a base
// path: POST <base>/session creates a session, <base>/session/<id>/…
// answers each command with what it received, DELETE <base>/session/<id>
// ends it, GET <base>/status says whether it is Ready, and a WebSocket
// upgrade to /session/<id> (the webSocketUrl it hands out when a create
// asks for one) echoes messages. It records every request and counts the
// TCP connections it accepted.
type WebDriver struct {
	Addr string
	Base string
	// OnCreate, when set, may answer a create itself (true when it did):
	// a 500, a 429, a body without a session ID, or a block.
	OnCreate func(w http.ResponseWriter, r *http.Request, body []byte) bool
	// OnCommand, when set, may answer a command itself (true when it
	// did), its body not read yet: one read as it arrives, say. A
	// command it answers is not recorded.
	OnCommand func(w http.ResponseWriter, r *http.Request) bool
	// SocketHost is the host[:port] of the webSocketUrl it hands out
	// (default: localhost:<its port>, as chromedriver does); CDP, when
	// set, makes it hand out se:cdp too (Selenium Grid does).
	SocketHost string
	CDP        bool
	// Grid, when set, makes the create answer carry what a Selenium Grid
	// node with chromedriver tells of itself, on the node's own address
	// (GridNode): se:vnc, se:vncEnabled, se:vncLocalAddress,
	// se:noVncPort, se:nodeHost, se:gridWebSocketUrl, se:containerName,
	// chrome.userDataDir beside chrome.chromedriverVersion, and
	// goog:processID.
	Grid bool
	// RefuseSockets makes it refuse a live session's socket with 400 and
	// a WebDriver error naming the session's ID.
	RefuseSockets bool
	// Ready is what /status says (true when made).
	Ready atomic.Bool

	mu       sync.Mutex
	live     map[string]bool
	deleted  map[string]int
	requests []WebDriverRequest
	conns    atomic.Int64
	closeFn  func()
}

// WebDriverRequest is one request a WebDriver fake received.
type WebDriverRequest struct {
	Method string
	// URI is the request URI as sent (escaped path and query).
	URI    string
	Header http.Header
	Body   []byte
	// ContentLength is the body's length as the request stated it (-1:
	// unknown, a chunked body).
	ContentLength int64
}

// NewWebDriver starts a fake WebDriver server under base ("" or like
// "/wd/hub").
func NewWebDriver(base string) *WebDriver {
	ln := listen()
	f := &WebDriver{Addr: ln.Addr().String(), Base: strings.TrimSuffix(base, "/"), live: map[string]bool{}, deleted: map[string]int{}}
	f.Ready.Store(true)
	srv := &http.Server{Handler: http.HandlerFunc(f.serve), ConnState: func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			f.conns.Add(1)
		}
	}}
	go srv.Serve(ln)
	f.closeFn = func() { srv.Close() }
	return f
}

// URL is the server's base URL, http://host:port<base>.
func (f *WebDriver) URL() string { return "http://" + f.Addr + f.Base }

// Close stops it.
func (f *WebDriver) Close() { f.closeFn() }

// Conns is the number of TCP connections it accepted.
func (f *WebDriver) Conns() int64 { return f.conns.Load() }

// Requests are the requests it received, in order.
func (f *WebDriver) Requests() []WebDriverRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]WebDriverRequest(nil), f.requests...)
}

// Deleted is how many DELETE requests session id got.
func (f *WebDriver) Deleted(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.deleted[id]
}

// Live lists the sessions not deleted.
func (f *WebDriver) Live() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for id := range f.live {
		out = append(out, id)
	}
	return out
}

// Plant makes id a live session, as if created earlier.
func (f *WebDriver) Plant(id string) {
	f.mu.Lock()
	f.live[id] = true
	f.mu.Unlock()
}

// Forget ends session id on the provider's side (its browser crashed):
// later commands get invalid session id.
func (f *WebDriver) Forget(id string) {
	f.mu.Lock()
	delete(f.live, id)
	f.mu.Unlock()
}

// WriteError answers a WebDriver error.
func WriteError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"value": map[string]string{"error": code, "message": message, "stacktrace": ""}})
}

func (f *WebDriver) serve(w http.ResponseWriter, r *http.Request) {
	path, ok := strings.CutPrefix(r.URL.EscapedPath(), f.Base)
	if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		f.socket(w, r)
		return
	}
	if ok && strings.HasPrefix(path, "/session/") && f.OnCommand != nil && f.OnCommand(w, r) {
		return
	}
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.requests = append(f.requests, WebDriverRequest{Method: r.Method, URI: r.RequestURI, Header: r.Header.Clone(), Body: body, ContentLength: r.ContentLength})
	f.mu.Unlock()
	switch {
	case !ok:
		WriteError(w, http.StatusNotFound, "unknown command", "outside the base")
	case path == "/status" && r.Method == http.MethodGet:
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		json.NewEncoder(w).Encode(map[string]any{"value": map[string]any{"ready": f.Ready.Load(), "message": "fake"}})
	case path == "/session" && r.Method == http.MethodPost:
		if f.OnCreate != nil && f.OnCreate(w, r, body) {
			return
		}
		f.create(w, body)
	case strings.HasPrefix(path, "/session/"):
		id, rest, _ := strings.Cut(strings.TrimPrefix(path, "/session/"), "/")
		f.mu.Lock()
		live := f.live[id]
		if r.Method == http.MethodDelete && rest == "" {
			f.deleted[id]++
			delete(f.live, id)
		}
		f.mu.Unlock()
		switch {
		case !live:
			WriteError(w, http.StatusNotFound, "invalid session id", "no such session")
		case r.Method == http.MethodDelete && rest == "":
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			io.WriteString(w, `{"value":null}`)
		case rest == "se/cdp":
			// What chromedriver answers a plain HTTP request there.
			WriteError(w, http.StatusNotFound, "unknown command", "unknown command: session/"+id+"/se/cdp")
		default:
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			json.NewEncoder(w).Encode(map[string]any{"value": map[string]any{
				"method": r.Method, "uri": r.RequestURI, "body": string(body)}})
		}
	default:
		WriteError(w, http.StatusNotFound, "unknown command", "no such command")
	}
}

func (f *WebDriver) create(w http.ResponseWriter, body []byte) {
	var req struct {
		Capabilities struct {
			AlwaysMatch map[string]any   `json:"alwaysMatch"`
			FirstMatch  []map[string]any `json:"firstMatch"`
		} `json:"capabilities"`
	}
	if json.Unmarshal(body, &req) != nil {
		WriteError(w, http.StatusBadRequest, "invalid argument", "not JSON")
		return
	}
	var b [8]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	caps := map[string]any{"browserName": "chrome", "browserVersion": "120.0",
		"goog:chromeOptions": map[string]any{"debuggerAddress": "localhost:45678"}}
	for k, v := range req.Capabilities.AlwaysMatch {
		if k != "webSocketUrl" {
			caps[k] = v
		}
	}
	host := f.SocketHost
	if host == "" {
		_, port, _ := net.SplitHostPort(f.Addr)
		host = "localhost:" + port
	}
	if v, _ := req.Capabilities.AlwaysMatch["webSocketUrl"].(bool); v {
		caps["webSocketUrl"] = "ws://" + host + "/session/" + id
	}
	if f.CDP {
		caps["se:cdp"] = "ws://" + host + "/session/" + id + "/se/cdp"
	}
	if f.Grid {
		caps["se:vnc"] = "ws://" + GridNode + ":4444/session/" + id + "/se/vnc"
		caps["se:vncEnabled"] = true
		caps["se:vncLocalAddress"] = "ws://" + GridNode + ":7900"
		caps["se:noVncPort"] = 7900
		caps["se:nodeHost"] = GridNode
		caps["se:gridWebSocketUrl"] = "ws://" + GridNode + ":4444"
		caps["se:containerName"] = "selenium-node-chrome-7"
		caps["chrome"] = map[string]any{"chromedriverVersion": "120.0.6099.109", "userDataDir": "/tmp/.org.chromium.Chromium.fake"}
		caps["goog:processID"] = 48151
	}
	f.mu.Lock()
	f.live[id] = true
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	json.NewEncoder(w).Encode(map[string]any{"value": map[string]any{"sessionId": id, "capabilities": caps}})
}

// GridNode is the address a Grid-shaped create answer names as its node's.
const GridNode = "10.11.12.13"

// socket accepts a live session's BiDi or CDP socket and echoes it.
func (f *WebDriver) socket(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests = append(f.requests, WebDriverRequest{Method: r.Method, URI: r.RequestURI, Header: r.Header.Clone()})
	id, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/session/"), "/")
	live := f.live[id]
	f.mu.Unlock()
	if !live {
		http.Error(w, "no such session", http.StatusNotFound)
		return
	}
	if f.RefuseSockets {
		WriteError(w, http.StatusBadRequest, "invalid argument", "no socket for session "+id)
		return
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return
	}
	EchoMessages(c)
}
