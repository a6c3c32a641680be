package upstreams

import "syscall"

// setLowat sets the socket's receive low-water mark to s.lowatTo. 32-bit
// x86 reaches setsockopt through socketcall, so it has no raw system call
// number for it.
func (s *sysReader) setLowat(fd uintptr) {
	syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, int(s.lowatTo))
}
