package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/status"
)

// The tests of this file take sessions back after their client left them
// (resume), with real Puppeteer and Playwright clients and real Chromium
// providers. A session is taken back with its resume token, a secret of
// its client: each client here brings its own on its first connect
// (?bf_resume_token=, as real Puppeteer and Playwright cannot read the
// 101's headers), except in TestResumeKey, whose Go client reads the one
// the gateway hands out on the 101; a resume presents it (?bf_resume= or
// the Browser-Failover-Resume header). The session ID, which operators
// see, never takes a session back. Each Chromium sits behind a small TCP proxy of this file that
// records every connection the gateway makes to it, so that a test can
// tell that a resume went to the session's browser and nowhere else; the
// proxy can also play a provider that kills its browser as soon as the
// gateway's WebSocket connection to it closes.

// driver is js/resume.mjs: commands on its stdin, one answer line each.
type driver struct {
	n  *NodeProc
	in io.WriteCloser
}

// startDriver starts js/resume.mjs; it ends at cleanup.
func startDriver(t *testing.T) *driver {
	t.Helper()
	pr, pw := io.Pipe()
	cmd := nodeCmd(context.Background(), t, "resume.mjs")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := startProc(t, cmd, pw)
	// Runs before startProc's kill: end of input first, then a polite stop.
	t.Cleanup(func() {
		in.Close()
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
		}
		p.stop(5 * time.Second)
	})
	return &driver{n: nodeLines(p, pr, pw), in: in}
}

// do sends one command and returns its answer, which must start with
// want (an ERROR answer, the script's end or nodeTimeout fail the test).
func (d *driver) do(t *testing.T, want, format string, args ...any) string {
	t.Helper()
	cmd := fmt.Sprintf(format, args...)
	start := time.Now()
	if _, err := io.WriteString(d.in, cmd+"\n"); err != nil {
		t.Fatalf("driver: writing %q: %v\n%s", cmd, err, d.n.Output())
	}
	timer := time.NewTimer(nodeTimeout)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-d.n.lines:
			if !ok {
				<-d.n.p.done
				t.Fatalf("driver ended (%v) during %q; stderr:\n%s", d.n.p.err, cmd, d.n.Output())
			}
			t.Logf("driver: %s → %s (%v)", cmd, line, time.Since(start).Round(time.Millisecond))
			if strings.HasPrefix(line, "ERROR ") {
				t.Fatalf("driver: %s: %s\nstderr:\n%s", cmd, line, d.n.Output())
			}
			if strings.HasPrefix(line, want) {
				return line
			}
		case <-timer.C:
			t.Fatalf("driver: no answer to %q within %v; stderr:\n%s", cmd, nodeTimeout, d.n.Output())
		}
	}
}

// connect runs "connect label url" and returns the session ID the
// gateway's 101 carried. url brings the client's own resume token, or
// presents one: the gateway hands out none.
func (d *driver) connect(t *testing.T, label, url string) string {
	t.Helper()
	f := strings.Fields(d.do(t, "CONNECTED "+label+" ", "connect %s %s", label, url))
	if len(f) != 5 || len(f[2]) < 22 { // 128 bits, base64url
		t.Fatalf("connect %s: answer %q has no session ID", label, strings.Join(f, " "))
	}
	if f[4] != "-" {
		t.Fatalf("connect %s: the client brought its resume token, and the 101 handed out another: %s", url, f[4])
	}
	return f[2]
}

// resumeToken is a fresh resume token of a client's own: 16 random bytes
// in base64url, 22 characters.
func resumeToken(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// wantSecret checks that the resume token tok is nowhere an operator
// looks: not in the admin API's sessions list, nor in its status, nor in
// the gateway's log.
func wantSecret(t *testing.T, g *testgw.Gateway, tok string) {
	t.Helper()
	for _, path := range []string{status.SessionsPath, status.StatusPath} {
		code, b, err := g.AdminDo(http.MethodGet, path, nil)
		if err != nil || code != http.StatusOK {
			t.Fatalf("%s: %d (%v)", path, code, err)
		}
		if bytes.Contains(b, []byte(tok)) {
			t.Fatalf("%s shows the resume token %s: %s", path, tok, b)
		}
	}
	if strings.Contains(g.Logs(), tok) {
		t.Fatalf("the gateway's log shows the resume token %s", tok)
	}
}

// wantNotForwarded checks that no request the gateway made to the
// providers behind px (discovery or upgrade) carried a resume item: no
// bf_resume or bf_resume_token in its URI, no Browser-Failover-Resume or
// Browser-Failover-Resume-Token header, none of the tokens anywhere.
func wantNotForwarded(t *testing.T, tokens []string, px ...*cdpProxy) {
	t.Helper()
	n := 0
	for _, p := range px {
		for _, h := range p.heads() {
			n++
			l := strings.ToLower(h)
			bad := strings.Contains(l, "bf_resume") || strings.Contains(l, "browser-failover-resume")
			for _, tok := range tokens {
				bad = bad || strings.Contains(h, tok)
			}
			if bad {
				t.Fatalf("a provider got a resume item:\n%s", h)
			}
		}
	}
	t.Logf("%d provider requests, none with a resume item", n)
}

// refused runs "connect label url" for a resume that must be refused with
// status and returns the answer's body.
func (d *driver) refused(t *testing.T, label, url string, status int) string {
	t.Helper()
	line := d.do(t, "", "connect %s %s", label, url)
	prefix := fmt.Sprintf("REFUSED %s %d ", label, status)
	if !strings.HasPrefix(line, prefix) {
		t.Fatalf("connect %s: %q, want %q…", url, line, prefix)
	}
	body := strings.TrimPrefix(line, prefix)
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil || m["error"] == nil {
		t.Fatalf("refused resume's body %q is not a JSON error (%v)", body, err)
	}
	return body
}

// wantPage checks a CHECK, PW or RAW answer: the page was found, with
// window.x === 42.
func wantPage(t *testing.T, answer string) {
	t.Helper()
	if !strings.Contains(answer, " found=true ") || !strings.HasSuffix(answer, " x=42") {
		t.Fatalf("the page is not there with x === 42: %s", answer)
	}
}

// cdpProxy is a TCP proxy in front of one Chromium's DevTools port. It
// tells HTTP connections (discovery) from WebSocket upgrades, and records
// each upgrade: its path, when it opened and closed, which side ended it
// first, and the close frames the gateway sent the browser. With kill, it
// kills the browser as soon as an upgraded connection ends: a provider
// whose browser lives as long as its socket.
type cdpProxy struct {
	t      *testing.T
	ln     net.Listener
	target *Chromium
	kill   bool

	mu      sync.Mutex
	plain   int      // connections that were not upgrades
	plainH  []string // their request heads
	failed  int      // connections it could not pass on (the browser is gone)
	ups     []*proxied
	conns   map[net.Conn]struct{}
	closing bool
	wg      sync.WaitGroup
}

// proxied is one upgraded connection as the proxy saw it.
type proxied struct {
	Path string
	// Head is the upgrade request's head as the gateway sent it.
	Head           string
	Opened, Closed time.Time // Closed is zero while it is open
	// By is the side whose TCP connection ended first: "gateway" or
	// "browser" (Chrome closes its side first once it answered a close
	// frame).
	By string
	// Closes are the close frames the gateway sent the browser, as
	// "code reason".
	Closes []string
}

// startProxy starts a proxy in front of c, closed at cleanup.
func startProxy(t *testing.T, c *Chromium, kill bool) *cdpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cdpProxy{t: t, ln: ln, target: c, kill: kill, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// HTTPURL is the provider URL of the browser behind the proxy.
func (p *cdpProxy) HTTPURL() string { return "http://" + p.ln.Addr().String() }

func (p *cdpProxy) close() {
	p.mu.Lock()
	p.closing = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

// track registers c (false: the proxy is closing).
func (p *cdpProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *cdpProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *cdpProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(c)
		}()
	}
}

// handle reads the request's head, passes the connection on to the
// browser, and records it.
func (p *cdpProxy) handle(c net.Conn) {
	defer p.untrack(c)
	br := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	var head bytes.Buffer
	path, upgrade := "", false
	for head.Len() < 64<<10 {
		line, err := br.ReadSlice('\n')
		head.Write(line)
		if err != nil {
			return
		}
		s := strings.TrimSpace(string(line))
		if path == "" {
			if f := strings.Fields(s); len(f) == 3 {
				path = f[1]
			}
		}
		if k, v, ok := strings.Cut(s, ":"); ok && strings.EqualFold(strings.TrimSpace(k), "upgrade") &&
			strings.EqualFold(strings.TrimSpace(v), "websocket") {
			upgrade = true
		}
		if s == "" {
			break
		}
	}
	c.SetReadDeadline(time.Time{})
	b, err := net.DialTimeout("tcp", p.target.Addr, 5*time.Second)
	if err != nil {
		// The browser is gone: the gateway's handshake fails.
		p.mu.Lock()
		p.failed++
		p.mu.Unlock()
		return
	}
	if !p.track(b) {
		return
	}
	defer p.untrack(b)
	if _, err := b.Write(head.Bytes()); err != nil {
		return
	}
	var rec *proxied
	p.mu.Lock()
	if upgrade {
		rec = &proxied{Path: path, Head: head.String(), Opened: time.Now()}
		p.ups = append(p.ups, rec)
	} else {
		p.plain++
		p.plainH = append(p.plainH, head.String())
	}
	p.mu.Unlock()
	ended := func(by string) {
		p.mu.Lock()
		first := rec != nil && rec.Closed.IsZero()
		if first {
			rec.Closed, rec.By = time.Now(), by
		}
		p.mu.Unlock()
		if first && p.kill {
			// The provider ends the browser with its socket.
			p.target.Kill()
		}
		c.Close()
		b.Close()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(c, b)
		ended("browser")
	}()
	var from io.Reader = br
	if upgrade {
		// What follows the 101 from the gateway is WebSocket frames.
		from = io.TeeReader(br, &frameSniffer{onClose: func(s string) {
			p.mu.Lock()
			rec.Closes = append(rec.Closes, s)
			p.mu.Unlock()
		}})
	}
	io.Copy(b, from)
	ended("gateway")
	<-done
}

// upgrades returns a copy of the upgraded connections so far.
func (p *cdpProxy) upgrades() []proxied {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]proxied, len(p.ups))
	for i, u := range p.ups {
		out[i] = *u
		out[i].Closes = append([]string(nil), u.Closes...)
	}
	return out
}

// heads returns the head of every request passed on to the browser
// (discovery and upgrades).
func (p *cdpProxy) heads() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := append([]string(nil), p.plainH...)
	for _, u := range p.ups {
		out = append(out, u.Head)
	}
	return out
}

// contacts counts every connection the gateway made to the proxy.
func (p *cdpProxy) contacts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.plain + p.failed + len(p.ups)
}

// frameSniffer follows the WebSocket frames of a client-to-server stream
// (masked) and reports each close frame's code and reason. It only reads.
type frameSniffer struct {
	head    []byte // the current frame's header, while incomplete
	left    uint64 // payload bytes of the current frame still to come
	isClose bool
	mask    [4]byte
	payload []byte // a close frame's payload so far
	onClose func(string)
}

func (f *frameSniffer) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		if f.left > 0 {
			k := uint64(len(b))
			if k > f.left {
				k = f.left
			}
			if f.isClose {
				f.payload = append(f.payload, b[:k]...)
			}
			f.left -= k
			b = b[k:]
			if f.left == 0 && f.isClose {
				f.closeFrame()
			}
			continue
		}
		f.head = append(f.head, b[0])
		b = b[1:]
		if len(f.head) < 2 {
			continue
		}
		size := 2
		switch f.head[1] & 0x7f {
		case 126:
			size += 2
		case 127:
			size += 8
		}
		if f.head[1]&0x80 != 0 {
			size += 4
		}
		if len(f.head) < size {
			continue
		}
		var length uint64
		switch l := f.head[1] & 0x7f; l {
		case 126:
			length = uint64(binary.BigEndian.Uint16(f.head[2:4]))
		case 127:
			length = binary.BigEndian.Uint64(f.head[2:10])
		default:
			length = uint64(l)
		}
		if f.head[1]&0x80 != 0 {
			copy(f.mask[:], f.head[size-4:size])
		} else {
			f.mask = [4]byte{}
		}
		f.isClose = f.head[0]&0x0f == 0x8
		f.left, f.payload, f.head = length, f.payload[:0], f.head[:0]
		if f.left == 0 && f.isClose {
			f.closeFrame()
		}
	}
	return n, nil
}

func (f *frameSniffer) closeFrame() {
	p := make([]byte, len(f.payload))
	for i := range f.payload {
		p[i] = f.payload[i] ^ f.mask[i%4]
	}
	if len(p) < 2 {
		f.onClose("1005")
		return
	}
	f.onClose(strconv.Itoa(int(binary.BigEndian.Uint16(p))) + " " + string(p[2:]))
}

// logEntry waits for the log entry msg whose field key is value, and
// returns it.
func logEntry(t *testing.T, g *testgw.Gateway, msg, key, value string) map[string]any {
	t.Helper()
	var found map[string]any
	testgw.Eventually(t, 30*time.Second, fmt.Sprintf("a %q log entry with %s %s", msg, key, value), func() bool {
		for _, e := range g.LogEntries(msg) {
			if e[key] == value {
				found = e
				return true
			}
		}
		return false
	})
	return found
}

// logTime is a log entry's time.
func logTime(e map[string]any) time.Time {
	ts, _ := e["ts"].(float64)
	return time.Unix(0, int64(ts*1e9))
}

// sessionsList reads the admin API's sessions list.
func sessionsList(t *testing.T, g *testgw.Gateway) []status.Session {
	t.Helper()
	code, b, err := g.AdminDo(http.MethodGet, status.SessionsPath, nil)
	var l status.Sessions
	if err != nil || code != http.StatusOK || json.Unmarshal(b, &l) != nil {
		t.Fatalf("sessions list: %d %s (%v)", code, b, err)
	}
	return l.Sessions
}

// listed returns the sessions list's entry id (ok false when absent).
func listed(t *testing.T, g *testgw.Gateway, id string) (status.Session, bool) {
	t.Helper()
	for _, s := range sessionsList(t, g) {
		if s.ID == id {
			return s, true
		}
	}
	return status.Session{}, false
}

// wantParked checks that the sessions list shows id parked at provider,
// resumable for about window more.
func wantParked(t *testing.T, g *testgw.Gateway, id, provider string, window time.Duration) {
	t.Helper()
	s, ok := listed(t, g, id)
	if !ok || !s.Parked || s.Provider != provider || s.ResumableUntil == nil {
		t.Fatalf("sessions list: %s is %+v (listed %v), want parked at %s", id, s, ok, provider)
	}
	if left := time.Until(*s.ResumableUntil); left <= 0 || left > window {
		t.Fatalf("sessions list: %s resumable for %v more, want within (0, %v]", id, left, window)
	}
}

// endParked ends a parked session as an operator does (DELETE on the
// admin API), so that nothing outlives the test.
func endParked(t *testing.T, g *testgw.Gateway, id string) {
	t.Helper()
	code, b, err := g.AdminDo(http.MethodDelete, status.SessionsPath+"/"+id, nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("DELETE session %s: %d %s (%v)", id, code, b, err)
	}
	if _, ok := listed(t, g, id); ok {
		t.Fatalf("session %s still listed after DELETE", id)
	}
}

// act runs an operator's provider action (drain, undrain) on the admin API.
func act(t *testing.T, g *testgw.Gateway, provider, action string) {
	t.Helper()
	code, b, err := g.AdminDo(http.MethodPost, status.ProvidersPath+provider+"/"+action, nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("%s %s: %d %s (%v)", action, provider, code, b, err)
	}
}

// metric reads one series of the admin API's /metrics (0 when absent).
func metric(t *testing.T, g *testgw.Gateway, series string) float64 {
	t.Helper()
	code, b, err := g.AdminDo(http.MethodGet, "/metrics", nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("/metrics: %d (%v)", code, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("/metrics: %q", line)
			}
			return f
		}
	}
	return 0
}

func resumes(result string) string {
	return `caddy_browser_failover_resumes_total{result="` + result + `"}`
}

// freshSession opens a plain CDP connection to the gateway and returns the
// provider the sessions list shows it at; it is closed at once, and its
// parked entry ended.
func freshSession(t *testing.T, g *testgw.Gateway) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, g.WS("/"), nil)
	if err != nil {
		t.Fatalf("a fresh connection: %v", err)
	}
	defer c.CloseNow()
	id := resp.Header.Get("Browser-Failover-Session")
	s, ok := listed(t, g, id)
	if !ok {
		t.Fatalf("the fresh session %q is not listed", id)
	}
	c.Close(websocket.StatusNormalClosure, "")
	logEntry(t, g, "session parked", "session_id", id)
	endParked(t, g, id)
	return s.Provider
}

// TestResumeAfterDrop: real Puppeteer through the gateway in front of two
// real Chromiums under round_robin. A page gets window.x = 42, the
// client's TCP connection is reset (no close frame), and a Puppeteer that
// connects with ?bf_resume=<its token> finds that page, x === 42, in the
// same browser, although the strategy would send a fresh connection to
// the other one, which never hears of the session. Before that, the
// session's ID is refused 410 and spends nothing, and while its provider
// is drained, the resume gets 410 and the window goes on. Once resumed,
// neither its token (its client is connected) nor its old ID resumes it
// again. The token is nowhere in the admin API, and no provider request
// carries a resume item, although the providers take the client's query
// (pass_query): the rest of it (keep=1) reaches the browser as written.
func TestResumeAfterDrop(t *testing.T) {
	Require(t, true)
	bs := StartChromiums(t, 2)
	px := []*cdpProxy{startProxy(t, bs[0], false), startProxy(t, bs[1], false)}
	names := []string{"rsd-a", "rsd-b"}
	const window = 2 * time.Minute
	g := testgw.Start(t, handler(`"strategy":"round_robin","queue":{"size":0},"connect_timeout":"10s","resume":{"window":"2m"}`,
		provider(names[0], px[0].HTTPURL(), `"pass_query":true`), provider(names[1], px[1].HTTPURL(), `"pass_query":true`)))
	resumed0, unknown0 := metric(t, g, resumes("resumed")), metric(t, g, resumes("unknown"))
	unavailable0 := metric(t, g, resumes("unavailable"))
	d := startDriver(t)

	tok := resumeToken(t)
	id1 := d.connect(t, "c1", g.WS("/?bf_resume_token="+tok+"&keep=1"))
	s1, ok := listed(t, g, id1)
	if !ok {
		t.Fatalf("session %s is not listed", id1)
	}
	own, other := 0, 1
	if s1.Provider == names[1] {
		own, other = 1, 0
	}
	d.do(t, "OPENED", "open c1 resume-drop")
	wantSecret(t, g, tok)
	upsBefore, otherBefore := len(px[own].upgrades()), px[other].contacts()

	d.do(t, "DROPPED", "drop c1")
	parked := logEntry(t, g, "session parked", "session_id", id1)
	if parked["provider"] != names[own] || parked["held"] != false || parked["close_code"] != float64(1001) {
		t.Fatalf("session parked: %v, want provider %s, held false, close_code 1001 (its connection dropped)", parked, names[own])
	}
	wantParked(t, g, id1, names[own], window)
	wantSecret(t, g, tok)
	if ups := px[own].upgrades(); ups[len(ups)-1].Closed.IsZero() {
		t.Fatalf("without hold, the provider connection is still open after the drop: %+v", ups)
	}

	// Its session ID, which the sessions list shows: 410, no provider
	// asked, and the session stays parked for its token.
	body := d.refused(t, "c2", g.WS("/?bf_resume="+id1), http.StatusGone)
	t.Logf("resume by the session ID: 410 %s", body)
	if n := px[other].contacts(); n != 0 || len(px[own].upgrades()) != upsBefore {
		t.Fatalf("a resume by session ID contacted %s %d times, %s %d times",
			names[other], n, names[own], len(px[own].upgrades())-upsBefore)
	}
	if got := metric(t, g, resumes("unknown")) - unknown0; got != 1 {
		t.Fatalf("resumes_total{result=unknown} went up by %v, want 1", got)
	}
	wantParked(t, g, id1, names[own], window)

	// Its provider drained: 410, the window goes on, and no other
	// provider is asked.
	act(t, g, names[own], "drain")
	body = d.refused(t, "c2", g.WS("/?bf_resume="+tok), http.StatusGone)
	t.Logf("resume at a drained provider: 410 %s", body)
	if n := px[other].contacts(); n != 0 || len(px[own].upgrades()) != upsBefore {
		t.Fatalf("a resume at a drained provider contacted %s %d times, %s %d times",
			names[other], n, names[own], len(px[own].upgrades())-upsBefore)
	}
	if got := metric(t, g, resumes("unavailable")) - unavailable0; got != 1 {
		t.Fatalf("resumes_total{result=unavailable} went up by %v, want 1", got)
	}
	wantParked(t, g, id1, names[own], window)
	act(t, g, names[own], "undrain")

	resuming := time.Now()
	id2 := d.connect(t, "c2", g.WS("/?keep=1&bf_resume="+tok))
	took := time.Since(resuming)
	if id2 == id1 {
		t.Fatalf("the resumed session kept ID %s, want a new one", id1)
	}
	wantPage(t, d.do(t, "CHECK", "check c2 resume-drop"))
	t.Logf("a resumed Puppeteer (upgrade, puppeteer.connect) in %v", took.Round(time.Millisecond))

	res := logEntry(t, g, "session resumed", "session_id", id2)
	if res["resumed_from"] != id1 || res["provider"] != names[own] || res["held"] != false {
		t.Fatalf("session resumed: %v, want resumed_from %s at %s, held false", res, id1, names[own])
	}
	if s, ok := listed(t, g, id2); !ok || s.Parked || s.Provider != names[own] {
		t.Fatalf("resumed session %s listed as %+v (%v), want live at %s", id2, s, ok, names[own])
	}
	if _, ok := listed(t, g, id1); ok {
		t.Fatalf("session %s still listed after its resume", id1)
	}
	wantSecret(t, g, tok)
	// The same browser, dialled again at the URL it was connected to, with
	// no discovery; the other browser never heard of it.
	ups := px[own].upgrades()
	// (Neither bf_resume_token nor bf_resume is forwarded: the request
	// URI is the browser's path with the rest of the client's query, the
	// same for the first connection and the resume.)
	if p, q, _ := strings.Cut(ups[0].Path, "?"); len(ups) != upsBefore+1 || ups[len(ups)-1].Path != ups[0].Path ||
		!strings.HasPrefix(p, "/devtools/browser/") || q != "keep=1" {
		t.Fatalf("%s's connections: %+v, want one more to %s, both to /devtools/browser/…?keep=1", names[own], ups, ups[0].Path)
	}
	if n := px[other].contacts(); n != otherBefore || n != 0 {
		t.Fatalf("%s was contacted %d times (%d before the resume), want never", names[other], n, otherBefore)
	}
	if got := metric(t, g, resumes("resumed")) - resumed0; got != 1 {
		t.Fatalf("resumes_total{result=resumed} went up by %v, want 1", got)
	}

	// The strategy sends a fresh client to the other browser.
	if p := freshSession(t, g); p != names[other] {
		t.Fatalf("a fresh connection went to %s, want %s (round_robin)", p, names[other])
	}

	// While its client is connected, the token resumes nothing (410); nor
	// does the first session's ID. No provider is asked, and the resumed
	// client goes on.
	before := []int{px[0].contacts(), px[1].contacts()}
	body = d.refused(t, "c3", g.WS("/?bf_resume="+tok), http.StatusGone)
	t.Logf("resume of a session whose client is connected: 410 %s", body)
	body = d.refused(t, "c3", g.WS("/?bf_resume="+id1), http.StatusGone)
	t.Logf("second resume by %s: 410 %s", id1, body)
	if after := []int{px[0].contacts(), px[1].contacts()}; after[0] != before[0] || after[1] != before[1] {
		t.Fatalf("a refused resume contacted a provider: %v connections before, %v after", before, after)
	}
	if got := metric(t, g, resumes("unknown")) - unknown0; got != 3 {
		t.Fatalf("resumes_total{result=unknown} went up by %v, want 3", got)
	}
	wantPage(t, d.do(t, "CHECK", "check c2 resume-drop"))
	if s, ok := listed(t, g, id2); !ok || s.Parked {
		t.Fatalf("resumed session %s listed as %+v (%v) after the refused resumes, want live", id2, s, ok)
	}

	// The resumed session ends like any other: parked again when its
	// client leaves; the operator ends it.
	d.do(t, "DISCONNECTED", "disconnect c2")
	logEntry(t, g, "session parked", "session_id", id2)
	wantSecret(t, g, tok)
	endParked(t, g, id2)
	wantNotForwarded(t, []string{tok}, px...)
	waitIdle(t, names...)
}

// TestResumeAfterDisconnect: clean disconnects (close frames) and the
// clients of the docs, chained on one browser page and one resume token,
// which the first client brings through discovery:
// puppeteer.connect({browserURL: gw + '?bf_resume_token=' + token}) (the
// gateway's /json/version hands it a webSocketDebuggerUrl with that query)
// leaves with browser.disconnect(); Puppeteer's own
// puppeteer.connect({browserWSEndpoint: gw + '?bf_resume=' + token}) takes
// it back and leaves; Playwright's chromium.connectOverCDP(gw +
// '/?bf_resume=' + token) takes it back (the page among its default
// context's pages) and leaves with browser.close(); Puppeteer with the
// transport takes it back from Playwright; Playwright once more with the
// http:// URL form (it fetches /json/version with the query first); and
// Puppeteer's browserURL with ?bf_resume= last. The session keeps its
// token: each client resumes with the same URL, and each resume gets a
// new ID, read from the log when the client cannot see it. The page keeps
// x === 42 throughout, in the same browser, and the other browser is
// never asked; the token is never shown in the admin API nor passed on to
// the browser, although the providers take the client's query
// (pass_query).
func TestResumeAfterDisconnect(t *testing.T) {
	Require(t, true)
	bs := StartChromiums(t, 2)
	px := []*cdpProxy{startProxy(t, bs[0], false), startProxy(t, bs[1], false)}
	names := []string{"rsc-a", "rsc-b"}
	g := testgw.Start(t, handler(`"strategy":"round_robin","queue":{"size":0},"connect_timeout":"10s","resume":{"window":"2m"}`,
		provider(names[0], px[0].HTTPURL(), `"pass_query":true`), provider(names[1], px[1].HTTPURL(), `"pass_query":true`)))
	d := startDriver(t)

	tok := resumeToken(t)
	d.do(t, "CONNECTED c1 ", "connect-browserurl c1 %s", g.HTTP("/?bf_resume_token="+tok))
	// The client cannot see its session ID: the gateway's only session.
	l := sessionsList(t, g)
	if len(l) != 1 {
		t.Fatalf("sessions list %+v, want the one session of c1", l)
	}
	id, s1 := l[0].ID, l[0]
	own, other := 0, 1
	if s1.Provider == names[1] {
		own, other = 1, 0
	}
	d.do(t, "OPENED", "open c1 resume-clean")
	otherBefore := px[other].contacts()
	ids := map[string]bool{id: true}

	// left checks the parking of the session id its client just left
	// with a close frame.
	left := func(id string) {
		t.Helper()
		// Puppeteer's (ws's) and Playwright's close frames carry no
		// code: the gateway keeps 1000 for them.
		e := logEntry(t, g, "session parked", "session_id", id)
		if e["close_code"] != float64(1000) || e["held"] != false || e["provider"] != names[own] {
			t.Fatalf("session parked: %v, want close_code 1000, held false, at %s", e, names[own])
		}
		wantSecret(t, g, tok)
	}
	// resume runs the next client's command, which resumes id, and
	// returns its answer and the new session's ID (from the log).
	resume := func(id, cmd string, args ...any) (string, string) {
		t.Helper()
		start := time.Now()
		answer := d.do(t, "", cmd, args...)
		res := logEntry(t, g, "session resumed", "resumed_from", id)
		if res["provider"] != names[own] || res["held"] != false {
			t.Fatalf("session resumed: %v, want provider %s, held false", res, names[own])
		}
		next := fmt.Sprint(res["session_id"])
		if ids[next] {
			t.Fatalf("the resume of %s made session %s, an ID it had before", id, next)
		}
		ids[next] = true
		t.Logf("resume of %s: %v", id, time.Since(start).Round(time.Millisecond))
		return answer, next
	}

	// Puppeteer's browserURL → Puppeteer's own browserWSEndpoint.
	d.do(t, "DISCONNECTED", "disconnect c1")
	left(id)
	_, id = resume(id, "connect-url c2 %s", g.WS("/?bf_resume="+tok))
	wantPage(t, d.do(t, "CHECK", "check c2 resume-clean"))
	d.do(t, "DISCONNECTED", "disconnect c2")
	left(id)

	// → Playwright's connectOverCDP (ws:// URL).
	answer, id := resume(id, "pw p3 %s resume-clean", g.WS("/?bf_resume="+tok))
	wantPage(t, answer)
	d.do(t, "PWCLOSED", "pwclose p3")
	left(id)

	// → Puppeteer with the transport, which reads the new ID itself.
	prev := id
	id = d.connect(t, "c4", g.WS("/?bf_resume="+tok))
	if res := logEntry(t, g, "session resumed", "session_id", id); res["resumed_from"] != prev || ids[id] {
		t.Fatalf("session resumed: %v, want resumed_from %s, a new ID", res, prev)
	}
	ids[id] = true
	wantPage(t, d.do(t, "CHECK", "check c4 resume-clean"))
	d.do(t, "DISCONNECTED", "disconnect c4")
	left(id)

	// → Playwright's connectOverCDP with the http:// URL.
	answer, id = resume(id, "pw p5 %s resume-clean", g.HTTP("/?bf_resume="+tok))
	wantPage(t, answer)
	d.do(t, "PWCLOSED", "pwclose p5")
	left(id)

	// → Puppeteer's browserURL, presenting the token through discovery.
	_, id = resume(id, "connect-browserurl c6 %s", g.HTTP("/?bf_resume="+tok))
	wantPage(t, d.do(t, "CHECK", "check c6 resume-clean"))
	d.do(t, "DISCONNECTED", "disconnect c6")
	left(id)
	endParked(t, g, id)

	if n := px[other].contacts(); n != otherBefore {
		t.Fatalf("%s was contacted %d times during the resumes", names[other], n-otherBefore)
	}
	ups := px[own].upgrades()
	if len(ups) != 6 {
		t.Fatalf("%s got %d WebSocket connections, want 6 (one per client)", names[own], len(ups))
	}
	for _, u := range ups {
		// The clients' queries held nothing but resume items.
		if u.Path != ups[0].Path || !strings.HasPrefix(u.Path, "/devtools/browser/") || strings.Contains(u.Path, "?") {
			t.Fatalf("%s's connections %+v, want all to the browser's path, no query", names[own], ups)
		}
	}
	wantNotForwarded(t, []string{tok}, px...)
	waitIdle(t, names...)
}

// TestResumeHoldKillingProvider: a provider that kills its browser as soon
// as the gateway's connection to it closes (the proxy of this file in
// front of a real Chromium). Without hold, a dropped client's browser is
// gone and its resume is answered 410; with hold, the gateway keeps that
// connection open while the client is away, and the page survives the
// drop with x === 42, over several resumes of the same held connection.
//
// A client joining a held connection shares the CDP connection with the
// clients before it, and Chrome keeps what they set up on it (target
// discovery, auto-attach), reporting each target to a connection once:
// a plain Puppeteer or Playwright would see no page. The gateway turns
// both off on the connection before each join, so every client here is a
// plain one, with no reset of its own — Puppeteer with the docs'
// transport, Puppeteer's own puppeteer.connect({browserWSEndpoint}),
// Playwright's connectOverCDP after Puppeteer, after a bare CDP client,
// after itself — and each finds the page with x === 42. All of them
// present the same resume token, which the session keeps; each join gets
// a new session ID. A resume by the held session's ID is refused 410 and
// leaves the held connection as it was.
func TestResumeHoldKillingProvider(t *testing.T) {
	Require(t, true)
	bs := StartChromiums(t, 3)
	kNo, kHold := startProxy(t, bs[0], true), startProxy(t, bs[1], true)
	otherPx := startProxy(t, bs[2], false)
	d := startDriver(t)
	base := `"queue":{"size":0},"connect_timeout":"10s",`
	g := testgw.Start(t, handler(base+`"resume":{"window":"2m"}`,
		provider("rkp-nohold", kNo.HTTPURL(), `"priority":1`),
		provider("rkp-other", otherPx.HTTPURL(), `"priority":2`)))

	t.Run("without-hold", func(t *testing.T) {
		refused0 := metric(t, g, resumes("refused"))
		tok := resumeToken(t)
		id := d.connect(t, "n1", g.WS("/?bf_resume_token="+tok))
		if s, _ := listed(t, g, id); s.Provider != "rkp-nohold" {
			t.Fatalf("session at %q, want rkp-nohold", s.Provider)
		}
		d.do(t, "OPENED", "open n1 resume-killed")
		d.do(t, "DROPPED", "drop n1")
		logEntry(t, g, "session parked", "session_id", id)
		testgw.Eventually(t, 30*time.Second, "the provider to kill its browser", bs[0].p.exited)
		ups := kNo.upgrades()
		if len(ups) != 1 || ups[0].By != "gateway" {
			t.Fatalf("provider connections %+v, want one, ended by the gateway", ups)
		}
		t.Logf("the gateway closed the provider connection with close frames %v (its client's connection dropped)", ups[0].Closes)
		body := d.refused(t, "n2", g.WS("/?bf_resume="+tok), http.StatusGone)
		t.Logf("resume of a killed browser: 410 %s", body)
		if got := metric(t, g, resumes("refused")) - refused0; got != 1 {
			t.Fatalf("resumes_total{result=refused} went up by %v, want 1", got)
		}
		if n := otherPx.contacts(); n != 0 {
			t.Fatalf("rkp-other was contacted %d times", n)
		}
		if _, ok := listed(t, g, id); ok {
			t.Fatalf("a session whose browser is gone is still listed")
		}
		wantNotForwarded(t, []string{tok}, kNo, otherPx)
	})

	t.Run("with-hold", func(t *testing.T) {
		if err := g.Reload(handler(base+`"resume":{"window":"2m","hold":true}`,
			provider("rkp-hold", kHold.HTTPURL(), `"priority":1`),
			provider("rkp-other", otherPx.HTTPURL(), `"priority":2`))); err != nil {
			t.Fatal(err)
		}
		otherBefore := otherPx.contacts()
		resumed0, unknown0 := metric(t, g, resumes("resumed")), metric(t, g, resumes("unknown"))
		tok := resumeToken(t)
		id1 := d.connect(t, "h1", g.WS("/?bf_resume_token="+tok))
		if s, _ := listed(t, g, id1); s.Provider != "rkp-hold" {
			t.Fatalf("session at %q, want rkp-hold", s.Provider)
		}
		d.do(t, "OPENED", "open h1 resume-held")
		dropped := time.Now()
		d.do(t, "DROPPED", "drop h1")
		parked := logEntry(t, g, "session parked", "session_id", id1)
		if parked["held"] != true || parked["close_code"] != float64(1001) {
			t.Fatalf("session parked: %v, want held, close_code 1001", parked)
		}
		wantParked(t, g, id1, "rkp-hold", 2*time.Minute)
		if n := active("rkp-hold"); n != 1 {
			t.Fatalf("rkp-hold holds %d sessions while one is held, want 1 (it keeps its slot)", n)
		}
		wantSecret(t, g, tok)
		// The held session's ID: 410, and nothing spent.
		body := d.refused(t, "h2", g.WS("/?bf_resume="+id1), http.StatusGone)
		t.Logf("resume of a held session by its ID: 410 %s", body)
		if got := metric(t, g, resumes("unknown")) - unknown0; got != 1 {
			t.Fatalf("resumes_total{result=unknown} went up by %v, want 1", got)
		}
		wantParked(t, g, id1, "rkp-hold", 2*time.Minute)
		// A while away: the provider connection stays open, the browser
		// lives.
		time.Sleep(3 * time.Second)
		if ups := kHold.upgrades(); len(ups) != 1 || !ups[0].Closed.IsZero() || bs[1].p.exited() {
			t.Fatalf("held: provider connections %+v, browser exited %v; want one, open, and the browser alive", ups, bs[1].p.exited())
		}

		// reset checks the gateway's reset of the held connection before
		// the join of session id: both commands answered; the time the
		// join waited for the answers goes to waits.
		var waits []time.Duration
		reset := func(id string) {
			t.Helper()
			e := logEntry(t, g, "held session reset", "session_id", id)
			if e["answered"] != float64(2) || e["sent"] != float64(2) {
				t.Fatalf("held session reset: %v, want 2 sent, 2 answered", e)
			}
			w := time.Duration(e["waited_ms"].(float64) * float64(time.Millisecond))
			waits = append(waits, w)
			t.Logf("the reset before session %s's join waited %v for Chrome's answers", id, w)
		}
		// resumed reads the session the client's resume of id made (from
		// the log, for clients that cannot see the 101).
		resumed := func(id string) string {
			t.Helper()
			res := logEntry(t, g, "session resumed", "resumed_from", id)
			if res["held"] != true || res["provider"] != "rkp-hold" {
				t.Fatalf("session resumed: %v, want held, at rkp-hold", res)
			}
			next := fmt.Sprint(res["session_id"])
			reset(next)
			return next
		}
		// leftHeld checks that session id is held again, its client gone
		// with code.
		leftHeld := func(id string, code int) {
			t.Helper()
			if e := logEntry(t, g, "session parked", "session_id", id); e["held"] != true || e["close_code"] != float64(code) {
				t.Fatalf("session parked: %v, want held, close_code %d", e, code)
			}
		}

		// Puppeteer with the docs' transport, nothing of its own before
		// puppeteer.connect.
		resuming := time.Now()
		id2 := d.connect(t, "h2", g.WS("/?bf_resume="+tok))
		took := time.Since(resuming)
		if next := resumed(id1); next != id2 {
			t.Fatalf("the resume of %s made session %s, the client was told %s", id1, next, id2)
		}
		t.Logf("a resumed Puppeteer over the held connection in %v (upgrade, reset, puppeteer.connect), %v after the drop",
			took.Round(time.Millisecond), time.Since(dropped).Round(time.Millisecond))
		wantPage(t, d.do(t, "CHECK", "check h2 resume-held"))
		d.do(t, "DROPPED", "drop h2")
		leftHeld(id2, 1001)

		// Puppeteer's own puppeteer.connect({browserWSEndpoint}).
		resuming = time.Now()
		d.do(t, "CONNECTED h3 ", "connect-url h3 %s", g.WS("/?bf_resume="+tok))
		took = time.Since(resuming)
		id3 := resumed(id2)
		t.Logf("puppeteer.connect({browserWSEndpoint}) over the held connection in %v", took.Round(time.Millisecond))
		wantPage(t, d.do(t, "CHECK", "check h3 resume-held"))
		d.do(t, "DISCONNECTED", "disconnect h3")
		leftHeld(id3, 1000)

		// Playwright's connectOverCDP, after Puppeteer.
		pwResume := func(label, id string) string {
			t.Helper()
			start := time.Now()
			answer := d.do(t, "PW", "pw %s %s resume-held", label, g.WS("/?bf_resume="+tok))
			took := time.Since(start)
			next := resumed(id)
			wantPage(t, answer)
			t.Logf("connectOverCDP over the held connection (connect, pages, window.x) in %v", took.Round(time.Millisecond))
			d.do(t, "PWCLOSED", "pwclose %s", label)
			leftHeld(next, 1000)
			return next
		}
		id4 := pwResume("p4", id3)

		// A bare CDP client (Target.attachToTarget on its own).
		raw := d.do(t, "RAW", "raw r5 %s resume-held", g.WS("/?bf_resume="+tok))
		wantPage(t, raw)
		id5 := strings.Fields(raw)[2]
		if next := resumed(id4); next != id5 {
			t.Fatalf("the resume of %s made session %s, the client was told %s", id4, next, id5)
		}
		d.do(t, "RAWCLOSED", "rawclose r5")
		leftHeld(id5, 1000)

		// connectOverCDP after a bare client, then after connectOverCDP.
		id6 := pwResume("p6", id5)
		id7 := pwResume("p7", id6)

		// And Puppeteer after Playwright.
		d.do(t, "CONNECTED h8 ", "connect-url h8 %s", g.WS("/?bf_resume="+tok))
		id8 := resumed(id7)
		wantPage(t, d.do(t, "CHECK", "check h8 resume-held"))
		d.do(t, "DISCONNECTED", "disconnect h8")
		leftHeld(id8, 1000)

		var most time.Duration
		for _, w := range waits {
			most = max(most, w)
		}
		t.Logf("the reset delayed %d joins by at most %v", len(waits), most)

		// One provider connection all along, never closed, the browser
		// alive; the other provider never heard of it.
		if ups := kHold.upgrades(); len(ups) != 1 || !ups[0].Closed.IsZero() || len(ups[0].Closes) != 0 || bs[1].p.exited() {
			t.Fatalf("provider connections %+v, browser exited %v; want one, open, no close frame, the browser alive", ups, bs[1].p.exited())
		}
		if n := otherPx.contacts(); n != otherBefore {
			t.Fatalf("rkp-other was contacted %d times", n-otherBefore)
		}
		if got := metric(t, g, resumes("resumed")) - resumed0; got != 7 {
			t.Fatalf("resumes_total{result=resumed} went up by %v, want 7", got)
		}
		if got := metric(t, g, `caddy_browser_failover_parked_sessions{held="true"}`); got != 1 {
			t.Fatalf("parked_sessions{held=true} is %v, want 1", got)
		}
		if seen := map[string]bool{id1: true, id2: true, id3: true, id4: true, id5: true, id6: true, id7: true, id8: true}; len(seen) != 8 {
			t.Fatalf("session IDs %v, want 8 distinct ones", []string{id1, id2, id3, id4, id5, id6, id7, id8})
		}
		wantSecret(t, g, tok)
		wantNotForwarded(t, []string{tok}, kHold, otherPx)

		// The operator ends it: now the provider gets its close frame,
		// and kills its browser.
		endParked(t, g, id8)
		testgw.Eventually(t, 30*time.Second, "the provider to kill its browser", bs[1].p.exited)
		ups := kHold.upgrades()
		t.Logf("held connection: open %v, ended by the %s with %v", ups[0].Closed.Sub(ups[0].Opened).Round(time.Millisecond), ups[0].By, ups[0].Closes)
		if len(ups[0].Closes) != 1 || !strings.HasPrefix(ups[0].Closes[0], "1000 ") {
			t.Fatalf("held connection ended %+v, want the gateway's close 1000", ups[0])
		}
		waitIdle(t, "rkp-hold", "rkp-other")
	})
}

// TestResumeAfterWindow: a resume after the window is answered 410 and
// contacts no provider, without hold (the entry is gone) and with it (the
// gateway closed the held provider connection at the window's end, with
// the client's close code, 1001 for a dropped connection).
func TestResumeAfterWindow(t *testing.T) {
	Require(t, true)
	bs := StartChromiums(t, 2)
	px := []*cdpProxy{startProxy(t, bs[0], false), startProxy(t, bs[1], false)}
	names := []string{"rsw-a", "rsw-b"}
	const window = 3 * time.Second
	conf := func(hold bool) string {
		return handler(fmt.Sprintf(`"strategy":"round_robin","queue":{"size":0},"connect_timeout":"10s","resume":{"window":"3s","hold":%v}`, hold),
			provider(names[0], px[0].HTTPURL(), ""), provider(names[1], px[1].HTTPURL(), ""))
	}
	g := testgw.Start(t, conf(false))
	d := startDriver(t)

	for _, hold := range []bool{false, true} {
		t.Run(fmt.Sprintf("hold=%v", hold), func(t *testing.T) {
			if hold {
				if err := g.Reload(conf(true)); err != nil {
					t.Fatal(err)
				}
			}
			unknown0 := metric(t, g, resumes("unknown"))
			tok := resumeToken(t)
			id := d.connect(t, "w1", g.WS("/?bf_resume_token="+tok))
			s, _ := listed(t, g, id)
			own := 0
			if s.Provider == names[1] {
				own = 1
			}
			d.do(t, "OPENED", "open w1 resume-late")
			d.do(t, "DROPPED", "drop w1")
			parked := logEntry(t, g, "session parked", "session_id", id)
			over := logEntry(t, g, "resume window over", "session_id", id)
			// The park's log line is written just after its window
			// starts: a little slack for that.
			const logSlack = 100 * time.Millisecond
			if w := logTime(over).Sub(logTime(parked)); w < window-logSlack {
				t.Fatalf("the window ended %v after the park, want at least %v", w, window)
			}
			if over["held"] != hold {
				t.Fatalf("resume window over: %v, want held %v", over, hold)
			}
			if _, ok := listed(t, g, id); ok {
				t.Fatalf("session %s still listed after its window", id)
			}
			ups := px[own].upgrades()
			last := ups[len(ups)-1]
			if hold {
				// Closed by the gateway at the window's end, not before.
				testgw.Eventually(t, 10*time.Second, "the held connection to close", func() bool {
					ups = px[own].upgrades()
					last = ups[len(ups)-1]
					return !last.Closed.IsZero()
				})
				if last.Closed.Before(logTime(parked).Add(window-logSlack)) || len(last.Closes) != 1 || last.Closes[0] != "1001 resume window over" {
					t.Fatalf("held connection %+v (parked at %v), want closed after the window with the gateway's close 1001 resume window over",
						last, logTime(parked))
				}
				t.Logf("held connection closed %v after the park, with %v", last.Closed.Sub(logTime(parked)).Round(time.Millisecond), last.Closes)
			}
			before := []int{px[0].contacts(), px[1].contacts()}
			body := d.refused(t, "w2", g.WS("/?bf_resume="+tok), http.StatusGone)
			t.Logf("resume after the window: 410 %s", body)
			if after := []int{px[0].contacts(), px[1].contacts()}; after[0] != before[0] || after[1] != before[1] {
				t.Fatalf("a resume after the window contacted a provider: %v connections before, %v after", before, after)
			}
			if got := metric(t, g, resumes("unknown")) - unknown0; got != 1 {
				t.Fatalf("resumes_total{result=unknown} went up by %v, want 1", got)
			}
			wantNotForwarded(t, []string{tok}, px...)
			waitIdle(t, names...)
		})
	}
}

// TestResumeBrowserRestarted: the provider's browser was restarted at the
// same address while the session was parked (a new browser, with another
// /devtools/browser/<id>). The resume dials the old URL, Chrome answers
// 404, and the client gets 410: not the new browser, which is not its
// own. That answer is not the provider's failure: it stays out of
// cooldown, and the next fresh client gets the new browser there.
func TestResumeBrowserRestarted(t *testing.T) {
	Require(t, true)
	bs := StartChromiums(t, 2)
	px := []*cdpProxy{startProxy(t, bs[0], false), startProxy(t, bs[1], false)}
	g := testgw.Start(t, handler(`"queue":{"size":0},"connect_timeout":"10s","resume":{"window":"2m"}`,
		provider("rsr-a", px[0].HTTPURL(), `"priority":1,"pass_query":true`), provider("rsr-b", px[1].HTTPURL(), `"priority":2,"pass_query":true`)))
	refused0 := metric(t, g, resumes("refused"))
	d := startDriver(t)

	tok := resumeToken(t)
	id := d.connect(t, "c1", g.WS("/?bf_resume_token="+tok))
	if s, _ := listed(t, g, id); s.Provider != "rsr-a" {
		t.Fatalf("session at %q, want rsr-a", s.Provider)
	}
	d.do(t, "OPENED", "open c1 resume-restarted")
	d.do(t, "DROPPED", "drop c1")
	logEntry(t, g, "session parked", "session_id", id)

	_, port, _ := net.SplitHostPort(bs[0].Addr)
	bs[0].Kill()
	again := StartChromiumAt(t, port)
	if again.WSPath == bs[0].WSPath {
		t.Fatalf("the restarted browser has the same path %s", again.WSPath)
	}
	body := d.refused(t, "c2", g.WS("/?bf_resume="+tok), http.StatusGone)
	t.Logf("resume after the browser restarted: 410 %s", body)
	if !strings.Contains(body, "status_404") {
		t.Fatalf("refused resume %s, want Chrome's 404 among its attempts", body)
	}
	if got := metric(t, g, resumes("refused")) - refused0; got != 1 {
		t.Fatalf("resumes_total{result=refused} went up by %v, want 1", got)
	}
	if n := px[1].contacts(); n != 0 {
		t.Fatalf("rsr-b was contacted %d times", n)
	}
	if p := providerStatus(t, g, "rsr-a"); !p.Healthy || p.CooldownUntil != nil || p.Failures != 0 {
		t.Fatalf("rsr-a after a resume its new browser refused: %+v, want healthy, no cooldown, no failure", p)
	}
	if p := freshSession(t, g); p != "rsr-a" {
		t.Fatalf("a fresh connection went to %s, want rsr-a's new browser", p)
	}
	wantNotForwarded(t, []string{tok}, px...)
	waitIdle(t, "rsr-a", "rsr-b")
}

// cdpCall sends one CDP command over c and returns its result.
func cdpCall(t *testing.T, c *websocket.Conn, id int, method string, params any) json.RawMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msg, _ := json.Marshal(map[string]any{"id": id, "method": method, "params": params})
	if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		var m struct {
			ID     int             `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  any             `json:"error"`
		}
		if json.Unmarshal(b, &m) == nil && m.ID == id {
			if m.Error != nil {
				t.Fatalf("%s: %v", method, m.Error)
			}
			return m.Result
		}
	}
}

// TestResumeKey: with resume_key {http.request.header.X-User}, a session
// left by alice's client (its connection dropped) is not resumed by bob's
// or by a client without the header, both presenting its resume token,
// nor by alice's with the session's ID (410 each, no provider contacted,
// the entry stays), and then is by alice's with the token in the
// Browser-Failover-Resume header instead of the query: her tab is there.
// Alice's client (coder/websocket, which returns the 101) brought no token
// of its own: it reads the one the gateway handed out on the 101, in
// Browser-Failover-Resume-Token. Neither that token nor the resume
// header reaches the provider, and the admin API never shows the token.
// Both providers are proxies in front of the same Chromium, so the
// proxies alone tell where each connection went.
func TestResumeKey(t *testing.T) {
	Require(t, false)
	bs := StartChromiums(t, 1)
	px := []*cdpProxy{startProxy(t, bs[0], false), startProxy(t, bs[0], false)}
	names := []string{"rsk-a", "rsk-b"}
	g := testgw.Start(t, handler(`"strategy":"round_robin","queue":{"size":0},"connect_timeout":"10s",`+
		`"resume":{"window":"2m"},"resume_key":"{http.request.header.X-User}"`,
		provider(names[0], px[0].HTTPURL(), ""), provider(names[1], px[1].HTTPURL(), "")))
	unknown0 := metric(t, g, resumes("unknown"))
	dial := func(h http.Header, resumeQuery string) (*websocket.Conn, *http.Response, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return websocket.Dial(ctx, g.WS("/"+resumeQuery), &websocket.DialOptions{HTTPHeader: h})
	}
	alice := http.Header{"X-User": {"alice"}}

	c, resp, err := dial(alice, "")
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Header.Get("Browser-Failover-Session")
	tok := resp.Header.Get("Browser-Failover-Resume-Token")
	if len(tok) < 22 || strings.Trim(tok, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") != "" || tok == id {
		t.Fatalf("the 101 handed out resume token %q (session %s), want 22 or more URL-safe characters, not the session ID", tok, id)
	}
	s, _ := listed(t, g, id)
	own := 0
	if s.Provider == names[1] {
		own = 1
	}
	var created struct {
		TargetID string `json:"targetId"`
	}
	json.Unmarshal(cdpCall(t, c, 1, "Target.createTarget", map[string]any{"url": "about:blank"}), &created)
	c.CloseNow() // no close frame
	logEntry(t, g, "session parked", "session_id", id)
	wantSecret(t, g, tok)

	before := []int{px[0].contacts(), px[1].contacts()}
	for _, try := range []struct {
		who       string
		h         http.Header
		presented string
	}{
		{"bob", http.Header{"X-User": {"bob"}}, tok},
		{"no header", nil, tok},
		{"alice, with the session ID", alice, id},
	} {
		c, resp, err := dial(try.h, "?bf_resume="+try.presented)
		if err == nil {
			c.CloseNow()
			t.Fatalf("%s resumed alice's session", try.who)
		}
		if resp == nil || resp.StatusCode != http.StatusGone {
			t.Fatalf("%s's resume: %v %v, want 410", try.who, resp, err)
		}
	}
	if after := []int{px[0].contacts(), px[1].contacts()}; after[0] != before[0] || after[1] != before[1] {
		t.Fatalf("refused resumes contacted a provider: %v connections before, %v after", before, after)
	}
	if got := metric(t, g, resumes("unknown")) - unknown0; got != 3 {
		t.Fatalf("resumes_total{result=unknown} went up by %v, want 3", got)
	}
	wantParked(t, g, id, names[own], 2*time.Minute)

	h := alice.Clone()
	h.Set("Browser-Failover-Resume", tok)
	c, resp, err = dial(h, "")
	if err != nil {
		t.Fatalf("alice's resume: %v", err)
	}
	id2 := resp.Header.Get("Browser-Failover-Session")
	if again := resp.Header.Get("Browser-Failover-Resume-Token"); again != "" && again != tok {
		t.Fatalf("the resume's 101 handed out another resume token %q; the session keeps %q", again, tok)
	}
	if res := logEntry(t, g, "session resumed", "session_id", id2); res["resumed_from"] != id || res["provider"] != names[own] || id2 == id {
		t.Fatalf("session resumed: %v, want a new ID, resumed_from %s at %s", res, id, names[own])
	}
	var targets struct {
		TargetInfos []struct {
			TargetID string `json:"targetId"`
		} `json:"targetInfos"`
	}
	json.Unmarshal(cdpCall(t, c, 2, "Target.getTargets", map[string]any{}), &targets)
	found := false
	for _, ti := range targets.TargetInfos {
		found = found || ti.TargetID == created.TargetID
	}
	if !found {
		t.Fatalf("alice's tab %s is not among the targets %+v", created.TargetID, targets.TargetInfos)
	}
	if n := px[1-own].contacts(); n != 0 {
		t.Fatalf("%s was contacted %d times", names[1-own], n)
	}
	ups := px[own].upgrades()
	if last := ups[len(ups)-1]; len(ups) != 2 || strings.Contains(strings.ToLower(last.Head), "browser-failover-resume") {
		t.Fatalf("%s's upgrades %+v, want a second one, without the resume header", names[own], ups)
	}
	wantSecret(t, g, tok)
	cdpCall(t, c, 3, "Target.closeTarget", map[string]any{"targetId": created.TargetID})
	c.Close(websocket.StatusNormalClosure, "")
	logEntry(t, g, "session parked", "session_id", id2)
	endParked(t, g, id2)
	wantNotForwarded(t, []string{tok}, px...)
	waitIdle(t, names...)
}
