//go:build unix && !(linux && (amd64 || arm64))

package pgryw

import "syscall"

// peekFD is one recv(2) of up to peekBytes with MSG_PEEK (they stay for pgx)
// and MSG_DONTWAIT. It runs through RawConn.Control, which does not wait
// for the socket to become readable nor for a read in progress elsewhere.
func (p *sockPeek) peekFD(fd uintptr) {
	p.n, _, p.err = syscall.Recvfrom(int(fd), p.buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
}
