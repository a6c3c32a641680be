package upstreams

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// Converse: the gateway talking with the provider on a connection before
// its session's relay starts, so before any byte of the client's goes to
// the provider (a browser profile put into the browser). The Talk's
// messages go as masked text frames (the gateway speaks as the client);
// the provider's are read and put together, each text message handed to
// Talk.Heard. A message that is not the talk's is kept as it came, for
// the client, ahead of whatever follows (Conn.Leftover); pings are
// answered as a client answers them.

// ErrConverseClosed is Converse's error when the provider closed the
// connection (a close frame, or its end) before the talk was over.
var ErrConverseClosed = errors.New("the provider closed the connection")

// Converse runs talk t on up, within wait, each message of the
// provider's put together up to maxMessage bytes (0: MaxReplyMessage). It
// returns once t says it is over; an error when the wait passes first,
// the provider closes or fails, or sends a text message too long to read
// (the connection is then of no use: the caller closes it).
func Converse(up *Conn, t Talk, wait time.Duration, maxMessage int64) error {
	if maxMessage <= 0 {
		maxMessage = MaxReplyMessage
	}
	up.Conn.SetDeadline(time.Now().Add(wait))
	defer up.Conn.SetDeadline(time.Time{})
	c := &converse{up: up, t: t, max: maxMessage, buf: up.Leftover}
	up.Leftover = nil
	t.Begin(c.send)
	err := c.run()
	// What the client gets first: the messages that were not the talk's,
	// and what was read behind the talk's last one.
	up.Leftover = append(c.kept, c.buf...)
	if err == nil && c.werr != nil {
		err = c.werr
	}
	return err
}

// converse is one Converse under way.
type converse struct {
	up   *Conn
	t    Talk
	max  int64
	buf  []byte // read, not taken yet
	kept []byte // the messages for the client
	werr error
	// The message being put together: its frames as they came, its
	// opcode and its payload.
	raw  []byte
	op   byte
	msg  []byte
	open bool
}

func (c *converse) send(msg []byte) bool {
	if c.werr != nil {
		return false
	}
	_, c.werr = c.up.Conn.Write(appendDataFrame(nil, opText, msg))
	return c.werr == nil
}

// run reads frames until the talk is over.
func (c *converse) run() error {
	rb := make([]byte, 32<<10)
	for {
		f, n, ok := parseFrame(c.buf)
		if !ok {
			if f.length > c.max+14 && f.op < opClose {
				return fmt.Errorf("the provider sent a message over %d bytes while the gateway talked with it", c.max)
			}
			m, err := c.up.Conn.Read(rb)
			c.buf = append(c.buf, rb[:m]...)
			if err != nil {
				if m > 0 {
					continue
				}
				if errors.Is(err, io.EOF) {
					return ErrConverseClosed
				}
				return err
			}
			continue
		}
		frame := c.buf[:n]
		rest := c.buf[n:]
		over, err := c.take(f, frame)
		c.buf = rest
		if err != nil || over {
			return err
		}
	}
}

// take handles one whole frame; over tells that the talk is done.
func (c *converse) take(f frameHead, frame []byte) (over bool, err error) {
	payload := frame[f.hdr:]
	if f.masked {
		payload = unmaskCopy(payload, f.key)
	}
	switch {
	case f.op == opClose:
		return false, ErrConverseClosed
	case f.op == opPing:
		_, err := c.up.Conn.Write(controlFrame(opPong, payload, true))
		return false, err
	case f.op == opPong || f.op > opPong:
		return false, nil
	case f.op == 0x0 && !c.open:
		// A continuation of nothing: for the client, as it came.
		c.kept = append(c.kept, frame...)
		return false, nil
	case f.op != 0x0:
		c.open, c.op = true, f.op
		c.raw, c.msg = c.raw[:0], c.msg[:0]
	}
	c.raw = append(c.raw, frame...)
	c.msg = append(c.msg, payload...)
	if int64(len(c.msg)) > c.max && c.op == opText {
		return false, fmt.Errorf("the provider sent a message over %d bytes while the gateway talked with it", c.max)
	}
	if !f.fin {
		return false, nil
	}
	c.open = false
	if c.op != opText {
		c.kept = append(c.kept, c.raw...)
		return false, nil
	}
	mine, over := c.t.Heard(c.msg)
	if !mine {
		c.kept = append(c.kept, c.raw...)
	}
	return over, nil
}

// frameHead is what parseFrame reads of a frame's header.
type frameHead struct {
	fin    bool
	op     byte
	masked bool
	key    [4]byte
	hdr    int   // the header's length
	length int64 // the payload's
}

// parseFrame reads the frame at the start of b: n is its whole length,
// ok false when b does not hold all of it yet (f.length is known once the
// header is whole).
func parseFrame(b []byte) (f frameHead, n int, ok bool) {
	if len(b) < 2 {
		return f, 0, false
	}
	f.fin, f.op, f.masked = b[0]&0x80 != 0, b[0]&0x0f, b[1]&0x80 != 0
	f.hdr = 2
	switch l := b[1] & 0x7f; l {
	case 126:
		if len(b) < 4 {
			return f, 0, false
		}
		f.length, f.hdr = int64(binary.BigEndian.Uint16(b[2:4])), 4
	case 127:
		if len(b) < 10 {
			return f, 0, false
		}
		f.length, f.hdr = int64(binary.BigEndian.Uint64(b[2:10])&(1<<63-1)), 10
	default:
		f.length = int64(l)
	}
	if f.masked {
		if len(b) < f.hdr+4 {
			return f, 0, false
		}
		copy(f.key[:], b[f.hdr:f.hdr+4])
		f.hdr += 4
	}
	if int64(len(b)-f.hdr) < f.length {
		return f, 0, false
	}
	return f, f.hdr + int(f.length), true
}

// unmaskCopy is p unmasked with key.
func unmaskCopy(p []byte, key [4]byte) []byte {
	out := make([]byte, len(p))
	for i, c := range p {
		out[i] = c ^ key[i&3]
	}
	return out
}
