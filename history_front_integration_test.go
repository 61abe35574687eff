package pgryw_test

// The history checker's sessions run on either front end: database/sql's
// (*sql.Conn, *sql.Tx, *sql.DB) or pgx's (*pgryw.PoolConn, pgx.Tx,
// *pgryw.Pool), through these adapters.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgryw/pgryw"
)

// histQ is what the checker runs statements on.
type histQ interface {
	exec(ctx context.Context, q string, args ...any) error
	query(ctx context.Context, q string, args ...any) (histRows, error)
	queryRow(ctx context.Context, q string, args ...any) histRow
}

// histRows are rows, database/sql's or pgx's.
type histRows interface {
	Next() bool
	Scan(...any) error
	Err() error
	Close()
}

// histRow is one row, database/sql's or pgx's.
type histRow interface{ Scan(...any) error }

// histConn is a session's connection.
type histConn interface {
	histQ
	// batchRead reads q (of one key) for each of keys: pgx's front end in
	// one batch, database/sql's one by one; each is given its row.
	batchRead(ctx context.Context, q string, keys []int, each func(i int, r histRow) error) error
	// batchExec runs q: pgx's front end in a batch (with a read in front
	// of it), database/sql's as one statement.
	batchExec(ctx context.Context, q string, args ...any) error
	begin(ctx context.Context, opts sql.TxOptions) (histTx, error)
	prepare(ctx context.Context, q string) (histStmt, error)
	valid() bool
	drop()  // discard the connection, broken or not
	close() // give it back
}

// histTx is a transaction.
type histTx interface {
	histQ
	commit() error
	rollback() error
}

// histStmt is a prepared statement.
type histStmt interface {
	exec(ctx context.Context, args ...any) error
	queryRow(ctx context.Context, args ...any) histRow
	close()
}

// newConn takes a connection for the session from its pool: pgx's front
// end's in odd slots (when the run has it), database/sql's otherwise.
func (s *histSession) newConn(ctx context.Context) (histConn, error) {
	if s.pool.pgx != nil && s.slot%2 == 1 {
		c, err := s.pool.pgx.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		return &pgxHConn{c: c}, nil
	}
	c, err := s.pool.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	return &sqlHConn{c: c}, nil
}

// poolQ is the session's pool, on the session's front end.
func (s *histSession) poolQ() histQ {
	if s.pool.pgx != nil && s.slot%2 == 1 {
		return pgxHQ{s.pool.pgx}
	}
	return sqlHQ{s.pool.db}
}

// openHistPool opens pgx's front end on a pool's DSN (the same replica
// addresses, pooler mode and keys as its database/sql side).
func openHistPool(t *testing.T, h *histRun, dsn string) *pgryw.Pool {
	pc, err := pgryw.ParsePoolConfig(dsn + "&pool_max_conns=16")
	if err != nil {
		t.Fatal(err)
	}
	pc.Config.ReadFunctions = append(pc.Config.ReadFunctions, nodeProbes...)
	p, err := pgryw.NewPoolWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	pgryw.SetNetHook(p.Connector(), h.wrap)
	t.Cleanup(p.Close)
	return p
}

// database/sql's.

type sqlQuerier interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	QueryRowContext(context.Context, string, ...any) *sql.Row
}

type sqlHQ struct{ q sqlQuerier }

func (q sqlHQ) exec(ctx context.Context, sq string, args ...any) error {
	_, err := q.q.ExecContext(ctx, sq, args...)
	return err
}

func (q sqlHQ) query(ctx context.Context, sq string, args ...any) (histRows, error) {
	rows, err := q.q.QueryContext(ctx, sq, args...)
	if err != nil {
		return nil, err
	}
	return sqlHRows{rows}, nil
}

func (q sqlHQ) queryRow(ctx context.Context, sq string, args ...any) histRow {
	return q.q.QueryRowContext(ctx, sq, args...)
}

type sqlHRows struct{ *sql.Rows }

func (r sqlHRows) Close() { r.Rows.Close() }

type sqlHConn struct{ c *sql.Conn }

func (c *sqlHConn) exec(ctx context.Context, q string, args ...any) error {
	return sqlHQ{c.c}.exec(ctx, q, args...)
}

func (c *sqlHConn) query(ctx context.Context, q string, args ...any) (histRows, error) {
	return sqlHQ{c.c}.query(ctx, q, args...)
}

func (c *sqlHConn) queryRow(ctx context.Context, q string, args ...any) histRow {
	return c.c.QueryRowContext(ctx, q, args...)
}

func (c *sqlHConn) batchRead(ctx context.Context, q string, keys []int, each func(int, histRow) error) error {
	for i, k := range keys {
		if err := each(i, c.c.QueryRowContext(ctx, q, k)); err != nil {
			return err
		}
	}
	return nil
}

func (c *sqlHConn) batchExec(ctx context.Context, q string, args ...any) error {
	return c.exec(ctx, q, args...)
}

func (c *sqlHConn) begin(ctx context.Context, opts sql.TxOptions) (histTx, error) {
	tx, err := c.c.BeginTx(ctx, &opts)
	if err != nil {
		return nil, err
	}
	return sqlHTx{sqlHQ{tx}, tx}, nil
}

func (c *sqlHConn) prepare(ctx context.Context, q string) (histStmt, error) {
	st, err := c.c.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	return sqlHStmt{st}, nil
}

func (c *sqlHConn) valid() bool {
	ok := true
	err := c.c.Raw(func(dc any) error {
		if v, isV := dc.(driver.Validator); isV && !v.IsValid() {
			ok = false
		}
		return nil
	})
	return ok && err == nil
}

func (c *sqlHConn) drop() {
	c.c.Raw(func(any) error { return driver.ErrBadConn })
	c.c.Close()
}

func (c *sqlHConn) close() { c.c.Close() }

type sqlHTx struct {
	sqlHQ
	tx *sql.Tx
}

func (t sqlHTx) commit() error   { return t.tx.Commit() }
func (t sqlHTx) rollback() error { return t.tx.Rollback() }

type sqlHStmt struct{ st *sql.Stmt }

func (s sqlHStmt) exec(ctx context.Context, args ...any) error {
	_, err := s.st.ExecContext(ctx, args...)
	return err
}

func (s sqlHStmt) queryRow(ctx context.Context, args ...any) histRow {
	return s.st.QueryRowContext(ctx, args...)
}

func (s sqlHStmt) close() { s.st.Close() }

// pgx's.

type pgxQuerier interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}

type pgxHQ struct{ q pgxQuerier }

func (q pgxHQ) exec(ctx context.Context, sq string, args ...any) error {
	_, err := q.q.Exec(ctx, sq, args...)
	return err
}

func (q pgxHQ) query(ctx context.Context, sq string, args ...any) (histRows, error) {
	rows, err := q.q.Query(ctx, sq, args...)
	if err != nil {
		return nil, err
	}
	return rows, nil
}

func (q pgxHQ) queryRow(ctx context.Context, sq string, args ...any) histRow {
	return q.q.QueryRow(ctx, sq, args...)
}

type pgxHConn struct{ c *pgryw.PoolConn }

var pgxHNames atomic.Int64

func (c *pgxHConn) exec(ctx context.Context, q string, args ...any) error {
	return pgxHQ{c.c}.exec(ctx, q, args...)
}

func (c *pgxHConn) query(ctx context.Context, q string, args ...any) (histRows, error) {
	return pgxHQ{c.c}.query(ctx, q, args...)
}

func (c *pgxHConn) queryRow(ctx context.Context, q string, args ...any) histRow {
	return c.c.QueryRow(ctx, q, args...)
}

func (c *pgxHConn) batchRead(ctx context.Context, q string, keys []int, each func(int, histRow) error) error {
	b := &pgx.Batch{}
	for i, k := range keys {
		b.Queue(q, k).QueryRow(func(r pgx.Row) error { return each(i, r) })
	}
	return c.c.SendBatch(ctx, b).Close()
}

func (c *pgxHConn) batchExec(ctx context.Context, q string, args ...any) error {
	b := &pgx.Batch{}
	b.Queue("SELECT 1")
	b.Queue(q, args...)
	return c.c.SendBatch(ctx, b).Close()
}

// begin begins a transaction as pgx's users do: the context bounds the
// BEGIN; its statements, and the commit, take the op's.
func (c *pgxHConn) begin(ctx context.Context, opts sql.TxOptions) (histTx, error) {
	tx, err := c.c.BeginTx(ctx, tpPgxOptions(opts))
	if err != nil {
		return nil, err
	}
	return pgxHTx{pgxHQ{tx}, tx, ctx}, nil
}

// prepare prepares q on the connection under a name of its own, as a pgx
// program does with Conn().Prepare, and runs it by that name.
func (c *pgxHConn) prepare(ctx context.Context, q string) (histStmt, error) {
	name := fmt.Sprintf("hist_st_%d", pgxHNames.Add(1))
	if _, err := c.c.Conn().Prepare(ctx, name, q); err != nil {
		return nil, err
	}
	return pgxHStmt{c.c, name}, nil
}

func (c *pgxHConn) valid() bool { return !c.c.Conn().IsClosed() }

func (c *pgxHConn) drop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c.c.Conn().Close(ctx)
	c.c.Release() // a closed primary connection: the pool destroys it
}

func (c *pgxHConn) close() { c.c.Release() }

type pgxHTx struct {
	pgxHQ
	tx  pgx.Tx
	ctx context.Context
}

func (t pgxHTx) commit() error { return t.tx.Commit(t.ctx) }

func (t pgxHTx) rollback() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return t.tx.Rollback(ctx)
}

type pgxHStmt struct {
	c    *pgryw.PoolConn
	name string
}

func (s pgxHStmt) exec(ctx context.Context, args ...any) error {
	_, err := s.c.Exec(ctx, s.name, args...)
	return err
}

func (s pgxHStmt) queryRow(ctx context.Context, args ...any) histRow {
	return s.c.QueryRow(ctx, s.name, args...)
}

func (s pgxHStmt) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.c.Conn().Deallocate(ctx, s.name)
}
