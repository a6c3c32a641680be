package browserfailover_test

// Memory is bounded by live work: client_limit key values, each seen once
// and answered 503, leave nothing behind in the gateway's heap.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/internal/fakes"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
)

// memKeyTemplate is the client_limit key of the memory test.
const memKeyTemplate = "{http.request.header.X-Key}"

// memKeyFiller makes each key value about 1 KiB, so that a kept key shows.
var memKeyFiller = strings.Repeat("k", 1016)

// memKey is the i-th distinct key value.
func memKey(i int) string { return fmt.Sprintf("%07d-", i) + memKeyFiller }

// TestDistinctClientKeysLeaveNoHeap sends 100,000 upgrades (20,000 under
// the race detector), each with a client_limit key of its own, to a
// gateway whose only provider refuses connections and whose queue is off:
// every one is answered 503. The live heap after them is where it was
// before, give or take a few MiB: nothing is kept per key value.
func TestDistinctClientKeysLeaveNoHeap(t *testing.T) {
	refused := fakes.Refused("mem-refused")
	g := testgw.Start(t, handler(`"queue":{"size":0},"client_limit":{"key":"`+memKeyTemplate+`","limit":1}`,
		provider("mem-refused", refused.URL(), "")))

	const warmUp = 2000
	n := 100_000
	if raceEnabled {
		n = 20_000 // the detector is about ten times slower
	}
	// Warm up: Caddy's buffers and pools, the provider's cooldown.
	sendDistinctKeys(t, g.Addr, 0, warmUp)
	before := liveHeap()
	start := time.Now()
	redials := sendDistinctKeys(t, g.Addr, warmUp, warmUp+n)
	elapsed := time.Since(start)
	after := liveHeap()

	growth := int64(after) - int64(before)
	t.Logf("%d distinct client_limit keys (1 KiB each), all answered 503 in %v (%d reconnects): live heap %.1f MiB before, %.1f MiB after, growth %+.2f MiB",
		n, elapsed.Round(time.Millisecond), redials, mib(before), mib(after), float64(growth)/(1<<20))
	const limit = 8 << 20
	if growth >= limit {
		t.Errorf("live heap grew by %.1f MiB over %d distinct client_limit keys, want < %d MiB", float64(growth)/(1<<20), n, limit>>20)
	}
	for _, i := range []int{0, warmUp, warmUp + n - 1} {
		if a := pool.Current().Quotas.Active(pool.QuotaKey{Template: memKeyTemplate, Value: memKey(i)}); a != 0 {
			t.Errorf("key %d still counts %d sessions", i, a)
		}
	}
}

// liveHeap is the heap still in use after two collections (the second
// frees what the first only unlinked, sync.Pool victims included).
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// sendDistinctKeys sends one WebSocket upgrade for each key from to
// (excluded) over a few kept-alive HTTP/1.1 connections and requires a
// 503 for each. It returns how many connections had to be made again
// (the server closed one).
func sendDistinctKeys(t *testing.T, addr string, from, to int) int64 {
	t.Helper()
	const workers = 4
	var next atomic.Int64
	next.Store(int64(from))
	var redials atomic.Int64
	var failed atomic.Bool
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var c net.Conn
			var br *bufio.Reader
			dialed := false
			defer func() {
				if c != nil {
					c.Close()
				}
			}()
			var req []byte
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= to {
					return
				}
				req = append(req[:0], "GET / HTTP/1.1\r\nHost: "+addr+
					"\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nX-Key: "...)
				req = append(req, memKey(i)...)
				req = append(req, "\r\n\r\n"...)
				for try := 0; ; try++ {
					if c == nil {
						var err error
						if c, err = net.Dial("tcp", addr); err != nil {
							failed.Store(true)
							t.Errorf("dial: %v", err)
							return
						}
						br = bufio.NewReader(c)
						if dialed {
							redials.Add(1)
						}
						dialed = true
					}
					status, keep, err := upgradeOnce(c, br, req)
					if err != nil && try == 0 {
						// The server closed a kept-alive connection.
						c.Close()
						c = nil
						continue
					}
					if err != nil {
						failed.Store(true)
						t.Errorf("key %d: %v", i, err)
						return
					}
					if status != http.StatusServiceUnavailable {
						failed.Store(true)
						t.Errorf("key %d: status %d, want 503", i, status)
						return
					}
					if !keep {
						c.Close()
						c = nil
					}
					break
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() {
		t.FailNow()
	}
	return redials.Load()
}

// upgradeOnce writes one request and reads its whole answer.
func upgradeOnce(c net.Conn, br *bufio.Reader, req []byte) (status int, keep bool, err error) {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(req); err != nil {
		return 0, false, err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, false, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, !resp.Close, err
}
