//go:build linux && !386

package upstreams

import (
	"syscall"
	"unsafe"
)

// setLowat sets the socket's receive low-water mark to s.lowatTo, a raw
// system call: the batch does not leave the runtime's scheduler for it.
func (s *sysReader) setLowat(fd uintptr) {
	syscall.RawSyscall6(syscall.SYS_SETSOCKOPT, fd, syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, uintptr(unsafe.Pointer(&s.lowatTo)), 4, 0)
}
