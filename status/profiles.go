package status

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/profiles"
)

// Browser profiles, as operators see them: the admin API's routes under
// ProfilesPath (the list, and deleting one), and the dashboard's list,
// through ServeProfiles. A profile is listed by its ID, its scope hashed
// as client keys are (its value may be a user's ID), its size and when it
// was written: never a cookie or a stored value.

// ProfilesPath lists the stored profiles; ProfilesPath + "/<id>" is one
// (DELETE, with ?scope=<scope as listed> when several scopes hold that
// ID).
const ProfilesPath = "/browser_failover/profiles"

// ProfileList is the document served at ProfilesPath.
type ProfileList struct {
	Profiles []Profile `json:"profiles"`
}

// Profile is one stored profile.
type Profile struct {
	ID string `json:"id"`
	// Scope is its scope's value hashed as status shows client keys
	// ("hmac:…"), null for a handler without a scope.
	Scope *string `json:"scope"`
	// Size is the bytes stored (sealed).
	Size int64 `json:"size"`
	// Updated is when it was last written.
	Updated time.Time `json:"updated"`
	// InUse: a session uses it now (on this node, or on another under
	// state redis).
	InUse bool `json:"in_use"`
}

// ListProfiles lists the stored profiles of every storage in use.
func ListProfiles(r *http.Request, reg *pool.Registry) (ProfileList, error) {
	out := ProfileList{Profiles: []Profile{}}
	if reg == nil {
		return out, nil
	}
	list, err := reg.Profiles.List(r.Context())
	for _, p := range list {
		e := Profile{ID: p.ID, Size: p.Size, Updated: p.Updated.UTC(), InUse: p.InUse}
		if s := p.Shown(); s != "" {
			e.Scope = &s
		}
		out.Profiles = append(out.Profiles, e)
	}
	return out, err
}

func (a Admin) handleProfiles(w http.ResponseWriter, r *http.Request) error {
	return ServeProfiles(w, r, a.registry(), strings.TrimPrefix(r.URL.Path, ProfilesPath))
}

// ServeProfiles serves the profiles' routes; sub is the path after
// ProfilesPath ("" or "/<id>"). Errors are caddy.APIErrors (the admin API
// renders them as JSON).
func ServeProfiles(w http.ResponseWriter, r *http.Request, reg *pool.Registry, sub string) error {
	if sub == "" || sub == "/" {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			return methodNotAllowed(w, "GET, HEAD")
		}
		list, err := ListProfiles(r, reg)
		if err != nil {
			return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: fmt.Errorf("reading the profiles' storage: %w", err)}
		}
		return writeJSON(w, r, list)
	}
	id := strings.TrimPrefix(sub, "/")
	if r.Method != http.MethodDelete {
		return methodNotAllowed(w, "DELETE")
	}
	if !profiles.ValidID(id) || reg == nil {
		return notFound(fmt.Sprintf("no profile %q", id))
	}
	n := profiles.Name{ID: id}
	if q := r.URL.Query(); q.Has("scope") {
		folder, ok := profiles.ScopeFolder(q.Get("scope"))
		if !ok {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("scope %q: want a scope as the list shows it (hmac:…), or none", q.Get("scope"))}
		}
		n.Scope = folder
	} else {
		// The one scope that holds it.
		list, err := reg.Profiles.List(r.Context())
		if err != nil {
			return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: fmt.Errorf("reading the profiles' storage: %w", err)}
		}
		var scopes []string
		for _, p := range list {
			if p.ID == id && !slices.Contains(scopes, p.Scope) {
				scopes = append(scopes, p.Scope)
			}
		}
		switch len(scopes) {
		case 0:
			return notFound(fmt.Sprintf("no profile %q", id))
		case 1:
			n.Scope = scopes[0]
		default:
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("%d scopes hold a profile %q: name one with ?scope=", len(scopes), id)}
		}
	}
	switch err := reg.Profiles.Delete(r.Context(), n); {
	case errors.Is(err, profiles.ErrNotFound):
		return notFound(fmt.Sprintf("no profile %q in that scope", id))
	case errors.Is(err, pool.ErrProfileInUse):
		return caddy.APIError{HTTPStatus: http.StatusConflict, Err: fmt.Errorf("profile %q is in use by a session: end it first", id)}
	case err != nil:
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: fmt.Errorf("deleting profile %q: %w", id, err)}
	}
	out := map[string]any{"deleted": id}
	if s := n.Shown(); s != "" {
		out["scope"] = s
	}
	return writeJSON(w, r, out)
}
