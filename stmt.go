package pgryw

import (
	"context"
	"database/sql/driver"
)

// stmt is a prepared statement: prepared on the server connection where
// Conn.PrepareContext made it, as pgx prepares it (pgx keeps one
// server-side statement per connection and text): the primary, and inside
// a read-only transaction on a replica that replica too. The node that
// runs it is chosen at each execution, like any other statement: on a
// connection that prepared it, it runs through the prepared statement;
// elsewhere, as its text.
type stmt struct {
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
func (s *stmt) via(b *backend) driver.Stmt {
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
func (s *stmt) Close() error {
	var first error
	for _, p := range s.preps {
		if p.on.node.index >= 0 {
			p.on.preps-- // a replica's: it may be lent again once none is left
		}
		if !p.on.closed() {
			if err := p.ps.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// NumInput implements driver.Stmt: the parameters the server described.
func (s *stmt) NumInput() int { return s.preps[0].ps.NumInput() }

// Exec implements driver.Stmt.
func (s *stmt) Exec(args []driver.Value) (driver.Result, error) {
	return s.cn.exec(context.Background(), s.query, named(args), s)
}

// Query implements driver.Stmt.
func (s *stmt) Query(args []driver.Value) (driver.Rows, error) {
	return s.cn.query(context.Background(), s.query, named(args), s)
}

// ExecContext implements driver.StmtExecContext.
func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return s.cn.exec(ctx, s.query, args, s)
}

// QueryContext implements driver.StmtQueryContext.
func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	return s.cn.query(ctx, s.query, args, s)
}

// CheckNamedValue implements driver.NamedValueChecker, like Conn's.
func (s *stmt) CheckNamedValue(*driver.NamedValue) error { return nil }

func named(args []driver.Value) []driver.NamedValue {
	nv := make([]driver.NamedValue, len(args))
	for i, v := range args {
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return nv
}

// The column type methods pass through to the backend's rows when it has them.

var (
	_ driver.Stmt             = (*stmt)(nil)
	_ driver.StmtExecContext  = (*stmt)(nil)
	_ driver.StmtQueryContext = (*stmt)(nil)
	_ driver.Tx               = (*tx)(nil)
	_ driver.Rows             = (*afterRows)(nil)
)
