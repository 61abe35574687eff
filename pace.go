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
// back at once) reached a replica that is 0 ms behind before the write's
// WAL had been replayed there in 26–47% of reads in rywbench's loop: the
// read rides with its check, the check finds the replica behind, and the
// read's execution is thrown away, then sent again. Each such read costs
// the replica a read more. The replay of a write's WAL takes a few hundred
// microseconds on a local cluster, a delay that varies little from one
// write to the next, so each replica learns how long after a write its
// first check should go (node.firstDelay): a first check that finds the
// replica behind raises the delay, one sent on time that finds it there
// lowers it, by steps that make about one first check in paceMissOdds+1
// find it behind (unless the delay is held at paceMax).
//
// The delay counts from when the write's answer was in (the capture's
// answer still on its way: pendingCapture.at), or else from when the
// primary was first seen at the watermark; a read sent later than that
// does not wait at all. The pause is never longer than the delay, and is
// taken only with one of max_waits' places (given back after it), so at
// most that many reads pause on a replica at once; the first of them
// sleeps on its thread (precise on an idle process), the others on the
// runtime's timers (see ctxsleep.Timer). Not paced: a read whose server
// waits (WAIT FOR), a replica with a steady lag (lagSteady: the lag history
// and the poll loop wait for it), a read whose pause would take half the
// budget or half the time to the caller's deadline.

const (
	// paceMissOdds: first checks that find the replica there per one that
	// finds it behind, where the delay settles.
	paceMissOdds = 3
	// paceStep: a first check that finds the replica there lowers the
	// delay by 1/paceStep of it (of paceFloor, below that); one that finds
	// it behind raises it by paceMissOdds times as much.
	paceStep = 32
	// paceFloor is the delay the steps are taken from while it is shorter.
	paceFloor = 20 * time.Microsecond
	// paceMax bounds the delay: a replica further behind is waited for by
	// its lag history (farBehind) and the poll loop, not by pacing. (The
	// same millisecond from which pauses are the poll loop's.)
	paceMax = followAfter
)

// pacing is a read's first check as paced: sent at `at` after its base,
// with the delay d in force; paced: pacing applied to it at all; waited:
// it paused.
type pacing struct {
	n      *node
	at, d  int64
	paced  bool
	waited bool
}

// paceFirst pauses, before a read's first check, until the replica's
// learned delay after the write behind the watermark has passed (see
// above).
func (w *waiting) paceFirst(ctx context.Context, wm lsn.LSN) pacing {
	if w.serverWaits || wm == 0 && !w.partial {
		return pacing{}
	}
	n := w.b.node
	now := time.Now().UnixNano()
	if fresh(n.lagAt.Load(), now) && n.lag.Load() >= int64(lagSteady) {
		return pacing{}
	}
	base, ok := w.base(wm)
	if !ok {
		return pacing{}
	}
	d := n.firstDelay.Load()
	// (Never more than d: the clock may have stepped back since base.)
	wait := time.Duration(min(base+d-now, d))
	if wait <= 0 {
		return pacing{n: n, at: now - base, d: d, paced: true}
	}
	if wait*2 > time.Until(w.deadline) {
		return pacing{}
	}
	if dl, ok := ctx.Deadline(); ok && wait*2 > time.Until(dl) {
		return pacing{} // the caller's deadline is near: the read goes now
	}
	if !w.held {
		if !w.cn.c.takeWait(n) {
			return pacing{} // max_waits reads pause here already: go now
		}
		defer w.cn.c.leaveWait(n)
	}
	sleep := ctxsleep.Sleep
	if n.pacing.Add(1) > 1 {
		sleep = ctxsleep.Timer
	}
	err := sleep(ctx, wait)
	n.pacing.Add(-1)
	if err != nil {
		return pacing{} // the try reports the context's end
	}
	return pacing{n: n, at: time.Now().UnixNano() - base, d: d, paced: true, waited: true}
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
// replica's delay, there lowers it, if the check went on time. A read that
// paused went as soon as pacing let it, however late its sleep woke; one
// that did not pause is on time for a check that finds the replica there
// only within paceFloor of the delay (a read sent well after it says
// nothing of it), and for one that finds it behind only within paceMax of
// its write (a replica behind by more is the lag history's to follow).
func (p pacing) learn(res waitResult, err error) {
	if !p.paced || err != nil {
		return
	}
	switch res {
	case waitBehind:
		if p.waited || p.at <= int64(paceMax) {
			p.n.paceStep(true)
		}
	case waitOK:
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
