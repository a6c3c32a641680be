package recordings

import (
	"context"
	"encoding/base64"
	"strings"
	"sync"
	"time"
)

// QueueLen is how many frames a recording holds while its storage writes:
// past it, frames are dropped (counted), so the client's traffic never
// waits for the storage.
const QueueLen = 16

// flushEvery is how often a recording under way writes its meta as frames
// come (besides every TouchEvery, and at its end).
const flushEvery = 2 * time.Second

// writeTimeout bounds one write to the storage.
const writeTimeout = 30 * time.Second

// Counter hears of what a recording stores and drops (the metrics).
type Counter interface {
	Stored(bytes int)
	Dropped()
}

// Options are how a recording captures.
type Options struct {
	// Format is its frames' format: jpeg or png.
	Format string
	// MaxBytes stops the capture once the frames stored reach it (0: no
	// bound).
	MaxBytes int64
	// Counter (nil: none) hears of each frame stored or dropped.
	Counter Counter
	// OnEnd (nil: none) is called once the recording is written whole,
	// after End.
	OnEnd func(*Recording)
}

// Recording is one session's capture under way: the participant hands it
// targets and frames (cdp.Sink), which a goroutine of its own writes to
// the storage in order; the newest frame of each target stays in memory
// for the live view.
type Recording struct {
	store *Store
	opts  Options
	queue chan job

	mu       sync.Mutex
	meta     Meta
	byTarget map[string]int // target index by the browser's target ID
	newest   []Newest       // by target index
	flushed  time.Time
	ended    bool
	queued   int64 // frames handed to the writer, not stored or dropped yet
	seq      int64 // meta snapshots taken
	done     chan struct{}

	// wmu orders the meta's writes: a snapshot older than the one last
	// written is not written.
	wmu     sync.Mutex
	written int64
}

// snapshot is a copy of the meta to write, and its place in order.
type snapshot struct {
	m   Meta
	seq int64
}

// job is a frame for the writer.
type job struct {
	target int
	data   []byte // base64
	at     time.Time
}

// Newest is the latest frame of a target, for the live view.
type Newest struct {
	Image []byte
	At    time.Time
	// N is its number in the target's frames.
	N int
}

// Begin starts recording m.ID (a new recording: its start is now), with m
// saying who and what; it is written from the first frame on.
func (s *Store) Begin(m Meta, o Options) *Recording {
	m.Start, m.End, m.Format = s.now(), nil, format(o.Format)
	if m.Targets == nil {
		m.Targets = []Target{}
	}
	return s.run(m, o)
}

// Continue goes on with recording id (a resumed session): its targets and
// frames so far are kept, and it is under way again. A recording that is
// not there begins as m.
func (s *Store) Continue(ctx context.Context, m Meta, o Options) *Recording {
	old, err := s.Meta(ctx, m.ID)
	if err != nil || old.Format != format(o.Format) {
		return s.Begin(m, o)
	}
	old.End = nil
	if old.Stopped == "incomplete" {
		old.Stopped = ""
	}
	return s.run(old, o)
}

func format(f string) string {
	if f == "png" {
		return "png"
	}
	return "jpeg"
}

func (s *Store) run(m Meta, o Options) *Recording {
	r := &Recording{store: s, opts: o, queue: make(chan job, QueueLen), meta: m,
		byTarget: map[string]int{}, done: make(chan struct{})}
	for i, t := range m.Targets {
		r.byTarget[t.ID] = i
	}
	r.newest = make([]Newest, len(m.Targets))
	go r.write()
	return r
}

// ID is the recording's ID.
func (r *Recording) ID() string { return r.meta.ID }

// Target tells of a page target (cdp.Sink): first seen, or its URL or
// title changed.
func (r *Recording) Target(id, url, title string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i, ok := r.byTarget[id]; ok {
		t := &r.meta.Targets[i]
		t.URL, t.Title = url, title
		return
	}
	i := len(r.meta.Targets)
	r.byTarget[id] = i
	r.meta.Targets = append(r.meta.Targets, Target{Index: i, ID: id, URL: url, Title: title, Frames: []int64{}})
	r.newest = append(r.newest, Newest{})
}

// Frame queues one frame of target id (cdp.Sink): data is its image in
// base64, owned by the recording from here. When the writer is behind by
// QueueLen frames, the frame is dropped and counted; it never waits.
func (r *Recording) Frame(id string, data []byte, at time.Time) {
	r.mu.Lock()
	i, ok := r.byTarget[id]
	if !ok || r.ended || r.meta.Stopped != "" {
		r.mu.Unlock()
		return
	}
	select {
	case r.queue <- job{target: i, data: data, at: at}:
		r.queued++
		r.mu.Unlock()
	default:
		r.meta.Dropped++
		r.mu.Unlock()
		if c := r.opts.Counter; c != nil {
			c.Dropped()
		}
	}
}

// Unavailable notes that the browser could not be followed (cdp.Sink).
func (r *Recording) Unavailable(why string) {
	r.mu.Lock()
	if r.meta.Stopped == "" {
		r.meta.Stopped = why
	}
	r.mu.Unlock()
}

// End ends the capture: the frames queued are still written, then the
// meta with its end, and OnEnd is called. It returns at once.
func (r *Recording) End() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return
	}
	r.ended = true
	close(r.queue)
}

// Done is closed once the recording is written whole after End.
func (r *Recording) Done() <-chan struct{} { return r.done }

// Stats are a recording's counts so far.
type Stats struct {
	Frames, Bytes, Dropped int64
	// Queued are frames waiting for the storage.
	Queued int64
	// Stopped is why capture stopped ("" while it goes on).
	Stopped string
}

// Stats are its counts so far.
func (r *Recording) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return Stats{Frames: r.meta.Frames, Bytes: r.meta.Bytes, Dropped: r.meta.Dropped, Queued: r.queued, Stopped: r.meta.Stopped}
}

// Brief is the recording as a session's entry and the sessions list show
// it: {"id","frames","bytes","dropped"[,"stopped"]}, or, when the browser
// could not be followed, "unavailable: <why>".
func (r *Recording) Brief() any {
	st := r.Stats()
	if strings.HasPrefix(st.Stopped, "unavailable") {
		return st.Stopped
	}
	out := map[string]any{"id": r.ID(), "frames": st.Frames, "bytes": st.Bytes, "dropped": st.Dropped}
	if st.Stopped != "" {
		out["stopped"] = st.Stopped
	}
	return out
}

// Meta is a copy of its meta as of now.
func (r *Recording) Meta() Meta {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.meta
	m.Targets = make([]Target, len(r.meta.Targets))
	for i, t := range r.meta.Targets {
		t.Frames = append([]int64(nil), t.Frames...)
		m.Targets[i] = t
	}
	return m
}

// Newest is the latest frame stored of target t (ok false: none yet).
func (r *Recording) Newest(t int) (Newest, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t < 0 || t >= len(r.newest) || r.newest[t].Image == nil {
		return Newest{}, false
	}
	return r.newest[t], true
}

// Touch writes the meta now (a live recording's heartbeat).
func (r *Recording) Touch() {
	r.mu.Lock()
	if r.ended {
		r.mu.Unlock()
		return
	}
	m := r.copyLocked()
	r.flushed = r.store.now()
	r.mu.Unlock()
	r.writeMeta(m)
}

// copyLocked snapshots the meta for a write (the frame lists are appended
// to only, so sharing their arrays up to their length is safe).
func (r *Recording) copyLocked() *snapshot {
	m := r.meta
	m.Targets = append([]Target(nil), r.meta.Targets...)
	r.seq++
	return &snapshot{m: m, seq: r.seq}
}

// writeMeta writes a snapshot unless a newer one was written.
func (r *Recording) writeMeta(sn *snapshot) {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	if sn.seq <= r.written {
		return
	}
	r.written = sn.seq
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	r.store.writeMeta(ctx, &sn.m)
}

// write is the recording's writer: each queued frame decoded and stored,
// the meta now and then, and at the end.
func (r *Recording) write() {
	defer close(r.done)
	r.Touch()
	for j := range r.queue {
		r.store1(j)
	}
	r.mu.Lock()
	end := r.store.now()
	r.meta.End = &end
	m := r.copyLocked()
	r.mu.Unlock()
	r.writeMeta(m)
	if r.opts.OnEnd != nil {
		r.opts.OnEnd(r)
	}
}

// store1 stores one frame.
func (r *Recording) store1(j job) {
	img := make([]byte, base64.StdEncoding.DecodedLen(len(j.data)))
	n, err := base64.StdEncoding.Decode(img, j.data)
	r.mu.Lock()
	r.queued--
	if err != nil || n == 0 || r.meta.Stopped != "" {
		r.mu.Unlock()
		return
	}
	img = img[:n]
	if max := r.opts.MaxBytes; max > 0 && r.meta.Bytes+int64(n) > max {
		r.meta.Stopped = "bytes"
		m := r.copyLocked()
		r.mu.Unlock()
		r.writeMeta(m)
		return
	}
	t := &r.meta.Targets[j.target]
	num := len(t.Frames)
	key := frameKey(r.meta.ID, j.target, num, r.meta.Format)
	r.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	err = r.store.st.Store(ctx, key, img)
	cancel()

	r.mu.Lock()
	if err != nil {
		r.meta.Dropped++
		r.mu.Unlock()
		if c := r.opts.Counter; c != nil {
			c.Dropped()
		}
		return
	}
	t = &r.meta.Targets[j.target]
	t.Frames = append(t.Frames, j.at.UnixMilli())
	r.meta.Frames++
	r.meta.Bytes += int64(n)
	r.newest[j.target] = Newest{Image: img, At: j.at, N: num}
	var flush *snapshot
	if now := r.store.now(); now.Sub(r.flushed) >= flushEvery {
		r.flushed = now
		flush = r.copyLocked()
	}
	r.mu.Unlock()
	if c := r.opts.Counter; c != nil {
		c.Stored(n)
	}
	if flush != nil {
		r.writeMeta(flush)
	}
}
