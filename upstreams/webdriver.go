package upstreams

// WebDriver over HTTP, the client's side: the create request a client
// sends (POST <base>/session) and the errors the gateway answers in
// WebDriver's own JSON.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

const (
	// MaxWebDriverCreate bounds a create request's body; a larger one is
	// an invalid argument.
	MaxWebDriverCreate = 1 << 20
	// MaxWebDriverCommand bounds a command's body, streamed to the
	// provider.
	MaxWebDriverCommand = 64 << 20
	// ExtensionPrefix starts the capabilities that are the gateway's own
	// (such as bf:options): read by the gateway, never sent to a provider.
	ExtensionPrefix = "bf:"
)

// W3C WebDriver error codes the gateway answers with.
const (
	ErrCodeSessionNotCreated    = "session not created"
	ErrCodeInvalidSessionID     = "invalid session id"
	ErrCodeInvalidArgument      = "invalid argument"
	ErrCodeUnknownError         = "unknown error"
	ErrCodeUnknownCommand       = "unknown command"
	ErrCodeUnsupportedOperation = "unsupported operation"
)

// webDriverStatus is the HTTP status of each W3C WebDriver error code.
var webDriverStatus = map[string]int{
	"element click intercepted": http.StatusBadRequest,
	"element not interactable":  http.StatusBadRequest,
	"insecure certificate":      http.StatusBadRequest,
	ErrCodeInvalidArgument:      http.StatusBadRequest,
	"invalid cookie domain":     http.StatusBadRequest,
	"invalid element state":     http.StatusBadRequest,
	"invalid selector":          http.StatusBadRequest,
	ErrCodeInvalidSessionID:     http.StatusNotFound,
	"javascript error":          http.StatusInternalServerError,
	"move target out of bounds": http.StatusInternalServerError,
	"no such alert":             http.StatusNotFound,
	"no such cookie":            http.StatusNotFound,
	"no such element":           http.StatusNotFound,
	"no such frame":             http.StatusNotFound,
	"no such window":            http.StatusNotFound,
	"no such shadow root":       http.StatusNotFound,
	"script timeout":            http.StatusInternalServerError,
	ErrCodeSessionNotCreated:    http.StatusInternalServerError,
	"stale element reference":   http.StatusNotFound,
	"detached shadow root":      http.StatusNotFound,
	"timeout":                   http.StatusInternalServerError,
	"unable to set cookie":      http.StatusInternalServerError,
	"unable to capture screen":  http.StatusInternalServerError,
	"unexpected alert open":     http.StatusInternalServerError,
	ErrCodeUnknownCommand:       http.StatusNotFound,
	ErrCodeUnknownError:         http.StatusInternalServerError,
	"unknown method":            http.StatusMethodNotAllowed,
	ErrCodeUnsupportedOperation: http.StatusInternalServerError,
}

// WebDriverErrorStatus is the HTTP status W3C WebDriver gives an error
// code (500 for a code it does not name).
func WebDriverErrorStatus(code string) int {
	if s, ok := webDriverStatus[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// WriteWebDriverError answers a WebDriver client with an error in the
// protocol's JSON, {"value":{"error":code,"message":message,
// "stacktrace":""}}, at the status the protocol gives code. Headers the
// caller set before (Retry-After) go along.
func WriteWebDriverError(w http.ResponseWriter, code, message string) {
	body, _ := json.Marshal(map[string]any{"value": map[string]string{
		"error": code, "message": message, "stacktrace": "",
	}})
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Del("Content-Length")
	w.WriteHeader(WebDriverErrorStatus(code))
	w.Write(body)
}

// InvalidSessionPeek is how much of a command answer's body
// IsInvalidSessionAnswer needs at most: the error code comes first in
// every driver's answer.
const InvalidSessionPeek = 4 << 10

// IsInvalidSessionAnswer reports whether a command's answer, of status
// and with body (its first bytes are enough: a prefix cut anywhere after
// the error code still tells), says "invalid session id": the provider
// ended the session itself.
func IsInvalidSessionAnswer(status int, body []byte) bool {
	if status != http.StatusNotFound {
		return false
	}
	code, ok := findPointer(body, "/value/error")
	return ok && code == ErrCodeInvalidSessionID
}

// CreateRequest is a client's create request (the body of POST
// <base>/session), checked: its alwaysMatch and firstMatch capabilities,
// without the gateway's own (bf:…), which are kept aside.
type CreateRequest struct {
	always map[string]json.RawMessage   // never nil
	first  []map[string]json.RawMessage // nil: none given
	ext    map[string]json.RawMessage   // the bf:… capabilities, alwaysMatch's first
}

// errCreateRequest is a create body that WebDriver calls an invalid
// argument.
var errCreateRequest = errors.New("invalid create request")

// ParseCreateRequest reads a create request's body: a JSON object whose
// "capabilities" member is an object, with an optional "alwaysMatch"
// object and an optional non-empty "firstMatch" array of objects that
// share no name with alwaysMatch (as WebDriver processes capabilities).
// Other members are not forwarded. A body over MaxWebDriverCreate is
// refused (read at most one byte more to tell). Its error's text fits the
// message of an "invalid argument" answer and never quotes the body.
func ParseCreateRequest(body []byte) (*CreateRequest, error) {
	bad := func(format string, args ...any) (*CreateRequest, error) {
		return nil, fmt.Errorf("%w: %s", errCreateRequest, fmt.Sprintf(format, args...))
	}
	if len(body) > MaxWebDriverCreate {
		return bad("the body is larger than %d bytes", MaxWebDriverCreate)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil || top == nil {
		return bad("the body is not a JSON object")
	}
	var caps map[string]json.RawMessage
	if raw, ok := top["capabilities"]; !ok || json.Unmarshal(raw, &caps) != nil || caps == nil {
		return bad(`the body has no "capabilities" object`)
	}
	r := &CreateRequest{always: map[string]json.RawMessage{}, ext: map[string]json.RawMessage{}}
	if raw, ok := caps["alwaysMatch"]; ok {
		if json.Unmarshal(raw, &r.always) != nil || r.always == nil {
			return bad(`"alwaysMatch" is not an object`)
		}
	}
	if raw, ok := caps["firstMatch"]; ok {
		if json.Unmarshal(raw, &r.first) != nil || len(r.first) == 0 {
			return bad(`"firstMatch" is not a non-empty array of objects`)
		}
		for i, m := range r.first {
			if m == nil {
				return bad(`"firstMatch" entry %d is not an object`, i)
			}
		}
	}
	// The gateway's own first: they are never forwarded, so they may be
	// in both.
	for _, m := range append([]map[string]json.RawMessage{r.always}, r.first...) {
		for k, v := range m {
			if strings.HasPrefix(k, ExtensionPrefix) {
				if _, seen := r.ext[k]; !seen {
					r.ext[k] = v
				}
				delete(m, k)
			}
		}
	}
	for i, m := range r.first {
		for k := range m {
			if _, dup := r.always[k]; dup {
				return bad(`"firstMatch" entry %d names %q, which "alwaysMatch" names too`, i, k)
			}
		}
	}
	return r, nil
}

// Browser is the browserName the request asks for first ("": any), for
// messages.
func (r *CreateRequest) Browser() string {
	if b := capString(r.always, "browserName"); b != "" {
		return b
	}
	for _, m := range r.first {
		if b := capString(m, "browserName"); b != "" {
			return b
		}
	}
	return ""
}

// Extension is the gateway capability name (such as "bf:options") as the
// client sent it, from alwaysMatch or else the first firstMatch entry
// naming it; nil when none did.
func (r *CreateRequest) Extension(name string) json.RawMessage { return r.ext[name] }

// capString is the string value of capability k in m ("" when absent or
// not a string).
func capString(m map[string]json.RawMessage, k string) string {
	var s string
	if raw, ok := m[k]; ok && json.Unmarshal(raw, &s) == nil {
		return s
	}
	return ""
}

// body is the create request as a provider gets it: the client's
// capabilities without the gateway's own, and caps (the provider's,
// placeholders resolved; nil: none) merged into alwaysMatch, where they
// win; a firstMatch entry loses the names caps sets, which alwaysMatch
// now holds.
func (r *CreateRequest) body(caps map[string]json.RawMessage) []byte {
	always := make(map[string]json.RawMessage, len(r.always)+len(caps))
	for k, v := range r.always {
		always[k] = v
	}
	for k, v := range caps {
		always[k] = v
	}
	out := map[string]any{"alwaysMatch": always}
	if r.first != nil {
		first := make([]map[string]json.RawMessage, len(r.first))
		for i, m := range r.first {
			e := make(map[string]json.RawMessage, len(m))
			for k, v := range m {
				if _, won := caps[k]; !won {
					e[k] = v
				}
			}
			first[i] = e
		}
		out["firstMatch"] = first
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(map[string]any{"capabilities": out})
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// asciiEqualFold compares a and b ignoring ASCII case only.
func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if asciiLowerByte(a[i]) != asciiLowerByte(b[i]) {
			return false
		}
	}
	return true
}

func asciiLowerByte(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// asciiLower is s with its ASCII letters in lower case.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		b[i] = asciiLowerByte(c)
	}
	return string(b)
}
