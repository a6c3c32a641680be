package status

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/cooldown"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// peer is one side of a fake session: it reads what the gateway sends and
// reports the first close frame's code and reason.
type peer struct {
	conn   net.Conn
	closes chan string
}

func newPeer(c net.Conn) *peer {
	p := &peer{conn: c, closes: make(chan string, 1)}
	go func() {
		var buf []byte
		b := make([]byte, 4096)
		for {
			n, err := c.Read(b)
			buf = append(buf, b[:n]...)
			// Unmasked or masked close frame: 0x88, length, [mask], payload.
			if len(buf) >= 2 && buf[0] == 0x88 {
				ln := int(buf[1] & 0x7f)
				masked := buf[1]&0x80 != 0
				hdr := 2
				if masked {
					hdr += 4
				}
				if len(buf) >= hdr+ln {
					pl := append([]byte(nil), buf[hdr:hdr+ln]...)
					if masked {
						for i := range pl {
							pl[i] ^= buf[2+i%4]
						}
					}
					p.closes <- fmt.Sprintf("%d %s", binary.BigEndian.Uint16(pl), pl[2:])
					io.Copy(io.Discard, c)
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	return p
}

// liveSession establishes a relay over pipes on provider p, registered
// under info, and returns it with its client and provider peers.
func liveSession(t *testing.T, p *pool.ProviderState, info pool.SessionInfo) (*upstreams.Session, *peer, *peer) {
	t.Helper()
	cg, cp := net.Pipe() // gateway side, client side
	ug, up := net.Pipe() // gateway side, provider side
	permit, _ := p.Health.Acquire()
	tk := p.Admit(permit)
	if tk == nil {
		t.Fatal("no slot")
	}
	p.Health.Done(permit, cooldown.Success, 0)
	s := upstreams.NewSession(cg, &upstreams.Conn{Conn: ug}, upstreams.SessionOptions{OnEnd: func(*upstreams.Session) { tk.Release() }})
	tk.Establish(s, info, nil)
	s.Run()
	t.Cleanup(func() { cp.Close(); up.Close() })
	return s, newPeer(cp), newPeer(up)
}

// TestSessionsAdmin: the list shows this node's sessions oldest first in
// the documented shape; DELETE ends one with close 1000 "closed by
// operator" to both sides, frees its slot and answers its object; unknown
// IDs are 404 and other methods 405.
func TestSessionsAdmin(t *testing.T) {
	reg := pool.NewRegistry(nil)
	p, err := reg.Claim("sessions-unit", "ws://h/", "ws://h/", t, cooldown.Config{}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.ReleaseClaim("sessions-unit", t)

	first, _, _ := liveSession(t, p, pool.SessionInfo{ID: "first-id", Protocol: "cdp", RemoteIP: "127.0.0.1", Attempts: 2})
	time.Sleep(2 * time.Millisecond) // distinct start times
	_, client2, provider2 := liveSession(t, p, pool.SessionInfo{ID: "second-id", Protocol: "playwright", Client: "sha256:0123456789ab", RemoteIP: "127.0.0.2", Attempts: 1})

	rec, err := serve(t, reg, http.MethodGet, SessionsPath)
	if err != nil {
		t.Fatal(err)
	}
	var got Sessions
	dec := json.NewDecoder(bytes.NewReader(rec.Body.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("%s: %v", rec.Body, err)
	}
	var mine []Session
	for _, s := range got.Sessions {
		if s.Provider == "sessions-unit" {
			mine = append(mine, s)
		}
	}
	if len(mine) != 2 || mine[0].ID != "first-id" || mine[1].ID != "second-id" {
		t.Fatalf("sessions %s", rec.Body)
	}
	a, b := mine[0], mine[1]
	if a.Protocol != "cdp" || a.Client != nil || a.RemoteIP != "127.0.0.1" || a.Attempts != 2 ||
		!a.Started.Equal(first.Start()) || a.Started.Location() != time.UTC || a.DurationMS < 0 {
		t.Fatalf("first %+v", a)
	}
	if b.Protocol != "playwright" || b.Client == nil || *b.Client != "sha256:0123456789ab" || b.Attempts != 1 {
		t.Fatalf("second %+v", b)
	}
	body := rec.Body.String()
	for _, key := range []string{`"id":`, `"provider":`, `"protocol":`, `"started":`, `"duration_ms":`, `"bytes_up":`, `"bytes_down":`, `"client":null`, `"remote_ip":`, `"attempts":`} {
		if !strings.Contains(body, key) {
			t.Errorf("no %s in %s", key, body)
		}
	}

	// End the second one.
	rec, err = serve(t, reg, http.MethodDelete, SessionsPath+"/second-id")
	if err != nil {
		t.Fatal(err)
	}
	var ended Session
	if err := json.Unmarshal(rec.Body.Bytes(), &ended); err != nil || ended.ID != "second-id" || ended.Provider != "sessions-unit" {
		t.Fatalf("DELETE answered %s (%v)", rec.Body, err)
	}
	for side, pr := range map[string]*peer{"client": client2, "provider": provider2} {
		select {
		case c := <-pr.closes:
			if c != "1000 closed by operator" {
				t.Fatalf("%s saw close %q", side, c)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s got no close frame", side)
		}
	}
	if n := p.Slots.Active(); n != 1 {
		t.Fatalf("active %d after the end, want 1", n)
	}
	if _, ok := reg.Sessions.ByID("second-id"); ok {
		t.Fatal("the ended session is still listed")
	}

	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{http.MethodDelete, SessionsPath + "/no-such-id", 404},
		{http.MethodDelete, SessionsPath + "/second-id", 404}, // already ended
		{http.MethodGet, SessionsPath + "/first-id", 405},
		{http.MethodPost, SessionsPath + "/first-id", 405},
		{http.MethodPost, SessionsPath, 405},
		{http.MethodDelete, SessionsPath, 405},
		{http.MethodDelete, SessionsPath + "/", 404},
		{http.MethodDelete, SessionsPath + "/a/b", 404},
	} {
		_, err := serve(t, reg, tc.method, tc.path)
		if got := apiStatus(err); got != tc.status {
			t.Errorf("%s %s: %d (%v), want %d", tc.method, tc.path, got, err, tc.status)
		}
	}
	first.Close(upstreams.CloseNormal, "test over")
	<-first.Done()
	if n := p.Slots.Active(); n != 0 {
		t.Fatalf("active %d at the end", n)
	}
}
