package pgryw

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgryw/pgryw/internal/ctxsleep"
	"github.com/pgryw/pgryw/internal/lsn"
)

// The pipelined wait: a read sent with its check in front, and, while a
// polled replica is merely behind, tried again within the budget, or left
// to the monitor's poll loop for its replica (waitList, monitor.go).

// pipelined sends the read with its check in one flush and, while a polled
// replica is merely behind, tries again within the budget: with the check
// for the first few tries (so the answer costs no extra round trip when the
// replica gets there), then polling alone and reading once it is there. With
// WAIT FOR or PolarDB's wait the server does the waiting, so one try says
// it all.
//
// A read waits on the replica only with one of max_waits' places: taken
// before a server-side wait is sent, or before polling starts. Without one
// it gets a check that does not wait (a replay position poll riding in
// front of it, whatever the server), and waitBusy if that finds the
// replica behind.
//
// With partial (polling only), the connection's own capture behind its last
// write was still on its way when the read began, and *wm does not count
// it: the poll needs no position, *wm is made whole once the read's answer
// is in, and the poll's answer is compared with that. A replica found
// behind is then waited for as usual.
func (cn *Conn) pipelined(ctx context.Context, a *attempt, wm *lsn.LSN, partial bool) (waitResult, error) {
	w := cn.startWait(ctx, a.b, partial)
	defer w.leave()
	// Behind a transaction pooler the check must run in the read's own
	// implicit transaction, chained in front of its extended-protocol
	// execution: a transaction of its own could reach another server
	// connection, and after a repoint another server, than the read.
	// Where it cannot (a simple-protocol read, PolarDB's SETs), the read
	// is not checked on the replica at all.
	// (pgx sends a transaction's BEGIN as a simple Query, always.)
	if w.pooled && (a.b.noChain || w.method == WaitPolar || a.op.begins() || w.method == WaitPoll && a.b.snapshotHeld(cn.sess.set.version)) {
		// The read moves on: not with a watermark still partial.
		if err := w.whole(ctx, wm); err != nil {
			return waitTimeout, err
		}
		return waitUnchecked, nil
	}
	first := 0
	far := w.farBehind(*wm)
	if far {
		// Only checkRead's first try may go with the watermark partial.
		if err := w.whole(ctx, wm); err != nil {
			return waitTimeout, err
		}
		// The lag history says the replica is not there yet, by more than
		// a read would take: a read sent now would be wasted. Wait first.
		// Without a max_waits place or a budget left, the read still gets
		// its check that does not wait, below.
		res, again, err := w.pause(ctx, *wm, 0)
		switch {
		case err != nil || !again && res != waitBusy && res != waitTimeout:
			return res, err
		case again:
			first = 1
		}
	}
	var paced pacing
	if !far {
		paced = w.paceFirst(ctx, *wm)
	}
	for i := first; ; i++ {
		res, err := w.try(ctx, a, wm, i)
		if i == first {
			paced.learn(res, err)
		}
		if err != nil || res != waitBehind {
			return res, err
		}
		a.drop()
		if res, again, err := w.pause(ctx, *wm, i); !again {
			return res, err
		}
	}
}

// try is the wait's try i: the read with its check in front for the first
// pipelinedAttempts (or wherever the server waits, or the check must share
// the read's transaction), a poll alone after, and the read alone once the
// monitor saw the replica get there (waitList).
func (w *waiting) try(ctx context.Context, a *attempt, wm *lsn.LSN, i int) (waitResult, error) {
	switch {
	case i > 0 && !w.serverWaits && a.b.node.knownReplayOn(a.b) >= *wm:
		a.read()
		a.known = true
		return waitOK, nil
	case i < pipelinedAttempts || w.serverWaits || w.pooled:
		return w.checkRead(ctx, a, wm)
	}
	return w.pollRead(ctx, a, *wm)
}

// waiting is one pipelined wait on one replica: its method, its budget's
// end, and its place among max_waits.
type waiting struct {
	cn          *Conn
	b           *backend
	method      WaitMethod
	serverWaits bool // WAIT FOR or PolarDB's wait: the server does the waiting
	pooled      bool // behind a transaction pooler
	held, over  bool // a max_waits place is held; none was free
	partial     bool // the connection's own capture is still on its way
	start       time.Time
	deadline    time.Time
}

// startWait begins a wait on b: a server-side wait takes a max_waits place
// first, and without one the read gets a poll that does not wait.
func (cn *Conn) startWait(ctx context.Context, b *backend, partial bool) waiting {
	budget := cn.c.budget(ctx)
	w := waiting{cn: cn, b: b, method: cn.c.methodFor(b), pooled: b.peer.TxPooled, partial: partial}
	w.serverWaits = w.method != WaitPoll
	if w.serverWaits {
		w.held = cn.c.enterWait(b.node)
		w.over = !w.held
		if w.over {
			w.method, w.serverWaits = WaitPoll, false
		}
	}
	w.start = time.Now()
	w.deadline = w.start.Add(budget)
	return w
}

// whole makes *wm the whole watermark where it was partial (the
// connection's own capture was on its way when the read began): it settles
// that capture first. Anything that trusts *wm beyond the check riding
// with the read's first try needs it whole.
func (w *waiting) whole(ctx context.Context, wm *lsn.LSN) error {
	if !w.partial {
		return nil
	}
	w.partial = false
	l, err := w.cn.watermark(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", errPositionLost, err)
	}
	*wm = l
	return nil
}

// leave gives back the max_waits place, if held.
func (w *waiting) leave() {
	if w.held {
		w.cn.c.leaveWait(w.b.node)
	}
}

// checkRead sends the read with its check in front, in one flush, and says
// what the check found; waitBehind means the read's answer was not used.
func (w *waiting) checkRead(ctx context.Context, a *attempt, wm *lsn.LSN) (waitResult, error) {
	c, b := w.cn.c, w.b
	chain := !a.op.begins() && !b.snapshotHeld(w.cn.sess.set.version)
	inj := c.armCheck(b, w.method, *wm, max(time.Until(w.deadline), time.Millisecond), chain)
	notices := b.wire.Notices()
	a.read()
	if a.op.lazy() && inj.Sent() {
		w.cn.await(ctx, b, inj) // a batch's results are read by the caller, later
	}
	if err := w.whole(ctx, wm); err != nil {
		return waitTimeout, err
	}
	if w.pooled && !inj.Sent() {
		// A read in the simple protocol: the connection's reads are
		// (default_query_exec_mode=simple_protocol).
		a.drop()
		b.noChain = b.noChain || inj.Refused()
		return waitUnchecked, nil
	}
	if a.unset {
		return waitOK, nil
	}
	res, err := c.checked(b, w.method, inj, *wm)
	if err == nil && res == waitRecheck {
		a.drop()
		b.holdSnapshot(w.cn.sess.set.version)
		if w.pooled {
			return waitUnchecked, nil
		}
		return w.checkRead(ctx, a, wm) // now with a Sync of its own
	}
	if err == nil && res == waitOK && w.method == WaitPolar {
		res = c.polarOutcome(b, a, *wm, notices)
	}
	if err == nil && inj.Err() != nil {
		a.drop() // the server skipped the read behind the check
	}
	return res, err
}

// pollRead polls alone, and sends the read once the replica is there.
func (w *waiting) pollRead(ctx context.Context, a *attempt, wm lsn.LSN) (waitResult, error) {
	res, err := w.cn.c.pollOnce(ctx, w.b, wm)
	if err == nil && res == waitOK {
		a.read()
	}
	return res, err
}

// pause waits before try i+1, within the budget and with a max_waits
// place; again is false when the wait is over, with its result.
func (w *waiting) pause(ctx context.Context, wm lsn.LSN, i int) (res waitResult, again bool, err error) {
	cn := w.cn
	left := time.Until(w.deadline)
	if !w.held && !w.over && left > 0 {
		w.held = cn.c.enterWait(w.b.node)
		w.over = !w.held
	}
	switch {
	case w.over:
		return waitBusy, false, nil
	case left <= 0:
		cn.c.stats.waitTimeouts.Add(1)
		return waitTimeout, false, nil
	}
	if i == 0 {
		cn.c.stats.waits.Add(1)
		cn.obs.waited = true
	}
	n := w.b.node
	d := min(cn.c.pollDelay(n, wm, i), left)
	if (d >= followAfter || time.Since(w.start) >= lagSteady) && n.usable(time.Now().UnixNano()) {
		// Long enough for the monitor's poll loop to do the polling, for
		// every read waiting on n at once. (Not on a node out of reads:
		// the monitor does not probe it, and would wake the read at once.)
		if followed, err := n.waiting.await(ctx, wm, left); err != nil {
			return waitTimeout, false, err
		} else if followed {
			return 0, true, nil
		}
	}
	if err := ctxsleep.Sleep(ctx, d); err != nil {
		return waitTimeout, false, err
	}
	return 0, true, nil
}

// followAfter is the shortest pause a read leaves to the monitor's poll
// loop (waitList) rather than polling on its own connection, as it does
// once it has waited lagSteady: before, its retries are on a replica about
// to get there, where a poll of its own (or the read riding with its
// check) saves the round trip and hand-offs a wake adds.
const followAfter = time.Millisecond

// farBehind reports that a polled replica is expected, by its measured
// lag, to replay wm later than lagSteady from now: the read waits before
// it is sent.
func (w *waiting) farBehind(wm lsn.LSN) bool {
	if w.serverWaits || w.partial || wm == 0 {
		return false
	}
	eta, ok := w.cn.c.topo.eta(w.b.node, wm)
	return ok && time.Duration(eta-time.Now().UnixNano()) > lagSteady
}

// checkedRead is pipelined, timed: a read sent with a catch-up check. A
// read that had to wait (a WAIT FOR or PolarDB wait, or polling after a
// failed check) counts as a wait of its node, and its duration goes into
// the node's histogram and the statement's ServedBy.Wait.
func (cn *Conn) checkedRead(ctx context.Context, a *attempt, wm *lsn.LSN, partial bool) (waitResult, error) {
	cn.obs.waited = false
	start := time.Now()
	res, err := cn.pipelined(ctx, a, wm, partial)
	c, n := cn.c, a.b.node
	if res == waitTimeout && err == nil {
		n.obs.waitTimeouts.Add(1)
	}
	if !cn.obs.waited && c.methodFor(a.b) == WaitPoll {
		return res, err
	}
	d := time.Since(start)
	cn.obs.wait += d
	n.obs.waits.Add(1)
	n.obs.observeWait(d)
	if c.debug() {
		c.logAt(slog.LevelDebug, "pgryw: waited for replica", slog.String("node", n.addr),
			slog.Duration("wait", d), slog.String("outcome", waitOutcome(res, err)))
	}
	return res, err
}

func waitOutcome(res waitResult, err error) string {
	switch {
	case err != nil:
		return "failed"
	case res == waitOK:
		return "caught up"
	case res == waitNotStandby:
		return "not a standby"
	case res == waitCannot || res == waitUnchecked:
		return "could not wait"
	}
	return "timed out"
}
