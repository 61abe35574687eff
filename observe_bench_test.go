package pgryw

import (
	"context"
	"database/sql/driver"
	"io"
	"testing"
)

// nopConn is a server connection that answers every statement at once
// without allocating, so that a benchmark through Conn measures pgryw's
// own work: classification, routing, and reporting where it ran.
type nopConn struct{}

func (nopConn) Prepare(string) (driver.Stmt, error) { return nil, driver.ErrSkip }
func (nopConn) Close() error                        { return nil }
func (nopConn) Begin() (driver.Tx, error)           { return nil, driver.ErrSkip }
func (nopConn) ExecContext(context.Context, string, []driver.NamedValue) (driver.Result, error) {
	return driver.RowsAffected(1), nil
}
func (nopConn) QueryContext(context.Context, string, []driver.NamedValue) (driver.Rows, error) {
	return nopRows{}, nil
}

type nopRows struct{}

func (nopRows) Columns() []string         { return nil }
func (nopRows) Close() error              { return nil }
func (nopRows) Next([]driver.Value) error { return io.EOF }

// nopConnection is a Conn of a connector with read_your_writes=off and two
// replicas whose server connections are nopConns, with no monitor or
// catalog worker.
func nopConnection(tb testing.TB) *Conn {
	tb.Helper()
	cfg, err := ParseDSN("host=w.invalid read_your_writes=off replicas=r1.invalid,r2.invalid")
	if err != nil {
		tb.Fatal(err)
	}
	c, err := newConnector(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	c.mon.closed, c.noCatalog = true, true
	c.dial = func(context.Context, *node) (driver.Conn, error) { return nopConn{}, nil }
	dc, err := c.Connect(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	return dc.(*Conn)
}

// BenchmarkStatementRouted runs a cached read (to a replica) and a cached
// write (to the primary) through Conn.ExecContext with read_your_writes=off
// against connections that answer at once: pgryw's per-statement cost
// without a server. The sub-benchmarks differ only in what observes the
// statements; "no hook" must allocate no more than before the served-by
// hook existed, and "hooks" no more than "no hook".
func BenchmarkStatementRouted(b *testing.B) {
	cn := nopConnection(b)
	c := cn.c
	read, write := benchStatements[0], benchStatements[3]
	run := func(b *testing.B, ctx context.Context) {
		for _, q := range []string{read, write} {
			if _, err := cn.ExecContext(ctx, q, nil); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			cn.ExecContext(ctx, read, nil)
			cn.ExecContext(ctx, write, nil)
		}
	}
	b.Run("no hook", func(b *testing.B) { run(b, context.Background()) })
	b.Run("hooks", func(b *testing.B) {
		var n int
		c.SetServedBy(func(context.Context, ServedBy) { n++ })
		defer c.SetServedBy(nil)
		run(b, WithServedBy(context.Background(), func(_ context.Context, s ServedBy) { n += int(s.Route) }))
	})
}

// A cached read routed to a replica, by Exec and by Query, and a cached
// write on the primary by Exec allocate nothing of pgryw's own: the plan,
// the executor's state and the attempt stay on the stack. (A write by
// Query allocates the wrapper that settles it when its rows are closed.)
func TestStatementRoutedAllocs(t *testing.T) {
	cn := nopConnection(t)
	c := cn.c
	ctx := context.Background()
	read, write := benchStatements[0], benchStatements[3]
	run := func() {
		for _, q := range []string{read, write} {
			if _, err := cn.ExecContext(ctx, q, nil); err != nil {
				t.Fatal(err)
			}
		}
		rows, err := cn.QueryContext(ctx, read, nil)
		if err != nil {
			t.Fatal(err)
		}
		rows.Close()
	}
	run()
	if st := c.Stats(); st.ReplicaReads != 2 {
		t.Fatalf("%d reads reached a replica, want 2", st.ReplicaReads)
	}
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Errorf("%v allocations per two reads and a write", n)
	}
}
