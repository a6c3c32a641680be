//go:build unix

package caddybin

import "syscall"

// RaiseFileLimit lets this process, and the children it starts, hold
// thousands of connections.
func RaiseFileLimit() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil && l.Cur < 65536 {
		l.Cur = 65536
		if l.Max < l.Cur {
			l.Max = l.Cur
		}
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}
