package browserfailover

import (
	"net"
	"reflect"
)

// relayConn is the connection a hijacked client's session is relayed on.
//
// Caddy hands out a hijacked connection wrapped so that its access log can
// count the bytes read and written on it. An HTTP/1.1 session outlives its
// request: Caddy writes the request's access log line as soon as the
// handler returns, while the relay goes on reading and writing, so the
// relay must not touch those counters (they are not safe to share across
// goroutines). The gateway writes its answer (the 101) through the
// wrapper, so the log line counts it, and relays on the connection
// underneath. The wrapper keeps that connection as its embedded net.Conn;
// a wrapper without one is relayed on as it is.
func relayConn(hijacked net.Conn) net.Conn {
	v := reflect.ValueOf(hijacked)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return hijacked
	}
	sf, ok := v.Elem().Type().FieldByName("Conn")
	if !ok || !sf.Anonymous || len(sf.Index) != 1 {
		return hijacked
	}
	f := v.Elem().FieldByIndex(sf.Index)
	if !f.CanInterface() {
		return hijacked
	}
	inner, ok := f.Interface().(net.Conn)
	if !ok || inner == nil {
		return hijacked
	}
	return inner
}
