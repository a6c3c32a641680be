// Package recordings keeps the recordings of CDP sessions in a storage
// (certmagic.Storage: Caddy's own, or a storage module a handler names),
// the way package ledger keeps created provider sessions: a Store is the
// layout and what reads and tidies it, a Recording one session's capture
// under way, fed frame by frame and written in the background.
//
// The layout, under browser_failover/recordings/<recording id>/ (the ID is
// the session's, the first one's when a resumed session goes on):
//
//	meta.json               the Meta: who, when, targets and their frames' times
//	targets/<t>/<n>.jpg     frame n of target t (.png for png frames)
//
// A recording whose process died has a meta without an end: it is closed
// (its end the time of its last frame, its frames as stored) by the next
// process that opens the store, once its meta has not been touched for
// StaleAfter (a live recording's meta is touched more often than that).
// Recordings show whatever was on screen: nothing of a frame, a URL or a
// title leaves this package but through the admin API's and the
// dashboard's readers.
package recordings

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/certmagic"
)

// Prefix is where recordings are kept in the storage.
const Prefix = "browser_failover/recordings"

// StaleAfter is how long the meta of a recording under way may go
// untouched before it is taken for one whose process died.
const StaleAfter = 3 * time.Minute

// TouchEvery is how often a live recording's meta is written at least.
const TouchEvery = time.Minute

// ErrNotFound is the error of a recording, target or frame that is not
// there.
var ErrNotFound = errors.New("no such recording")

// Meta describes one recording (meta.json).
type Meta struct {
	// ID is the recording's: its session's ID (a resumed session's
	// recording goes on under the first one's).
	ID string `json:"id"`
	// Provider is the provider's name.
	Provider string `json:"provider"`
	// Start and End are when the capture began and ended; End is null
	// while it goes on.
	Start time.Time  `json:"start"`
	End   *time.Time `json:"end"`
	// Updated is when the meta was last written.
	Updated time.Time `json:"updated"`
	// Options are the session options its client stated (absent: none).
	Options map[string]any `json:"options,omitempty"`
	// Client is the session's client key, hashed as the status shows it
	// ("" without one).
	Client string `json:"client,omitempty"`
	// Format is the frames' format: jpeg or png.
	Format string `json:"format"`
	// Targets are the pages followed, in the order they were found.
	Targets []Target `json:"targets"`
	// Frames and Bytes count the frames stored and their bytes; Dropped
	// the frames dropped because the storage could not keep up.
	Frames  int64 `json:"frames"`
	Bytes   int64 `json:"bytes"`
	Dropped int64 `json:"dropped"`
	// Stopped is why capture stopped before the session ended: "bytes"
	// (max_bytes reached), "incomplete" (its process died; closed later),
	// or "unavailable: <why>" (the browser could not be followed). Empty
	// otherwise.
	Stopped string `json:"stopped,omitempty"`
}

// Target is one page target of a recording.
type Target struct {
	// Index numbers it within the recording (its frames' folder).
	Index int `json:"index"`
	// ID is the browser's target ID.
	ID    string `json:"target_id"`
	URL   string `json:"url"`
	Title string `json:"title"`
	// Frames are the times its frames were drawn, in Unix milliseconds:
	// frame n was drawn at Frames[n].
	Frames []int64 `json:"frames"`
}

// Summary is a recording as a list shows it: its meta without the frames'
// times.
type Summary struct {
	ID       string         `json:"id"`
	Provider string         `json:"provider"`
	Start    time.Time      `json:"start"`
	End      *time.Time     `json:"end"`
	Options  map[string]any `json:"options,omitempty"`
	Client   string         `json:"client,omitempty"`
	Format   string         `json:"format"`
	Targets  int            `json:"targets"`
	Frames   int64          `json:"frames"`
	Bytes    int64          `json:"bytes"`
	Dropped  int64          `json:"dropped"`
	Stopped  string         `json:"stopped,omitempty"`
}

// Summary is m without its frames' times.
func (m Meta) Summary() Summary {
	return Summary{ID: m.ID, Provider: m.Provider, Start: m.Start, End: m.End, Options: m.Options, Client: m.Client,
		Format: m.Format, Targets: len(m.Targets), Frames: m.Frames, Bytes: m.Bytes, Dropped: m.Dropped, Stopped: m.Stopped}
}

// Store is the recordings in one storage, on a clock.
type Store struct {
	st  certmagic.Storage
	now func() time.Time
}

// NewStore keeps recordings in st; now is the clock (the registry's).
func NewStore(st certmagic.Storage, now func() time.Time) *Store {
	return &Store{st: st, now: now}
}

// Storage is where the store keeps its recordings.
func (s *Store) Storage() certmagic.Storage { return s.st }

var validID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidID reports whether id may name a recording (a session ID).
func ValidID(id string) bool { return validID.MatchString(id) }

func metaKey(id string) string { return path.Join(Prefix, id, "meta.json") }

// frameKey is the key of frame n of target t.
func frameKey(id string, t, n int, format string) string {
	return path.Join(Prefix, id, "targets", strconv.Itoa(t), strconv.Itoa(n)+ext(format))
}

// ext is the file extension of a format's frames.
func ext(format string) string {
	if format == "png" {
		return ".png"
	}
	return ".jpg"
}

// ContentType is the MIME type of a format's frames.
func ContentType(format string) string {
	if format == "png" {
		return "image/png"
	}
	return "image/jpeg"
}

// Meta reads recording id's meta.
func (s *Store) Meta(ctx context.Context, id string) (Meta, error) {
	var m Meta
	if !ValidID(id) {
		return m, ErrNotFound
	}
	b, err := s.st.Load(ctx, metaKey(id))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return m, ErrNotFound
		}
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("recording %s: its meta cannot be read: %w", id, err)
	}
	return m, nil
}

// writeMeta writes m, its Updated set to now.
func (s *Store) writeMeta(ctx context.Context, m *Meta) error {
	m.Updated = s.now()
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return s.st.Store(ctx, metaKey(m.ID), b)
}

// ids lists the recordings' IDs in the storage.
func (s *Store) ids(ctx context.Context) ([]string, error) {
	keys, err := s.st.List(ctx, Prefix, false)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		if id := path.Base(k); ValidID(id) {
			out = append(out, id)
		}
	}
	return out, nil
}

// List returns the recordings' metas, newest first (by start), at most
// limit of them (0: all). A recording whose meta cannot be read is left
// out.
func (s *Store) List(ctx context.Context, limit int) ([]Meta, error) {
	ids, err := s.ids(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Meta, 0, len(ids))
	for _, id := range ids {
		if m, err := s.Meta(ctx, id); err == nil {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b Meta) int {
		if c := b.Start.Compare(a.Start); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Frame reads frame n of target t of recording id: its image and MIME
// type.
func (s *Store) Frame(ctx context.Context, id string, t, n int) ([]byte, string, error) {
	m, err := s.Meta(ctx, id)
	if err != nil {
		return nil, "", err
	}
	if t < 0 || t >= len(m.Targets) || n < 0 || n >= len(m.Targets[t].Frames) {
		return nil, "", ErrNotFound
	}
	b, err := s.st.Load(ctx, frameKey(id, t, n, m.Format))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", ErrNotFound
	}
	return b, ContentType(m.Format), err
}

// Delete removes recording id, meta and frames.
func (s *Store) Delete(ctx context.Context, id string) error {
	if !ValidID(id) {
		return ErrNotFound
	}
	if !s.st.Exists(ctx, path.Join(Prefix, id)) {
		return ErrNotFound
	}
	return s.st.Delete(ctx, path.Join(Prefix, id))
}

// Tidy closes the recordings whose process died (no end, meta untouched
// for StaleAfter, and not live here: live tells) and deletes those that
// ended before expire (zero: none). It returns how many of each.
func (s *Store) Tidy(ctx context.Context, expire time.Time, live func(id string) bool) (closed, deleted int, err error) {
	ids, err := s.ids(ctx)
	if err != nil {
		return 0, 0, err
	}
	now := s.now()
	var errs []error
	for _, id := range ids {
		if live != nil && live(id) {
			continue
		}
		m, err := s.Meta(ctx, id)
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				// Frames without a meta: a recording whose first
				// meta was never written; old ones go.
				if info, serr := s.st.Stat(ctx, path.Join(Prefix, id)); serr == nil && !expire.IsZero() && info.Modified.Before(expire) {
					errs = append(errs, s.st.Delete(ctx, path.Join(Prefix, id)))
				}
				continue
			}
			errs = append(errs, err)
			continue
		}
		if m.End == nil && now.Sub(m.Updated) >= StaleAfter {
			if err := s.closeIncomplete(ctx, &m); err != nil {
				errs = append(errs, err)
				continue
			}
			closed++
		}
		if m.End != nil && !expire.IsZero() && m.End.Before(expire) {
			if err := s.st.Delete(ctx, path.Join(Prefix, id)); err != nil {
				errs = append(errs, err)
				continue
			}
			deleted++
		}
	}
	return closed, deleted, errors.Join(errs...)
}

// closeIncomplete closes the recording of a process that died: the frames
// it stored after its meta was last written are listed (their times those
// of their files), and it ends with its last frame.
func (s *Store) closeIncomplete(ctx context.Context, m *Meta) error {
	end := m.Updated
	for i := range m.Targets {
		t := &m.Targets[i]
		for n := len(t.Frames); ; n++ {
			info, err := s.st.Stat(ctx, frameKey(m.ID, t.Index, n, m.Format))
			if err != nil {
				break
			}
			t.Frames = append(t.Frames, info.Modified.UnixMilli())
			m.Frames++
			m.Bytes += info.Size
		}
		if k := len(t.Frames); k > 0 {
			if last := time.UnixMilli(t.Frames[k-1]); last.After(end) {
				end = last
			}
		}
	}
	if m.Stopped == "" {
		m.Stopped = "incomplete"
	}
	m.End = &end
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return s.st.Store(ctx, metaKey(m.ID), b)
}
