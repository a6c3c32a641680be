// Package xconnect turns on HTTP/2 extended CONNECT (RFC 8441) in the
// process, so that Caddy's HTTP/2 server advertises
// SETTINGS_ENABLE_CONNECT_PROTOCOL and HTTP/2 clients (browsers) can open
// WebSockets over it.
//
// Caddy 2.11 serves HTTP/2 with golang.org/x/net/http2 (and h2c with
// net/http's bundled copy); with Go 1.26 both leave extended CONNECT off
// unless the GODEBUG environment variable holds http2xconnect=1 when their
// package initializes: they read os.Getenv("GODEBUG") in init, so neither a
// //go:debug directive nor a later os.Setenv reaches them. This package
// imports nothing but the standard library's os and strings and its import
// path sorts before "golang.org/..." and "net/...", so the Go spec's
// package initialization order runs its init before theirs.
//
// An operator who sets http2xconnect themselves (for example
// GODEBUG=http2xconnect=0 to keep it off) is left alone.
package xconnect

import (
	"os"
	"strings"
)

// Setting is the GODEBUG setting this package adds.
const Setting = "http2xconnect=1"

// Enabled reports whether GODEBUG asked for extended CONNECT when the
// process started (after this package's init).
var Enabled bool

func init() {
	v := os.Getenv("GODEBUG")
	if !strings.Contains(v, "http2xconnect=") {
		if v != "" {
			v += ","
		}
		v += Setting
		os.Setenv("GODEBUG", v)
	}
	Enabled = strings.Contains(os.Getenv("GODEBUG"), Setting)
}
