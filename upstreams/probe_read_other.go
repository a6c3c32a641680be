//go:build !linux

package upstreams

import "net"

// newRawReader: without a direct read of the socket, probes wait for
// their answers one by one (Send declines, and Probe runs them).
func newRawReader(net.Conn) rawReader { return nil }
