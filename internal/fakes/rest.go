package fakes

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
)

// REST is a fake cloud provider that creates browser sessions over REST,
// Browserbase-style: POST /v1/sessions answers {"id":…, "connectUrl":…};
// POST /v1/sessions/<id>/release releases one. It keeps its own books of
// what it created and what was released, which the tests compare.
type REST struct {
	Addr string
	// Connect gives the connect URL of each new session (default: "").
	Connect func(id string) string
	// OnCreate, when set, may answer a create call itself (it returns
	// true when it did), e.g. with 429 or a body without connectUrl; it
	// may also block, for a slow create. It runs before the session is
	// booked.
	OnCreate func(w http.ResponseWriter, r *http.Request) bool
	// OnRelease, when set, may answer a release call itself (true when it
	// did, and the session is then not released), or block.
	OnRelease func(w http.ResponseWriter, r *http.Request, id string) bool
	// Pad, when above 0, adds a "padding" string of that many bytes to
	// each create answer (a large answer); with PadFirst it comes before
	// the session's ID, otherwise after every other field.
	Pad      int
	PadFirst bool

	mu        sync.Mutex
	created   []string
	released  map[string]int
	unknown   int
	creates   []http.Header
	bodies    [][]byte
	relBodies [][]byte
	requests  []string
	seq       atomic.Int64
	closeFn   func()
	scheme    string
}

// NewREST starts a fake REST provider whose sessions connect to connect's
// result.
func NewREST(connect func(id string) string) *REST {
	ln := listen()
	f := &REST{Addr: ln.Addr().String(), Connect: connect, released: map[string]int{}, scheme: "http"}
	srv := &http.Server{Handler: http.HandlerFunc(f.serve)}
	go srv.Serve(ln)
	f.closeFn = func() { srv.Close() }
	return f
}

// NewRESTTLS is NewREST over https, with a certificate of its own that
// no one trusts (a client skips verifying it).
func NewRESTTLS(connect func(id string) string) *REST {
	f := &REST{Connect: connect, released: map[string]int{}, scheme: "https"}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	srv.StartTLS()
	f.Addr = srv.Listener.Addr().String()
	f.closeFn = srv.Close
	return f
}

// URL is the provider's base URL, http://host:port (https:// for
// NewRESTTLS).
func (f *REST) URL() string { return f.scheme + "://" + f.Addr }

// Close stops it.
func (f *REST) Close() { f.closeFn() }

func (f *REST) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.requests = append(f.requests, r.Method+" "+r.RequestURI)
	f.mu.Unlock()
	path := r.URL.Path
	switch {
	case r.Method == http.MethodPost && path == "/v1/sessions":
		f.mu.Lock()
		f.creates = append(f.creates, r.Header.Clone())
		f.bodies = append(f.bodies, body)
		f.mu.Unlock()
		if f.OnCreate != nil && f.OnCreate(w, r) {
			return
		}
		id := fmt.Sprintf("s%d", f.seq.Add(1))
		f.mu.Lock()
		f.created = append(f.created, id)
		f.mu.Unlock()
		cu := ""
		if f.Connect != nil {
			cu = f.Connect(id)
		}
		w.Header().Set("Content-Type", "application/json")
		f.writeCreated(w, id, cu)
	case r.Method == http.MethodPost && strings.HasPrefix(path, "/v1/sessions/") && strings.HasSuffix(path, "/release"):
		id := strings.TrimSuffix(strings.TrimPrefix(path, "/v1/sessions/"), "/release")
		if f.OnRelease != nil && f.OnRelease(w, r, id) {
			return
		}
		f.mu.Lock()
		f.relBodies = append(f.relBodies, body)
		known := false
		for _, c := range f.created {
			known = known || c == id
		}
		if !known {
			f.unknown++
			f.mu.Unlock()
			http.Error(w, "no such session", http.StatusNotFound)
			return
		}
		f.released[id]++
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"COMPLETED"}`)
	case r.Method == http.MethodGet && path == "/v1/sessions":
		// The sessions created and not released yet, as {"sessions":
		// [{"id": …}, …]}.
		f.mu.Lock()
		live := []map[string]string{}
		for _, id := range f.created {
			if f.released[id] == 0 {
				live = append(live, map[string]string{"id": id})
			}
		}
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"sessions": live})
	default:
		http.Error(w, "not found", http.StatusNotFound)
	}
}

// Plant makes a session the provider holds that no gateway created (as
// another client of the same account would), to be listed and released.
func (f *REST) Plant(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.created = append(f.created, id)
}

// writeCreated writes a create answer, its fields in order (padding first
// or last).
func (f *REST) writeCreated(w io.Writer, id, connectURL string) {
	str := func(v string) string { b, _ := json.Marshal(v); return string(b) }
	fields := []string{`"id":` + str(id), `"connectUrl":` + str(connectURL), `"status":"RUNNING"`}
	if f.Pad > 0 {
		pad := `"padding":"` + strings.Repeat("x", f.Pad) + `"`
		if f.PadFirst {
			fields = append([]string{pad}, fields...)
		} else {
			fields = append(fields, pad)
		}
	}
	io.WriteString(w, "{"+strings.Join(fields, ",")+"}\n")
}

// Books is what the fake created and released.
type Books struct {
	// Created is every session created, in order.
	Created []string
	// Released counts the release calls of each session.
	Released map[string]int
	// Unknown counts release calls for sessions it never created.
	Unknown int
}

// Books returns its books.
func (f *REST) Books() Books {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := Books{Created: append([]string(nil), f.created...), Released: map[string]int{}, Unknown: f.unknown}
	for k, v := range f.released {
		b.Released[k] = v
	}
	return b
}

// Balanced reports whether every session created was released exactly
// once and nothing else was released; the error says what is off.
func (b Books) Balanced() error {
	var problems []string
	for _, id := range b.Created {
		if n := b.Released[id]; n != 1 {
			problems = append(problems, fmt.Sprintf("%s released %d times", id, n))
		}
	}
	if b.Unknown > 0 {
		problems = append(problems, fmt.Sprintf("%d releases of unknown sessions", b.Unknown))
	}
	if len(problems) > 0 {
		return fmt.Errorf("created %d, released %d: %s", len(b.Created), len(b.Released), strings.Join(problems, "; "))
	}
	return nil
}

// Creates returns the header of each create call.
func (f *REST) Creates() []http.Header {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]http.Header(nil), f.creates...)
}

// CreateBodies returns the body of each create call.
func (f *REST) CreateBodies() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]byte(nil), f.bodies...)
}

// ReleaseBodies returns the body of each release call that released.
func (f *REST) ReleaseBodies() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]byte(nil), f.relBodies...)
}

// Requests returns every request it was sent, as "METHOD request-URI"
// (the path and query as they came, still escaped), in order.
func (f *REST) Requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}
