//go:build unix

package pgryw

import (
	"crypto/tls"
	"errors"
	"net"
	"syscall"

	"github.com/pgryw/pgryw/internal/wire"
)

// sockPeek looks at what an idle server connection's socket holds, without
// reading it and without waiting.
//
// peekBytes is how much it looks at: enough for the answer to a capture
// that rode behind the connection's last write and that nobody has read
// yet (writes return at their own ReadyForQuery), and the message after it.
const peekBytes = 256

type sockPeek struct {
	rc  syscall.RawConn
	tls bool
	buf [peekBytes]byte
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
// holds the end of the stream or a reset, or, as the first thing waiting
// after the answers w still expects (a ride-along's answer nobody has read
// yet: wire.Conn.LastWords), a message a server sends an idle client only
// as it terminates the session (without TLS: a notice, such as the warning
// of an immediate shutdown, or an error, such as FATAL 57P01; under TLS: an
// alert, such as close_notify, as the first thing waiting). A notification
// or anything else that may come while a session lives reports false, as
// does a socket with nothing to read, or with an answer still arriving.
func (p *sockPeek) gone(w *wire.Conn) bool {
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
	t, ok := w.LastWords(p.buf[:p.n])
	return ok && (t == 'N' || t == 'E')
}
