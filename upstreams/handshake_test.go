package upstreams

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
)

func mustProvider(t *testing.T, o Config, d Defaults) *Provider {
	t.Helper()
	p, err := New(o, d, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// parseRequest reads back a request appendRequest wrote.
func parseRequest(t *testing.T, b []byte) *http.Request {
	t.Helper()
	r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(string(b))))
	if err != nil {
		t.Fatalf("%v in %q", err, b)
	}
	return r
}

func TestWSTarget(t *testing.T) {
	cases := []struct {
		url, clientQuery string
		pass             bool
		want             string
	}{
		{"ws://h/p?b=2&a=1", "x=9", false, "/p?b=2&a=1"},
		{"ws://h/p?b=2&a=1", "x=9", true, "/p?a=1&b=2&x=9"},
		{"ws://h/p?token=mine", "token=theirs&y=1", true, "/p?token=mine&y=1"},
		{"ws://h/", "", true, "/"},
		{"ws://h", "q=1", true, "/?q=1"},
	}
	for _, tc := range cases {
		p := mustProvider(t, Config{Name: "p", URL: tc.url, PassQuery: tc.pass}, Defaults{})
		got := p.own().wsTarget(&Handshake{RawQuery: tc.clientQuery}, p.path, p.query, p.rawQuery, p.host).requestURI
		if got != tc.want {
			t.Errorf("%s + %q (pass_query %v): %q, want %q", tc.url, tc.clientQuery, tc.pass, got, tc.want)
		}
	}
}

func TestAppendRequestHeaders(t *testing.T) {
	client := http.Header{
		"Connection":               {"Upgrade, X-Hop"},
		"Upgrade":                  {"websocket"},
		"X-Hop":                    {"drop me"},
		"Keep-Alive":               {"timeout=5"},
		"Authorization":            {"Bearer for-the-gateway"},
		"Proxy-Authorization":      {"Basic eA=="},
		"Origin":                   {"http://evil.example"},
		"Sec-Websocket-Protocol":   {"cdp"},
		"Sec-Websocket-Extensions": {"permessage-deflate"},
		"User-Agent":               {"Playwright/1.64.0"},
		"Cookie":                   {"a=b"},
	}
	hs := &Handshake{Key: NewKey(), Header: client}

	// User info becomes Basic auth; the client's credentials stay behind.
	p := mustProvider(t, Config{Name: "p", URL: "ws://user:pa%40ss@h:9/x"}, Defaults{})
	r := parseRequest(t, p.own().appendRequest(nil, hs, target{host: "h:9", requestURI: "/x"}, nil))
	if u, pw, ok := r.BasicAuth(); !ok || u != "user" || pw != "pa@ss" {
		t.Fatalf("basic auth %q %q %v", u, pw, ok)
	}
	for _, k := range []string{"X-Hop", "Keep-Alive", "Proxy-Authorization", "Origin", "Cookie"} {
		if r.Header.Get(k) != "" {
			t.Errorf("%s forwarded", k)
		}
	}
	for _, k := range []string{"Sec-Websocket-Protocol", "Sec-Websocket-Extensions", "User-Agent"} {
		if r.Header.Get(k) != client.Get(k) {
			t.Errorf("%s not forwarded as is: %q", k, r.Header.Get(k))
		}
	}
	if r.Header.Get("Sec-Websocket-Key") != hs.Key || r.Header.Get("Sec-Websocket-Version") != "13" ||
		r.Header.Get("Upgrade") != "websocket" || r.Host != "h:9" {
		t.Fatalf("handshake fields %v host %q", r.Header, r.Host)
	}

	// header_up: set Authorization (user info then not used), add, delete,
	// placeholders expanded, Origin set on purpose; Cookie forwarded by
	// forward_headers, then added to.
	p = mustProvider(t, Config{Name: "p", URL: "ws://user:pw@h:9/x", HeadersUp: []HeaderOp{
		{Op: "set", Field: "Authorization", Value: "Bearer {token}"},
		{Op: "add", Field: "Cookie", Value: "c=d"},
		{Op: "delete", Field: "User-Agent"},
		{Op: "set", Field: "Origin", Value: "http://127.0.0.1"},
	}}, Defaults{ForwardHeaders: []string{"cookie"}})
	replace := func(s string) string { return strings.ReplaceAll(s, "{token}", "t0k") }
	r = parseRequest(t, p.own().appendRequest(nil, hs, target{host: "h:9", requestURI: "/x"}, replace))
	if r.Header.Get("Authorization") != "Bearer t0k" || len(r.Header.Values("Authorization")) != 1 {
		t.Fatalf("authorization %v", r.Header.Values("Authorization"))
	}
	if strings.Join(r.Header.Values("Cookie"), ";") != "a=b;c=d" || r.Header.Get("User-Agent") != "" || r.Header.Get("Origin") != "http://127.0.0.1" {
		t.Fatalf("header_up result %v", r.Header)
	}
}

func TestRedact(t *testing.T) {
	cases := map[string]string{
		"wss://connect.example.com/?apiKey=abc": "wss://connect.example.com/?apiKey=REDACTED",
		"wss://u:p@h/x?a=1&b=2&a=3":             "wss://REDACTED@h/x?a=REDACTED&b=REDACTED&a=REDACTED",
		"http://127.0.0.1:9222":                 "http://127.0.0.1:9222",
		"ws://h/?flag":                          "ws://h/?REDACTED",
		"ws://h/?s3cr3t&a=1":                    "ws://h/?REDACTED&a=REDACTED",
		"ws://h/?a=1&&=x":                       "ws://h/?a=REDACTED&=REDACTED",
		"ws://h/p?token=%2Fsecret%3D&x=y#frag":  "ws://h/p?token=REDACTED&x=REDACTED",
	}
	for in, want := range cases {
		if got := RedactString(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}
