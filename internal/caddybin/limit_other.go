//go:build !unix

package caddybin

// RaiseFileLimit does nothing where there is no RLIMIT_NOFILE.
func RaiseFileLimit() {}
