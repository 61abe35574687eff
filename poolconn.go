package pgryw

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
	"github.com/pgryw/pgryw/internal/sqlclass"
)

// PoolConn is a connection acquired from a Pool, with pgxpool.Conn's
// methods: its statements share one session (its watermark, settings and
// transaction blocks). Release gives it back.
type PoolConn struct {
	res *puddle.Resource[*poolConn]
	p   *Pool
}

func (c *PoolConn) cn() *Conn { return c.res.Value().cn }

// releaser returns c.Release, for rows, results and transactions that give
// the connection back when they end.
func (c *PoolConn) releaser() func() { return c.Release }

// Release gives the connection back to its pool; calls after the first do
// nothing. A connection left in a transaction, or broken, is closed.
func (c *PoolConn) Release() {
	res := c.res
	if res == nil {
		return
	}
	c.res = nil
	p := c.p
	cn := res.Value().cn
	cn.releaseReplicas()
	if !cn.reusable() {
		res.Destroy()
		p.dropped()
		return
	}
	if res.Value().expired() {
		p.lifetimeDestroys.Add(1)
		res.Destroy()
		p.dropped()
		return
	}
	after := p.cfg.AfterRelease
	if after == nil {
		res.Release()
		return
	}
	go func() {
		var keep bool
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cn.underHook(ctx, func(c *pgx.Conn) { keep = after(c) })
		if keep {
			res.Release()
			return
		}
		res.Destroy()
		p.dropped()
	}()
}

// prepareHook runs a PrepareConn (or BeforeAcquire) hook on the primary's
// pgx connection. A reset reset_session left pending runs first: riding in
// front of the next statement, as it would, it would undo what the hook
// set.
func (cn *Conn) prepareHook(ctx context.Context, f func(context.Context, *pgx.Conn) (bool, error)) (ok bool, err error) {
	if err := cn.resetNow(ctx); err != nil {
		return false, err
	}
	cn.underHook(ctx, func(c *pgx.Conn) { ok, err = f(ctx, c) })
	return ok, err
}

// resetNow runs a reset reset_session left pending, with a round trip of
// its own.
func (cn *Conn) resetNow(ctx context.Context) error {
	w := cn.primary
	if !cn.resetPending || w.wire == nil || !w.idle() {
		return nil
	}
	cn.resetPending = false
	_, _, err := w.control(ctx, sqlReset+"; SELECT 1")
	return err
}

// underHook runs f, a pool hook given the primary's pgx connection
// (PrepareConn, BeforeAcquire, AfterRelease), and takes in what it sent
// there, which pgryw did not route: the statements' texts, as the wire
// layer saw them go out, classified as any statement is. A write marks
// the position lost (the next replica read reads one afresh); settings
// (SET, set_config with a literal name, SET ROLE) and other session state
// are read back at once, so that settings follow reads to the replicas
// as the connection's own would; what cannot be known (a statement whose
// text was not seen, such as one prepared outside a hook; set_config with
// a computed name; a function, CALL or DO that may do anything) keeps the
// connection's reads on the primary, as after set_config with a computed
// name, until DISCARD ALL.
func (cn *Conn) underHook(ctx context.Context, f func(*pgx.Conn)) {
	w := cn.primary.wire
	if w == nil || cn.c.plain {
		f(cn.primary.pgx())
		return
	}
	sent := cn.primary.sent()
	w.Record()
	f(cn.primary.pgx())
	texts, unknown := w.Recorded()
	if cn.primary.sent() == sent || cn.primary.closed() {
		return
	}
	const why = "a statement of a pool hook's"
	wrote, state := unknown, unknown
	for _, q := range texts {
		cls := cn.c.classify(ctx, q)
		if cls.State&(sqlclass.StateUntracked|sqlclass.StatePermanent) != 0 || cls.Reason == "CALL" || cls.Reason == "DO" || cn.c.callsVolatile(&cls) {
			unknown = true
		}
		wrote = wrote || cn.c.mayWrite(&cls)
		if touchesState(&cls) {
			cn.track(&cls)
			state = true
		}
	}
	if wrote && cn.c.cfg.ReadYourWrites {
		cn.markLost(ctx, true)
	}
	switch {
	case unknown:
		cn.setPins(cn.pins|pinUntracked|pinUnread, why)
	case state:
		cn.readBackNow(ctx, why)
	}
}

// reusable reports whether cn may go back to the pool: no transaction of
// the front end's or block open, no answer left unread on any of its
// server connections, the primary's open. Rows of a write left open
// (INSERT … RETURNING) may have committed with no position read: the
// session's position is then marked lost, and a later read reads it
// afresh.
func (cn *Conn) reusable() bool {
	p := cn.primary
	if o := cn.open; o.ctx != nil {
		cn.open = openStmt{}
		if o.commits {
			cn.markLost(o.ctx, true) // the Session's too
		}
	}
	if cn.tx != nil || p.closed() || !p.idle() || p.pg.IsBusy() {
		return false
	}
	for _, b := range cn.replicas {
		if b != nil && !b.closed() && (b.pg.IsBusy() || !b.idle()) {
			return false
		}
	}
	return true
}

// Exec runs sql, as pgx's Exec: on a replica when it only reads, else on
// the primary.
func (c *PoolConn) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return c.cn().pgxExec(ctx, sql, args)
}

// Query runs sql, as pgx's Query.
func (c *PoolConn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return c.cn().pgxQuery(ctx, sql, args, nil)
}

// QueryRow runs sql, as pgx's QueryRow.
func (c *PoolConn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return c.cn().pgxQueryRow(ctx, sql, args, nil)
}

// SendBatch sends b, as pgx's SendBatch (see Pool.SendBatch).
func (c *PoolConn) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return c.cn().pgxBatch(ctx, b, nil)
}

// CopyFrom copies rows into a table on the primary, and moves the
// watermark.
func (c *PoolConn) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return c.cn().pgxCopyFrom(ctx, table, columns, src)
}

// Begin begins a transaction, as pgx's Begin.
func (c *PoolConn) Begin(ctx context.Context) (pgx.Tx, error) {
	return c.BeginTx(ctx, pgx.TxOptions{})
}

// BeginTx begins a transaction with options (see Pool.BeginTx).
func (c *PoolConn) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	t, err := c.cn().pgxBegin(ctx, opts)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// Ping checks the primary connection.
func (c *PoolConn) Ping(ctx context.Context) error {
	cn := c.cn()
	if err := cn.pgxStart(ctx); err != nil {
		return err
	}
	if err := cn.checkPrimary(ctx); err != nil {
		return cn.pgxError(err)
	}
	return cn.primary.pgx().Ping(ctx)
}

// Conn returns the primary's pgx connection. Statements sent through it
// directly are not routed and do not move the watermark: use RunOnPrimary
// for writes. A primary connection that the server ended while the
// PoolConn's reads ran on replicas (its idle_session_timeout) is replaced
// first, as before any statement pgryw sends (docs/guarantees.md, Idle
// sessions); if it cannot be, the connection returned is the ended one,
// whose first use fails as pgx's would.
func (c *PoolConn) Conn() *pgx.Conn {
	cn := c.cn()
	if cn.tx == nil {
		_ = cn.checkPrimary(context.Background()) // (on failure the ended connection is returned: see above)
	}
	return cn.primary.pgx()
}

// RunOnPrimary runs f with the primary's pgx connection, and then counts
// whatever f did as a write (see Conn.RunOnPrimary).
func (c *PoolConn) RunOnPrimary(ctx context.Context, f func(*pgx.Conn) error) error {
	cn := c.cn()
	return cn.pgxError(cn.RunOnPrimary(ctx, f))
}
