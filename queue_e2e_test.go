package browserfailover_test

// End-to-end tests of the wait queue:
// FIFO admission, leaving while queued, timeout, full queue, waking on the
// end of a cooldown or capacity skip, a storm of 1,000 waiters, and the
// logged waiting time. Real time, fake providers, in-process Caddy.

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
)

// waiting is the number of clients waiting in the queue of the handler
// that lists provider name (-1 when no handler does).
func waiting(name string) int {
	for _, q := range pool.Current().Queues.Counts() {
		for _, p := range q.Providers {
			if p == name {
				return q.Waiting
			}
		}
	}
	return -1
}

func waitWaiting(t *testing.T, name string, n int) {
	t.Helper()
	testgw.Eventually(t, 10*time.Second, fmt.Sprintf("%d waiting for %s", n, name), func() bool { return waiting(name) == n })
}

// dialResult is what a queued client got.
type dialResult struct {
	conn    *websocket.Conn
	status  int
	err     error
	elapsed time.Duration
	// session is the Browser-Failover-Session of its 101 (dialWith).
	session string
}

// dialAsync starts a client whose dial may wait in the queue.
func dialAsync(ctx context.Context, url string) <-chan dialResult {
	ch := make(chan dialResult, 1)
	go func() {
		start := time.Now()
		c, resp, err := websocket.Dial(ctx, url, nil)
		// A reload's listener swap can reset a connection before any
		// answer (see dial): a real client tries again.
		for try := 0; err != nil && resp == nil && try < 2 && resetBeforeAnswer(err) && ctx.Err() == nil; try++ {
			time.Sleep(50 * time.Millisecond)
			c, resp, err = websocket.Dial(ctx, url, nil)
		}
		r := dialResult{conn: c, err: err, elapsed: time.Since(start)}
		if resp != nil {
			r.status = resp.StatusCode
		}
		ch <- r
	}()
	return ch
}

func receive(t *testing.T, ch <-chan dialResult, within time.Duration, what string) dialResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(within):
		t.Fatalf("%s: no answer within %v", what, within)
	}
	return dialResult{}
}

// TestQueueFIFO: with max_concurrent 1 and one session held, queued
// clients are admitted one by one in arrival order; one that disconnects
// while queued leaves the queue at once and is skipped. The waiting time
// is logged as queue_wait_ms.
func TestQueueFIFO(t *testing.T) {
	echo := fakes.Echo("qf-echo", nil)
	defer echo.Close()
	g := testgw.Start(t, handler(`"queue":{"size":10,"timeout":"20s"}`, provider("qf-echo", echo.URL(), `"max_concurrent":1`)))
	held := hold(t, g)

	admitted := make(chan int, 4)
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	cancels := make([]context.CancelFunc, 4)
	start := time.Now()
	for i := range 4 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cancels[i] = cancel
		defer cancel()
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, _, err := websocket.Dial(ctx, g.WS("/"), nil)
			if err != nil {
				if i != 1 {
					errs <- fmt.Errorf("client %d: %v", i, err)
				}
				return
			}
			admitted <- i
			// Hold the slot briefly, so that a wrong order would show.
			time.Sleep(50 * time.Millisecond)
			if err := c.Write(ctx, websocket.MessageText, []byte("x")); err != nil {
				errs <- err
			} else if _, _, err := c.Read(ctx); err != nil {
				errs <- err
			}
			c.Close(websocket.StatusNormalClosure, "")
		}()
		waitWaiting(t, "qf-echo", i+1)
	}
	// Client 1 goes away while queued: it leaves the queue at once.
	// (Within waitWaiting's 10s, well before the 20s queue timeout.)
	cancels[1]()
	waitWaiting(t, "qf-echo", 3)
	if echo.Hits.Load() != 1 {
		t.Fatalf("the provider was contacted for a queued client")
	}
	time.Sleep(300 * time.Millisecond) // everyone has waited at least this
	held.Close(websocket.StatusNormalClosure, "")
	wg.Wait()
	close(admitted)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var order []int
	for i := range admitted {
		order = append(order, i)
	}
	if fmt.Sprint(order) != "[0 2 3]" {
		t.Fatalf("admitted in order %v, want [0 2 3]", order)
	}
	total := time.Since(start)
	waitWaiting(t, "qf-echo", 0)

	entries := waitSessionLogs(t, g, 4)
	var waits []float64
	for _, e := range entries {
		w, ok := e["queue_wait_ms"].(float64)
		if !ok {
			t.Fatalf("session ended without queue_wait_ms: %v", e)
		}
		waits = append(waits, w)
	}
	sort.Float64s(waits)
	if waits[0] != 0 {
		t.Fatalf("the held session (never queued) logged queue_wait_ms %v", waits[0])
	}
	for _, w := range waits[1:] {
		if w < 300 || w > float64(total.Milliseconds()) {
			t.Fatalf("queued sessions logged queue_wait_ms %v, want each between 300 and %d", waits[1:], total.Milliseconds())
		}
	}
	if n := echo.Hits.Load(); n != 4 {
		t.Fatalf("provider contacted %d times, want 4", n)
	}
}

// TestQueueTimeout: a waiter gets 503 with Retry-After and the attempts of
// its passes once the queue timeout passes.
func TestQueueTimeout(t *testing.T) {
	echo := fakes.Echo("qt-echo", nil)
	defer echo.Close()
	g := testgw.Start(t, handler(`"queue":{"size":10,"timeout":"500ms"}`, provider("qt-echo", echo.URL(), `"max_concurrent":1`)))
	hold(t, g)

	start := time.Now()
	r := must503(t, g)
	elapsed := time.Since(start)
	if elapsed < 450*time.Millisecond || elapsed > 10*time.Second {
		t.Fatalf("503 after %v, want after the 500ms queue timeout", elapsed)
	}
	if len(r.Body.Attempts) == 0 {
		t.Fatalf("no attempts in %s", r.Raw)
	}
	for _, a := range r.Body.Attempts {
		if a.Provider != "qt-echo" || a.Outcome != "full" || a.MS != 0 {
			t.Fatalf("attempts %s", r.Raw)
		}
	}
	if r.Body.Error != "no browser provider available" {
		t.Fatalf("body %s", r.Raw)
	}
	testgw.Eventually(t, 5*time.Second, "rejected log", func() bool { return len(g.LogEntries("rejected")) == 1 })
	e := g.LogEntries("rejected")[0]
	if e["close_reason"] != "queue timeout" || e["queue_wait_ms"].(float64) < 450 {
		t.Fatalf("rejected entry %v", e)
	}
	if waiting("qt-echo") != 0 {
		t.Fatal("the timed-out waiter is still queued")
	}
}

// TestQueueTimeoutListsEveryPass: while it waits on a provider that fails
// without cooling down, a waiter retries once a second; the 503 lists the
// attempts of every pass in order.
func TestQueueTimeoutListsEveryPass(t *testing.T) {
	echo := fakes.Echo("qp-echo", nil)
	defer echo.Close()
	bad := newScripted(t, "qp-bad", nil, always(step{status: 500}))
	g := testgw.Start(t, handler(`"queue":{"size":10,"timeout":"2s"},"cooldown":{"min_requests":10}`,
		provider("qp-echo", echo.URL(), `"max_concurrent":1`),
		provider("qp-bad", bad.URL(), `"priority":2`)))
	hold(t, g)
	start := time.Now()
	r := must503(t, g)
	if time.Since(start) < 1900*time.Millisecond {
		t.Fatalf("503 after %v, before the queue timeout", time.Since(start))
	}
	w := r.words()
	if len(w) < 4 || len(w)%2 != 0 {
		t.Fatalf("attempts %v, want at least two passes", w)
	}
	for i := 0; i < len(w); i += 2 {
		if w[i] != "qp-echo:full" || w[i+1] != "qp-bad:status_500" {
			t.Fatalf("attempts %v", w)
		}
	}
	if int64(len(w)/2) != bad.Hits.Load() {
		t.Fatalf("%d passes listed, provider saw %d", len(w)/2, bad.Hits.Load())
	}
	if bad.Hits.Load() > 3 {
		t.Fatalf("%d retries in 2s, want at most one a second", bad.Hits.Load())
	}
}

// TestQueueFull: with size 1 and one waiter, the next client gets 503 at
// once.
func TestQueueFull(t *testing.T) {
	echo := fakes.Echo("qx-echo", nil)
	defer echo.Close()
	g := testgw.Start(t, handler(`"queue":{"size":1,"timeout":"20s"}`, provider("qx-echo", echo.URL(), `"max_concurrent":1`)))
	held := hold(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := dialAsync(ctx, g.WS("/"))
	waitWaiting(t, "qx-echo", 1)

	start := time.Now()
	must503(t, g)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("503 after %v, want at once", d)
	}
	testgw.Eventually(t, 5*time.Second, "rejected log", func() bool { return len(g.LogEntries("rejected")) == 1 })
	if e := g.LogEntries("rejected")[0]; e["close_reason"] != "queue full" {
		t.Fatalf("rejected entry %v", e)
	}
	held.Close(websocket.StatusNormalClosure, "")
	r := receive(t, first, 10*time.Second, "the waiter")
	if r.err != nil {
		t.Fatalf("the waiter: %v", r.err)
	}
	r.conn.Close(websocket.StatusNormalClosure, "")
}

// TestQueueWakesOnSkipEnd: the only provider answers 429 Retry-After: 1,
// then serves. A client queues and is served right after the skip ends,
// with no session ending anywhere.
func TestQueueWakesOnSkipEnd(t *testing.T) {
	flaky := newScripted(t, "qs-flaky", nil, func(n int64) step {
		if n == 1 {
			return step{status: 429, header: http.Header{"Retry-After": {"1"}}}
		}
		return step{}
	})
	g := testgw.Start(t, handler(`"queue":{"size":10,"timeout":"20s"}`, provider("qs-flaky", flaky.URL(), "")))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	r := receive(t, dialAsync(ctx, g.WS("/")), 25*time.Second, "the client")
	if r.err != nil {
		t.Fatalf("client: %v (status %d)", r.err, r.status)
	}
	defer r.conn.CloseNow()
	elapsed := time.Since(start)
	if elapsed < 900*time.Millisecond || elapsed > 10*time.Second {
		t.Fatalf("served after %v, want soon after the 1s skip and well before the 20s queue timeout", elapsed)
	}
	if n := flaky.Hits.Load(); n != 2 {
		t.Fatalf("provider contacted %d times, want 2", n)
	}
	r.conn.Close(websocket.StatusNormalClosure, "")
	e := waitSessionLogs(t, g, 1)[0]
	// The 429, possibly skips of a spurious wake-up (allowed), then the ok.
	w := attemptWords(e)
	if len(w) < 2 || w[0] != "qs-flaky:status_429" || w[len(w)-1] != "qs-flaky:ok" {
		t.Fatalf("attempts %v", w)
	}
	for _, x := range w[1 : len(w)-1] {
		if x != "qs-flaky:cooldown" {
			t.Fatalf("attempts %v", w)
		}
	}
	if ms := e["queue_wait_ms"].(float64); ms < 800 {
		t.Fatalf("queue_wait_ms %v", ms)
	}
}

// TestQueueWakesOnCooldownEnd: the only provider is cooled down by 500s
// (queue off); after a reload turns the queue on, a client queues and is
// served by the trial right after the cooldown ends.
func TestQueueWakesOnCooldownEnd(t *testing.T) {
	flaky := newScripted(t, "qc-flaky", nil, func(n int64) step {
		if n <= 5 {
			return step{status: 500}
		}
		return step{}
	})
	p := provider("qc-flaky", flaky.URL(), "")
	g := testgw.Start(t, handler(`"queue":{"size":0},"cooldown":{"duration":"2s"}`, p))
	for range 5 {
		must503(t, g)
	}
	s := health(t, "qc-flaky")
	if s.Healthy || s.Cooldowns != 1 {
		t.Fatalf("not cooled down: %+v", s)
	}
	if err := g.Reload(handler(`"queue":{"size":10,"timeout":"20s"},"cooldown":{"duration":"2s"}`, p)); err != nil {
		t.Fatal(err)
	}
	if !health(t, "qc-flaky").Until.Equal(s.Until) {
		t.Fatal("the reload changed the cooldown")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Caddy stops the old config's server in the background once /load has
	// answered, so a connection made right after may still be accepted by
	// it and get its answer: a 503 at once, with no queue. A real client
	// tries again. (The new config answers nothing before the cooldown
	// ends, so an answer within a second is the old one.)
	var r dialResult
	for try := 0; ; try++ {
		r = receive(t, dialAsync(ctx, g.WS("/")), 25*time.Second, "the client")
		if r.err == nil || r.status != http.StatusServiceUnavailable || r.elapsed >= time.Second || try == 2 {
			break
		}
		t.Logf("a 503 after %v: the old config's server took the connection", r.elapsed)
	}
	if r.err != nil {
		t.Fatalf("client: %v (status %d)", r.err, r.status)
	}
	defer r.conn.CloseNow()
	if now := time.Now(); now.Before(s.Until) || now.After(s.Until.Add(8*time.Second)) {
		t.Fatalf("served %v after the cooldown's end, want soon after it", now.Sub(s.Until))
	}
	if n := flaky.Hits.Load(); n != 6 {
		t.Fatalf("provider contacted %d times, want 6", n)
	}
	if s := health(t, "qc-flaky"); !s.Healthy || s.Streak != 0 {
		t.Fatalf("after the successful trial: %+v", s)
	}
}

// TestQueueWakesOnLaterCooldownEnd: two providers skip for different
// times. The first to come back takes the first waiter and is then full;
// the second waiter must be woken when the second provider comes back,
// although no session ends.
func TestQueueWakesOnLaterCooldownEnd(t *testing.T) {
	early := newScripted(t, "ql-early", nil, func(n int64) step {
		if n == 1 {
			return step{status: 429, header: http.Header{"Retry-After": {"1"}}}
		}
		return step{}
	})
	late := newScripted(t, "ql-late", nil, func(n int64) step {
		if n == 1 {
			return step{status: 429, header: http.Header{"Retry-After": {"3"}}}
		}
		return step{}
	})
	g := testgw.Start(t, handler(`"queue":{"size":10,"timeout":"12s"}`,
		provider("ql-early", early.URL(), `"max_concurrent":1`),
		provider("ql-late", late.URL(), `"priority":2`)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	first := dialAsync(ctx, g.WS("/"))
	waitWaiting(t, "ql-early", 1)
	second := dialAsync(ctx, g.WS("/"))
	waitWaiting(t, "ql-early", 2)

	r1 := receive(t, first, 25*time.Second, "the first waiter")
	if r1.err != nil {
		t.Fatalf("first waiter: %v (status %d)", r1.err, r1.status)
	}
	defer r1.conn.CloseNow() // held: ql-early stays full
	r2 := receive(t, second, 25*time.Second, "the second waiter")
	if r2.err != nil {
		t.Fatalf("second waiter: %v (status %d) after %v; want it served when ql-late's skip ended (~3s)", r2.err, r2.status, time.Since(start))
	}
	defer r2.conn.CloseNow()
	if d := time.Since(start); d > 9*time.Second {
		t.Fatalf("second waiter served after %v, want soon after ql-late's 3s skip", d)
	}
	if late.Hits.Load() != 2 || early.Hits.Load() != 2 {
		t.Fatalf("hits early %d late %d", early.Hits.Load(), late.Hits.Load())
	}
}

// TestQueueStorm: 1,000 clients against one provider with max_concurrent
// 4; each session exchanges one message and closes. Every client is
// answered exactly once (all are served: queue size 1000, timeout 30s),
// and afterwards every count is back to 0 and the queue is empty.
func TestQueueStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("storm test")
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < 8192 {
		lim.Cur = min(lim.Max, 8192)
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	const clients = 1000
	echo := fakes.Echo("qm-echo", nil)
	defer echo.Close()
	g := testgw.Start(t, handler(`"queue":{"size":1000,"timeout":"30s"}`, provider("qm-echo", echo.URL(), `"max_concurrent":4`)))

	var served, rejected, failed, peak atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, resp, err := websocket.Dial(ctx, g.WS("/"), nil)
			if err != nil {
				if resp != nil && resp.StatusCode == http.StatusServiceUnavailable {
					rejected.Add(1)
					return
				}
				failed.Add(1)
				firstErr.CompareAndSwap(nil, fmt.Sprintf("client %d: %v", i, err))
				return
			}
			if n := active("qm-echo"); n > peak.Load() {
				peak.Store(n) // racy maximum, good enough to spot a breach
			}
			msg := []byte(fmt.Sprintf("client-%d", i))
			err = c.Write(ctx, websocket.MessageText, msg)
			if err == nil {
				var got []byte
				_, got, err = c.Read(ctx)
				if err == nil && string(got) != string(msg) {
					err = fmt.Errorf("echo %q", got)
				}
			}
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, fmt.Sprintf("client %d session: %v", i, err))
				c.CloseNow()
				return
			}
			served.Add(1)
			c.Close(websocket.StatusNormalClosure, "")
		}()
		if i%50 == 49 {
			time.Sleep(5 * time.Millisecond) // spread the SYNs a little
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	t.Logf("%d clients: %d served, %d rejected, %d failed in %v (peak active %d)", clients, served.Load(), rejected.Load(), failed.Load(), elapsed, peak.Load())
	if failed.Load() != 0 {
		t.Fatalf("%d clients failed, first: %v", failed.Load(), firstErr.Load())
	}
	if served.Load()+rejected.Load() != clients {
		t.Fatalf("served %d + rejected %d != %d", served.Load(), rejected.Load(), clients)
	}
	if rejected.Load() != 0 {
		t.Fatalf("%d clients rejected, want all served before the 30s queue timeout", rejected.Load())
	}
	if peak.Load() > 4 {
		t.Fatalf("%d sessions at once on a max_concurrent 4 provider", peak.Load())
	}
	testgw.Eventually(t, 15*time.Second, "every count back to 0", func() bool {
		p := state(t, "qm-echo")
		return p.Slots.Active() == 0 && p.Slots.Reserved() == 0 && pool.Current().Sessions.Count() == 0 && waiting("qm-echo") == 0
	})
	if n := echo.Hits.Load(); n != clients {
		t.Fatalf("provider contacted %d times for %d sessions", n, clients)
	}
	entries := waitSessionLogs(t, g, clients)
	if len(entries) != clients {
		t.Fatalf("%d session ended entries", len(entries))
	}
	queued := 0
	for _, e := range entries {
		ms, ok := e["queue_wait_ms"].(float64)
		if !ok {
			t.Fatalf("entry without queue_wait_ms: %v", e)
		}
		if ms > 0 {
			queued++
		}
	}
	if queued < clients/2 {
		t.Fatalf("only %d of %d sessions logged a queue wait", queued, clients)
	}
}

// TestQueueWakesOnTrialSuccess: a client queues because the provider's
// trial (another client's) is in flight; when the trial succeeds the
// provider is healthy again and the waiter is served, although no slot
// freed and no cooldown ended after it queued.
func TestQueueWakesOnTrialSuccess(t *testing.T) {
	flaky := newScripted(t, "qr-flaky", nil, func(n int64) step {
		switch {
		case n <= 3:
			return step{status: 500}
		case n == 4: // the trial: slow, then fine
			return step{delay: 600 * time.Millisecond}
		}
		return step{}
	})
	other := fakes.Echo("qr-other", nil)
	defer other.Close()
	ps := []string{provider("qr-flaky", flaky.URL(), ""), provider("qr-other", other.URL(), `"priority":2`)}
	const cd = `"cooldown":{"duration":"1s","min_requests":3}`
	g := testgw.Start(t, handler(`"queue":{"size":0},`+cd, ps...))
	state(t, "qr-other").SetDraining(true)
	defer state(t, "qr-other").SetDraining(false)
	for range 3 {
		must503(t, g)
	}
	s := health(t, "qr-flaky")
	if s.Cooldowns != 1 {
		t.Fatalf("not cooled down: %+v", s)
	}
	if err := g.Reload(handler(`"queue":{"size":10,"timeout":"15s"},`+cd, ps...)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(s.Until) + 30*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	trial := dialAsync(ctx, g.WS("/"))
	testgw.Eventually(t, 5*time.Second, "the trial to start", func() bool { return flaky.Hits.Load() == 4 })
	start := time.Now()
	waiter := dialAsync(ctx, g.WS("/"))
	waitWaiting(t, "qr-flaky", 1)
	if r := receive(t, trial, 10*time.Second, "the trial client"); r.err != nil {
		t.Fatalf("trial client: %v", r.err)
	} else {
		defer r.conn.CloseNow()
	}
	r := receive(t, waiter, 25*time.Second, "the waiter")
	if r.err != nil {
		t.Fatalf("waiter: %v (status %d) after %v; want it served once the trial succeeded", r.err, r.status, time.Since(start))
	}
	defer r.conn.CloseNow()
	if d := time.Since(start); d > 8*time.Second {
		t.Fatalf("waiter served after %v, want soon after the trial succeeded", d)
	}
}

// TestQueueFrontLeavesWhileRetrying: the first waiter retries a provider
// that fails without cooling down (once a second); a second client queues
// behind it without a pass of its own. When the first leaves, the second
// takes over the retries and is served once the provider recovers.
func TestQueueFrontLeavesWhileRetrying(t *testing.T) {
	flaky := newScripted(t, "qb-flaky", nil, func(n int64) step {
		if n <= 3 {
			return step{status: 500}
		}
		return step{}
	})
	g := testgw.Start(t, handler(`"queue":{"size":10,"timeout":"15s"},"cooldown":{"min_requests":50}`,
		provider("qb-flaky", flaky.URL(), "")))
	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	first := dialAsync(ctx1, g.WS("/"))
	waitWaiting(t, "qb-flaky", 1)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	second := dialAsync(ctx2, g.WS("/"))
	waitWaiting(t, "qb-flaky", 2)
	testgw.Eventually(t, 10*time.Second, "the first waiter's retry", func() bool { return flaky.Hits.Load() >= 2 })
	cancel1()
	start := time.Now()
	if r := receive(t, first, 10*time.Second, "the first client"); r.err == nil {
		r.conn.CloseNow()
		t.Fatal("the first client was served")
	}
	r := receive(t, second, 25*time.Second, "the second waiter")
	if r.err != nil {
		t.Fatalf("second waiter: %v (status %d) after %v; want it served once the provider recovered", r.err, r.status, time.Since(start))
	}
	defer r.conn.CloseNow()
	if d := time.Since(start); d > 8*time.Second {
		t.Fatalf("second waiter served %v after the first left", d)
	}
}

// TestQueueRetryRateLimitedProvider: a waiter on a failing provider with
// max_concurrent retries it at most once a second (its own failed
// attempt's freed slot does not wake it again at once).
func TestQueueRetryRateLimitedProvider(t *testing.T) {
	bad := newScripted(t, "qy-bad", nil, always(step{status: 500}))
	g := testgw.Start(t, handler(`"queue":{"size":10,"timeout":"3s"},"cooldown":{"min_requests":50}`,
		provider("qy-bad", bad.URL(), `"max_concurrent":1`)))
	r := must503(t, g)
	// Passes at about 0, 1, 2 (and perhaps 3) seconds.
	if n := bad.Hits.Load(); n < 2 || n > 4 {
		t.Fatalf("%d attempts in 3s, want one a second: %v", n, r.words())
	}
	if int64(len(r.Body.Attempts)) != bad.Hits.Load() {
		t.Fatalf("attempts %v for %d hits", r.words(), bad.Hits.Load())
	}
}
