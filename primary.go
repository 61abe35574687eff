package pgryw

import (
	"context"
	"database/sql/driver"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pgryw/pgryw/internal/sqlclass"
	"github.com/pgryw/pgryw/internal/wire"
)

// checkPrimary looks, before a statement on the primary connection,
// whether the server has ended it while it sat idle: a non-blocking look
// at its socket (backend.gone), made once per hand-out, before the first
// statement on the primary, and whenever the connection has carried
// nothing for idleLook (backend.touch). A connection is ended while
// idle in the pool when the writer died or was shut down, as in a
// failover, or the session was terminated; and while its Conn is in use,
// too, for the server sees only its own connection: a Conn whose reads
// all go to replicas leaves its primary connection idle, and the server's
// idle_session_timeout (or a restart meanwhile) ends it although the
// caller never was. A read routed to a replica does not look: it sends
// nothing on the primary, and the look, a system call, was a quarter of
// what such a read cost pgryw beyond pgx.
//
// An ended connection is replaced, before anything is sent on it, by a new
// one to the writer there is now, and the statement runs there, with no
// error. Ended in the pool (at a hand-out), whatever session state the
// ended session held is gone with it, as it would be with the new
// connection database/sql would otherwise take. Ended while the Conn is in
// use, the session's settings are restored on the new one
// (replacePrimary), and prepared statements run by their text; a session
// holding state that cannot be restored (an advisory lock, LISTEN, a
// temporary table, PREPARE, a cursor WITH HOLD, state not read back) is
// not replaced: its reads ran on the primary, so the connection sat as
// idle as the caller did, and the statement gets the server's error, as
// it would with pgx.
//
// If the new connection cannot be made, the statement gets
// driver.ErrBadConn: nothing was sent, and database/sql runs it again on
// another connection (within a sql.Conn it cannot: the caller gets the
// error, as with any dead connection).
func (cn *Conn) checkPrimary(ctx context.Context) error {
	b := cn.primary
	handOut := cn.checkDue
	cn.checkDue = false
	if wasIdle := b.touch(); !(handOut || wasIdle) || !b.gone() {
		return nil
	}
	switch {
	case handOut:
		return cn.replacePrimary(ctx, false)
	case cn.restorable():
		return cn.replacePrimary(ctx, true)
	}
	return nil
}

// restorable reports whether the primary connection's session holds
// nothing that a new connection would lack once given the session's
// settings: no state that pins (but a setting a standby refuses, which is
// a setting), no transaction block, no statement under way.
func (cn *Conn) restorable() bool {
	b := cn.primary
	return cn.pins&^pinSettings == 0 && b.idle() && !b.pg.IsBusy() && cn.open.ctx == nil
}

// replacePrimary closes the primary connection, ended by its server, and
// opens a new one to the writer. With keep, the session's settings are
// given to the new session, which then carries what the caller set (the
// same statement as replica connections are given them with, its names
// and values bind parameters); without, they are forgotten. The
// watermark is the Conn's and stays; a capture whose answer was due on the
// old connection is marked lost, and the next read that needs it reads a
// position afresh. If the new connection cannot be made or will not take
// the settings, the caller gets driver.ErrBadConn: nothing of its
// statement was sent.
func (cn *Conn) replacePrimary(ctx context.Context, keep bool) error {
	if cn.pending != nil {
		cn.pending.abandon()
		cn.pending = nil
	}
	cn.primary.close()
	dc, err := cn.c.dial(ctx, cn.c.topo.primary, forConn)
	if err != nil {
		cn.lostErr = err
		return driver.ErrBadConn
	}
	b := newBackend(dc, cn.c.topo.primary)
	cn.primary = b
	cn.resetPending, cn.blockWrote = false, false
	set := &cn.sess.set
	if !keep {
		// The ended session's state went with it.
		cn.dropSessionState(0, "primary connection replaced")
		return nil
	}
	cn.c.logAt(slog.LevelInfo, "pgryw: the primary connection of a connection in use was ended by its server; replaced, with the session's settings",
		slog.Int("settings", len(set.names)))
	if len(set.names) == 0 {
		return nil
	}
	res := b.pg.ExecParams(ctx, sqlApplySettings, [][]byte{textArray(set.names, nil), textArray(set.values, nil)}, nil, nil, nil).Read()
	if res.Err != nil {
		b.close()
		cn.lostErr = res.Err
		return driver.ErrBadConn
	}
	return nil
}

// probeFastPath makes sure, once per node (and again when it failed and its
// time off is over), that a fast-path FunctionCall gets through to the
// primary and back, before captures riding behind the application's
// statements take it (backend.injectCapture): something in between (a
// pooler, a proxy) might refuse the message, or drop the connection at it.
// The probe is pgryw's own round trip (SELECT 1 with the call behind it),
// made on a connection that has read the function's OID in its first
// capture, as database/sql hands it out again: if the connection breaks,
// it is reported bad and database/sql takes another; nothing of the
// application's was on it.
func (cn *Conn) probeFastPath(ctx context.Context) error {
	b := cn.primary
	n := b.node
	if !cn.fastPathUnknown() {
		return nil
	}
	if err := cn.checkPrimary(ctx); err != nil || cn.primary != b {
		return err // replaced: the new connection has not read the OID yet
	}
	if !n.fastState.CompareAndSwap(fastUnknown, fastProbing) {
		return nil
	}
	inj := injectFastCapture(&b.probe, b.captureFn.Load())
	b.wire.AppendAfterExec(inj)
	_, _, err := b.control(ctx, "SELECT 1")
	answered := err == nil && cn.await(ctx, b, inj)
	b.wire.Disarm()
	if answered && fastAnswer(inj) {
		n.fastState.Store(fastOK)
		return nil
	}
	if !answered && ctx.Err() != nil {
		n.fastState.Store(fastUnknown) // the caller's context ended: no verdict
	} else {
		n.fastPathOff()
	}
	if b.closed() || !answered {
		b.close()
		return driver.ErrBadConn
	}
	return nil
}

// fastPathUnknown reports that the primary connection can probe its node's
// fast path now: nobody has, the node's fast path is on, and the
// connection is idle with its capture function known and nothing pending.
func (cn *Conn) fastPathUnknown() bool {
	b := cn.primary
	n := b.node
	switch {
	case b.wire == nil || b.peer.TxPooled || cn.pending != nil || !b.idle():
		return false
	case b.captureFn.Load() == 0 || n.fastState.Load() != fastUnknown:
		return false
	}
	return n.fastPathOn()
}

// fastAnswer reports that a fast-path capture answered with a position.
func fastAnswer(inj *wire.Injection) bool {
	if inj.Err() != nil {
		return false
	}
	row, null := inj.Row()
	if len(row) != 1 || null[0] {
		return false
	}
	_, err := parseInsertLSN(row[0])
	return err == nil
}

// runPrimary runs op on the primary, with what rides along (reset_session's
// reset in front, the capture and the read-back of session state behind)
// and what follows (watermarks, pins, reporting). done is not nil when
// op's answer is still open (rows, batch results) and the statement's
// outcome matters: an autocommit INSERT … RETURNING commits only when its
// result is complete, and the capture riding behind it is answered after
// that. The caller calls done with the answer's error once it is closed;
// a fallback read keeps its max_fallback place until then.
func (cn *Conn) runPrimary(ctx context.Context, cls sqlclass.Result, p *plan, op *stmtOp) (done func(error), err error) {
	if err := cn.checkPrimary(ctx); err != nil {
		return nil, err
	}
	ws := cn.beforePrimary(ctx, &cls)
	var start time.Time
	if p.read {
		start = time.Now() // a read's round trip: the fallback reserve's measure
	}
	err = op.run(cn.primary)
	if p.read && err == nil {
		cn.primary.node.sawRoundTrip(time.Since(start))
	}
	switch {
	case cn.staleRead(&cls, &ws, err):
		cn.afterPrimary(ctx, &ws, err)
		ws = cn.beforePrimary(ctx, &cls)
		op.st = nil
		err = op.run(cn.primary)
	case cn.endedUnrun(&ws, err):
		// The server ended the session for idleness as the statement
		// went out (its timer fired before checkPrimary's look, or under
		// TLS, where the look cannot see it): nothing of it ran, nor did
		// what rode with it, so there is nothing to settle. It goes
		// again, once, on a new connection with the session's settings.
		if err := cn.replacePrimary(ctx, true); err != nil {
			cn.releaseFallback()
			return nil, err
		}
		ws = cn.beforePrimary(ctx, &cls)
		op.discard()
		op.st = nil
		err = op.run(cn.primary)
	}
	if op.open() {
		cn.servedPrimary(ctx, &cls, p)
		if err == nil && (ws.inj != nil || ws.commits || cn.fallbackHeld) {
			return cn.settleLater(ctx, ws), nil
		}
		cn.afterPrimary(ctx, &ws, err)
	} else {
		cn.afterPrimary(ctx, &ws, err)
		cn.servedPrimary(ctx, &cls, p)
	}
	cn.releaseFallback()
	if !op.native() && cn.lostRead(ctx, &cls, &ws, err) {
		return nil, driver.ErrBadConn
	}
	return nil, err
}

// settleLater is runPrimary's done: ws is a copy, so that only a statement
// whose answer stays open puts one on the heap.
func (cn *Conn) settleLater(ctx context.Context, ws primaryStmt) func(error) {
	cn.open = openStmt{ctx: ctx, commits: ws.commits}
	return func(err error) {
		cn.open = openStmt{}
		cn.afterPrimary(ctx, &ws, err)
		cn.releaseFallback()
	}
}

// openStmt is a statement on the primary whose answer is still open (its
// rows), until it is settled: the connection given back to a pool before
// (its rows left open) marks its position lost, for its Session too.
type openStmt struct {
	ctx     context.Context
	commits bool
}

// staleRead reports that a read run on the primary outside a transaction
// block failed because pgx's cached description of it predates a schema
// change ("cached plan must not change result type"). Nothing ran, pgx has
// dropped the description, and a read is safe to send again: pgryw does,
// once, where plain pgx would fail the statement once.
func (cn *Conn) staleRead(cls *sqlclass.Result, ws *primaryStmt, err error) bool {
	return err != nil && ws.idleBefore && cn.primary.idle() && cn.c.readOnly(cls) && isStaleDescription(err)
}

// endedUnrun reports that a statement run on the primary outside a
// transaction block failed because the server had ended the session for
// idleness (idle_session_timeout) before running any of it
// (wire.Conn.EndedIdle), on a session whose state a new connection can be
// given (restorable): it may be sent again there, write or read. The
// server's timer can fire just as the statement goes out, whatever the
// look in front of it saw.
func (cn *Conn) endedUnrun(ws *primaryStmt, err error) bool {
	if err == nil || !ws.idleBefore || cn.pins&^pinSettings != 0 || cn.open.ctx != nil || !cn.primary.closed() {
		return false
	}
	ended, unrun := cn.primary.endedIdle()
	return ended && unrun
}

// lostRead reports that a read run on the primary outside a transaction
// block failed because the connection did (it broke, or the server ended
// the session: a shutdown, a crash, a failover), before any row reached the
// caller (pgx reads the first row before returning). A read is safe to run
// again: returned as driver.ErrBadConn, database/sql runs it on another
// connection, within the caller's context, which reaches whichever writer
// (or replica) there is now. Not on a connection pinned by session state,
// which the next connection would not have.
func (cn *Conn) lostRead(ctx context.Context, cls *sqlclass.Result, ws *primaryStmt, err error) bool {
	if err == nil || !ws.idleBefore || cn.pins != 0 || cls.Pin || ctx.Err() != nil || !cn.primary.closed() || !cn.c.readOnly(cls) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return connFault(pgErr)
	}
	return true
}

// primaryStmt is one statement run on the primary outside a database/sql
// transaction, from before it is sent until its outcome is known.
type primaryStmt struct {
	cls        sqlclass.Result // a copy: a pointer to the caller's would put it on the heap
	idleBefore bool
	commits    bool            // it may commit a write (read_your_writes on)
	reset      *wire.Injection // reset_session's reset in front of it, when armed
	inj        *wire.Injection // the ride-along capture, when armed
	seen       lostSeen        // lost counts before it was sent
	later      bool            // a possible commit sent with no capture: its position is read when wanted (captureLater)
	state      *wire.Injection // the ride-along read-back of session state, when armed
	readBack   bool            // session state must be read back after it
}

// endsIdle reports whether the primary connection is sure to be outside any
// transaction block once the statement has run, whatever its outcome: an
// autocommit statement (one or several, without transaction control) sent
// outside a block, or a plain COMMIT or ROLLBACK.
func endsIdle(cls *sqlclass.Result, idleBefore bool) bool {
	if cls.Mixed || cls.Chain {
		return false
	}
	switch cls.Tx {
	case sqlclass.TxNone:
		return idleBefore
	case sqlclass.TxCommit, sqlclass.TxRollback:
		return true
	}
	return false
}

// beforePrimary prepares a statement about to run on the primary: it arms the
// ride-along capture where one may run.
func (cn *Conn) beforePrimary(ctx context.Context, cls *sqlclass.Result) primaryStmt {
	return cn.beforePrimaryCommits(ctx, cls, cn.commits(cls))
}

func (cn *Conn) beforePrimaryCommits(ctx context.Context, cls *sqlclass.Result, commits bool) primaryStmt {
	w := cn.primary
	ws := primaryStmt{cls: *cls, idleBefore: w.idle()}
	if cls.State&sqlclass.StateDeallocate != 0 {
		w.forgetPrepared()
	}
	ws.reset = cn.armReset()
	if cn.c.cfg.ResetSession && !cn.opaqueCall && (cls.Reason == "CALL" || cls.Reason == "DO" || cn.c.callsVolatile(cls)) {
		cn.opaqueCall = true
	}
	if cn.c.cfg.ReadYourWrites {
		ws.commits = commits
		ws.seen = cn.lostSeen(ctx)
		ws.later = commits && cn.captureLater()
		if !ws.later && w.wire != nil && endsIdle(cls, ws.idleBefore) && !w.peer.TxPooled {
			// (Behind a transaction pooler the statement's ReadyForQuery
			// may hand its server connection to another client: the
			// position is read with a round trip of its own, afterPrimary.)
			slot := &w.post
			if p := cn.pending; p != nil && p.inj == &w.post.inj {
				slot = &w.post2 // the pending capture's answer is still to come
			}
			ws.inj = w.injectCapture(slot)
			w.wire.AppendAfterExec(ws.inj)
			cn.owed = false // this capture covers the write that went without
		}
	}
	ws.state, ws.readBack = cn.armReadBack(cls, ws.idleBefore)
	return ws
}

// commits reports whether a statement about to run on the primary, outside
// any database/sql transaction, may commit a write: an autocommit statement
// that may write (a multi-statement string with its own BEGIN and COMMIT
// included), or a COMMIT ending a transaction block in which such a
// statement ran. A read-only block's COMMIT moves nothing.
func (cn *Conn) commits(cls *sqlclass.Result) bool {
	if cls.Tx == sqlclass.TxCommit && !cls.Write {
		return cn.blockWrote
	}
	return cn.c.mayWrite(cls)
}

// afterPrimary updates the connection once a statement has run on the primary
// (err is its outcome): takes in the session state it left (state.go),
// tracks Exec'd transaction blocks, and moves the watermarks.
func (cn *Conn) afterPrimary(ctx context.Context, ws *primaryStmt, err error) {
	w := cn.primary
	cn.settlePending(context.Background(), false) // the last statement's capture came before this one's answer: no wait
	if ws.reset != nil && ws.inj == nil && ws.state == nil {
		w.wire.Disarm()
	}
	cn.settleReset(ctx, ws.reset)
	closed := w.closed()
	inBlock := !closed && !w.idle()
	wrote := cn.blockEffects(ws, err, inBlock)
	if wrote {
		cn.lastWrite = cn.c.uses.Load() + 1
	}
	if cn.c.cfg.ReadYourWrites && cn.deferCapture(ctx, ws, err, wrote) {
		cn.settleReadBack(ctx, ws, err)
		return
	}
	pos, havePos := cn.settleCapture(ctx, w, ws.inj)
	cn.settleReadBack(ctx, ws, err)
	if cn.c.cfg.ReadYourWrites {
		cn.settled(ctx, ws, pos, havePos, wrote)
	}
}

// settled moves the watermarks after a statement on the primary: by its
// position (wrote: it may have committed a write), or, without one, by a
// capture of its own or by marking the position lost.
func (cn *Conn) settled(ctx context.Context, ws *primaryStmt, pos primaryPos, havePos, wrote bool) {
	w := cn.primary
	closed := w.closed()
	inBlock := !closed && !w.idle()
	switch {
	case havePos && wrote:
		cn.advance(ctx, pos, ws.seen)
	case havePos:
		cn.raiseConn(pos, ws.seen)
	case wrote && ws.later:
		// Sent without a capture (captureLater): the next read that needs
		// the position reads one, which covers this and every write that
		// returned before it; this connection's own sends it ahead of its
		// check (captureOwed).
		cn.markLost(ctx, true)
		cn.owed = !closed && !inBlock
	case wrote && !closed && !inBlock && ctx.Err() == nil:
		// No ride-along (a multi-statement string with transaction
		// control): read the position with a round trip of its own.
		cn.captureNow(ctx)
	case wrote:
		cn.markLost(ctx, true)
	case w.wire != nil && (closed || !inBlock):
		// A statement that read on the primary without a position (its
		// answer was lost, or the caller's context ended first and the
		// connection was closed): the connection's next replica read must
		// not see less, so it captures first.
		cn.markLost(ctx, false)
	}
}

// blockEffects tracks Exec'd transaction blocks through a statement that
// has run on the primary (err is its outcome; inBlock: a block is open
// now), and reports whether a write may have committed, so that its
// position must be covered.
func (cn *Conn) blockEffects(ws *primaryStmt, err error, inBlock bool) bool {
	cls := &ws.cls
	var wrote bool
	switch {
	case cls.Mixed:
		// Whatever the outcome, a COMMIT inside the string may have run.
		wrote = ws.commits
		cn.blockWrote = inBlock && ws.commits
	case err != nil:
		// A failed autocommit statement or COMMIT may still have committed
		// (the connection broke after the server did, or a command commits
		// part-way, such as CREATE INDEX CONCURRENTLY); where its position
		// rode along, covering it costs nothing. A failed statement inside
		// a block committed nothing: the block is aborted. A block open
		// before a broken connection is gone (inBlock is false then).
		wrote = ws.commits && (ws.idleBefore && cls.Tx == sqlclass.TxNone || cls.Tx == sqlclass.TxCommit)
		if !inBlock {
			cn.blockWrote = false
		}
	case cls.Tx == sqlclass.TxCommit:
		// COMMIT AND CHAIN commits and opens a new block at once.
		wrote = ws.commits
		cn.blockWrote = false
	case cls.Tx == sqlclass.TxRollback:
		cn.blockWrote = false
	case cls.Tx == sqlclass.TxBegin:
		if ws.idleBefore {
			cn.blockWrote = false
		}
	case inBlock:
		// Inside a block opened by an Exec'd BEGIN: remember whether it
		// wrote, for its COMMIT.
		if ws.commits {
			cn.blockWrote = true
		}
	default:
		wrote = ws.commits
	}
	return wrote
}

// RunOnPrimary runs f with the primary connection's *pgx.Conn, for what
// database/sql cannot express (CopyFrom, SendBatch, pgx's own types). Reach
// it through sql.Conn.Raw:
//
//	err := conn.Raw(func(dc any) error {
//		return dc.(*pgryw.Conn).RunOnPrimary(ctx, func(pc *pgx.Conn) error {
//			_, err := pc.CopyFrom(ctx, pgx.Identifier{"t"}, cols, rows)
//			return err
//		})
//	})
//
// Whatever f did counts as a possible write, whether f succeeded or not:
// afterwards the primary's position is read (one round trip) and advances the
// watermarks; inside a database/sql transaction its COMMIT does that. f
// must not end a transaction that pgryw opened. Session state f changes
// (SET, LISTEN, ...) is not tracked: run such statements through
// database/sql, or pin reads with WithPrimary.
func (cn *Conn) RunOnPrimary(ctx context.Context, f func(*pgx.Conn) error) error {
	if err := cn.settlePending(ctx, true); err != nil {
		return err
	}
	if err := cn.checkPrimary(ctx); err != nil {
		return err
	}
	sc, ok := cn.primary.conn.(*stdlib.Conn)
	if !ok {
		return errors.New("pgryw: RunOnPrimary needs a pgx connection")
	}
	if cn.resetPending && cn.primary.idle() {
		cn.resetPending = false
		if _, _, err := cn.primary.control(ctx, sqlReset+"; SELECT 1"); err != nil {
			return err
		}
	}
	err := f(sc.Conn())
	if cn.c.plain || !cn.c.cfg.ReadYourWrites {
		return err
	}
	w := cn.primary
	switch {
	case cn.tx != nil && !cn.tx.onReplica:
		cn.tx.wrote = true
	case w.closed():
		cn.markLost(ctx, true)
	case !w.idle():
		// f opened a block (or left one open): its COMMIT captures.
		cn.blockWrote = true
	default:
		cn.captureNow(ctx)
	}
	return err
}
