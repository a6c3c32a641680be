package upstreams

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// holdRelay is a session between a fake client and a fake provider on
// loopback TCP that counts its parks and ends.
type holdRelay struct {
	s        *Session
	client   net.Conn // the client's end
	provider net.Conn // the provider's end
	pr       *bufio.Reader
	parks    chan *Session
	ends     chan *Session
	endN     atomic.Int32
	farewell *Farewell // the session's, if any
}

func newHoldRelay(t *testing.T, o SessionOptions) *holdRelay {
	t.Helper()
	client, gwClient := tcpPair(t)
	gwUp, provider := tcpPair(t)
	h := &holdRelay{client: client, provider: provider, pr: bufio.NewReader(provider),
		parks: make(chan *Session, 16), ends: make(chan *Session, 16)}
	o.OnPark = func(s *Session) { h.parks <- s }
	o.OnEnd = func(s *Session) { h.endN.Add(1); h.ends <- s }
	h.farewell = o.Farewell
	h.s = NewSession(gwClient, &Conn{Conn: gwUp}, o)
	h.s.Run()
	t.Cleanup(func() { h.s.Close(CloseGoingAway, "test over") })
	return h
}

func (h *holdRelay) waitPark(t *testing.T) {
	t.Helper()
	select {
	case <-h.parks:
	case <-h.ends:
		t.Fatalf("the session ended (%s) instead of parking", h.s.Reason())
	case <-time.After(5 * time.Second):
		t.Fatal("the session did not park")
	}
	if !h.s.Parked() || !h.s.ClientEnded() {
		t.Fatalf("after OnPark: parked %v, client ended %v", h.s.Parked(), h.s.ClientEnded())
	}
}

func (h *holdRelay) waitEnd(t *testing.T) {
	t.Helper()
	select {
	case <-h.ends:
	case <-time.After(5 * time.Second):
		t.Fatal("the session did not end")
	}
	if n := h.endN.Load(); n != 1 {
		t.Fatalf("OnEnd called %d times", n)
	}
	if h.s.Parked() {
		t.Fatal("an ended session reports parked")
	}
}

// stillOn checks that the session has not ended (nor parked again) for a
// while.
func (h *holdRelay) stillOn(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-h.ends:
		t.Fatalf("the session ended (%s)", h.s.Reason())
	case <-h.parks:
		t.Fatal("the session parked again")
	case <-time.After(d):
	}
}

// resume joins a new client; it returns the client's end.
func (h *holdRelay) resume(t *testing.T, pending []byte) net.Conn {
	t.Helper()
	c, gw := tcpPair(t)
	if err := h.s.Resume(gw, pending); err != nil {
		t.Fatalf("resume: %v", err)
	}
	return c
}

// providerFrame reads the next frame the provider gets.
func (h *holdRelay) providerFrame(t *testing.T) frame {
	t.Helper()
	h.provider.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err := readFrame(h.pr)
	if err != nil {
		t.Fatalf("provider: %v", err)
	}
	h.provider.SetReadDeadline(time.Time{})
	return f
}

// providerSilent checks that the provider gets nothing for d, and that its
// connection is still open.
func (h *holdRelay) providerSilent(t *testing.T, d time.Duration) {
	t.Helper()
	h.provider.SetReadDeadline(time.Now().Add(d))
	_, err := h.pr.Peek(1)
	if err == nil {
		f, _ := readFrame(h.pr)
		t.Fatalf("the provider got a frame (opcode %#x, payload %q)", f.op, f.payload)
	}
	if !isTimeout(err) {
		t.Fatalf("the provider's connection ended: %v", err)
	}
	h.provider.SetReadDeadline(time.Time{})
}

// readRaw reads exactly n bytes from c.
func readRaw(t *testing.T, c net.Conn, r io.Reader, n int) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		t.Fatalf("read %d bytes: %v", n, err)
	}
	c.SetReadDeadline(time.Time{})
	return b
}

// readEnd reads c until it ends and returns what came.
func readEnd(t *testing.T, c net.Conn) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("reading to the end: %v", err)
	}
	return b
}

// answerAndHangUp reads frames from c until a close frame, answers it with
// reply and closes c; it returns the frames read.
func answerAndHangUp(c net.Conn, reply []byte) []frame {
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	out, closed := readToClose(bufio.NewReader(c), c, reply)
	if closed {
		c.Close()
	}
	return out
}

func resetConn(c net.Conn) {
	c.(*net.TCPConn).SetLinger(0)
	c.Close()
}

// TestHoldParksOnClientDrop: a client whose connection drops (FIN or RST)
// between two frames parks the session: OnPark, no OnEnd, the provider's
// connection open and no close frame sent to it; ClientCloseCode is 1001.
func TestHoldParksOnClientDrop(t *testing.T) {
	for _, rst := range []bool{false, true} {
		name := map[bool]string{false: "FIN", true: "RST"}[rst]
		t.Run(name, func(t *testing.T) {
			h := newHoldRelay(t, SessionOptions{Hold: true})
			// The relay works as usual first.
			writeFrame(h.client, 0x1, []byte("hello"), true)
			if f := h.providerFrame(t); string(f.payload) != "hello" || !f.masked {
				t.Fatalf("provider got %+v", f)
			}
			writeFrame(h.provider, 0x1, []byte("welcome"), false)
			if f, err := readFrame(bufio.NewReader(h.client)); err != nil || string(f.payload) != "welcome" {
				t.Fatalf("client got %+v %v", f, err)
			}
			if rst {
				resetConn(h.client)
			} else {
				h.client.Close()
			}
			h.waitPark(t)
			if c := h.s.ClientCloseCode(); c != CloseGoingAway {
				t.Fatalf("client close code %d, want 1001", c)
			}
			h.providerSilent(t, 300*time.Millisecond)
			h.stillOn(t, 50*time.Millisecond)
		})
	}
}

// TestHoldClientCloseNotForwarded: the client's close frame parks the
// session: it is not relayed, the client gets its code echoed and its
// connection closed, and ClientCloseCode is the code (1000 for a close
// frame without one). With keepalive on too (the client's stream is then
// watched for pongs and close frames at once).
func TestHoldClientCloseNotForwarded(t *testing.T) {
	cases := []struct {
		name      string
		payload   []byte // the close frame's
		keepalive time.Duration
		code      int
		echo      []byte
	}{
		{"1000", binary.BigEndian.AppendUint16(nil, 1000), 0, 1000, []byte{0x03, 0xe8}},
		{"4001 with reason", append(binary.BigEndian.AppendUint16(nil, 4001), "later"...), 0, 4001, []byte{0x0f, 0xa1}},
		{"no code", nil, 0, 1000, nil},
		{"1000 with keepalive", binary.BigEndian.AppendUint16(nil, 1000), time.Hour, 1000, []byte{0x03, 0xe8}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHoldRelay(t, SessionOptions{Hold: true, Keepalive: tc.keepalive})
			// A data frame and the close frame in one write: the data is
			// relayed, the close is not.
			h.client.Write(append(frameBytes(0x2, []byte{0x88, 0x88}, true), frameBytes(opClose, tc.payload, true)...))
			if f := h.providerFrame(t); f.op != 0x2 || !bytes.Equal(f.payload, []byte{0x88, 0x88}) {
				t.Fatalf("provider got %+v", f)
			}
			h.waitPark(t)
			got := readEnd(t, h.client)
			if want := frameBytes(opClose, tc.echo, false); !bytes.Equal(got, want) {
				t.Fatalf("client got % x, want the echo % x then the end", got, want)
			}
			if c := h.s.ClientCloseCode(); c != tc.code {
				t.Fatalf("client close code %d, want %d", c, tc.code)
			}
			h.providerSilent(t, 300*time.Millisecond)
			if h.s.BytesUp() != int64(len(frameBytes(0x2, []byte{0x88, 0x88}, true))) {
				t.Fatalf("bytes up %d: the close frame was counted as relayed", h.s.BytesUp())
			}
		})
	}
}

// TestHoldDropsAndAnswersWhileParked: what the provider sends while parked
// is dropped and counted, frame by frame whatever the reads' cuts; its
// pings get a masked pong with the same payload.
func TestHoldDropsAndAnswersWhileParked(t *testing.T) {
	h := newHoldRelay(t, SessionOptions{Hold: true})
	h.client.Close()
	h.waitPark(t)
	var sent []byte
	sent = append(sent, mkFrame(true, 0x1, []byte("one"), false, 0)...)
	sent = append(sent, mkFrame(true, 0x2, payloadOf(200), false, 0)...)
	sent = append(sent, mkFrame(false, 0x2, payloadOf(70000), false, 0)...)
	sent = append(sent, mkFrame(true, 0x0, payloadOf(10), false, 0)...)
	sent = append(sent, mkFrame(true, opPong, []byte("unasked"), false, 0)...)
	sent = append(sent, mkFrame(true, opPing, []byte("are you there"), false, 0)...)
	// Written in odd pieces, so frames and pings are cut across reads.
	for off := 0; off < len(sent); off += 7001 {
		h.provider.Write(sent[off:min(off+7001, len(sent))])
		time.Sleep(2 * time.Millisecond)
	}
	f := h.providerFrame(t)
	if f.op != opPong || !f.masked || string(f.payload) != "are you there" {
		t.Fatalf("provider got %+v, want a masked pong", f)
	}
	waitCond(t, 5*time.Second, "the drops counted", func() bool {
		fr, b := h.s.ParkedDropped()
		return fr == 6 && b == int64(len(sent))
	})
	if fr, b := h.s.ParkedDropped(); fr != 6 || b != int64(len(sent)) {
		t.Fatalf("dropped %d frames, %d bytes; want 6, %d", fr, b, len(sent))
	}
	if h.s.BytesDown() != 0 {
		t.Fatalf("bytes down %d: dropped bytes counted as relayed", h.s.BytesDown())
	}
	h.stillOn(t, 50*time.Millisecond)
}

// TestHoldResume: a new client joins the parked session at a frame boundary
// of the provider's stream (the rest of a frame in flight toward the old
// client and what came while parked are dropped); its bytes and its
// pending bytes reach the provider as they are; the session parks and
// resumes again; Close ends it, OnEnd once.
func TestHoldResume(t *testing.T) {
	h := newHoldRelay(t, SessionOptions{Hold: true})
	cr := bufio.NewReader(h.client)
	// The provider starts a 1000-byte frame; the client gets its first
	// half, then drops.
	big := payloadOf(1000)
	bigFrame := mkFrame(true, 0x2, big, false, 0)
	h.provider.Write(bigFrame[:504])
	readRaw(t, h.client, cr, 504)
	h.client.Close()
	h.waitPark(t)
	// The rest of it and a frame while parked: dropped.
	while := mkFrame(true, 0x1, []byte("while parked"), false, 0)
	h.provider.Write(append(bigFrame[504:], while...))
	waitCond(t, 5*time.Second, "the frame in flight and the one while parked dropped", func() bool {
		fr, b := h.s.ParkedDropped()
		return fr == 2 && b == int64(len(bigFrame)-504+len(while))
	})

	pending := mkFrame(true, 0x1, []byte(`{"id":1}`), true, 0)
	c2 := h.resume(t, pending)
	if h.s.Parked() {
		t.Fatal("still parked after Resume")
	}
	c2r := bufio.NewReader(c2)
	fromC2 := mkFrame(true, 0x1, []byte(`{"id":2}`), true, 0)
	c2.Write(fromC2)
	want := append(append([]byte(nil), pending...), fromC2...)
	if got := readRaw(t, h.provider, h.pr, len(want)); !bytes.Equal(got, want) {
		t.Fatalf("provider got % x, want % x", got, want)
	}
	after := mkFrame(true, 0x1, []byte("after"), false, 0)
	h.provider.Write(after)
	if got := readRaw(t, c2, c2r, len(after)); !bytes.Equal(got, after) {
		t.Fatalf("new client got % x, want % x", got, after)
	}

	// Parked again, by a close frame this time, and resumed again.
	c2.Write(closeFrame(4000, "", true))
	h.waitPark(t)
	if got := readEnd(t, c2); !bytes.Equal(got, frameBytes(opClose, []byte{0x0f, 0xa0}, false)) {
		t.Fatalf("second client got % x", got)
	}
	if c := h.s.ClientCloseCode(); c != 4000 {
		t.Fatalf("close code %d", c)
	}
	c3 := h.resume(t, nil)
	c3.Write(fromC2)
	if got := readRaw(t, h.provider, h.pr, len(fromC2)); !bytes.Equal(got, fromC2) {
		t.Fatalf("provider got % x from the third client", got)
	}
	h.provider.Write(after)
	if got := readRaw(t, c3, bufio.NewReader(c3), len(after)); !bytes.Equal(got, after) {
		t.Fatalf("third client got % x", got)
	}
	// (A counter moves just after its write returns.)
	waitCond(t, 5*time.Second, "the byte counters over all three clients", func() bool {
		return h.s.BytesUp() == int64(len(pending)+2*len(fromC2)) && h.s.BytesDown() == int64(504+2*len(after))
	})
	if h.s.ClientEnded() {
		t.Fatal("a resumed session reports its client ended")
	}

	// Close ends it as any session: both sides get the close frame.
	h.s.Close(CloseNormal, EndOperator)
	fromClient := answerClose(c3, closeFrame(CloseNormal, "", true))
	fromProvider := answerClose(h.provider, closeFrame(CloseNormal, "", false))
	h.waitEnd(t)
	if cf := <-fromClient; len(cf) != 1 || !isClose(cf[0], CloseNormal, EndOperator) {
		t.Fatalf("client got %+v", cf)
	}
	if pf := <-fromProvider; len(pf) != 1 || !isClose(pf[0], CloseNormal, EndOperator) {
		t.Fatalf("provider got %+v", pf)
	}
	if len(h.parks) != 0 || h.s.Reason() != EndOperator || h.s.ClientEnded() {
		t.Fatalf("parks left %d, reason %q, client ended %v", len(h.parks), h.s.Reason(), h.s.ClientEnded())
	}
	if err := h.s.Resume(nil, nil); !errors.Is(err, ErrNotParked) {
		t.Fatalf("resume after the end: %v", err)
	}
}

// TestHoldResumeIntoStream: a client resets its connection while the
// provider streams frames (the relay's writes to it fail): the session
// parks, and a new client gets whole frames from a boundary on.
func TestHoldResumeIntoStream(t *testing.T) {
	h := newHoldRelay(t, SessionOptions{Hold: true})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// Frames of assorted sizes, some spanning many reads.
			n := []int{10, 3000, 70000, 125}[i%4]
			p := bytes.Repeat([]byte{byte(i)}, n)
			if _, err := h.provider.Write(mkFrame(true, 0x2, p, false, 0)); err != nil {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	defer func() {
		close(stop)
		h.provider.SetWriteDeadline(aLongTimeAgo)
		wg.Wait()
	}()
	readRaw(t, h.client, h.client, 50000)
	resetConn(h.client)
	h.waitPark(t)
	c := h.resume(t, nil)
	cr := bufio.NewReader(c)
	for i := 0; i < 20; i++ {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		f, err := readFrame(cr)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if f.op != 0x2 || f.masked || len(f.payload) == 0 || !bytes.Equal(f.payload, bytes.Repeat(f.payload[:1], len(f.payload))) {
			t.Fatalf("frame %d: not a whole frame from the provider (op %#x, %d bytes)", i, f.op, len(f.payload))
		}
		if n := len(f.payload); n != 10 && n != 3000 && n != 70000 && n != 125 {
			t.Fatalf("frame %d of %d bytes", i, n)
		}
	}
	fr, b := h.s.ParkedDropped()
	t.Logf("dropped while parked: %d frames, %d bytes", fr, b)
}

// TestHoldCloseWhileParked: Close on a parked session sends the provider a
// masked close frame with the code and reason, and the session ends once
// the provider answers, OnEnd once.
func TestHoldCloseWhileParked(t *testing.T) {
	h := newHoldRelay(t, SessionOptions{Hold: true})
	h.client.Write(closeFrame(4001, "brb", true))
	h.waitPark(t)
	start := time.Now()
	h.s.Close(h.s.ClientCloseCode(), "resume window over")
	f := h.providerFrame(t)
	if !f.masked || !isClose(f, 4001, "resume window over") {
		t.Fatalf("provider got %+v", f)
	}
	h.provider.Write(closeFrame(4001, "", false))
	h.waitEnd(t)
	if d := time.Since(start); d > CloseWait {
		t.Fatalf("took %v to end after the provider's answer", d)
	}
	if h.s.Reason() != "resume window over" || h.s.ClientEnded() {
		t.Fatalf("reason %q, client ended %v", h.s.Reason(), h.s.ClientEnded())
	}
	if err := h.s.Resume(nil, nil); !errors.Is(err, ErrNotParked) {
		t.Fatalf("resume after the end: %v", err)
	}
}

// TestHoldProviderEndsWhileParked: a provider that closes (its close frame
// answered with a masked one), hangs up or resets while parked ends the
// session, OnEnd once, with the provider's reason.
func TestHoldProviderEndsWhileParked(t *testing.T) {
	for _, how := range []string{"close frame", "FIN", "RST"} {
		t.Run(how, func(t *testing.T) {
			h := newHoldRelay(t, SessionOptions{Hold: true})
			h.client.Close()
			h.waitPark(t)
			want := EndProviderClosed
			switch how {
			case "close frame":
				h.provider.Write(closeFrame(1000, "bye", false))
				f := h.providerFrame(t)
				if !f.masked || !isClose(f, 1000, "") {
					t.Fatalf("provider got %+v, want a masked close 1000", f)
				}
				h.provider.Close()
			case "FIN":
				h.provider.Close()
			case "RST":
				resetConn(h.provider)
				want = EndProviderError
			}
			h.waitEnd(t)
			if h.s.Reason() != want || h.s.ClientEnded() {
				t.Fatalf("reason %q, client ended %v", h.s.Reason(), h.s.ClientEnded())
			}
			if err := h.s.Resume(nil, nil); !errors.Is(err, ErrNotParked) {
				t.Fatalf("resume after the end: %v", err)
			}
		})
	}
}

// TestHoldClientDropsMidFrame: a client that drops in the middle of one of
// its frames cannot be held: the session ends as without hold.
func TestHoldClientDropsMidFrame(t *testing.T) {
	h := newHoldRelay(t, SessionOptions{Hold: true})
	fr := mkFrame(true, 0x2, payloadOf(1000), true, 0)
	h.client.Write(fr[:600])
	readRaw(t, h.provider, h.pr, 600)
	h.client.Close()
	// The provider sees its side end; it hangs up too.
	h.provider.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := h.pr.ReadByte(); err != io.EOF {
		t.Fatalf("provider: %v, want EOF", err)
	}
	h.provider.Close()
	h.waitEnd(t)
	if len(h.parks) != 0 {
		t.Fatal("parked")
	}
	if h.s.Reason() != EndClientClosed || !h.s.ClientEnded() || h.s.ClientCloseCode() != CloseGoingAway {
		t.Fatalf("reason %q, client ended %v, code %d", h.s.Reason(), h.s.ClientEnded(), h.s.ClientCloseCode())
	}
}

// TestHoldResumeRaces: of two concurrent Resumes exactly one wins; a Resume
// racing Close or the provider's close frame either loses or wins a client
// that then gets a close frame; the session ends once.
func TestHoldResumeRaces(t *testing.T) {
	t.Run("two resumes", func(t *testing.T) {
		h := newHoldRelay(t, SessionOptions{Hold: true})
		winner := twoResumes(t, h, func(gw net.Conn) error { return h.s.Resume(gw, nil) })
		msg := mkFrame(true, 0x1, []byte("to the winner"), false, 0)
		h.provider.Write(msg)
		if got := readRaw(t, winner, winner, len(msg)); !bytes.Equal(got, msg) {
			t.Fatalf("winner got % x", got)
		}
	})
	for _, rival := range []string{"Close", "provider close"} {
		t.Run("resume and "+rival, func(t *testing.T) {
			resumeAgainstRival(t, rival, func(h *holdRelay) (func(net.Conn) error, func(int)) {
				return func(gw net.Conn) error { return h.s.Resume(gw, nil) }, nil
			}, func(i int, fs []frame) {
				// The client won: it gets a close frame (the rival's) and
				// its connection ends.
				if len(fs) == 0 || fs[len(fs)-1].op != opClose {
					t.Fatalf("round %d: the resumed client got %+v, no close frame", i, fs)
				}
			})
		})
	}
}

// twoResumes parks h's session and races two resumes of it: exactly one
// must win, the other get ErrNotParked. It returns the winner's client.
func twoResumes(t *testing.T, h *holdRelay, resume func(gw net.Conn) error) net.Conn {
	t.Helper()
	h.client.Close()
	h.waitPark(t)
	var clients, gws [2]net.Conn
	var errs [2]error
	for i := range clients {
		clients[i], gws[i] = tcpPair(t)
	}
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = resume(gws[i]) }()
	}
	wg.Wait()
	won := -1
	for i, err := range errs {
		switch {
		case err == nil && won >= 0:
			t.Fatal("both resumes won")
		case err == nil:
			won = i
		case !errors.Is(err, ErrNotParked):
			t.Fatalf("resume: %v", err)
		}
	}
	if won < 0 {
		t.Fatal("no resume won")
	}
	return clients[won]
}

// resumeAgainstRival runs 20 rounds, each on a fresh parked session, of a
// resume racing rival ("Close" or the provider's "provider close"); the
// provider hangs up at the close frame (answering it after Close). round
// gives the round's resume and what to check once its session has ended
// (nil: nothing); won checks the frames a client that won got before the
// gateway hung up. A resume that loses must get ErrNotParked.
func resumeAgainstRival(t *testing.T, rival string, round func(h *holdRelay) (resume func(gw net.Conn) error, ended func(i int)), won func(i int, fs []frame)) {
	t.Helper()
	wins := 0
	for i := 0; i < 20; i++ {
		h := newHoldRelay(t, SessionOptions{Hold: true})
		h.client.Close()
		h.waitPark(t)
		c, gw := tcpPair(t)
		provDone := h.hangUpAtClose(rival == "Close")
		resume, ended := round(h)
		var err error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); err = resume(gw) }()
		go func() {
			defer wg.Done()
			if rival == "Close" {
				h.s.Close(CloseGoingAway, EndShutdown)
			} else {
				h.provider.Write(closeFrame(CloseNormal, "done", false))
			}
		}()
		wg.Wait()
		if err == nil {
			won(i, answerAndHangUp(c, closeFrame(CloseNormal, "", true)))
			wins++
		} else if !errors.Is(err, ErrNotParked) {
			t.Fatalf("round %d: resume: %v", i, err)
		}
		h.waitEnd(t)
		<-provDone
		if ended != nil {
			ended(i)
		}
	}
	t.Logf("the resume won %d rounds of 20", wins)
}

// TestHoldKeepaliveDeadClient: with keepalive, a client that answers no
// ping parks the session (its code 1001); keepalive rests while parked (no
// ping to the provider); after a resume it pings the new client.
func TestHoldKeepaliveDeadClient(t *testing.T) {
	const iv = 100 * time.Millisecond
	h := newHoldRelay(t, SessionOptions{Hold: true, Keepalive: iv})
	newPeer(h.client, true, false) // reads, answers nothing
	// The provider answers pings; the test reads its frames here.
	var pings atomic.Int32
	provDone := make(chan struct{})
	go func() {
		defer close(provDone)
		for {
			f, err := readFrame(h.pr)
			if err != nil {
				return
			}
			if f.op == opPing {
				pings.Add(1)
				h.provider.Write(frameBytes(opPong, f.payload, false))
			}
		}
	}()
	select {
	case <-h.parks:
	case <-h.ends:
		t.Fatalf("ended (%s) instead of parking", h.s.Reason())
	case <-time.After(30*iv + 5*time.Second):
		t.Fatal("did not park")
	}
	if !h.s.ClientEnded() || h.s.ClientCloseCode() != CloseGoingAway {
		t.Fatalf("client ended %v, code %d", h.s.ClientEnded(), h.s.ClientCloseCode())
	}
	time.Sleep(iv) // a ping in flight at the park comes in
	before := pings.Load()
	h.stillOn(t, 8*iv)
	if n := pings.Load(); n != before {
		t.Fatalf("the provider got %d pings while parked", n-before)
	}
	c := h.resume(t, nil)
	p := newPeer(c, true, true)
	waitCond(t, 5*time.Second, "a ping to the new client", func() bool { return p.count(opPing) > 0 })
	waitCond(t, 5*time.Second, "pings to the provider again", func() bool { return pings.Load() > before })
	h.stillOn(t, 5*iv)
}

// TestHoldTimersWhileParked: a parked session waits for its client, which
// its lifecycle's idle timeout does not count as idle; its time limit
// (Close) closes the provider side.
func TestHoldTimersWhileParked(t *testing.T) {
	h := newHoldRelay(t, SessionOptions{Hold: true})
	if _, waiting := h.s.Activity(); waiting {
		t.Fatal("waiting for a client while it has one")
	}
	h.client.Close()
	h.waitPark(t)
	if _, waiting := h.s.Activity(); !waiting {
		t.Fatal("a parked session does not say it waits for its client")
	}
	fromProvider := answerClose(h.provider, closeFrame(CloseNormal, "", false))
	h.s.Close(CloseNormal, EndMaxDuration)
	h.waitEnd(t)
	if h.s.Reason() != EndMaxDuration {
		t.Fatalf("reason %q", h.s.Reason())
	}
	if pf := <-fromProvider; len(pf) != 1 || !pf[0].masked || !isClose(pf[0], CloseNormal, EndMaxDuration) {
		t.Fatalf("provider got %+v", pf)
	}
}

// TestClientEndedWithoutHold: without hold nothing parks, and ClientEnded
// and ClientCloseCode tell how the session ended.
func TestClientEndedWithoutHold(t *testing.T) {
	cases := []struct {
		name  string
		o     SessionOptions
		end   func(t *testing.T, h *holdRelay)
		ended bool
		code  int
	}{
		{"client close 4002", SessionOptions{}, func(t *testing.T, h *holdRelay) {
			h.client.Write(closeFrame(4002, "done", true))
			if f := h.providerFrame(t); !isClose(f, 4002, "done") {
				t.Fatalf("provider got %+v", f)
			}
			h.provider.Write(closeFrame(4002, "", false))
			h.provider.Close()
		}, true, 4002},
		{"client close without code", SessionOptions{}, func(t *testing.T, h *holdRelay) {
			h.client.Write(frameBytes(opClose, nil, true))
			h.providerFrame(t)
			h.provider.Close()
		}, true, 1000},
		{"client FIN", SessionOptions{}, func(t *testing.T, h *holdRelay) {
			h.client.Close()
			h.provider.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := h.pr.ReadByte(); err != io.EOF {
				t.Fatalf("provider: %v, want EOF", err)
			}
			h.provider.Close()
		}, true, 1001},
		{"client RST", SessionOptions{}, func(t *testing.T, h *holdRelay) { resetConn(h.client) }, true, 1001},
		{"provider close", SessionOptions{}, func(t *testing.T, h *holdRelay) {
			h.provider.Write(closeFrame(1000, "", false))
			if f, _ := readFrame(bufio.NewReader(h.client)); f.op != opClose {
				t.Fatalf("client got %+v", f)
			}
			h.client.Write(closeFrame(1000, "", true))
			h.client.Close()
			h.provider.Close()
		}, false, 1000},
		{"provider RST", SessionOptions{}, func(t *testing.T, h *holdRelay) { resetConn(h.provider) }, false, 1001},
		{"gateway close", SessionOptions{}, func(t *testing.T, h *holdRelay) {
			h.s.Close(CloseGoingAway, EndShutdown)
			answerClose(h.client, closeFrame(CloseGoingAway, "", true))
			answerClose(h.provider, closeFrame(CloseGoingAway, "", false))
		}, false, 1001},
		{"keepalive dead client", SessionOptions{Keepalive: 50 * time.Millisecond}, func(t *testing.T, h *holdRelay) {
			newPeer(h.client, true, false)
			newPeer(h.provider, false, true)
		}, true, 1001},
		{"keepalive dead provider", SessionOptions{Keepalive: 50 * time.Millisecond}, func(t *testing.T, h *holdRelay) {
			newPeer(h.client, true, true)
			newPeer(h.provider, false, false)
		}, false, 1001},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHoldRelay(t, tc.o)
			tc.end(t, h)
			select {
			case <-h.ends:
			case <-time.After(10 * time.Second):
				t.Fatal("the session did not end")
			}
			if len(h.parks) != 0 || h.s.Parked() {
				t.Fatal("parked without hold")
			}
			if h.s.ClientEnded() != tc.ended || h.s.ClientCloseCode() != tc.code {
				t.Fatalf("reason %q: client ended %v, code %d; want %v, %d",
					h.s.Reason(), h.s.ClientEnded(), h.s.ClientCloseCode(), tc.ended, tc.code)
			}
			if err := h.s.Resume(nil, nil); !errors.Is(err, ErrNotParked) {
				t.Fatalf("resume without hold: %v", err)
			}
		})
	}
}

// TestTrackerMessagesAndCloseCode: the frame tracker tells a message
// boundary from a frame boundary (control frames may come between the
// frames of a message), and reads a close frame's code, masked or not,
// whatever the reads' cuts.
func TestTrackerMessagesAndCloseCode(t *testing.T) {
	type step struct {
		frame      []byte
		atMessage  bool
		closeCode  int
		checkClose bool
	}
	steps := []step{
		{frame: mkFrame(false, 0x1, []byte("part1"), true, 0)},
		{frame: mkFrame(true, opPing, []byte("x"), true, 0)},
		{frame: mkFrame(false, 0x0, payloadOf(300), true, 0)},
		{frame: mkFrame(true, opPong, nil, true, 0)},
		{frame: mkFrame(true, 0x0, []byte("end"), true, 0), atMessage: true},
		{frame: mkFrame(true, 0x2, payloadOf(70000), false, 0), atMessage: true},
		{frame: mkFrame(true, opClose, append(binary.BigEndian.AppendUint16(nil, 4321), "why"...), true, 0), atMessage: true, closeCode: 4321, checkClose: true},
		{frame: mkFrame(true, opClose, binary.BigEndian.AppendUint16(nil, 1001), false, 0), atMessage: true, closeCode: 1001, checkClose: true},
		{frame: mkFrame(true, opClose, nil, true, 0), atMessage: true, closeCode: closeNoStatus, checkClose: true},
		{frame: mkFrame(true, opClose, []byte{3}, true, 0), atMessage: true, closeCode: closeNoStatus, checkClose: true},
	}
	for _, cut := range []int{1, 2, 3, 7, 1 << 20} {
		var tr frameTracker
		for i, st := range steps {
			f := st.frame
			for off := 0; off < len(f); off += cut {
				tr.advance(f[off:min(off+cut, len(f))], false)
			}
			if !tr.atBoundary() || tr.atMessageBoundary() != st.atMessage {
				t.Fatalf("cut %d, frame %d: at boundary %v, at message boundary %v", cut, i, tr.atBoundary(), tr.atMessageBoundary())
			}
			if st.checkClose && tr.closeCode() != st.closeCode {
				t.Fatalf("cut %d, frame %d: close code %d, want %d", cut, i, tr.closeCode(), st.closeCode)
			}
		}
	}
}

// TestHoldFragmentedMessages: a new client joins between two messages of
// the provider, never inside a fragmented one; a client that leaves
// between the frames of its own fragmented message is not held.
func TestHoldFragmentedMessages(t *testing.T) {
	t.Run("provider mid-message", func(t *testing.T) {
		h := newHoldRelay(t, SessionOptions{Hold: true})
		part1 := mkFrame(false, 0x1, []byte("part1"), false, 0)
		h.provider.Write(part1)
		readRaw(t, h.client, h.client, len(part1))
		h.client.Close()
		h.waitPark(t)
		part2 := mkFrame(false, 0x0, []byte("part2"), false, 0)
		ping := mkFrame(true, opPing, []byte("p"), false, 0)
		h.provider.Write(append(part2, ping...))
		if f := h.providerFrame(t); f.op != opPong {
			t.Fatalf("provider got %+v", f)
		}
		c := h.resume(t, nil)
		part3 := mkFrame(true, 0x0, []byte("part3"), false, 0)
		next := mkFrame(true, 0x1, []byte("next"), false, 0)
		h.provider.Write(append(part3, next...))
		if got := readRaw(t, c, c, len(next)); !bytes.Equal(got, next) {
			t.Fatalf("new client got % x, want the next message % x", got, next)
		}
		if fr, _ := h.s.ParkedDropped(); fr != 3 {
			t.Fatalf("dropped %d frames, want 3", fr)
		}
	})
	for _, how := range []string{"drop", "close frame"} {
		t.Run("client mid-message, "+how, func(t *testing.T) {
			h := newHoldRelay(t, SessionOptions{Hold: true})
			first := mkFrame(false, 0x1, []byte("first"), true, 0)
			h.client.Write(first)
			readRaw(t, h.provider, h.pr, len(first))
			want := EndClientClosed
			if how == "drop" {
				h.client.Close()
				h.provider.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := h.pr.ReadByte(); err != io.EOF {
					t.Fatalf("provider: %v, want EOF", err)
				}
			} else {
				h.client.Write(closeFrame(1000, "", true))
				if f := h.providerFrame(t); !isClose(f, 1000, "") {
					t.Fatalf("provider got %+v, want the client's close", f)
				}
				h.client.Close()
			}
			h.provider.Close()
			h.waitEnd(t)
			if len(h.parks) != 0 || h.s.Reason() != want || !h.s.ClientEnded() {
				t.Fatalf("parks %d, reason %q, client ended %v", len(h.parks), h.s.Reason(), h.s.ClientEnded())
			}
		})
	}
}

// BenchmarkRelayHold: what hold costs the relay (the client's stream
// watched for close frames, the provider's stream toward the client not
// spliced). Compare the sub-benchmarks of one run:
//
//	go test -run '^$' -bench RelayHold -count 5 ./upstreams/
func BenchmarkRelayHold(b *testing.B) {
	for _, size := range []int{256, 64 << 10, 1 << 20} {
		for _, hold := range []bool{false, true} {
			name := map[bool]string{false: "off", true: "on"}[hold]
			b.Run(name+"/"+sizeName(size), func(b *testing.B) {
				benchRelayWith(b, size, SessionOptions{Hold: hold})
			})
		}
	}
}

// hangUpAtClose plays the provider of a resume race: it reads frames until
// a close frame, answers it when answer is set (the gateway's Close) or
// takes it as the answer to its own, then hangs up. The channel closes
// when it is done.
func (h *holdRelay) hangUpAtClose(answer bool) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			f, err := readFrame(h.pr)
			if err != nil {
				return
			}
			if f.op == opClose {
				if answer {
					h.provider.Write(closeFrame(CloseNormal, "", false))
				}
				h.provider.Close()
				return
			}
		}
	}()
	return done
}
