package gateway

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"

	"github.com/browserfailover/caddy-browser-failover/options"
	"github.com/browserfailover/caddy-browser-failover/upstreams"
)

// Session options: what a client asks of its browser once for every
// provider (a region in order of preference, a proxy country, stealth,
// captcha solving, recording, a timeout). They are read when the client
// is checked, choose and order its candidates, and reach each provider
// only through {bf.option.<name>} placeholders in that provider's own
// words (options.Honours).

// readOptions reads the session options a client states (step 0, check):
// its bf_ query items in rawQuery, its Browser-Failover-Options header
// and, on a WebDriver create, its bf:options capability (nil: none). rest
// is rawQuery without the bf_ items (pass_query passes on the rest); the
// header is never forwarded, the capability never sent. An error names
// the bad option: the client is answered 400 before any provider is
// asked.
func readOptions(rawQuery string, header http.Header, capability json.RawMessage) (s options.Set, rest string, err error) {
	s, rest, err = options.FromRequest(rawQuery, header, ResumeQuery, ResumeTokenQuery)
	if err == nil && capability != nil {
		var o options.Set
		if o, err = options.FromCapability(capability); err == nil {
			s, err = s.Merge(o, options.Capability)
		}
	}
	return s, rest, err
}

// parkedOptions are the options a parked session was made with.
func parkedOptions(q string) options.Set {
	s, _, _ := options.FromRequest(q, nil)
	return s
}

// byOptions keeps of order the providers that honour the client's
// options, those of its first region first, then its next region's
// (order kept within), and lists the others in c.unsupported.
func (c *connect) byOptions(order []int) []int {
	if c.opts.Empty() {
		return order
	}
	c.unsupported = c.unsupported[:0]
	kept := order[:0:0]
	for _, i := range order {
		m := c.pool.all[i]
		if lacks := c.h.lacks(m.up, c.opts, c.cls.proto); len(lacks) > 0 {
			c.unsupported = append(c.unsupported, unsupported{Provider: m.up.Name, Lacks: lacks})
			continue
		}
		kept = append(kept, i)
	}
	if len(c.opts.Regions()) > 1 {
		slices.SortStableFunc(kept, func(a, b int) int {
			return c.pool.all[a].up.Honours().Rank(c.opts) - c.pool.all[b].up.Honours().Rank(c.opts)
		})
	}
	return kept
}

// anyHonours reports whether some provider of the client's pool can
// honour its options; when none can, the client is answered 502 at once
// naming them (false).
func (c *connect) anyHonours() bool {
	if c.opts.Empty() {
		return true
	}
	c.byOptions(c.pool.members)
	if len(c.unsupported) < len(c.pool.members) || c.mayFind() {
		return true
	}
	var want []string
	for _, u := range c.unsupported {
		for _, o := range u.Lacks {
			if !slices.Contains(want, o) {
				want = append(want, o)
			}
		}
	}
	msg := "no provider here honours the session options asked for: " + strings.Join(want, ", ")
	c.finish(c.unservable(msg))
	return false
}

// replaceAt is the replace of an attempt at m: its session options
// rendered in m's words, then the request's placeholders.
func (c *connect) replaceAt(m *member) func(string) string {
	return withOptions(m.up, c.opts, c.replace)
}

// withOptions is replace with session options opts rendered first, in
// up's words (replace itself when up renders no option).
func withOptions(up *upstreams.Provider, opts options.Set, replace func(string) string) func(string) string {
	if !up.UsesOptions() {
		return replace
	}
	hon := up.Honours()
	return func(s string) string {
		s = hon.Replace(opts, s)
		if replace != nil {
			s = replace(s)
		}
		return s
	}
}
