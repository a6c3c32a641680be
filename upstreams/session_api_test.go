package upstreams

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestJSONPointer(t *testing.T) {
	var doc any
	dec := json.NewDecoder(strings.NewReader(`{"id":"s1","n":42,"a/b":{"m~n":"x"},"list":[{"u":"ws://h/1"}],"empty":"","obj":{}}`))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"/id": "s1", "/n": "42", "/a~1b/m~0n": "x", "/list/0/u": "ws://h/1"} {
		if got, ok := pointer(doc, p); !ok || got != want {
			t.Errorf("%s: %q %v, want %q", p, got, ok, want)
		}
	}
	for _, p := range []string{"/missing", "/empty", "/obj", "/list/1/u", "/list/x", "/id/x"} {
		if got, ok := pointer(doc, p); ok {
			t.Errorf("%s: found %q", p, got)
		}
	}
}

func TestFillJSON(t *testing.T) {
	out, err := FillJSON(`{"a":"{x}","list":["{x}",1,true],"{x}":null}`, func(s string) string {
		return strings.ReplaceAll(s, "{x}", `q"uote\`)
	})
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	if v["a"] != `q"uote\` || v["list"].([]any)[0] != `q"uote\` {
		t.Fatalf("filled %s", out)
	}
	if _, err := FillJSON(`{"a":`, nil); err == nil {
		t.Fatal("bad JSON accepted")
	}
}

func TestValidateSessionAPI(t *testing.T) {
	ok := SessionAPI{CreateMethod: "POST", CreateURL: "/v1/sessions", ConnectURL: "/connectUrl", SessionID: "/id",
		ReleaseMethod: "POST", ReleaseURL: "https://h/v1/sessions/{session_id}"}
	if err := ValidateSessionAPI(ok); err != nil {
		t.Fatal(err)
	}
	secret := "hDrS3cr3t"
	bad := ok
	bad.Headers = []Header{{Field: "X-Key", Value: secret + "\n"}}
	bad.Body = `{"key":"` + secret
	err := ValidateSessionAPI(bad)
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Fatalf("error %v: missing, or it shows the secret", err)
	}
	if _, err := New(Config{Name: "p", URL: "https://api.h", SessionAPI: &SessionAPI{}}, Defaults{}, nil); err == nil ||
		!strings.Contains(err.Error(), "no create call") || !strings.Contains(err.Error(), "no release call") {
		t.Fatalf("empty session API: %v", err)
	}
	p, err := New(Config{Name: "p", URL: "https://api.h.example", SessionAPI: &ok}, Defaults{}, nil)
	if err != nil || p.Discover || p.api.createURL.String() != "https://api.h.example/v1/sessions" {
		t.Fatalf("%v %+v", err, p)
	}
	if _, err := p.retarget("wss://connect.h.example/?sessionId=1"); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"ftp://h/", "/relative", ""} {
		if _, err := p.retarget(u); err == nil {
			t.Errorf("connect URL %q accepted", u)
		}
	}
}
