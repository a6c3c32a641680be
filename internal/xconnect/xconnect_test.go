package xconnect

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestEnabledByDefault(t *testing.T) {
	if os.Getenv("XCONNECT_CHILD") != "" {
		// Run as a child with the GODEBUG the parent chose: report.
		if Enabled {
			os.Stdout.WriteString("enabled " + os.Getenv("GODEBUG"))
		} else {
			os.Stdout.WriteString("disabled " + os.Getenv("GODEBUG"))
		}
		return
	}
	for _, tc := range []struct{ godebug, want string }{
		{"", "enabled http2xconnect=1"},
		{"netdns=go", "enabled netdns=go,http2xconnect=1"},
		{"http2xconnect=0", "disabled http2xconnect=0"}, // the operator's choice stands
		{"http2xconnect=1", "enabled http2xconnect=1"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestEnabledByDefault$")
		cmd.Env = append(os.Environ(), "XCONNECT_CHILD=1", "GODEBUG="+tc.godebug)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("GODEBUG=%q: %v", tc.godebug, err)
		}
		if got, _, _ := strings.Cut(string(out), "\n"); got != tc.want && !strings.HasPrefix(string(out), tc.want) {
			t.Fatalf("GODEBUG=%q: %q, want %q", tc.godebug, out, tc.want)
		}
	}
}
