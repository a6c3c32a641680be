package e2e

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp/remote"
	"github.com/coder/websocket"

	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/recordings"
	"github.com/browserfailover/caddy-browser-failover/status"
)

// recorded is the handler option that records every CDP session.
const recordAll = `"recording":{"sessions":"all"}`

// noted is one message of a client's stream as js/record.mjs notes it.
type noted struct {
	ID        *int64 `json:"id"`
	Method    string `json:"method"`
	SessionID string `json:"sessionId"`
	Error     bool   `json:"error"`
	Announces string `json:"announces"`
	Type      string `json:"type"`
}

// clientStream is what a client sent and got.
type clientStream struct {
	sent, got []noted
}

// readStream reads record.mjs's SENT and GOT lines.
func readStream(t *testing.T, out string) clientStream {
	t.Helper()
	var s clientStream
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		dir, rest, _ := strings.Cut(sc.Text(), " ")
		var n noted
		switch dir {
		case "SENT", "GOT":
			if err := json.Unmarshal([]byte(rest), &n); err != nil {
				t.Fatalf("%s: %v", sc.Text(), err)
			}
		default:
			continue
		}
		if dir == "SENT" {
			s.sent = append(s.sent, n)
		} else {
			s.got = append(s.got, n)
		}
	}
	if len(s.sent) == 0 || len(s.got) == 0 {
		t.Fatalf("no stream noted:\n%s", out)
	}
	return s
}

// checkOwnStream checks that everything the client got is its own: one
// answer to each command it sent, in the session it sent it in, no answer
// to anything else, and events only of the root session or of sessions
// announced to it (after their announcement). It returns, per announced
// session's target type and for the root, the event methods seen, and the
// commands' methods with whether each was answered with an error, in the
// order sent.
func checkOwnStream(t *testing.T, s clientStream) (events map[string][]string, commands []string) {
	t.Helper()
	sentIn := map[int64]noted{}
	for _, c := range s.sent {
		if c.ID == nil {
			t.Fatalf("the client sent a command without an ID: %+v", c)
		}
		sentIn[*c.ID] = c
	}
	answered := map[int64]bool{}
	known := map[string]string{"": "root"}
	events = map[string][]string{}
	errs := map[int64]bool{}
	for _, m := range s.got {
		role, ok := known[m.SessionID]
		if !ok {
			t.Fatalf("the client got a message of a session never announced to it: %+v", m)
		}
		if m.ID != nil {
			c, mine := sentIn[*m.ID]
			if !mine {
				t.Fatalf("the client got an answer to an ID it never sent: %d in session %q (error %v)", *m.ID, m.SessionID, m.Error)
			}
			if answered[*m.ID] {
				t.Fatalf("the client got two answers to ID %d", *m.ID)
			}
			if c.SessionID != m.SessionID {
				t.Fatalf("answer %d in session %q, its command in %q", *m.ID, m.SessionID, c.SessionID)
			}
			answered[*m.ID] = true
			errs[*m.ID] = m.Error
			continue
		}
		if m.Method == "Target.attachedToTarget" && m.Announces != "" {
			known[m.Announces] = m.Type
		}
		if !slices.Contains(events[role], m.Method) {
			events[role] = append(events[role], m.Method)
		}
	}
	for _, c := range s.sent {
		if !answered[*c.ID] {
			// A command the client gave up on at its disconnect is
			// fine only at the very end.
			continue
		}
		w := c.Method
		if errs[*c.ID] {
			w += "!"
		}
		commands = append(commands, w)
	}
	for role := range events {
		sort.Strings(events[role])
	}
	return events, commands
}

// recordingOf waits for the session ended entry of a recorded session and
// returns its recording's ID, and the entry's recording field.
func recordingOfEnded(t *testing.T, g *testgw.Gateway, n int) (string, any) {
	t.Helper()
	var rec any
	testgw.Eventually(t, 15*time.Second, fmt.Sprintf("%d sessions' end", n), func() bool {
		return len(g.LogEntries("session ended")) >= n
	})
	e := g.LogEntries("session ended")[n-1]
	rec = e["recording"]
	m, ok := rec.(map[string]any)
	if !ok {
		t.Fatalf("session ended entry's recording: %#v", e["recording"])
	}
	return fmt.Sprint(m["id"]), rec
}

// recordingMeta reads a recording's meta through the admin API.
func recordingMeta(t *testing.T, g *testgw.Gateway, id string) recordings.Meta {
	t.Helper()
	code, b, err := g.AdminDo(http.MethodGet, status.RecordingsPath+"/"+id, nil)
	if err != nil || code != 200 {
		t.Fatalf("recording %s: %d %v %s", id, code, err, b)
	}
	var m recordings.Meta
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// checkTwoTargets checks that a recording has frames of the flow's page
// (its last URL the third navigation's) and of its popup, each in order,
// the popup's after the page's first; it returns their indexes.
func checkTwoTargets(t *testing.T, m recordings.Meta) (pageT, popupT int) {
	t.Helper()
	pageT, popupT = -1, -1
	for _, tg := range m.Targets {
		switch {
		case strings.Contains(tg.URL, "<title>three</title>") || strings.Contains(tg.URL, "%3Ctitle%3Ethree"):
			pageT = tg.Index
		case tg.Title == "popup":
			popupT = tg.Index
		}
		if !slices.IsSorted(tg.Frames) {
			t.Fatalf("target %d's frames out of order: %v", tg.Index, tg.Frames)
		}
	}
	if pageT < 0 || popupT < 0 {
		t.Fatalf("the recording lacks the page or the popup: %+v", summary(m))
	}
	p, q := m.Targets[pageT], m.Targets[popupT]
	if len(p.Frames) == 0 || len(q.Frames) == 0 {
		t.Fatalf("frames: page %d, popup %d; want some of each: %+v", len(p.Frames), len(q.Frames), summary(m))
	}
	if q.Frames[0] < p.Frames[0] {
		t.Fatalf("the popup's first frame (%d) before the page's (%d)", q.Frames[0], p.Frames[0])
	}
	if q.Title != "popup" || p.Title != "three" {
		t.Fatalf("titles %q and %q", p.Title, q.Title)
	}
	return pageT, popupT
}

func summary(m recordings.Meta) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d frames, %d dropped, stopped %q;", m.Frames, m.Dropped, m.Stopped)
	for _, tg := range m.Targets {
		fmt.Fprintf(&b, " [%d %.60s %q %d frames]", tg.Index, tg.URL, tg.Title, len(tg.Frames))
	}
	return b.String()
}

// checkRecordingSecret checks that nothing of recording id — its page's
// URL and title, a frame's bytes — is in the gateway's log, status,
// sessions list or metrics; only the recordings' own API serves them.
func checkRecordingSecret(t *testing.T, g *testgw.Gateway, id string, tg int) {
	t.Helper()
	_, img, _ := g.AdminDo(http.MethodGet, fmt.Sprintf("%s/%s/targets/%d/frames/0", status.RecordingsPath, id, tg), nil)
	secrets := []string{"font-size:80px", "<title>three", `\u003ctitle\u003ethree`, "%3Ctitle%3Ethree", base64.StdEncoding.EncodeToString(img[100:160])}
	_, meta, _ := g.AdminDo(http.MethodGet, status.RecordingsPath+"/"+id, nil)
	if !strings.Contains(string(meta), secrets[0]) {
		t.Fatalf("the recording's meta lacks its page's URL: %.300s", meta)
	}
	places := map[string]string{"log": g.Logs()}
	for _, path := range []string{status.StatusPath, status.SessionsPath, "/metrics", status.RecordingsPath} {
		_, b, _ := g.AdminDo(http.MethodGet, path, nil)
		places[path] = string(b)
	}
	for where, text := range places {
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Fatalf("%q of the recording is in the %s", s, where)
			}
		}
	}
}

// frameOK fetches frame n of target tg and checks it is a JPEG.
func frameOK(t *testing.T, g *testgw.Gateway, id string, tg, n int) {
	t.Helper()
	code, b, err := g.AdminDo(http.MethodGet, fmt.Sprintf("%s/%s/targets/%d/frames/%d", status.RecordingsPath, id, tg, n), nil)
	if err != nil || code != 200 || len(b) < 4 || b[0] != 0xFF || b[1] != 0xD8 {
		t.Fatalf("frame %d/%d: %d %v (%d bytes)", tg, n, code, err, len(b))
	}
}

// TestRecordingPuppeteer: Puppeteer's flow — three navigations and a popup
// — through a gateway that records every CDP session: the client's own
// stream has nothing of the gateway's (one answer per command, events only
// of its own sessions) and matches the same flow through a gateway that
// does not record (the same commands answered the same way, the same
// events per kind of session); the recording has frames of the page and
// of the popup, in order, served as images, and its MP4 from ffmpeg
// probes as H.264 with a duration. The sessions API shows the recording
// while the session is live; the metrics count its frames.
func TestRecordingPuppeteer(t *testing.T) {
	Require(t, true)
	chr := StartChromium(t)
	local := provider("local", chr.WSURL(), "")

	g := testgw.Start(t, handler("", local))
	plain := readStream(t, RunNode(t, "record.mjs", "puppeteer", g.WS("/")))
	if err := g.Reload(handler(recordAll, local)); err != nil {
		t.Fatal(err)
	}
	out := RunNode(t, "record.mjs", "puppeteer", g.WS("/"))
	recorded := readStream(t, out)
	plainEvents, plainCommands := checkOwnStream(t, plain)
	recEvents, recCommands := checkOwnStream(t, recorded)
	if strings.Join(plainCommands, " ") != strings.Join(recCommands, " ") {
		t.Fatalf("the client's commands and their answers differ with recording:\nwithout: %v\nwith:    %v", plainCommands, recCommands)
	}
	for _, role := range []string{"root", "page"} {
		if strings.Join(plainEvents[role], " ") != strings.Join(recEvents[role], " ") {
			t.Fatalf("the client's %s events differ with recording:\nwithout: %v\nwith:    %v", role, plainEvents[role], recEvents[role])
		}
	}

	id, _ := recordingOfEnded(t, g, 2)
	m := recordingMeta(t, g, id)
	if m.End == nil || m.Provider != "local" || m.Dropped != 0 || m.Format != "jpeg" {
		t.Fatalf("recording %s", summary(m))
	}
	pageT, popupT := checkTwoTargets(t, m)
	frameOK(t, g, id, pageT, 0)
	frameOK(t, g, id, popupT, len(m.Targets[popupT].Frames)-1)
	checkRecordingSecret(t, g, id, pageT)

	// The list has it, newest first.
	code, b, _ := g.AdminDo(http.MethodGet, status.RecordingsPath+"?limit=1", nil)
	var list status.RecordingList
	if json.Unmarshal(b, &list) != nil || code != 200 || len(list.Recordings) != 1 || list.Recordings[0].ID != id || list.Recordings[0].Live {
		t.Fatalf("recordings list: %d %s", code, b)
	}
	// Its video.
	if _, err := exec.LookPath("ffprobe"); err != nil {
		t.Fatal("ffprobe missing: e2e/setup.sh installs ffmpeg")
	}
	code, b, err := g.AdminDo(http.MethodGet, fmt.Sprintf("%s/%s/targets/%d/video.mp4", status.RecordingsPath, id, pageT), nil)
	if err != nil || code != 200 {
		t.Fatalf("video: %d %v %.300s", code, err, b)
	}
	file := filepath.Join(t.TempDir(), "page.mp4")
	os.WriteFile(file, b, 0o600)
	codec, dur := probeVideo(t, file)
	if codec != "h264" || dur <= 0 {
		t.Fatalf("the video: codec %q, duration %v", codec, dur)
	}
	// The metrics.
	_, mb, _ := g.AdminDo(http.MethodGet, "/metrics", nil)
	if !strings.Contains(string(mb), `caddy_browser_failover_recording_frames_total{provider="local"}`) {
		t.Fatalf("no recording_frames_total in the metrics")
	}
	// Deleting it.
	if code, _, _ := g.AdminDo(http.MethodDelete, status.RecordingsPath+"/"+id, nil); code != 200 {
		t.Fatalf("delete: %d", code)
	}
	if code, _, _ := g.AdminDo(http.MethodGet, status.RecordingsPath+"/"+id, nil); code != 404 {
		t.Fatalf("after delete: %d", code)
	}
}

// TestRecordingPlaywrightAndChromedp: Playwright's connectOverCDP runs the
// same flow with its session recorded (frames of the page and the
// popup), and chromedp its own flow, recorded too; each client's run is
// unchanged.
func TestRecordingPlaywrightAndChromedp(t *testing.T) {
	Require(t, true)
	chr := StartChromium(t)
	g := testgw.Start(t, handler(recordAll, provider("local", chr.WSURL(), "")))
	out := RunNode(t, "record.mjs", "pw-cdp", g.WS("/"))
	if !strings.Contains(out, "TITLES one two three popup") {
		t.Fatalf("playwright: %s", out)
	}
	id, _ := recordingOfEnded(t, g, 1)
	checkTwoTargets(t, recordingMeta(t, g, id))

	runChromedp(t, g.WS("/"), func() {
		// While the session is live the sessions list shows its
		// recording.
		testgw.Eventually(t, 10*time.Second, "the live session's recording", func() bool {
			_, b, _ := g.AdminDo(http.MethodGet, status.SessionsPath, nil)
			var list status.Sessions
			json.Unmarshal(b, &list)
			for _, s := range list.Sessions {
				if m, ok := s.Recording.(map[string]any); ok && m["frames"].(float64) > 0 {
					return true
				}
			}
			return false
		})
	}, remote.NoModifyURL)
	id2, _ := recordingOfEnded(t, g, 2)
	m := recordingMeta(t, g, id2)
	if m.Frames == 0 {
		t.Fatalf("chromedp's recording: %s", summary(m))
	}
	found := false
	for _, tg := range m.Targets {
		found = found || tg.Title == "hello e2e"
	}
	if !found {
		t.Fatalf("chromedp's page is not in its recording: %s", summary(m))
	}
}

// TestRecordingBrowserless: real browserless v2, which starts a browser
// per connection, recorded on the client's own connection: the flow runs
// and the recording has the page and the popup.
func TestRecordingBrowserless(t *testing.T) {
	Require(t, true)
	bl := StartBrowserless(t, 2, 0)
	g := testgw.Start(t, handler(recordAll, provider("bl", bl, "")))
	out := RunNode(t, "record.mjs", "puppeteer", g.WS("/"))
	checkOwnStream(t, readStream(t, out))
	id, _ := recordingOfEnded(t, g, 1)
	checkTwoTargets(t, recordingMeta(t, g, id))
}

// TestRecordingPageEndpointUnavailable: a provider whose URL is a page's
// DevTools endpoint (/devtools/page/…) cannot be followed: the session
// runs unrecorded, and its end entry says why.
func TestRecordingPageEndpointUnavailable(t *testing.T) {
	Require(t, false)
	chr := StartChromium(t)
	resp, err := http.Get(chr.HTTPURL() + "/json/list")
	if err != nil {
		t.Fatal(err)
	}
	var targets []struct {
		Type string `json:"type"`
		WS   string `json:"webSocketDebuggerUrl"`
	}
	json.NewDecoder(resp.Body).Decode(&targets)
	resp.Body.Close()
	var pageWS string
	for _, tg := range targets {
		if tg.Type == "page" {
			pageWS = tg.WS
		}
	}
	if pageWS == "" {
		t.Fatal("no page target")
	}
	g := testgw.Start(t, handler(recordAll, provider("page", pageWS, "")))
	c, _ := viaGateway(t, g, 1)
	c.CloseNow()
	testgw.Eventually(t, 10*time.Second, "the session's end", func() bool { return len(g.LogEntries("session ended")) == 1 })
	rec, _ := g.LogEntries("session ended")[0]["recording"].(string)
	if !strings.HasPrefix(rec, "unavailable: ") || !strings.Contains(rec, "/devtools/page/") {
		t.Fatalf("recording %q", rec)
	}
	code, b, _ := g.AdminDo(http.MethodGet, status.RecordingsPath, nil)
	if code != 200 || !strings.Contains(string(b), `"recordings":[]`) {
		t.Fatalf("recordings: %d %s", code, b)
	}
}

// probeVideo reads a video's codec and duration with ffprobe.
func probeVideo(t *testing.T, file string) (string, float64) {
	t.Helper()
	out, err := exec.Command("ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "stream=codec_name:format=duration", "-of", "json", file).Output()
	if err != nil {
		t.Fatalf("ffprobe: %v", err)
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
	fmt.Sscan(p.Format.Duration, &d)
	return p.Streams[0].Codec, d
}

// liveRecording waits until session id's recording (the sessions list's)
// has stored at least n frames, and returns its ID.
func liveRecording(t *testing.T, g *testgw.Gateway, id string, n float64) string {
	t.Helper()
	var rec string
	testgw.Eventually(t, 20*time.Second, fmt.Sprintf("session %s's recording to have %v frames", id, n), func() bool {
		s, ok := listed(t, g, id)
		if !ok {
			return false
		}
		m, _ := s.Recording.(map[string]any)
		if f, _ := m["frames"].(float64); f >= n {
			rec = fmt.Sprint(m["id"])
			return true
		}
		return false
	})
	return rec
}

// openPage has a raw CDP client open a page whose title is title.
func openPage(t *testing.T, c *websocket.Conn, id int, title string) {
	t.Helper()
	cdpCall(t, c, id, "Target.createTarget", map[string]any{"url": "data:text/html,<title>" + title + "</title><h1>" + title + "</h1>"})
}

// TestRecordingResumed: a recorded CDP session whose client leaves and
// resumes — the provider's connection closed and dialled again, or held —
// goes on under the same recording: the resumed session's recording is
// the first one's, and holds the pages of both clients.
func TestRecordingResumed(t *testing.T) {
	for _, hold := range []bool{false, true} {
		t.Run(fmt.Sprintf("hold=%v", hold), func(t *testing.T) {
			Require(t, false)
			chr := StartChromium(t)
			resume := `"resume":{"window":"1m"}`
			if hold {
				resume = `"resume":{"window":"1m","hold":true}`
			}
			g := testgw.Start(t, handler(recordAll+","+resume, provider("local", chr.WSURL(), "")))
			tok := resumeToken(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c, resp, err := websocket.Dial(ctx, g.WS("/?bf_resume_token="+tok), nil)
			if err != nil {
				t.Fatal(err)
			}
			first := resp.Header.Get("Browser-Failover-Session")
			openPage(t, c, 1, "before")
			rec := liveRecording(t, g, first, 1)
			if rec != first {
				t.Fatalf("recording %q of session %q", rec, first)
			}
			waitTitled(t, g, rec, "before")
			c.Close(websocket.StatusNormalClosure, "")
			logEntry(t, g, "session parked", "session_id", first)

			c2, resp2, err := websocket.Dial(ctx, g.WS("/?bf_resume="+tok), nil)
			if err != nil {
				t.Fatal(err)
			}
			second := resp2.Header.Get("Browser-Failover-Session")
			openPage(t, c2, 2, "after")
			if got := liveRecording(t, g, second, 1); got != rec {
				t.Fatalf("the resumed session's recording is %q, want %q", got, rec)
			}
			waitTitled(t, g, rec, "after")
			c2.Close(websocket.StatusNormalClosure, "")
			logEntry(t, g, "session parked", "session_id", second)
			endParked(t, g, second)
			testgw.Eventually(t, 20*time.Second, "the recording to end", func() bool {
				m := recordingMeta(t, g, rec)
				return m.End != nil && !strings.Contains(string(must(g.AdminDo(http.MethodGet, status.RecordingsPath, nil))), `"live":true`)
			})
			m := recordingMeta(t, g, rec)
			titles := map[string]int{}
			for _, tg := range m.Targets {
				titles[tg.Title] += len(tg.Frames)
			}
			if titles["before"] == 0 || titles["after"] == 0 || m.ID != first {
				t.Fatalf("the recording lacks a client's page: %s", summary(m))
			}
			code, b, _ := g.AdminDo(http.MethodGet, status.RecordingsPath, nil)
			var list status.RecordingList
			if json.Unmarshal(b, &list) != nil || code != 200 || len(list.Recordings) != 1 {
				t.Fatalf("recordings: %s", b)
			}
		})
	}
}

// waitTitled waits until recording rec has frames of a page titled
// title. A page's title reaches the recording after its URL (the browser
// tells it once the page is parsed); a client that leaves at once may end
// the session before it does.
func waitTitled(t *testing.T, g *testgw.Gateway, rec, title string) {
	t.Helper()
	testgw.Eventually(t, 20*time.Second, "frames of the page titled "+title, func() bool {
		for _, tg := range recordingMeta(t, g, rec).Targets {
			if tg.Title == title && len(tg.Frames) > 0 {
				return true
			}
		}
		return false
	})
}

// must is the body of an admin call.
func must(_ int, b []byte, _ error) []byte { return b }

// TestRecordingWarm: a warm session handed to a client, with every CDP
// session recorded, is recorded from its hand-out on.
func TestRecordingWarm(t *testing.T) {
	Require(t, false)
	chr := StartChromium(t)
	g := testgw.Start(t, handler(recordAll, provider("warm-rec", chr.WSURL(), `"warm":1`)))
	testgw.Eventually(t, 20*time.Second, "a warm session ready", func() bool {
		p, ok := pool.Current().Lookup("warm-rec")
		ready, _ := p.Warm()
		return ok && ready == 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, g.WS("/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Header.Get("Browser-Failover-Session")
	openPage(t, c, 1, "warm")
	liveRecording(t, g, id, 1)
	c.Close(websocket.StatusNormalClosure, "")
	testgw.Eventually(t, 20*time.Second, "the session's end", func() bool { return len(g.LogEntries("session ended")) == 1 })
	e := g.LogEntries("session ended")[0]
	if e["warm"] != true {
		t.Fatalf("not the warm session: %v", e)
	}
	if m, _ := e["recording"].(map[string]any); m == nil || m["frames"].(float64) < 1 {
		t.Fatalf("recording %v", e["recording"])
	}
}
