package gateway

import (
	"fmt"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/cluster"
	"github.com/browserfailover/caddy-browser-failover/config"
	"github.com/browserfailover/caddy-browser-failover/profiles"
)

// Browser profiles: a CDP client that names a profile (the session
// option profile) gets, in the browser's default context, the cookies and
// localStorage its profile's last session left, whichever provider serves
// it, and they are read back and stored when its session ends. Its name
// is read when the client is checked (its scope's value hashed, as status
// shows client keys); the profile is taken by the client's ticket at its
// first admission (admit), waiting up to the profiles' wait while another
// session uses it, on every node under shared state, and read from the
// handler's store, sealed with its key; a client that cannot have it is
// answered 409 (in use), 500 (the key cannot open it, the stored profile
// left as it is) or 503 (its lock cannot be asked, on_unavailable
// reject), before any provider is asked (profile_admit.go). The restore
// and the save are the gateway's part in the session itself
// (profile_session.go).

// profileKeeper is a handler's profiles option as provisioned. The key
// stays inside its store's sealer.
type profileKeeper struct {
	cfg     *config.ProfilesConfig
	store   *profiles.Store
	wait    time.Duration
	release func()
}

// provisionProfiles opens the handler's store of profiles: its key
// resolved by known and checked, in its storage module or Caddy's own
// storage. Called after the shared state is open.
func (h *Gateway) provisionProfiles(ctx caddy.Context, known func(string) string) error {
	pc := h.Profiles
	if pc == nil {
		return nil
	}
	key, err := config.ParseProfileKey(known(pc.Key))
	if err != nil {
		if strings.Contains(pc.Key, "{") {
			// The placeholder's name helps; the key itself never shows.
			return fmt.Errorf("profiles key %s: %w", pc.Key, err)
		}
		return fmt.Errorf("profiles: %w", err)
	}
	sealer, err := profiles.NewSealer(key)
	clear(key)
	if err != nil {
		return fmt.Errorf("profiles: %w", err)
	}
	st, skey, err := storageOf(ctx, pc, pc.Storage)
	if err != nil {
		return fmt.Errorf("profiles storage: %w", err)
	}
	maxSize := pc.MaxSize
	if maxSize == 0 {
		maxSize = config.DefaultProfileMaxSize
	}
	var shared *cluster.Shared
	if h.shared != nil {
		shared = h.shared.s
	}
	h.prof = &profileKeeper{cfg: pc, store: profiles.NewStore(st, sealer, maxSize), wait: time.Duration(pc.Wait),
		release: h.reg.Profiles.Open(skey, st, shared)}
	return nil
}

// cleanupProfiles gives the storage's use back.
func (h *Gateway) cleanupProfiles() {
	if h.prof != nil {
		h.prof.release()
	}
}

// profileNameOf reads a profile's name in the shared state (its scope's
// folder, a slash, its ID); ok false for anything else.
func profileNameOf(s string) (profiles.Name, bool) {
	scope, id, ok := strings.Cut(s, "/")
	n := profiles.Name{Scope: scope, ID: id}
	if !ok || !profiles.ValidID(id) {
		return n, false
	}
	if _, valid := profiles.ScopeFolder("hmac:" + scope); !valid && scope != profiles.NoScope {
		return n, false
	}
	return n, true
}

// clientProfile is the profile a client named: where it is kept, and,
// once its ticket holds it, what was stored (nil: nothing yet).
type clientProfile struct {
	name  profiles.Name
	taken bool
	data  *profiles.Profile
}

// profileIOWait bounds one read or write of a profile in its storage.
const profileIOWait = 10 * time.Second
