package pgryw

// Routing decision tests: go-sqlmock connections stand in for the primary
// and the replicas, and each test states which node receives which statement
// (pinning, hints, a replica's refusal, an unreachable replica). They decide
// nothing about the wire: what pgryw sends in one flush, and what it strips,
// is tested against a scripted server in protocol_test.go. Query text is
// matched exactly.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/jackc/pgx/v5/pgconn"
)

var mockSeq atomic.Int64

type mockCluster struct {
	c        *Connector
	db       *sql.DB
	primary  sqlmock.Sqlmock
	replicas []sqlmock.Sqlmock
	dials    []int // per node (primary last)
}

// newMockCluster builds a connector whose primary and n replicas are sqlmock
// connections. extra is appended to the DSN.
func newMockCluster(t *testing.T, n int, extra string) *mockCluster {
	t.Helper()
	var addrs []string
	for i := 0; i < n; i++ {
		addrs = append(addrs, fmt.Sprintf("replica%d.invalid:5433", i))
	}
	// Which node receives a statement does not depend on read-your-writes,
	// whose waits and captures are the wire's business (protocol_test.go).
	dsn := "host=primary.invalid user=app password=hunter2 dbname=app read_your_writes=off " + extra
	if n > 0 {
		dsn += " replicas=" + strings.Join(addrs, ",")
	}
	cfg, err := ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	c, err := newConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.mon.closed = true // the monitor would take the mocks' connections
	c.noCatalog = true  // and so would catalog look-ups
	mc := &mockCluster{c: c, dials: make([]int, n+1)}
	conns := make([]driver.Conn, n+1)
	mk := func() (sqlmock.Sqlmock, driver.Conn) {
		name := fmt.Sprintf("pgryw_mock_%d", mockSeq.Add(1))
		db, m, err := sqlmock.NewWithDSN(name, sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
		if err != nil {
			t.Fatal(err)
		}
		dc, err := db.Driver().Open(name)
		if err != nil {
			t.Fatal(err)
		}
		return m, dc
	}
	mc.primary, conns[n] = mk()
	for i := 0; i < n; i++ {
		var m sqlmock.Sqlmock
		m, conns[i] = mk()
		mc.replicas = append(mc.replicas, m)
	}
	c.dial = func(ctx context.Context, nd *node) (driver.Conn, error) {
		i := nd.index
		if i < 0 {
			i = n
		}
		mc.dials[i]++
		if mc.dials[i] > 1 {
			return nil, fmt.Errorf("node %s dialled twice", nd.addr)
		}
		return conns[i], nil
	}
	mc.db = sql.OpenDB(c)
	mc.db.SetMaxOpenConns(1)
	t.Cleanup(func() { mc.db.Close() })
	return mc
}

func (mc *mockCluster) verify(t *testing.T) {
	t.Helper()
	if err := mc.primary.ExpectationsWereMet(); err != nil {
		t.Errorf("primary: %v", err)
	}
	for i, r := range mc.replicas {
		if err := r.ExpectationsWereMet(); err != nil {
			t.Errorf("replica %d: %v", i, err)
		}
	}
}

func valueRow(v int) *sqlmock.Rows {
	return sqlmock.NewRows([]string{"v"}).AddRow(v)
}

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

func TestSessionStatePinsToPrimary(t *testing.T) {
	mc := newMockCluster(t, 1, "")
	mc.primary.ExpectExec("SET search_path = app").WillReturnResult(sqlmock.NewResult(0, 0))
	mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	if _, err := mc.db.Exec("SET search_path = app"); err != nil {
		t.Fatal(err)
	}
	if _, err := readOne(t, mc.db); err != nil {
		t.Fatal(err)
	}
	mc.verify(t)
}

func TestHints(t *testing.T) {
	mc := newMockCluster(t, 1, "")
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
	mc := newMockCluster(t, 1, "read_functions=audit_touch")
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
	mc := newMockCluster(t, 1, "")
	mc.c.dial = func(orig func(context.Context, *node) (driver.Conn, error)) func(context.Context, *node) (driver.Conn, error) {
		return func(ctx context.Context, n *node) (driver.Conn, error) {
			if n.index >= 0 {
				return nil, errors.New("dial tcp: connection refused")
			}
			return orig(ctx, n)
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
	mc := newMockCluster(t, 1, "")
	ctx := WithReplica(context.Background())
	conn, err := mc.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	mc.primary.ExpectExec("SET search_path = app").WillReturnResult(sqlmock.NewResult(0, 0))
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
