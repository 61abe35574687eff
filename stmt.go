package pgryw

import (
	"context"
	"database/sql/driver"
)

// Stmt is a prepared statement: prepared on the server connection where
// Conn.PrepareContext made it, as pgx prepares it (pgx keeps one
// server-side statement per connection and text): the primary, and inside
// a read-only transaction on a replica that replica too. The node that
// runs it is chosen at each execution, like any other statement: on a
// connection that prepared it, it runs through the prepared statement;
// elsewhere, as its text.
type Stmt struct {
	cn    *Conn
	query string
	preps []prepared // the first one's answers NumInput
}

// prepared is a statement prepared on one server connection.
type prepared struct {
	on *backend
	ps driver.Stmt // pgx's statement there
}

// via returns the statement prepared on b, if any.
func (s *Stmt) via(b *backend) driver.Stmt {
	if s == nil {
		return nil
	}
	for _, p := range s.preps {
		if p.on == b {
			return p.ps
		}
	}
	return nil
}

// Close implements driver.Stmt: the server-side prepared statements are
// released as pgx does, on the connections that still live.
func (s *Stmt) Close() error {
	var first error
	for _, p := range s.preps {
		if !p.on.closed() {
			if err := p.ps.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// NumInput implements driver.Stmt: the parameters the server described.
func (s *Stmt) NumInput() int { return s.preps[0].ps.NumInput() }

// Exec implements driver.Stmt.
func (s *Stmt) Exec(args []driver.Value) (driver.Result, error) {
	return s.cn.exec(context.Background(), s.query, named(args), s)
}

// Query implements driver.Stmt.
func (s *Stmt) Query(args []driver.Value) (driver.Rows, error) {
	return s.cn.query(context.Background(), s.query, named(args), s)
}

// ExecContext implements driver.StmtExecContext.
func (s *Stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return s.cn.exec(ctx, s.query, args, s)
}

// QueryContext implements driver.StmtQueryContext.
func (s *Stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	return s.cn.query(ctx, s.query, args, s)
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

// The column type methods pass through to the backend's rows when it has them.

var (
	_ driver.Stmt             = (*Stmt)(nil)
	_ driver.StmtExecContext  = (*Stmt)(nil)
	_ driver.StmtQueryContext = (*Stmt)(nil)
	_ driver.Tx               = (*tx)(nil)
	_ driver.Rows             = (*afterRows)(nil)
)
