package status

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/recordings"
)

// recorded is a registry with a store holding one ended recording
// ("ended", two targets of two frames each) and one under way ("live",
// one target of one frame), with the frames' images.
func recorded(t *testing.T) (reg *pool.Registry, endedImg, liveImg []byte) {
	t.Helper()
	reg = pool.NewRegistry(nil)
	t.Cleanup(func() { reg.Destruct() })
	s, release := reg.Recordings.Open("test", &certmagic.FileStorage{Path: t.TempDir()}, 0)
	t.Cleanup(release)
	// Not real JPEGs: the store keeps whatever bytes the browser sent.
	endedImg = []byte("\xff\xd8ended-frame-bytes")
	liveImg = []byte("\xff\xd8live-frame-bytes")
	at := time.Now()

	e := s.Begin(recordings.Meta{ID: "ended", Provider: "p1"}, recordings.Options{})
	e.Target("T1", "data:text/html,<title>one</title>", "one")
	e.Target("T2", "about:blank", "popup")
	for i, tg := range []string{"T1", "T1", "T2", "T2"} {
		e.Frame(tg, []byte(base64.StdEncoding.EncodeToString(endedImg)), at.Add(time.Duration(i)*100*time.Millisecond))
	}
	e.End()
	<-e.Done()

	l := s.Begin(recordings.Meta{ID: "live", Provider: "p2"}, recordings.Options{})
	reg.Recordings.Add(&pool.LiveRecording{Recording: l, Session: "live", Provider: "p2", Store: s})
	t.Cleanup(func() { l.End(); <-l.Done() })
	l.Target("L1", "data:text/html,<title>watch</title>", "watch")
	l.Frame("L1", []byte(base64.StdEncoding.EncodeToString(liveImg)), at)
	for i := 0; ; i++ {
		if _, ok := l.Newest(0); ok {
			break
		}
		if i > 3000 {
			t.Fatal("the live recording's frame not stored within 15s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return reg, endedImg, liveImg
}

// adminGet is what the admin API's recordings route answers to GET sub.
func adminGet(t *testing.T, reg *pool.Registry, sub string) (int, []byte) {
	t.Helper()
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "http://localhost:2019"+RecordingsPath+sub, nil)
	if err := ServeRecordings(w, r, reg, sub); err != nil {
		// The admin API renders its errors as {"error": …} as well.
		w = httptest.NewRecorder()
		if dashAPI(w, err) != nil {
			t.Fatalf("GET %s: %v", sub, err)
		}
	}
	return w.Code, w.Body.Bytes()
}

// TestDashboardRecordings: the dashboard serves the recordings' documents
// and images as the admin API does, through the same functions, under
// any prefix: the list, a meta, a frame; a live recording's newest frame
// per target; a video names ffmpeg when it is missing. Its answers are
// not to be stored or framed.
func TestDashboardRecordings(t *testing.T) {
	reg, endedImg, liveImg := recorded(t)
	d := dashboard(t, reg, false)
	for _, prefix := range []string{"", "/dash", "/ops/dashboard"} {
		for _, sub := range []string{"", "/ended", "/ended/targets/1/frames/1", "/live", "/nothing"} {
			path := prefix + "/recordings" + sub
			if sub == "" {
				path = prefix + "/recordings.json"
			}
			w := do(t, d, http.MethodGet, path, false, nil)
			code, want := adminGet(t, reg, sub)
			if w.Code != code || !bytes.Equal(w.Body.Bytes(), want) {
				t.Fatalf("GET %s: %d %q; the admin API answers %d %q", path, w.Code, w.Body, code, want)
			}
			if w.Header().Get("X-Frame-Options") != "DENY" || w.Header().Get("X-Content-Type-Options") != "nosniff" {
				t.Fatalf("GET %s: headers %v", path, w.Header())
			}
		}
	}
	// The page may show the frames it fetches, and nothing else's.
	if csp := do(t, d, http.MethodGet, "/dash/", false, nil).Header().Get("Content-Security-Policy"); !strings.Contains(csp, "img-src 'self' data:;") {
		t.Fatalf("the page's policy does not let it show its frames: %s", csp)
	}
	w := do(t, d, http.MethodGet, "/dash/recordings/ended/targets/0/frames/1", false, nil)
	if w.Code != 200 || !bytes.Equal(w.Body.Bytes(), endedImg) || w.Header().Get("Content-Type") != "image/jpeg" {
		t.Fatalf("frame: %d %q %v", w.Code, w.Body, w.Header())
	}
	var list RecordingList
	w = do(t, d, http.MethodGet, "/dash/recordings.json", false, nil)
	if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil || len(list.Recordings) != 2 ||
		list.Recordings[0].ID != "live" || !list.Recordings[0].Live || list.Recordings[1].ID != "ended" || list.Recordings[1].Targets != 2 {
		t.Fatalf("list: %s", w.Body)
	}
	w = do(t, d, http.MethodGet, "/dash/recordings.json?limit=x", false, nil)
	if w.Code != 400 || !strings.Contains(w.Body.String(), `"error":"limit`) {
		t.Fatalf("a bad limit: %d %s", w.Code, w.Body)
	}

	// The live view: the recordings under way, and each target's newest
	// frame.
	w = do(t, d, http.MethodGet, "/dash/live.json", false, nil)
	var live struct {
		Live []LiveRecording `json:"live"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &live); err != nil || len(live.Live) != 1 || live.Live[0].ID != "live" ||
		len(live.Live[0].Targets) != 1 || live.Live[0].Targets[0].Newest == nil || live.Live[0].Targets[0].Title != "watch" {
		t.Fatalf("live.json: %d %s", w.Code, w.Body)
	}
	w = do(t, d, http.MethodGet, "/dash/live/live/targets/0/frame", false, nil)
	if w.Code != 200 || !bytes.Equal(w.Body.Bytes(), liveImg) || w.Header().Get("X-Frame-Number") != "0" ||
		w.Header().Get("Content-Type") != "image/jpeg" || w.Header().Get("Cache-Control") != "no-store" {
		t.Fatalf("live frame: %d %q %v", w.Code, w.Body, w.Header())
	}
	for _, path := range []string{"/dash/live/live/targets/1/frame", "/dash/live/ended/targets/0/frame", "/dash/live/nothing/targets/0/frame", "/dash/live/live/targets/x/frame"} {
		if w := do(t, d, http.MethodGet, path, false, nil); w.Code != 404 || !strings.Contains(w.Body.String(), `"error"`) {
			t.Fatalf("GET %s: %d %s", path, w.Code, w.Body)
		}
	}
	if w := do(t, d, http.MethodPost, "/dash/live/live/targets/0/frame", true, nil); w.Code != 405 {
		t.Fatalf("POST of a live frame: %d", w.Code)
	}

	// A video without ffmpeg: 503 naming it, as the admin API says.
	t.Setenv("PATH", t.TempDir())
	w = do(t, d, http.MethodGet, "/dash/recordings/ended/targets/0/video.mp4", false, nil)
	if w.Code != 503 || !strings.Contains(w.Body.String(), "ffmpeg") {
		t.Fatalf("video without ffmpeg: %d %s", w.Code, w.Body)
	}
	if code, body := adminGet(t, reg, "/ended/targets/0/video.mp4"); code != 503 || !bytes.Equal(body, w.Body.Bytes()) {
		t.Fatalf("the admin API's video without ffmpeg: %d %s", code, body)
	}

	// A path of no recording's shape is the page.
	for _, path := range []string{"/recordings/", "/live/", "/dash/recordings/bad%20id", "/dash/recordings/ended/targets/0", "/ops/live/x/"} {
		if w := do(t, d, http.MethodGet, path, false, nil); w.Code != 200 || !strings.Contains(w.Body.String(), "<!DOCTYPE html>") {
			t.Fatalf("GET %s: %d %.80s", path, w.Code, w.Body)
		}
	}
}

// TestDashboardRecordingDelete: deleting a recording is an action like the
// others: a POST from the page itself with controls on, refused (403)
// otherwise and the recording kept; a recording under way is not deleted
// (409); the admin API's DELETE goes through the same function.
func TestDashboardRecordingDelete(t *testing.T) {
	reg, _, _ := recorded(t)
	exists := func(id string) bool {
		_, err := reg.Recordings.Meta(context.Background(), id)
		return err == nil
	}
	off := dashboard(t, reg, false)
	if w := do(t, off, http.MethodPost, "/dash/recordings/ended/delete", true, nil); w.Code != 403 || !strings.Contains(w.Body.String(), "controls are off") {
		t.Fatalf("delete with controls off: %d %s", w.Code, w.Body)
	}
	on := dashboard(t, reg, true)
	for name, hdr := range map[string]map[string]string{
		"another origin":         {"Origin": "http://evil.example"},
		"a cross-site fetch":     {"Sec-Fetch-Site": "cross-site"},
		"without the page's own": {DashboardHeader: ""},
	} {
		if w := do(t, on, http.MethodPost, "/dash/recordings/ended/delete", true, hdr); w.Code != 403 {
			t.Fatalf("delete from %s: %d %s", name, w.Code, w.Body)
		}
	}
	for _, m := range []string{http.MethodGet, http.MethodDelete} {
		if w := do(t, on, m, "/dash/recordings/ended/delete", true, nil); w.Code != 405 {
			t.Fatalf("%s of the delete action: %d", m, w.Code)
		}
	}
	if w := do(t, on, http.MethodDelete, "/dash/recordings/ended", true, nil); w.Code != 405 || w.Header().Get("Allow") != "GET, HEAD" {
		t.Fatalf("DELETE on the dashboard: %d %v", w.Code, w.Header())
	}
	if !exists("ended") {
		t.Fatal("a refused deletion deleted the recording")
	}
	if w := do(t, on, http.MethodPost, "/dash/recordings/live/delete", true, nil); w.Code != 409 || !strings.Contains(w.Body.String(), "under way") {
		t.Fatalf("delete of a recording under way: %d %s", w.Code, w.Body)
	}
	w := do(t, on, http.MethodPost, "/dash/recordings/ended/delete", true, nil)
	if w.Code != 200 || strings.TrimSpace(w.Body.String()) != `{"deleted":"ended"}` || exists("ended") {
		t.Fatalf("delete: %d %s", w.Code, w.Body)
	}
	if w := do(t, on, http.MethodPost, "/dash/recordings/ended/delete", true, nil); w.Code != 404 {
		t.Fatalf("delete again: %d %s", w.Code, w.Body)
	}
	if !exists("live") {
		t.Fatal("the live recording is gone")
	}
}

// TestDashboardRecordingsHost: a page of another site (its own name as
// Host) gets 403 and nothing of a recording from the new endpoints.
func TestDashboardRecordingsHost(t *testing.T) {
	reg, _, _ := recorded(t)
	d := dashboard(t, reg, true)
	for _, path := range []string{"/dash/live.json", "/dash/live/live/targets/0/frame", "/dash/recordings.json",
		"/dash/recordings/ended", "/dash/recordings/ended/targets/0/frames/0", "/dash/recordings/ended/targets/0/video.mp4",
		"/dash/recordings/ended/delete"} {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			r := httptest.NewRequest(method, "http://evil.example:8080"+path, nil)
			r.Header.Set(DashboardHeader, "1")
			w := httptest.NewRecorder()
			if err := d.ServeHTTP(w, r, nil); err != nil {
				t.Fatal(err)
			}
			body := w.Body.String()
			if w.Code != 403 || !strings.Contains(body, "evil.example") || strings.Contains(body, "frame-bytes") || strings.Contains(body, "title") {
				t.Fatalf("%s %s from evil.example: %d %.200s", method, path, w.Code, body)
			}
		}
	}
	if _, err := reg.Recordings.Meta(context.Background(), "ended"); err != nil {
		t.Fatal(fmt.Errorf("the recording is gone: %w", err))
	}
}
