package pgryw

// Routing tests: scripted servers (fakecluster_test.go) stand for the
// primary and the replicas, and each test states which node receives which
// statement (session state, hints, a replica's refusal, an unreachable
// replica). What pgryw sends in one flush, and what it strips, is
// protocol_test.go's. Query text is matched exactly.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

const (
	insertSQL = "INSERT INTO t (v) VALUES ($1)"
	selectSQL = "SELECT v FROM t WHERE id = $1"
)

func readOne(t *testing.T, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (int, error) {
	t.Helper()
	var v int
	err := q.QueryRowContext(context.Background(), selectSQL, int64(7)).Scan(&v)
	return v, err
}

// A setting is read back behind the SET and follows the connection's
// reads to the replica; state that lives on the session (an advisory lock)
// keeps its reads on the primary.
func TestSessionStateRouting(t *testing.T) {
	mc := newFakeCluster(t, 1, "")
	mc.primary.ExpectExec("SET search_path = app")
	mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	mc.primary.ExpectExec("SELECT pg_advisory_lock(1)")
	mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	if _, err := mc.db.Exec("SET search_path = app"); err != nil {
		t.Fatal(err)
	}
	if _, err := readOne(t, mc.db); err != nil {
		t.Fatal(err)
	}
	if _, err := mc.db.Exec("SELECT pg_advisory_lock(1)"); err != nil {
		t.Fatal(err)
	}
	if _, err := readOne(t, mc.db); err != nil {
		t.Fatal(err)
	}
	mc.verify(t)
}

func TestHints(t *testing.T) {
	mc := newFakeCluster(t, 1, "")
	q := selectSQL + " /* pgryw:primary */"
	mc.primary.ExpectQuery(q).WithArgs(7).WillReturnRows(valueRow(1))
	mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	var v int
	if err := mc.db.QueryRow(q, int64(7)).Scan(&v); err != nil {
		t.Fatal(err)
	}
	if _, err := readOne(t, withPrimaryDB{mc.db}); err != nil {
		t.Fatal(err)
	}
	_, err := mc.db.Exec("/* pgryw:replica */ DELETE FROM t")
	if !errors.Is(err, ErrReplicaHint) {
		t.Fatalf("got %v", err)
	}
	mc.verify(t)
}

type withPrimaryDB struct{ db *sql.DB }

func (w withPrimaryDB) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return w.db.QueryRowContext(WithPrimary(ctx), q, args...)
}

func TestReplicaRefusalLearnsWrite(t *testing.T) {
	mc := newFakeCluster(t, 1, "read_functions=audit_touch")
	q := "SELECT audit_touch($1)"
	mc.replicas[0].ExpectQuery(q).WithArgs(7).WillReturnError(pgError("25006"))
	mc.primary.ExpectQuery(q).WithArgs(7).WillReturnRows(valueRow(1))
	mc.primary.ExpectQuery(q).WithArgs(7).WillReturnRows(valueRow(1))
	for i := 0; i < 2; i++ {
		var v int
		if err := mc.db.QueryRow(q, int64(7)).Scan(&v); err != nil {
			t.Fatal(err)
		}
	}
	mc.verify(t)
}

func TestUnreachableReplicaFallsBack(t *testing.T) {
	mc := newFakeCluster(t, 1, "")
	mc.c.dial = func(orig func(context.Context, *node, dialFor) (driver.Conn, error)) func(context.Context, *node, dialFor) (driver.Conn, error) {
		return func(ctx context.Context, n *node, why dialFor) (driver.Conn, error) {
			if n.index >= 0 {
				return nil, errors.New("dial tcp: connection refused")
			}
			return orig(ctx, n, why)
		}
	}(mc.c.dial)
	mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	if _, err := readOne(t, mc.db); err != nil {
		t.Fatal(err)
	}
	mc.verify(t)
	if s := mc.c.Stats(); s.Fallbacks != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func pgError(code string) error {
	return &pgconn.PgError{Severity: "ERROR", Code: code, Message: "cannot execute in a read-only transaction"}
}

func TestWithReplicaContext(t *testing.T) {
	mc := newFakeCluster(t, 1, "")
	ctx := WithReplica(context.Background())
	conn, err := mc.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	mc.primary.ExpectExec("SET search_path = app")
	mc.replicas[0].ExpectQuery(selectSQL).WithArgs(int64(7)).WillReturnRows(valueRow(1))
	if _, err := conn.ExecContext(context.Background(), "SET search_path = app"); err != nil {
		t.Fatal(err)
	}
	// Pinned by SET, but the context asks for a replica.
	var v int
	if err := conn.QueryRowContext(ctx, selectSQL, int64(7)).Scan(&v); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "DELETE FROM t"); !errors.Is(err, ErrReplicaHint) {
		t.Fatalf("write with WithReplica: %v", err)
	}
	mc.verify(t)
}
