package pgryw

import (
	"context"
	"database/sql/driver"
	"fmt"

	"github.com/pgryw/pgryw/internal/sqlclass"
)

// Conn is one database/sql connection: a primary connection opened at once,
// and replica connections borrowed from the replicas' idle ones (node.idle)
// when a read needs them, given back when database/sql takes the Conn back.
// Statements are routed one by one; see the package documentation.
type Conn struct {
	c        *Connector
	primary  *backend
	replicas []*backend // by replica index; nil until used

	sess Session // this connection's own watermark

	// pins: why reads stay on the primary connection: session state lives
	// there (an advisory lock, LISTEN, a temporary table...; see state.go).
	// 0: reads go to replicas, with the session's settings carried along.
	pins pinReason

	// poll: the replay poll behind this connection's last replica read,
	// left to be settled by its next one (replica.go).
	poll pendingPoll

	// unbounded: the replica connection that served this connection's last
	// replica read when no poll rode behind it (one replica, trailPolls):
	// what that read saw is bounded only by what this server connection
	// replays next, so no other may serve the next read before the
	// connection's watermark is raised to a primary position.
	unbounded *backend
	// unboundedAt: Connector.opened when that read's answer was in. A
	// connection to the same server instance opened by then, and still
	// open, has lived through that read: its session sees at least what
	// the read saw (bounds).
	unboundedAt uint64
	// unboundedInst: that connection's server instance (its peer's,
	// copied: once lent on, another Conn may learn more of it).
	unboundedInst uint64

	// pending: the capture behind this connection's last statement on the
	// primary, left to be settled later (deferred.go).
	pending *pendingCapture

	// resetPending: reset_session's reset rides in front of the next
	// statement on the primary.
	resetPending bool
	// opaqueCall: with reset_session, a statement on the primary called a
	// volatile function of the database's, whose effects on the session
	// pgryw cannot fully see (through other functions, in other
	// languages): the connection is reset for its next user.
	opaqueCall bool

	// checkDue: database/sql has handed the connection out again, and
	// nothing has been sent on the primary connection since
	// (checkPrimary).
	checkDue bool

	// blockWrote: a transaction block opened with an Exec'd BEGIN has run a
	// statement that may write, so its COMMIT moves the watermark.
	blockWrote bool

	// lastWrite: the cluster's watermark uses when this connection's last
	// possible commit on the primary returned, plus one; 0 before its
	// first (captureLater).
	lastWrite uint64
	// owed: this connection's last possible commit went without its
	// capture, and none has been sent since (captureOwed).
	owed bool

	tx *tx // the open transaction of the front end's, if any

	// open: the statement on the primary whose rows are still open.
	open openStmt

	// lostErr: why the last new primary connection checkPrimary asked for
	// could not be made (database/sql gets driver.ErrBadConn; pgx's front
	// end, this).
	lostErr error

	obs stmtObs // what routing the statement under way learned (observe.go)

	// fallbackHeld: this connection holds a max_fallback slot for the read
	// (or read-only transaction) it is running on the primary.
	fallbackHeld bool

	// op: the statement onReplica is running (startOp). Kept here rather
	// than on the caller's stack, where the escape analysis would not keep
	// it: a replica read allocates nothing of pgryw's own.
	op stmtOp

	closed bool // Close has run
}

// startOp makes o the connection's replicaOp for one onReplica call; the
// caller clears cn.op when it has taken the answer.
func (cn *Conn) startOp(o stmtOp) *stmtOp {
	cn.op = o
	return &cn.op
}

// Close implements driver.Conn.
func (cn *Conn) Close() error {
	cn.closePending()
	cn.setPins(0, "connection closed")
	cn.releaseFallback()
	err := cn.primary.close()
	for i, b := range cn.replicas {
		if b != nil {
			b.close()
			cn.replicas[i] = nil
		}
	}
	if !cn.closed {
		cn.closed = true
		open := int(cn.c.conns.Add(-1))
		for _, n := range cn.c.topo.replicas {
			n.idle.trim(open)
		}
	}
	return err
}

// Prepare implements driver.Conn.
func (cn *Conn) Prepare(query string) (driver.Stmt, error) {
	return cn.PrepareContext(context.Background(), query)
}

// PrepareContext implements driver.ConnPrepareContext. As with pgx, the
// statement is prepared on the server at once, so that a statement that
// cannot be prepared (a missing table, a syntax error) fails here and
// NumInput counts its parameters: on the primary, where pgx would prepare
// it, and inside a read-only transaction on a replica there too (where it
// runs, and where a failure aborts the transaction as pgx's would). Which
// node runs it is still decided at each execution (see stmt).
func (cn *Conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if cn.pending != nil {
		if err := cn.settlePending(ctx, false); err != nil {
			return nil, err
		}
	}
	st := &stmt{cn: cn, query: query}
	if t := cn.tx; t != nil && t.onReplica {
		// pgx keeps one server-side statement per connection and text:
		// if the primary connection has this one, pgx would answer from
		// it without a word to the server, whatever state its
		// transaction is in. Otherwise its Parse would run inside the
		// transaction, which runs on the replica: its answer is the
		// replica's (an error aborts the transaction).
		var prim driver.Stmt
		cached := false
		if cn.primary.idle() {
			sent := cn.primary.sent()
			if ps, err := cn.primary.prepare(ctx, query); err == nil {
				prim, cached = ps, cn.primary.sent() == sent
			}
		}
		if cached {
			st.preps = append(st.preps, prepared{on: cn.primary, ps: prim})
			return st, nil
		}
		ps, err := t.b.prepare(ctx, query)
		if err == nil {
			// Parse analysis of a query takes the transaction's snapshot.
			cls := cn.c.classify(ctx, query)
			t.snapped = t.snapped || snapshotStmt(&cls)
		}
		if err != nil {
			t.aborted = true
			if prim != nil {
				prim.Close()
			}
			return nil, err
		}
		st.preps = append(st.preps, prepared{on: t.b, ps: ps})
		t.b.preps++ // the connection stays with this Conn while it lives
		if prim != nil {
			st.preps = append(st.preps, prepared{on: cn.primary, ps: prim})
		}
		return st, nil
	}
	if cn.tx == nil {
		if err := cn.checkPrimary(ctx); err != nil {
			return nil, err
		}
	}
	reset := cn.armReset()
	ps, err := cn.primary.prepare(ctx, query)
	if reset != nil {
		cn.primary.wire.Disarm()
		cn.settleReset(ctx, reset)
	}
	if err != nil {
		return nil, err
	}
	st.preps = append(st.preps, prepared{on: cn.primary, ps: ps})
	return st, nil
}

// Begin implements driver.Conn.
func (cn *Conn) Begin() (driver.Tx, error) {
	return cn.BeginTx(context.Background(), driver.TxOptions{})
}

// CheckNamedValue implements driver.NamedValueChecker: every argument goes to
// pgx untouched (pgx encodes arrays, Scanner/Valuer types and more itself).
func (cn *Conn) CheckNamedValue(*driver.NamedValue) error { return nil }

// Ping implements driver.Pinger against the primary.
func (cn *Conn) Ping(ctx context.Context) error {
	if err := cn.settlePending(ctx, false); err != nil {
		return err
	}
	if err := cn.checkPrimary(ctx); err != nil {
		return err
	}
	if p, ok := cn.primary.conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

// ResetSession implements driver.SessionResetter. It drops replica
// connections that have failed (the others are checked when a read uses
// them) and arranges for the primary connection to be checked before
// anything is sent on it (checkPrimary).
func (cn *Conn) ResetSession(ctx context.Context) error {
	if cn.pending != nil {
		if err := cn.settlePending(ctx, false); err != nil {
			return err
		}
	}
	for i, b := range cn.replicas {
		if b != nil && b.closed() {
			b.close()
			cn.replicas[i] = nil
		}
	}
	cn.checkDue = true
	if cn.primary.node.fastState.Load() == fastUnknown && cn.primary.captureFn.Load() != 0 {
		if err := cn.probeFastPath(ctx); err != nil {
			return err
		}
	}
	if r, ok := cn.primary.conn.(driver.SessionResetter); ok {
		if err := r.ResetSession(ctx); err != nil {
			return err
		}
	}
	if cn.c.cfg.ResetSession && !cn.c.plain {
		return cn.resetState(ctx)
	}
	return nil
}

// IsValid implements driver.Validator. database/sql calls it as it takes
// the connection back: the replica connections it borrowed go back to
// their replicas' pools then (releaseReplicas).
func (cn *Conn) IsValid() bool {
	cn.releaseReplicas()
	if v, ok := cn.primary.conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return !cn.primary.closed()
}

// ExecContext implements driver.ExecerContext.
func (cn *Conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return cn.exec(ctx, query, args, nil)
}

// exec is ExecContext, of a prepared statement's text when st is not nil:
// where st was prepared, it runs through it.
func (cn *Conn) exec(ctx context.Context, query string, args []driver.NamedValue, st *stmt) (driver.Result, error) {
	if cn.pending != nil {
		if err := cn.settlePending(ctx, false); err != nil {
			return nil, err
		}
	}
	if cn.tx != nil {
		return cn.tx.exec(ctx, query, args, st)
	}
	if cn.c.plain {
		res, err := cn.primary.execVia(ctx, st, query, args)
		cn.servedPlain(ctx, false)
		return res, err
	}
	done, err := cn.statement(ctx, cn.c.classify(ctx, query), stmtOp{kind: opExec, ctx: ctx, query: query, args: args, st: st})
	res := cn.op.res
	cn.op = stmtOp{}
	if done != nil {
		done(err)
	}
	return res, err
}

// QueryContext implements driver.QueryerContext.
func (cn *Conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return cn.query(ctx, query, args, nil)
}

// query is QueryContext, of a prepared statement's text when st is not
// nil: where st was prepared, it runs through it.
func (cn *Conn) query(ctx context.Context, query string, args []driver.NamedValue, st *stmt) (driver.Rows, error) {
	if cn.pending != nil {
		if err := cn.settlePending(ctx, false); err != nil {
			return nil, err
		}
	}
	if cn.tx != nil {
		return cn.tx.query(ctx, query, args, st)
	}
	if cn.c.plain {
		rows, err := cn.primary.queryVia(ctx, st, query, args)
		cn.servedPlain(ctx, false)
		return rows, err
	}
	done, err := cn.statement(ctx, cn.c.classify(ctx, query), stmtOp{kind: opQuery, ctx: ctx, query: query, args: args, st: st})
	rows := cn.op.rows
	cn.op = stmtOp{}
	switch {
	case done == nil:
		return rows, err
	case err != nil:
		done(err)
		return rows, err
	}
	return &afterRows{Rows: rows, done: done}, nil
}

// statement runs o, a statement outside any transaction of the front
// end's, classified as cls: collected, planned, and run on a replica or the
// primary. Its answer is left in cn.op, which the caller takes and clears.
// done, when not nil, is to be called once the answer has been read (at
// once when it is not open: an Exec's), with its error: it settles what
// the statement's outcome decides (the primary's watermark, or what a
// replica read saw).
func (cn *Conn) statement(ctx context.Context, cls sqlclass.Result, o stmtOp) (done func(error), err error) {
	p := cn.planFor(ctx, &cls)
	switch p.target {
	case targetRefused:
		return nil, refusedHint(&cls)
	case targetReplica:
		r := o
		r.st = nil // prepared where PrepareContext ran: the primary
		r.ahead = r.kind == opPgxQuery || r.kind == opPgxBatch
		op := cn.startOp(r)
		onPrimary, done, err := cn.onReplica(ctx, o.query, &cls, &p, true, op)
		if !onPrimary {
			return done, err
		}
	}
	// A read of pgx's on the primary reads its first row first too, as
	// database/sql's does: a description pgx cached before a schema change
	// fails it before any row reached the caller, and it is sent again
	// (runPrimary's staleRead). So does a write of pgx's Query on a
	// primary connection that sat quiet (backend.quiet): the server may
	// have ended it for idleness as the write went out, and its FATAL as
	// the first answer means the write never ran and goes again
	// (runPrimary's endedUnrun). pgx's Query returns once the first answer
	// is in anyway: the server sends the write's rows in the same flush.
	o.ahead = o.kind == opPgxQuery && (p.read || cn.primary.quiet())
	return cn.runPrimary(ctx, cls, &p, cn.startOp(o))
}

// refusedHint is the error for a statement a replica hint asks a replica
// for although it must run on the primary.
func refusedHint(cls *sqlclass.Result) error {
	return fmt.Errorf("%w (%s)", ErrReplicaHint, cls.Reason)
}

var (
	_ driver.Conn               = (*Conn)(nil)
	_ driver.ConnBeginTx        = (*Conn)(nil)
	_ driver.ConnPrepareContext = (*Conn)(nil)
	_ driver.ExecerContext      = (*Conn)(nil)
	_ driver.QueryerContext     = (*Conn)(nil)
	_ driver.NamedValueChecker  = (*Conn)(nil)
	_ driver.Pinger             = (*Conn)(nil)
	_ driver.SessionResetter    = (*Conn)(nil)
	_ driver.Validator          = (*Conn)(nil)
)

// Connector returns the connector this connection belongs to.
func (cn *Conn) Connector() *Connector { return cn.c }
