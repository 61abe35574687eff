package pgtest

import (
	"io"
	"net"
	"sync"
)

// SwitchProxy forwards TCP connections on loopback to a target that tests can
// change: to another server (an address in front of several standbys), or
// to none, when it takes each connection and closes it at once (a server
// that refuses to talk). Changing the target ends every connection
// forwarded so far.
type SwitchProxy struct {
	ln     net.Listener
	mu     sync.Mutex
	target string
	conns  []net.Conn // forwarded connections, both sides
}

// StartSwitchProxy starts a SwitchProxy to target ("" for none) on a free loopback
// port.
func StartSwitchProxy(target string) (*SwitchProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &SwitchProxy{ln: ln, target: target}
	go p.serve()
	return p, nil
}

// Addr returns the proxy's host:port.
func (p *SwitchProxy) Addr() string { return p.ln.Addr().String() }

// SetTarget forwards new connections to target ("" for none) and ends the
// connections forwarded so far.
func (p *SwitchProxy) SetTarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// Close stops accepting and ends every forwarded connection.
func (p *SwitchProxy) Close() error {
	err := p.ln.Close()
	p.SetTarget("")
	return err
}

func (p *SwitchProxy) serve() {
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		var up net.Conn
		if p.target != "" {
			up, err = net.Dial("tcp", p.target)
		}
		if up == nil || err != nil {
			p.mu.Unlock()
			nc.Close()
			continue
		}
		p.conns = append(p.conns, nc, up)
		p.mu.Unlock()
		go func() { io.Copy(up, nc); up.Close() }()
		go func() { io.Copy(nc, up); nc.Close() }()
	}
}
