package pgryw

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgryw/pgryw/internal/ctxsleep"
	"github.com/pgryw/pgryw/internal/lsn"
	"github.com/pgryw/pgryw/internal/wire"
)

// One attempt of a replica read on one replica: the statement sent with
// its check in front (pipelined) and its replay poll behind, its answer
// used or discarded, and what the poll says the read saw.

// attempt is one read on one replica: its answer, until used or discarded.
type attempt struct {
	ctx   context.Context
	cn    *Conn
	b     *backend
	op    *stmtOp
	trail bool            // a replay poll rides behind the read
	post  *wire.Injection // that poll, once armed
	ran   bool
	err   error
	// unset: the replica refused the connection's settings, which rode in
	// front of the read; its answer must not be used.
	unset bool
	// known: the read went without a check, the monitor having seen the
	// replica get there while it waited (waiting.try).
	known bool
}

func (a *attempt) read() {
	if a.cn.poll.b == a.b {
		a.cn.settlePoll(a.ctx) // its slot is about to be reused
	}
	var set *wire.Injection
	if a.b.applied.version != a.cn.sess.set.version {
		set = a.cn.armSettings(a.b)
	}
	if w := a.b.wire; w != nil {
		if a.trail && a.cn.c.cfg.ReadYourWrites && a.cn.c.trailPolls() && !a.b.peer.TxPooled {
			a.post = a.b.injectPrepared(&a.b.post, stmtPoll, sqlPoll)
			w.AppendAfterExec(a.post)
		}
	}
	peek := a.op.kind == opPgxBatch && a.b.wire != nil
	if peek {
		a.b.wire.Watch()
	}
	a.err = a.op.run(a.b)
	a.ran = true
	if w := a.b.wire; w != nil {
		w.Disarm()
	}
	if peek {
		a.err = a.peek()
	}
	if set != nil && a.op.lazy() {
		a.cn.await(a.ctx, a.b, set) // nothing of the answer was read yet
	}
	a.unset = set != nil && a.cn.settledSettings(a.b, set)
}

// peekLimit bounds what a replica batch's answer may hold for peek to read
// it whole before the caller does.
const peekLimit = 1 << 20

// peek reads a batch's whole answer from the replica before the caller
// reads any of it (pgx reads a batch's results when asked), and returns
// its first error: a replica that refuses a statement as a standby (an
// unlogged table, say), or fails (a recovery conflict), is then passed
// over as for a single read, before any result reached the caller; any
// other error reaches the caller from the results, as pgx gives it. An
// answer too large to hold is left as it is.
func (a *attempt) peek() error {
	w := a.b.wire
	code, complete, err := w.Peek(a.ctx, peekLimit)
	w.Unwatch()
	switch {
	case err != nil && a.ctx.Err() == nil:
		a.b.close() // the socket failed: another replica
		return err
	case err != nil:
		return err
	case complete && code != "":
		return &pgconn.PgError{Severity: "ERROR", Code: code}
	}
	return nil
}

// drop discards the answer, whatever it was. A discarded read may leave a
// statement description in pgx's cache taken while the replica was behind
// (say, before the session's own ALTER TABLE … ADD COLUMN); its next
// execution then fails with "cached plan must not change result type"
// before running, and onReplica reads again.
func (a *attempt) drop() {
	a.op.discard()
	if a.post != nil {
		a.cn.await(a.ctx, a.b, a.post) // its slot is about to be reused
		a.post = nil
	}
	a.err, a.ran = nil, false
}

// finish settles a read that was served: it reads the replay position that
// rode behind it and raises the connection's floor to it. Without one, the
// floor is marked lost and the next replica read captures a primary position
// first. The poll's answer comes after the read's own ReadyForQuery: when it
// is not in yet, the read returns without it, and the connection's next
// replica read, which is the first to need the floor, settles it
// (settlePoll).
func (a *attempt) finish() {
	inj := a.post
	a.post = nil
	a.cn.finishRead(a.ctx, a.b, inj, a.trail)
}

// finishRead is attempt.finish, by value: a read whose rows are still open
// calls it when they are closed, after its attempt is gone.
func (cn *Conn) finishRead(ctx context.Context, b *backend, inj *wire.Injection, trail bool) {
	if inj == nil {
		switch {
		case !trail || !cn.c.cfg.ReadYourWrites:
		case !cn.c.trailPolls() && !b.peer.TxPooled:
			cn.unbounded = b
		case b.wire != nil:
			cn.markLost(ctx, false)
		}
		return
	}
	cn.unbounded = nil
	if inj.Sent() && !inj.Done() && !b.closed() && cn.poll.b == nil {
		b.wire.Disarm()
		cn.poll = pendingPoll{b: b, inj: inj}
		return
	}
	cn.applyPoll(ctx, b, inj)
}

// trailPolls reports whether a replay poll rides behind each replica read to
// bound what it saw. With one replica it does not: a connection's replica
// reads all run on the same server connection to that replica, whose replay
// position never goes backwards, so the read is its own bound
// (Conn.unbounded), and the primary has everything a standby of it replayed.
// Only a read on another server connection (the replica was reconnected,
// perhaps restarted, which can take it back to an earlier consistent point)
// needs the floor; it then reads a fresh primary position first (onReplica).
func (c *Connector) trailPolls() bool { return len(c.topo.replicas) > 1 }

// pendingPoll is a read's trailing replay poll whose answer had not arrived
// when the read returned.
type pendingPoll struct {
	b   *backend
	inj *wire.Injection
}

// settlePoll applies the connection's pending replay poll, waiting for its
// answer within ctx: before the connection's next replica read, which needs
// the floor and would reuse the poll's slot.
func (cn *Conn) settlePoll(ctx context.Context) {
	if p := cn.poll; p.b != nil {
		cn.poll = pendingPoll{}
		cn.applyPoll(ctx, p.b, p.inj)
	}
}

// applyPoll reads a trailing replay poll's answer and raises the
// connection's floor to it, or marks the floor lost.
func (cn *Conn) applyPoll(ctx context.Context, b *backend, inj *wire.Injection) {
	if !cn.await(ctx, b, inj) || inj.Err() != nil {
		if err := inj.Err(); err != nil {
			b.injectionFailed(stmtPoll, err)
			if isRefusal(err) {
				b.node.record(eventRefused)
			}
		}
		cn.markLost(ctx, false)
		return
	}
	row, null := inj.Row()
	l, known, inRecovery, err := parsePoll(row, null)
	if err != nil || !known || !inRecovery {
		// Promoted while reading: the read may have seen writes of the new
		// history; only a primary position bounds it.
		if err == nil && !inRecovery {
			b.node.record(eventPromoted)
		}
		cn.markLost(ctx, false)
		return
	}
	cn.c.topo.observe(b.node, b.peer.Instance, l, time.Now().UnixNano())
	cn.sess.wm.Advance(l)
}

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
	if w.pooled && (a.b.noChain || w.method == WaitPolar || a.op.begins()) {
		return waitUnchecked, nil
	}
	first := 0
	if w.farBehind(*wm) {
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
	for i := first; ; i++ {
		res, err := w.try(ctx, a, wm, i)
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
	inj := c.armCheck(b, w.method, *wm, max(time.Until(w.deadline), time.Millisecond))
	notices := b.wire.Notices()
	a.read()
	if a.op.lazy() && inj.Sent() {
		w.cn.await(ctx, b, inj) // a batch's results are read by the caller, later
	}
	if w.partial {
		w.partial = false
		l, err := w.cn.watermark(ctx) // settles the capture first
		if err != nil {
			return waitTimeout, fmt.Errorf("%w: %w", errPositionLost, err)
		}
		*wm = l
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
