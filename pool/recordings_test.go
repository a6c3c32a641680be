package pool

import (
	"context"
	"encoding/json"
	"errors"
	"path"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/browserfailover/caddy-browser-failover/recordings"
)

// putRecording writes a recording's meta straight into the storage.
func putRecording(t *testing.T, st certmagic.Storage, m recordings.Meta) {
	t.Helper()
	b, _ := json.Marshal(m)
	if err := st.Store(context.Background(), path.Join(recordings.Prefix, m.ID, "meta.json"), b); err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond (the loop's passes run on goroutines of their
// own).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; i < 3000; i++ {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%s: not within 15s", what)
}

// TestRecordingsLoop: on the registry's (fake) clock, a store opened for
// the first time closes the recording a dead process left at once; the
// loop deletes recordings once their retention has passed, and touches
// the meta of a recording under way, which is never closed or deleted;
// a recording under way cannot be deleted through the registry.
func TestRecordingsLoop(t *testing.T) {
	clock := &fakeClock{now: time.Date(2030, 5, 1, 0, 0, 0, 0, time.UTC)}
	reg := NewRegistry(clock)
	st := &certmagic.FileStorage{Path: t.TempDir()}
	ctx := context.Background()
	now := clock.Now()
	putRecording(t, st, recordings.Meta{ID: "crashed", Start: now.Add(-time.Hour), Updated: now.Add(-time.Hour), Format: "jpeg", Targets: []recordings.Target{}})
	ended := now.Add(-time.Minute)
	putRecording(t, st, recordings.Meta{ID: "ended", Start: now.Add(-time.Hour), End: &ended, Format: "jpeg", Targets: []recordings.Target{}})

	s, release := reg.Recordings.Open("test", st, 2*time.Hour)
	defer release()
	eventually(t, "the crashed recording closed at the store's opening", func() bool {
		m, err := s.Meta(ctx, "crashed")
		return err == nil && m.End != nil && m.Stopped == "incomplete"
	})

	live := s.Begin(recordings.Meta{ID: "live", Provider: "p"}, recordings.Options{})
	l := &LiveRecording{Recording: live, Session: "live", Provider: "p", Store: s}
	reg.Recordings.Add(l)
	eventually(t, "the live recording's first meta", func() bool { _, err := s.Meta(ctx, "live"); return err == nil })
	first, _ := s.Meta(ctx, "live")

	// Three hours on, minute by minute: the ended recordings expire, the
	// live one is touched.
	for i := 0; i < 180; i++ {
		clock.Advance(time.Minute)
	}
	eventually(t, "expired recordings deleted", func() bool {
		_, e1 := s.Meta(ctx, "crashed")
		_, e2 := s.Meta(ctx, "ended")
		return errors.Is(e1, recordings.ErrNotFound) && errors.Is(e2, recordings.ErrNotFound)
	})
	eventually(t, "the live recording touched", func() bool {
		m, err := s.Meta(ctx, "live")
		return err == nil && m.Updated.After(first.Updated) && m.End == nil
	})
	if err := reg.Recordings.Delete(ctx, "live"); !errors.Is(err, ErrRecordingLive) {
		t.Fatalf("deleting a live recording: %v", err)
	}
	if got := reg.Recordings.Live(); len(got) != 1 || got[0].ID() != "live" {
		t.Fatalf("live %v", got)
	}
	list, err := reg.Recordings.List(ctx, 0)
	if err != nil || len(list) != 1 || list[0].ID != "live" {
		t.Fatalf("list %v %v", list, err)
	}
	live.End()
	<-live.Done()
	reg.Recordings.Remove(l)
	if err := reg.Recordings.Delete(ctx, "live"); err != nil {
		t.Fatal(err)
	}
}
