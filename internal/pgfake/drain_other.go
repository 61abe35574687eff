//go:build !unix

package pgfake

import "net"

// drain is a no-op where pgfake cannot read without blocking: a batch is
// then what one read returned, completed to a message boundary.
func drain(net.Conn, []byte) int { return 0 }
