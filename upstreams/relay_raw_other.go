//go:build !unix

package upstreams

import "net"

// bindRaw: here a plain TCP source is read through net.Conn, like any
// other; its wait holds a buffer (the small one while it trickles).
func (d *direction) bindRaw(*net.TCPConn) {}
