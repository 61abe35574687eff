package pgryw

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
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

// hopelessLimit names the bound that made pick give up on n: max_replica_lag
// when n is not known to be within it, else "" (its measured lag is too
// long for the budget).
func (c *Connector) hopelessLimit(n *node) string {
	if c.topo.lag.on && !c.topo.lag.allows(n, time.Now().UnixNano()) {
		return "max_replica_lag=" + c.cfg.MaxReplicaLag.String()
	}
	return ""
}

// enterWait takes one of max_waits' places on replica n for a read about to
// make it wait, and reports false (counted) when they are all taken.
func (c *Connector) enterWait(n *node) bool {
	w := &n.waits
	for {
		cur := w.Load()
		if c.over.maxWaits > 0 && cur >= c.over.maxWaits {
			c.stats.waitsRefused.Add(1)
			c.logAt(slog.LevelDebug, "pgryw: read does not wait on a replica: max_waits reached",
				slog.String("replica", n.addr), slog.Int64("max_waits", c.over.maxWaits))
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

// lagBound is max_replica_lag as pick applies it. A replica is allowed when
// it is known to be within the bound:
//
//   - in bytes: the primary's latest sampled position, sampled within
//     lagFresh, minus the replica's last known replay position. The
//     replica's position only rises, so this is an upper bound of its
//     distance at the sample's time.
//   - in time: now minus when the primary was last sampled at or below the
//     replica's last known replay position (taken before that sample was
//     sent). The replica has everything the primary had then, so this is
//     an upper bound of its staleness now, and it grows by itself while
//     nothing new is learnt.
//
// Unknown (no sample yet, no replay position, the sample too old, the
// position older than the ring) is not allowed.
type lagBound struct {
	on      bool
	bytes   uint64
	dur     int64 // ns
	samples primarySamples
	skips   atomic.Int64 // replicas passed over
}

func (l *lagBound) init(b ReplicaLag) {
	l.on = !b.IsZero()
	l.bytes, l.dur = b.Bytes, int64(b.Duration)
	// Keep entries at least dur/64 apart, so the ring spans twice the
	// bound: a replica within the bound always finds its entry, at most
	// 1/64 of the bound older than the truth.
	l.samples.spacing = l.dur / 64
}

// allows reports whether n is known to be within the bound at now.
func (l *lagBound) allows(n *node, now int64) bool {
	p := n.knownReplay()
	if p == 0 {
		return false
	}
	if l.bytes > 0 {
		latest, at, ok := l.samples.latest()
		return ok && now-at <= lagFresh && (latest <= p || uint64(latest-p) <= l.bytes)
	}
	at, ok := l.samples.atOrBelow(p)
	return ok && now-at <= l.dur
}

// primarySamples is a ring of the primary's WAL positions (adjusted as
// captures are, see lsn.ReplayTarget), each with the time just before the
// query that read it was sent: the primary was at or below the position
// then.
type primarySamples struct {
	mu      sync.Mutex
	lsn     [sampleRing]lsn.LSN
	at      [sampleRing]int64
	n, head int
	spacing int64 // least time between two entries but the newest
}

const sampleRing = 128

// add records that the primary was at or below l at time at. The newest
// entry always holds the latest sample; older ones are kept spacing apart.
// A position below the newest means a new primary history: the ring starts
// over.
func (s *primarySamples) add(l lsn.LSN, at int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n > 0 {
		last := (s.head + s.n - 1) % sampleRing
		switch {
		case l < s.lsn[last]:
			s.n, s.head = 0, 0
		case l == s.lsn[last]:
			s.at[last] = at // the primary was still there: a later time bounds more
			return
		case s.n >= 2 && at-s.at[(s.head+s.n-2)%sampleRing] < s.spacing:
			s.lsn[last], s.at[last] = l, at
			return
		}
	}
	i := (s.head + s.n) % sampleRing
	if s.n < sampleRing {
		s.n++
	} else {
		s.head = (s.head + 1) % sampleRing
	}
	s.lsn[i], s.at[i] = l, at
}

// latest returns the newest sample.
func (s *primarySamples) latest() (lsn.LSN, int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 {
		return 0, 0, false
	}
	i := (s.head + s.n - 1) % sampleRing
	return s.lsn[i], s.at[i], true
}

// atOrBelow returns the time of the newest sample at or below p.
func (s *primarySamples) atOrBelow(p lsn.LSN) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lo, hi := 0, s.n // find the first entry above p
	for lo < hi {
		mid := (lo + hi) / 2
		if s.lsn[(s.head+mid)%sampleRing] > p {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	if lo == 0 {
		return 0, false
	}
	return s.at[(s.head+lo-1)%sampleRing], true
}

// sampleInterval is how often the sampler reads the primary's position.
// With the monitor reading each replica's every monitorInterval, a caught-up
// replica is known to be within about sampleInterval+monitorInterval.
const sampleInterval = 50 * time.Millisecond

// startSampler starts the primary sampler when max_replica_lag is set, and
// returns a function that waits for it to stop once ctx is done.
func (c *Connector) startSampler(ctx context.Context) (wait func()) {
	if !c.topo.lag.on {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var b *backend
		defer func() {
			if b != nil {
				b.close()
			}
		}()
		t := time.NewTicker(sampleInterval)
		defer t.Stop()
		for {
			b = c.samplePrimary(ctx, b)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { <-done }
}

// samplePrimary reads the primary's position once on b (connecting first
// when needed) and returns the connection to keep for next time.
func (c *Connector) samplePrimary(ctx context.Context, b *backend) *backend {
	ctx, cancel := context.WithTimeout(ctx, monitorTimeout)
	defer cancel()
	if b == nil || b.closed() {
		dc, err := c.dial(ctx, c.topo.primary)
		if err != nil {
			return nil
		}
		b = newBackend(dc, c.topo.primary)
	}
	sent := time.Now().UnixNano()
	l, err := capture(ctx, b)
	if err != nil {
		b.close()
		return nil
	}
	if c.sawPrimary(l) { // not an answer from a writer that has been replaced
		c.topo.lag.samples.add(l.lsn, sent)
	}
	return b
}
