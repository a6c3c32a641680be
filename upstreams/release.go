package upstreams

// Releases: each provider session a creator made (a Remote) ended once,
// off the request path, by the Releaser, through the ledger.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Releases of provider sessions run off the request path, in a Releaser:
// a bounded number of calls in flight, each session tried up to Tries
// times, each call bounded by Timeout. Submitting never blocks. Create
// calls in flight count as pending too, until what they created is
// released or handed to a connection, so that a process exit waits for
// them; StopCreates keeps new ones from starting. The caller keeps one
// Releaser for every provider that outlives a config load (the gateway's
// registry does), and hands it to New in Defaults.

// Releaser releases provider sessions. Its settings are read when it is
// made (NewReleaser sets the defaults); change them only before use.
type Releaser struct {
	// Tries is how many calls one release makes at most.
	Tries int
	// Timeout bounds one release call.
	Timeout time.Duration
	// Backoff is the wait before retry n (1, 2, …): n times it.
	Backoff time.Duration
	// Sleep waits between tries (tests replace it).
	Sleep func(time.Duration)
	// Later runs f after d, for the rounds of tries of a session the
	// ledger keeps (tests replace it).
	Later func(d time.Duration, f func()) *time.Timer
	// CreateGrace is how long a create call may go on after its attempt
	// gave up (the client left, connect_timeout passed): long enough to
	// learn the ID of a session the provider created anyway, and release
	// it.
	CreateGrace time.Duration
	// OnFailure, when set, hears of each failed release call (the
	// provider's name and the cause, which never holds a secret).
	OnFailure func(provider string, err error)
	// OnOrphan, when set, hears of each session a create answer may have
	// made that cannot be released: a 2xx answer whose session ID could
	// not be read, or was refused (CheckSessionID) while the release URL
	// holds it in its path. It gets the provider's name and the cause,
	// which never holds a header, a URL or the answer's body.
	OnOrphan func(provider, cause string)
	// Ledger, when set, keeps every session created until its release is
	// confirmed: a session is recorded before its connect URL is dialed
	// (an attempt whose entry cannot be written releases the session and
	// ends with kind Gateway), and a release that keeps failing is tried
	// again, with a growing wait, for as long as the process runs.
	Ledger Ledger
	// OnReaped, when set, hears of each adopted session (one a gone
	// process created, see Adopt) whose release the provider confirmed:
	// the provider's name, its session ID and the owner it came from.
	OnReaped func(provider, id, from string)
	// OnLedgerError, when set, hears of each ledger write that failed.
	OnLedgerError func(provider string, err error)

	slots chan struct{}
	mu    sync.Mutex
	// pending counts releases submitted and not finished, and create
	// calls not settled.
	pending int
	idle    *sync.Cond
	// stopped: StopCreates was called; no create call starts.
	stopped bool
}

// NewReleaser returns a releaser with the default settings: 3 tries, 10 s
// a call, 1 s then 2 s between them, 8 calls in flight, 30 s of grace for
// a create call.
func NewReleaser() *Releaser {
	r := &Releaser{Tries: 3, Timeout: 10 * time.Second, Backoff: time.Second,
		Sleep: time.Sleep, CreateGrace: 30 * time.Second, Later: time.AfterFunc, slots: make(chan struct{}, 8)}
	r.idle = sync.NewCond(&r.mu)
	return r
}

type counter = atomic.Int64

// chanOnce is a sync.Once that reports whether this call was the first.
type chanOnce struct{ done atomic.Bool }

func (o *chanOnce) do() bool { return o.done.CompareAndSwap(false, true) }

// ErrCreatesStopped is the error of an attempt refused, or given up after
// its create call answered, because StopCreates was called. Its Result
// has kind ClientGone (nothing counted against the provider).
var ErrCreatesStopped = errors.New("the gateway is shutting down: no provider session is created")

// StopCreates stops session-API attempts for good, at process exit: from
// now on an attempt at a provider with a session API ends at once, before
// its create call, with kind ClientGone and ErrCreatesStopped; a create
// call already in flight is still waited for by WaitReleases, and the
// session it creates is released, not dialed (its attempt ends the same
// way). Call it when the process begins to exit, before WaitReleases.
func (r *Releaser) StopCreates() {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
}

// AllowCreates undoes StopCreates (for tests, and for a process that
// goes on after all).
func (r *Releaser) AllowCreates() {
	r.mu.Lock()
	r.stopped = false
	r.mu.Unlock()
}

// CreatesStopped reports whether StopCreates is in effect.
func (r *Releaser) CreatesStopped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopped
}

func stoppedResult() Result {
	return Result{Outcome: Outcome{Word: WordClientGone, Kind: ClientGone, Err: ErrCreatesStopped}}
}

// startCreate counts a create call about to start as pending; ok is false
// once creates are stopped. settled, called when what the call created is
// released (submitted) or handed on, ends the count; calls after the
// first do nothing.
func (r *Releaser) startCreate() (settled func(), ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return nil, false
	}
	r.pending++
	var once sync.Once
	return func() { once.Do(r.finished) }, true
}

// finished ends one pending count.
func (r *Releaser) finished() {
	r.mu.Lock()
	r.pending--
	if r.pending == 0 {
		r.idle.Broadcast()
	}
	r.mu.Unlock()
}

func (r *Releaser) submit(s *Remote) {
	r.mu.Lock()
	slots := r.slots
	r.pending++
	r.mu.Unlock()
	go func() {
		defer r.finished()
		slots <- struct{}{}
		defer func() { <-slots }()
		s.run()
	}()
}

func (r *Releaser) ledgerError(provider string, err error) {
	if f := r.OnLedgerError; f != nil {
		f(provider, err)
	}
}

// Ledger keeps the provider sessions created until their release is
// confirmed (package ledger implements it over Caddy's storage).
type Ledger interface {
	Record(ctx context.Context, provider, id string) error
	Remove(ctx context.Context, provider, id string) error
}

// Pending is the number of releases not finished yet, create
// calls in flight included.
func (r *Releaser) Pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pending
}

// Wait waits until every submitted release has finished, and
// every create call in flight has answered and what it created has been
// released or handed to a connection, or until the deadline passes; it
// reports whether all finished.
func (r *Releaser) Wait(deadline time.Time) bool {
	t := time.AfterFunc(time.Until(deadline), func() {
		r.mu.Lock()
		r.idle.Broadcast()
		r.mu.Unlock()
	})
	defer t.Stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	for r.pending > 0 && time.Now().Before(deadline) {
		r.idle.Wait()
	}
	return r.pending == 0
}

// Remote is one browser session a provider's creator made: released
// exactly once, off the request path, through its creator's release call.
type Remote struct {
	by      creator
	id      string
	headers []Header // resolved at create time
	once    chanOnce
	// recorded: the ledger holds its entry; from is the gone owner an
	// adopted session came from; rounds counts the rounds of release
	// tries that failed.
	recorded bool
	from     string
	rounds   int
}

// ID is the provider's session ID.
func (r *Remote) ID() string { return r.id }

// Adopt returns, for release, session id that another process created at
// this provider and left behind (from names that process; its ledger entry
// is now this one's). The release call's headers are resolved with known,
// without a request: a header that needs the request's placeholders is sent
// without their values. A webdriver provider's is released with DELETE
// <base>/session/<id>. Nil when the provider creates no sessions.
func (p *Provider) Adopt(id, from string, known func(string) string) *Remote {
	if p.creates == nil {
		return nil
	}
	return &Remote{by: p.creates, id: id, headers: p.creates.adoptedFields(known), recorded: true, from: from}
}

// Release hands the session to the background releaser (at most once; a
// nil Remote is a no-op). It never blocks.
func (r *Remote) Release() {
	if r == nil || !r.once.do() {
		return
	}
	r.by.keeper().rel.submit(r)
}

// Confirmed books the session as released without a release call, at
// most once and only if Release was not called (a nil Remote is a no-op):
// the provider already confirmed its end, as when a WebDriver client's own
// DELETE, sent on, was answered 2xx, 404 or 410. Its ledger entry is
// removed off the request path; it never blocks.
func (r *Remote) Confirmed() {
	if r == nil || !r.once.do() {
		return
	}
	rel := r.by.keeper().rel
	rel.mu.Lock()
	rel.pending++
	rel.mu.Unlock()
	go func() {
		defer rel.finished()
		r.confirm()
	}()
}

// run releases s: up to Tries calls, waiting n×Backoff before try n+1.
// With a ledger, a confirmed release removes the session's entry, and a
// session whose round of tries failed gets another round later: its entry
// stays until then, so a process that exits meanwhile leaves it to be
// reaped.
func (s *Remote) run() {
	k := s.by.keeper()
	b, r := k.books, k.rel
	for try := 1; try <= r.Tries; try++ {
		if try > 1 {
			r.Sleep(time.Duration(try-1) * r.Backoff)
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.Timeout)
		ok, err := s.release(ctx)
		cancel()
		if errors.Is(err, errBadSessionID) {
			// No call can release it safely, now or later: an orphan.
			k.orphan(fmt.Sprintf("%v, and the release URL holds it in its path", err))
			return
		}
		if ok {
			s.confirm()
			return
		}
		b.ReleaseFailures.Add(1)
		if f := r.OnFailure; f != nil {
			f(k.provider, err)
		}
	}
	if r.Ledger != nil && s.recorded {
		s.rounds++
		r.Later(roundWait(s.rounds), func() { r.submit(s) })
	}
}

// roundWait is the wait before round n+1 of a kept session's tries: 10 s,
// doubling, at most 5 minutes.
func roundWait(n int) time.Duration {
	return min(10*time.Second<<min(n-1, 5), 5*time.Minute)
}

// confirm books a confirmed release: in the books, and with the ledger.
func (s *Remote) confirm() {
	if b := s.by.keeper().books; s.from == "" {
		b.Released.Add(1)
	} else {
		b.Reaped.Add(1)
	}
	s.released()
}

// released books a confirmed release with the ledger.
func (s *Remote) released() {
	k := s.by.keeper()
	r := k.rel
	if r.Ledger == nil || !s.recorded {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.Timeout)
	err := r.Ledger.Remove(ctx, k.provider, s.id)
	cancel()
	if err != nil {
		// The ledger deletes the entry again later; should the process
		// end first, a reaper releases the session once more, and the
		// provider answers it as released.
		r.ledgerError(k.provider, err)
	}
	if s.from != "" {
		if f := r.OnReaped; f != nil {
			f(k.provider, s.id, s.from)
		}
	}
}

// release makes one release call within ctx; ok reports that the provider
// no longer holds the session. An ID refused by CheckSessionID is never
// put in a release path: the error then wraps errBadSessionID.
func (r *Remote) release(ctx context.Context) (ok bool, err error) {
	k := r.by.keeper()
	if err := CheckSessionID(r.id); err != nil && k.idInPath {
		return false, err
	}
	c, err := r.by.releaseCall(r.id, r.headers)
	if err != nil {
		return false, err
	}
	resp, err := c.do(ctx, k.client)
	if err != nil {
		return false, err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, MaxRelayedBody))
	resp.Body.Close()
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode <= 299,
		resp.StatusCode == http.StatusNotFound, resp.StatusCode == http.StatusGone:
		return true, nil
	}
	return false, fmt.Errorf("release answered %d", resp.StatusCode)
}
