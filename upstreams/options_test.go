package upstreams

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/browserfailover/caddy-browser-failover/options"
)

// TestOptionsThroughDiscovery: a discovered provider whose URL's query
// holds option placeholders gets them rendered on its discovery request
// and on the upgrade to the URL discovery gave; an unstated option's item
// is left out of both.
func TestOptionsThroughDiscovery(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	var uris []string
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				conn.SetDeadline(time.Now().Add(5 * time.Second))
				req, err := http.ReadRequest(bufio.NewReader(conn))
				if err != nil {
					return
				}
				mu.Lock()
				uris = append(uris, req.RequestURI)
				mu.Unlock()
				if req.URL.Path == "/json/version" {
					body := fmt.Sprintf(`{"webSocketDebuggerUrl":"ws://%s/devtools/browser/abc?own=1"}`, req.Host)
					fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Length:%d\r\nContent-Type:application/json\r\n\r\n%s", len(body), body)
					return
				}
				fmt.Fprintf(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", AcceptFor(req.Header.Get("Sec-WebSocket-Key")))
				conn.Read(make([]byte, 1))
			}()
		}
	}()
	c := Config{Name: "disc", URL: "http://" + ln.Addr().String() + "/?token=t&stealth={bf.option.stealth}&country={bf.option.proxy_country}",
		Supports: []string{"stealth", "proxy_country"}, OptionMap: map[string]map[string]string{"stealth": {"true": "on"}}}
	p, err := New(c, Defaults{ConnectTimeout: 5 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !p.UsesOptions() {
		t.Fatal("UsesOptions")
	}
	s, _, err := options.FromRequest("bf_stealth=true", nil)
	if err != nil {
		t.Fatal(err)
	}
	replace := func(v string) string { return p.Honours().Replace(s, v) }
	res := p.Connect(context.Background(), &Handshake{Key: NewKey(), Header: http.Header{}}, replace)
	if res.Conn != nil {
		defer res.Conn.Close()
	}
	if res.Outcome.Kind != Success {
		t.Fatalf("outcome %s (%v)", res.Outcome.Word, res.Outcome.Err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(uris) != 2 {
		t.Fatalf("requests %q", uris)
	}
	for i, want := range []url.Values{{"token": {"t"}, "stealth": {"on"}}, {"token": {"t"}, "stealth": {"on"}, "own": {"1"}}} {
		u, _ := url.ParseRequestURI(uris[i])
		if u.Query().Encode() != want.Encode() {
			t.Errorf("request %d: %s, want the query %s", i, uris[i], want.Encode())
		}
	}
}

func TestOptionRenderingHelpers(t *testing.T) {
	q := url.Values{"a": {"1"}, "s": {"{bf.option.stealth}"}, "r": {"x-{bf.option.region}"}}
	got := renderQuery(q, unstated)
	if got.Encode() != "a=1&r=x-" {
		t.Fatalf("renderQuery: %s (an item left empty is dropped; one with text around stays)", got.Encode())
	}
	if v, ok := headerValue("{bf.option.stealth}", unstated); ok || v != "" {
		t.Fatal("an unset option's header is sent")
	}
	if v, ok := headerValue("plain", unstated); !ok || v != "plain" {
		t.Fatal("a plain header")
	}
	if fillString("{bf.option.stealth}", unstated) != nil || fillString("{bf.option.stealth}", func(string) string { return "true" }) != true {
		t.Fatal("fillString")
	}
	if fillString("{env.X}", nil) != "{env.X}" {
		t.Fatal("fillString of another placeholder")
	}
}
