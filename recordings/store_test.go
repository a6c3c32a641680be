package recordings

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"image"
	"image/color"
	"image/jpeg"
	"os"
	"os/exec"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newClock() *fakeClock { return &fakeClock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)} }

// jpegFrame is a real JPEG of w×h in one colour, base64 as a browser sends
// it.
func jpegFrame(t *testing.T, w, h int, c color.Color) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			img.Set(x, y, c)
		}
	}
	var b bytes.Buffer
	if err := jpeg.Encode(&b, img, nil); err != nil {
		t.Fatal(err)
	}
	return []byte(base64.StdEncoding.EncodeToString(b.Bytes()))
}

func wait(t *testing.T, r *Recording) {
	t.Helper()
	select {
	case <-r.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the recording was not written within 30s")
	}
}

// TestRecordingLayout: two targets' frames land under
// browser_failover/recordings/<id>/targets/<t>/<n>.jpg, the meta lists
// each target's frames' times in order with its URL and title, and the
// store reads them back; the list is newest first; Delete removes it all.
func TestRecordingLayout(t *testing.T) {
	fs := &certmagic.FileStorage{Path: t.TempDir()}
	clock := newClock()
	s := NewStore(fs, clock.Now)
	ctx := context.Background()

	older := s.Begin(Meta{ID: "older", Provider: "p"}, Options{Format: "jpeg"})
	older.End()
	wait(t, older)
	clock.Add(time.Minute)

	r := s.Begin(Meta{ID: "sess1", Provider: "local", Client: "k1", Options: map[string]any{"record": true}}, Options{Format: "jpeg"})
	r.Target("T-A", "data:text/html,a", "first")
	base := time.UnixMilli(1_900_000_000_000)
	for i := 0; i < 3; i++ {
		r.Frame("T-A", jpegFrame(t, 32, 24, color.RGBA{R: uint8(80 * i), A: 255}), base.Add(time.Duration(i)*100*time.Millisecond))
		waitStored(t, r, int64(i+1))
	}
	r.Target("T-B", "about:blank", "")
	r.Target("T-B", "data:text/html,b", "popup")
	r.Frame("T-B", jpegFrame(t, 32, 24, color.White), base.Add(time.Second))
	r.Frame("T-unknown", jpegFrame(t, 8, 8, color.White), base)
	r.End()
	wait(t, r)

	m, err := s.Meta(ctx, "sess1")
	if err != nil {
		t.Fatal(err)
	}
	if m.End == nil || m.Frames != 4 || m.Dropped != 0 || len(m.Targets) != 2 || m.Format != "jpeg" || m.Client != "k1" {
		t.Fatalf("meta %+v", m)
	}
	a, b := m.Targets[0], m.Targets[1]
	if a.URL != "data:text/html,a" || a.Title != "first" || len(a.Frames) != 3 || a.Frames[0] != base.UnixMilli() || a.Frames[2] != base.Add(200*time.Millisecond).UnixMilli() {
		t.Fatalf("target A %+v", a)
	}
	if b.Index != 1 || b.URL != "data:text/html,b" || b.Title != "popup" || len(b.Frames) != 1 {
		t.Fatalf("target B %+v", b)
	}
	for _, k := range []string{"meta.json", "targets/0/0.jpg", "targets/0/2.jpg", "targets/1/0.jpg"} {
		if !fs.Exists(ctx, path.Join(Prefix, "sess1", k)) {
			t.Fatalf("%s is not in the storage", k)
		}
	}
	img, ct, err := s.Frame(ctx, "sess1", 0, 1)
	if err != nil || ct != "image/jpeg" {
		t.Fatal(ct, err)
	}
	if _, err := jpeg.Decode(bytes.NewReader(img)); err != nil {
		t.Fatalf("frame 0/1 is not a JPEG: %v", err)
	}
	if _, _, err := s.Frame(ctx, "sess1", 1, 1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a frame past the end: %v", err)
	}
	if _, err := s.Meta(ctx, "../sess1"); !errors.Is(err, ErrNotFound) {
		t.Fatal("an ID with a path in it was read")
	}
	list, err := s.List(ctx, 0)
	if err != nil || len(list) != 2 || list[0].ID != "sess1" || list[1].ID != "older" {
		t.Fatalf("list %v %v", list, err)
	}
	if one, _ := s.List(ctx, 1); len(one) != 1 || one[0].ID != "sess1" {
		t.Fatalf("limit 1: %v", one)
	}
	if err := s.Delete(ctx, "sess1"); err != nil {
		t.Fatal(err)
	}
	if fs.Exists(ctx, path.Join(Prefix, "sess1")) {
		t.Fatal("Delete left the recording")
	}
	if err := s.Delete(ctx, "sess1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a second Delete: %v", err)
	}
}

func waitStored(t *testing.T, r *Recording, n int64) {
	t.Helper()
	for i := 0; i < 3000; i++ {
		if r.Stats().Frames >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("frame %d not stored", n)
}

// TestRecordingContinue: a resumed session's recording goes on under the
// same ID: its targets and frames so far are kept, a known target's
// frames are numbered on.
func TestRecordingContinue(t *testing.T) {
	fs := &certmagic.FileStorage{Path: t.TempDir()}
	s := NewStore(fs, newClock().Now)
	r := s.Begin(Meta{ID: "s", Provider: "p"}, Options{})
	r.Target("T", "u", "")
	r.Frame("T", jpegFrame(t, 8, 8, color.Black), time.UnixMilli(1000))
	waitStored(t, r, 1)
	r.End()
	wait(t, r)
	r2 := s.Continue(context.Background(), Meta{ID: "s", Provider: "p"}, Options{})
	r2.Target("T", "u2", "t2")
	r2.Frame("T", jpegFrame(t, 8, 8, color.White), time.UnixMilli(2000))
	waitStored(t, r2, 2)
	r2.End()
	wait(t, r2)
	m, _ := s.Meta(context.Background(), "s")
	if len(m.Targets) != 1 || len(m.Targets[0].Frames) != 2 || m.Frames != 2 || m.Targets[0].URL != "u2" || m.End == nil {
		t.Fatalf("continued meta %+v", m)
	}
	if !fs.Exists(context.Background(), path.Join(Prefix, "s", "targets/0/1.jpg")) {
		t.Fatal("the continued frame is not frame 1")
	}
}

// TestTidyClosesAndExpires: on a fake clock, a recording whose process
// died (no end, meta stale) is closed with the frames it stored after its
// last meta write; a recording under way here, or one whose meta is
// fresh, is left; ended recordings older than the retention go, younger
// ones stay.
func TestTidyClosesAndExpires(t *testing.T) {
	fs := &certmagic.FileStorage{Path: t.TempDir()}
	clock := newClock()
	s := NewStore(fs, clock.Now)
	ctx := context.Background()
	put := func(m Meta, frames int) {
		b, _ := json.Marshal(m)
		if err := fs.Store(ctx, metaKey(m.ID), b); err != nil {
			t.Fatal(err)
		}
		for n := 0; n < frames; n++ {
			fs.Store(ctx, frameKey(m.ID, 0, n, "jpeg"), []byte("img"))
		}
	}
	now := clock.Now()
	target := []Target{{Index: 0, ID: "T", Frames: []int64{now.Add(-time.Hour).UnixMilli()}}}
	// Crashed an hour ago with 3 frames stored, 1 in its meta.
	put(Meta{ID: "crashed", Start: now.Add(-2 * time.Hour), Updated: now.Add(-time.Hour), Format: "jpeg", Frames: 1, Bytes: 3,
		Targets: append([]Target(nil), target...)}, 3)
	// Under way on another node: touched a minute ago.
	put(Meta{ID: "fresh", Start: now.Add(-time.Hour), Updated: now.Add(-time.Minute), Format: "jpeg", Targets: []Target{}}, 0)
	// Under way here, stale meta (the loop skips what is live).
	put(Meta{ID: "live", Start: now.Add(-time.Hour), Updated: now.Add(-time.Hour), Format: "jpeg", Targets: []Target{}}, 0)
	old, recent := now.Add(-8*24*time.Hour), now.Add(-24*time.Hour)
	put(Meta{ID: "old", Start: old, End: &old, Format: "jpeg", Targets: []Target{}}, 0)
	put(Meta{ID: "recent", Start: recent, End: &recent, Format: "jpeg", Targets: []Target{}}, 0)

	closed, deleted, err := s.Tidy(ctx, now.Add(-7*24*time.Hour), func(id string) bool { return id == "live" })
	if err != nil || closed != 1 || deleted != 1 {
		t.Fatalf("closed %d deleted %d err %v; want 1 and 1", closed, deleted, err)
	}
	m, err := s.Meta(ctx, "crashed")
	if err != nil || m.End == nil || m.Stopped != "incomplete" || m.Frames != 3 || len(m.Targets[0].Frames) != 3 {
		t.Fatalf("closed crashed recording: %+v %v", m, err)
	}
	for id, want := range map[string]bool{"fresh": false, "live": false, "old": true, "recent": false} {
		m, err := s.Meta(ctx, id)
		gone := errors.Is(err, ErrNotFound)
		if gone != want || (!gone && id != "recent" && m.End != nil) {
			t.Fatalf("%s: gone %v (want %v), end %v", id, gone, want, m.End)
		}
	}
	// Retention 0 deletes nothing.
	if _, deleted, _ := s.Tidy(ctx, time.Time{}, nil); deleted != 0 {
		t.Fatalf("zero retention deleted %d", deleted)
	}
}

// blockingStorage holds every frame write until release is closed.
type blockingStorage struct {
	certmagic.Storage
	release chan struct{}
}

func (b *blockingStorage) Store(ctx context.Context, key string, v []byte) error {
	if strings.HasSuffix(key, ".jpg") {
		<-b.release
	}
	return b.Storage.Store(ctx, key, v)
}

type counts struct {
	mu              sync.Mutex
	stored, dropped int
}

func (c *counts) Stored(int) { c.mu.Lock(); c.stored++; c.mu.Unlock() }
func (c *counts) Dropped()   { c.mu.Lock(); c.dropped++; c.mu.Unlock() }

// TestSlowStorageDropsFrames: a storage that does not take frames makes
// the recording drop them (counted, in its meta and to its counter), and
// Frame never waits for it.
func TestSlowStorageDropsFrames(t *testing.T) {
	bs := &blockingStorage{Storage: &certmagic.FileStorage{Path: t.TempDir()}, release: make(chan struct{})}
	s := NewStore(bs, newClock().Now)
	c := &counts{}
	r := s.Begin(Meta{ID: "slow"}, Options{Counter: c})
	r.Target("T", "u", "")
	frame := jpegFrame(t, 8, 8, color.Black)
	sent := make(chan struct{})
	go func() {
		for i := 0; i < 100; i++ {
			r.Frame("T", frame, time.UnixMilli(int64(i)))
		}
		close(sent)
	}()
	select {
	case <-sent:
	case <-time.After(30 * time.Second):
		t.Fatal("Frame waited for the storage")
	}
	st := r.Stats()
	if st.Dropped < 100-QueueLen-1 || st.Frames != 0 {
		t.Fatalf("with the storage stuck: %+v", st)
	}
	close(bs.release)
	r.End()
	wait(t, r)
	m, _ := s.Meta(context.Background(), "slow")
	if m.Frames+m.Dropped != 100 || m.Dropped != st.Dropped {
		t.Fatalf("meta frames %d dropped %d", m.Frames, m.Dropped)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if int64(c.dropped) != m.Dropped || int64(c.stored) != m.Frames {
		t.Fatalf("counter %d/%d, meta %d/%d", c.stored, c.dropped, m.Frames, m.Dropped)
	}
}

// TestMaxBytesStopsCapture: frames past max_bytes are not stored and the
// recording says why.
func TestMaxBytesStopsCapture(t *testing.T) {
	s := NewStore(&certmagic.FileStorage{Path: t.TempDir()}, newClock().Now)
	frame := jpegFrame(t, 16, 16, color.Black)
	size, _ := base64.StdEncoding.DecodeString(string(frame))
	r := s.Begin(Meta{ID: "capped"}, Options{MaxBytes: int64(2*len(size) + 1)})
	r.Target("T", "u", "")
	for i := 0; i < 5; i++ {
		r.Frame("T", frame, time.UnixMilli(int64(i)))
		for r.Stats().Queued > 0 {
			time.Sleep(time.Millisecond)
		}
	}
	r.End()
	wait(t, r)
	m, _ := s.Meta(context.Background(), "capped")
	if m.Frames != 2 || m.Stopped != "bytes" {
		t.Fatalf("frames %d stopped %q; want 2 and bytes", m.Frames, m.Stopped)
	}
}

// TestVideo: a target's frames become an H.264 MP4 whose duration follows
// the frames' times (ffprobe reads it).
func TestVideo(t *testing.T) {
	if _, err := exec.LookPath("ffprobe"); err != nil {
		t.Skip("ffmpeg/ffprobe not installed (e2e/setup.sh installs them)")
	}
	s := NewStore(&certmagic.FileStorage{Path: t.TempDir()}, newClock().Now)
	r := s.Begin(Meta{ID: "vid"}, Options{})
	r.Target("T", "u", "")
	for i := 0; i < 4; i++ {
		r.Frame("T", jpegFrame(t, 64+2*i, 47, color.RGBA{G: uint8(60 * i), A: 255}), time.UnixMilli(int64(1000*i)))
		waitStored(t, r, int64(i+1))
	}
	r.End()
	wait(t, r)
	file, err := s.Video(context.Background(), "vid", 0, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(file)
	codec, dur := Probe(t, file)
	if codec != "h264" || dur < 3 || dur > 4 {
		t.Fatalf("video: codec %q duration %v; want h264 and 3.5s", codec, dur)
	}
}

// Probe reads a video's codec and duration with ffprobe.
func Probe(t *testing.T, file string) (string, float64) {
	t.Helper()
	out, err := exec.Command("ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "stream=codec_name:format=duration", "-of", "json", file).Output()
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		Streams []struct {
			Codec string `json:"codec_name"`
		} `json:"streams"`
		Format struct {
			Duration string `json:"duration"`
		} `json:"format"`
	}
	if err := json.Unmarshal(out, &p); err != nil || len(p.Streams) == 0 {
		t.Fatalf("ffprobe: %s %v", out, err)
	}
	var d float64
	json.Unmarshal([]byte(p.Format.Duration), &d)
	return p.Streams[0].Codec, d
}
