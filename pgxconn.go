package pgryw

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pgryw/pgryw/internal/sqlclass"
)

// pgx's front end on a Conn: the statements of Pool, PoolConn and Tx, as
// stmtOps for the same core as database/sql's. What they return is pgx's
// own: pgx.Rows, pgx.Row, pgx.BatchResults, pgx.Tx, pgconn.CommandTag and
// pgx's errors, unwrapped.

// pgxExec is pgx's Exec on cn.
func (cn *Conn) pgxExec(ctx context.Context, query string, args []any) (pgconn.CommandTag, error) {
	if err := cn.pgxStart(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	op := stmtOp{kind: opPgxExec, ctx: ctx, query: query, pargs: args}
	switch {
	case cn.tx != nil:
		err := cn.tx.run(&op)
		return op.tag, err
	case cn.c.plain:
		tag, err := cn.primary.pgx().Exec(ctx, query, args...)
		cn.servedPlain(ctx, false)
		return tag, err
	}
	done, err := cn.statement(ctx, cn.c.classify(ctx, query), op)
	tag := cn.op.tag
	cn.op = stmtOp{}
	if done != nil {
		done(err)
	}
	return tag, cn.pgxError(err)
}

// pgxQuery is pgx's Query on cn. release, when not nil, is called once the
// rows are closed (a pool's connection goes back then).
func (cn *Conn) pgxQuery(ctx context.Context, query string, args []any, release func()) (pgx.Rows, error) {
	if err := cn.pgxStart(ctx); err != nil {
		if release != nil {
			release()
		}
		return errRows{err: err}, err
	}
	op := stmtOp{kind: opPgxQuery, ctx: ctx, query: query, pargs: args}
	switch {
	case cn.tx != nil:
		err := cn.tx.run(&op)
		return rowsOf(&op, nil, err, release)
	case cn.c.plain:
		rows, err := cn.primary.pgx().Query(ctx, query, args...)
		cn.servedPlain(ctx, false)
		switch {
		case release == nil:
			return rows, err
		case err != nil:
			release()
			return rows, err
		}
		return &pgxRows{Rows: rows, release: release}, nil
	}
	done, err := cn.statement(ctx, cn.c.classify(ctx, query), op)
	op = cn.op
	cn.op = stmtOp{}
	return rowsOf(&op, done, cn.pgxError(err), release)
}

// rowsOf returns what pgx's Query returns for op's answer: pgx's own rows
// (wrapped when their first row was read ahead, or when something is to
// be done once they are closed) and the error pgx's Query gave, or, when
// the statement never ran as pgx's would have (a hint refused, an
// on_timeout error), rows that report err.
func rowsOf(op *stmtOp, done func(error), err error, release func()) (pgx.Rows, error) {
	switch {
	case op.prows == nil:
		if done != nil {
			done(err)
		}
		if release != nil {
			release()
		}
		return errRows{err: err}, err
	case op.qerr != nil:
		if done != nil {
			done(op.qerr)
		}
		if release != nil {
			release()
		}
		return op.prows, op.qerr
	case !op.ahead && done == nil && release == nil:
		return op.prows, nil
	}
	r := &pgxRows{Rows: op.prows, ahead: op.ahead, more: op.more, done: done, release: release}
	if op.ahead && !op.more {
		r.finish() // pgx closed them at the first Next
	}
	return r, nil
}

// pgxQueryRow is pgx's QueryRow on cn.
func (cn *Conn) pgxQueryRow(ctx context.Context, query string, args []any, release func()) pgx.Row {
	rows, _ := cn.pgxQuery(ctx, query, args, release)
	return &pgxRow{rows: rows}
}

// pgxBatch is pgx's SendBatch on cn. A batch that only reads is one read:
// on a replica that has replayed the session's watermark, after one wait
// for the whole batch. One with anything else runs on the primary, in the
// one implicit transaction pgx sends it as, and its commit moves the
// watermark.
func (cn *Conn) pgxBatch(ctx context.Context, b *pgx.Batch, release func()) pgx.BatchResults {
	if err := cn.pgxStart(ctx); err != nil {
		if release != nil {
			release()
		}
		return pgx.FailedBatchResults(b, err)
	}
	if cn.c.plain || len(b.QueuedQueries) == 0 {
		br := cn.primary.pgx().SendBatch(ctx, b)
		if cn.c.plain {
			cn.servedPlain(ctx, false)
		}
		if t := br.Tx(); t != nil {
			// The batch began a transaction (pgx.Batch.BeginTx): the
			// connection goes back when it ends.
			return &pgxBatch{BatchResults: br, tx: &Tx{raw: t, release: release}}
		}
		return batchOf(br, nil, release)
	}
	if cn.tx != nil {
		// pgx's Conn.SendBatch while a transaction of the connection's is
		// open: the transaction's.
		t := &Tx{t: cn.tx, release: nil}
		br := t.SendBatch(ctx, b)
		if release != nil {
			return &pgxBatch{BatchResults: br, release: release}
		}
		return br
	}
	op := stmtOp{kind: opPgxBatch, ctx: ctx, query: b.QueuedQueries[0].SQL, batch: b}
	done, err := cn.statement(ctx, cn.c.classifyBatch(ctx, b), op)
	op = cn.op
	cn.op = stmtOp{}
	if op.bres == nil {
		if done != nil {
			done(err)
		}
		if release != nil {
			release()
		}
		return pgx.FailedBatchResults(b, cn.pgxError(err))
	}
	br := &pgxBatch{BatchResults: op.bres, done: done, release: release}
	if t := op.bres.Tx(); t != nil {
		// The batch began a transaction (pgx.Batch.BeginTx): it is
		// pgryw's, on the primary, and ends the connection's use when it
		// ends.
		cn.tx = &tx{cn: cn, b: cn.primary, inner: pgxTx{t}, ctx: ctx, begin: stmtOp{kind: opPgxBegin}, wrote: true}
		br.tx = &Tx{t: cn.tx, release: release}
		br.release = nil
	}
	return br
}

// classifyBatch classifies a batch as one statement: pgx sends it in one
// implicit transaction. It is a read when every statement in it is; it
// writes when any may (transaction control among its statements makes it
// Mixed, as in a multi-statement string); the session state it touches is
// all of theirs.
func (c *Connector) classifyBatch(ctx context.Context, b *pgx.Batch) sqlclass.Result {
	var r sqlclass.Result
	for i, q := range b.QueuedQueries {
		cls := c.classify(ctx, q.SQL)
		if i == 0 {
			r = cls
			r.Settings = append([]string(nil), cls.Settings...)
			r.Funcs = append([]string(nil), cls.Funcs...)
			continue
		}
		read := c.readOnly(&r)
		r.Write = r.Write || cls.Write
		r.Pin = r.Pin || cls.Pin
		r.State |= cls.State
		r.Settings = append(r.Settings, cls.Settings...)
		r.Funcs = append(r.Funcs, cls.Funcs...)
		r.Mixed = r.Mixed || cls.Mixed || cls.Tx != sqlclass.TxNone || r.Tx != sqlclass.TxNone
		r.TxLocal = r.TxLocal && cls.TxLocal
		if !r.Node && cls.Node {
			r.Node, r.NodeReason = true, cls.NodeReason
		}
		switch {
		case cls.Hint == sqlclass.HintPrimary:
			r.Hint = sqlclass.HintPrimary
		case cls.Hint == sqlclass.HintReplica && r.Hint == sqlclass.HintNone:
			r.Hint = sqlclass.HintReplica
		}
		if read && !c.readOnly(&r) {
			r.Reason = cls.Reason // the first statement that keeps it off replicas
		}
	}
	if r.Mixed {
		r.Write = true
	}
	return r
}

// pgxCopyFrom is pgx's CopyFrom on cn: on the primary, and it moves the
// watermark (its position is read with a round trip of its own: nothing
// may ride in a COPY's flush).
func (cn *Conn) pgxCopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := cn.pgxStart(ctx); err != nil {
		return 0, err
	}
	if t := cn.tx; t != nil {
		return t.copyFrom(ctx, table, columns, src)
	}
	if cn.c.plain {
		n, err := cn.primary.pgx().CopyFrom(ctx, table, columns, src)
		cn.servedPlain(ctx, false)
		return n, err
	}
	var n int64
	err := cn.RunOnPrimary(ctx, func(pc *pgx.Conn) error {
		var err error
		n, err = pc.CopyFrom(ctx, table, columns, src)
		return err
	})
	cls := sqlclass.Result{Write: true, Reason: "COPY"}
	cn.servedPrimary(ctx, &cls, &plan{route: RouteWrite})
	return n, cn.pgxError(err)
}

// copyFrom is CopyFrom inside the transaction: it writes, so a read-only
// transaction on a replica moves to the primary first, where its
// read-only mode refuses the COPY as pgx's would.
func (t *tx) copyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	t.ctx = ctx
	if t.onReplica && !t.aborted {
		if err := t.toPrimary(); err != nil {
			return 0, err
		}
	}
	n, err := t.b.pgx().CopyFrom(ctx, table, columns, src)
	t.ran, t.wrote = true, true
	t.served(ctx, "COPY")
	return n, err
}

// pgxBegin is pgx's BeginTx on cn: a read-only transaction (AccessMode
// ReadOnly, no BeginQuery of the caller's) may run on a replica, as
// database/sql's does; anything else on the primary.
func (cn *Conn) pgxBegin(ctx context.Context, opts pgx.TxOptions) (*Tx, error) {
	if err := cn.pgxStart(ctx); err != nil {
		return nil, err
	}
	if cn.tx != nil {
		return nil, errors.New("pgryw: a transaction is already open on this connection")
	}
	if cn.c.plain {
		t, err := cn.primary.pgx().BeginTx(ctx, opts)
		cn.servedPlain(ctx, true)
		if err != nil {
			return nil, err
		}
		return &Tx{raw: t}, nil
	}
	t, err := cn.begin(ctx, sqlTxOptions(opts), stmtOp{kind: opPgxBegin, ctx: ctx, popts: opts})
	if err != nil {
		return nil, cn.pgxError(err)
	}
	return &Tx{t: t}, nil
}

// sqlTxOptions is how routing reads pgx's transaction options: read-only
// only when the caller left the BEGIN to pgx (a BeginQuery of its own may
// say anything).
func sqlTxOptions(o pgx.TxOptions) driver.TxOptions {
	var d driver.TxOptions
	d.ReadOnly = o.AccessMode == pgx.ReadOnly && o.BeginQuery == ""
	switch o.IsoLevel {
	case pgx.Serializable:
		d.Isolation = driver.IsolationLevel(sql.LevelSerializable)
	case pgx.RepeatableRead:
		d.Isolation = driver.IsolationLevel(sql.LevelRepeatableRead)
	case pgx.ReadCommitted:
		d.Isolation = driver.IsolationLevel(sql.LevelReadCommitted)
	case pgx.ReadUncommitted:
		d.Isolation = driver.IsolationLevel(sql.LevelReadUncommitted)
	}
	return d
}

// pgxStart readies cn for a statement of pgx's front end: the capture of
// its last write, if still on its way, is settled first.
func (cn *Conn) pgxStart(ctx context.Context) error {
	if cn.pending == nil {
		return nil
	}
	return cn.pgxError(cn.settlePending(ctx, false))
}

// pgxError is err as pgx's front end returns it: database/sql's "bad
// connection", which makes database/sql try another connection, is the
// reason the primary connection could not be used.
func (cn *Conn) pgxError(err error) error {
	if err != driver.ErrBadConn {
		return err
	}
	if cn.lostErr != nil {
		return cn.lostErr
	}
	return errPrimaryLost
}

// errRows are the rows of a query that never ran.
type errRows struct{ err error }

func (errRows) Close()                                       {}
func (r errRows) Err() error                                 { return r.err }
func (errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (errRows) Next() bool                                   { return false }
func (r errRows) Scan(...any) error                          { return r.err }
func (r errRows) Values() ([]any, error)                     { return nil, r.err }
func (errRows) RawValues() [][]byte                          { return nil }
func (errRows) Conn() *pgx.Conn                              { return nil }
func (errRows) TypeMap() *pgtype.Map                         { return nil }

// pgxRows are pgx's rows, with their first row read ahead (ahead: the
// first Next returns more) and done and release called once they are
// closed: by Close, or by the Next that found no more rows (pgx closes its
// rows then).
type pgxRows struct {
	pgx.Rows
	ahead, more bool
	done        func(error)
	release     func()
}

// Next implements pgx.Rows.
func (r *pgxRows) Next() bool {
	if r.ahead {
		r.ahead = false
		if !r.more {
			r.finish()
		}
		return r.more
	}
	if r.Rows.Next() {
		return true
	}
	r.finish()
	return false
}

// Close implements pgx.Rows.
func (r *pgxRows) Close() {
	r.Rows.Close()
	r.finish()
}

func (r *pgxRows) finish() {
	if d := r.done; d != nil {
		r.done = nil
		d(r.Rows.Err())
	}
	if rel := r.release; rel != nil {
		r.release = nil
		rel()
	}
}

// pgxRow is pgx's QueryRow's row, over rows of pgryw's.
type pgxRow struct{ rows pgx.Rows }

// Scan implements pgx.Row as pgx's does: the first row, or pgx.ErrNoRows.
func (r *pgxRow) Scan(dest ...any) error {
	rows := r.rows
	if err := rows.Err(); err != nil {
		rows.Close()
		return err
	}
	for _, d := range dest {
		if _, ok := d.(*pgtype.DriverBytes); ok {
			rows.Close()
			return fmt.Errorf("cannot scan into *pgtype.DriverBytes from QueryRow")
		}
	}
	if !rows.Next() {
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	// A panic in the caller's own Scanner leaves the rows open. A row of
	// the pool's own QueryRow is closed on the way out, which gives its
	// connection back, as pgxpool's row releases its connection, and the
	// panic goes on to the caller. A row of a held connection's, or a
	// transaction's, stays open, as pgx's does.
	done := false
	if pr, ok := rows.(*pgxRows); ok && pr.release != nil {
		defer func() {
			if !done {
				rows.Close()
			}
		}()
	}
	rows.Scan(dest...)
	done = true
	rows.Close()
	return rows.Err()
}

// txEnded ends pgryw's side of the transaction the batch began when it
// never began on the server (the batch failed first: pgx closes its
// transaction then, and its caller need not roll it back).
func (b *pgxBatch) txEnded() {
	t := b.tx
	if t == nil || t.closed {
		return
	}
	if t.raw != nil {
		if t.raw.Conn().PgConn().TxStatus() == 'I' {
			t.closed = true
			t.done()
		}
		return
	}
	in := t.t
	if in.cn.tx == in && in.b.idle() {
		in.cn.tx = nil
		t.closed = true
		t.done()
	}
}

// batchOf returns pgx's batch results, with done and release called once
// they are closed.
func batchOf(br pgx.BatchResults, done func(error), release func()) pgx.BatchResults {
	if done == nil && release == nil {
		return br
	}
	return &pgxBatch{BatchResults: br, done: done, release: release}
}

// pgxBatch are pgx's batch results, with done and release called once they
// are closed.
type pgxBatch struct {
	pgx.BatchResults
	tx      *Tx // the transaction the batch began (pgx.Batch.BeginTx)
	done    func(error)
	release func()
	err     error
	closed  bool
}

// Tx implements pgx.BatchResults: the transaction the batch began, as
// pgryw's.
func (b *pgxBatch) Tx() pgx.Tx {
	if b.tx != nil {
		return b.tx
	}
	return b.BatchResults.Tx()
}

// Close implements pgx.BatchResults.
func (b *pgxBatch) Close() error {
	if b.closed {
		return b.err
	}
	defer b.txEnded()
	b.closed = true
	if err := b.BatchResults.Close(); b.err == nil {
		b.err = err
	}
	if d := b.done; d != nil {
		b.done = nil
		d(b.err)
	}
	if rel := b.release; rel != nil {
		b.release = nil
		rel()
	}
	return b.err
}
