package pgryw

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pgryw/pgryw/internal/lsn"
	"github.com/pgryw/pgryw/internal/sqlclass"
	"github.com/pgryw/pgryw/internal/wire"
)

// Write capture and watermarks: what running a statement on the primary does
// to the session's position.
//
// The rule: every statement that leaves the primary connection outside a
// transaction block carries, riding behind it in the same flush, a read of
// pg_current_wal_insert_lsn(). If the statement may have committed a write
// (it succeeded, or it failed in a way that may have come after a commit),
// the position advances the connection's and the pool's watermarks;
// otherwise it raises the connection's alone, as an upper bound of what the
// statement saw (monotonic reads). Nothing rides along where it would run
// inside a transaction block: there it would take the block's snapshot or
// break a SET TRANSACTION that follows. When a possible commit's position
// cannot be read (the connection broke, the caller's context ended, the
// block is still open), the position is marked lost and the next replica
// read captures one first.

// primaryStmt is one statement run on the primary outside a database/sql
// transaction, from before it is sent until its outcome is known.
type primaryStmt struct {
	cls        sqlclass.Result // a copy: a pointer to the caller's would put it on the heap
	idleBefore bool
	commits    bool            // it may commit a write (read_your_writes on)
	reset      *wire.Injection // reset_session's reset in front of it, when armed
	inj        *wire.Injection // the ride-along capture, when armed
	seen       lostSeen        // lost counts before it was sent
	state      *wire.Injection // the ride-along read-back of session state, when armed
	readBack   bool            // session state must be read back after it
}

// lostSeen holds the sessions' lost counts read before a capture was sent:
// the connection's, the pool's and the context's Session's.
type lostSeen struct{ conn, db, ctx uint64 }

func (cn *Conn) lostSeen(ctx context.Context) lostSeen {
	s := lostSeen{conn: cn.sess.lost.Load()}
	if cn.c.cfg.SessionScope == ScopeDB {
		s.db = cn.c.db.lost.Load()
	}
	if cs := SessionFrom(ctx); cs != nil {
		s.ctx = cs.lost.Load()
	}
	return s
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
		if w.wire != nil && endsIdle(cls, ws.idleBefore) && !w.peer.TxPooled {
			// (Behind a transaction pooler the statement's ReadyForQuery
			// may hand its server connection to another client: the
			// position is read with a round trip of its own, afterPrimary.)
			slot := &w.post
			if p := cn.pending; p != nil && p.inj == &w.post.inj {
				slot = &w.post2 // the pending capture's answer is still to come
			}
			ws.inj = w.injectCapture(slot)
			w.wire.AppendAfterExec(ws.inj)
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

// settleCapture reads the answer to a ride-along capture, within the
// caller's context. If the answer cannot be read the connection is out of
// step with the server and is closed (database/sql then discards it).
func (cn *Conn) settleCapture(ctx context.Context, b *backend, inj *wire.Injection) (primaryPos, bool) {
	if inj == nil {
		return primaryPos{}, false
	}
	b.wire.Disarm()
	if !cn.await(ctx, b, inj) {
		return primaryPos{}, false
	}
	p, ok, err := cn.c.captured(b, inj)
	if err != nil {
		b.injectionFailed(b.slotName(inj), err)
	}
	return p, ok
}

// captured reads the answer to a capture that has arrived and counts it:
// the position, or the server's error for it (nil when the answer just did
// not parse).
func (c *Connector) captured(b *backend, inj *wire.Injection) (primaryPos, bool, error) {
	if err := inj.Err(); err != nil {
		c.stats.captureFailures.Add(1)
		b.captureAnswered(inj, true)
		return primaryPos{}, false, err
	}
	b.captureAnswered(inj, false)
	row, null := inj.Row()
	if len(row) == 0 || null[0] {
		return primaryPos{}, false, nil
	}
	p, err := b.parseCapture(row)
	if err != nil {
		return primaryPos{}, false, nil
	}
	c.stats.captures.Add(1)
	return p, true, nil
}

// await waits, within ctx, for the rest of a ride-along statement's answer
// and reports whether it arrived. An answer that cannot be read leaves the
// connection out of step with the server, so it is closed.
func (cn *Conn) await(ctx context.Context, b *backend, inj *wire.Injection) bool {
	if !inj.Sent() || b.closed() {
		return false
	}
	if inj.Done() {
		return true
	}
	if err := b.wire.Await(ctx, inj); err != nil {
		if ctx.Err() == nil {
			b.captureUnanswered(inj)
		}
		b.close()
		return false
	}
	return inj.Done()
}

// captureNow reads the primary's position after a commit with a round trip of
// its own, within the caller's context, and advances the watermarks. If it
// cannot, the position is marked lost.
func (cn *Conn) captureNow(ctx context.Context) {
	seen := cn.lostSeen(ctx)
	p, err := capture(ctx, cn.primary)
	if err != nil {
		cn.c.stats.captureFailures.Add(1)
		cn.markLost(ctx, true)
		return
	}
	cn.c.stats.captures.Add(1)
	cn.advance(ctx, p, seen)
}

// markLost records a position that could not be read: a possible commit's
// (on this connection and, with session_scope=db, on the pool), or only
// this connection's read floor.
func (cn *Conn) markLost(ctx context.Context, commit bool) {
	cn.markLostFor(SessionFrom(ctx), commit)
}

// markLostFor is markLost for the statement's Session cs (nil: none).
func (cn *Conn) markLostFor(cs *Session, commit bool) {
	cn.sess.markLost()
	if commit && cn.c.cfg.SessionScope == ScopeDB {
		cn.c.db.markLost()
	}
	if commit && cs != nil {
		cs.by.Store(cn.c)
		cs.markLost()
	}
}

// freshPosition reads the primary's position on a connection of its own:
// for a Session's token, when a commit's position was lost (it covers
// every commit that returned before it). One runs at a time per
// connector, and a position read after a call began serves it: a burst of
// tokens during a stall costs one connection at a time, not one each.
func (c *Connector) freshPosition(ctx context.Context) (generation, lsn.LSN, error) {
	start := time.Now()
	select {
	case c.fresh.turn <- struct{}{}:
	case <-ctx.Done():
		return generation{}, 0, ctx.Err()
	}
	defer func() { <-c.fresh.turn }()
	if c.fresh.sent.After(start) {
		return c.fresh.gen, c.fresh.lsn, nil
	}
	dc, err := c.dial(ctx, c.topo.primary)
	if err != nil {
		return generation{}, 0, err
	}
	b := newBackend(dc, c.topo.primary)
	defer b.close()
	sent := time.Now()
	p, err := capture(ctx, b)
	if err != nil {
		c.stats.captureFailures.Add(1)
		return generation{}, 0, err
	}
	c.stats.captures.Add(1)
	gen := c.genAt(ctx, b, p.tli)
	c.fresh.sent, c.fresh.gen, c.fresh.lsn = sent, gen, p.lsn
	return gen, p.lsn, nil
}

// freshState is freshPosition's: turn admits one at a time and guards the
// rest, the last position it read and when it was sent.
type freshState struct {
	turn chan struct{}
	sent time.Time
	gen  generation
	lsn  lsn.LSN
}

// advance raises the watermarks this connection answers to after a possible
// commit, records the primary's position for lag estimates, and marks the
// losses seen before the capture was sent as covered. A position read on a
// writer that has since been replaced raises this connection's watermark
// alone (see sawPrimary).
func (cn *Conn) advance(ctx context.Context, p primaryPos, seen lostSeen) bool {
	if cs := SessionFrom(ctx); cs != nil {
		cn.c.generationOf(ctx, cn.primary) // read once per connector, on this idle connection
		return cn.advanceFor(cs, p, seen)
	}
	return cn.advanceFor(nil, p, seen)
}

// advanceFor is advance for the statement's Session cs (nil: none), once
// the primary's system identifier is known (or known to be unreadable): it
// sends nothing, so it may run on another connection's goroutine.
func (cn *Conn) advanceFor(cs *Session, p primaryPos, seen lostSeen) bool {
	if !cn.raiseConn(p, seen) {
		return false
	}
	if cn.c.cfg.SessionScope == ScopeDB {
		cn.c.db.wm.Advance(p.lsn)
		cn.c.db.cover(seen.db)
	}
	if cs != nil {
		cs.advanceAt(cn.c.genAt(context.Background(), cn.primary, p.tli), p.lsn)
		cs.cover(seen.ctx)
	}
	return true
}

// raiseConn raises this connection's watermark alone to a primary position
// read after a statement that committed nothing, and reports whether the
// position is of the current writer's history.
func (cn *Conn) raiseConn(p primaryPos, seen lostSeen) bool {
	current := cn.c.sawPrimary(p)
	cn.sess.wm.Advance(p.lsn)
	cn.sess.cover(seen.conn)
	return current
}

// watermark returns the position a replica read must see: this
// connection's, with session_scope=db the pool's, and the context's
// Session's. If a position was lost it captures a fresh one first (the
// primary connection is idle here); so it does for a Session whose position
// belongs to another primary generation (a token from before a failover:
// the current position covers every write of it that survived) or lies
// beyond anything the primary is known to have written (a forged or stale
// unsigned token: clamped, so that no read waits for a position that will
// not come).
func (cn *Conn) watermark(ctx context.Context) (lsn.LSN, error) {
	return cn.watermarkBut(ctx, nil)
}

// watermarkBut is watermark leaving the connection's own pending capture
// skip, when not nil, in flight: the position it returns is then a lower
// bound of the watermark, which watermark gives once skip has arrived.
func (cn *Conn) watermarkBut(ctx context.Context, skip *pendingCapture) (lsn.LSN, error) {
	if !cn.c.cfg.ReadYourWrites {
		return 0, nil
	}
	cn.settlePoll(ctx) // the floor of this connection's last replica read
	// Writes that returned before their positions arrived (deferred.go).
	if skip == nil {
		if err := cn.settlePending(ctx, true); err != nil {
			return 0, err
		}
	}
	w := wmSources{db: cn.c.cfg.SessionScope == ScopeDB, cs: SessionFrom(ctx)}
	if err := cn.collect(ctx, skip, &w); err != nil {
		return 0, err
	}
	if w.connLost || w.dbLost || w.csLost || w.foreign || w.beyond {
		if err := cn.recapture(ctx, skip, &w); err != nil {
			return 0, err
		}
	}
	wm := cn.sess.wm.Load()
	if w.db {
		wm = max(wm, cn.c.db.wm.Load())
	}
	if w.cs != nil {
		wm = max(wm, w.cs.wm.Load())
	}
	return wm, nil
}

// wmSources is what a read's watermark is made of, and what is wrong with
// it: positions lost (or late) on the way, and a session position from
// another history (foreign) or beyond anything the primary wrote (beyond).
type wmSources struct {
	db bool     // session_scope=db: the pool's watermark counts
	cs *Session // WithSession's, or nil
	// late: other connections' captures still not in after othersWait;
	// they count as lost until a fresh capture covers them.
	late                     []*pendingCapture
	connLost, dbLost, csLost bool
	csGen, gen               generation
	csPos                    lsn.LSN
	foreign, beyond          bool
}

// collect settles (or gives up on) other connections' captures, and finds
// what of the watermark was lost and whether the session's position
// belongs to the writer's history.
func (cn *Conn) collect(ctx context.Context, skip *pendingCapture, w *wmSources) error {
	// Other connections' captures: one that is late counts as lost here.
	if w.db {
		l, err := cn.c.inflight.settleOthers(ctx, skip)
		if err != nil {
			return err
		}
		w.late, w.dbLost = l, len(l) > 0
	}
	if w.cs != nil {
		l, err := w.cs.inflight.settleOthers(ctx, skip)
		if err != nil {
			return err
		}
		w.late, w.csLost = append(w.late, l...), len(l) > 0
	}
	_, w.connLost = cn.sess.pending()
	if w.db && !w.dbLost {
		_, w.dbLost = cn.c.db.pending()
	}
	if w.cs == nil {
		return nil
	}
	if !w.csLost {
		_, w.csLost = w.cs.pending()
	}
	if w.csGen, w.csPos = w.cs.position(); w.csPos == 0 {
		return nil
	}
	if err := cn.checkPrimary(ctx); err != nil {
		return err
	}
	w.gen = cn.c.generationOf(ctx, cn.primary)
	w.foreign = w.csGen != w.gen
	// Only an unsigned position can be forged; a signed one was issued
	// after a real commit.
	w.beyond = !w.foreign && !w.cs.signed() && w.csPos > cn.c.topo.hist.latest()
	return nil
}

// recapture reads a fresh primary position, which covers every write that
// returned before it was sent: it stands in for what was lost or late, and
// rebases or clamps a session position that cannot be waited for.
func (cn *Conn) recapture(ctx context.Context, skip *pendingCapture, w *wmSources) error {
	if skip != nil {
		// The capture below goes on the primary connection, behind the
		// answer still on its way: take that first.
		if err := cn.settlePending(ctx, true); err != nil {
			return err
		}
	}
	if err := cn.checkPrimary(ctx); err != nil {
		return err
	}
	seen := cn.lostSeen(ctx)
	p, err := capture(ctx, cn.primary)
	if err != nil {
		cn.c.stats.captureFailures.Add(1)
		return err
	}
	cn.c.stats.captures.Add(1)
	if w.csPos > 0 {
		cn.rebaseSession(ctx, w, p)
	}
	if !w.dbLost && !w.csLost {
		cn.raiseConn(p, seen)
		return nil
	}
	if cn.advance(ctx, p, seen) {
		for _, lp := range w.late {
			lp.retire(w.db, w.cs) // covered: no reader waits for it again
		}
	} else if len(w.late) > 0 {
		// Read on a writer since replaced: it does not cover the late
		// writes, made on the current one.
		return errPositionLost
	}
	return nil
}

// rebaseSession moves the session's position onto the writer's history at
// p when it is foreign to it, or down to p when it lies beyond anything the
// primary wrote.
func (cn *Conn) rebaseSession(ctx context.Context, w *wmSources, p primaryPos) {
	// The capture may be the first position of a new writer.
	gen := cn.c.genAt(ctx, cn.primary, p.tli)
	// A later timeline of this system than the writer's own is kept from a
	// signed token (issued after a real commit, by a writer this one has
	// not caught up with), or when this connector has seen a writer on it
	// (this connection reaches one since replaced); an unsigned one beyond
	// both may be forged, and would make every read wait.
	cs, csGen := w.cs, w.csGen
	switch {
	case csGen != gen && (!newer(csGen, gen) || !cs.signed() && csGen.timeline > cn.c.tli.Load()):
		cn.c.stats.tokensRebased.Add(1)
		cs.rebase(gen, p.lsn)
	case w.beyond && w.csPos > p.lsn:
		cn.c.stats.tokensClamped.Add(1)
		cs.rebase(gen, p.lsn)
	}
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
