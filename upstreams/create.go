package upstreams

// The common create step. A creator is one way a provider session is made
// that the gateway must end itself: the REST session API's (create_rest.go)
// and WebDriver's (create_webdriver.go). Each says how its create call is
// refused, where its answer holds the session's ID, and how a session is
// released by that ID; what surrounds those is written here, once for
// both: the create inside the attempt's deadline, and on for the
// releaser's CreateGrace after it, so that a session made late is
// released, never lost; the orphans (an answer naming no session the
// gateway can release); the books; the ledger entry written before the
// session is handed on. The release itself, exactly once and off the
// request path, is release.go's. The third way a provider session is made,
// the WebSocket upgrade (dial.go), creates nothing to release.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// creator is one way a provider session is made over HTTP and released by
// its ID: *sessionAPI and *webDriver.
type creator interface {
	// keeper is where its sessions are counted and released.
	keeper() *sessionKeeper
	// refused is the outcome of a create answered with a status other
	// than 2xx; it reads what it needs of resp's body.
	refused(resp *http.Response) Result
	// read reads a 2xx create answer: raw is all of it, or what could be
	// read, and fault why it cannot be used ("": it can).
	read(raw []byte, fault string) answer
	// releaseCall is the call that ends session id, carrying fields.
	releaseCall(id string, fields []Header) (call, error)
	// adoptedFields are the fields of the release calls of a session
	// another process created (see Provider.Adopt): no request is there
	// to read, its placeholders known when the config loads are resolved
	// with known.
	adoptedFields(known func(string) string) []Header
}

// sessionKeeper is what every creator keeps its sessions with: the
// provider's name, the client its calls go over, the books they are
// counted in and the releaser that ends them.
type sessionKeeper struct {
	provider string
	client   *http.Client
	books    *Books
	rel      *Releaser
	// idInPath: the release call names the ID in its URL's path, so a
	// refused ID cannot be released safely; inPath says so, for the
	// orphan it then is.
	idInPath bool
	inPath   string
}

// newSessionKeeper is the keeper of provider's sessions, counted in
// d.Books and released by d.Releaser (nil: its own).
func newSessionKeeper(provider string, client *http.Client, d Defaults, idInPath bool, inPath string) sessionKeeper {
	k := sessionKeeper{provider: provider, client: client, books: d.Books, rel: d.Releaser, idInPath: idInPath, inPath: inPath}
	if k.books == nil {
		k.books = &Books{}
	}
	if k.rel == nil {
		k.rel = NewReleaser()
	}
	return k
}

func (k *sessionKeeper) keeper() *sessionKeeper { return k }

// orphan books a session a 2xx create answer may have made that cannot be
// released (its ID unknown), and tells its releaser's OnOrphan.
func (k *sessionKeeper) orphan(why string) {
	k.books.Orphans.Add(1)
	if f := k.rel.OnOrphan; f != nil {
		f(k.provider, why)
	}
}

// call is one HTTP call of a creator: its method, URL, header (a Host
// field sets the request's Host) and body (nil: none).
type call struct {
	method, url string
	header      http.Header
	body        []byte
}

// do makes c over client within ctx. Its error never names the URL.
func (c call) do(ctx context.Context, client *http.Client) (*http.Response, error) {
	var body io.Reader
	if c.body != nil {
		body = bytes.NewReader(c.body)
	}
	req, err := http.NewRequestWithContext(ctx, c.method, c.url, body)
	if err == nil {
		for k, vs := range c.header {
			if k == "Host" {
				req.Host = vs[len(vs)-1]
				continue
			}
			req.Header[k] = vs
		}
		var resp *http.Response
		if resp, err = client.Do(req); err == nil {
			return resp, nil
		}
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // its text names the URL
	}
	return nil, err
}

// fieldsHeader is the header of a session API call: Accept for JSON, and
// Content-Type for a JSON body, then fields in order (a field given
// again replaces the one before).
func fieldsHeader(fields []Header, hasBody bool) http.Header {
	h := http.Header{"Accept": {"application/json"}}
	if hasBody {
		h["Content-Type"] = []string{"application/json"}
	}
	for _, f := range fields {
		h.Set(f.Field, f.Value)
	}
	return h
}

// createCall is the create call of one attempt, prepared on the
// request's goroutine (its request placeholders are read there), and the
// fields the session's release calls carry.
type createCall struct {
	call
	release []Header
}

// answer is what a creator read in a 2xx create answer.
type answer struct {
	// id is the session's ID; "" when none could be read, noID says why.
	id, noID string
	// idAt is where the ID stood, for the orphan a refused one is.
	idAt string
	// fault is why the answer cannot be used all the same ("": it can).
	fault string
	// kept is what of the answer the creator hands on with the session.
	kept any
}

// made is what one create call gave: a session recorded in the ledger,
// with what its creator kept of the answer, or res.
type made struct {
	remote *Remote
	kept   any
	res    *Result // Kind 0: a transport error to classify
}

// createWithin makes one create call cc of c for an attempt that ends at
// deadline (actx; ctx is the client's) and hands what it made to use. The
// call is not cut when the attempt ends: it goes on for the releaser's
// CreateGrace, so that a session made after that is still learnt and
// released. From the call's start until what it made is settled
// (released, or handed on when use returns) it counts as pending for
// Releaser.Wait; once StopCreates is called no call starts, and a session
// made after it is released, not handed on.
func createWithin(ctx, actx context.Context, deadline time.Time, c creator, cc createCall, use func(made) Result) Result {
	rel := c.keeper().rel
	settled, ok := rel.startCreate()
	if !ok {
		return stoppedResult()
	}
	defer func() {
		if settled != nil {
			settled()
		}
	}()
	cctx, ccancel := context.WithDeadline(context.WithoutCancel(ctx), deadline.Add(rel.CreateGrace))
	answer := make(chan made, 1)
	go func() {
		defer ccancel()
		answer <- makeSession(cctx, c, cc)
	}()
	var m made
	select {
	case m = <-answer:
	case <-actx.Done():
		done := settled
		settled = nil
		go func() {
			// Release first: the release is pending before the create
			// stops being so.
			(<-answer).remote.Release()
			done()
		}()
		return errResult(ctx, actx.Err())
	}
	if m.res != nil {
		if m.res.Outcome.Kind == 0 {
			return errResult(ctx, m.res.Outcome.Err)
		}
		return *m.res
	}
	if rel.CreatesStopped() {
		m.remote.Release()
		return stoppedResult()
	}
	return use(m)
}

// makeSession makes the create call cc of c within ctx and reads its
// answer. A session the provider created is never lost: when the answer
// cannot be used but names a session ID, the session is released at
// once; when a 2xx answer names none the gateway can read, it is counted
// as an orphan. A session handed on is first recorded in the releaser's
// ledger: one the ledger does not name would outlive a crash of this
// process.
func makeSession(ctx context.Context, c creator, cc createCall) made {
	k := c.keeper()
	transport := func(err error) made {
		return made{res: &Result{Outcome: Outcome{Err: fmt.Errorf("create: %w", err)}}}
	}
	resp, err := cc.do(ctx, k.client)
	if err != nil {
		return transport(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		r := c.refused(resp)
		return made{res: &r}
	}
	// One byte more than the limit tells an answer at the limit from a
	// larger one.
	raw, rerr := io.ReadAll(io.LimitReader(resp.Body, MaxCreateAnswer+1))
	var fault string // why the answer cannot be used ("": it can)
	switch {
	case rerr != nil:
		fault = "the answer was cut short"
	case len(raw) > MaxCreateAnswer:
		fault = fmt.Sprintf("the answer is larger than %d bytes", MaxCreateAnswer)
		raw = raw[:MaxCreateAnswer]
	}
	a := c.read(raw, fault)
	failed := func(why string) made {
		if rerr != nil {
			return transport(fmt.Errorf("reading the answer: %w", rerr))
		}
		return made{res: &Result{Outcome: Outcome{Word: WordBadCreate, Kind: Failure, Err: fmt.Errorf("%w: %s", errBadCreate, why)}}}
	}
	if a.id == "" {
		k.orphan(a.noID)
		return failed(a.noID)
	}
	r := &Remote{by: c, id: a.id, headers: cc.release}
	if err := CheckSessionID(a.id); err != nil {
		// A release call would name something else than the session; it
		// is made only where the ID is escaped whole (a query, a body).
		if k.idInPath {
			k.orphan(fmt.Sprintf("%v (%s), and %s", err, a.idAt, k.inPath))
		} else {
			k.books.Created.Add(1)
			r.Release()
		}
		if rerr != nil {
			return failed("")
		}
		return made{res: &Result{Outcome: Outcome{Word: WordBadSessionID, Kind: Failure, Err: fmt.Errorf("%w: %w", errBadCreate, err)}}}
	}
	k.books.Created.Add(1)
	if a.fault != "" {
		r.Release()
		return failed(a.fault)
	}
	if l := k.rel.Ledger; l != nil {
		if err := l.Record(ctx, k.provider, a.id); err != nil {
			k.rel.ledgerError(k.provider, err)
			r.Release()
			return made{res: &Result{Outcome: Outcome{Word: WordLedger, Kind: Gateway, Err: err}}}
		}
		r.recorded = true
	}
	return made{remote: r, kept: a.kept}
}

// errResult is the result of an attempt that ended with err, classified
// (ctx is the client's: canceled, the client is gone).
func errResult(ctx context.Context, err error) Result {
	word, kind := ClassifyError(err, errors.Is(ctx.Err(), context.Canceled))
	return Result{Outcome: Outcome{Word: word, Kind: kind, Err: err}}
}

// within is the window of one attempt that starts at start: ctx cut at
// start+timeout, or at ctx's earlier deadline.
func within(ctx context.Context, start time.Time, timeout time.Duration) (actx context.Context, deadline time.Time, cancel context.CancelFunc) {
	deadline = start.Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	actx, cancel = context.WithDeadline(ctx, deadline)
	return actx, deadline, cancel
}

// Outcome words of a create call (a session API's or WebDriver's).
const (
	// WordCreateFailed: create answered a status other than 2xx, 408 or
	// 429.
	WordCreateFailed = "create_failed"
	// WordBadCreate: create answered 2xx with a body that is not JSON, is
	// larger than MaxCreateAnswer, or lacks the connect URL or session ID.
	WordBadCreate = "bad_create"
	// WordBadConnectURL: the connect URL of a create answer points to a
	// host the gateway does not dial with the provider's headers (not the
	// create call's host, not under its registrable domain, not named in
	// ConnectHosts), or is plain (ws://, http://) after a create call over
	// https without InsecureConnect.
	WordBadConnectURL = "bad_connect_url"
	// WordBadSessionID: the session ID of a create answer is refused (see
	// CheckSessionID).
	WordBadSessionID = "bad_session_id"
	// WordLedger: the session created could not be written to the
	// ledger; it was released, not dialed.
	WordLedger = "ledger_failed"
)

// MaxCreateAnswer bounds the create answer the gateway reads. A larger
// answer is a failure (WordBadCreate); the session it names is still
// released when its ID lies within the first MaxCreateAnswer bytes.
const MaxCreateAnswer = 1 << 20

// MaxSessionID bounds a provider's session ID, in bytes. Real IDs are
// UUIDs or alike (36 bytes); 1 KiB leaves room for any provider's own
// scheme while keeping a release URL well inside what servers accept
// (8 KiB request lines) and ledger entries and log lines small.
const MaxSessionID = 1024

var (
	errBadCreate     = errors.New("bad create answer")
	errBadConnectURL = errors.New("connect URL refused")
	errBadSessionID  = errors.New("session ID refused")
)

// CheckSessionID refuses a session ID that cannot be trusted to name one
// session in a release call: "." or ".." (a URL path resolves them, so the
// release would go to the sessions collection or the level above it, with
// the API key), one holding a control byte, and one longer than
// MaxSessionID. The error describes the ID without showing it.
func CheckSessionID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: it is empty", errBadSessionID)
	case id == "." || id == "..":
		return fmt.Errorf("%w: it is %q, a URL path's dot segment", errBadSessionID, id)
	case len(id) > MaxSessionID:
		return fmt.Errorf("%w: it is longer than %d bytes", errBadSessionID, MaxSessionID)
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x20 || id[i] == 0x7f {
			return fmt.Errorf("%w: it holds a control byte", errBadSessionID)
		}
	}
	return nil
}

// Books are the counts of the sessions a provider's creator makes (its
// session API, or WebDriver's create). They outlive a config load: the
// caller keeps them by provider name (Defaults.Books).
type Books struct {
	// Created: sessions the provider created whose ID the gateway read.
	Created counter
	// Released: sessions whose release the provider accepted (2xx, or 404
	// and 410: already gone).
	Released counter
	// ReleaseFailures: release calls that failed (each retry counts).
	ReleaseFailures counter
	// Orphans: sessions a create answer may have made that the gateway
	// cannot release (a 2xx answer whose session ID could not be read:
	// none at the pointer, not JSON, over MaxCreateAnswer, cut short; or
	// one whose ID CheckSessionID refused while the release URL holds it
	// in its path).
	Orphans counter
	// Reaped: sessions another process created and left behind (their
	// ledger entries adopted) whose release the provider accepted; not in
	// Created nor Released.
	Reaped counter
}

// Unreleased is the number of sessions created and not released yet.
func (b *Books) Unreleased() int64 { return b.Created.Load() - b.Released.Load() }
