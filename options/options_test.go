package options

import (
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestFromRequest(t *testing.T) {
	for _, tc := range []struct {
		name, query string
		header      []string
		want        map[string]any
		rest        string
		bad         string // the option the error names ("-": no name)
	}{
		{name: "none", query: "a=1&b=2", rest: "a=1&b=2"},
		{name: "query", query: "a=1&bf_region=eu-central,us-east&bf_stealth=1&bf_proxy_country=DE&z=2",
			want: map[string]any{"region": []string{"eu-central", "us-east"}, "stealth": true, "proxy_country": "de"}, rest: "a=1&z=2"},
		{name: "header", header: []string{"region=eu-central us-east, stealth=true", "timeout=10m, record=0"},
			want: map[string]any{"region": []string{"eu-central", "us-east"}, "stealth": true, "timeout": "10m0s", "record": false}},
		{name: "both places", query: "bf_solve_captchas=true", header: []string{"proxy_country=fr"},
			want: map[string]any{"solve_captchas": true, "proxy_country": "fr"}},
		{name: "escaped name", query: "bf%5Fstealth=true", want: map[string]any{"stealth": true}},
		{name: "unknown", query: "bf_colour=red", bad: "bf_colour"},
		{name: "unknown in header", header: []string{"colour=red"}, bad: "colour"},
		{name: "twice", query: "bf_stealth=1&bf_stealth=0", bad: "bf_stealth"},
		{name: "twice across", query: "bf_stealth=1", header: []string{"stealth=0"}, bad: "stealth"},
		{name: "bad bool", query: "bf_record=yes", bad: "bf_record"},
		{name: "bad country", query: "bf_proxy_country=xx", bad: "bf_proxy_country"},
		{name: "long country", query: "bf_proxy_country=deu", bad: "bf_proxy_country"},
		{name: "short timeout", query: "bf_timeout=500ms", bad: "bf_timeout"},
		{name: "long timeout", query: "bf_timeout=25h", bad: "bf_timeout"},
		{name: "bad region", query: "bf_region=eu%20central", bad: "bf_region"},
		{name: "empty region", query: "bf_region=,", bad: "bf_region"},
		{name: "brace region", query: "bf_region=%7Benv.KEY%7D", bad: "bf_region"},
		{name: "many regions", query: "bf_region=a,b,c,d,e,f,g,h,i", bad: "bf_region"},
		{name: "header without =", header: []string{"stealth"}, bad: "stealth"},
		{name: "bad escape", query: "bf_stealth=%zz", bad: "bf_stealth"},
		{name: "huge header", header: []string{"stealth=1," + strings.Repeat(" ", MaxHeader)}, bad: "-"},
		{name: "profile", query: "bf_profile=alice.main_1-x", want: map[string]any{"profile": "alice.main_1-x"}},
		{name: "profile in header", header: []string{"profile=shop, stealth=1"}, want: map[string]any{"profile": "shop", "stealth": true}},
		{name: "empty profile", query: "bf_profile=", bad: "bf_profile"},
		{name: "profile with a slash", query: "bf_profile=a%2Fb", bad: "bf_profile"},
		{name: "profile with a space", header: []string{"profile=a b"}, bad: "profile"},
		{name: "profile with a brace", query: "bf_profile=%7Benv.K%7D", bad: "bf_profile"},
		{name: "dot-dot profile", query: "bf_profile=..", bad: "bf_profile"},
		{name: "long profile", query: "bf_profile=" + strings.Repeat("p", MaxProfileID+1), bad: "bf_profile"},
		{name: "profile twice", query: "bf_profile=a", header: []string{"profile=b"}, bad: "profile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range tc.header {
				h.Add(Header, v)
			}
			s, rest, err := FromRequest(tc.query, h)
			if tc.bad != "" {
				var e *Error
				if !errors.As(err, &e) {
					t.Fatalf("err %v, want an *Error", err)
				}
				if want := strings.TrimPrefix(tc.bad, "-"); e.Option != want {
					t.Fatalf("the error names %q, want %q (%v)", e.Option, want, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if rest != tc.rest {
				t.Errorf("rest %q, want %q", rest, tc.rest)
			}
			if got := s.Map(); !reflect.DeepEqual(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
				t.Errorf("options %v, want %v", got, tc.want)
			}
		})
	}
}

func TestFromCapability(t *testing.T) {
	s, err := FromCapability(json.RawMessage(`{"region":["eu-central","us-east"],"stealth":true,"proxy_country":"DE","timeout":"90s","record":"0"}`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"region": []string{"eu-central", "us-east"}, "stealth": true, "proxy_country": "de", "timeout": "1m30s", "record": false}
	if !reflect.DeepEqual(s.Map(), want) {
		t.Fatalf("%v, want %v", s.Map(), want)
	}
	if s, err := FromCapability(json.RawMessage(`{"profile":"p-1"}`)); err != nil || s.Profile() != "p-1" {
		t.Fatalf("profile in bf:options: %v %v", s.Map(), err)
	}
	for raw, name := range map[string]string{
		`{"profile":"a/b"}`:      Profile,
		`{"profile":true}`:       Profile,
		`[1]`:                    Capability,
		`{"stealth":3}`:          Stealth,
		`{"region":[1]}`:         Region,
		`{"colour":"red"}`:       "colour",
		`{"timeout":"forever"}`:  Timeout,
		`{"proxy_country":"zz"}`: ProxyCountry,
		`null`:                   Capability,
	} {
		var e *Error
		if _, err := FromCapability(json.RawMessage(raw)); !errors.As(err, &e) || e.Option != name {
			t.Errorf("%s: %v, want an error naming %s", raw, err, name)
		}
	}
}

func TestAskedAndLacks(t *testing.T) {
	s, _, err := FromRequest("bf_region=eu,us&bf_stealth=true&bf_record=false&bf_proxy_country=de", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Asked(); !reflect.DeepEqual(got, []string{ProxyCountry, Stealth}) {
		t.Fatalf("asked %v (a boolean set to false asks for nothing)", got)
	}
	for _, tc := range []struct {
		p     Honours
		lacks []string
		rank  int
	}{
		{Honours{Regions: []string{"eu"}, Supports: []string{Stealth, ProxyCountry}}, nil, 0},
		{Honours{Regions: []string{"ap", "us"}, Supports: []string{Stealth, ProxyCountry, Record}}, nil, 1},
		{Honours{Regions: []string{"ap"}, Supports: []string{Stealth}}, []string{Region, ProxyCountry}, -1},
		{Honours{}, []string{Region, ProxyCountry, Stealth}, -1},
	} {
		if got := tc.p.Lacks(s); !reflect.DeepEqual(got, tc.lacks) {
			t.Errorf("%+v lacks %v, want %v", tc.p, got, tc.lacks)
		}
		if got := tc.p.Rank(s); got != tc.rank {
			t.Errorf("%+v rank %d, want %d", tc.p, got, tc.rank)
		}
	}
	var none Set
	if l := (&Honours{}).Lacks(none); l != nil || (&Honours{}).Rank(none) != 0 {
		t.Fatalf("a client asking nothing: lacks %v", l)
	}
}

func TestRender(t *testing.T) {
	s, _, err := FromRequest("bf_region=eu-central,us-east&bf_stealth=1&bf_proxy_country=DE&bf_timeout=2m&bf_record=0", nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &Honours{Regions: []string{"us-east", "eu-central"}, Map: map[string]map[string]string{
		Region: {"eu-central": "eu-central-1"}, ProxyCountry: {"gb": "uk"},
	}}
	for in, want := range map[string]string{
		"{bf.option.region}":         "eu-central-1",
		"{bf.option.proxy_country}":  "de",
		"{bf.option.stealth}":        "true",
		"{bf.option.record}":         "false",
		"{bf.option.solve_captchas}": "",
		"{bf.option.timeout}":        "120",
		"{bf.option.timeout_ms}":     "120000",
		"r={bf.option.region}&{env.X}&{bf.option.nope}&{bf.option.": "r=eu-central-1&{env.X}&{bf.option.nope}&{bf.option.",
		"plain": "plain",
	} {
		if got := p.Replace(s, in); got != want {
			t.Errorf("Replace(%q) = %q, want %q", in, got, want)
		}
	}
	// The region rendered is the client's first that the provider has.
	us := &Honours{Regions: []string{"us-east"}}
	if got := us.Render(s, Region); got != "us-east" {
		t.Errorf("region at a us-east provider: %q", got)
	}
	var none Set
	if got := p.Replace(none, "[{bf.option.region}|{bf.option.stealth}]"); got != "[|]" {
		t.Errorf("unset options render %q, want empty", got)
	}
	for _, tc := range []struct {
		name, text string
		want       any
	}{
		{Stealth, "true", true}, {Stealth, "false", false}, {Stealth, "", nil},
		{Stealth, "advanced", "advanced"}, {Timeout, "120", int64(120)}, {ProxyCountry, "de", "de"},
	} {
		if got := JSONValue(tc.name, tc.text); got != tc.want {
			t.Errorf("JSONValue(%s, %q) = %#v, want %#v", tc.name, tc.text, got, tc.want)
		}
	}
	if n, ok := Whole("{bf.option.stealth}"); !ok || n != Stealth {
		t.Error("Whole")
	}
	if _, ok := Whole("x{bf.option.stealth}"); ok {
		t.Error("Whole with text around")
	}
}

// TestProfileIsTheGatewaysOwn: a profile asks nothing of a provider (no
// provider lacks it, none is told it), and ForProviders leaves it out.
func TestProfileIsTheGatewaysOwn(t *testing.T) {
	s, _, err := FromRequest("bf_profile=alice&bf_stealth=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Asked(); !reflect.DeepEqual(got, []string{Stealth}) {
		t.Fatalf("asked %v", got)
	}
	if l := (&Honours{Supports: []string{Stealth}}).Lacks(s); l != nil {
		t.Fatalf("lacks %v", l)
	}
	p := s.ForProviders()
	if p.Profile() != "" || s.Profile() != "alice" || p.Equal(s) || !p.WithProfile("alice").Equal(s) {
		t.Fatalf("ForProviders %v of %v", p.Map(), s.Map())
	}
	if back, _, err := FromRequest(s.Query(), nil); err != nil || !back.Equal(s) {
		t.Fatalf("query %q read back as %v (%v)", s.Query(), back.Map(), err)
	}
	for _, bad := range []error{
		CheckSupports([]string{Profile}),
		CheckMap(map[string]map[string]string{Profile: {"a": "b"}}),
		CheckPlaceholders("?p={bf.option.profile}"),
	} {
		if bad == nil {
			t.Error("a provider setting naming profile passed")
		}
	}
}

func TestCheckProvider(t *testing.T) {
	if err := errors.Join(CheckRegions([]string{"eu-central"}), CheckSupports([]string{Stealth, Timeout}), CheckMap(map[string]map[string]string{Region: {"eu-central": "eu-central-1"}})); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		regions, supports []string
		m                 map[string]map[string]string
		want              string
	}{
		{regions: []string{"eu central"}, want: "region"},
		{supports: []string{Region}, want: "given by region"},
		{supports: []string{"colour"}, want: `"colour" is not a session option`},
		{m: map[string]map[string]string{"colour": {"a": "b"}}, want: "option_map"},
		{m: map[string]map[string]string{Region: {"a": "{env.X}"}}, want: "brace"},
		{m: map[string]map[string]string{Region: {"a": ""}}, want: "non-empty"},
	} {
		err := errors.Join(CheckRegions(tc.regions), CheckSupports(tc.supports), CheckMap(tc.m))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc, err, tc.want)
		}
	}
	if err := CheckPlaceholders("?a={bf.option.stealth}&b={bf.option.timeout_ms}"); err != nil {
		t.Error(err)
	}
	if err := CheckPlaceholders("?a={bf.option.colour}"); err == nil {
		t.Error("an unknown option placeholder passed")
	}
}

func TestQueryRoundTrip(t *testing.T) {
	s, _, err := FromRequest("bf_region=eu,us&bf_timeout=90s&bf_stealth=0", nil)
	if err != nil {
		t.Fatal(err)
	}
	back, rest, err := FromRequest(s.Query(), nil)
	if err != nil || rest != "" || !reflect.DeepEqual(back, s) {
		t.Fatalf("%v %q %v, want %v", back, rest, err, s)
	}
	if (Set{}).Query() != "" || !(Set{}).Empty() {
		t.Fatal("the zero set")
	}
	_ = time.Second
}

// FuzzHeader: any header either parses into options that render again as
// themselves, or is refused with an *Error; it never panics.
func FuzzHeader(f *testing.F) {
	for _, s := range []string{"region=eu-central us-east, stealth=true", "timeout=10m,record=0", "proxy_country=DE", "=,,=", "stealth=1,stealth=0", "region=" + strings.Repeat("a ", 20)} {
		f.Add(s, "bf_solve_captchas=1")
	}
	f.Fuzz(func(t *testing.T, header, query string) {
		h := http.Header{}
		h.Set(Header, header)
		s, rest, err := FromRequest(query, h)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("%v is not an *Error", err)
			}
			return
		}
		if strings.Contains(rest, QueryPrefix) {
			for _, item := range strings.Split(rest, "&") {
				if strings.HasPrefix(item, QueryPrefix) {
					t.Fatalf("rest %q keeps a bf_ item", rest)
				}
			}
		}
		back, _, err := FromRequest(s.Query(), nil)
		if err != nil || !reflect.DeepEqual(back.Map(), s.Map()) {
			t.Fatalf("%v rendered as %q read back as %v (%v)", s.Map(), s.Query(), back.Map(), err)
		}
		for _, r := range s.Regions() {
			if !ValidRegion(r) {
				t.Fatalf("region %q", r)
			}
		}
	})
}

func TestOthersLeftInQuery(t *testing.T) {
	s, rest, err := FromRequest("bf_resume=abc&bf_stealth=1&bf_resume_token=t", nil, "bf_resume", "bf_resume_token")
	if err != nil || rest != "bf_resume=abc&bf_resume_token=t" {
		t.Fatalf("rest %q, err %v", rest, err)
	}
	if v, _ := s.Value(Stealth); v != "true" {
		t.Fatalf("stealth %q", v)
	}
}

// TestEqual: the same options however they are written are equal; a
// region list in another order, an option stated false against one left
// out, or another value are not.
func TestEqual(t *testing.T) {
	read := func(q string) Set {
		t.Helper()
		s, _, err := FromRequest(q, http.Header{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	capSet, err := FromCapability(json.RawMessage(`{"region":["eu","us"],"stealth":true,"proxy_country":"DE","timeout":"10m"}`))
	if err != nil {
		t.Fatal(err)
	}
	if a := read("bf_region=eu,us&bf_stealth=1&bf_proxy_country=de&bf_timeout=600s"); !a.Equal(capSet) || !capSet.Equal(a) {
		t.Fatalf("the same options written two ways: %v %v", a.Map(), capSet.Map())
	}
	for _, q := range []string{
		"bf_region=us,eu&bf_stealth=1&bf_proxy_country=de&bf_timeout=10m",
		"bf_region=eu,us&bf_stealth=0&bf_proxy_country=de&bf_timeout=10m",
		"bf_region=eu,us&bf_proxy_country=de&bf_timeout=10m",
		"bf_region=eu,us&bf_stealth=1&bf_proxy_country=fr&bf_timeout=10m",
		"bf_region=eu,us&bf_stealth=1&bf_proxy_country=de&bf_timeout=11m",
		"bf_region=eu,us&bf_stealth=1&bf_proxy_country=de&bf_timeout=10m&bf_record=false",
	} {
		if read(q).Equal(capSet) {
			t.Errorf("%s equals %v", q, capSet.Map())
		}
	}
	if !(Set{}).Equal(read("")) || (Set{}).Equal(read("bf_stealth=false")) {
		t.Fatal("the empty set")
	}
}
