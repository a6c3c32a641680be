package pool

import (
	"testing"

	"github.com/browserfailover/caddy-browser-failover/cooldown"
)

// TestReleaseClaimRestores: a config load that claims a running provider
// and then fails (its claims released while the running load still holds
// the name) leaves the running load's settings; a load that replaces the
// running one keeps its own when the old one lets go.
func TestReleaseClaimRestores(t *testing.T) {
	running, failed, next := new(int), new(int), new(int) // load identities
	cfg := cooldown.Config{MinRequests: 3}
	p, err := Claim("pool-unit", "ws://h:1/", "ws://h:1/", running, cfg, false, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer ReleaseClaim("pool-unit", next)

	// A failing load: two handlers claim it with other settings.
	for range 2 {
		if _, err := Claim("pool-unit", "ws://other:1/", "ws://other:1/", failed, cooldown.Config{MinRequests: 9}, true, 1); err != nil {
			t.Fatal(err)
		}
	}
	if p.MaxConcurrent() != 1 || p.URL() != "ws://other:1/" {
		t.Fatalf("the claims did not apply: max %d url %s", p.MaxConcurrent(), p.URL())
	}
	ReleaseClaim("pool-unit", failed)
	if p.MaxConcurrent() != 1 {
		t.Fatal("restored before the failed load's last claim went")
	}
	ReleaseClaim("pool-unit", failed)
	if p.MaxConcurrent() != 2 || p.URL() != "ws://h:1/" || p.Health.Config().MinRequests != 3 {
		t.Fatalf("the failed load's settings stayed: max %d url %s min_requests %d", p.MaxConcurrent(), p.URL(), p.Health.Config().MinRequests)
	}

	// A load that runs: the old load's release keeps the new settings.
	if _, err := Claim("pool-unit", "ws://h:1/", "ws://h:1/", next, cfg, false, 5); err != nil {
		t.Fatal(err)
	}
	ReleaseClaim("pool-unit", running)
	if p.MaxConcurrent() != 5 {
		t.Fatalf("the replaced load's release changed the new settings: max %d", p.MaxConcurrent())
	}
	if q, ok := Lookup("pool-unit"); !ok || q != p {
		t.Fatal("the entry went away while the new load holds it")
	}
}
