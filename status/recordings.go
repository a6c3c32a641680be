package status

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/recordings"
)

// Recordings of CDP sessions, as operators read them: the admin API's
// routes under RecordingsPath, and what the dashboard serves of them (the
// same documents and images, through ServeRecordings and the live
// readers). A recording shows whatever was on the client's screen: it is
// served here and on the dashboard only, never on the client's URL, and
// nothing of it goes into a log or an event.

// RecordingsPath lists the stored recordings; RecordingsPath + "/<id>" is
// one, + "/<id>/targets/<t>/frames/<n>" a frame's image, +
// "/<id>/targets/<t>/video.mp4" a target's video.
const RecordingsPath = "/browser_failover/recordings"

// RecordingList is the document served at RecordingsPath: the recordings
// of every store the running handlers record into, newest first.
type RecordingList struct {
	Recordings []Recording `json:"recordings"`
}

// Recording is one recording in the list: its meta without the frames'
// times, and whether it is under way on this node.
type Recording struct {
	recordings.Summary
	Live bool `json:"live"`
}

// ListRecordings lists the recordings, newest first, at most limit (0:
// all).
func ListRecordings(r *http.Request, reg *pool.Registry, limit int) (RecordingList, error) {
	out := RecordingList{Recordings: []Recording{}}
	if reg == nil {
		return out, nil
	}
	list, err := reg.Recordings.List(r.Context(), limit)
	for _, s := range list {
		_, live := reg.Recordings.LiveOne(s.ID)
		out.Recordings = append(out.Recordings, Recording{Summary: s, Live: live})
	}
	return out, err
}

// LiveRecording is a recording under way on this node, for the live view.
type LiveRecording struct {
	// ID is the recording's; Session its session's ID now (a resumed
	// session goes on under the first one's recording).
	ID       string    `json:"id"`
	Session  string    `json:"session"`
	Provider string    `json:"provider"`
	Started  time.Time `json:"started"`
	Format   string    `json:"format"`
	Frames   int64     `json:"frames"`
	Dropped  int64     `json:"dropped"`
	// Targets are its pages; Newest is when each one's latest frame was
	// drawn (null before the first), N that frame's number.
	Targets []LiveTarget `json:"targets"`
}

// LiveTarget is one page of a recording under way.
type LiveTarget struct {
	Index  int        `json:"index"`
	URL    string     `json:"url"`
	Title  string     `json:"title"`
	Frames int        `json:"frames"`
	Newest *time.Time `json:"newest"`
	N      int        `json:"n"`
}

// LiveRecordings lists the recordings under way on this node, oldest
// first.
func LiveRecordings(reg *pool.Registry) []LiveRecording {
	out := []LiveRecording{}
	if reg == nil {
		return out
	}
	for _, l := range reg.Recordings.Live() {
		m := l.Meta()
		lr := LiveRecording{ID: m.ID, Session: l.Session, Provider: l.Provider, Started: m.Start.UTC(), Format: m.Format,
			Frames: m.Frames, Dropped: m.Dropped, Targets: make([]LiveTarget, 0, len(m.Targets))}
		for _, t := range m.Targets {
			lt := LiveTarget{Index: t.Index, URL: t.URL, Title: t.Title, Frames: len(t.Frames)}
			if n, ok := l.Newest(t.Index); ok {
				at := n.At.UTC()
				lt.Newest, lt.N = &at, n.N
			}
			lr.Targets = append(lr.Targets, lt)
		}
		out = append(out, lr)
	}
	return out
}

// NewestFrame is the latest frame of target t of recording id under way
// on this node: its image, MIME type, when it was drawn and its number.
func NewestFrame(reg *pool.Registry, id string, t int) ([]byte, string, time.Time, int, bool) {
	if reg == nil {
		return nil, "", time.Time{}, 0, false
	}
	n, ct, ok := reg.Recordings.Newest(id, t)
	return n.Image, ct, n.At, n.N, ok
}

func (a Admin) handleRecordings(w http.ResponseWriter, r *http.Request) error {
	return ServeRecordings(w, r, a.registry(), strings.TrimPrefix(r.URL.Path, RecordingsPath))
}

// ServeRecordings serves the recordings' routes; sub is the path after
// RecordingsPath ("" or "/…"). The dashboard serves the same under its
// own path. Errors are caddy.APIErrors (the admin API renders them as
// JSON).
func ServeRecordings(w http.ResponseWriter, r *http.Request, reg *pool.Registry, sub string) error {
	parts := strings.Split(strings.Trim(sub, "/"), "/")
	if sub == "" || sub == "/" {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			return methodNotAllowed(w, "GET, HEAD")
		}
		limit := 0
		if v := r.URL.Query().Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("limit %q: want a positive number", v)}
			}
			limit = n
		}
		list, err := ListRecordings(r, reg, limit)
		if err != nil && len(list.Recordings) == 0 {
			return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: fmt.Errorf("reading the recordings' storage: %w", err)}
		}
		return writeJSON(w, r, list)
	}
	id := parts[0]
	if !recordings.ValidID(id) || reg == nil {
		return notFound(fmt.Sprintf("no recording %q", id))
	}
	switch {
	case len(parts) == 1:
		return serveRecording(w, r, reg, id)
	case len(parts) == 5 && parts[1] == "targets" && parts[3] == "frames":
		t, terr := strconv.Atoi(parts[2])
		n, nerr := strconv.Atoi(parts[4])
		if terr != nil || nerr != nil {
			return notFound("want /browser_failover/recordings/<id>/targets/<t>/frames/<n>")
		}
		return serveFrame(w, r, reg, id, t, n)
	case len(parts) == 4 && parts[1] == "targets" && parts[3] == "video.mp4":
		t, err := strconv.Atoi(parts[2])
		if err != nil {
			return notFound("want /browser_failover/recordings/<id>/targets/<t>/video.mp4")
		}
		return serveVideo(w, r, reg, id, t)
	}
	return notFound("want /browser_failover/recordings/<id>, …/targets/<t>/frames/<n> or …/targets/<t>/video.mp4")
}

// recordingError is the API error of err, about recording id.
func recordingError(id string, err error) error {
	switch {
	case errors.Is(err, recordings.ErrNotFound):
		return notFound(fmt.Sprintf("no recording %q, or not that target or frame", id))
	case errors.Is(err, pool.ErrRecordingLive):
		return caddy.APIError{HTTPStatus: http.StatusConflict, Err: err}
	case errors.Is(err, recordings.ErrNoFFmpeg):
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
}

// serveRecording serves a recording's meta (GET) or deletes it (DELETE).
func serveRecording(w http.ResponseWriter, r *http.Request, reg *pool.Registry, id string) error {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		m, err := reg.Recordings.Meta(r.Context(), id)
		if err != nil {
			return recordingError(id, err)
		}
		return writeJSON(w, r, m)
	case http.MethodDelete:
		out, err := DeleteRecording(r.Context(), reg, id)
		if err != nil {
			return err
		}
		return writeJSON(w, r, out)
	}
	return methodNotAllowed(w, "GET, HEAD, DELETE")
}

// DeleteRecording deletes recording id (not one under way) and returns
// the answer to the deletion; errors are caddy.APIErrors. The admin API's
// DELETE and the dashboard's Delete button both come here.
func DeleteRecording(ctx context.Context, reg *pool.Registry, id string) (map[string]string, error) {
	if !recordings.ValidID(id) || reg == nil {
		return nil, notFound(fmt.Sprintf("no recording %q", id))
	}
	if err := reg.Recordings.Delete(ctx, id); err != nil {
		return nil, recordingError(id, err)
	}
	return map[string]string{"deleted": id}, nil
}

// serveFrame serves one frame's image.
func serveFrame(w http.ResponseWriter, r *http.Request, reg *pool.Registry, id string, t, n int) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return methodNotAllowed(w, "GET, HEAD")
	}
	img, ct, err := reg.Recordings.Frame(r.Context(), id, t, n)
	if err != nil {
		return recordingError(id, err)
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Content-Length", strconv.Itoa(len(img)))
	w.Header().Set("Cache-Control", "private, max-age=3600")
	if r.Method == http.MethodHead {
		return nil
	}
	_, err = w.Write(img)
	return err
}

// serveVideo serves a target's frames as an MP4 made by ffmpeg.
func serveVideo(w http.ResponseWriter, r *http.Request, reg *pool.Registry, id string, t int) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return methodNotAllowed(w, "GET, HEAD")
	}
	file, err := reg.Recordings.Video(r.Context(), id, t, os.TempDir())
	if err != nil {
		return recordingError(id, err)
	}
	defer os.Remove(file)
	f, err := os.Open(file)
	if err != nil {
		return recordingError(id, err)
	}
	defer f.Close()
	w.Header().Set("Content-Type", "video/mp4")
	w.Header().Set("Cache-Control", "no-store")
	http.ServeContent(w, r, "video.mp4", time.Time{}, f)
	return nil
}
