package browserfailover

import (
	"fmt"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// A provider URL may hold placeholders anywhere, even as a whole
// (url {env.BROWSER_URL}); then its form can only be checked once they are
// resolved, at provision, with the same errors as a URL written out.

// wholePlaceholder reports whether a configured URL begins with a
// placeholder, so that its scheme is known only once resolved.
func wholePlaceholder(raw string) bool {
	return strings.HasPrefix(raw, "{")
}

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
	if err := checkURLForm(&cp); err != nil {
		return "", err
	}
	return resolved, nil
}
