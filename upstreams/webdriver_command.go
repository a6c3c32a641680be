package upstreams

// WebDriver over HTTP, after the create: each command sent on to the
// provider's session, and the session's BiDi or CDP socket.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
)

var (
	// ErrCommandPath is a command path the gateway does not send on: one
	// whose segments climb out of the session ("..", "." or an escaped
	// slash), or one holding a query, a fragment, a space or a control
	// byte. The client gets "invalid argument"; the provider hears nothing.
	ErrCommandPath = errors.New("not a WebDriver command path")
	// ErrCommandTooLarge is a command body over MaxWebDriverCommand.
	ErrCommandTooLarge = fmt.Errorf("the command body is larger than %d bytes", MaxWebDriverCommand)
)

// MaxBufferedCommand is how much of a command body of unknown length
// (a chunked request) the gateway reads before it sends the command on:
// a body that ends within it goes to the provider with its length
// (chromedriver refuses chunked bodies); a longer one is streamed to the
// provider as it comes, chunked. No command holds more of its body.
const MaxBufferedCommand = 1 << 20

// sizedBody is a command body whose length is known.
type sizedBody struct {
	r io.Reader
	n int64
}

func (b *sizedBody) Read(p []byte) (int, error) { return b.r.Read(p) }

// CommandBody is a command's body r of length n (a request's
// ContentLength; -1: unknown), for WebDriverCommand: a known length is
// streamed with it, as chromedriver wants (it refuses chunked bodies); of
// an unknown one up to MaxBufferedCommand is read first, sent with its
// length when the body ends there, and else streamed on, chunked.
func CommandBody(r io.Reader, n int64) io.Reader { return &sizedBody{r: r, n: n} }

// checkCommandPath checks rest, a command's escaped path after
// /session/<id> ("" or starting with "/").
func checkCommandPath(rest string) error {
	if rest == "" {
		return nil
	}
	if rest[0] != '/' || strings.IndexFunc(rest, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '?' || r == '#' || r == '\\' }) >= 0 {
		return ErrCommandPath
	}
	for _, seg := range strings.Split(rest[1:], "/") {
		dec, err := url.PathUnescape(seg)
		if err != nil || dec == "." || dec == ".." || strings.ContainsAny(dec, "/\\") {
			return ErrCommandPath
		}
	}
	return nil
}

// WebDriverCommand sends one command of session s to p: method, the
// path <base>/session/<provider's ID><rest> (rest is the escaped path
// after the client's /session/<id>: "" or starting with "/"), the query
// rawQuery (the provider URL's own items merged in, its keys winning) and
// body (nil: none; see CommandBody), as they are, with the provider's
// credentials (its URL's user info as Basic auth, header_up as resolved
// at the create), on the provider's kept-alive connections. It is bounded
// by ctx only: a command such as a page load may take long. The answer is
// the provider's (the caller relays its status, Content-Type and body,
// and closes it). The error is a *CommandError when the provider could not
// be reached, or says the command could not be sent (ErrCommandPath,
// ErrCommandTooLarge); its text never names a URL, an address or a
// credential.
func (p *Provider) WebDriverCommand(ctx context.Context, s *WebDriverSession, method, rest, rawQuery string, body io.Reader) (*http.Response, error) {
	if p.wd == nil || s == nil {
		return nil, fmt.Errorf("provider %q is not a webdriver provider", p.Name)
	}
	if err := checkCommandPath(rest); err != nil {
		return nil, err
	}
	if strings.IndexFunc(rawQuery, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '#' }) >= 0 {
		return nil, ErrCommandPath
	}
	if err := checkMethod(method); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCommandPath, err)
	}
	n := int64(-1)
	var bounded *boundedBody // a body streamed chunked (nil: none)
	if b, ok := body.(*sizedBody); ok {
		body, n = b.r, b.n
	}
	if body == http.NoBody {
		body = nil
	}
	switch {
	case body == nil:
		n = 0
	case n > MaxWebDriverCommand:
		return nil, ErrCommandTooLarge
	case n < 0:
		head, err := readUpTo(body, MaxBufferedCommand)
		if err != nil {
			return nil, fmt.Errorf("reading the command body: %w", err)
		}
		if len(head) <= MaxBufferedCommand {
			body, n = bytes.NewReader(head), int64(len(head))
			break
		}
		// Longer: what was read and the rest go on as they come,
		// chunked, within MaxWebDriverCommand.
		bounded = &boundedBody{r: io.MultiReader(bytes.NewReader(head), body), left: MaxWebDriverCommand}
		body = bounded
	}
	req, err := http.NewRequestWithContext(ctx, method, p.wd.url("/session/"+url.PathEscape(s.ID)+rest, rawQuery), nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrCommandPath, urlErrorCause(err))
	}
	header := s.header
	if header == nil {
		header = p.wd.header(nil)
	}
	setHeader(req, header)
	if n != 0 {
		// n < 0: a streamed body, sent chunked.
		req.Body, req.ContentLength = io.NopCloser(body), n
		req.Header.Set("Content-Type", "application/json; charset=utf-8")
	}
	resp, err := p.wd.client.Do(req)
	if bounded != nil {
		if bounded.over.Load() {
			// The provider heard a request cut short.
			if resp != nil {
				resp.Body.Close()
			}
			return nil, ErrCommandTooLarge
		}
		if rerr := bounded.readErr(); err != nil && rerr != nil {
			// The client's body broke off, not the provider.
			return nil, fmt.Errorf("reading the command body: %w", rerr)
		}
	}
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its text names the URL
		}
		word, _ := ClassifyError(err, errors.Is(ctx.Err(), context.Canceled))
		return nil, &CommandError{Provider: p.Name, Word: word, Err: err}
	}
	return resp, nil
}

// readUpTo reads r until it ends or more than max bytes were read: the
// bytes read (max+1 of them when r holds more), in a buffer that grows
// with them, never beyond max+1.
func readUpTo(r io.Reader, max int) ([]byte, error) {
	b := make([]byte, 0, min(4<<10, max+1))
	for len(b) <= max {
		if len(b) == cap(b) {
			b = append(make([]byte, 0, min(2*cap(b), max+1)), b...)
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return nil, err
		}
	}
	return b, nil
}

// boundedBody is a command body streamed to the provider as it comes:
// past left bytes its read fails (and the request to the provider with
// it), and over tells so. The transport reads it in a goroutine of its
// own; over and the read error are read after the call.
type boundedBody struct {
	r    io.Reader
	left int64
	over atomic.Bool
	err  atomic.Pointer[error] // the client's read error, not io.EOF
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.over.Load() {
		return 0, ErrCommandTooLarge
	}
	if int64(len(p)) > b.left+1 {
		// One byte more than allowed tells a body at the bound from a
		// larger one.
		p = p[:b.left+1]
	}
	n, err := b.r.Read(p)
	if int64(n) > b.left {
		b.over.Store(true)
		return int(b.left), ErrCommandTooLarge
	}
	b.left -= int64(n)
	if err != nil && err != io.EOF {
		b.err.Store(&err)
	}
	return n, err
}

// readErr is the error the client's body failed with (nil: none).
func (b *boundedBody) readErr() error {
	if e := b.err.Load(); e != nil {
		return *e
	}
	return nil
}

// CommandError is a command the provider could not be reached for. Its
// text names the provider and the outcome word only, so that a client may
// be told it; the cause (Unwrap), for logs, may name the provider's
// address.
type CommandError struct {
	Provider string
	// Word is the outcome word of the cause (refused, timeout, reset,
	// tls_error, client_gone …).
	Word string
	Err  error
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("provider %q could not be reached (%s)", e.Provider, e.Word)
}

func (e *CommandError) Unwrap() error { return e.Err }

// WebDriverSocket opens session s's BiDi socket (cdp false: the
// provider's webSocketUrl) or its CDP socket (cdp true: se:cdp) for the
// client's upgrade hs, as Reconnect dials a resume point: one upgrade
// within p.ConnectTimeout (or ctx's earlier deadline), the client's
// negotiation fields and the provider's credentials (Basic auth,
// header_up resolved with replace), never the client's Authorization. A
// session without that socket fails with WordBadConnectURL.
func (p *Provider) WebDriverSocket(ctx context.Context, hs *Handshake, s *WebDriverSession, cdp bool, replace func(string) string) (res Result) {
	start := time.Now()
	defer func() { res.Outcome.Elapsed = time.Since(start) }()
	raw, name := s.socket, "webSocketUrl"
	if cdp {
		raw, name = s.cdp, "se:cdp"
	}
	if p.wd == nil || raw == "" {
		err := fmt.Errorf("%w: the session has no %s socket", errBadConnectURL, name)
		if s.sockErr != nil {
			err = fmt.Errorf("%w: %w", errBadConnectURL, s.sockErr)
		}
		return Result{Outcome: Outcome{Word: WordBadConnectURL, Kind: Failure, Err: err}}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return Result{Outcome: Outcome{Word: WordBadConnectURL, Kind: Failure, Err: fmt.Errorf("%w: %s", errBadConnectURL, urlErrorCause(err))}}
	}
	t, err := p.retarget(raw)
	if err != nil {
		return Result{Outcome: Outcome{Word: WordBadConnectURL, Kind: Failure, Err: err}}
	}
	// The socket is the provider's own: its credentials go with it.
	t.basicAuth = p.basicAuth
	actx, deadline, cancel := within(ctx, start, p.ConnectTimeout)
	defer cancel()
	if _, ok := hs.Header["Authorization"]; ok {
		// The client's credential for the gateway, whatever
		// forward_headers says.
		c := *hs
		c.Header = hs.Header.Clone()
		c.Header.Del("Authorization")
		hs = &c
	}
	return t.upgrade(ctx, actx, deadline, hs, target{host: u.Host, requestURI: u.RequestURI()}, replace)
}

// setHeader puts h on req (a Host field sets the request's Host).
func setHeader(req *http.Request, h http.Header) {
	for k, vs := range h {
		if k == "Host" {
			req.Host = vs[len(vs)-1]
			continue
		}
		req.Header[k] = vs
	}
	req.Header.Set("Accept", "application/json")
}
