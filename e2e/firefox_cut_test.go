package e2e

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/status"
)

// bidiRaw is a WebDriver BiDi client on a bare TCP connection, so that a
// test can end it anywhere in a frame.
type bidiRaw struct {
	c  net.Conn
	br *bufio.Reader
}

// dialBiDiRaw opens a BiDi WebSocket (/session) through the gateway at
// addr; the handshake may wait in the gateway's queue.
func dialBiDiRaw(t *testing.T, addr string) *bidiRaw {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	key := make([]byte, 16)
	rand.Read(key)
	c.SetDeadline(time.Now().Add(60 * time.Second))
	fmt.Fprintf(c, "GET /session HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", addr, base64.StdEncoding.EncodeToString(key))
	b := &bidiRaw{c: c, br: bufio.NewReader(c)}
	resp, err := http.ReadResponse(b.br, nil)
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("handshake: %d %s", resp.StatusCode, body)
	}
	return b
}

// frame is one masked client frame.
func (b *bidiRaw) frame(fin bool, op byte, p []byte) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	f := []byte{b0}
	switch n := len(p); {
	case n <= 125:
		f = append(f, 0x80|byte(n))
	case n <= 0xffff:
		f = binary.BigEndian.AppendUint16(append(f, 0x80|126), uint16(n))
	default:
		f = binary.BigEndian.AppendUint64(append(f, 0x80|127), uint64(n))
	}
	key := make([]byte, 4)
	rand.Read(key)
	f = append(f, key...)
	for i, c := range p {
		f = append(f, c^key[i&3])
	}
	return f
}

// write sends raw bytes.
func (b *bidiRaw) write(t *testing.T, p []byte) {
	t.Helper()
	if _, err := b.c.Write(p); err != nil {
		t.Fatalf("write: %v", err)
	}
}

// command sends a command and returns the answer with its ID (events in
// between are skipped).
func (b *bidiRaw) command(t *testing.T, id int, method, params string) map[string]any {
	t.Helper()
	b.write(t, b.frame(true, 0x1, fmt.Appendf(nil, `{"id":%d,"method":%q,"params":%s}`, id, method, params)))
	for {
		msg := b.message(t)
		var m map[string]any
		if err := json.Unmarshal(msg, &m); err != nil {
			t.Fatalf("%s: %q is not JSON", method, msg)
		}
		if m["id"] == float64(id) {
			return m
		}
	}
}

// message reads the next text message from Firefox (whose frames are
// whole messages).
func (b *bidiRaw) message(t *testing.T) []byte {
	t.Helper()
	b.c.SetReadDeadline(time.Now().Add(60 * time.Second))
	for {
		var h [2]byte
		if _, err := io.ReadFull(b.br, h[:]); err != nil {
			t.Fatalf("reading a message: %v", err)
		}
		n := uint64(h[1] & 0x7f)
		switch n {
		case 126:
			var l [2]byte
			io.ReadFull(b.br, l[:])
			n = uint64(binary.BigEndian.Uint16(l[:]))
		case 127:
			var l [8]byte
			io.ReadFull(b.br, l[:])
			n = binary.BigEndian.Uint64(l[:])
		}
		p := make([]byte, n)
		if _, err := io.ReadFull(b.br, p); err != nil {
			t.Fatalf("reading a message: %v", err)
		}
		switch h[0] & 0xf {
		case 0x1:
			return p
		case 0x8:
			t.Fatalf("the connection closed (% x)", p)
		}
	}
}

// newSession has the client create its BiDi session: session.new must
// succeed.
func (b *bidiRaw) newSession(t *testing.T) {
	t.Helper()
	if m := b.command(t, 1, "session.new", `{"capabilities":{}}`); m["type"] != "success" {
		t.Fatalf("session.new: %v: %v", m["error"], m["message"])
	}
}

// TestFirefoxBiDiClientCutMidMessage: a BiDi client whose connection ends
// in the middle of one of its messages (inside a large frame, inside a
// character, inside a frame header, between or inside the frames of a
// fragmented message; FIN or RST) does not keep real Firefox's one
// session: the gateway completes the message for Firefox, ends the
// session with session.end, and the next client's session.new succeeds.
// The same when an operator ends the session while the client is in the
// middle of a message.
func TestFirefoxBiDiClientCutMidMessage(t *testing.T) {
	RequireFirefox(t)
	ff := StartFirefox(t)
	g := testgw.Start(t, handler(`"queue":{"size":5,"timeout":"60s"}`, provider("ff-cut", ff.WSURL(), `"protocol":"bidi"`)))
	head := `{"id":2,"method":"script.evaluate","params":{"target":{"context":"x"},"awaitPromise":false,"expression":"'`
	for _, tc := range []struct {
		name string
		end  string // how it ends: FIN, RST, or an operator ends the session
		cut  func(b *bidiRaw) []byte
	}{
		{"inside a large frame", "FIN", func(b *bidiRaw) []byte {
			f := b.frame(true, 0x1, []byte(head+strings.Repeat("x", 1<<20)+`'"}}`))
			return f[:300<<10]
		}},
		{"inside a character", "FIN", func(b *bidiRaw) []byte {
			f := b.frame(true, 0x1, []byte(head+strings.Repeat("€", 40000)+`'"}}`))
			return f[:14+len(head)+3*20000+1] // the first byte of a €
		}},
		{"inside a frame header", "FIN", func(b *bidiRaw) []byte {
			return b.frame(true, 0x1, []byte(head+strings.Repeat("x", 1<<20)+`'"}}`))[:5]
		}},
		{"between the frames of a message", "FIN", func(b *bidiRaw) []byte {
			return b.frame(false, 0x1, []byte(`{"id":2,"method":"session.sta`))
		}},
		{"inside a frame of a fragmented message", "RST", func(b *bidiRaw) []byte {
			first := b.frame(false, 0x1, []byte(head))
			next := b.frame(false, 0x0, []byte(strings.Repeat("é", 40000)))
			return append(first, next[:14+3001]...) // inside an é
		}},
		// The gateway ends the session itself while the client is in the
		// middle of a message.
		{"operator, between the frames of a message", "operator", func(b *bidiRaw) []byte {
			return b.frame(false, 0x1, []byte(`{"id":2,"method":"session.sta`))
		}},
		{"operator, inside a frame that stalls", "operator", func(b *bidiRaw) []byte {
			return b.frame(true, 0x1, []byte(head+strings.Repeat("€", 40000)+`'"}}`))[:14+len(head)+3*20000+2]
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := dialBiDiRaw(t, g.Addr)
			b.newSession(t)
			b.write(t, tc.cut(b))
			switch tc.end {
			case "RST":
				b.c.(*net.TCPConn).SetLinger(0)
				b.c.Close()
			case "FIN":
				b.c.Close()
			case "operator":
				ss := sessionsList(t, g)
				if len(ss) != 1 {
					t.Fatalf("sessions list %+v, want one session", ss)
				}
				if code, body, err := g.AdminDo(http.MethodDelete, status.SessionsPath+"/"+ss[0].ID, nil); err != nil || code != http.StatusOK {
					t.Fatalf("DELETE session: %d %s (%v)", code, body, err)
				}
			}
			// The next client waits for the first one's slot, then
			// gets a session of its own.
			next := dialBiDiRaw(t, g.Addr)
			next.newSession(t)
			if m := next.command(t, 2, "session.end", `{}`); m["type"] != "success" {
				t.Fatalf("session.end: %v", m)
			}
			next.c.Close()
			waitIdle(t, "ff-cut")
		})
	}
}
