package gateway

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/spend"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// TestAbandonClosesLateWinner: an attempt that answered 101 after another
// won gets a masked close 1000 "hedge lost", its slot back, and no change
// to its provider's health; it is listed as hedge_lost.
func TestAbandonClosesLateWinner(t *testing.T) {
	gen := new(int)
	reg := pool.NewRegistry(nil)
	st, err := reg.Claim("abandon-unit", "ws://127.0.0.1:1/", "ws://127.0.0.1:1/", gen, cooldown.Config{MinRequests: 1}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.ReleaseClaim("abandon-unit", gen)
	up, err := upstreams.New(upstreams.Config{Name: "abandon-unit", URL: "ws://127.0.0.1:1/"}, upstreams.Defaults{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Its provider charges per session: the loser's session is charged.
	st.Spend.SetPricing(pool.Pricing{Cost: &spend.Cost{Amount: 0.5, Per: spend.PerSession}})
	permit, ok := st.Health.Acquire()
	if !ok {
		t.Fatal("no permit")
	}
	tk := st.Admit(permit)
	if tk == nil {
		t.Fatal("no slot")
	}
	h := &Gateway{}
	h.logger, h.reg = zap.NewNop(), reg
	c := &connect{h: h}
	f := &flight{m: &member{up: up, state: st}, t: tk, cancel: func() {}, start: time.Now()}
	results := make(chan landing, 1)
	c.abandon(map[*flight]struct{}{f: {}}, results)
	if c.hedgesWasted != 1 || len(c.attempts) != 1 || c.attempts[0].Outcome != upstreams.WordHedgeLost {
		t.Fatalf("wasted %d attempts %+v", c.hedgesWasted, c.attempts)
	}

	gw, provider := net.Pipe()
	results <- landing{f: f, res: upstreams.Result{Outcome: upstreams.Outcome{Word: upstreams.WordOK, Kind: upstreams.Success}, Conn: &upstreams.Conn{Conn: gw}}}
	provider.SetDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, 2)
	if _, err := io.ReadFull(provider, hdr); err != nil {
		t.Fatal(err)
	}
	if hdr[0] != 0x88 || hdr[1]&0x80 == 0 {
		t.Fatalf("frame header % x: want a masked close frame", hdr)
	}
	n := int(hdr[1] & 0x7f)
	rest := make([]byte, 4+n)
	if _, err := io.ReadFull(provider, rest); err != nil {
		t.Fatal(err)
	}
	key, payload := rest[:4], rest[4:]
	for i := range payload {
		payload[i] ^= key[i&3]
	}
	if code := binary.BigEndian.Uint16(payload); code != 1000 || string(payload[2:]) != "hedge lost" {
		t.Fatalf("close %d %q", code, payload[2:])
	}
	provider.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for st.Slots.Reserved() != 0 {
		if ctx.Err() != nil {
			t.Fatal("slot not given back")
		}
		time.Sleep(time.Millisecond)
	}
	if snap := st.Health.Snapshot(); snap.Failures != 0 || !snap.Healthy {
		t.Fatalf("health %+v", snap)
	}
	for b := st.Spend.Book().Read(); b.Spent != 0.5 || b.Live != 0; b = st.Spend.Book().Read() {
		if ctx.Err() != nil {
			t.Fatalf("the loser's session: spent %v, live meters %d; want its price, 0.5", b.Spent, b.Live)
		}
		time.Sleep(time.Millisecond)
	}
}
