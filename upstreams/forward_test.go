package upstreams

import (
	"net/http"
	"slices"
	"strings"
	"testing"
)

// gatewayClient is a client handshake carrying what a gateway user sends:
// cookies of a forward_auth login, the gateway's own token, an API key
// for the gateway, a custom header, and what the browser tools send.
func gatewayClient() http.Header {
	return http.Header{
		"Connection":                  {"Upgrade"},
		"Upgrade":                     {"websocket"},
		"Sec-Websocket-Key":           {"dGhlIHNhbXBsZSBub25jZQ=="},
		"Sec-Websocket-Version":       {"13"},
		"Sec-Websocket-Protocol":      {"cdp"},
		"Sec-Websocket-Extensions":    {"permessage-deflate; client_max_window_bits"},
		"User-Agent":                  {"Playwright/1.64.0 (x64; linux) node/22"},
		"X-Playwright-Browser":        {"chromium"},
		"X-Playwright-Launch-Options": {`{"headless":true}`},
		"Cookie":                      {"session=forward-auth-login"},
		"Authorization":               {"Bearer for-the-gateway"},
		"X-Gateway-Token":             {"gateway-token-1"},
		"X-Api-Key":                   {"sk-for-the-gateway"},
		"X-Custom":                    {"custom-1"},
		"X-Trace-Id":                  {"trace-1"},
		"X-Trace-Span":                {"span-1"},
		"Origin":                      {"http://app.example"},
		"Proxy-Authorization":         {"Basic eA=="},
		"Keep-Alive":                  {"timeout=5"},
		"Accept-Language":             {"en"},
	}
}

// sentFields lists the fields of the upstream request p builds for the
// client, canonical and sorted, besides those the gateway always writes.
func sentFields(t *testing.T, p *Provider, client http.Header) (http.Header, []string) {
	t.Helper()
	hs := &Handshake{Key: NewKey(), Header: client}
	r := parseRequest(t, p.own().appendRequest(nil, hs, target{host: "h:9", requestURI: "/x"}, nil))
	var names []string
	for k := range r.Header {
		switch k {
		case "Upgrade", "Connection", "Sec-Websocket-Key", "Sec-Websocket-Version":
			continue
		}
		names = append(names, k)
	}
	slices.Sort(names)
	return r.Header, names
}

// TestForwardHeadersDefault: a provider gets, of the client's handshake,
// exactly the WebSocket negotiation fields, User-Agent and the
// x-playwright-* fields, with their values as sent.
func TestForwardHeadersDefault(t *testing.T) {
	client := gatewayClient()
	for _, withOps := range []bool{false, true} {
		o := Config{Name: "p", URL: "ws://h:9/x"}
		if withOps {
			// The header_up path builds the set the same way.
			o.HeadersUp = []HeaderOp{{Op: "set", Field: "X-Provider", Value: "v"}}
		}
		h, names := sentFields(t, mustProvider(t, o, Defaults{}), client)
		want := []string{"Sec-Websocket-Extensions", "Sec-Websocket-Protocol", "User-Agent", "X-Playwright-Browser", "X-Playwright-Launch-Options"}
		if withOps {
			want = append(want, "X-Provider")
			slices.Sort(want)
		}
		if !slices.Equal(names, want) {
			t.Errorf("header_up %v: the provider got %v, want exactly %v", withOps, names, want)
		}
		for _, k := range want {
			if k != "X-Provider" && strings.Join(h.Values(k), "|") != strings.Join(client.Values(k), "|") {
				t.Errorf("%s = %q, want %q", k, h.Values(k), client.Values(k))
			}
		}
	}
}

// TestForwardHeadersNamed: forward_headers with a name (any case) and a
// prefix adds exactly those; Authorization and Origin go only when named
// in full; user info in the provider URL still wins over a forwarded
// Authorization; "*" forwards everything but them and hop-by-hop fields.
func TestForwardHeadersNamed(t *testing.T) {
	client := gatewayClient()
	base := []string{"Sec-Websocket-Extensions", "Sec-Websocket-Protocol", "User-Agent", "X-Playwright-Browser", "X-Playwright-Launch-Options"}
	with := func(extra ...string) []string {
		out := append(slices.Clone(base), extra...)
		slices.Sort(out)
		return out
	}
	cases := []struct {
		name    string
		url     string
		forward []string
		want    []string
	}{
		{"name and prefix", "ws://h:9/x", []string{"x-custom", "X-TRACE-*"}, with("X-Custom", "X-Trace-Id", "X-Trace-Span")},
		{"a prefix never takes authorization or origin", "ws://h:9/x", []string{"*"},
			with("Accept-Language", "Cookie", "X-Api-Key", "X-Custom", "X-Gateway-Token", "X-Trace-Id", "X-Trace-Span")},
		{"named in full", "ws://h:9/x", []string{"Authorization", "origin", "Cookie"}, with("Authorization", "Cookie", "Origin")},
		{"user info wins", "ws://u:p@h:9/x", []string{"Authorization"}, with("Authorization")},
		{"always-forwarded named again", "ws://h:9/x", []string{"User-Agent", "x-playwright-*"}, with()},
	}
	for _, tc := range cases {
		p := mustProvider(t, Config{Name: "p", URL: tc.url}, Defaults{ForwardHeaders: tc.forward})
		h, names := sentFields(t, p, client)
		if !slices.Equal(names, tc.want) {
			t.Errorf("%s: the provider got %v, want exactly %v", tc.name, names, tc.want)
		}
		if tc.url == "ws://u:p@h:9/x" {
			if u, pw, ok := (&http.Request{Header: h}).BasicAuth(); !ok || u != "u" || pw != "p" || len(h.Values("Authorization")) != 1 {
				t.Errorf("%s: Authorization %q", tc.name, h.Values("Authorization"))
			}
		}
	}
	// header_up on top of forward_headers: still sets and removes anything.
	p := mustProvider(t, Config{Name: "p", URL: "ws://h:9/x",
		HeadersUp: []HeaderOp{{Op: "delete", Field: "Cookie"}, {Op: "set", Field: "X-Gateway-Token", Value: "{copied}"}}},
		Defaults{ForwardHeaders: []string{"X-Api-Key", "Cookie"}})
	hs := &Handshake{Key: NewKey(), Header: client}
	r := parseRequest(t, p.own().appendRequest(nil, hs, target{host: "h:9", requestURI: "/x"},
		func(s string) string { return strings.ReplaceAll(s, "{copied}", client.Get("X-Gateway-Token")) }))
	if r.Header.Get("Cookie") != "" || r.Header.Get("X-Api-Key") != "sk-for-the-gateway" || r.Header.Get("X-Gateway-Token") != "gateway-token-1" {
		t.Errorf("header_up over forward_headers: %v", r.Header)
	}
}

func TestCheckForwardHeaders(t *testing.T) {
	for _, ok := range [][]string{nil, {"Cookie"}, {"x-api-key", "X-Trace-*"}, {"*"}, {"Authorization"}} {
		if err := CheckForwardHeaders(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for bad, want := range map[string]string{
		"":                    "empty field name",
		"X Bad":               "is not a header field name",
		"X:Bad":               "is not a header field name",
		"X-*-Mid":             "is not a header field name",
		"X**":                 "is not a header field name",
		"Connection":          "never forwarded",
		"keep-alive":          "never forwarded",
		"Host":                "never forwarded",
		"Sec-WebSocket-Key":   "never forwarded",
		"proxy-authorization": "never forwarded",
	} {
		err := CheckForwardHeaders([]string{bad})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error with %q", bad, err, want)
		}
	}
	if _, err := New(Config{Name: "p", URL: "ws://h/"}, Defaults{ForwardHeaders: []string{"Upgrade"}}, nil); err == nil || !strings.Contains(err.Error(), `provider "p"`) {
		t.Errorf("New with a hop-by-hop field: %v", err)
	}
}
