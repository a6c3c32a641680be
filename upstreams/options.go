package upstreams

import (
	"net/url"

	"github.com/browserfailover/caddy-browser-failover/options"
)

// The session options a client states reach a provider only through
// {bf.option.<name>} placeholders in what the provider is sent: its URL's
// query, header_up values, its session API's create URL, headers and
// body, and a webdriver provider's capabilities. The caller's replace
// renders them for the provider at hand (see options.Honours.Replace);
// here is only what depends on where they stand.

// queryHasOptions reports whether a value of q holds an option
// placeholder.
func queryHasOptions(q url.Values) bool {
	for _, vs := range q {
		for _, v := range vs {
			if options.Has(v) {
				return true
			}
		}
	}
	return false
}

// renderQuery is q with its values rendered by replace; an item whose
// value held an option placeholder and renders empty is left out (an
// option the client did not state is not sent at all).
func renderQuery(q url.Values, replace func(string) string) url.Values {
	out := make(url.Values, len(q))
	for k, vs := range q {
		for _, v := range vs {
			if options.Has(v) {
				if v = replaceOr(replace, v); v == "" {
					continue
				}
			}
			out[k] = append(out[k], v)
		}
	}
	return out
}

// headerValue is a header's value v rendered by replace; ok is false when
// it held an option placeholder and renders empty: the header is not sent.
func headerValue(v string, replace func(string) string) (string, bool) {
	had := options.Has(v)
	v = replaceOr(replace, v)
	return v, !had || v != ""
}

// unstated renders every option placeholder in s as unset (empty): what a
// request that states no option, such as a health probe, sends.
func unstated(s string) string {
	var none options.Honours
	return none.Replace(options.Set{}, s)
}

// replaceOr is replace(v), or v without a replace.
func replaceOr(replace func(string) string, v string) string {
	if replace == nil {
		return v
	}
	return replace(v)
}

// fillString is a JSON template's string s filled by replace: an option
// placeholder standing alone renders as the JSON value it stands for
// (true, "de", 120, null when unset), anything else as a string.
func fillString(s string, replace func(string) string) any {
	if name, ok := options.Whole(s); ok {
		return options.JSONValue(name, replaceOr(replace, s))
	}
	return replaceOr(replace, s)
}
