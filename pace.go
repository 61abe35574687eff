package pgryw

import (
	"context"
	"time"

	"github.com/pgryw/pgryw/internal/ctxsleep"
	"github.com/pgryw/pgryw/internal/lsn"
)

// Pacing a read's first check on a polled replica.
//
// A read sent right behind a write (the user's loop: insert, then read it
// back at once) reaches a replica that is 0 ms behind before the write's
// WAL has been replayed there about half the time: the read rides with its
// check, the check finds the replica behind, and the read's execution is
// thrown away, then sent again. Each such read costs the replica a read
// more. The replay of a write's WAL takes a few hundred microseconds here,
// a delay that varies little from one write to the next on a given
// cluster, so each replica learns how long after a write its first check
// should go (node.firstDelay): a first check that finds the replica behind
// raises the delay, one sent on time that finds it there lowers it, by
// steps that make about one first check in paceMissOdds+1 find it behind.
// The delay counts from when the write's answer was in (the capture's
// answer still on its way: pendingCapture.at), or else from when the
// primary was first seen at the watermark; a read sent later than that
// does not wait at all. It never exceeds paceMax, and is not used where
// the server waits (WAIT FOR), where one check says it all.

const (
	// paceMissOdds: first checks that find the replica there per one that
	// finds it behind, where the delay settles.
	paceMissOdds = 3
	// paceStep is the delay's step, as a share of the delay (and of
	// paceFloor below it): 1/paceStep for a miss's step up … times
	// paceMissOdds.
	paceStep = 32
	// paceFloor is the delay the steps are taken from while it is shorter.
	paceFloor = 20 * time.Microsecond
	// paceMax bounds the delay: a replica further behind is waited for by
	// its lag history (farBehind) and the poll loop, not by pacing.
	paceMax = followAfter
)

// pacing is a read's first check as paced: sent at `at` after its base,
// with the delay d in force (ok: paced at all).
type pacing struct {
	n      *node
	at, d  int64
	paced  bool
	waited bool
}

// paceFirst waits, before a read's first check, until the replica's
// learned delay after the watermark's write has passed, where it has not
// yet: not where that would take half the budget or half the time to the
// caller's deadline. The pause is not counted as a wait (Stats.Waits, the
// node's wait histogram): the read has not been found behind.
func (w *waiting) paceFirst(ctx context.Context, wm lsn.LSN) pacing {
	if w.serverWaits || wm == 0 {
		return pacing{}
	}
	base, ok := w.base(wm)
	if !ok {
		return pacing{}
	}
	n := w.b.node
	d := n.firstDelay.Load()
	now := time.Now().UnixNano()
	var waited bool
	if wait := time.Duration(base + d - now); wait > 0 {
		if wait*2 > time.Until(w.deadline) {
			return pacing{}
		}
		if dl, ok := ctx.Deadline(); ok && wait*2 > time.Until(dl) {
			return pacing{} // the caller's deadline is near: the read goes now
		}
		if ctxsleep.Sleep(ctx, wait) != nil {
			return pacing{} // the try reports the context's end
		}
		now, waited = time.Now().UnixNano(), true
	}
	return pacing{n: n, at: now - base, d: d, paced: true, waited: waited}
}

// base is when the write behind wm was known to be done: the connection's
// own, still partial, when its answer was in; else when the primary was
// first seen at wm.
func (w *waiting) base(wm lsn.LSN) (int64, bool) {
	if w.partial {
		if p := w.cn.pending; p != nil && p.at != 0 {
			return p.at, true
		}
		return 0, false
	}
	return w.cn.c.topo.hist.firstAfter(wm, false)
}

// learn takes in what the paced first check found: behind raises the
// replica's delay, there lowers it, if the check went on time (a read sent
// well after its delay that finds the replica there says nothing of it).
func (p pacing) learn(res waitResult, err error) {
	if !p.paced || err != nil {
		return
	}
	switch res {
	case waitBehind:
		p.n.paceStep(true)
	case waitOK:
		// After a sleep the check goes later than the delay by however
		// late the sleep woke: still on time, since it went as soon as
		// pacing let it.
		if p.waited || p.at <= p.d+int64(paceFloor) {
			p.n.paceStep(false)
		}
	}
}

// paceStep moves n's first-check delay up a step (behind) or down one.
func (n *node) paceStep(behind bool) {
	for {
		d := n.firstDelay.Load()
		step := max(d, int64(paceFloor)) / paceStep
		next := max(d-step, 0)
		if behind {
			next = min(d+step*paceMissOdds, int64(paceMax))
		}
		if next == d || n.firstDelay.CompareAndSwap(d, next) {
			return
		}
	}
}
