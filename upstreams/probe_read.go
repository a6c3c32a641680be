package upstreams

import (
	"errors"
	"net"
)

// errNotYet is what a probeReader that does not wait returns when the rest
// of the answer has not come yet.
var errNotYet = errors.New("answer not there yet")

// maxReadAhead bounds what Collect reads without waiting; a larger answer
// is read by Finish.
const maxReadAhead = 16 << 10

// probeReader is what a prober's bufio.Reader reads: the connection, after
// the bytes Collect read ahead. Those are kept until the probe is over, so
// that Finish can read the answer again from its start if Collect could
// not end the probe.
type probeReader struct {
	conn net.Conn
	// raw reads the connection without waiting; nil when it cannot (TLS,
	// or a platform without it).
	raw rawReader
	// ahead holds what was read ahead; aheadErr, what ended that (nil:
	// nothing did). off is how much of ahead was served, errServed
	// whether aheadErr was.
	ahead     []byte
	aheadErr  error
	off       int
	errServed bool
	// nowait: with ahead served, Read reads more without waiting, and
	// returns errNotYet when nothing more has come.
	nowait bool
}

// rawReader reads and writes a connection's socket directly, without the
// runtime's work for a call that may block (the socket never blocks).
type rawReader interface {
	// readNow reads once without waiting: n > 0 bytes; or again, when
	// nothing has come (or the connection is closed or past its read
	// deadline: its own read tells which); or the error (io.EOF at the
	// end) a read of the connection would return.
	readNow(p []byte) (n int, again bool, err error)
	// readWait is readNow waiting, until the connection's read
	// deadline, for something to come.
	readWait(p []byte) (n int, again bool, err error)
	// write writes p whole, waiting only while the socket takes no more.
	write(p []byte) error
	// quiet says whether data that comes in may go unannounced: while
	// on, an answer smaller than the probe's read-ahead limit wakes no
	// thread waiting on the runtime's poller (it is read without
	// waiting); it must be off before a read waits.
	quiet(on bool)
}

// reset makes r read conn, with nothing read ahead.
func (r *probeReader) reset(conn net.Conn) {
	r.conn = conn
	r.raw = newRawReader(conn)
	r.forget()
}

func (r *probeReader) Read(p []byte) (int, error) {
	for {
		if r.off < len(r.ahead) {
			n := copy(p, r.ahead[r.off:])
			r.off += n
			return n, nil
		}
		if r.aheadErr != nil && !r.errServed {
			r.errServed = true
			return 0, r.aheadErr
		}
		if !r.nowait {
			return r.conn.Read(p)
		}
		if !r.readAhead() {
			return 0, errNotYet
		}
	}
}

// readAhead reads once what has come, without waiting, and keeps it; false
// when nothing has (or more may not be read ahead).
func (r *probeReader) readAhead() bool { return r.readMore(false) }

// readAheadWait is readAhead waiting, until the connection's read
// deadline, for something to come.
func (r *probeReader) readAheadWait() bool { return r.readMore(true) }

func (r *probeReader) readMore(wait bool) bool {
	if r.raw == nil || r.aheadErr != nil {
		return false
	}
	if len(r.ahead) == cap(r.ahead) {
		if cap(r.ahead) >= maxReadAhead {
			return false
		}
		grown := make([]byte, len(r.ahead), max(2*cap(r.ahead), 1024))
		copy(grown, r.ahead)
		r.ahead = grown
	}
	read := r.raw.readNow
	if wait {
		read = r.raw.readWait
	}
	n, again, err := read(r.ahead[len(r.ahead):cap(r.ahead)])
	switch {
	case again:
		return false
	case n > 0:
		r.ahead = r.ahead[:len(r.ahead)+n]
	default:
		r.aheadErr = err
	}
	return true
}

// rewind serves what was read ahead again, from its start.
func (r *probeReader) rewind() {
	r.off, r.errServed = 0, false
}

// forget drops what was read ahead (the probe is over).
func (r *probeReader) forget() {
	r.ahead, r.aheadErr, r.off, r.errServed, r.nowait = r.ahead[:0], nil, 0, false, false
}
