package upstreams

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// wf is a frame as the tests write and expect it (payload unmasked);
// form forces a length form as mkFrame does (0: the shortest).
type wf struct {
	fin     bool
	op      byte
	payload string
	form    int
}

// wire is the client's stream of frames, masked.
func wire(fs []wf) []byte {
	var b []byte
	for _, f := range fs {
		b = append(b, mkFrame(f.fin, f.op, []byte(f.payload), true, f.form)...)
	}
	return b
}

// sp is n spaces: the filler of a text frame.
func sp(n int) string { return strings.Repeat(" ", n) }

// command is a BiDi command of exactly n bytes (n >= 64).
func command(n int) string {
	head := `{"id":5,"method":"script.evaluate","params":{"expression":"`
	return head + strings.Repeat("x", n-len(head)-3) + `"}}`
}

// cutRow is a client stream cut short: the frames the client meant to
// send, the first frame it did not send whole and how many of that
// frame's bytes it sent, and the frames the provider must get before the
// gateway's session.end.
type cutRow struct {
	name        string
	frames      []wf
	frame, upTo int
	want        []wf
}

// sent is the part of the stream the client sends.
func (r cutRow) sent() []byte {
	b := wire(r.frames[:r.frame])
	if r.frame < len(r.frames) {
		b = append(b, wire(r.frames[r.frame : r.frame+1])[:r.upTo]...)
	}
	return b
}

var (
	frag     = `{"id":3,"method":"browsingContext.nav`
	fragRest = `igate","params":{"context":"c","url":"about:blank"}}`
	euros    = "ab" + strings.Repeat("€", 40)
	mixed    = strings.Repeat("é€𐀀x", 7000) // 70000 bytes
)

var cutRows = []cutRow{
	// Inside a payload: the rest of the frame is spaces, masked with the
	// client's key (cut at offsets that are no multiple of 4, and past
	// the gateway's 32 KiB buffer).
	{"payload", []wf{{true, 1, command(100), 0}}, 0, 6 + 37, []wf{{true, 1, command(100)[:37] + sp(63), 0}}},
	{"16-bit payload", []wf{{true, 1, command(1000), 0}}, 0, 8 + 601, []wf{{true, 1, command(1000)[:601] + sp(399), 0}}},
	{"64-bit payload", []wf{{true, 1, command(70000), 0}}, 0, 14 + 50001, []wf{{true, 1, command(70000)[:50001] + sp(19999), 0}}},
	{"binary", []wf{{true, 2, "\xff\xfe\xfd\xfc\xfb", 0}}, 0, 6 + 2, []wf{{true, 2, "\xff\xfe" + sp(3), 0}}},
	// Inside a character: it is completed with the smallest valid
	// continuation bytes first.
	{"character 1 of 3", []wf{{true, 1, euros, 0}}, 0, 6 + 3, []wf{{true, 1, "ab\xe2\x80\x80" + sp(len(euros)-5), 0}}},
	{"character 2 of 3", []wf{{true, 1, euros, 0}}, 0, 6 + 4, []wf{{true, 1, "ab\xe2\x82\x80" + sp(len(euros)-5), 0}}},
	{"character after e0", []wf{{true, 1, "ab" + strings.Repeat("\xe0\xa0\x80", 10), 0}}, 0, 6 + 3, []wf{{true, 1, "ab\xe0\xa0\x80" + sp(27), 0}}},
	{"character after ed", []wf{{true, 1, "ab" + strings.Repeat("\xed\x9f\xbf", 10), 0}}, 0, 6 + 3, []wf{{true, 1, "ab\xed\x80\x80" + sp(27), 0}}},
	{"character after f0", []wf{{true, 1, "ab" + strings.Repeat("\xf0\x90\x80\x80", 10), 0}}, 0, 6 + 3, []wf{{true, 1, "ab\xf0\x90\x80\x80" + sp(36), 0}}},
	{"character 3 of 4", []wf{{true, 1, "ab" + strings.Repeat("\U0010ffff", 10), 0}}, 0, 6 + 5, []wf{{true, 1, "ab\xf4\x8f\xbf\x80" + sp(36), 0}}},
	{"character deep in a long frame", []wf{{true, 1, mixed, 0}}, 0, 14 + 50003, []wf{{true, 1, mixed[:50003] + "\x80\x80" + sp(70000-50005), 0}}},
	// Inside the header: the shortest length its bytes allow.
	{"header, its first byte", []wf{{true, 1, command(100), 0}}, 0, 1, []wf{{true, 1, "", 0}}},
	{"header, 7-bit length", []wf{{true, 1, command(100), 0}}, 0, 2, []wf{{true, 1, sp(100), 0}}},
	{"header, in the mask key", []wf{{true, 1, command(100), 0}}, 0, 4, []wf{{true, 1, sp(100), 0}}},
	{"header, 16-bit length unknown", []wf{{true, 1, command(768), 0}}, 0, 2, []wf{{true, 1, sp(126), 0}}},
	{"header, half a 16-bit length", []wf{{true, 1, command(768), 0}}, 0, 3, []wf{{true, 1, sp(768), 0}}},
	{"header, 64-bit length unknown", []wf{{true, 1, command(70000), 0}}, 0, 2, []wf{{true, 1, sp(65536), 0}}},
	{"header, 5 of 8 length bytes", []wf{{true, 1, command(70000), 0}}, 0, 7, []wf{{true, 1, sp(65536), 0}}},
	{"header, 7 of 8 length bytes", []wf{{true, 1, command(70000), 0}}, 0, 9, []wf{{true, 1, sp(0x011100), 0}}},
	{"header, in a 64-bit frame's key", []wf{{true, 1, command(70000), 0}}, 0, 12, []wf{{true, 1, sp(70000), 0}}},
	// Control frames (a ping, a pong with keepalive off) are completed
	// the same way.
	{"ping", []wf{{true, opPing, "0123456789abcdefghij", 0}}, 0, 6 + 5, []wf{{true, opPing, "01234" + sp(15), 0}}},
	{"pong", []wf{{true, opPong, "0123456789", 0}}, 0, 6 + 9, []wf{{true, opPong, "012345678 ", 0}}},
	// A fragmented message ends with a last continuation frame.
	{"between two frames of a message", []wf{{false, 1, frag, 0}}, 1, 0, []wf{{false, 1, frag, 0}, {true, 0, "", 0}}},
	{"in a middle frame", []wf{{false, 1, frag, 0}, {false, 0, fragRest, 0}}, 1, 6 + 10,
		[]wf{{false, 1, frag, 0}, {false, 0, fragRest[:10] + sp(len(fragRest)-10), 0}, {true, 0, "", 0}}},
	{"in the last frame", []wf{{false, 1, frag, 0}, {true, 0, fragRest, 0}}, 1, 6 + 3,
		[]wf{{false, 1, frag, 0}, {true, 0, fragRest[:3] + sp(len(fragRest)-3), 0}}},
	{"in the header of the last frame", []wf{{false, 1, frag, 0}, {true, 0, fragRest, 0}}, 1, 1,
		[]wf{{false, 1, frag, 0}, {true, 0, "", 0}}},
	{"a character across frames", []wf{{false, 1, "ab\xe2\x82", 0}}, 1, 0,
		[]wf{{false, 1, "ab\xe2\x82", 0}, {true, 0, "\x80", 0}}},
	{"a character longer than the frame it is cut in", []wf{{false, 1, "ab\xf0", 0}, {false, 0, "\x9f", 0}}, 1, 6,
		[]wf{{false, 1, "ab\xf0", 0}, {false, 0, "\x90", 0}, {true, 0, "\x80\x80", 0}}},
	{"a ping between two frames", []wf{{false, 1, frag, 0}, {true, opPing, "pingpayload", 0}}, 1, 6 + 3,
		[]wf{{false, 1, frag, 0}, {true, opPing, "pin" + sp(8), 0}, {true, 0, "", 0}}},
}

// wantFrames reads the frames the provider gets next and checks them
// against want: masked, as want (payloads unmasked), and each text message
// valid UTF-8.
func (h *holdRelay) wantFrames(t *testing.T, want []wf) {
	t.Helper()
	var text []byte
	inText := false
	for i, w := range want {
		f := h.providerFrame(t)
		if !f.masked || f.fin != w.fin || f.op != w.op || string(f.payload) != w.payload {
			t.Fatalf("provider frame %d: fin %v opcode %#x masked %v %q; want fin %v opcode %#x %q",
				i, f.fin, f.op, f.masked, trimmed(f.payload), w.fin, w.op, trimmed([]byte(w.payload)))
		}
		if f.op == 0x1 || f.op == 0x0 && inText {
			text = append(text, f.payload...)
			inText = !f.fin
			if f.fin && !utf8.Valid(text) {
				t.Fatalf("provider got a text message that is not UTF-8: %q", trimmed(text))
			}
		}
	}
}

// trimmed shortens b for a message.
func trimmed(b []byte) string {
	if len(b) > 80 {
		return fmt.Sprintf("%q…(%d bytes)", b[:80], len(b))
	}
	return fmt.Sprintf("%q", b)
}

// TestFarewellClientCutsMessage: a client that leaves in the middle of one
// of its messages (its connection ending, FIN or RST, inside a frame's
// header or payload, inside a character, between the frames of a
// fragmented message) has the gateway complete that message for the
// provider, as valid text; then the provider gets session.end and, once it
// has answered it, the close.
func TestFarewellClientCutsMessage(t *testing.T) {
	for _, r := range cutRows {
		for _, rst := range []bool{false, true} {
			end := "FIN"
			if rst {
				end = "RST"
			}
			t.Run(r.name+"/"+end, func(t *testing.T) { r.run(t, rst) })
		}
	}
}

// run has the client send r's stream, then end its connection (with an
// RST when rst is set).
func (r cutRow) run(t *testing.T, rst bool) {
	h := newFarewellRelay(t, 0, SessionOptions{})
	sent := r.sent()
	h.client.Write(sent)
	// Everything the client sent reached the provider before its
	// connection ends (an RST may drop what the gateway has not
	// read yet).
	got := readRaw(t, h.provider, h.pr, len(sent))
	h.pr = bufio.NewReader(io.MultiReader(bytes.NewReader(got), h.pr))
	reason := EndClientClosed
	if rst {
		resetConn(h.client)
		reason = EndClientError
	} else {
		h.client.Close()
	}
	h.wantFrames(t, r.want)
	reply := h.wantFarewell(t)
	h.provider.Write(frameBytes(0x1, reply, false))
	h.wantClosed(t, CloseGoingAway, reason)
}

// TestFarewellClientCutsControlFrame: a control frame the relay holds back
// until it is whole (a close frame; a pong with keepalive on) never
// reached the provider: a client that leaves inside it has the provider
// get no part of it, only the end of a message the client had begun, then
// session.end.
func TestFarewellClientCutsControlFrame(t *testing.T) {
	for _, tc := range []struct {
		name      string
		keepalive time.Duration
		before    []wf
		held      []byte
	}{
		{"close frame", 0, nil, closeFrame(4001, "bye", true)[:5]},
		{"close frame in a message", 0, []wf{{false, 1, frag, 0}}, closeFrame(4001, "bye", true)[:7]},
		{"pong with keepalive", time.Hour, nil, frameBytes(opPong, []byte("pong"), true)[:4]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newFarewellRelay(t, 0, SessionOptions{Keepalive: tc.keepalive})
			h.client.Write(append(wire(tc.before), tc.held...))
			want := tc.before
			if len(want) > 0 {
				want = append(want, wf{true, 0, "", 0})
				h.wantFrames(t, tc.before)
			}
			h.client.Close()
			h.wantFrames(t, want[len(tc.before):])
			reply := h.wantFarewell(t)
			h.provider.Write(frameBytes(0x1, reply, false))
			h.wantClosed(t, CloseGoingAway, EndClientClosed)
		})
	}
}

// TestFarewellCloseInMessage: a client's close frame between two frames
// of its fragmented message is not relayed: the provider gets the end of
// the message (the rest of a character in it too), session.end, then the
// client's close code.
func TestFarewellCloseInMessage(t *testing.T) {
	h := newFarewellRelay(t, 0, SessionOptions{})
	h.client.Write(append(wire([]wf{{false, 1, "ab\xe2", 0}}), closeFrame(4001, "", true)...))
	h.wantFrames(t, []wf{{false, 1, "ab\xe2", 0}, {true, 0, "\x80\x80", 0}})
	reply := h.wantFarewell(t)
	if got, want := readEnd(t, h.client), frameBytes(opClose, []byte{0x0f, 0xa1}, false); !bytes.Equal(got, want) {
		t.Fatalf("client got % x, want its close echoed, then the end", got)
	}
	h.provider.Write(frameBytes(0x1, reply, false))
	h.wantClosed(t, 4001, EndClientClosed)
}

// TestFarewellClientCutsHugeFrame: a frame that still owes more than
// fillMax bytes is not completed: the provider gets nothing more, and the
// session ends as without a farewell.
func TestFarewellClientCutsHugeFrame(t *testing.T) {
	h := newFarewellRelay(t, 0, SessionOptions{})
	hdr := binary.BigEndian.AppendUint64([]byte{0x81, 0x80 | 127}, fillMax+2000)
	sent := append(append(hdr, 1, 2, 3, 4), payloadOf(1000)...)
	h.client.Write(sent)
	readRaw(t, h.provider, h.pr, len(sent))
	h.client.Close()
	h.provider.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := h.pr.ReadByte(); err == nil {
		t.Fatalf("provider got a byte (%#x) after the client's partial frame, want its end", b)
	}
	h.provider.Close()
	h.waitEnd(t)
	if h.s.Reason() != EndClientClosed {
		t.Fatalf("reason %q", h.s.Reason())
	}
}

// TestFarewellGatewayCloseMidMessage: when the gateway ends a session
// whose client is in the middle of a message (between two of its frames;
// inside one that stalls for CloseWait; inside one when the client's
// connection then ends), the provider gets the end of that message,
// session.end, and the gateway's close frame.
func TestFarewellGatewayCloseMidMessage(t *testing.T) {
	for _, tc := range []struct {
		name      string
		sent      []byte
		want      []wf
		clientEnd bool
	}{
		{"between two frames", wire([]wf{{false, 1, frag, 0}}), []wf{{false, 1, frag, 0}, {true, 0, "", 0}}, false},
		{"a frame stalls", wire([]wf{{true, 1, command(100), 0}})[:6+10], []wf{{true, 1, command(100)[:10] + sp(90), 0}}, false},
		{"the client's connection ends", wire([]wf{{true, 1, "ab" + strings.Repeat("€", 40), 0}})[:6+3],
			[]wf{{true, 1, "ab\xe2\x80\x80" + sp(len(euros)-5), 0}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newFarewellRelay(t, 0, SessionOptions{})
			h.client.Write(tc.sent)
			got := readRaw(t, h.provider, h.pr, len(tc.sent))
			h.pr = bufio.NewReader(io.MultiReader(bytes.NewReader(got), h.pr))
			h.s.Close(CloseNormal, EndOperator)
			cr := bufio.NewReader(h.client)
			h.client.SetReadDeadline(time.Now().Add(5 * time.Second))
			if f, err := readFrame(cr); err != nil || !isClose(f, CloseNormal, EndOperator) {
				t.Fatalf("client got %+v %v, want the gateway's close", f, err)
			}
			if tc.clientEnd {
				h.client.Close()
			}
			h.wantFrames(t, tc.want)
			h.wantFarewell(t)
			if f := h.providerFrame(t); !f.masked || !isClose(f, CloseNormal, EndOperator) {
				t.Fatalf("provider got opcode %#x %q, want the gateway's close", f.op, f.payload)
			}
			h.provider.Write(closeFrame(1000, "", false))
			h.provider.Close()
			h.client.Close()
			h.waitEnd(t)
			if h.s.Reason() != EndOperator {
				t.Fatalf("reason %q", h.s.Reason())
			}
		})
	}
}

// TestFarewellClientUsesLargestID: the answer to a client's command, sent
// just before it left, with the largest ID BiDi allows (the one a gateway
// might pick for its own) does not end the wait for the answer to the
// gateway's session.end.
func TestFarewellClientUsesLargestID(t *testing.T) {
	h := newFarewellRelay(t, 0, SessionOptions{})
	writeFrame(h.client, 0x1, []byte(`{"id":9007199254740991,"method":"session.status","params":{}}`), true)
	h.providerFrame(t)
	h.client.Close()
	reply := h.wantFarewell(t)
	writeFrame(h.provider, 0x1, []byte(`{"type":"success","id":9007199254740991,"result":{"ready":false}}`), false)
	h.providerSilent(t, 200*time.Millisecond)
	h.provider.Write(frameBytes(0x1, reply, false))
	h.wantClosed(t, CloseGoingAway, EndClientClosed)
}

// TestFrameTrackerFollowsUTF8: fed the client's stream in pieces of any
// size, the tracker knows at every point what completes the current text
// message's last character: nothing when it is whole, else continuation
// bytes that make it valid UTF-8; nothing for a binary message.
func TestFrameTrackerFollowsUTF8(t *testing.T) {
	runes := []string{"a", "é", "€", "\u0800", "\ud7ff", "\U00010000", "\U0010ffff", "𝄞"}
	for seed := uint64(1); seed <= 200; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		// A few messages, each in a few frames (a ping between some), and
		// for each byte of the stream the message and how much of its
		// payload came by then.
		var stream []byte
		var msgs [][]byte
		var bins []bool
		type at struct{ msg, n int }
		var pos []at
		for m := 0; m < 4; m++ {
			var msg []byte
			for n := r.IntN(40); n > 0; n-- {
				msg = append(msg, runes[r.IntN(len(runes))]...)
			}
			bin := r.IntN(5) == 0
			msgs, bins = append(msgs, msg), append(bins, bin)
			for done := 0; done < len(msg) || done == 0; {
				n := min(len(msg)-done, r.IntN(12))
				op := byte(0x0)
				if done == 0 {
					op = 0x1
					if bin {
						op = 0x2
					}
				}
				fin := done+n == len(msg)
				f := mkFrame(fin, op, msg[done:done+n], true, 0)
				hl := len(f) - n
				for i := range f {
					pos = append(pos, at{m, done + max(0, i+1-hl)})
				}
				stream = append(stream, f...)
				done += n
				if fin {
					break
				}
				if r.IntN(3) == 0 {
					p := mkFrame(true, opPing, []byte("pi"), true, 0)
					for range p {
						pos = append(pos, at{m, done})
					}
					stream = append(stream, p...)
				}
			}
		}
		tr := frameTracker{followText: true}
		for i := 0; i < len(stream); {
			n := 1 + r.IntN(min(len(stream)-i, 9))
			tr.advance(stream[i:i+n], false)
			i += n
			p := pos[i-1]
			tail := tr.utf8Tail(nil)
			msg := msgs[p.msg][:p.n]
			switch {
			case bins[p.msg] && len(tail) > 0:
				t.Fatalf("seed %d at %d: a binary message has a tail % x", seed, i, tail)
			case bins[p.msg]:
			case utf8.Valid(msg) != (len(tail) == 0) || !utf8.Valid(append(msg[:len(msg):len(msg)], tail...)):
				t.Fatalf("seed %d at %d: message so far % x, tail % x", seed, i, msg, tail)
			}
		}
	}
}

// TestHeaderRest: a frame header cut anywhere is completed with the
// shortest payload length its bytes allow (126 and up for a 16-bit
// length, 64 KiB and up for a 64-bit one), keeping the client's bytes,
// the opcode and the FIN bit; the mask key's missing bytes are made up.
func TestHeaderRest(t *testing.T) {
	for _, tc := range []struct {
		fin    bool
		length int64
		cut    int
		want   int64
	}{
		{true, 100, 1, 0},
		{false, 100, 1, 0},
		{true, 100, 2, 100},
		{true, 100, 5, 100},
		{true, 768, 2, 126},
		{true, 768, 3, 768},
		{true, 200, 3, 126},
		{true, 768, 7, 768},
		{true, 70000, 2, 65536},
		{true, 70000, 6, 65536},
		{true, 70000, 7, 65536},
		{true, 70000, 8, 65536},
		{true, 70000, 9, 0x011100},
		{true, 70000, 10, 70000},
		{true, 70000, 13, 70000},
		{true, 5 << 32, 6, 5 << 32},
	} {
		var full []byte
		if tc.length > 1<<32 {
			full = append(binary.BigEndian.AppendUint64([]byte{0x81, 0xff}, uint64(tc.length)), 1, 2, 3, 4)
		} else {
			full = mkFrame(tc.fin, 0x1, make([]byte, int(tc.length)), true, 0)
		}
		var tr frameTracker
		tr.advance(full[:tc.cut], false)
		rest := tr.headerRest()
		hdr := append(full[:tc.cut:tc.cut], rest...)
		if len(hdr) < 2 || headerLen(hdr[1]) != len(hdr) || hdr[1]&0x80 == 0 {
			t.Errorf("%+v: header % x is not one whole masked header", tc, hdr)
			continue
		}
		tr.advance(rest, false)
		if tr.hdrN != 0 || tr.remaining != tc.want || tr.opcode != 0x1 || tr.fragmented == tc.fin {
			t.Errorf("%+v: header % x gives %d bytes, opcode %#x, fragmented %v; want %d", tc, hdr, tr.remaining, tr.opcode, tr.fragmented, tc.want)
		}
	}
}
