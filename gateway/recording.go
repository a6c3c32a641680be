package gateway

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/cdp"
	"github.com/browserfailover/caddy-browser-failover/config"
	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/options"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/recordings"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Recording: a relayed CDP session the handler records has the gateway
// take part in it (package cdp: the relay's tap, on the client's own
// connection), its frames kept in the handler's store (package
// recordings, the registry's Recordings). Which sessions: those whose
// client stated the session option record, or every CDP session with
// `sessions all`; not when the client asked a provider that records itself
// (`supports record`). Fresh, warm, hedged and resumed sessions alike: a
// session's recording is its socket's (socket.go), and a resumed session
// goes on with the recording of the session it takes back. A session
// whose messages cannot be read (compression), or whose endpoint is a
// page's, runs unrecorded and says why.

// recording is a handler's recording option as provisioned.
type recording struct {
	cfg      *config.RecordingConfig
	store    *recordings.Store
	release  func()
	sc       cdp.Screencast
	maxBytes int64
}

// provisionRecording opens the handler's store of recordings: in its
// storage module, or Caddy's own storage.
func (h *Gateway) provisionRecording(ctx caddy.Context) error {
	rc := h.Recording
	if rc == nil {
		return nil
	}
	st, key, err := storageOf(ctx, rc, rc.Storage)
	if err != nil {
		return fmt.Errorf("recording storage: %w", err)
	}
	r := &recording{cfg: rc, maxBytes: rc.MaxBytes,
		sc: cdp.Screencast{Format: "jpeg", Quality: config.DefaultRecordingQuality,
			MaxWidth: config.DefaultRecordingMaxWidth, MaxHeight: config.DefaultRecordingMaxHeight, EveryNthFrame: 1}}
	if rc.Format != "" {
		r.sc.Format = rc.Format
	}
	if rc.Quality > 0 {
		r.sc.Quality = rc.Quality
	}
	if rc.MaxSize != "" {
		r.sc.MaxWidth, r.sc.MaxHeight, _ = config.ParseSize(rc.MaxSize)
	}
	if rc.EveryNthFrame > 0 {
		r.sc.EveryNthFrame = rc.EveryNthFrame
	}
	if r.maxBytes == 0 {
		r.maxBytes = config.DefaultRecordingMaxBytes
	}
	retention := config.DefaultRecordingRetention
	if rc.Retention != nil {
		retention = time.Duration(*rc.Retention)
	}
	r.store, r.release = h.reg.Recordings.Open(key, st, retention)
	h.rec = r
	return nil
}

// cleanupRecording gives the store's use back.
func (h *Gateway) cleanupRecording() {
	if h.rec != nil {
		h.rec.release()
	}
}

// honoursRecord reports whether the handler records the sessions of
// clients speaking proto itself: then every provider honours the session
// option record for them.
func (h *Gateway) honoursRecord(proto upstreams.Protocol) bool {
	return h.rec != nil && proto == upstreams.ProtocolCDP
}

// lacks lists what of options opts, of a client speaking proto, provider
// up cannot honour.
func (h *Gateway) lacks(up *upstreams.Provider, opts options.Set, proto upstreams.Protocol) []string {
	if h.honoursRecord(proto) {
		return up.Honours().Lacks(opts, options.Record)
	}
	return up.Honours().Lacks(opts)
}

// mayRecord reports whether the session of a client speaking proto with
// options opts is to be recorded here (unless the provider it gets records
// it itself).
func (h *Gateway) mayRecord(opts options.Set, proto upstreams.Protocol) bool {
	r := h.rec
	return r != nil && proto == upstreams.ProtocolCDP && (r.cfg.RecordsAll() || slices.Contains(opts.Asked(), options.Record))
}

// offerNoExtension takes the client's WebSocket extension offer
// (permessage-deflate) out of what the providers get, for a session that
// is to be recorded: a provider then answers without one, so the
// session's messages can be read, and the client gets a 101 without it
// (a server may always decline an extension; Playwright offers
// compression, Chrome accepts it).
func offerNoExtension(hs *upstreams.Handshake) {
	hs.Header.Del("Sec-Websocket-Extensions")
}

// sessionRecording is a relayed socket's recording: under way (rec, the
// participant p), or why not (unavailable).
type sessionRecording struct {
	rec         *recordings.Recording
	live        *pool.LiveRecording
	p           *cdp.Participant
	unavailable string
}

// tap is the relay's tap of the session (nil when it is not recorded).
func (sr *sessionRecording) tap() upstreams.Tap {
	if sr == nil || sr.p == nil {
		return nil
	}
	return sr.p
}

// recordingID is the ID of the session's recording ("" when none).
func (sr *sessionRecording) recordingID() string {
	if sr == nil || sr.rec == nil {
		return ""
	}
	return sr.rec.ID()
}

// endWait bounds how long a session's end waits for its recording to be
// written (the frames still queued), so that its end entry has the
// recording's counts.
const recordingEndWait = time.Second

// end ends the recording with its session.
func (sr *sessionRecording) end() {
	if sr == nil || sr.rec == nil {
		return
	}
	sr.rec.End()
	select {
	case <-sr.rec.Done():
	case <-time.After(recordingEndWait):
	}
}

// field is what the session's end entry says of its recording: its
// counts, or why there is none.
func (sr *sessionRecording) field() (zap.Field, bool) {
	if sr == nil {
		return zap.Skip(), false
	}
	if v := sr.shown(); v != nil {
		return zap.Any("recording", v), true
	}
	return zap.Skip(), false
}

// shown is the recording as the end entry and the sessions list show it:
// {"id","frames","bytes","dropped"[,"stopped"]}, or "unavailable: <why>".
func (sr *sessionRecording) shown() any {
	if sr == nil {
		return nil
	}
	if sr.rec == nil {
		return sr.unavailable
	}
	return sr.rec.Brief()
}

// recordingCounter counts a recording's frames in the metrics.
type recordingCounter struct {
	m        *observe.Metrics
	provider string
}

func (rc recordingCounter) Stored(n int) { rc.m.RecordingStored(rc.provider, n) }
func (rc recordingCounter) Dropped()     { rc.m.RecordingDropped(rc.provider) }

// storageOf is the storage an option keeps its files in: the storage
// module its raw Storage field names (loaded from owner, the option's
// config), else Caddy's own storage; key names it, so that options in the
// same storage share what is kept per storage.
func storageOf(ctx caddy.Context, owner any, raw json.RawMessage) (certmagic.Storage, string, error) {
	st := ctx.Storage()
	if len(raw) == 0 {
		return st, fmt.Sprintf("caddy %T %v", st, st), nil
	}
	key := "module " + string(raw) // before LoadModule lets the field go
	v, err := ctx.LoadModule(owner, "Storage")
	if err != nil {
		return nil, "", err
	}
	conv, ok := v.(caddy.StorageConverter)
	if !ok {
		return nil, "", fmt.Errorf("module %T is not a storage", v)
	}
	if st, err = conv.CertMagicStorage(); err != nil {
		return nil, "", err
	}
	return st, key, nil
}
