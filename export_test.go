package pgryw

import (
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgryw/pgryw/internal/lsn"
)

// Hooks for the external integration tests.

// SetNetHook wraps every server connection c opens from now on, under
// pgryw's wire layer, with f(port, conn).
func SetNetHook(c *Connector, f func(port uint16, nc net.Conn) net.Conn) {
	c.netHook = func(pc *pgconn.Config, nc net.Conn) net.Conn { return f(pc.Port, nc) }
}

// StopMonitor keeps c's background monitor from starting.
func StopMonitor(c *Connector) { c.mon.closed = true }

// Observe tells c that replica i has replayed pos, as the monitor would.
func Observe(c *Connector, i int, pos string) {
	l, err := lsn.Parse(pos)
	if err != nil {
		panic(err)
	}
	now := time.Now().UnixNano()
	c.topo.observe(c.topo.replicas[i], 0, l, now, now)
}

// PoolWatermark returns c's pool-wide watermark (session_scope=db).
func PoolWatermark(c *Connector) string { return c.db.wm.Load().String() }

// WaitForChecks counts the catch-up checks c sent as WAIT FOR LSN.
func WaitForChecks(c *Connector) int64 { return c.stats.waitFors.Load() }

// HoldFallbacks takes n of c's max_fallback slots, as n fallback reads
// running on the primary would, until release is called.
func HoldFallbacks(c *Connector, n int) (release func()) {
	for i := 0; i < n; i++ {
		if !c.over.fallback.try() {
			panic("HoldFallbacks: no slot free")
		}
	}
	return func() {
		for i := 0; i < n; i++ {
			c.over.fallback.release()
		}
	}
}

// FallbacksInUse returns how many of c's max_fallback slots are taken.
func FallbacksInUse(c *Connector) int64 { return c.over.fallback.inUse.Load() }

// HoldWaits takes n of max_waits' places on c's replica i, as n reads
// waiting on it would, until release is called.
func HoldWaits(c *Connector, i, n int) (release func()) {
	c.topo.replicas[i].waits.Add(int64(n))
	return func() { c.topo.replicas[i].waits.Add(-int64(n)) }
}

// PrimaryAddr returns the local address of cn's primary connection (nil
// when it has no wire layer).
func PrimaryAddr(cn *Conn) net.Addr {
	if cn.primary == nil || cn.primary.wire == nil {
		return nil
	}
	return cn.primary.wire.LocalAddr()
}

// PoolConnPrimaryAddr is PrimaryAddr of a Pool's connection.
func PoolConnPrimaryAddr(c *PoolConn) net.Addr { return PrimaryAddr(c.cn()) }

// SQLCapture is the capture sent with a round trip of its own.
const SQLCapture = sqlCapture

// SetNoChain marks cn's replica connections behind a transaction pooler
// as taking no chained check (as after a simple-protocol read), and
// returns how many it marked.
func SetNoChain(cn *Conn) (n int) {
	for _, b := range cn.replicas {
		if b != nil && b.peer.TxPooled {
			b.noChain = true
			n++
		}
	}
	return n
}

// CloseIdleReplicaConns closes the replica connections c's Conns gave back
// and no Conn holds, as if they had broken: the next read dials anew.
func CloseIdleReplicaConns(c *Connector) {
	for _, n := range c.topo.replicas {
		n.idle.drain()
	}
}

// IdleReplicaConns is how many replica connections of replica i no Conn of
// c's holds.
func IdleReplicaConns(c *Connector, i int) int { return c.topo.replicas[i].idle.size() }

// FirstDelay returns replica i's learned delay before a read's first
// check (pace.go).
func FirstDelay(c *Connector, i int) time.Duration {
	return time.Duration(c.topo.replicas[i].firstDelay.Load())
}

// SetFirstDelay sets replica i's delay before a read's first check.
func SetFirstDelay(c *Connector, i int, d time.Duration) {
	c.topo.replicas[i].firstDelay.Store(int64(d))
}

// HoldPositionHistory locks c's history of primary positions (the lag
// estimates'), so that the next goroutine recording a primary position
// there (applying a capture's answer: sawPrimary) stops at it until
// release is called.
func HoldPositionHistory(c *Connector) (release func()) {
	c.topo.hist.mu.Lock()
	return c.topo.hist.mu.Unlock
}
