package upstreams

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"
)

// BenchmarkRelayKeepalive: what keepalive costs the relay's hot path.
// Messages go client → provider (masked) and come back (echoed as they
// are), through a session with keepalive off and on (a 1s interval: busy
// sessions are never pinged, so what shows is the pong scan of each
// frame). Compare the sub-benchmarks of one run:
//
//	go test -run '^$' -bench RelayKeepalive -count 5 ./upstreams/
func BenchmarkRelayKeepalive(b *testing.B) {
	for _, size := range []int{256, 64 << 10, 1 << 20} {
		for _, ka := range []time.Duration{0, time.Second} {
			name := "off"
			if ka > 0 {
				name = "on"
			}
			b.Run(name+"/"+sizeName(size), func(b *testing.B) { benchRelay(b, size, ka) })
		}
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return itoa(n>>20) + "MiB"
	case n >= 1<<10:
		return itoa(n>>10) + "KiB"
	}
	return itoa(n) + "B"
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

func benchPair(b *testing.B) (x, y net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	x, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	y = <-ch
	b.Cleanup(func() { x.Close(); y.Close() })
	return x, y
}

func benchRelay(b *testing.B, size int, keepalive time.Duration) {
	benchRelayWith(b, size, SessionOptions{Keepalive: keepalive})
}

func benchRelayWith(b *testing.B, size int, o SessionOptions) {
	client, gwClient := benchPair(b)
	gwUp, provider := benchPair(b)
	s := NewSession(gwClient, &Conn{Conn: gwUp}, o)
	s.Run()
	b.Cleanup(func() { s.Close(CloseNormal, "done") })
	go io.Copy(provider, provider) // the provider echoes the bytes as they are
	frame := []byte{0x82}
	switch {
	case size < 126:
		frame = append(frame, 0x80|byte(size))
	case size < 1<<16:
		frame = binary.BigEndian.AppendUint16(append(frame, 0x80|126), uint16(size))
	default:
		frame = binary.BigEndian.AppendUint64(append(frame, 0x80|127), uint64(size))
	}
	frame = append(frame, 1, 2, 3, 4)
	frame = append(frame, make([]byte, size)...)
	buf := make([]byte, len(frame))
	b.SetBytes(int64(len(frame)))
	b.ResetTimer()
	for range b.N {
		if _, err := client.Write(frame); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(client, buf); err != nil {
			b.Fatal(err)
		}
	}
}
