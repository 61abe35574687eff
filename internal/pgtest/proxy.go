package pgtest

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
)

// proxy is the loopback TCP plumbing shared by the test proxies
// (WaitForProxy, PolarProxy, SwitchProxy): it accepts clients, dials the
// target for each, runs the two directions, and closes everything on Close.
type proxy struct {
	ln     net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	target string // "": clients are closed at once
	conns  map[net.Conn]bool
}

// startProxy listens on a free loopback port; for each client it dials
// target, asks handle for the connection's two directions, frontend (client
// to server) and backend (server to client), and runs each in its own
// goroutine, closing the other side's connection when one ends.
func startProxy(target string, handle func(client, server net.Conn) (frontend, backend func())) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept(handle)
	return p, nil
}

// Addr returns the proxy's "host:port".
func (p *proxy) Addr() string { return p.ln.Addr().String() }

// Close stops the proxy and its connections.
func (p *proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// retarget sends new clients to target ("": closes them at once) and ends
// the connections forwarded so far.
func (p *proxy) retarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	for c := range p.conns {
		c.Close()
	}
}

func (p *proxy) track(c net.Conn, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.conns[c] = true
	} else {
		delete(p.conns, c)
	}
}

func (p *proxy) accept(handle func(client, server net.Conn) (frontend, backend func())) {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		if target == "" {
			client.Close()
			continue
		}
		server, err := net.Dial("tcp", target)
		if err != nil {
			client.Close()
			continue
		}
		p.track(client, true)
		p.track(server, true)
		frontend, backend := handle(client, server)
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			backend()
			client.Close()
			p.track(client, false)
		}()
		go func() {
			defer p.wg.Done()
			frontend()
			server.Close()
			p.track(server, false)
		}()
	}
}

// forwardStartup copies the client's startup message, which has no type
// byte (its length comes first), to the server, and reports whether it did.
func forwardStartup(client, server net.Conn) bool {
	var hdr [4]byte
	if _, err := io.ReadFull(client, hdr[:]); err != nil {
		return false
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n < 4 || n > 1<<20 {
		return false
	}
	start := make([]byte, n)
	copy(start, hdr[:])
	if _, err := io.ReadFull(client, start[4:]); err != nil {
		return false
	}
	_, err := server.Write(start)
	return err == nil
}

// readMessage reads one protocol message after the startup phase: its type
// and its body.
func readMessage(r io.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n < 4 || n > 1<<30 {
		return 0, nil, errors.New("pgtest: message length out of range")
	}
	body := make([]byte, n-4)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, err
	}
	return hdr[0], body, nil
}
