package pgryw

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"reflect"

	"github.com/pgryw/pgryw/internal/sqlclass"
)

// Stmt is a prepared statement. It holds only the SQL text: the node that
// runs it is chosen at each execution, like any other statement.
type Stmt struct {
	cn    *Conn
	query string
}

// Close implements driver.Stmt.
func (s *Stmt) Close() error { return nil }

// NumInput implements driver.Stmt; -1 leaves the argument count to the server.
func (s *Stmt) NumInput() int { return -1 }

// Exec implements driver.Stmt.
func (s *Stmt) Exec(args []driver.Value) (driver.Result, error) {
	return s.cn.ExecContext(context.Background(), s.query, named(args))
}

// Query implements driver.Stmt.
func (s *Stmt) Query(args []driver.Value) (driver.Rows, error) {
	return s.cn.QueryContext(context.Background(), s.query, named(args))
}

// ExecContext implements driver.StmtExecContext.
func (s *Stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return s.cn.ExecContext(ctx, s.query, args)
}

// QueryContext implements driver.StmtQueryContext.
func (s *Stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	return s.cn.QueryContext(ctx, s.query, args)
}

// CheckNamedValue implements driver.NamedValueChecker, like Conn's.
func (s *Stmt) CheckNamedValue(*driver.NamedValue) error { return nil }

func named(args []driver.Value) []driver.NamedValue {
	nv := make([]driver.NamedValue, len(args))
	for i, v := range args {
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return nv
}

// tx is a database/sql transaction. A read-write transaction runs wholly on
// the primary; a read-only one may run wholly on a replica that was made to
// catch up before BEGIN (a snapshot taken after BEGIN under REPEATABLE READ
// would otherwise be older than the watermark).
type tx struct {
	cn        *Conn
	b         *backend
	inner     driver.Tx
	ctx       context.Context
	onReplica bool
	wrote     bool // a statement that may write ran: the commit moves the watermark
	opts      driver.TxOptions
	ran       bool // a statement ran in it
	tainted   bool // on a replica: a statement in it may have changed session state
}

// BeginTx implements driver.ConnBeginTx.
func (cn *Conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if err := cn.settlePending(ctx, false); err != nil {
		return nil, err
	}
	if cn.c.plain {
		t, err := cn.primary.conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
		cn.servedPlain(ctx, true)
		return t, err
	}
	cn.obs = stmtObs{}
	// A standby refuses SERIALIZABLE ("cannot use serializable mode in a
	// hot standby"), so a read-only serializable transaction runs on the
	// primary, where it means what it says.
	serializable := sql.IsolationLevel(opts.Isolation) == sql.LevelSerializable
	if opts.ReadOnly && !serializable && cn.pins == 0 && !wantsPrimary(ctx) && cn.primary.idle() {
		// BEGIN is routed like a read: the replica's check rides in front
		// of it, so the snapshot, taken by the transaction's first
		// statement, is no older than the watermark. A failed check rolls
		// the transaction back before anything ran in it.
		var none sqlclass.Result
		op := cn.startOp(replicaOp{kind: opBegin, ctx: ctx, opts: opts})
		onPrimary, _, err := cn.onReplica(ctx, "", &none, false, op)
		inner, on := op.tx, op.on
		cn.op = replicaOp{}
		if err != nil {
			return nil, err
		}
		if !onPrimary {
			cn.tx = &tx{cn: cn, b: on, inner: inner, ctx: ctx, onReplica: true, opts: opts}
			return cn.tx, nil
		}
	}
	if err := cn.checkPrimary(ctx); err != nil {
		return nil, err
	}
	reset := cn.armReset()
	inner, err := cn.primary.conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if reset != nil {
		cn.primary.wire.Disarm()
		cn.settleReset(ctx, reset)
	}
	cn.servedBegin(ctx, opts.ReadOnly)
	if err != nil {
		cn.releaseFallback()
		return nil, err
	}
	cn.primary.txOpen = true
	cn.tx = &tx{cn: cn, b: cn.primary, inner: inner, ctx: ctx, opts: opts}
	return cn.tx, nil
}

func (t *tx) note(query string, err error) {
	cls := t.cn.c.classes.get(query)
	if t.onReplica {
		// Session state taken in a transaction on a replica (a session
		// SET, say) would outlive it there, unknown to pgryw: that
		// replica connection is closed when the transaction ends.
		t.tainted = t.tainted || touchesState(&cls)
		return
	}
	t.cn.track(&cls)
	if touchesState(&cls) {
		// Read back when the transaction ends; until then, it is pinned.
		t.cn.setPins(t.cn.pins|pinUnread, cls.Reason)
	}
	if err == nil && t.cn.c.mayWrite(&cls) {
		t.wrote = true
	}
}

func (t *tx) exec(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	res, err := t.b.exec(ctx, query, args)
	if t.refused(err) {
		if err = t.moveToPrimary(); err == nil {
			res, err = t.b.exec(ctx, query, args)
		}
	}
	t.ran = true
	t.note(query, err)
	t.served(ctx, query)
	return res, err
}

func (t *tx) query(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	rows, err := t.b.query(ctx, query, args)
	if t.refused(err) {
		if err = t.moveToPrimary(); err == nil {
			rows, err = t.b.query(ctx, query, args)
		}
	}
	t.ran = true
	t.note(query, err)
	t.served(ctx, query)
	return rows, err
}

// refused reports that the standby refused the first statement of a
// read-only transaction before running it: "cannot use serializable mode
// in a hot standby", from a database, role or DSN default isolation level
// that BEGIN alone does not apply.
func (t *tx) refused(err error) bool {
	return t.onReplica && !t.ran && isRefusal(err)
}

// moveToPrimary ends the replica's transaction, in which nothing ran, and
// begins the same one on the primary, where the statement runs instead.
func (t *tx) moveToPrimary() error {
	t.b.node.markRefused()
	t.cn.fellBackFrom(t.b.node, FallbackRefused)
	t.inner.Rollback()
	cn := t.cn
	if err := cn.checkPrimary(t.ctx); err != nil {
		cn.tx = nil
		return err
	}
	inner, err := cn.primary.conn.(driver.ConnBeginTx).BeginTx(t.ctx, t.opts)
	if err != nil {
		cn.tx = nil
		return err
	}
	cn.primary.txOpen = true
	cn.c.stats.primaryReads.Add(1)
	cn.c.stats.fallbacks.Add(1)
	t.inner, t.b, t.onReplica = inner, cn.primary, false
	return nil
}

// Commit implements driver.Tx. A committed read-write transaction advances
// the watermark; the position query rides behind COMMIT in the same flush.
// Any transaction's end also raises the connection's floor to a position at
// or past what it read (monotonic reads).
func (t *tx) Commit() error {
	return t.end(t.inner.Commit, true)
}

// Rollback implements driver.Tx.
func (t *tx) Rollback() error {
	return t.end(t.inner.Rollback, false)
}

func (t *tx) end(f func() error, commit bool) error {
	cn := t.cn
	cn.tx = nil
	defer cn.releaseFallback() // a read-only transaction that fell back to the primary
	t.b.txOpen = false
	if t.onReplica && !cn.c.cfg.ReadYourWrites {
		err := f()
		if t.tainted {
			cn.dropReplica(t.b)
		}
		return err
	}
	if t.onReplica {
		op := cn.startOp(replicaOp{kind: opEnd, ctx: t.ctx, end: f})
		a := &attempt{ctx: t.ctx, cn: cn, b: t.b, trail: true, op: op}
		a.read()
		err := a.err
		a.finish()
		cn.op = replicaOp{}
		if t.tainted {
			cn.dropReplica(t.b)
		}
		return err
	}
	end := sqlclass.Result{Tx: sqlclass.TxRollback, Reason: "ROLLBACK"}
	if commit {
		end = sqlclass.Result{Tx: sqlclass.TxCommit, Write: t.wrote, Reason: "COMMIT"}
	}
	ws := cn.beforePrimaryCommits(t.ctx, &end, commit && t.wrote)
	err := f()
	cn.afterPrimary(t.ctx, &ws, err)
	return err
}

// afterRows calls done once its rows are closed: an autocommit statement that
// returns rows has committed only when its result is complete.
type afterRows struct {
	driver.Rows
	done func(error)
}

// Close implements driver.Rows.
func (r *afterRows) Close() error {
	err := r.Rows.Close()
	if r.done != nil {
		r.done(err)
		r.done = nil
	}
	return err
}

// The column type methods pass through to the backend's rows when it has them.

// ColumnTypeDatabaseTypeName implements driver.RowsColumnTypeDatabaseTypeName.
func (r *afterRows) ColumnTypeDatabaseTypeName(i int) string {
	if x, ok := r.Rows.(driver.RowsColumnTypeDatabaseTypeName); ok {
		return x.ColumnTypeDatabaseTypeName(i)
	}
	return ""
}

// ColumnTypeLength implements driver.RowsColumnTypeLength.
func (r *afterRows) ColumnTypeLength(i int) (int64, bool) {
	if x, ok := r.Rows.(driver.RowsColumnTypeLength); ok {
		return x.ColumnTypeLength(i)
	}
	return 0, false
}

// ColumnTypePrecisionScale implements driver.RowsColumnTypePrecisionScale.
func (r *afterRows) ColumnTypePrecisionScale(i int) (int64, int64, bool) {
	if x, ok := r.Rows.(driver.RowsColumnTypePrecisionScale); ok {
		return x.ColumnTypePrecisionScale(i)
	}
	return 0, 0, false
}

// ColumnTypeScanType implements driver.RowsColumnTypeScanType.
func (r *afterRows) ColumnTypeScanType(i int) reflect.Type {
	if x, ok := r.Rows.(driver.RowsColumnTypeScanType); ok {
		return x.ColumnTypeScanType(i)
	}
	return reflect.TypeFor[any]()
}

// ColumnTypeNullable implements driver.RowsColumnTypeNullable.
func (r *afterRows) ColumnTypeNullable(i int) (bool, bool) {
	if x, ok := r.Rows.(driver.RowsColumnTypeNullable); ok {
		return x.ColumnTypeNullable(i)
	}
	return false, false
}

var (
	_ driver.Stmt             = (*Stmt)(nil)
	_ driver.StmtExecContext  = (*Stmt)(nil)
	_ driver.StmtQueryContext = (*Stmt)(nil)
	_ driver.Tx               = (*tx)(nil)
	_ driver.Rows             = (*afterRows)(nil)
)
