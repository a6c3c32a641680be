package upstreams

import (
	"errors"
	"net"
)

// TEMPORARY: replaced by the hold branch.

func (s *Session) ClientEnded() bool {
	r := s.Reason()
	return r == EndClientClosed || r == EndClientError
}
func (s *Session) ClientCloseCode() int                        { return 1001 }
func (s *Session) Parked() bool                                { return false }
func (s *Session) Resume(client net.Conn, pending []byte) error { return errors.New("stub") }
func (s *Session) ParkedDropped() (frames, bytes int64)        { return 0, 0 }
