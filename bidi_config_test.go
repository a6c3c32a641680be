package browserfailover

import (
	"strings"
	"testing"
)

// TestBiDiMaxConcurrentDefault: a bidi provider takes one session at a time
// unless max_concurrent says otherwise, and a stated 0 (unlimited) means
// the same in the Caddyfile as in JSON: it survives the Caddyfile's
// adaptation to JSON. Other providers stay unlimited by default.
func TestBiDiMaxConcurrentDefault(t *testing.T) {
	for _, tc := range []struct {
		opts string // the provider's Caddyfile options, "; " between
		want int
	}{
		{"protocol bidi", 1},
		{"protocol bidi; max_concurrent 0", 0},
		{"max_concurrent 0; protocol bidi", 0},
		{"protocol bidi; max_concurrent 4", 4},
		{"protocol cdp", 0},
		{"", 0},
	} {
		lines := strings.ReplaceAll(tc.opts, "; ", "\n  ")
		cf := "browser_failover {\n provider a ws://h:1/session {\n  " + lines + "\n }\n}"
		fromCF, _, err := fromCaddyfile(t, cf)
		if err != nil {
			t.Fatalf("%s: %v", tc.opts, err)
		}
		var members []string
		for _, o := range strings.Split(tc.opts, "; ") {
			if k, v, ok := strings.Cut(o, " "); ok {
				if k == "max_concurrent" {
					members = append(members, `"max_concurrent":`+v)
				} else {
					members = append(members, `"`+k+`":"`+v+`"`)
				}
			}
		}
		js := `{"providers":[{"name":"a","url":"ws://h:1/session"` + strings.Join(append([]string{""}, members...), ",") + `}]}`
		fromJS, err := fromJSON([]byte(js))
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		if got := fromCF.Providers[0].EffectiveMaxConcurrent(); got != tc.want {
			t.Errorf("Caddyfile %q: max_concurrent %d, want %d", tc.opts, got, tc.want)
		}
		if got := fromJS.Providers[0].EffectiveMaxConcurrent(); got != tc.want {
			t.Errorf("JSON %s: max_concurrent %d, want %d", js, got, tc.want)
		}
	}
}
