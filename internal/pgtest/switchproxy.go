package pgtest

import (
	"io"
	"net"
)

// SwitchProxy forwards TCP connections on loopback to a target that tests can
// change: to another server (an address in front of several standbys), or
// to none, when it takes each connection and closes it at once (a server
// that refuses to talk). Changing the target ends every connection
// forwarded so far.
type SwitchProxy struct{ *proxy }

// StartSwitchProxy starts a SwitchProxy to target ("" for none) on a free
// loopback port.
func StartSwitchProxy(target string) (*SwitchProxy, error) {
	p, err := startProxy(target, func(client, server net.Conn) (frontend, backend func()) {
		return func() { io.Copy(server, client) }, func() { io.Copy(client, server) }
	})
	if err != nil {
		return nil, err
	}
	return &SwitchProxy{p}, nil
}

// SetTarget forwards new connections to target ("" for none) and ends the
// connections forwarded so far.
func (p *SwitchProxy) SetTarget(target string) { p.retarget(target) }

// Repoint forwards new connections to target ("" for none) and leaves the
// connections forwarded so far as they are: an address that starts leading
// to another server (a DNS name moved, a balancer's target changed) while
// connections to the old one live on.
func (p *SwitchProxy) Repoint(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}
