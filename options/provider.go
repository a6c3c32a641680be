package options

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// PlaceholderPrefix starts each option placeholder: {bf.option.<name>}.
const PlaceholderPrefix = "{bf.option."

// TimeoutMS is a placeholder name only: the timeout in milliseconds
// ({bf.option.timeout} renders whole seconds).
const TimeoutMS = "timeout_ms"

// placeholderName reports whether name may follow bf.option: every
// option but the gateway's own profile, which no provider is told.
func placeholderName(name string) bool { return Known(name) && name != Profile || name == TimeoutMS }

// providerNames are the options a provider may honour besides its
// regions.
var providerNames = []string{ProxyCountry, Stealth, SolveCaptchas, Record, Timeout}

// Honours is what one provider honours and how it words each option.
// The zero Honours honours nothing and translates nothing.
type Honours struct {
	// Regions are where it runs, or where its session API can create.
	Regions []string
	// Supports are the other options it honours.
	Supports []string
	// Map translates a value per option: option → ours → theirs.
	Map map[string]map[string]string
}

// CheckRegions checks a provider's region setting.
func CheckRegions(regions []string) error {
	var errs []error
	for _, r := range regions {
		if !ValidRegion(r) {
			errs = append(errs, fmt.Errorf("region: %q is not a region name (letters, digits, -, _ and ., up to 64)", r))
		}
	}
	return errors.Join(errs...)
}

// CheckSupports checks a provider's supports setting.
func CheckSupports(supports []string) error {
	var errs []error
	for _, o := range supports {
		switch {
		case o == Region:
			errs = append(errs, errors.New("supports: a provider's regions are given by region, not supports"))
		case o == Profile:
			errs = append(errs, errors.New("supports: profile is the gateway's own (its profiles block), not a provider's"))
		case !Known(o):
			errs = append(errs, fmt.Errorf("supports: %q is not a session option (the options: %s)", o, strings.Join(providerNames, ", ")))
		}
	}
	return errors.Join(errs...)
}

// CheckMap checks a provider's option_map setting.
func CheckMap(m map[string]map[string]string) error {
	var errs []error
	for o, vals := range m {
		if !Known(o) || o == Profile {
			errs = append(errs, fmt.Errorf("option_map: %q is not a session option a provider is told", o))
			continue
		}
		if len(vals) == 0 {
			errs = append(errs, fmt.Errorf("option_map %s: no <ours>=<theirs> pair", o))
		}
		for ours, theirs := range vals {
			if ours == "" || theirs == "" {
				errs = append(errs, fmt.Errorf("option_map %s: %q=%q: both sides must be non-empty", o, ours, theirs))
			}
			for _, v := range []string{ours, theirs} {
				if strings.ContainsAny(v, "{}") || strings.IndexFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0 {
					errs = append(errs, fmt.Errorf("option_map %s: %q holds a brace or a control character", o, v))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// CheckPlaceholders reports an option placeholder in s that names no
// option.
func CheckPlaceholders(s string) error {
	for rest := s; ; {
		i := strings.Index(rest, PlaceholderPrefix)
		if i < 0 {
			return nil
		}
		rest = rest[i+len(PlaceholderPrefix):]
		j := strings.IndexByte(rest, '}')
		if j < 0 {
			return fmt.Errorf("an unclosed %s placeholder", PlaceholderPrefix+"…}")
		}
		if name := rest[:j]; !placeholderName(name) {
			return fmt.Errorf("{bf.option.%s} names no session option a provider is told (the options: region, %s, and timeout_ms)", name, strings.Join(providerNames, ", "))
		}
		rest = rest[j+1:]
	}
}

// Has reports whether s holds an option placeholder.
func Has(s string) bool { return strings.Contains(s, PlaceholderPrefix) }

// Lacks lists what of s the provider cannot honour: region when none of
// its regions is on the client's list, then each other asked option it
// does not support, nor also (what the gateway honours itself for it,
// such as record when it records the session). Empty: it can serve s.
func (p *Honours) Lacks(s Set, also ...string) []string {
	var out []string
	if len(s.regions) > 0 && p.Rank(s) < 0 {
		out = append(out, Region)
	}
	for _, o := range s.Asked() {
		if !slices.Contains(p.Supports, o) && !slices.Contains(also, o) {
			out = append(out, o)
		}
	}
	return out
}

// Rank is the place on the client's region list of the first region the
// provider has (0 when the client names none); -1 when it has none of
// them.
func (p *Honours) Rank(s Set) int {
	if len(s.regions) == 0 {
		return 0
	}
	for i, r := range s.regions {
		if slices.Contains(p.Regions, r) {
			return i
		}
	}
	return -1
}

// Render is the text of placeholder name at this provider for s: the
// stated value in the provider's words (option_map), empty when s does
// not state it. The region is the client's first that the provider has;
// a country is lowercase; booleans are true or false; the timeout whole
// seconds (timeout_ms: milliseconds).
func (p *Honours) Render(s Set, name string) string {
	var v string
	switch name {
	case Region:
		if i := p.Rank(s); i >= 0 && len(s.regions) > 0 {
			v = s.regions[i]
		}
	case Timeout:
		if s.timeout != 0 {
			v = strconv.FormatInt(int64(s.timeout.Seconds()), 10)
		}
	case TimeoutMS:
		if s.timeout != 0 {
			v = strconv.FormatInt(s.timeout.Milliseconds(), 10)
		}
		name = Timeout
	default:
		v, _ = s.Value(name)
	}
	if v == "" {
		return ""
	}
	if theirs, ok := p.Map[name][v]; ok {
		return theirs
	}
	return v
}

// Replace replaces every option placeholder in text by its rendering at
// this provider for s; other text, other placeholders included, is left
// as it is.
func (p *Honours) Replace(s Set, text string) string {
	if !Has(text) {
		return text
	}
	var b strings.Builder
	for {
		i := strings.Index(text, PlaceholderPrefix)
		if i < 0 {
			break
		}
		j := strings.IndexByte(text[i:], '}')
		if j < 0 {
			break
		}
		name := text[i+len(PlaceholderPrefix) : i+j]
		b.WriteString(text[:i])
		if placeholderName(name) {
			b.WriteString(p.Render(s, name))
		} else {
			b.WriteString(text[i : i+j+1])
		}
		text = text[i+j+1:]
	}
	b.WriteString(text)
	return b.String()
}

// Whole reports whether text is one option placeholder and nothing else,
// and which.
func Whole(text string) (name string, ok bool) {
	if !strings.HasPrefix(text, PlaceholderPrefix) || !strings.HasSuffix(text, "}") {
		return "", false
	}
	name = text[len(PlaceholderPrefix) : len(text)-1]
	return name, placeholderName(name)
}

// JSONValue is what placeholder name, rendered as text, stands for as a
// JSON value on its own: null when empty, a boolean for a boolean option
// rendered true or false, a number for a timeout rendered as digits, a
// string otherwise.
func JSONValue(name, text string) any {
	switch {
	case text == "":
		return nil
	case boolBit[name] != 0 && (text == "true" || text == "false"):
		return text == "true"
	case name == Timeout || name == TimeoutMS:
		if n, err := strconv.ParseInt(text, 10, 64); err == nil {
			return n
		}
	}
	return text
}
