package upstreams

// What of the provider a WebDriver client must not see: the capabilities
// of a create answer that tell where the provider runs (stripInternals),
// and the provider's session ID in any answer, which is replaced by the
// ID the client knows the session by (IDRewriter), as the answer streams.

import (
	"bytes"
	"io"
	"strings"
)

// providerInternal is a capability a create answer loses.
type providerInternal struct {
	// in is the capability holding it ("": the capabilities object
	// itself); name is its name there.
	in, name string
	// prefix: every name starting with name, ASCII case ignored.
	prefix bool
}

// providerInternals are the capabilities a create answer loses, each
// because it tells the client where the provider runs or how to reach
// its machine past the gateway. Everything else a provider answers goes
// to the client (Answer also removes any string naming the provider's
// host, session ID or secrets).
var providerInternals = []providerInternal{
	// Chrome's and Edge's DevTools address on the provider's machine:
	// a way to the browser past the gateway.
	{in: "goog:chromeOptions", name: "debuggerAddress"},
	{in: "ms:edgeOptions", name: "debuggerAddress"},
	// Firefox's, likewise.
	{name: "moz:debuggerAddress"},
	// Selenium Grid's VNC: se:vnc (a socket to the node's screen),
	// se:vncEnabled, se:vncLocalAddress (the node's own address) …
	{name: "se:vnc", prefix: true},
	// … and the port of the node's noVNC server.
	{name: "se:noVnc", prefix: true},
	// The Grid node's address, and the Grid's own socket URL.
	{name: "se:nodeHost"},
	{name: "se:gridWebSocketUrl"},
	// The container the browser runs in (Grid in Docker).
	{name: "se:containerName"},
	// The browser's profile directory on the provider's disk: Firefox's,
	// chromedriver's ("chrome":{"chromedriverVersion":…,"userDataDir":…})
	// and msedgedriver's.
	{name: "moz:profile"},
	{in: "chrome", name: "userDataDir"},
	{in: "msedge", name: "userDataDir"},
	// The browser's process ID on the provider's machine.
	{name: "moz:processID"},
	{name: "goog:processID"},
}

// stripInternals removes providerInternals from caps.
func stripInternals(caps map[string]any) {
	for _, pi := range providerInternals {
		m := caps
		if pi.in != "" {
			m, _ = caps[pi.in].(map[string]any)
		}
		for k := range m {
			if k == pi.name || (pi.prefix && len(k) >= len(pi.name) && strings.EqualFold(k[:len(pi.name)], pi.name)) {
				delete(m, k)
			}
		}
	}
}

// minReplacedID is the length from which a provider's session ID is
// replaced wherever it is in an answer. A shorter one could be part of
// any large answer (a screenshot's base64) by chance; it is replaced only
// where it stands as a whole JSON string.
const minReplacedID = 8

// IDRewriter writes to its writer what it is given, with s's provider
// session ID replaced by the client's ID of the session, as it goes: it
// holds back at most the ID's length less one byte, never a whole answer.
// Flush writes what it holds back once the answer has ended.
type IDRewriter struct {
	w        io.Writer
	old, new []byte
	held     []byte
	buf      []byte
	n        int64
}

// Rewriter returns an IDRewriter for answers of s to w, the provider's
// session ID replaced by clientID.
func (s *WebDriverSession) Rewriter(w io.Writer, clientID string) *IDRewriter {
	old, repl := s.ID, clientID
	if len(old) < minReplacedID {
		old, repl = `"`+old+`"`, `"`+repl+`"`
	}
	return &IDRewriter{w: w, old: []byte(old), new: []byte(repl)}
}

// SameLength reports whether an answer keeps its length (its
// Content-Length holds): the two IDs are as long.
func (r *IDRewriter) SameLength() bool { return len(r.old) == len(r.new) }

// Written counts the bytes written to the writer.
func (r *IDRewriter) Written() int64 { return r.n }

// Write takes p, writing on what cannot be the start of the ID.
func (r *IDRewriter) Write(p []byte) (int, error) {
	if len(r.old) == 0 {
		return r.out(p, len(p))
	}
	r.buf = append(append(r.buf[:0], r.held...), p...)
	data := r.buf
	for {
		i := bytes.Index(data, r.old)
		if i < 0 {
			break
		}
		if _, err := r.out(data[:i], 0); err != nil {
			return 0, err
		}
		if _, err := r.out(r.new, 0); err != nil {
			return 0, err
		}
		data = data[i+len(r.old):]
	}
	keep := heldBack(data, r.old)
	if _, err := r.out(data[:len(data)-keep], 0); err != nil {
		return 0, err
	}
	r.held = append(r.held[:0], data[len(data)-keep:]...)
	return len(p), nil
}

// heldBack is the length of the longest end of data that begins old
// (shorter than old).
func heldBack(data, old []byte) int {
	for k := min(len(old)-1, len(data)); k > 0; k-- {
		if bytes.HasPrefix(old, data[len(data)-k:]) {
			return k
		}
	}
	return 0
}

// Flush writes what was held back: the answer has ended.
func (r *IDRewriter) Flush() error {
	_, err := r.out(r.held, 0)
	r.held = r.held[:0]
	return err
}

func (r *IDRewriter) out(b []byte, ret int) (int, error) {
	if len(b) == 0 {
		return ret, nil
	}
	n, err := r.w.Write(b)
	r.n += int64(n)
	return ret, err
}

// Rewrite is b, a whole answer of s's provider (an error it gave), with
// the provider's session ID replaced by clientID as IDRewriter does.
func (s *WebDriverSession) Rewrite(b []byte, clientID string) []byte {
	var out bytes.Buffer
	r := s.Rewriter(&out, clientID)
	r.Write(b)
	r.Flush()
	return out.Bytes()
}
