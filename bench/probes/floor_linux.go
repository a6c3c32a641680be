package main

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// floorLoop sends the probes' GETs with nothing around them: n kept
// connections of its own, taken out of the runtime's poller; at every
// grid time (a tenth of the interval, as the gateway aligns its probes) a
// tenth of them each write a GET, the loop polls their sockets until the
// answers have come, and reads each once.
type floorLoop struct {
	fds      []int
	reqs     [][]byte
	interval time.Duration
}

func newFloor(server string, n int, interval time.Duration) (*floorLoop, error) {
	f := &floorLoop{interval: interval}
	for i := range n {
		c, err := net.Dial("tcp", server)
		if err != nil {
			f.close()
			return nil, err
		}
		rc, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			f.close()
			return nil, err
		}
		fd := -1
		rc.Control(func(s uintptr) {
			r, _, errno := syscall.Syscall(syscall.SYS_FCNTL, s, syscall.F_DUPFD_CLOEXEC, 0)
			if errno == 0 {
				fd = int(r)
			}
		})
		c.Close()
		if fd < 0 {
			f.close()
			return nil, fmt.Errorf("no descriptor for connection %d", i)
		}
		f.fds = append(f.fds, fd)
		f.reqs = append(f.reqs, []byte("GET /p"+strconv.Itoa(i)+"/json/version HTTP/1.1\r\nHost: "+server+
			"\r\nUser-Agent: floor\r\nAccept: application/json\r\n\r\n"))
	}
	return f, nil
}

func (f *floorLoop) close() {
	for _, fd := range f.fds {
		syscall.Close(fd)
	}
}

type pollFd struct {
	fd      int32
	events  int16
	revents int16
}

// run runs the loop for d and measures it.
func (f *floorLoop) run(server string, d time.Duration) sample {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		f.loop(stop)
	}()
	time.Sleep(f.interval) // every connection has sent once
	s := measure(server, d)
	close(stop)
	wg.Wait()
	return s
}

func (f *floorLoop) loop(stop chan struct{}) {
	grid := max(f.interval/10, time.Millisecond)
	steps := int(f.interval / grid)
	buf := make([]byte, 4096)
	set := make([]pollFd, 0, len(f.fds))
	next := time.Now().Truncate(grid).Add(grid)
	t := time.NewTimer(time.Until(next))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		step := int(next.UnixNano()/int64(grid)) % steps
		next = next.Add(grid)
		t.Reset(time.Until(next))
		set = set[:0]
		for i := step; i < len(f.fds); i += steps {
			req := f.reqs[i]
			syscall.RawSyscall(syscall.SYS_WRITE, uintptr(f.fds[i]), uintptr(unsafe.Pointer(&req[0])), uintptr(len(req)))
			set = append(set, pollFd{fd: int32(f.fds[i]), events: 1})
		}
		end := time.Now().Add(25 * time.Millisecond)
		for len(set) > 0 && time.Now().Before(end) {
			ts := syscall.NsecToTimespec(int64(time.Until(end)))
			syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&set[0])), uintptr(len(set)), uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
			k := 0
			for _, p := range set {
				if p.revents != 0 {
					syscall.RawSyscall(syscall.SYS_READ, uintptr(p.fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
					continue
				}
				set[k] = p
				k++
			}
			set = set[:k]
		}
	}
}
