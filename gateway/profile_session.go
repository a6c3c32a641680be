package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/browserfailover/caddy-browser-failover/cdp"
	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/options"
	"github.com/browserfailover/caddy-browser-failover/profiles"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// A client's browser profile in its session: put into the browser before
// the client's first byte is relayed (restoreProfile: after the provider's
// 101, or a warm session's hand-over, and before the client is answered),
// and read back at the session's end while the browser is still there
// (the session's last word), then sealed and written, before the
// provider's connection closes and before the ticket gives the profile
// back. Which origins' localStorage is read: those the profile held, and
// those of every page and frame the session's pages visited (a
// participant that watches their URLs only, or the recording's
// participant when the session is recorded).

// profileRestoreWait bounds the restore of a profile, before the client
// is answered: a provider that does not take it within it fails the
// connect (502 naming the profile).
const profileRestoreWait = 10 * time.Second

// profileSaveWait bounds the read of a profile at a session's end: past
// it, the stored profile is left as it was.
const profileSaveWait = 5 * time.Second

// restoreProfile puts the client's profile, taken at its admission, into
// the browser of provider connection up at m, before the client gets its
// 101: nil when it is there (or there is nothing to put), else the
// client's answer (the caller closes up).
func (c socket) restoreProfile(m *member, up *upstreams.Conn) *refusal {
	cp := c.profile
	if cp == nil || !cp.taken || c.h.prof == nil {
		return nil
	}
	id := cp.name.ID
	fail := func(why string) *refusal {
		c.h.logger.Error("profile not restored", zap.String("session_id", c.id), zap.String("provider", m.up.Name),
			zap.String("profile", id), zap.String("error", why))
		rf := c.unservable(fmt.Sprintf("profile %q could not be put into the browser at provider %s: %s", id, m.up.Name, why))
		rf.reason, rf.provider = observe.ReasonProfile, m.up.Name
		rf.more = map[string]any{"option": options.Profile, "profile": id}
		return rf
	}
	if ext := up.Answer.Header.Get("Sec-Websocket-Extensions"); ext != "" {
		return fail("the session negotiated a WebSocket extension (" + extensionNames(ext) + "), so the gateway cannot speak in it")
	}
	if cp.data.Empty() {
		return nil
	}
	r := cdp.NewRestore(cp.data)
	err := upstreams.Converse(up, r, profileRestoreWait, 0)
	if err == nil && r.Err() != "" {
		err = errors.New(r.Err())
	}
	if err != nil {
		return fail(err.Error())
	}
	if ce := c.h.logger.Check(zap.DebugLevel, "profile restored"); ce != nil {
		ce.Write(zap.String("session_id", c.id), zap.String("provider", m.up.Name), zap.String("profile", id),
			zap.Int("cookies", len(cp.data.Cookies)), zap.Int("origins", len(cp.data.Origins)))
	}
	return nil
}

// profileSave is a relayed session's save of its profile at its end.
type profileSave struct {
	k       *profileKeeper
	name    profiles.Name
	logger  *zap.Logger
	session string
	mu      sync.Mutex
	origins profiles.Origins
	save    *cdp.Save
}

// profileSaveOf is the save of the profile ticket holder's session uses
// (nil: none). known are the origins whose localStorage the profile held
// (nil for a resumed session: they are read from the store).
func (c socket) profileSaveOf(name profiles.Name, known *profiles.Profile) *profileSave {
	k := c.h.prof
	if k == nil {
		return nil
	}
	ps := &profileSave{k: k, name: name, logger: c.h.logger, session: c.id}
	if known == nil && (c.profile == nil || !c.profile.taken) {
		// A resumed session: the origins of what its profile holds.
		ctx, cancel := context.WithTimeout(context.Background(), profileIOWait)
		known, _ = k.store.Load(ctx, name)
		cancel()
	}
	for _, o := range known.OriginNames() {
		ps.origins.AddOrigin(o)
	}
	return ps
}

// visited notes the URL of one of the session's pages or frames.
func (ps *profileSave) visited(url string) {
	ps.mu.Lock()
	ps.origins.Add(url)
	ps.mu.Unlock()
}

// talk is the session's last word: the save, of the cookies and of the
// origins noted by the time it begins.
func (ps *profileSave) talk() *upstreams.LastWord {
	return &upstreams.LastWord{Talk: ps, Wait: profileSaveWait}
}

// Begin starts the read (upstreams.Talk).
func (ps *profileSave) Begin(send func([]byte) bool) {
	ps.mu.Lock()
	ps.save = cdp.NewSave(ps.origins.List())
	ps.mu.Unlock()
	ps.save.Begin(send)
}

// Heard takes a message of the provider's (upstreams.Talk).
func (ps *profileSave) Heard(msg []byte) (mine, over bool) { return ps.save.Heard(msg) }

// end writes what the last word read, once the session has ended, before
// its ticket gives the profile back: a read that failed, or did not end
// within its wait, or never began (the provider ended first), and a
// profile over max_size, leave the stored profile as it was.
func (ps *profileSave) end(reason string) {
	if ps == nil {
		return
	}
	fields := []zap.Field{zap.String("session_id", ps.session), zap.String("profile", ps.name.ID), zap.String("session_end", reason)}
	ps.mu.Lock()
	sv := ps.save
	ps.mu.Unlock()
	if sv == nil {
		ps.logger.Warn("profile not saved", append(fields, zap.String("error", "the session ended before the browser could be read (the provider ended it first); the stored profile is left as it was"))...)
		return
	}
	p, err := sv.Result()
	if err != nil {
		ps.logger.Warn("profile not saved", append(fields, zap.String("error", err.Error()+"; the stored profile is left as it was"))...)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), profileIOWait)
	n, err := ps.k.store.Save(ctx, ps.name, p)
	cancel()
	if err != nil {
		ps.logger.Error("profile not saved", append(fields, zap.String("error", err.Error()+"; the stored profile is left as it was"))...)
		return
	}
	ps.logger.Info("profile saved", append(fields, zap.Int("cookies", len(p.Cookies)), zap.Int("origins", len(p.Origins)), zap.Int("bytes", n))...)
}
