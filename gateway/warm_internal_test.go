package gateway

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/browserfailover/caddy-browser-failover/config"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// TestWarmSettingsPrint: the print of a provider's warm settings follows
// the values its {env.*} and {file.*} placeholders resolve to now, and
// nothing else of them: the same values print the same, a rotated file or
// a changed variable prints otherwise; the print holds no value.
func TestWarmSettingsPrint(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("key-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("WARM_PRINT_KEY", "env-1")
	pc := &config.ProviderConfig{Config: upstreams.Config{Name: "p", URL: "ws://127.0.0.1:1/?k={env.WARM_PRINT_KEY}",
		HeadersUp: []upstreams.HeaderOp{
			{Op: "set", Field: "X-Token", Value: "{file." + file + "}"},
			{Op: "set", Field: "X-Client", Value: "{http.request.header.X} \\{env.NOT_ONE}"},
		}}}
	set := newWarmSettings(pc)
	if want := []string{"env.WARM_PRINT_KEY", "file." + file}; !slices.Equal(slices.Sorted(slices.Values(set.names)), want) {
		t.Fatalf("placeholders %q, want %q", set.names, want)
	}
	reg := pool.NewRegistry(nil)
	first := set.print(reg)
	if set.print(reg) != first {
		t.Fatal("the same values print otherwise")
	}
	if strings.Contains(first, "key-1") || strings.Contains(first, "env-1") {
		t.Fatal("the print holds a value")
	}
	os.WriteFile(file, []byte("key-2\n"), 0o600)
	rotated := set.print(reg)
	if rotated == first {
		t.Fatal("a rotated file prints the same")
	}
	t.Setenv("WARM_PRINT_KEY", "env-2")
	if set.print(reg) == rotated {
		t.Fatal("a changed variable prints the same")
	}
	os.WriteFile(file, []byte("key-1\n"), 0o600)
	t.Setenv("WARM_PRINT_KEY", "env-1")
	if set.print(reg) != first {
		t.Fatal("the values back print otherwise")
	}
}
