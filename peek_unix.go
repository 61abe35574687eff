//go:build unix

package pgryw

import (
	"crypto/tls"
	"errors"
	"net"
	"syscall"
)

// sockPeek looks at what an idle server connection's socket holds, without
// reading it and without waiting.
type sockPeek struct {
	rc  syscall.RawConn
	tls bool
	buf [1]byte
	n   int
	err error
	fn  func(uintptr) // peekFD, bound once so a peek allocates nothing
}

// newSockPeek returns a peeker for nc (the connection under pgryw's wire
// layer: TCP or a Unix socket, possibly under TLS), or nil when it cannot
// see the socket (a test's wrapper).
func newSockPeek(nc net.Conn) *sockPeek {
	p := &sockPeek{}
	if t, ok := nc.(*tls.Conn); ok {
		nc, p.tls = t.NetConn(), true
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	p.rc = rc
	p.fn = p.peekFD
	return p
}

// gone reports that the server has ended an idle connection: its socket
// holds the end of the stream or a reset, or, as the first thing waiting, a
// message a server sends an idle client only as it terminates the session
// (without TLS: a notice, such as the warning of an immediate shutdown, or
// an error, such as FATAL 57P01; under TLS: an alert, such as close_notify).
// A notification or anything else that may come while a session lives
// reports false, as does a socket with nothing to read.
func (p *sockPeek) gone() bool {
	if err := p.rc.Control(p.fn); err != nil {
		return true // the descriptor is closed
	}
	switch {
	case errors.Is(p.err, syscall.EAGAIN) || errors.Is(p.err, syscall.EWOULDBLOCK) || errors.Is(p.err, syscall.EINTR):
		return false
	case p.err != nil || p.n == 0:
		return true
	case p.tls:
		return p.buf[0] == 21 // TLS alert record
	}
	return p.buf[0] == 'N' || p.buf[0] == 'E'
}
