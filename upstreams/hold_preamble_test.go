package upstreams

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// replies is a test's IsReply: it records every message it is given and
// takes those that start with `{"id":90` for answers.
type replies struct {
	mu   sync.Mutex
	seen []string
}

func (r *replies) isReply(m []byte) bool {
	r.mu.Lock()
	r.seen = append(r.seen, string(m))
	r.mu.Unlock()
	return bytes.HasPrefix(m, []byte(`{"id":90`))
}

func (r *replies) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.seen...)
}

var testPreamble = [][]byte{
	[]byte(`{"id":901,"method":"Target.setAutoAttach","params":{"autoAttach":false}}`),
	[]byte(`{"id":902,"method":"Target.setDiscoverTargets","params":{"discover":false}}`),
}

// resumeWith joins a new client with the test preamble; it returns the
// client's end and the channel of its join report.
func (h *holdRelay) resumeWith(t *testing.T, r *replies, pending []byte, wait time.Duration) (net.Conn, chan JoinReport) {
	t.Helper()
	c, gw := tcpPair(t)
	reports := make(chan JoinReport, 2)
	err := h.s.ResumeWith(gw, ResumeOptions{Pending: pending, Preamble: testPreamble, IsReply: r.isReply,
		ReplyWait: wait, OnJoin: func(jr JoinReport) { reports <- jr }})
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	return c, reports
}

// readPreamble reads the preamble's two frames at the provider: masked
// text frames, in order.
func (h *holdRelay) readPreamble(t *testing.T) {
	t.Helper()
	for i, want := range testPreamble {
		f := h.providerFrame(t)
		if f.op != 0x1 || !f.masked || !bytes.Equal(f.payload, want) {
			t.Fatalf("preamble message %d: provider got op %#x masked %v %q, want a masked text frame %q",
				i, f.op, f.masked, f.payload, want)
		}
	}
}

// writeCut writes b to c in pieces of n bytes, so frames are cut across
// the relay's reads.
func writeCut(c net.Conn, b []byte, n int) {
	for off := 0; off < len(b); off += n {
		c.Write(b[off:min(off+n, len(b))])
		time.Sleep(time.Millisecond)
	}
}

func joinReport(t *testing.T, reports chan JoinReport) JoinReport {
	t.Helper()
	select {
	case r := <-reports:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("the client did not join")
		return JoinReport{}
	}
}

// TestResumePreamble: the preamble reaches the provider masked and in
// order before any byte of the new client, although the client writes at
// once; the provider's answers (one of them fragmented, a ping between
// its frames), its events and the rest of a frame that was in flight
// toward the client that left are dropped, pings still answered; only
// whole text messages whose start came after the preamble go to IsReply;
// once both answers are in, the client's pending and later bytes reach the
// provider as they are, and the provider's next message is the first
// thing the client gets. A later plain Resume sends no preamble.
func TestResumePreamble(t *testing.T) {
	h := newHoldRelay(t, SessionOptions{Hold: true})
	cr := bufio.NewReader(h.client)
	// A text frame in flight when the client drops, that looks like an
	// answer: its start came before the preamble, so it is none.
	inflight := mkFrame(true, 0x1, []byte(`{"id":901,"result":{},"pad":"`+strings.Repeat("p", 1000)+`"}`), false, 0)
	h.provider.Write(inflight[:500])
	readRaw(t, h.client, cr, 500)
	h.client.Close()
	h.waitPark(t)

	r := &replies{}
	pending := mkFrame(true, 0x1, []byte(`{"id":1,"method":"Browser.getVersion"}`), true, 0)
	c2, reports := h.resumeWith(t, r, pending, 30*time.Second)
	fromC2 := mkFrame(true, 0x1, []byte(`{"id":2,"method":"Target.getTargets"}`), true, 0)
	c2.Write(fromC2)
	h.readPreamble(t)
	// Nothing of the client while the answers are awaited.
	h.providerSilent(t, 300*time.Millisecond)

	event := `{"method":"Target.targetCreated","params":{}}`
	reply902 := `{"id":902,"result":{}}`
	var seq []byte
	seq = append(seq, inflight[500:]...)
	seq = append(seq, mkFrame(true, 0x1, []byte(event), false, 0)...)
	seq = append(seq, mkFrame(true, 0x2, []byte(`{"id":902,"binary":true}`), false, 0)...)
	seq = append(seq, mkFrame(false, 0x1, []byte(`{"id":901,`), false, 0)...)
	seq = append(seq, mkFrame(true, opPing, []byte("still there?"), false, 0)...)
	seq = append(seq, mkFrame(true, 0x0, []byte(`"result":{}}`), false, 0)...)
	seq = append(seq, mkFrame(true, 0x1, []byte(reply902), false, 0)...)
	writeCut(h.provider, seq, 13)

	if f := h.providerFrame(t); f.op != opPong || !f.masked || string(f.payload) != "still there?" {
		t.Fatalf("provider got %+v, want the masked pong", f)
	}
	want := append(append([]byte(nil), pending...), fromC2...)
	if got := readRaw(t, h.provider, h.pr, len(want)); !bytes.Equal(got, want) {
		t.Fatalf("provider got % x, want the client's bytes % x", got, want)
	}
	jr := joinReport(t, reports)
	if jr.Sent != 2 || jr.Replies != 2 || !jr.Answered() || jr.Waited <= 0 {
		t.Fatalf("join report %+v, want 2 sent, 2 answered", jr)
	}
	t.Logf("joined after %v", jr.Waited)
	after := mkFrame(true, 0x1, []byte(`{"id":1,"result":{}}`), false, 0)
	h.provider.Write(after)
	c2r := bufio.NewReader(c2)
	if got := readRaw(t, c2, c2r, len(after)); !bytes.Equal(got, after) {
		t.Fatalf("new client got % x first, want % x", got, after)
	}
	wantSeen := []string{event, `{"id":901,"result":{}}`, reply902}
	if seen := r.got(); strings.Join(seen, "\n") != strings.Join(wantSeen, "\n") {
		t.Fatalf("IsReply saw %q, want %q", seen, wantSeen)
	}
	if fr, b := h.s.ParkedDropped(); fr != 7 || b != int64(len(seq)) {
		t.Fatalf("dropped %d frames, %d bytes; want 7, %d", fr, b, len(seq))
	}
	// (A counter moves just after its write returns; dropped bytes
	// counted as relayed would pass the figure, never reach it.)
	waitCond(t, 5*time.Second, "bytes down of what was relayed only, none of what was dropped", func() bool {
		return h.s.BytesDown() == 500+int64(len(after))
	})

	// Parked again; a plain Resume joins without a preamble.
	c2.Write(closeFrame(CloseNormal, "", true))
	h.waitPark(t)
	c3 := h.resume(t, nil)
	c3.Write(fromC2)
	if got := readRaw(t, h.provider, h.pr, len(fromC2)); !bytes.Equal(got, fromC2) {
		t.Fatalf("provider got % x from the third client, want its frame and no preamble", got)
	}
	select {
	case jr := <-reports:
		t.Fatalf("a second join report %+v", jr)
	default:
	}
}

// TestResumePreambleUnanswered: answers that do not come within the wait
// do not keep the client out: it joins when the wait is over (not
// before), with what was answered reported; an answer after that reaches
// the client as any message.
func TestResumePreambleUnanswered(t *testing.T) {
	const wait = 400 * time.Millisecond
	h := newHoldRelay(t, SessionOptions{Hold: true})
	h.client.Close()
	h.waitPark(t)
	r := &replies{}
	start := time.Now()
	c2, reports := h.resumeWith(t, r, nil, wait)
	fromC2 := mkFrame(true, 0x1, []byte(`{"id":3}`), true, 0)
	c2.Write(fromC2)
	h.readPreamble(t)
	h.provider.Write(append(mkFrame(true, 0x1, []byte(`{"id":901,"result":{}}`), false, 0),
		mkFrame(true, 0x1, []byte(`{"method":"Target.attachedToTarget"}`), false, 0)...))
	if got := readRaw(t, h.provider, h.pr, len(fromC2)); !bytes.Equal(got, fromC2) {
		t.Fatalf("provider got % x", got)
	}
	jr := joinReport(t, reports)
	took := time.Since(start)
	if jr.Sent != 2 || jr.Replies != 1 || jr.Answered() || jr.Waited < wait {
		t.Fatalf("join report %+v, want 2 sent, 1 answered, a wait of %v at least", jr, wait)
	}
	if took < wait {
		t.Fatalf("joined %v after the resume, before the wait (%v) was over", took, wait)
	}
	t.Logf("joined %v after the resume (report: %+v)", took, jr)
	late := mkFrame(true, 0x1, []byte(`{"id":902,"result":{}}`), false, 0)
	h.provider.Write(late)
	if got := readRaw(t, c2, c2, len(late)); !bytes.Equal(got, late) {
		t.Fatalf("client got % x, want the late answer % x", got, late)
	}
}

// TestResumePreambleLongMessages: text messages longer than
// MaxReplyMessage, in one frame or several, are dropped unread (an answer
// among them does not count); one of exactly MaxReplyMessage bytes is
// read.
func TestResumePreambleLongMessages(t *testing.T) {
	h := newHoldRelay(t, SessionOptions{Hold: true})
	h.client.Close()
	h.waitPark(t)
	r := &replies{}
	c2, reports := h.resumeWith(t, r, nil, 30*time.Second)
	h.readPreamble(t)
	long := func(n int) []byte {
		p := []byte(`{"id":901,"pad":"`)
		p = append(p, bytes.Repeat([]byte("x"), n-len(p)-2)...)
		return append(p, `"}`...)
	}
	exact := long(MaxReplyMessage)
	exact[6] = '8' // {"id":801…: read, not an answer
	var seq []byte
	seq = append(seq, mkFrame(true, 0x1, long(MaxReplyMessage+1), false, 0)...)
	two := long(80000)
	seq = append(seq, mkFrame(false, 0x1, two[:40000], false, 0)...)
	seq = append(seq, mkFrame(true, 0x0, two[40000:], false, 0)...)
	seq = append(seq, mkFrame(true, 0x1, exact, false, 0)...)
	seq = append(seq, mkFrame(true, 0x1, []byte(`{"id":902,"result":{}}`), false, 0)...)
	h.provider.Write(seq)
	// Only one answer so far: no join.
	select {
	case jr := <-reports:
		t.Fatalf("joined (%+v) with one answer", jr)
	case <-time.After(300 * time.Millisecond):
	}
	if seen := r.got(); len(seen) != 2 || seen[0] != string(exact) || seen[1] != `{"id":902,"result":{}}` {
		lens := make([]int, len(seen))
		for i, s := range seen {
			lens[i] = len(s)
		}
		t.Fatalf("IsReply saw messages of %v bytes, want %d and 22", lens, len(exact))
	}
	h.provider.Write(mkFrame(true, 0x1, []byte(`{"id":901,"result":{}}`), false, 0))
	if jr := joinReport(t, reports); jr.Replies != 2 {
		t.Fatalf("join report %+v", jr)
	}
	after := mkFrame(true, 0x1, []byte("after"), false, 0)
	h.provider.Write(after)
	if got := readRaw(t, c2, c2, len(after)); !bytes.Equal(got, after) {
		t.Fatalf("client got % x", got)
	}
}

// TestResumePreambleRaces: a preamble changes nothing of Resume's races:
// of two resumes one wins and the provider gets one preamble; a resume
// racing Close or the provider's close frame either loses or wins a
// client that then gets a close frame (never a join); Close while the
// answers are awaited gives the client a close frame; the session ends
// once each time.
func TestResumePreambleRaces(t *testing.T) {
	t.Run("two resumes", func(t *testing.T) {
		h := newHoldRelay(t, SessionOptions{Hold: true})
		r := &replies{}
		reports := make(chan JoinReport, 2)
		winner := twoResumes(t, h, func(gw net.Conn) error {
			return h.s.ResumeWith(gw, ResumeOptions{Preamble: testPreamble, IsReply: r.isReply,
				OnJoin: func(jr JoinReport) { reports <- jr }})
		})
		h.readPreamble(t)
		h.provider.Write(append(mkFrame(true, 0x1, []byte(`{"id":901}`), false, 0), mkFrame(true, 0x1, []byte(`{"id":902}`), false, 0)...))
		joinReport(t, reports)
		msg := mkFrame(true, 0x1, []byte("to the winner"), false, 0)
		h.provider.Write(msg)
		if got := readRaw(t, winner, winner, len(msg)); !bytes.Equal(got, msg) {
			t.Fatalf("winner got % x", got)
		}
		// One preamble only.
		h.providerSilent(t, 200*time.Millisecond)
	})
	for _, rival := range []string{"Close", "provider close"} {
		t.Run("resume and "+rival, func(t *testing.T) {
			resumeAgainstRival(t, rival, func(h *holdRelay) (func(net.Conn) error, func(int)) {
				// The preamble (when the resume won) goes unanswered.
				joined := make(chan JoinReport, 1)
				resume := func(gw net.Conn) error {
					return h.s.ResumeWith(gw, ResumeOptions{Preamble: testPreamble, IsReply: (&replies{}).isReply,
						OnJoin: func(jr JoinReport) { joined <- jr }})
				}
				return resume, func(i int) {
					if len(joined) != 0 {
						t.Fatalf("round %d: the client joined a session that ended", i)
					}
				}
			}, func(i int, fs []frame) {
				if len(fs) != 1 || fs[0].op != opClose {
					t.Fatalf("round %d: the resumed client got %+v, want a close frame alone", i, fs)
				}
			})
		})
	}
	t.Run("Close while waiting", func(t *testing.T) {
		h := newHoldRelay(t, SessionOptions{Hold: true})
		h.client.Close()
		h.waitPark(t)
		c, reports := h.resumeWith(t, &replies{}, nil, 30*time.Second)
		h.readPreamble(t)
		h.s.Close(CloseGoingAway, EndShutdown)
		fromProvider := answerClose(h.provider, closeFrame(CloseGoingAway, "", false))
		fs := answerAndHangUp(c, closeFrame(CloseNormal, "", true))
		if len(fs) != 1 || !isClose(fs[0], CloseGoingAway, EndShutdown) {
			t.Fatalf("the waiting client got %+v, want the close frame alone", fs)
		}
		if pf := <-fromProvider; len(pf) != 1 || !pf[0].masked || !isClose(pf[0], CloseGoingAway, EndShutdown) {
			t.Fatalf("provider got %+v", pf)
		}
		h.waitEnd(t)
		if len(reports) != 0 {
			t.Fatal("a join report for a session that ended")
		}
	})
}

// TestResumePreambleNeedsReplyCheck: a preamble without IsReply is
// refused, and the session stays parked.
func TestResumePreambleNeedsReplyCheck(t *testing.T) {
	h := newHoldRelay(t, SessionOptions{Hold: true})
	h.client.Close()
	h.waitPark(t)
	_, gw := tcpPair(t)
	if err := h.s.ResumeWith(gw, ResumeOptions{Preamble: testPreamble}); !errors.Is(err, ErrNoReplyCheck) {
		t.Fatalf("resume: %v, want ErrNoReplyCheck", err)
	}
	if !h.s.Parked() {
		t.Fatal("not parked any more")
	}
	h.providerSilent(t, 100*time.Millisecond)
}

// TestAppendDataFrame: the preamble's frames in each length form, masked.
func TestAppendDataFrame(t *testing.T) {
	for _, n := range []int{0, 125, 126, 0xffff, 0x10000} {
		p := payloadOf(n)
		b := appendDataFrame(nil, 0x1, p)
		f, err := readFrame(bufio.NewReader(bytes.NewReader(b)))
		if err != nil || f.op != 0x1 || !f.masked || !bytes.Equal(f.payload, p) {
			t.Fatalf("%d bytes: %+v %v", n, f.op, err)
		}
		var tr frameTracker
		if tr.advance(b, false); !tr.atMessageBoundary() {
			t.Fatalf("%d bytes: the tracker is not at a boundary after the frame", n)
		}
	}
}
