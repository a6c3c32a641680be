package upstreams

import (
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
)

// websocketGUID is the fixed GUID of RFC 6455 section 1.3.
const websocketGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// Handshake is a client's WebSocket upgrade, checked and ready to be sent to
// any provider.
type Handshake struct {
	// Key is the Sec-WebSocket-Key the provider will see: the client's own,
	// or a fresh one for HTTP/2 and HTTP/3 extended CONNECT clients.
	Key string
	// Header is the client's request header.
	Header http.Header
	// RawQuery is the client's query, for pass_query.
	RawQuery string
	// ExtendedConnect is set for HTTP/2 and HTTP/3 clients (RFC 8441/9220):
	// they are answered 200 instead of 101 and speak frames on the stream.
	ExtendedConnect bool
}

// CheckError is a malformed upgrade: the client gets Status and the message.
type CheckError struct {
	// Status is 400 or 426.
	Status int
	// Msg says what is wrong with the upgrade.
	Msg string
}

func (e *CheckError) Error() string { return e.Msg }

// IsUpgrade reports whether r asks for a WebSocket: an HTTP/1.1 upgrade
// (Connection has the upgrade token, Upgrade has websocket) or an HTTP/2 or
// HTTP/3 extended CONNECT with the websocket protocol.
func IsUpgrade(r *http.Request) bool {
	if isExtendedConnect(r) {
		return true
	}
	return headerHasToken(r.Header, "Connection", "upgrade") && headerHasToken(r.Header, "Upgrade", "websocket")
}

func isExtendedConnect(r *http.Request) bool {
	if r.Method != http.MethodConnect {
		return false
	}
	switch r.ProtoMajor {
	case 2:
		return strings.EqualFold(r.Header.Get(":protocol"), "websocket")
	case 3:
		return strings.EqualFold(r.Proto, "websocket")
	}
	return false
}

// Check validates an upgrade request (one for which IsUpgrade is true): not
// GET or no valid key (base64 of 16 bytes) gives 400, another version than 13
// gives 426.
func Check(r *http.Request) (*Handshake, error) {
	hs := &Handshake{Header: r.Header, RawQuery: r.URL.RawQuery}
	if isExtendedConnect(r) {
		if v := r.Header.Get("Sec-WebSocket-Version"); v != "" && v != "13" {
			return nil, &CheckError{Status: http.StatusUpgradeRequired, Msg: "unsupported Sec-WebSocket-Version: only 13 is supported"}
		}
		hs.ExtendedConnect = true
		hs.Key = NewKey()
		return hs, nil
	}
	if r.Method != http.MethodGet {
		return nil, &CheckError{Status: http.StatusBadRequest, Msg: "a WebSocket upgrade must be a GET request"}
	}
	keys := r.Header.Values("Sec-WebSocket-Key")
	if len(keys) != 1 || !validKey(keys[0]) {
		return nil, &CheckError{Status: http.StatusBadRequest, Msg: "missing or invalid Sec-WebSocket-Key"}
	}
	if v := r.Header.Values("Sec-WebSocket-Version"); len(v) != 1 || strings.TrimSpace(v[0]) != "13" {
		return nil, &CheckError{Status: http.StatusUpgradeRequired, Msg: "unsupported Sec-WebSocket-Version: only 13 is supported"}
	}
	hs.Key = keys[0]
	return hs, nil
}

// validKey reports whether k is the base64 encoding of 16 bytes.
func validKey(k string) bool {
	k = strings.TrimSpace(k)
	if len(k) != 24 {
		return false
	}
	b, err := base64.StdEncoding.DecodeString(k)
	return err == nil && len(b) == 16
}

// NewKey returns a fresh Sec-WebSocket-Key.
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.StdEncoding.EncodeToString(b[:])
}

// AcceptFor computes the Sec-WebSocket-Accept a server must answer to key.
func AcceptFor(key string) string {
	h := sha1.New()
	h.Write([]byte(key))
	h.Write([]byte(websocketGUID))
	return base64.StdEncoding.EncodeToString(h.Sum(nil))
}

// headerHasToken reports whether any value of field holds token in its
// comma-separated list (case-insensitive).
func headerHasToken(h http.Header, field, token string) bool {
	for _, v := range h[textproto.CanonicalMIMEHeaderKey(field)] {
		for v != "" {
			var t string
			t, v, _ = strings.Cut(v, ",")
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// HopByHop reports whether the canonical header name k belongs to one
// connection only (RFC 9110 section 7.6.1) and is never passed on as is.
func HopByHop(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// target is where one attempt goes: host header, request URI.
type target struct {
	host       string
	requestURI string
}

// wsTarget is where the upgrade goes: path and query (the endpoint's, or
// the discovered ones), with the client's query merged in under
// pass_query (the provider's keys win). rawQuery, when set, is query as
// written, sent as is when nothing is merged.
func (u *upgrader) wsTarget(hs *Handshake, path string, query url.Values, rawQuery, host string) target {
	uri := path
	if u.p.conf.PassQuery && hs.RawQuery != "" {
		if cq, err := url.ParseQuery(hs.RawQuery); err == nil && len(cq) > 0 {
			q := make(url.Values, len(query)+len(cq))
			for k, v := range cq {
				q[k] = v
			}
			for k, v := range query {
				q[k] = v
			}
			return target{host: host, requestURI: uri + "?" + q.Encode()}
		}
	}
	switch {
	case rawQuery != "":
		uri += "?" + rawQuery
	case len(query) > 0:
		uri += "?" + query.Encode()
	}
	return target{host: host, requestURI: uri}
}

// appendRequest writes the upstream upgrade request to buf: the client's
// fields that forwards allows (forward.go), the endpoint URL's user info
// as Basic auth, then the provider's header_up operations. replace expands
// request placeholders in header_up values (nil: none).
func (u *upgrader) appendRequest(buf []byte, hs *Handshake, t target, replace func(string) string) []byte {
	p := u.p
	// Fields named in the client's Connection header are hop-by-hop too.
	var connNamed map[string]bool
	for _, v := range hs.Header["Connection"] {
		for _, f := range strings.Split(v, ",") {
			f = textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(f))
			if f != "" && f != "Upgrade" {
				if connNamed == nil {
					connNamed = map[string]bool{}
				}
				connNamed[f] = true
			}
		}
	}
	start := func(host string) {
		buf = append(buf, "GET "...)
		buf = append(buf, t.requestURI...)
		buf = append(buf, " HTTP/1.1\r\nHost: "...)
		buf = append(buf, host...)
		buf = append(buf, "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: "...)
		buf = append(buf, hs.Key...)
		buf = append(buf, "\r\nSec-WebSocket-Version: 13\r\n"...)
	}
	if len(p.headerOps) == 0 {
		start(t.host)
		for k, vs := range hs.Header {
			if !p.forward.forwards(k) || connNamed[k] || (k == "Authorization" && u.basicAuth != "") {
				continue
			}
			for _, v := range vs {
				buf = appendField(buf, k, v)
			}
		}
		if u.basicAuth != "" {
			buf = appendField(buf, "Authorization", u.basicAuth)
		}
		return append(buf, "\r\n"...)
	}

	// With header_up, build the forwarded set first, then apply the
	// operations in order.
	h := make(http.Header, len(hs.Header)+2)
	for k, vs := range hs.Header {
		if !p.forward.forwards(k) || connNamed[k] {
			continue
		}
		h[k] = vs
	}
	if u.basicAuth != "" && !p.setsAuth {
		h["Authorization"] = []string{u.basicAuth}
	}
	for _, op := range p.headerOps {
		v, send := headerValue(op.Value, replace)
		if !send && op.Op != "delete" {
			continue
		}
		k := textproto.CanonicalMIMEHeaderKey(op.Field)
		switch op.Op {
		case "set":
			h[k] = []string{v}
		case "add":
			h[k] = append(h[k][:len(h[k]):len(h[k])], v)
		case "delete":
			delete(h, k)
		}
	}
	host := t.host
	if v := h.Get("Host"); v != "" && !strings.ContainsAny(v, "\r\n ") {
		host = v
	}
	start(host)
	for k, vs := range h {
		switch k {
		case "Host", "Upgrade", "Connection", "Sec-Websocket-Key", "Sec-Websocket-Version", "Content-Length", "Transfer-Encoding":
			continue // the gateway owns the framing of the handshake
		}
		for _, v := range vs {
			buf = appendField(buf, k, v)
		}
	}
	return append(buf, "\r\n"...)
}

func appendField(buf []byte, k, v string) []byte {
	// A value with a line break would split the request: drop it.
	if strings.ContainsAny(v, "\r\n") || strings.ContainsAny(k, "\r\n: ") {
		return buf
	}
	buf = append(buf, k...)
	buf = append(buf, ": "...)
	buf = append(buf, v...)
	return append(buf, "\r\n"...)
}
