package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"

	"github.com/browserfailover/caddy-browser-failover/internal/fakedns"
	"github.com/browserfailover/caddy-browser-failover/internal/testgw"
	"github.com/browserfailover/caddy-browser-failover/status"
)

// TestFoundChromiums: real headless Chromiums as the providers of a
// providers block, found through Caddy's srv source at a DNS server on
// loopback whose records change: the default scheme discovers each
// browser at /json/version; a browser added to the records serves the
// next client while the first is busy; a browser taken out of them keeps
// its live chromedp session, which goes on working, and leaves the status
// once the session ended.
func TestFoundChromiums(t *testing.T) {
	Require(t, false)
	dns := fakedns.Start(t)
	bs := StartChromiums(t, 2)
	a, b := bs[0], bs[1]
	port := func(c *Chromium) uint16 {
		_, p, _ := net.SplitHostPort(c.Addr)
		n, _ := strconv.Atoi(p)
		return uint16(n)
	}
	name := func(c *Chromium) string { return fmt.Sprintf("cr/localhost:%d", port(c)) }
	rec := func(c *Chromium) fakedns.SRV { return fakedns.SRV{Target: "localhost.", Port: port(c), Weight: 1} }
	const srv = "_cdp._tcp.e2e.browsers.test."
	dns.SetSRV(srv, rec(a))
	g := testgw.Start(t, fmt.Sprintf(`{"handler":"browser_failover","queue":{"size":0},"dynamic_providers":[{"name":"cr",
		"dynamic":{"source":"srv","name":%q,"refresh":"200ms","resolver":{"addresses":[%q]}},"max_concurrent":1}]}`, srv, dns.Addr))

	providers := func() map[string]status.Provider {
		code, body, err := g.AdminDo(http.MethodGet, status.StatusPath, nil)
		if err != nil || code != 200 {
			t.Fatalf("status: %d %v", code, err)
		}
		var st status.Status
		if err := json.Unmarshal(body, &st); err != nil {
			t.Fatal(err)
		}
		out := map[string]status.Provider{}
		for _, p := range st.Providers {
			out[p.Name] = p
		}
		return out
	}
	testgw.Eventually(t, 10*time.Second, name(a)+" found", func() bool { _, ok := providers()[name(a)]; return ok })

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A chromedp client through the gateway: it navigates and reads the
	// page's title.
	open := func(what string) (context.Context, context.CancelFunc) {
		t.Helper()
		actx, acancel := remote.NewAllocator(ctx, g.HTTP("/"))
		cctx, ccancel := chromedp.NewContext(actx)
		title, err := "", chromedp.Do(cctx, chromedp.Navigate(dataPage))
		if err == nil {
			title, err = chromedp.Run(cctx, chromedp.Title())
		}
		if err != nil || title != "hello e2e" {
			t.Fatalf("%s: %v (title %q)", what, err, title)
		}
		return cctx, func() { ccancel(); acancel() }
	}
	eval := func(cctx context.Context, what string) {
		t.Helper()
		if v, err := chromedp.Run(cctx, chromedp.Evaluate[int](`6*7`)); err != nil || v != 42 {
			t.Fatalf("%s: %v (6*7 = %d)", what, err, v)
		}
	}

	first, closeFirst := open("first client, on the only browser found")
	defer closeFirst()
	if p := providers()[name(a)]; p.Active != 1 || p.FoundBy != "cr" || p.URL != "http://"+name(a)[len("cr/"):]+"/" {
		t.Fatalf("%s: %+v", name(a), p)
	}

	// A second browser appears in the records: the next client gets it
	// (the first is full).
	dns.SetSRV(srv, rec(a), rec(b))
	testgw.Eventually(t, 10*time.Second, name(b)+" found", func() bool { _, ok := providers()[name(b)]; return ok })
	second, closeSecond := open("second client, on the browser found later")
	eval(second, "second client")
	if p := providers()[name(b)]; p.Active != 1 {
		t.Fatalf("%s after the second client: %+v", name(b), p)
	}
	closeSecond()

	// The first browser leaves the records: its session goes on.
	dns.SetSRV(srv, rec(b))
	testgw.Eventually(t, 10*time.Second, name(a)+" leaving", func() bool { return providers()[name(a)].Leaving })
	eval(first, "first client, its browser leaving")
	third, closeThird := open("third client, while the first browser is leaving")
	eval(third, "third client")
	if p := providers()[name(b)]; p.Active != 1 {
		t.Fatalf("the third client is not on %s: %+v", name(b), p)
	}
	closeThird()
	closeFirst()
	testgw.Eventually(t, 10*time.Second, name(a)+" to leave the status", func() bool { _, ok := providers()[name(a)]; return !ok })
}
