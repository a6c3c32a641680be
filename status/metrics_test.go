package status

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/browserfailover/caddy-browser-failover/observe"
	"github.com/browserfailover/caddy-browser-failover/pool"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// TestSessionOrphansMetric: session_orphans_total{provider} is a counter
// of the session API books' orphans, and bad_connect_url is a label as
// it is.
func TestSessionOrphansMetric(t *testing.T) {
	if got := observe.OutcomeLabel(upstreams.WordBadConnectURL); got != "bad_connect_url" {
		t.Fatalf("OutcomeLabel(bad_connect_url) = %q", got)
	}
	r := pool.NewRegistry(nil)
	r.Books.Of("orphan-metric-test").Orphans.Add(2)
	reg := prometheus.NewRegistry()
	if err := observe.Register(reg, r.Metrics(), Gauges(r)); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != "caddy_browser_failover_session_orphans_total" {
			continue
		}
		if mf.GetType().String() != "COUNTER" {
			t.Fatalf("type %v", mf.GetType())
		}
		for _, m := range mf.GetMetric() {
			if l := m.GetLabel(); len(l) == 1 && l[0].GetName() == "provider" && l[0].GetValue() == "orphan-metric-test" {
				if v := m.GetCounter().GetValue(); v != 2 {
					t.Fatalf("value %v, want 2", v)
				}
				return
			}
		}
	}
	t.Fatal("no session_orphans_total{provider=\"orphan-metric-test\"}")
}
