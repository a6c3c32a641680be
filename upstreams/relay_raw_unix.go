//go:build unix

package upstreams

import (
	"net"
	"syscall"
)

// bindRaw lets a plain TCP source be read straight from its socket, so a
// session waiting for bytes holds no buffer.
func (d *direction) bindRaw(src *net.TCPConn) {
	if raw, err := src.SyscallConn(); err == nil {
		d.raw = raw
		d.rawFn = d.rawRead // bound once: no allocation per read
	}
}

// rawRead reads src's socket into a pooled buffer taken only now that the
// socket may be readable; it reports false (and keeps no buffer) when
// nothing is there yet, and the runtime then waits for readability.
func (d *direction) rawRead(fd uintptr) bool {
	b := relayBufs.Get().(*[]byte)
	var n int
	var err error
	for {
		n, err = syscall.Read(int(fd), *b)
		if err != syscall.EINTR {
			break
		}
	}
	if err == syscall.EAGAIN {
		relayBufs.Put(b)
		return false
	}
	d.rbuf, d.rn, d.rerr = b, n, err
	return true
}
