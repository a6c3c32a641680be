package upstreams

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	a, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b = <-ch
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// relayFixture is a session between a fake client and a fake provider, both
// on plain TCP (so the relay may splice).
type relayFixture struct {
	s        *Session
	client   net.Conn // the client's end
	provider net.Conn // the provider's end
	ended    chan *Session
}

func newRelay(t *testing.T, o SessionOptions) *relayFixture {
	t.Helper()
	client, gwClient := tcpPair(t)
	gwUp, provider := tcpPair(t)
	f := &relayFixture{client: client, provider: provider, ended: make(chan *Session, 1)}
	o.OnEnd = func(s *Session) { f.ended <- s }
	f.s = NewSession(gwClient, &Conn{Conn: gwUp}, o)
	f.s.Run()
	return f
}

func (f *relayFixture) waitEnd(t *testing.T, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-f.ended:
		return time.Since(start)
	case <-time.After(within):
		t.Fatalf("the session did not end within %v", within)
		return 0
	}
}

type frame struct {
	op      byte
	fin     bool
	masked  bool
	payload []byte
}

// readFrame reads one frame, unmasking its payload.
func readFrame(br *bufio.Reader) (frame, error) {
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return frame{}, err
	}
	f := frame{op: h[0] & 0xf, fin: h[0]&0x80 != 0, masked: h[1]&0x80 != 0}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return f, err
		}
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return f, err
		}
		n = binary.BigEndian.Uint64(b[:])
	}
	var key [4]byte
	if f.masked {
		if _, err := io.ReadFull(br, key[:]); err != nil {
			return f, err
		}
	}
	f.payload = make([]byte, n)
	if _, err := io.ReadFull(br, f.payload); err != nil {
		return f, err
	}
	for i := range f.payload {
		f.payload[i] ^= key[i&3]
	}
	return f, nil
}

// readFrames reads frames until the connection ends.
func readFrames(r io.Reader) []frame {
	br := bufio.NewReader(r)
	var out []frame
	for {
		f, err := readFrame(br)
		if err != nil {
			return out
		}
		out = append(out, f)
	}
}

// answerClose reads frames from c until a close frame, answers it with
// reply, then reads on until c ends; it returns every frame read.
func answerClose(c net.Conn, reply []byte) chan []frame {
	ch := make(chan []frame, 1)
	go func() {
		br := bufio.NewReader(c)
		out, closed := readToClose(br, c, reply)
		if closed {
			out = append(out, readFrames(br)...)
		}
		ch <- out
	}()
	return ch
}

// readToClose reads frames from br until a close frame, which it answers
// on c with reply; closed tells whether one came before br ended.
func readToClose(br *bufio.Reader, c net.Conn, reply []byte) (out []frame, closed bool) {
	for {
		f, err := readFrame(br)
		if err != nil {
			return out, false
		}
		out = append(out, f)
		if f.op == opClose {
			c.Write(reply)
			return out, true
		}
	}
}

func isClose(f frame, code int, reason string) bool {
	return f.op == opClose && len(f.payload) >= 2 &&
		int(binary.BigEndian.Uint16(f.payload)) == code && string(f.payload[2:]) == reason
}

// TestSessionCloseRepliesEndItAtOnce: idle both ways, Close sends each side
// a close frame (masked only toward the provider); once both answer, the
// session ends without waiting out CloseWait.
func TestSessionCloseRepliesEndItAtOnce(t *testing.T) {
	f := newRelay(t, SessionOptions{})
	time.Sleep(20 * time.Millisecond)
	f.s.Close(CloseGoingAway, EndShutdown)
	fromClient := answerClose(f.client, closeFrame(CloseGoingAway, "", true))
	fromProvider := answerClose(f.provider, closeFrame(CloseGoingAway, "", false))
	if d := f.waitEnd(t, 3*time.Second); d > CloseWait/2 {
		t.Fatalf("the session took %v to end after both replies", d)
	}
	cf, pf := <-fromClient, <-fromProvider
	if len(cf) != 1 || cf[0].masked || !isClose(cf[0], CloseGoingAway, EndShutdown) {
		t.Fatalf("client got %+v", cf)
	}
	if len(pf) != 1 || !pf[0].masked || !isClose(pf[0], CloseGoingAway, EndShutdown) {
		t.Fatalf("provider got %+v", pf)
	}
	if f.s.Reason() != EndShutdown {
		t.Fatalf("reason %q", f.s.Reason())
	}
}

// lateConn is a connection whose reads learn of an interrupt (a read
// deadline in the past) only after one more read has returned bytes: what
// the runtime does when the bytes and the interrupt arrive together.
type lateConn struct {
	net.Conn
	mu      sync.Mutex
	pending *time.Time
}

func (c *lateConn) SetReadDeadline(t time.Time) error {
	if !t.IsZero() && t.Before(time.Now()) {
		c.mu.Lock()
		c.pending = &t
		c.mu.Unlock()
		return nil
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *lateConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	if t := c.pending; t != nil && n > 0 {
		c.pending = nil
		c.Conn.SetReadDeadline(*t)
	}
	c.mu.Unlock()
	return n, err
}

// TestSessionCloseReplyReadLate: the client's answer to the gateway's
// close frame comes back in the read its interrupt woke; the provider
// still gets the gateway's close frame, and only that one.
func TestSessionCloseReplyReadLate(t *testing.T) {
	client, gwClient := tcpPair(t)
	gwUp, provider := tcpPair(t)
	ended := make(chan *Session, 1)
	s := NewSession(&lateConn{Conn: gwClient}, &Conn{Conn: gwUp}, SessionOptions{OnEnd: func(s *Session) { ended <- s }})
	s.Run()
	time.Sleep(20 * time.Millisecond)
	s.Close(CloseGoingAway, EndShutdown)
	fromClient := answerClose(client, closeFrame(CloseGoingAway, "", true))
	fromProvider := answerClose(provider, closeFrame(CloseGoingAway, "", false))
	select {
	case <-ended:
	case <-time.After(3 * time.Second):
		t.Fatal("the session did not end")
	}
	cf, pf := <-fromClient, <-fromProvider
	if len(cf) != 1 || !isClose(cf[0], CloseGoingAway, EndShutdown) {
		t.Fatalf("client got %+v", cf)
	}
	if len(pf) != 1 || !pf[0].masked || !isClose(pf[0], CloseGoingAway, EndShutdown) {
		t.Fatalf("provider got %+v, want the gateway's close frame alone", pf)
	}
}

// TestSessionCloseCutsStalledFrame: a frame that stops moving after Close
// is cut CloseWait later, not held until CloseFrameLimit.
func TestSessionCloseCutsStalledFrame(t *testing.T) {
	start := time.Now()
	f := newRelay(t, SessionOptions{})
	// The session's time limit (its lifecycle's) closes it.
	time.AfterFunc(100*time.Millisecond, func() { f.s.Close(CloseNormal, EndMaxDuration) })
	// The provider starts a 1 MiB frame and stalls after 100 KiB.
	hdr := []byte{0x82, 127}
	hdr = binary.BigEndian.AppendUint64(hdr, 1<<20)
	f.provider.Write(append(hdr, make([]byte, 100<<10)...))
	got := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(io.Discard, f.client)
		got <- n
	}()
	go io.Copy(io.Discard, f.provider)
	f.waitEnd(t, CloseFrameLimit)
	if d := time.Since(start); d < 100*time.Millisecond+CloseWait || d > 100*time.Millisecond+2*CloseWait+5*time.Second {
		t.Fatalf("ended after %v, want about 100ms + CloseWait (or two)", d)
	}
	if n := <-got; n != int64(len(hdr)+100<<10) {
		t.Fatalf("client got %d bytes, want the %d sent and no close frame", n, len(hdr)+100<<10)
	}
	if f.s.Reason() != EndMaxDuration {
		t.Fatalf("reason %q", f.s.Reason())
	}
}

// TestSessionCloseWaitsForMovingFrame: a long frame that keeps moving after
// Close is delivered whole (over more than 2*CloseWait, spliced and read),
// then the close frame follows it.
func TestSessionCloseWaitsForMovingFrame(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 3s")
	}
	const size = 8 << 20
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i*7 + i>>12)
	}
	f := newRelay(t, SessionOptions{})
	time.AfterFunc(100*time.Millisecond, func() { f.s.Close(CloseNormal, EndMaxDuration) })
	// The provider answers the gateway's close once its own frame is out.
	fromProvider := make(chan []frame, 1)
	go func() {
		got := make(chan []frame, 1)
		go func() { got <- readFrames(f.provider) }()
		f.provider.Write(binary.BigEndian.AppendUint64([]byte{0x82, 127}, size))
		for off := 0; off < size; off += 256 << 10 {
			f.provider.Write(payload[off : off+256<<10])
			time.Sleep(90 * time.Millisecond)
		}
		f.provider.Write(closeFrame(CloseNormal, "", false))
		fromProvider <- <-got
	}()
	fromClient := answerClose(f.client, closeFrame(CloseNormal, "", true))
	start := time.Now()
	f.waitEnd(t, CloseFrameLimit+3*CloseWait)
	if d := time.Since(start); d < 2500*time.Millisecond {
		t.Fatalf("ended after %v: the frame cannot have been delivered", d)
	}
	cf := <-fromClient
	if len(cf) != 2 || !bytes.Equal(cf[0].payload, payload) || !isClose(cf[1], CloseNormal, EndMaxDuration) {
		t.Fatalf("client got %d frames", len(cf))
	}
	if pf := <-fromProvider; len(pf) != 1 || !pf[0].masked || !isClose(pf[0], CloseNormal, EndMaxDuration) {
		t.Fatalf("provider got %+v", pf)
	}
}

// TestSessionEndReasonIsCloseInitiator: the side whose close frame came
// first ended the session, whichever side hangs up TCP first.
func TestSessionEndReasonIsCloseInitiator(t *testing.T) {
	for _, clientFirst := range []bool{true, false} {
		f := newRelay(t, SessionOptions{})
		init, peer := f.client, f.provider
		initClose, peerClose := closeFrame(CloseNormal, "bye", true), closeFrame(CloseNormal, "bye", false)
		want := EndClientClosed
		if !clientFirst {
			init, peer = peer, init
			initClose, peerClose = peerClose, initClose
			want = EndProviderClosed
		}
		init.Write(initClose)
		// The peer answers and hangs up at once; the initiator is slower.
		br := bufio.NewReader(peer)
		if fr, err := readFrame(br); err != nil || !isClose(fr, CloseNormal, "bye") {
			t.Fatalf("peer got %+v %v", fr, err)
		}
		peer.Write(peerClose)
		peer.Close()
		if fr, err := readFrame(bufio.NewReader(init)); err != nil || fr.op != opClose {
			t.Fatalf("initiator got %+v %v", fr, err)
		}
		time.Sleep(50 * time.Millisecond)
		init.Close()
		f.waitEnd(t, 3*time.Second)
		if f.s.Reason() != want {
			t.Fatalf("client first %v: reason %q, want %q", clientFirst, f.s.Reason(), want)
		}
	}
}

// TestSessionClientSocketClosedBeforeRun: when the gateway's own client
// socket is closed before the relay starts (its handshake answer could not
// be written), the session still ends at once although the provider stays
// silent, and the provider's connection is closed.
func TestSessionClientSocketClosedBeforeRun(t *testing.T) {
	client, gwClient := tcpPair(t)
	_ = client
	gwUp, provider := tcpPair(t)
	ended := make(chan struct{})
	s := NewSession(gwClient, &Conn{Conn: gwUp}, SessionOptions{OnEnd: func(*Session) { close(ended) }})
	gwClient.Close()
	s.Run()
	select {
	case <-ended:
	case <-time.After(3 * time.Second):
		t.Fatal("the session never ended: its slot would leak")
	}
	provider.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := provider.Read(make([]byte, 1)); err == nil {
		t.Fatal("the provider's connection is still open")
	}
}

// TestSessionEndReasonIsFirstToHangUp: a client that hangs up its TCP
// connection without a close frame ended the session, even when the
// provider hangs up the moment the gateway half-closes toward it (each
// round is a race the relay must not lose).
func TestSessionEndReasonIsFirstToHangUp(t *testing.T) {
	for i := 0; i < 50; i++ {
		f := newRelay(t, SessionOptions{})
		go func() {
			io.Copy(io.Discard, f.provider)
			f.provider.Close()
		}()
		f.client.Close()
		f.waitEnd(t, 3*time.Second)
		if r := f.s.Reason(); r != EndClientClosed {
			t.Fatalf("round %d: reason %q, want %q", i, r, EndClientClosed)
		}
	}
}

// TestSessionDone: Done asked before the end is closed by it (after
// OnEnd); Done asked after the end is closed already; a session nobody
// asked holds no channel.
func TestSessionDone(t *testing.T) {
	f := newRelay(t, SessionOptions{})
	before := f.s.Done()
	select {
	case <-before:
		t.Fatal("Done closed while the session is live")
	default:
	}
	f.client.Close()
	f.waitEnd(t, 3*time.Second)
	select {
	case <-before:
	case <-time.After(3 * time.Second):
		t.Fatal("Done asked before the end was not closed by it")
	}

	g := newRelay(t, SessionOptions{})
	g.client.Close()
	g.waitEnd(t, 3*time.Second)
	select {
	case <-g.s.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("Done asked after the end is not closed")
	}
	h := newRelay(t, SessionOptions{})
	if h.s.done != nil { // only Done writes it
		t.Fatal("a live session nobody waits on holds a done channel")
	}
	h.client.Close()
	h.waitEnd(t, 3*time.Second)
}
