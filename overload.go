package pgryw

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/pgryw/pgryw/internal/lsn"
)

// Overload bounds: what keeps a lag event from becoming an outage.
//
// When the replicas fall behind, three things pile up, and one DSN key
// bounds each:
//
//   - reads parked on a replica, waiting for it to replay their watermark,
//     each holding a replica connection and a pool connection for up to
//     the budget: max_waits, per replica;
//   - reads sent to the primary instead (on_timeout=primary), on top of the
//     writes it must keep serving: max_fallback, per connector, beyond which
//     on_max_fallback decides;
//   - for reads that need no watermark, rows from a replica any distance
//     behind: max_replica_lag passes over replicas not known to be within
//     it.
//
// The first two count and refuse with atomics and a channel, never holding
// a lock while a statement runs; the third reads a small ring of primary
// positions, fed by a sampler goroutine that runs only when the bound is
// set.

// overload holds one connector's bounds and their state.
type overload struct {
	fallback fallbackGate
	maxWaits int64
	waitPeak atomic.Int64 // the most reads waiting on any one replica at once
}

// initOverload sets up c's bounds from its configuration.
func (c *Connector) initOverload() {
	cfg := c.cfg
	c.over.fallback.init(cfg.MaxFallback)
	c.over.maxWaits = int64(cfg.MaxWaits)
	c.topo.lag.init(cfg.MaxReplicaLag)
}

// fallbackGate bounds concurrent fallback reads on the primary: a slot is a
// token in slots (nil: no bound). inUse and peak count with or without a
// bound, for Stats.
type fallbackGate struct {
	slots chan struct{}
	limit int
	inUse atomic.Int64
	peak  atomic.Int64
}

func (g *fallbackGate) init(limit int) {
	g.limit = limit
	if limit > 0 {
		g.slots = make(chan struct{}, limit)
	}
}

// try takes a slot if one is free.
func (g *fallbackGate) try() bool {
	if g.slots != nil {
		select {
		case g.slots <- struct{}{}:
		default:
			return false
		}
	}
	g.enter()
	return true
}

// wait takes a slot, waiting at most d and while ctx lives.
func (g *fallbackGate) wait(ctx context.Context, d time.Duration) bool {
	if g.try() {
		return true
	}
	if d <= 0 {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case g.slots <- struct{}{}:
		g.enter()
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}

func (g *fallbackGate) enter() { raisePeak(&g.peak, g.inUse.Add(1)) }

// release gives a slot back. inUse drops first, so that peak never counts a
// slot twice.
func (g *fallbackGate) release() {
	g.inUse.Add(-1)
	if g.slots != nil {
		<-g.slots
	}
}

// raisePeak raises peak to n if n is higher.
func raisePeak(peak *atomic.Int64, n int64) {
	for {
		p := peak.Load()
		if n <= p || peak.CompareAndSwap(p, n) {
			return
		}
	}
}

// fallback is on_timeout=primary for a read whose replica n is behind wm:
// it takes a max_fallback slot and returns errUsePrimary (the caller runs
// the read on the primary; the Conn holds the slot until the read is done,
// see releaseFallback). Over the bound on_max_fallback decides: wait for a
// slot within the read's budget, fail with a *ReplicaBehindError, or serve
// the replica's rows (nil).
func (cn *Conn) fallback(ctx context.Context, n *node, wm lsn.LSN) error {
	c := cn.c
	g := &c.over.fallback
	if g.try() {
		cn.fallbackHeld = true
		return errUsePrimary
	}
	var waited time.Duration
	if c.cfg.OnMaxFallback == FallbackWait {
		c.stats.fallbackWaits.Add(1)
		start := time.Now()
		if g.wait(ctx, c.budget(ctx)) {
			cn.fallbackHeld = true
			return errUsePrimary
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		waited = time.Since(start).Round(time.Millisecond)
	}
	c.stats.fallbacksRefused.Add(1)
	c.logAt(slog.LevelDebug, "pgryw: read kept off the primary: max_fallback reached",
		slog.String("replica", n.addr), slog.Int("max_fallback", g.limit),
		slog.String("on_max_fallback", c.cfg.OnMaxFallback.String()), slog.Duration("waited", waited))
	if c.cfg.OnMaxFallback == FallbackStale {
		c.stats.staleReads.Add(1)
		return nil
	}
	c.stats.behindErrors.Add(1)
	return behindError(n, wm, waited, fmt.Sprintf("max_fallback=%d", g.limit))
}

// releaseFallback gives back the max_fallback slot this connection holds,
// if any: called once the read that took it is done on the primary (its
// rows closed, or its transaction ended).
func (cn *Conn) releaseFallback() {
	if cn.fallbackHeld {
		cn.fallbackHeld = false
		cn.c.over.fallback.release()
	}
}

// behindError is the error for a read that gives up on replica n.
func behindError(n *node, wm lsn.LSN, waited time.Duration, limit string) *ReplicaBehindError {
	replayed := "unknown"
	if r := n.knownReplay(); r > 0 {
		replayed = r.String()
	}
	return &ReplicaBehindError{Replica: n.addr, Watermark: wm.String(), Replayed: replayed, Waited: waited, Limit: limit}
}

// enterWait takes one of max_waits' places on replica n for a read about to
// make it wait, and reports false (counted) when they are all taken.
func (c *Connector) enterWait(n *node) bool {
	if c.takeWait(n) {
		return true
	}
	c.stats.waitsRefused.Add(1)
	c.logAt(slog.LevelDebug, "pgryw: read does not wait on a replica: max_waits reached",
		slog.String("replica", n.addr), slog.Int64("max_waits", c.over.maxWaits))
	return false
}

// takeWait is enterWait without counting or logging a refusal: for a
// pause a read can go without (pace.go).
func (c *Connector) takeWait(n *node) bool {
	w := &n.waits
	for {
		cur := w.Load()
		if c.over.maxWaits > 0 && cur >= c.over.maxWaits {
			return false
		}
		if w.CompareAndSwap(cur, cur+1) {
			raisePeak(&c.over.waitPeak, cur+1)
			return true
		}
	}
}

// leaveWait gives back a place taken by enterWait.
func (c *Connector) leaveWait(n *node) { n.waits.Add(-1) }

const sampleRing = 128

// sampleInterval is how often the sampler reads the primary's position.
// With the monitor reading each replica's every monitorInterval, a caught-up
// replica is known to be within about sampleInterval+monitorInterval.
const sampleInterval = 50 * time.Millisecond

// behind decides what a read does when replica n did not (or, by its
// measured lag, will not) replay wm in time, or an overload bound (limit, as
// in ReplicaBehindError) rules it out: errUsePrimary (on_timeout=primary,
// within max_fallback), a *ReplicaBehindError (on_timeout=error), or nil to
// serve the replica's rows anyway (on_timeout=stale).
func (cn *Conn) behind(ctx context.Context, n *node, wm lsn.LSN, limit string) error {
	cn.skip(n, FallbackBehind)
	switch cn.c.cfg.OnTimeout {
	case OnTimeoutError:
		cn.c.stats.behindErrors.Add(1)
		waited := cn.c.cfg.WaitTimeout
		if limit != "" {
			waited = 0
		}
		return behindError(n, wm, waited, limit)
	case OnTimeoutStale:
		cn.c.stats.staleReads.Add(1)
		return nil
	}
	return cn.fallback(ctx, n, wm)
}
