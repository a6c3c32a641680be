package upstreams

import (
	"bytes"
	"context"
	"net/http"
	"time"
)

// A probe in two steps, for many probes due at once: Send writes each
// request on its kept connection; Await waits for one answer to begin to
// come; Collect reads an answer that is there, whole, without waiting;
// only a probe whose answer does not come soon needs Finish, which waits
// for it alone. The answers of many probes are so read by one goroutine,
// with one read each and no wake-up each. The probe is the same as
// Probe's: the same request, checks, timeout and result, Elapsed running
// from the request's sending to its answer's reading.

// Send starts a probe on the kept connection: it writes the request and
// returns true; the prober stays busy (Close waits) until Collect or Finish
// ends the probe. It returns false, having started nothing, when the probe
// cannot be run in two steps (no kept connection yet, a TLS one, or the
// kept one failed to take the request): Probe is the way then.
func (pr *Prober) Send(ctx context.Context) bool {
	pr.mu.Lock()
	if pr.conn == nil || pr.rd.raw == nil || pr.closed || pr.br.Buffered() > 0 {
		pr.mu.Unlock()
		return false
	}
	pr.watch(ctx)
	if pr.deadlineSet {
		// The last probe waited: its deadline, past by now, would end the
		// read that does not wait.
		pr.setReadDeadline(ctx, time.Time{})
		pr.deadlineSet = false
	}
	pr.start = time.Now()
	if err := pr.rd.raw.write(pr.req); err != nil {
		// The provider closed the kept connection while it was idle:
		// Probe sends the request on a fresh one, as it would have.
		pr.drop()
		pr.mu.Unlock()
		return false
	}
	pr.sent = true
	return true
}

// Collect ends the probe Send started if its answer is there, whole, and
// needs nothing more (no second request): done is then true. Otherwise
// nothing is lost (what it read is read again) and Finish ends the probe.
func (pr *Prober) Collect(ctx context.Context) (res ProbeResult, done bool) {
	if !pr.sent {
		panic("upstreams: Prober.Collect without Send")
	}
	if len(pr.rd.ahead) == 0 && pr.rd.aheadErr == nil && !pr.rd.readAhead() {
		return res, false
	}
	// Most often the one read has it all: it is read where it is.
	ans, body, keep, whole := wholeAnswer(pr.rd.ahead)
	var err error
	if !whole || pr.rd.aheadErr != nil {
		pr.rd.nowait = true
		ans, body, keep, err = pr.readExchange()
		pr.rd.nowait = false
	}
	if err != nil || pr.hostRefused(ans, body) {
		// Not all there yet, or it takes another request: Finish reads it
		// all again, waiting as needed.
		pr.rd.rewind()
		pr.br.Reset(&pr.rd)
		return res, false
	}
	if !keep || ctx.Err() != nil {
		pr.drop()
	} else {
		// The next answer too will most likely be read without waiting.
		pr.rd.raw.quiet(true)
	}
	res = pr.result(ctx, ans, body, nil)
	res.Outcome.Elapsed = time.Since(pr.start)
	pr.rd.forget()
	pr.sent = false
	pr.mu.Unlock()
	return res, true
}

// Await waits at most d (and not past the probe's timeout) for the answer
// to the request Send wrote to begin to come, and reads what has; false
// when nothing has. Collect reads the rest.
func (pr *Prober) Await(d time.Duration) bool {
	if !pr.sent {
		panic("upstreams: Prober.Await without Send")
	}
	if len(pr.rd.ahead) > 0 || pr.rd.aheadErr != nil || pr.rd.readAhead() {
		return true
	}
	pr.rd.raw.quiet(false)
	until := time.Now().Add(d)
	if end := pr.start.Add(pr.opts.Timeout); end.Before(until) {
		until = end
	}
	pr.setReadDeadline(pr.watching, until)
	pr.deadlineSet = true
	return pr.rd.readAheadWait()
}

// Finish ends the probe Send started, waiting for its answer within the
// timeout (counted from Send).
func (pr *Prober) Finish(ctx context.Context) ProbeResult {
	if !pr.sent {
		panic("upstreams: Prober.Finish without Send")
	}
	defer pr.mu.Unlock()
	pr.sent = false
	res := pr.probe(ctx, pr.start, true)
	pr.rd.forget()
	return res
}

// wholeAnswer reads an answer that buf holds whole, head and body, and
// nothing more, as readExchange would read it; ok is false when buf holds
// less or more, or anything readExchange would fail on (which reads it
// then). The body is part of buf.
func wholeAnswer(buf []byte) (a probeAnswer, body []byte, keep, ok bool) {
	a = probeAnswer{length: -1}
	next := func() ([]byte, bool) {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			return nil, false
		}
		line := buf[:i]
		buf = buf[i+1:]
		return bytes.TrimSuffix(line, []byte{'\r'}), true
	}
	line, found := next()
	if !found || a.statusLine(line) != nil {
		return a, nil, false, false
	}
	for n := 0; ; n++ {
		line, found := next()
		if !found {
			return a, nil, false, false
		}
		if len(line) == 0 {
			break
		}
		if a.field(n, line) != nil {
			return a, nil, false, false
		}
	}
	a.headDone()
	keep = a.http11 && !a.close
	switch {
	case a.status < 200 || a.status == http.StatusNoContent || a.status == http.StatusNotModified:
		return a, nil, keep, len(buf) == 0
	case !a.chunked && a.length >= 0 && a.length <= maxProbeBody:
		return a, buf, keep, int64(len(buf)) == a.length
	}
	return a, nil, false, false
}
