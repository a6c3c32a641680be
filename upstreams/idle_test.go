package upstreams

import (
	"bytes"
	"io"
	"net"
	"testing"
)

// TestIdleWatchAnswersClose: the watch of an idle connection sees the
// provider's close frame whatever the pieces it comes in, after other
// frames, and answers it as a client: masked, echoing the code, or with no
// code when the provider gave none or one that may not be sent.
func TestIdleWatchAnswersClose(t *testing.T) {
	for _, tc := range []struct {
		name      string
		close     []byte
		wantEcho  []byte
		pieceSize int
	}{
		{"code and reason, one byte at a time", []byte{0x88, 6, 0x03, 0xe9, 'i', 'd', 'l', 'e'}, []byte{0x03, 0xe9}, 1},
		{"no code", []byte{0x88, 0}, nil, 64},
		{"a code that may not be sent", []byte{0x88, 2, 0x03, 0xee}, nil, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stream := append([]byte{0x81, 2, 'h', 'i', 0x89, 0}, tc.close...)
			var w IdleWatch
			closed := false
			for i := 0; i < len(stream); i += tc.pieceSize {
				end := min(i+tc.pieceSize, len(stream))
				if closed {
					t.Fatal("closed before the close frame was whole")
				}
				closed = w.Closed(stream[i:end])
			}
			if !closed {
				t.Fatal("the close frame was not seen")
			}
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			go func() { w.AnswerClose(&Conn{Conn: a}) }()
			hdr := make([]byte, 2)
			if _, err := io.ReadFull(b, hdr); err != nil {
				t.Fatal(err)
			}
			if hdr[0] != 0x88 || hdr[1]&0x80 == 0 || int(hdr[1]&0x7f) != len(tc.wantEcho) {
				t.Fatalf("answer header %x: want a masked close with %d payload bytes", hdr, len(tc.wantEcho))
			}
			rest := make([]byte, 4+len(tc.wantEcho))
			if _, err := io.ReadFull(b, rest); err != nil {
				t.Fatal(err)
			}
			got := rest[4:]
			for i := range got {
				got[i] ^= rest[i%4]
			}
			if !bytes.Equal(got, tc.wantEcho) {
				t.Fatalf("answer payload %x, want %x", got, tc.wantEcho)
			}
		})
	}
}
