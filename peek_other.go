//go:build !unix

package pgryw

import (
	"net"

	"github.com/pgryw/pgryw/internal/wire"
)

// sockPeek cannot look at sockets here: idle connections a server ended are
// found when a statement fails on them.
type sockPeek struct{}

func newSockPeek(net.Conn) *sockPeek { return nil }

func (*sockPeek) gone(*wire.Conn) bool { return false }
