// Package fakedns is a DNS server on 127.0.0.1 for tests, built on
// github.com/miekg/dns (the library CoreDNS is built on): it answers SRV
// and A queries from records the test changes while it runs, and can be
// made to answer SERVFAIL, or to be down (its port closed, so a query is
// refused at once), and back.
package fakedns

import (
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/miekg/dns"
)

// SRV is one SRV record's data.
type SRV struct {
	Target           string // a domain name; a trailing dot is added when missing
	Port             uint16
	Priority, Weight uint16
}

// Server is a running DNS server. Names are matched case-insensitively,
// with or without their trailing dot; a name with no record of the type
// asked answers NOERROR with none, a name with no record at all NXDOMAIN.
type Server struct {
	// Addr is where it answers (UDP), 127.0.0.1:port: what a resolver
	// list names.
	Addr string

	mu      sync.Mutex
	srv     map[string][]SRV
	a       map[string][]net.IP
	fail    bool
	server  *dns.Server
	queries atomic.Int64
}

// Start starts a server on a free 127.0.0.1 port for a test; the test's
// end stops it.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := Listen()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Down)
	return s
}

// Listen starts a server on a free 127.0.0.1 port (a benchmark's); Down
// stops it.
func Listen() (*Server, error) {
	s := &Server{srv: map[string][]SRV{}, a: map[string][]net.IP{}}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s.Addr = pc.LocalAddr().String()
	s.serve(pc)
	return s, nil
}

func (s *Server) serve(pc net.PacketConn) {
	started := make(chan struct{})
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(s.answer), NotifyStartedFunc: func() { close(started) }}
	s.mu.Lock()
	s.server = srv
	s.mu.Unlock()
	go srv.ActivateAndServe()
	<-started
}

// key is a name as the records are kept.
func key(name string) string { return strings.ToLower(dns.Fqdn(name)) }

// SetSRV makes recs the SRV records of name (none: it has none).
func (s *Server) SetSRV(name string, recs ...SRV) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(recs) == 0 {
		delete(s.srv, key(name))
		return
	}
	s.srv[key(name)] = append([]SRV(nil), recs...)
}

// SetA makes ips the A records of name (none: it has none).
func (s *Server) SetA(name string, ips ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(ips) == 0 {
		delete(s.a, key(name))
		return
	}
	var out []net.IP
	for _, ip := range ips {
		out = append(out, net.ParseIP(ip).To4())
	}
	s.a[key(name)] = out
}

// Fail makes every answer SERVFAIL (on), or the records again (off).
func (s *Server) Fail(on bool) {
	s.mu.Lock()
	s.fail = on
	s.mu.Unlock()
}

// Down stops the server: its port is closed, so a query is refused.
func (s *Server) Down() {
	s.mu.Lock()
	srv := s.server
	s.server = nil
	s.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
	}
}

// Up starts the server again on its address after Down.
func (s *Server) Up() error {
	pc, err := net.ListenPacket("udp", s.Addr)
	if err != nil {
		return err
	}
	s.serve(pc)
	return nil
}

// Queries counts the queries answered so far.
func (s *Server) Queries() int64 { return s.queries.Load() }

func (s *Server) answer(w dns.ResponseWriter, req *dns.Msg) {
	s.queries.Add(1)
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		m.Rcode = dns.RcodeServerFailure
		w.WriteMsg(m)
		return
	}
	known := false
	for _, q := range req.Question {
		name := key(q.Name)
		srvs, hasSRV := s.srv[name]
		ips, hasA := s.a[name]
		known = known || hasSRV || hasA
		hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: 1}
		switch q.Qtype {
		case dns.TypeSRV:
			hdr.Rrtype = dns.TypeSRV
			for _, r := range srvs {
				m.Answer = append(m.Answer, &dns.SRV{Hdr: hdr, Priority: r.Priority, Weight: r.Weight, Port: r.Port, Target: dns.Fqdn(r.Target)})
			}
		case dns.TypeA:
			hdr.Rrtype = dns.TypeA
			for _, ip := range ips {
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: ip})
			}
		}
	}
	if !known {
		m.Rcode = dns.RcodeNameError
	}
	w.WriteMsg(m)
}
