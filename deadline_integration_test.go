package pgryw_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
)

// A read whose caller's deadline is shorter than wait_timeout, on replicas
// behind by more than that deadline and whose lag pgryw has not learned
// yet (a connector of its own per read): on_timeout=primary promises a
// primary read, and pgx on the primary answers in about a millisecond. The
// wait must give up early enough to leave the fallback time to run: no
// context deadline exceeded, no driver.ErrBadConn, the session's own row.
// Before the fix, the wait took the whole deadline and the read failed
// (context deadline exceeded; driver: bad connection on a sql.Conn).
func TestIntegrationDeadlineShorterThanWait(t *testing.T) {
	setDelay(t, 1500*time.Millisecond)
	table := newTable(t)
	ctx := context.Background()
	const deadline = 150 * time.Millisecond
	var id int64
	type reader func(t *testing.T, ctx context.Context, id int64) (int, error)
	fronts := []struct {
		name string
		open func(t *testing.T) (write func(int64) error, read reader)
	}{
		{"sql.DB", func(t *testing.T) (func(int64) error, reader) {
			db, _ := openDB(t, "wait_timeout=2s")
			return func(id int64) error { return insertRow(ctx, db, table, id) },
				func(t *testing.T, ctx context.Context, id int64) (int, error) { return readRow(ctx, db, table, id) }
		}},
		{"sql.Conn", func(t *testing.T) (func(int64) error, reader) {
			db, _ := openDB(t, "wait_timeout=2s")
			conn := oneConn(t, db)
			return func(id int64) error { return insertRow(ctx, conn, table, id) },
				func(t *testing.T, ctx context.Context, id int64) (int, error) { return readRow(ctx, conn, table, id) }
		}},
		{"sql.Conn/session_scope=conn", func(t *testing.T) (func(int64) error, reader) {
			db, _ := openDB(t, "wait_timeout=2s&session_scope=conn")
			conn := oneConn(t, db)
			return func(id int64) error { return insertRow(ctx, conn, table, id) },
				func(t *testing.T, ctx context.Context, id int64) (int, error) { return readRow(ctx, conn, table, id) }
		}},
		{"Pool", func(t *testing.T) (func(int64) error, reader) {
			p := openPool(t, "wait_timeout=2s")
			return func(id int64) error {
					_, err := p.Exec(ctx, "INSERT INTO "+table+" VALUES ($1, 1)", id)
					return err
				}, func(t *testing.T, ctx context.Context, id int64) (int, error) {
					var n int
					err := p.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE id = $1", id).Scan(&n)
					return n, err
				}
		}},
	}
	for _, f := range fronts {
		t.Run(f.name, func(t *testing.T) {
			for i := 0; i < 3; i++ {
				write, read := f.open(t) // a fresh connector: no lag learned
				id++
				if err := write(id); err != nil {
					t.Fatal(err)
				}
				var served pgryw.ServedBy
				rctx := pgryw.WithServedBy(ctx, func(_ context.Context, s pgryw.ServedBy) { served = s })
				rctx, cancel := context.WithTimeout(rctx, deadline)
				start := time.Now()
				n, err := read(t, rctx, id)
				took := time.Since(start)
				cancel()
				if err != nil {
					t.Fatalf("read %d with a %v deadline (wait_timeout=2s, on_timeout=primary): %v after %v", i, deadline, err, took)
				}
				if n != 1 {
					t.Fatalf("read %d: the session's own row is missing (served %+v)", i, served)
				}
				if served.Role != pgryw.RolePrimary || served.Fallback != pgryw.FallbackBehind {
					t.Errorf("read %d: served %+v, want the primary with FallbackBehind", i, served)
				}
			}
		})
	}
}

// execer is what *sql.DB and *sql.Conn share for a write and a read.
type execer interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
	QueryRowContext(context.Context, string, ...any) *sql.Row
}

func insertRow(ctx context.Context, q execer, table string, id int64) error {
	_, err := q.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s VALUES ($1, 1)", table), id)
	return err
}

func readRow(ctx context.Context, q execer, table string, id int64) (int, error) {
	var n int
	err := q.QueryRowContext(ctx, fmt.Sprintf("SELECT count(*) FROM %s WHERE id = $1", table), id).Scan(&n)
	return n, err
}
