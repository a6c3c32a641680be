//go:build linux

package upstreams

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// sysReader reads a TCP connection's socket directly.
type sysReader struct {
	conn *net.TCPConn
	rc   syscall.RawConn
	// One read's buffer, whether to wait, and what it found; readFn
	// reads with them (made once: a closure per read would be allocated
	// each time).
	p       []byte
	wait    bool
	n       int
	errno   error
	readFn  func(fd uintptr) bool
	writeFn func(fd uintptr) bool
	// lowat is the socket's receive low-water mark (0: the default,
	// one byte); lowatFn sets it to lowatTo.
	lowat, lowatTo int32
	lowatFn        func(fd uintptr)
}

func newRawReader(conn net.Conn) rawReader {
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	s := &sysReader{conn: tc, rc: rc}
	s.readFn, s.writeFn, s.lowatFn = s.readFD, s.writeFD, s.setLowat
	return s
}

func (s *sysReader) readNow(p []byte) (int, bool, error) { return s.read(p, false) }

func (s *sysReader) readWait(p []byte) (int, bool, error) { return s.read(p, true) }

// readFD reads the socket once; false (with wait) makes the poller wait
// for more while nothing has come.
//
// The socket does not block (the poller waits instead), so the read is a
// raw system call: the runtime's bookkeeping of a call that may block
// (handing the P over, waking its monitor thread) would cost more than
// the read itself.
func (s *sysReader) readFD(fd uintptr) bool {
	for {
		n, _, errno := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(s.p))), uintptr(len(s.p)))
		s.n, s.errno = int(n), nil
		if errno != 0 {
			s.n, s.errno = 0, errno
		}
		if errno != syscall.EINTR {
			return !s.wait || errno != syscall.EAGAIN
		}
	}
}

// write writes p whole, waiting (as the connection's Write would) only
// while the socket takes no more.
func (s *sysReader) write(p []byte) error {
	s.p = p
	err := s.rc.Write(s.writeFn)
	if err == nil && s.errno != nil {
		err = os.NewSyscallError("write", s.errno)
	}
	s.p, s.errno = nil, nil
	return err
}

// writeFD writes what is left of s.p; false makes the poller wait for room.
func (s *sysReader) writeFD(fd uintptr) bool {
	for len(s.p) > 0 {
		n, _, errno := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(unsafe.SliceData(s.p))), uintptr(len(s.p)))
		switch errno {
		case 0:
			s.p = s.p[n:]
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			s.errno = errno
			return true
		}
	}
	return true
}

func (s *sysReader) read(p []byte, wait bool) (n int, again bool, err error) {
	s.p, s.wait = p, wait
	rerr := s.rc.Read(s.readFn)
	n, errno := s.n, s.errno
	s.p, s.n, s.errno = nil, 0, nil
	switch {
	case rerr != nil:
		// Closed, or past its deadline (called off): the connection's
		// own read says so.
		return 0, true, nil
	case errno == syscall.EAGAIN:
		return 0, true, nil
	case errno != nil:
		return 0, false, &net.OpError{Op: "read", Net: "tcp", Source: s.conn.LocalAddr(), Addr: s.conn.RemoteAddr(), Err: os.NewSyscallError("read", errno)}
	case n == 0:
		return 0, false, io.EOF
	}
	return n, false, nil
}

// quiet raises the socket's receive low-water mark above any answer read
// without waiting (on), or puts it back to one byte: below the mark, data
// that comes in does not make the socket readable to the runtime's poller,
// so the thread the poller sleeps on is not woken for each answer of a
// batch, which the batch reads itself. A read finds the data whatever the
// mark (it does not wait); one that waits goes through the poller, so the
// mark must be back to one byte first: what came before is then read at
// once, and what comes after is announced.
func (s *sysReader) quiet(on bool) {
	to := int32(0)
	if on {
		to = maxReadAhead
	}
	if s.lowat == to {
		return
	}
	s.lowatTo = max(to, 1)
	if s.rc.Control(s.lowatFn) == nil {
		s.lowat = to
	}
}
