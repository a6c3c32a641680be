package browserfailover

import (
	"fmt"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// A provider URL may hold placeholders anywhere, even as a whole
// (url {env.BROWSER_URL}); then its form can only be checked once they are
// resolved, at provision, with the same errors as a URL written out.

// resolveURL resolves the placeholders of pc's URL and checks the result
// as a URL written out is checked. Errors name the provider, never the
// URL.
func resolveURL(pc *ProviderConfig, repl *caddy.Replacer) (string, error) {
	resolved := strings.TrimSpace(repl.ReplaceKnown(pc.URL, ""))
	if resolved == "" {
		return "", fmt.Errorf("provider %q: the URL is empty once its placeholders are resolved (is the environment variable set?)", pc.Name)
	}
	cp := *pc
	cp.URL = resolved
	if wholePlaceholder(resolved) {
		return "", fmt.Errorf("provider %q: the URL's placeholder is not known when the config loads (use {env.X})", pc.Name)
	}
	if err := cp.validateURL(); err != nil {
		return "", within(fmt.Sprintf("provider %q: ", pc.Name), err)
	}
	return resolved, nil
}
