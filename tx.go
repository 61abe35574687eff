package pgryw

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgryw/pgryw/internal/lsn"
	"github.com/pgryw/pgryw/internal/sqlclass"
)

// tx is a database/sql transaction. A read-write transaction runs wholly on
// the primary; a read-only one may run wholly on a replica that was made to
// catch up before BEGIN (a snapshot taken after BEGIN under REPEATABLE READ
// would otherwise be older than the watermark).
type tx struct {
	cn        *Conn
	b         *backend
	inner     txInner
	ctx       context.Context
	onReplica bool
	wrote     bool // a statement that may write ran: the commit moves the watermark
	// opts are the transaction's options as routing reads them; begin is
	// the op that opened it, to open it again on the primary (toPrimary).
	opts  driver.TxOptions
	begin stmtOp
	ran   bool // a statement ran in it
	// snapped: a statement that took a snapshot ran in it (takesSnapshot;
	// or a query was prepared in it): under REPEATABLE READ its snapshot
	// is taken.
	snapped bool
	tainted bool // on a replica: a statement in it may have changed session state
	// local: on a replica, the statements run so far whose effects last
	// the transaction (SET LOCAL, savepoints, cursors), in order: run again
	// on the primary if the rest of the transaction moves there.
	local []replayed
	// aborted: on a replica, a statement failed and no ROLLBACK TO has
	// run since: the transaction only answers "aborted" now, wherever.
	aborted bool
	// checked: on a replica, the watermark it was known to have replayed
	// when the transaction began (or found to be enough since).
	checked lsn.LSN
	// iso: the transaction's isolation level as the server reports it,
	// once asked ("" until then).
	iso string
}

// behind reports that the session's watermark has risen, since a read-only
// transaction began on its replica, in a way its next statement would see
// on the primary alone: before its first statement that takes a snapshot
// (the transaction's, under REPEATABLE READ), or under READ COMMITTED,
// where each statement sees what committed before it. Nothing waits inside the transaction (its session
// holds locks after its first statement: a wait or a poll there could
// stall the replica's replay, and PostgreSQL 19 refuses such a wait), so
// the rest of the transaction moves to the primary instead. Under
// REPEATABLE READ or SERIALIZABLE, once the snapshot is taken, it is older
// than the write on any node, and nothing changes.
func (t *tx) behind(ctx context.Context) bool {
	if !t.onReplica || t.aborted || !t.cn.c.cfg.ReadYourWrites {
		return false
	}
	wm, err := t.cn.watermark(ctx)
	if err != nil {
		return true // only the primary has everything now
	}
	if wm <= t.checked {
		return false
	}
	if t.snapped && !t.readCommitted(ctx) {
		t.checked = wm
		return false
	}
	return true
}

// readCommitted reports whether the transaction runs at READ COMMITTED (or
// READ UNCOMMITTED, which is the same in PostgreSQL): from its options, or
// for the default level, from the server, asked once (SHOW takes no
// snapshot and no lock).
func (t *tx) readCommitted(ctx context.Context) bool {
	switch sql.IsolationLevel(t.opts.Isolation) {
	case sql.LevelReadCommitted, sql.LevelReadUncommitted:
		return true
	case sql.LevelDefault:
	default:
		return false
	}
	if t.iso == "" {
		row, _, err := t.b.control(ctx, "SHOW transaction_isolation")
		if err != nil || len(row) != 1 {
			return true // when in doubt, the primary
		}
		t.iso = row[0]
	}
	return t.iso == "read committed" || t.iso == "read uncommitted"
}

// replayed is a statement to run again when a transaction moves.
type replayed struct {
	query string
	args  []driver.NamedValue
	pargs []any
	pgx   bool       // pgx's front end ran it
	batch *pgx.Batch // a batch of pgx's
}

// replay runs r on b, within ctx.
func (r *replayed) replay(ctx context.Context, b *backend) error {
	switch {
	case r.batch != nil:
		// A batch is sent once (pgx keeps what it learned of each
		// statement in it): the same statements, in a new one.
		nb := &pgx.Batch{}
		for _, q := range r.batch.QueuedQueries {
			nb.Queue(q.SQL, q.Arguments...)
		}
		return b.pgx().SendBatch(ctx, nb).Close()
	case r.pgx:
		_, err := b.pgx().Exec(ctx, r.query, r.pargs...)
		return err
	}
	_, err := b.exec(ctx, r.query, r.args)
	return err
}

// needsPrimary reports that a statement in a read-only transaction on a
// replica must run on the primary: it reads node identity or node-local
// state, changes session state that outlives the transaction (a session
// SET, an advisory lock, LISTEN, PREPARE, a cursor WITH HOLD, a temporary
// table), or is not known to be a read (a write is refused by the
// primary's read-only transaction as pgx would see it; a volatile function
// may change the session). Statements whose effects end with the
// transaction stay.
func (t *tx) needsPrimary(cls *sqlclass.Result) bool {
	switch {
	case !t.onReplica || t.aborted:
		return false
	case cls.Node:
		return true
	case cls.TxLocal:
		return false
	}
	return cls.Pin || !t.cn.c.readOnly(cls)
}

// toPrimary moves the rest of a read-only transaction from its replica to
// the primary, before a statement that needsPrimary: the same transaction
// begins there and the statements whose effects last the transaction run
// again, so the moved statement sees what it would have seen. The replica's
// transaction ends. Under REPEATABLE READ the statements from here on see
// the primary's snapshot, taken now (docs/guarantees.md lists this).
func (t *tx) toPrimary() error {
	// Whether the replica's snapshot is left behind (Stats.SnapshotMoves):
	// the isolation level is asked there while its transaction can
	// answer, else of the primary's.
	held := t.snapped && !t.aborted && !t.readCommitted(t.ctx)
	if err := t.reopenOnPrimary(); err != nil {
		return err
	}
	if held || t.snapped && t.aborted && !t.readCommitted(t.ctx) {
		t.cn.c.stats.snapshotMoves.Add(1)
	}
	for i := range t.local {
		if err := t.local[i].replay(t.ctx, t.b); err != nil {
			return err
		}
	}
	t.local = nil
	return nil
}

// BeginTx implements driver.ConnBeginTx.
func (cn *Conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if cn.c.plain {
		if err := cn.settlePending(ctx, false); err != nil {
			return nil, err
		}
		t, err := cn.primary.conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
		cn.servedPlain(ctx, true)
		return t, err
	}
	t, err := cn.begin(ctx, opts, stmtOp{kind: opBegin, ctx: ctx, opts: opts})
	if err != nil {
		return nil, err
	}
	return t, nil
}

// begin opens a transaction with begin (opBegin or opPgxBegin), whose
// options routing reads as opts: a read-only one on a replica that has
// replayed the session's watermark, else on the primary.
func (cn *Conn) begin(ctx context.Context, opts driver.TxOptions, begin stmtOp) (*tx, error) {
	if err := cn.settlePending(ctx, false); err != nil {
		return nil, err
	}
	cn.obs = stmtObs{}
	p := cn.planForBegin(ctx, opts)
	if p.target == targetReplica {
		// BEGIN is routed like a read: the replica's check rides in front
		// of it, so the snapshot, taken by the transaction's first
		// statement, is no older than the watermark. A failed check rolls
		// the transaction back before anything ran in it.
		var none sqlclass.Result
		op := cn.startOp(begin)
		onPrimary, _, err := cn.onReplica(ctx, "", &none, &p, false, op)
		inner, on, checked := op.tx, op.on, op.checked
		cn.op = stmtOp{}
		if err != nil {
			return nil, err
		}
		if !onPrimary {
			cn.tx = &tx{cn: cn, b: on, inner: inner, ctx: ctx, onReplica: true, opts: opts, begin: begin, checked: checked}
			return cn.tx, nil
		}
	}
	if err := cn.checkPrimary(ctx); err != nil {
		return nil, err
	}
	reset := cn.armReset()
	op := begin
	err := op.run(cn.primary)
	if reset != nil {
		cn.primary.wire.Disarm()
		cn.settleReset(ctx, reset)
	}
	if cn.endedUnrun(&primaryStmt{idleBefore: true}, err) {
		// The server ended the session for idleness as BEGIN went out:
		// it never ran (see runPrimary).
		if err = cn.replacePrimary(ctx, true); err == nil {
			op = begin
			err = op.run(cn.primary)
		}
	}
	cn.servedBegin(ctx, &p)
	if err != nil {
		cn.releaseFallback()
		return nil, err
	}
	cn.tx = &tx{cn: cn, b: cn.primary, inner: op.tx, ctx: ctx, opts: opts, begin: begin}
	return cn.tx, nil
}

func (t *tx) note(op *stmtOp, cls *sqlclass.Result, err error) {
	query := op.query
	if t.onReplica {
		// Session state taken in a transaction on a replica would outlive
		// it there, unknown to pgryw (needsPrimary keeps it off replicas;
		// a statement it could not see into may still): that replica
		// connection is closed when the transaction ends.
		t.tainted = t.tainted || touchesState(cls) && !cls.TxLocal
		switch {
		case reachedServer(err, t.b):
			t.aborted = true
		case err != nil:
		case cls.TxLocal:
			if cls.Tx == sqlclass.TxSavepoint && strings.HasPrefix(strings.ToUpper(strings.TrimSpace(query)), "ROLLBACK") {
				t.aborted = false
			}
			if strings.Contains(strings.ToUpper(query), "LOCAL") {
				// SET LOCAL app.x leaves app.x defined, as '', in the
				// session once the transaction ends, where a new session
				// has none: the connection is not lent to another Conn.
				t.b.custom = true
			}
			t.local = append(t.local, replayed{query: query, args: slices.Clone(op.args), pargs: slices.Clone(op.pargs), pgx: op.native(), batch: op.batch})
		}
		return
	}
	t.cn.track(cls)
	if touchesState(cls) {
		// Read back when the transaction ends; until then, it is pinned.
		t.cn.setPins(t.cn.pins|pinUnread, cls.Reason)
	}
	if err == nil && t.cn.c.mayWrite(cls) {
		t.wrote = true
	}
}

// place moves a transaction on a replica to the primary before a statement
// classified as cls, when the statement must run there or would see more
// there (needsPrimary, behind).
func (t *tx) place(ctx context.Context, cls *sqlclass.Result) error {
	if t.needsPrimary(cls) || t.behind(ctx) {
		return t.toPrimary()
	}
	return nil
}

func (t *tx) exec(ctx context.Context, query string, args []driver.NamedValue, st *stmt) (driver.Result, error) {
	op := stmtOp{kind: opExec, ctx: ctx, query: query, args: args, st: st}
	err := t.run(&op)
	return op.res, err
}

func (t *tx) query(ctx context.Context, query string, args []driver.NamedValue, st *stmt) (driver.Rows, error) {
	op := stmtOp{kind: opQuery, ctx: ctx, query: query, args: args, st: st}
	err := t.run(&op)
	return op.rows, err
}

// run runs a statement of the transaction where the transaction is, moving
// it to the primary first when it must (place) or when its replica
// refused the statement before running it (refused).
func (t *tx) run(op *stmtOp) error {
	if op.native() {
		// pgx's BeginTx context bounds the BEGIN alone: what the
		// transaction does for a statement (move to the primary, say) is
		// bounded by the statement's.
		t.ctx = op.ctx
	}
	if t.onReplica && !t.aborted && t.b.pg.TxStatus() == 'E' {
		// An error pgryw did not read (in a result past what a batch's
		// read-ahead holds, say) aborted it on the server.
		t.aborted = true
	}
	cls := t.cn.c.classifyOp(op.ctx, op)
	if t.onReplica && !t.aborted && t.snapped && t.beside(op, &cls) {
		return t.runBeside(op, &cls)
	}
	if err := t.place(op.ctx, &cls); err != nil {
		return err
	}
	err := t.runOn(op)
	if refused, nodeWide := t.refused(err); refused {
		op.discard() // a batch's results, read ahead
		query := op.query
		if op.kind == opPgxBatch {
			query = "" // which of its statements was refused is not known: nothing is learned
		}
		if err = t.retryOnPrimary(query, nodeWide, err); err == nil {
			err = t.runOn(op)
		}
	}
	t.ran = true
	t.snapped = t.snapped || err == nil && t.cn.c.takesSnapshot(op.ctx, op, &cls)
	t.note(op, &cls, err)
	t.served(op.ctx, op.query)
	return err
}

// takesSnapshot reports that op, classified as cls, took the
// transaction's snapshot: anything but an empty string, SHOW, SET LOCAL,
// SET TRANSACTION, SET CONSTRAINTS, FETCH, MOVE, CLOSE and savepoints,
// read from the first statement of a string (a batch's: from each), that
// succeeded (one that failed may have failed before it took one). Where it
// errs it says no: a transaction thought to have no snapshot yet moves to
// the primary when the watermark rises, where one thought to have one
// would stay, and its first read could miss the write.
func (c *Connector) takesSnapshot(ctx context.Context, op *stmtOp, cls *sqlclass.Result) bool {
	if op.kind != opPgxBatch {
		return snapshotStmt(cls)
	}
	for _, q := range op.batch.QueuedQueries {
		if cls := c.classify(ctx, q.SQL); snapshotStmt(&cls) {
			return true
		}
	}
	return false
}

// snapshotStmt is takesSnapshot for one statement string.
func snapshotStmt(cls *sqlclass.Result) bool {
	switch cls.Reason {
	case "empty", "SHOW", "SET LOCAL", "SET TRANSACTION", "SET CONSTRAINTS", "FETCH", "MOVE", "CLOSE":
		// (FETCH and MOVE read a cursor declared in the transaction,
		// whose DECLARE took the snapshot.)
		return false
	}
	return cls.Tx != sqlclass.TxSavepoint
}

// beside reports that op, a statement of a read-only transaction on a
// replica that holds its snapshot, must be answered by the primary and can
// be answered there outside the transaction, as it would be inside it: it
// reads node identity alone, in one of the forms sqlclass.NodeProbe admits
// (SELECT pg_is_in_recovery(), inet_server_port(); SHOW in_hot_standby),
// and nothing run in the transaction so far changes how it reads (SET
// LOCAL, a savepoint, a cursor). Moving the transaction instead would give
// the rest of it the primary's newer snapshot. Batches move it still.
func (t *tx) beside(op *stmtOp, cls *sqlclass.Result) bool {
	switch op.kind {
	case opExec, opQuery, opPgxExec, opPgxQuery:
	default:
		return false
	}
	return cls.Node && len(t.local) == 0 && cls.Hint == sqlclass.HintNone &&
		sqlclass.NodeProbe(op.query) && !t.readCommitted(t.ctx)
}

// besideAbortTimeout bounds the statement that aborts a replica's
// transaction after runBeside's statement failed.
const besideAbortTimeout = 5 * time.Second

// reachedServer reports that err is the answer of a server to a statement
// that was sent, or that the connection failed under it: an error of pgx's
// own before anything was sent (a wrong number of arguments, a connection
// still busy) leaves a transaction as it was.
func reachedServer(err error, b *backend) bool {
	var pe *pgconn.PgError
	return err != nil && (errors.As(err, &pe) || b.closed())
}

// runBeside runs op (beside) on the primary's connection, outside the
// transaction, which stays on its replica with its snapshot. An error (it
// comes with the one row such a statement returns, read before this
// returns) aborts the replica's transaction as the statement's would have
// inside it, with an error pgryw makes there itself: what follows in the
// transaction fails until ROLLBACK TO or its end, as with pgx. An error
// of pgx's own before anything was sent (a context already done) aborts
// nothing (reachedServer): pgx sends nothing then either.
func (t *tx) runBeside(op *stmtOp, cls *sqlclass.Result) error {
	cn := t.cn
	p := plan{target: targetPrimary, route: RouteNodeLocal, read: true}
	op.ahead = op.kind == opPgxQuery
	probe := *cls
	probe.Funcs = nil // built-ins NodeProbe admits, volatile or not: a read
	done, err := cn.runPrimary(op.ctx, probe, &p, op)
	if done != nil {
		done(err) // a read holds nothing open on the primary
	}
	if reachedServer(err, cn.primary) {
		// Within a bound of its own: the caller's context may be what
		// ended the statement.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(op.ctx), besideAbortTimeout)
		t.b.control(ctx, "SELECT 1 OPERATOR(pg_catalog./) 0") //nolint:errcheck // it fails: that is what it is for
		cancel()
		t.aborted = true
	}
	return err
}

// runOn runs op on the transaction's backend. On a replica pgx's Query
// reads its first row first, and a batch's whole answer is read ahead
// (sent as a copy, whose callbacks run from the results that stand): a
// refusal comes with it (refused).
func (t *tx) runOn(op *stmtOp) error {
	op.ahead = (op.kind == opPgxQuery || op.kind == opPgxBatch) && t.onReplica
	if op.kind != opPgxBatch || !op.ahead || t.b.wire == nil {
		return op.run(t.b)
	}
	t.b.wire.Watch()
	op.run(t.b)
	return t.b.peekBatch(op.ctx)
}

// refused reports that the standby refused the first statement of a
// read-only transaction before running it: "cannot use serializable mode
// in a hot standby", from a database, role or DSN default isolation level
// that BEGIN alone does not apply.
//
// Or its first statement is one a standby refuses although the primary
// runs it (a write: 25006; an unlogged table, a WAL function: 0A000,
// 55000): nothing ran either, and the transaction moves the same way, the
// node staying in reads.
//
// After its first statement, such a refusal moves the rest of the
// transaction (toPrimary): the refusal aborted the replica's transaction,
// but nothing of it is needed there any more.
func (t *tx) refused(err error) (refused, nodeWide bool) {
	var e *pgconn.PgError
	if !t.onReplica || !errors.As(err, &e) {
		return false, false
	}
	if refusedByStandby(e) {
		// Refused when the snapshot is taken: a SHOW or SET LOCAL
		// before it ran.
		return !t.snapped, !t.snapped
	}
	return e.Code == sqlstateReadOnly || refusedAsStandby(e) && !isStaleDescription(e), false
}

// retryOnPrimary moves a transaction whose statement its replica refused
// to the primary, learning that the statement (query, unless "") belongs
// there.
func (t *tx) retryOnPrimary(query string, nodeWide bool, err error) error {
	var e *pgconn.PgError
	switch {
	case nodeWide || query == "" || !errors.As(err, &e):
	case e.Code == sqlstateReadOnly:
		t.cn.c.classes.learnWrite(query)
	default:
		t.cn.c.classes.learnPrimary(query, e.Code)
	}
	if !t.ran {
		return t.moveToPrimary(nodeWide)
	}
	return t.toPrimary()
}

// moveToPrimary ends the replica's transaction, in which nothing ran, and
// begins the same one on the primary, where the statement runs instead.
// With nodeWide (the session's defaults cannot run on the node at all) the
// node is left out of reads for a while.
func (t *tx) moveToPrimary(nodeWide bool) error {
	if nodeWide {
		t.b.node.record(eventRefused)
	}
	t.cn.fellBackFrom(t.b.node, FallbackRefused)
	if err := t.reopenOnPrimary(); err != nil {
		return err
	}
	t.cn.c.stats.primaryReads.Add(1)
	t.cn.c.stats.fallbacks.Add(1)
	return nil
}

// reopenOnPrimary ends the transaction on its replica and begins the same
// one on the primary.
func (t *tx) reopenOnPrimary() error {
	cn := t.cn
	t.inner.rollback(t.ctx)
	if t.tainted {
		cn.dropReplica(t.b)
		t.tainted = false
	}
	if err := cn.checkPrimary(t.ctx); err != nil {
		cn.tx = nil
		return err
	}
	op := t.begin
	op.ctx = t.ctx
	if err := op.run(cn.primary); err != nil {
		cn.tx = nil
		return err
	}
	t.inner, t.b, t.onReplica = op.tx, cn.primary, false
	return nil
}

// Commit implements driver.Tx. A committed read-write transaction advances
// the watermark; the position query rides behind COMMIT in the same flush.
// Any transaction's end also raises the connection's floor to a position at
// or past what it read (monotonic reads).
func (t *tx) Commit() error {
	return t.end(func() error { return t.inner.commit(t.ctx) }, true)
}

// Rollback implements driver.Tx.
func (t *tx) Rollback() error {
	return t.end(func() error { return t.inner.rollback(t.ctx) }, false)
}

func (t *tx) end(f func() error, commit bool) error {
	cn := t.cn
	cn.tx = nil
	defer cn.releaseFallback() // a read-only transaction that fell back to the primary
	if t.onReplica && !cn.c.cfg.ReadYourWrites {
		err := f()
		if t.tainted {
			cn.dropReplica(t.b)
		}
		return err
	}
	if t.onReplica {
		op := cn.startOp(stmtOp{kind: opEnd, ctx: t.ctx, end: f})
		a := &attempt{ctx: t.ctx, cn: cn, b: t.b, trail: true, op: op}
		a.read()
		err := a.err
		a.finish()
		cn.op = stmtOp{}
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

// served reports a statement run inside the transaction, on its node.
func (t *tx) served(ctx context.Context, query string) {
	cn := t.cn
	n, role := t.b.node, RoleReplica
	o := &n.obs
	o.statements.Add(1)
	if !t.onReplica {
		role = RolePrimary
		if cls := cn.c.classes.get(query); cn.c.mayWrite(&cls) {
			o.writes.Add(1)
		} else {
			o.reads.Add(1)
		}
	} else {
		o.reads.Add(1)
	}
	cn.report(ctx, n, role, false, RouteTransaction)
}
