// Package faultnet wraps net.Conns so that tests can inject network faults
// at chosen points of a conversation: a write cut after k bytes, a read cut
// after k bytes, a connection reset, a stall, or a cut or stall right after
// the server's next ReadyForQuery.
//
// A Network tracks every connection it wrapped, so a test can arm a fault on
// one connection (found by its local address, or picked from the live ones to
// a port) or on all connections to a port. Its Wrap method has the signature
// pgryw's SetNetHook test seam expects:
//
//	nw := faultnet.New()
//	pgryw.SetNetHook(connector, nw.Wrap)
//	...
//	nw.Lookup(pgConn.Conn().LocalAddr()).Arm(faultnet.Fault{Kind: faultnet.CutWrite, After: 17})
//
// Faults are one-shot: once fired, a fault is spent. Arming a fault of a kind
// already armed on a connection replaces it; faults of different kinds are
// independent. Deadlines set on a Conn are honoured during a stall, and Close
// ends a stall at once.
package faultnet

import (
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Kind says what a Fault does.
type Kind uint8

const (
	// CutWrite lets Fault.After more bytes through Write and then closes the
	// connection: the Write that reaches the limit writes only the bytes up
	// to it, closes the underlying connection and returns that count with
	// ErrInjected. After 0 means the next Write writes nothing.
	CutWrite Kind = iota + 1
	// CutRead lets Fault.After more bytes through Read and then closes the
	// connection: Reads return at most the bytes left, and the first Read
	// with none left closes the underlying connection and returns
	// ErrInjected.
	CutRead
	// Reset closes the connection with a TCP reset (SO_LINGER 0) at its next
	// Read or Write, which returns ErrInjected.
	Reset
	// Stall makes the next Read or Write (whichever comes first) wait
	// Fault.Delay before it goes ahead; a deadline that passes meanwhile ends
	// it with os.ErrDeadlineExceeded, and Close with net.ErrClosed.
	Stall
	// CutAfterReady lets the server's bytes through up to the end of the
	// next ReadyForQuery that ends the answer to a data-changing statement
	// (a CommandComplete tagged INSERT, UPDATE, DELETE, MERGE or COPY came
	// since the last ReadyForQuery: not the answer to a Parse and Describe,
	// nor to a SELECT, such as a driver's own position query behind the
	// write) and closes the connection there, as a
	// server or network failing at that moment would: what came behind it
	// is lost, and the next Read returns ErrInjected. (The connection must
	// carry the PostgreSQL protocol from its first byte, as one wrapped in
	// pgconn's AfterNetConnect does.)
	CutAfterReady
	// StallAfterReady holds back the server's bytes behind that same
	// ReadyForQuery for Fault.Delay: Reads return up to the end of it at
	// once, and the next ones wait (deadlines and Close end the wait as
	// for Stall).
	StallAfterReady
)

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case CutWrite:
		return "cut-write"
	case CutRead:
		return "cut-read"
	case Reset:
		return "reset"
	case Stall:
		return "stall"
	case CutAfterReady:
		return "cut-after-ready"
	case StallAfterReady:
		return "stall-after-ready"
	}
	return "kind?"
}

// Fault describes one fault to arm on a Conn.
type Fault struct {
	// Kind is what happens.
	Kind Kind
	// After is, for CutWrite and CutRead, how many bytes (counted from
	// arming, across calls) go through before the cut.
	After int
	// Delay is, for Stall and StallAfterReady, how long the stall lasts.
	Delay time.Duration
}

// ErrInjected is the error a Read or Write returns when a fault cut or reset
// its connection.
var ErrInjected = errors.New("faultnet: injected network fault")

// Conn is a net.Conn wrapped by a Network. It is safe for concurrent use as
// a net.Conn is: one Read and one Write may run at the same time, and Arm,
// Disarm and Reset may be called from any goroutine.
type Conn struct {
	net.Conn
	port uint16
	nw   *Network

	mu        sync.Mutex
	writeLeft int // bytes before a write cut; -1: none armed
	readLeft  int // bytes before a read cut; -1: none armed
	reset     bool
	stall     time.Duration
	rdl, wdl  time.Time     // deadlines as last set
	dlChanged chan struct{} // closed and replaced when a deadline changes
	closed    bool
	closedCh  chan struct{}
	cut       bool // a fault closed the connection

	// The server's message framing, followed across Reads, for the
	// AfterReady kinds.
	frHdr     [5]byte
	frN       int     // header bytes seen of the current message
	frLeft    int     // body bytes still to come of the current message
	frDone    bool    // a data-changing statement's CommandComplete came since the last ReadyForQuery
	frTag     [6]byte // the first bytes of the current CommandComplete's tag
	frTagN    int
	afterCut  bool          // CutAfterReady armed
	afterWait time.Duration // StallAfterReady armed
	heldUntil time.Time     // the next Reads wait until then
	held      []byte        // bytes read behind the ReadyForQuery, not yet returned
}

// Port returns the port the connection was wrapped for (the server's port).
func (c *Conn) Port() uint16 { return c.port }

// Arm arms f on c, replacing a fault of the same kind that has not fired.
func (c *Conn) Arm(f Fault) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch f.Kind {
	case CutWrite:
		c.writeLeft = max(f.After, 0)
	case CutRead:
		c.readLeft = max(f.After, 0)
	case Reset:
		c.reset = true
	case Stall:
		c.stall = f.Delay
	case CutAfterReady:
		c.afterCut = true
	case StallAfterReady:
		c.afterWait = f.Delay
	}
}

// Disarm removes every fault armed on c that has not fired.
func (c *Conn) Disarm() {
	c.mu.Lock()
	c.writeLeft, c.readLeft, c.reset, c.stall = -1, -1, false, 0
	c.afterCut, c.afterWait = false, 0
	c.mu.Unlock()
}

// Armed reports whether any fault is armed on c and has not fired.
func (c *Conn) Armed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writeLeft >= 0 || c.readLeft >= 0 || c.reset || c.stall > 0 || c.afterCut || c.afterWait > 0
}

// Reset closes c at once with a TCP reset (when the underlying connection is
// a *net.TCPConn; otherwise a plain close). Calls in progress fail.
func (c *Conn) Reset() error {
	c.nw.fire(c, Reset)
	return c.abort(true)
}

// abort closes the underlying connection because of a fault.
func (c *Conn) abort(rst bool) error {
	c.mu.Lock()
	c.cut = true
	c.mu.Unlock()
	if rst {
		if tc, ok := c.Conn.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
	}
	return c.Close()
}

// before runs at the start of every Read and Write: a pending reset or stall
// fires here.
func (c *Conn) before(write bool) error {
	c.mu.Lock()
	if c.cut {
		c.mu.Unlock()
		return ErrInjected
	}
	if c.reset {
		c.reset = false
		c.mu.Unlock()
		c.nw.fire(c, Reset)
		c.abort(true)
		return ErrInjected
	}
	d := c.stall
	c.stall = 0
	c.mu.Unlock()
	if d > 0 {
		c.nw.fire(c, Stall)
		return c.sleep(d, write)
	}
	return nil
}

// sleep waits d, or until the read (write) deadline passes or c is closed.
func (c *Conn) sleep(d time.Duration, write bool) error {
	end := time.NewTimer(d)
	defer end.Stop()
	for {
		c.mu.Lock()
		dl := c.rdl
		if write {
			dl = c.wdl
		}
		changed, closed := c.dlChanged, c.closedCh
		c.mu.Unlock()
		var dlc <-chan time.Time
		if !dl.IsZero() {
			left := time.Until(dl)
			if left <= 0 {
				return os.ErrDeadlineExceeded
			}
			t := time.NewTimer(left)
			defer t.Stop()
			dlc = t.C
		}
		select {
		case <-end.C:
			return nil
		case <-dlc:
			return os.ErrDeadlineExceeded
		case <-closed:
			return net.ErrClosed
		case <-changed:
		}
	}
}

// Write implements net.Conn, applying armed faults.
func (c *Conn) Write(p []byte) (int, error) {
	if err := c.before(true); err != nil {
		return 0, err
	}
	c.mu.Lock()
	left := c.writeLeft
	if left < 0 || left > len(p) {
		if left > 0 {
			c.writeLeft -= len(p)
		}
		c.mu.Unlock()
		return c.Conn.Write(p)
	}
	c.writeLeft = -1
	c.mu.Unlock()
	c.nw.fire(c, CutWrite)
	n := 0
	if left > 0 {
		n, _ = c.Conn.Write(p[:left])
	}
	c.abort(false)
	return n, ErrInjected
}

// Read implements net.Conn, applying armed faults.
func (c *Conn) Read(p []byte) (int, error) {
	if err := c.before(false); err != nil {
		return 0, err
	}
	if n, err, done := c.afterReady(p); done {
		return n, err
	}
	c.mu.Lock()
	left := c.readLeft
	if left == 0 {
		c.readLeft = -1
		c.mu.Unlock()
		c.nw.fire(c, CutRead)
		c.abort(false)
		return 0, ErrInjected
	}
	c.mu.Unlock()
	if left > 0 && len(p) > left {
		p = p[:left]
	}
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	if left > 0 && c.readLeft == left { // only if no new fault was armed meanwhile
		c.readLeft -= n
	}
	n, fired := c.frame(p, n)
	c.mu.Unlock()
	if fired != 0 {
		c.nw.fire(c, fired)
	}
	if fired == CutAfterReady {
		c.abort(false)
	}
	return n, err
}

// afterReady serves a Read while an AfterReady fault that fired is still
// in effect: the cut, the wait, the bytes held back. done is false when
// nothing is.
func (c *Conn) afterReady(p []byte) (n int, err error, done bool) {
	c.mu.Lock()
	until := c.heldUntil
	c.mu.Unlock()
	if !until.IsZero() {
		if d := time.Until(until); d > 0 {
			if err := c.sleep(d, false); err != nil {
				return 0, err, true
			}
		}
		c.mu.Lock()
		c.heldUntil = time.Time{}
		c.mu.Unlock()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.held) == 0 {
		return 0, nil, false
	}
	n = copy(p, c.held)
	c.held = c.held[n:]
	return n, nil, true
}

// frame follows the server's message framing over the n bytes just read
// into p and returns how many of them the Read returns (all of them,
// unless an AfterReady fault fires at a ReadyForQuery that ends before the
// last), and the kind that fired, if one did. Call it with c.mu held.
func (c *Conn) frame(p []byte, n int) (int, Kind) {
	for i := 0; i < n; {
		if c.frN < 5 {
			c.frHdr[c.frN] = p[i]
			c.frN++
			i++
			if c.frN < 5 {
				continue
			}
			c.frLeft = max(int(uint32(c.frHdr[1])<<24|uint32(c.frHdr[2])<<16|uint32(c.frHdr[3])<<8|uint32(c.frHdr[4]))-4, 0)
		}
		k := min(c.frLeft, n-i)
		if c.frHdr[0] == 'C' {
			c.frTagN += copy(c.frTag[c.frTagN:], p[i:i+k])
		}
		i += k
		c.frLeft -= k
		if c.frLeft > 0 {
			continue
		}
		c.frN = 0 // the message ends at i
		if c.frHdr[0] == 'C' {
			tag := string(c.frTag[:c.frTagN])
			for _, w := range [...]string{"INSERT", "UPDATE", "DELETE", "MERGE ", "COPY "} {
				if strings.HasPrefix(tag, w) {
					c.frDone = true
				}
			}
			c.frTagN = 0
		}
		if c.frHdr[0] != 'Z' {
			continue
		}
		done := c.frDone
		c.frDone = false
		if !done || !c.afterCut && c.afterWait == 0 {
			continue
		}
		if c.afterCut {
			c.afterCut = false
			return i, CutAfterReady // what came behind it is lost
		}
		c.heldUntil = time.Now().Add(c.afterWait)
		c.afterWait = 0
		c.held = append(c.held[:0], p[i:n]...)
		c.frame(p[i:n], n-i) // (the held bytes' framing; nothing is armed now)
		return i, StallAfterReady
	}
	return n, 0
}

// SetDeadline implements net.Conn; a stall in progress sees the change.
func (c *Conn) SetDeadline(t time.Time) error {
	c.setDeadlines(t, true, true)
	return c.Conn.SetDeadline(t)
}

// SetReadDeadline implements net.Conn; a stall in progress sees the change.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.setDeadlines(t, true, false)
	return c.Conn.SetReadDeadline(t)
}

// SetWriteDeadline implements net.Conn; a stall in progress sees the change.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.setDeadlines(t, false, true)
	return c.Conn.SetWriteDeadline(t)
}

func (c *Conn) setDeadlines(t time.Time, r, w bool) {
	c.mu.Lock()
	if r {
		c.rdl = t
	}
	if w {
		c.wdl = t
	}
	close(c.dlChanged)
	c.dlChanged = make(chan struct{})
	c.mu.Unlock()
}

// SyscallConn returns the underlying connection's raw connection, when it
// has one, so that code looking at the socket (a non-blocking peek) sees
// what a connection cut by a fault shows: a closed descriptor.
func (c *Conn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.New("faultnet: the underlying connection has no raw connection")
	}
	return sc.SyscallConn()
}

// Close implements net.Conn and forgets c in its Network.
func (c *Conn) Close() error {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.closedCh)
	}
	c.mu.Unlock()
	c.nw.forget(c)
	return c.Conn.Close()
}

// Network wraps connections and keeps track of the live ones. The zero value
// is not usable; call New.
type Network struct {
	mu     sync.Mutex
	conns  map[*Conn]struct{}
	byAddr map[string]*Conn
	fired  [StallAfterReady + 1]atomic.Int64

	// OnFire, when set before any connection is wrapped, is called (from
	// the goroutine doing the I/O, or calling Reset) each time a fault
	// fires.
	OnFire func(c *Conn, k Kind)
}

// New returns an empty Network.
func New() *Network {
	return &Network{conns: map[*Conn]struct{}{}, byAddr: map[string]*Conn{}}
}

// Wrap wraps nc, a connection to a server listening on port, and tracks it
// until it is closed. Its signature fits pgryw.SetNetHook.
func (n *Network) Wrap(port uint16, nc net.Conn) net.Conn {
	c := &Conn{Conn: nc, port: port, nw: n, writeLeft: -1, readLeft: -1,
		dlChanged: make(chan struct{}), closedCh: make(chan struct{})}
	n.mu.Lock()
	n.conns[c] = struct{}{}
	if a := nc.LocalAddr(); a != nil {
		n.byAddr[a.String()] = c
	}
	n.mu.Unlock()
	return c
}

func (n *Network) forget(c *Conn) {
	n.mu.Lock()
	delete(n.conns, c)
	if a := c.Conn.LocalAddr(); a != nil && n.byAddr[a.String()] == c {
		delete(n.byAddr, a.String())
	}
	n.mu.Unlock()
}

func (n *Network) fire(c *Conn, k Kind) {
	n.fired[k].Add(1)
	if n.OnFire != nil {
		n.OnFire(c, k)
	}
}

// Lookup returns the live connection whose local address is local (as seen
// through any wrapper above it that reports the same LocalAddr), or nil.
func (n *Network) Lookup(local net.Addr) *Conn {
	if local == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.byAddr[local.String()]
}

// Conns returns the live connections to port, or all of them when port is 0,
// in no particular order.
func (n *Network) Conns(port uint16) []*Conn {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []*Conn
	for c := range n.conns {
		if port == 0 || c.port == port {
			out = append(out, c)
		}
	}
	return out
}

// ArmAll arms f on every live connection to port (0: all) and returns how
// many it armed.
func (n *Network) ArmAll(port uint16, f Fault) int {
	cs := n.Conns(port)
	for _, c := range cs {
		c.Arm(f)
	}
	return len(cs)
}

// DisarmAll disarms every live connection.
func (n *Network) DisarmAll() {
	for _, c := range n.Conns(0) {
		c.Disarm()
	}
}

// Fired returns how many faults of kind k have fired so far.
func (n *Network) Fired(k Kind) int64 {
	if k == 0 || k > StallAfterReady {
		return 0
	}
	return n.fired[k].Load()
}
