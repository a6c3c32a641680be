package recordings

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	_ "image/jpeg" // frames' sizes
	_ "image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrNoFFmpeg is Video's error when ffmpeg is not on the PATH.
var ErrNoFFmpeg = errors.New("ffmpeg is not on the gateway's PATH: install it (Debian: apt-get install ffmpeg) to serve recordings as video")

// lastFrame is how long the last frame of a video shows.
const lastFrame = 0.5

// Video writes target t of recording id as an MP4 (H.264) made by ffmpeg
// from its frames, each shown until the next one was drawn (the concat
// demuxer's durations, from the frames' times), into a file in dir, and
// returns its path; the caller removes it. Frames of other sizes than the
// first are scaled and padded to it.
func (s *Store) Video(ctx context.Context, id string, t int, dir string) (string, error) {
	bin, err := exec.LookPath("ffmpeg")
	if err != nil {
		return "", ErrNoFFmpeg
	}
	m, err := s.Meta(ctx, id)
	if err != nil {
		return "", err
	}
	if t < 0 || t >= len(m.Targets) || len(m.Targets[t].Frames) == 0 {
		return "", ErrNotFound
	}
	work, err := os.MkdirTemp(dir, "recording-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	times := m.Targets[t].Frames
	var list strings.Builder
	list.WriteString("ffconcat version 1.0\n")
	w, h := 0, 0
	for n := range times {
		img, err := s.st.Load(ctx, frameKey(id, t, n, m.Format))
		if err != nil {
			return "", fmt.Errorf("frame %d: %w", n, err)
		}
		if w == 0 {
			cfg, _, err := image.DecodeConfig(bytes.NewReader(img))
			if err != nil {
				return "", fmt.Errorf("frame %d: %w", n, err)
			}
			w, h = cfg.Width+cfg.Width%2, cfg.Height+cfg.Height%2
		}
		name := strconv.Itoa(n) + ext(m.Format)
		if err := os.WriteFile(filepath.Join(work, name), img, 0o600); err != nil {
			return "", err
		}
		d := lastFrame
		if n+1 < len(times) {
			d = max(float64(times[n+1]-times[n])/1000, 0.001)
		}
		fmt.Fprintf(&list, "file '%s'\nduration %.3f\n", name, d)
	}
	// The concat demuxer takes the last file's duration only when it is
	// listed once more.
	fmt.Fprintf(&list, "file '%s'\n", strconv.Itoa(len(times)-1)+ext(m.Format))
	if err := os.WriteFile(filepath.Join(work, "list.txt"), []byte(list.String()), 0o600); err != nil {
		return "", err
	}
	out, err := os.CreateTemp(dir, "recording-*.mp4")
	if err != nil {
		return "", err
	}
	out.Close()
	vf := fmt.Sprintf("scale=%d:%d:force_original_aspect_ratio=decrease,pad=%d:%d:(ow-iw)/2:(oh-ih)/2,format=yuv420p", w, h, w, h)
	cmd := exec.CommandContext(ctx, bin, "-hide_banner", "-loglevel", "error", "-nostdin", "-y",
		"-f", "concat", "-safe", "0", "-i", filepath.Join(work, "list.txt"),
		"-vf", vf, "-fps_mode", "vfr", "-c:v", "libx264", "-preset", "veryfast", "-movflags", "+faststart", out.Name())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		os.Remove(out.Name())
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 300 {
			msg = msg[:300]
		}
		return "", fmt.Errorf("ffmpeg: %v: %s", err, msg)
	}
	return out.Name(), nil
}
