package pgryw

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Tx is a transaction of pgx's front end, as Pool.BeginTx, PoolConn.BeginTx
// and their Begin open it; it implements pgx.Tx. A read-write transaction
// runs wholly on the primary, and its commit moves the watermark; a
// read-only one (pgx.TxOptions.AccessMode pgx.ReadOnly) may run wholly on a
// replica that replayed the session's watermark before BEGIN, and moves to
// the primary when a statement must run there, as database/sql's does.
type Tx struct {
	t       *tx    // nil when the pool has no replicas
	raw     pgx.Tx // the pgx transaction itself, when the pool has no replicas
	release func() // gives the pool's connection back, once the transaction ends
	closed  bool
	sp      int64 // savepoints made by Begin
}

var _ pgx.Tx = (*Tx)(nil)

// Begin implements pgx.Tx: a pseudo nested transaction, a savepoint, as
// pgx's.
func (t *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.raw != nil {
		return t.raw.Begin(ctx)
	}
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	t.sp++
	if _, err := t.Exec(ctx, "savepoint sp_"+strconv.FormatInt(t.sp, 10)); err != nil {
		return nil, err
	}
	return &nestedTx{tx: t, n: t.sp}, nil
}

// Commit implements pgx.Tx. A read-write transaction's commit moves the
// watermarks: the position is read behind COMMIT, in the same flush.
func (t *Tx) Commit(ctx context.Context) error { return t.end(ctx, true) }

// Rollback implements pgx.Tx.
func (t *Tx) Rollback(ctx context.Context) error { return t.end(ctx, false) }

// end commits or rolls the transaction back, and gives the pool's
// connection back.
func (t *Tx) end(ctx context.Context, commit bool) error {
	defer t.done()
	if t.raw != nil {
		if commit {
			return t.raw.Commit(ctx)
		}
		return t.raw.Rollback(ctx)
	}
	if t.closed {
		return pgx.ErrTxClosed
	}
	t.closed = true
	in := t.t
	in.ctx = ctx
	if commit {
		return in.end(func() error { return in.inner.commit(ctx) }, true)
	}
	return in.end(func() error { return in.inner.rollback(ctx) }, false)
}

func (t *Tx) done() {
	if rel := t.release; rel != nil {
		t.release = nil
		rel()
	}
}

// Exec implements pgx.Tx.
func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.raw != nil {
		return t.raw.Exec(ctx, sql, args...)
	}
	if t.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	op := stmtOp{kind: opPgxExec, ctx: ctx, query: sql, pargs: args}
	err := t.t.run(&op)
	return op.tag, t.t.cn.pgxError(err)
}

// Query implements pgx.Tx.
func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.raw != nil {
		return t.raw.Query(ctx, sql, args...)
	}
	if t.closed {
		return errRows{err: pgx.ErrTxClosed}, pgx.ErrTxClosed
	}
	op := stmtOp{kind: opPgxQuery, ctx: ctx, query: sql, pargs: args}
	err := t.t.run(&op)
	return rowsOf(&op, nil, t.t.cn.pgxError(err), nil)
}

// QueryRow implements pgx.Tx.
func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.raw != nil {
		return t.raw.QueryRow(ctx, sql, args...)
	}
	rows, _ := t.Query(ctx, sql, args...)
	return &pgxRow{rows: rows}
}

// SendBatch implements pgx.Tx.
func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.raw != nil {
		return t.raw.SendBatch(ctx, b)
	}
	if t.closed {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	if pgx.FailedBatchResults(b, nil).Tx() != nil {
		// pgx.Batch.BeginTx: pgx refuses it inside a transaction.
		return pgx.FailedBatchResults(b, errBatchBeginInTx)
	}
	if len(b.QueuedQueries) == 0 {
		return t.t.b.pgx().SendBatch(ctx, b)
	}
	op := stmtOp{kind: opPgxBatch, ctx: ctx, query: b.QueuedQueries[0].SQL, batch: b}
	err := t.t.run(&op)
	if op.bres == nil {
		return pgx.FailedBatchResults(b, t.t.cn.pgxError(err))
	}
	return op.bres
}

// CopyFrom implements pgx.Tx.
func (t *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if t.raw != nil {
		return t.raw.CopyFrom(ctx, table, columns, src)
	}
	if t.closed {
		return 0, pgx.ErrTxClosed
	}
	n, err := t.t.copyFrom(ctx, table, columns, src)
	return n, t.t.cn.pgxError(err)
}

// LargeObjects implements pgx.Tx. Large objects are written on the
// primary: a transaction on a replica moves there first, and the
// transaction counts as one that wrote.
func (t *Tx) LargeObjects() pgx.LargeObjects {
	if t.raw != nil {
		return t.raw.LargeObjects()
	}
	in := t.t
	if in.onReplica && !in.aborted && !t.closed {
		in.toPrimary()
	}
	if !in.onReplica {
		in.wrote = true
	}
	return in.inner.(pgxTx).LargeObjects()
}

// Prepare implements pgx.Tx: the statement is prepared on the primary
// connection (a transaction on a replica moves there first), where a
// statement run by its name later goes.
func (t *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.raw != nil {
		return t.raw.Prepare(ctx, name, sql)
	}
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	in := t.t
	in.ctx = ctx
	if in.onReplica && !in.aborted {
		if err := in.toPrimary(); err != nil {
			return nil, in.cn.pgxError(err)
		}
	}
	return in.b.pgx().Prepare(ctx, name, sql)
}

// Conn implements pgx.Tx: the connection the transaction runs on (a
// replica's, for a read-only transaction there). Statements sent through
// it directly are not routed, and do not move the watermark.
func (t *Tx) Conn() *pgx.Conn {
	if t.raw != nil {
		return t.raw.Conn()
	}
	return t.t.b.pgx()
}

// nestedTx is a savepoint made by Tx.Begin, as pgx's pseudo nested
// transaction.
type nestedTx struct {
	tx     *Tx
	n      int64
	closed bool
}

func (n *nestedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if n.closed {
		return nil, pgx.ErrTxClosed
	}
	return n.tx.Begin(ctx)
}

func (n *nestedTx) Commit(ctx context.Context) error {
	if n.closed {
		return pgx.ErrTxClosed
	}
	_, err := n.Exec(ctx, "release savepoint sp_"+strconv.FormatInt(n.n, 10))
	n.closed = true
	return err
}

func (n *nestedTx) Rollback(ctx context.Context) error {
	if n.closed {
		return pgx.ErrTxClosed
	}
	_, err := n.Exec(ctx, "rollback to savepoint sp_"+strconv.FormatInt(n.n, 10))
	n.closed = true
	return err
}

func (n *nestedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if n.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return n.tx.Exec(ctx, sql, args...)
}

func (n *nestedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if n.closed {
		return errRows{err: pgx.ErrTxClosed}, pgx.ErrTxClosed
	}
	return n.tx.Query(ctx, sql, args...)
}

func (n *nestedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, _ := n.Query(ctx, sql, args...)
	return &pgxRow{rows: rows}
}

func (n *nestedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if n.closed {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return n.tx.SendBatch(ctx, b)
}

func (n *nestedTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if n.closed {
		return 0, pgx.ErrTxClosed
	}
	return n.tx.CopyFrom(ctx, table, columns, src)
}

func (n *nestedTx) LargeObjects() pgx.LargeObjects { return n.tx.LargeObjects() }

func (n *nestedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if n.closed {
		return nil, pgx.ErrTxClosed
	}
	return n.tx.Prepare(ctx, name, sql)
}

func (n *nestedTx) Conn() *pgx.Conn { return n.tx.Conn() }
