//go:build unix

package pgfake

import (
	"net"
	"syscall"
)

// drain reads into buf what the socket holds right now, without waiting,
// and returns the count (0 when nothing is there or on any error).
func drain(nc net.Conn, buf []byte) int {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return 0
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	// Go keeps sockets in non-blocking mode; returning true from the
	// callback stops the runtime from waiting for readiness, so this is a
	// single non-blocking read(2).
	rc.Read(func(fd uintptr) bool {
		m, err := syscall.Read(int(fd), buf)
		if err == nil && m > 0 {
			n = m
		}
		return true
	})
	return n
}
