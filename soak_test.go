package browserfailover_test

// A chaos soak: providers flap between refusing, hanging, answering
// 5xx/429, resetting and echoing; clients connect, talk, vanish mid
// handshake or while queued, hold sessions for random times; the config is
// reloaded in between. Afterwards every count is back to zero and the
// process holds no more goroutines or file descriptors than before.
//
// SOAK_DURATION sets the chaos phase (default 45s, -short 5s), e.g.
//
//	SOAK_DURATION=10m go test -run TestSoak -timeout 20m .

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// flapMode is what a flapping provider does with the next connection.
type flapMode int32

const (
	flapEcho flapMode = iota
	flapRefuse
	flapHang
	flap5xx
	flap429
	flapReset
)

func (m flapMode) String() string {
	return [...]string{"echo", "refuse", "hang", "5xx", "429", "reset"}[m]
}

// flapper is a provider on a fixed port whose behavior can be switched at
// any time; refusing closes its listener, leaving it reopens one on the
// same port.
type flapper struct {
	name string
	addr string
	mode atomic.Int32
	hits atomic.Int64
	srv  *http.Server
	seen func(*http.Request) // optional: sees every request

	mu     sync.Mutex
	ln     net.Listener // nil while refusing
	held   map[any]func()
	closed bool
	wg     sync.WaitGroup
}

func newFlapper(t *testing.T, name string) *flapper {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &flapper{name: name, addr: ln.Addr().String(), held: map[any]func(){}}
	f.srv = &http.Server{Handler: f, ErrorLog: log.New(io.Discard, "", 0), ReadHeaderTimeout: 5 * time.Second}
	f.serveLocked(ln)
	t.Cleanup(f.close)
	return f
}

func (f *flapper) serveLocked(ln net.Listener) {
	f.ln = ln
	go f.srv.Serve(ln)
}

// set switches the mode. Refusing closes the listener and, with kill, the
// live connections too (a crashed provider); any other mode reopens the
// listener on the same port if it was closed.
func (f *flapper) set(m flapMode, kill bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	f.mode.Store(int32(m))
	if m == flapRefuse {
		if f.ln != nil {
			f.ln.Close()
			f.ln = nil
		}
		if kill {
			for _, k := range f.held {
				k()
			}
		}
		return
	}
	for i := 0; f.ln == nil && i < 50; i++ {
		ln, err := net.Listen("tcp", f.addr)
		if err == nil {
			f.serveLocked(ln)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hold tracks a hijacked connection until release; false once closed.
func (f *flapper) hold(key any, kill func()) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.held[key] = kill
	f.wg.Add(1)
	return true
}

func (f *flapper) release(key any) {
	f.mu.Lock()
	delete(f.held, key)
	f.mu.Unlock()
	f.wg.Done()
}

func (f *flapper) close() {
	f.mu.Lock()
	f.closed = true
	if f.ln != nil {
		f.ln.Close()
		f.ln = nil
	}
	for _, k := range f.held {
		k()
	}
	f.mu.Unlock()
	f.srv.Close()
	f.wg.Wait()
}

func (f *flapper) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.hits.Add(1)
	if f.seen != nil {
		f.seen(r)
	}
	switch flapMode(f.mode.Load()) {
	case flapHang:
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		if !f.hold(c, func() { c.Close() }) {
			c.Close()
			return
		}
		defer f.release(c)
		io.Copy(io.Discard, c) // until the gateway gives up
		c.Close()
	case flapReset:
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	case flap5xx:
		w.WriteHeader(500 + rand.IntN(4))
		io.WriteString(w, "provider is unwell")
	case flap429:
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
	default: // echo (or refuse, for a connection accepted just before)
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: websocket.CompressionDisabled})
		if err != nil {
			return
		}
		if !f.hold(c, func() { c.CloseNow() }) {
			c.CloseNow()
			return
		}
		defer f.release(c)
		fakes.EchoMessages(c)
	}
}

// soakOpts configure one soak run.
type soakOpts struct {
	// fdSlack is descriptors the gateway may rightly keep open after the
	// soak beyond the usual margin (the shared state's connection pool).
	fdSlack   int
	prefix    string // provider names are prefix+"0".. prefix+"3"
	providers int
	duration  time.Duration
	workers   int
	// providerURL builds provider i's URL from its address (default
	// ws://addr/); providerExtra gives more JSON keys of provider i.
	providerURL   func(i int, addr string) string
	providerExtra func(i int) string
	// handlerExtra holds more handler keys (webhooks …).
	handlerExtra string
	// wrap builds the whole config around the handler JSON (default
	// g.Config).
	wrap func(g *testgw.Gateway, handlerJSON string) []byte
	// onBody sees every answer clients got that was not a 101, with its
	// body.
	onBody func(status int, body []byte)
	// onTick runs after every reload.
	onTick func(g *testgw.Gateway)
	// onProviderRequest sees every request a provider gets.
	onProviderRequest func(*http.Request)
}

// soakStats are the figures of a run.
type soakStats struct {
	tried, established, rejected, queuedGone, handshakeGone, heldGone atomic.Int64
	badRequests, other, transportErrs, brokenSessions, echoed         atomic.Int64
	flips, reloads, reloadErrs                                        atomic.Int64
	resumes, resumed, resumeRefused                                   atomic.Int64
	statuses                                                          sync.Map // int -> *atomic.Int64

	goroutinesBefore, goroutinesAfter, fdsBefore, fdsAfter int

	mu                  sync.Mutex
	problems            []string
	transportErrSamples []string
}

func (s *soakStats) transportErr(err error) {
	s.transportErrs.Add(1)
	s.mu.Lock()
	if len(s.transportErrSamples) < 5 {
		s.transportErrSamples = append(s.transportErrSamples, err.Error())
	}
	s.mu.Unlock()
}

func (s *soakStats) problem(format string, args ...any) {
	s.mu.Lock()
	if len(s.problems) < 20 {
		s.problems = append(s.problems, fmt.Sprintf(format, args...))
	}
	s.mu.Unlock()
}

func (s *soakStats) status(code int) {
	v, _ := s.statuses.LoadOrStore(code, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func (s *soakStats) statusList() string {
	var parts []string
	s.statuses.Range(func(k, v any) bool {
		parts = append(parts, fmt.Sprintf("%d:%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	return strings.Join(parts, " ")
}

func (s *soakStats) log(t *testing.T, what string, d time.Duration) {
	t.Logf("%s: %v of chaos; %d connections tried, %d sessions established (%d echoed, %d broken by a provider), "+
		"%d rejections (503), %d bad requests (400), answers by status [%s], %d transport errors; "+
		"clients vanished: %d mid-handshake, %d while queued/attempting, %d holding a session; "+
		"%d provider mode flips, %d reloads (%d rejected); %d resumes after a drop (%d resumed, %d refused); goroutines %d -> %d, fds %d -> %d",
		what, d, s.tried.Load(), s.established.Load(), s.echoed.Load(), s.brokenSessions.Load(),
		s.rejected.Load(), s.badRequests.Load(), s.statusList(), s.transportErrs.Load(),
		s.handshakeGone.Load(), s.queuedGone.Load(), s.heldGone.Load(),
		s.flips.Load(), s.reloads.Load(), s.reloadErrs.Load(),
		s.resumes.Load(), s.resumed.Load(), s.resumeRefused.Load(),
		s.goroutinesBefore, s.goroutinesAfter, s.fdsBefore, s.fdsAfter)
	if len(s.transportErrSamples) > 0 {
		t.Logf("%s: transport errors seen by clients (sample): %q", what, s.transportErrSamples)
	}
}

// soakDuration is SOAK_DURATION, or def (short under -short).
func soakDuration(t *testing.T, def, short time.Duration) time.Duration {
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("SOAK_DURATION: %v", err)
		}
		return d
	}
	if testing.Short() {
		return short
	}
	return def
}

// openFDs counts the process's open file descriptors.
func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}

// fdList describes the open file descriptors, for leak reports.
func fdList() string {
	ents, _ := os.ReadDir("/proc/self/fd")
	var out []string
	for _, e := range ents {
		target, _ := os.Readlink("/proc/self/fd/" + e.Name())
		out = append(out, e.Name()+"->"+target)
	}
	return strings.Join(out, " ")
}

// soakVariant is one config of the reload cycle.
type soakVariant struct {
	strategy   string
	maxConc    []int
	drop       int // provider left out, -1 none
	queueSize  int
	queueMS    int
	maxSession bool
	hedge      bool // hedge_after 40ms
	quota      bool // client_limit 2 per X-Soak-Key
	resume     int  // 0 off, 1 resume 400ms, 2 resume 400ms hold
}

var soakStrategies = []string{"priority", "round_robin", "least_conn", "weighted", "random", "latency"}

func (o *soakOpts) handlerJSON(fl []*flapper, v soakVariant) string {
	var ps []string
	for i, f := range fl {
		if i == v.drop {
			continue
		}
		u := "ws://" + f.addr + "/"
		if o.providerURL != nil {
			u = o.providerURL(i, f.addr)
		}
		extra := fmt.Sprintf(`"priority":%d,"weight":%d,"max_concurrent":%d`, i+1, i+1, v.maxConc[i])
		if o.providerExtra != nil {
			if e := o.providerExtra(i); e != "" {
				extra += "," + e
			}
		}
		ps = append(ps, provider(f.name, u, extra))
	}
	hx := fmt.Sprintf(`"strategy":%q,"connect_timeout":"300ms",`+
		`"cooldown":{"duration":"200ms","max_duration":"1s","window":"2s","failure_threshold":0.5,"min_requests":3},`+
		`"queue":{"size":%d,"timeout":"%dms"}`, v.strategy, v.queueSize, v.queueMS)
	if v.maxSession {
		hx += `,"session":{"max_duration":"1s","idle_timeout":"700ms"}`
	}
	if v.hedge {
		hx += `,"hedge_after":"40ms"`
	}
	if v.quota {
		hx += `,"client_limit":{"key":"{http.request.header.X-Soak-Key}","limit":2}`
	}
	switch v.resume {
	case 1:
		hx += `,"resume":{"window":"400ms"}`
	case 2:
		hx += `,"resume":{"window":"400ms","hold":true}`
	}
	if o.handlerExtra != "" {
		hx += "," + o.handlerExtra
	}
	return handler(hx, ps...)
}

func (o *soakOpts) baseVariant() soakVariant {
	v := soakVariant{strategy: "priority", drop: -1, queueSize: 16, queueMS: 800, resume: 2}
	for range o.providers {
		v.maxConc = append(v.maxConc, 3)
	}
	return v
}

func (o *soakOpts) randomVariant(rng *rand.Rand) soakVariant {
	v := soakVariant{
		strategy:   soakStrategies[rng.IntN(len(soakStrategies))],
		drop:       -1,
		queueSize:  rng.IntN(17), // 0 turns the queue off
		queueMS:    300 + rng.IntN(900),
		maxSession: rng.IntN(4) == 0,
		hedge:      rng.IntN(2) == 0,
		quota:      rng.IntN(2) == 0,
		resume:     rng.IntN(3),
	}
	for range o.providers {
		v.maxConc = append(v.maxConc, rng.IntN(5)) // 0: unlimited
	}
	if rng.IntN(4) == 0 {
		v.drop = rng.IntN(o.providers)
	}
	return v
}

// runSoak runs the chaos for o.duration, then checks that everything
// settles: counts at zero, goroutines and fds back near their start.
func runSoak(t *testing.T, o soakOpts) (*testgw.Gateway, *soakStats) {
	t.Helper()
	if o.providers == 0 {
		o.providers = 4
	}
	if o.workers == 0 {
		o.workers = 12
	}
	var fl []*flapper
	var names []string
	for i := range o.providers {
		name := fmt.Sprintf("%s%d", o.prefix, i)
		f := newFlapper(t, name)
		f.seen = o.onProviderRequest
		fl = append(fl, f)
		names = append(names, name)
	}
	load := func(g *testgw.Gateway, v soakVariant) error {
		h := o.handlerJSON(fl, v)
		if o.wrap != nil {
			return g.Load(o.wrap(g, h))
		}
		return g.Reload(h)
	}
	g := testgw.Start(t, o.handlerJSON(fl, o.baseVariant()))
	if o.wrap != nil {
		if err := load(g, o.baseVariant()); err != nil {
			t.Fatal(err)
		}
	}
	st := &soakStats{}

	// Warm up (first-use goroutines of the runtime, the HTTP client and
	// Caddy), then take the baseline.
	if c, _, err := dial(t, g.WS("/"), nil); err == nil {
		echoOnce(t, c, []byte("warm"))
		c.Close(websocket.StatusNormalClosure, "")
	} else {
		t.Fatalf("warm-up dial: %v", err)
	}
	soakSettle(t, g, names, 10*time.Second)
	http.DefaultClient.CloseIdleConnections()
	time.Sleep(200 * time.Millisecond)
	runtime.GC()
	st.goroutinesBefore, st.fdsBefore = runtime.NumGoroutine(), openFDs()

	ctx, stop := context.WithTimeout(context.Background(), o.duration)
	defer stop()
	var bg sync.WaitGroup

	// Chaos: providers flap.
	bg.Add(1)
	go func() {
		defer bg.Done()
		rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
		modes := []flapMode{flapEcho, flapEcho, flapEcho, flapRefuse, flapHang, flap5xx, flap5xx, flap429, flapReset}
		for ctx.Err() == nil {
			f := fl[rng.IntN(len(fl))]
			f.set(modes[rng.IntN(len(modes))], rng.IntN(2) == 0)
			st.flips.Add(1)
			sleepCtx(ctx, time.Duration(100+rng.IntN(300))*time.Millisecond)
		}
	}()
	// Reloads.
	bg.Add(1)
	go func() {
		defer bg.Done()
		rng := rand.New(rand.NewPCG(rand.Uint64(), 2))
		for ctx.Err() == nil {
			sleepCtx(ctx, time.Duration(500+rng.IntN(1000))*time.Millisecond)
			if ctx.Err() != nil {
				return
			}
			st.reloads.Add(1)
			if err := load(g, o.randomVariant(rng)); err != nil {
				st.reloadErrs.Add(1)
				t.Errorf("reload: %v", err)
			}
			if o.onTick != nil {
				o.onTick(g)
			}
		}
	}()
	// Clients.
	var workers sync.WaitGroup
	for w := range o.workers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			rng := rand.New(rand.NewPCG(rand.Uint64(), uint64(w)+10))
			for ctx.Err() == nil {
				st.tried.Add(1)
				soakClient(g, rng, st, o.onBody)
			}
		}()
	}
	workers.Wait()
	bg.Wait()
	for _, p := range st.problems {
		t.Error(p)
	}

	// Calm: every provider serves again, the base config is back.
	for _, f := range fl {
		f.set(flapEcho, false)
	}
	if err := load(g, o.baseVariant()); err != nil {
		t.Fatalf("final reload: %v", err)
	}
	soakSettle(t, g, names, 30*time.Second)

	// The gateway still serves.
	c, _, err := dial(t, g.WS("/"), nil)
	if err != nil {
		t.Fatalf("dial after the soak: %v", err)
	}
	echoOnce(t, c, []byte("still here"))
	c.Close(websocket.StatusNormalClosure, "")
	soakSettle(t, g, names, 10*time.Second)

	// No goroutine or descriptor left behind.
	const goMargin, fdMargin = 10, 4
	deadline := time.Now().Add(30 * time.Second)
	for {
		http.DefaultClient.CloseIdleConnections()
		runtime.GC() // the runtime's pooled splice pipes close on GC
		st.goroutinesAfter, st.fdsAfter = runtime.NumGoroutine(), openFDs()
		if st.goroutinesAfter <= st.goroutinesBefore+goMargin && st.fdsAfter <= st.fdsBefore+fdMargin+o.fdSlack {
			break
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Errorf("leak: goroutines %d -> %d, fds %d -> %d (%s)\n%s", st.goroutinesBefore, st.goroutinesAfter,
				st.fdsBefore, st.fdsAfter, fdList(), buf[:n])
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return g, st
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// soakSettle waits until no slot, session or waiter is left.
func soakSettle(t *testing.T, g *testgw.Gateway, names []string, wait time.Duration) {
	t.Helper()
	var why string
	settled := func() bool {
		for _, n := range names {
			p, ok := pool.Current().Lookup(n)
			if !ok {
				why = n + " is not configured"
				return false
			}
			if p.Slots.Active() != 0 || p.Slots.Reserved() != 0 {
				why = fmt.Sprintf("%s: active %d reserved %d", n, p.Slots.Active(), p.Slots.Reserved())
				return false
			}
		}
		if n := pool.Current().Sessions.Count(); n != 0 {
			why = fmt.Sprintf("%d live sessions", n)
			return false
		}
		for _, q := range pool.Current().Queues.Counts() {
			if q.Waiting != 0 {
				why = fmt.Sprintf("queue of %v: %d waiting", q.Providers, q.Waiting)
				return false
			}
		}
		if n, held := pool.Current().Parked.Count(); n != 0 {
			why = fmt.Sprintf("%d sessions parked (%d held)", n, held)
			return false
		}
		if cl := pool.Current().Quotas.Counts(); len(cl) != 0 {
			why = fmt.Sprintf("client quotas still counted: %+v", cl)
			return false
		}
		return true
	}
	deadline := time.Now().Add(wait)
	for !settled() {
		if time.Now().After(deadline) {
			t.Fatalf("not settled after %v: %s", wait, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rawUpgradeRequest is a valid upgrade request for host.
func rawUpgradeRequest(host, path string) string {
	return "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + upstreams.NewKey() + "\r\nUser-Agent: soak\r\n\r\n"
}

// soakClient is one client doing one random thing.
func soakClient(g *testgw.Gateway, rng *rand.Rand, st *soakStats, onBody func(int, []byte)) {
	seen := func(status int, body []byte) {
		st.status(status)
		switch status {
		case http.StatusServiceUnavailable:
			st.rejected.Add(1)
		case http.StatusBadRequest:
			st.badRequests.Add(1)
		default:
			st.other.Add(1)
		}
		if onBody != nil {
			onBody(status, body)
		}
	}
	switch p := rng.IntN(100); {
	case p < 35: // a real session: talk, hold, leave politely or not
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, resp, err := websocket.Dial(ctx, g.WS("/"), &websocket.DialOptions{
			CompressionMode: websocket.CompressionDisabled,
			// Four client keys for the client_limit variants.
			HTTPHeader: http.Header{"X-Soak-Key": {fmt.Sprintf("soak-key-%d", rng.IntN(4))}},
		})
		if err != nil {
			if resp != nil {
				body, _ := io.ReadAll(resp.Body)
				seen(resp.StatusCode, body)
			} else {
				st.transportErr(err)
			}
			return
		}
		st.established.Add(1)
		st.status(http.StatusSwitchingProtocols)
		hold := time.Now().Add(time.Duration(rng.IntN(800)) * time.Millisecond)
		for {
			msg := make([]byte, 1+rng.IntN(2048))
			if c.Write(ctx, websocket.MessageBinary, msg) != nil {
				st.brokenSessions.Add(1)
				break
			}
			if _, got, err := c.Read(ctx); err != nil || len(got) != len(msg) {
				st.brokenSessions.Add(1)
				break
			}
			st.echoed.Add(1)
			if time.Now().After(hold) {
				break
			}
			time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond)
		}
		drop := rng.IntN(4) == 0
		if drop {
			st.heldGone.Add(1)
			c.CloseNow()
		} else {
			c.Close(websocket.StatusNormalClosure, "")
		}
		if rng.IntN(3) == 0 {
			// Come back for it (with resume on, the same browser; off,
			// or too late, or its provider unwell: 410).
			// Without resume on, no token was handed out: the session ID,
			// which never resumes, stands in for one.
			token := resp.Header.Get("Browser-Failover-Resume-Token")
			if token == "" {
				token = resp.Header.Get("Browser-Failover-Session")
			}
			soakResume(g, rng, st, token, seen)
		}
	case p < 50: // vanish mid-handshake
		conn, err := net.DialTimeout("tcp", g.Addr, 2*time.Second)
		if err != nil {
			st.transportErr(err)
			return
		}
		req := rawUpgradeRequest(g.Addr, "/")
		conn.Write([]byte(req[:rng.IntN(len(req))]))
		time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond)
		conn.Close()
		st.handshakeGone.Add(1)
	case p < 65: // vanish while queued or while attempts run
		conn, err := net.DialTimeout("tcp", g.Addr, 2*time.Second)
		if err != nil {
			st.transportErr(err)
			return
		}
		conn.Write([]byte(rawUpgradeRequest(g.Addr, "/")))
		time.Sleep(time.Duration(rng.IntN(600)) * time.Millisecond)
		conn.Close()
		st.queuedGone.Add(1)
	case p < 85: // raw upgrade, read the answer, send a frame, drop
		conn, err := net.DialTimeout("tcp", g.Addr, 2*time.Second)
		if err != nil {
			st.transportErr(err)
			return
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write([]byte(rawUpgradeRequest(g.Addr, "/?q=1"))); err != nil {
			st.transportErr(err)
			return
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			st.transportErr(err)
			return
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			st.established.Add(1)
			st.status(http.StatusSwitchingProtocols)
			conn.Write([]byte{0x82, 0x83, 1, 2, 3, 4, 'a' ^ 1, 'b' ^ 2, 'c' ^ 3}) // masked "abc"
			time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond)
			return
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		seen(resp.StatusCode, body)
		if resp.StatusCode == http.StatusServiceUnavailable {
			var rb struct {
				Error       string `json:"error"`
				RetryAfterS int    `json:"retry_after_s"`
			}
			if json.Unmarshal(body, &rb) != nil || rb.Error == "" || resp.Header.Get("Retry-After") != fmt.Sprint(rb.RetryAfterS) {
				st.problem("bad 503: %v %s", resp.Header, body)
			}
		}
	case p < 93: // a bogus upgrade: 400, nothing contacted
		req, _ := http.NewRequest(http.MethodGet, g.HTTP("/"), nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "not-a-key")
		soakPlain(req, st, seen)
	default: // discovery or plain HTTP
		path := "/json/version"
		if rng.IntN(2) == 0 {
			path = "/plain"
		}
		req, _ := http.NewRequest(http.MethodGet, g.HTTP(path), nil)
		soakPlain(req, st, seen)
	}
}

// soakResume resumes the session of the resume token after a random pause
// and talks in it once; refusals (410, 409, 429) are fine, anything else a
// problem.
func soakResume(g *testgw.Gateway, rng *rand.Rand, st *soakStats, token string, seen func(int, []byte)) {
	time.Sleep(time.Duration(rng.IntN(250)) * time.Millisecond)
	st.resumes.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, g.WS("/?bf_resume="+token), &websocket.DialOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		if resp == nil {
			st.transportErr(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		switch resp.StatusCode {
		case http.StatusGone, http.StatusConflict, http.StatusTooManyRequests:
			st.resumeRefused.Add(1)
			seen(resp.StatusCode, body)
		default:
			seen(resp.StatusCode, body)
			st.problem("resume answered %d: %s", resp.StatusCode, body)
		}
		return
	}
	defer c.CloseNow()
	st.resumed.Add(1)
	st.status(http.StatusSwitchingProtocols)
	msg := []byte("resumed")
	if c.Write(ctx, websocket.MessageBinary, msg) != nil {
		st.brokenSessions.Add(1)
		return
	}
	if _, got, err := c.Read(ctx); err != nil || string(got) != string(msg) {
		st.brokenSessions.Add(1)
		return
	}
	st.echoed.Add(1)
	if rng.IntN(2) == 0 {
		c.Close(websocket.StatusNormalClosure, "")
	}
}

func soakPlain(req *http.Request, st *soakStats, seen func(int, []byte)) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		st.transportErr(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	seen(resp.StatusCode, body)
}

// TestSoak is the chaos soak (SOAK_DURATION, default 45s; -short 5s).
func TestSoak(t *testing.T) {
	d := soakDuration(t, 45*time.Second, 5*time.Second)
	// soak-3 creates each browser over a session API (a fake REST
	// provider whose sessions connect to its flapper): after the chaos
	// every session it created is released exactly once.
	var flapAddr atomic.Value
	rest := fakes.NewREST(func(string) string { return "ws://" + flapAddr.Load().(string) + "/" })
	defer rest.Close()
	_, st := runSoak(t, soakOpts{
		prefix: "soak-", duration: d,
		providerURL: func(i int, addr string) string {
			if i == 3 {
				flapAddr.Store(addr)
				return rest.URL()
			}
			return "ws://" + addr + "/"
		},
		providerExtra: func(i int) string {
			if i == 3 {
				return soakSessionAPI
			}
			return ""
		},
	})
	st.log(t, "soak", d)
	b := waitReleased(t, rest, "soak-3")
	t.Logf("soak session API: created %d, released %d, unreleased 0", len(b.Created), len(b.Released))
	if st.established.Load() == 0 || st.rejected.Load() == 0 || st.reloads.Load() == 0 {
		t.Errorf("the soak did not exercise both sessions, rejections and reloads")
	}
	if st.resumed.Load() == 0 || st.resumeRefused.Load() == 0 {
		t.Errorf("the soak resumed %d sessions and saw %d refused: want both", st.resumed.Load(), st.resumeRefused.Load())
	}
}

// soakSessionAPI is the session_api of the soak's REST-created provider.
const soakSessionAPI = `"session_api":{"create_method":"POST","create_url":"/v1/sessions",` +
	`"headers":[{"field":"X-BB-API-Key","value":"soak-key"}],"body":"{\"projectId\":\"soak\"}",` +
	`"connect_url":"/connectUrl","session_id":"/id","release_method":"POST",` +
	`"release_url":"/v1/sessions/{session_id}/release","release_body":"{\"status\":\"REQUEST_RELEASE\"}"}`

// waitReleased waits until every session f created was released exactly
// once and the gateway counts none unreleased; it fails the test when
// nothing was created at all.
func waitReleased(t *testing.T, f *fakes.REST, provider string) fakes.Books {
	t.Helper()
	var b fakes.Books
	var last error
	testgw.Eventually(t, 30*time.Second, "every created session released once", func() bool {
		b = f.Books()
		last = b.Balanced()
		gb, ok := pool.Current().Books.Lookup(provider)
		if last == nil && (!ok || gb.Unreleased() != 0) {
			last = fmt.Errorf("the gateway counts sessions unreleased")
		}
		return last == nil
	})
	if last != nil {
		t.Fatal(last)
	}
	if len(b.Created) == 0 {
		t.Fatalf("%s created no session", provider)
	}
	return b
}
