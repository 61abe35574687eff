package pgryw

// Routing tests: go-sqlmock connections stand in for the primary and the
// replicas, and each test states the exact statement sequence every node must
// see. Query text is matched exactly.

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
	dsn := "host=primary.invalid user=app password=hunter2 dbname=app " + extra
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

func lsnRow(l string) *sqlmock.Rows {
	return sqlmock.NewRows([]string{"pg_current_wal_insert_lsn", "current_setting"}).AddRow(l, "8192")
}

func pollRow(l string, inRecovery bool) *sqlmock.Rows {
	return sqlmock.NewRows([]string{"pg_last_wal_replay_lsn", "pg_is_in_recovery"}).AddRow(l, inRecovery)
}

func statusRow(s string) *sqlmock.Rows {
	return sqlmock.NewRows([]string{"status"}).AddRow(s)
}

func valueRow(v int) *sqlmock.Rows {
	return sqlmock.NewRows([]string{"v"}).AddRow(v)
}

const (
	insertSQL = "INSERT INTO t (v) VALUES ($1)"
	selectSQL = "SELECT v FROM t WHERE id = $1"
)

// write runs the insert on the primary and expects the capture after it.
func (mc *mockCluster) expectWrite(pos string) {
	mc.primary.ExpectExec(insertSQL).WithArgs(1).WillReturnResult(sqlmock.NewResult(0, 1))
	mc.primary.ExpectQuery(sqlCapture).WillReturnRows(lsnRow(pos))
}

func readOne(t *testing.T, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (int, error) {
	t.Helper()
	var v int
	err := q.QueryRowContext(context.Background(), selectSQL, int64(7)).Scan(&v)
	return v, err
}

func TestReadWithoutWriteSkipsWait(t *testing.T) {
	mc := newMockCluster(t, 1, "")
	mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	if _, err := readOne(t, mc.db); err != nil {
		t.Fatal(err)
	}
	mc.verify(t)
	if s := mc.c.Stats(); s.ReplicaReads != 1 || s.Waits != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestWriteThenReadPolls(t *testing.T) {
	mc := newMockCluster(t, 1, "wait_method=poll")
	mc.expectWrite("0/3000100")
	mc.replicas[0].ExpectQuery(sqlPoll).WillReturnRows(pollRow("0/3000000", true))
	mc.replicas[0].ExpectQuery(sqlPoll).WillReturnRows(pollRow("0/3000100", true))
	mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	// The replica is now known to be caught up: the next read needs no poll.
	mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	if _, err := mc.db.Exec(insertSQL, int64(1)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if _, err := readOne(t, mc.db); err != nil {
			t.Fatal(err)
		}
	}
	mc.verify(t)
}

func TestWaitForStatuses(t *testing.T) {
	waitSQL := "WAIT FOR LSN '0/03000100' WITH (MODE 'standby_replay', TIMEOUT '500ms', NO_THROW)"
	for _, tc := range []struct {
		status    string
		onReplica bool
	}{
		{"success", true},
		{"timeout", false},
		{"not in recovery", false},
	} {
		t.Run(tc.status, func(t *testing.T) {
			mc := newMockCluster(t, 1, "wait_method=wait_for")
			mc.expectWrite("0/3000100")
			mc.replicas[0].ExpectQuery(waitSQL).WillReturnRows(statusRow(tc.status))
			if tc.onReplica {
				mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
			} else {
				mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
			}
			if _, err := mc.db.Exec(insertSQL, int64(1)); err != nil {
				t.Fatal(err)
			}
			if _, err := readOne(t, mc.db); err != nil {
				t.Fatal(err)
			}
			mc.verify(t)
			if tc.status == "not in recovery" && !mc.c.topo.replicas[0].notStandby.Load() {
				t.Fatal("replica not marked as promoted")
			}
		})
	}
}

func TestTimeoutPolicies(t *testing.T) {
	for _, policy := range []string{"primary", "error", "stale"} {
		t.Run(policy, func(t *testing.T) {
			mc := newMockCluster(t, 1, "wait_method=wait_for wait_timeout=20ms on_timeout="+policy)
			mc.expectWrite("0/3000100")
			mc.replicas[0].ExpectQuery("WAIT FOR LSN '0/03000100' WITH (MODE 'standby_replay', TIMEOUT '20ms', NO_THROW)").
				WillReturnRows(statusRow("timeout"))
			switch policy {
			case "primary":
				mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
			case "stale":
				mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(0))
			}
			if _, err := mc.db.Exec(insertSQL, int64(1)); err != nil {
				t.Fatal(err)
			}
			_, err := readOne(t, mc.db)
			if policy == "error" {
				if !errors.Is(err, ErrReplicaBehind) {
					t.Fatalf("got %v, want ErrReplicaBehind", err)
				}
				if !strings.Contains(err.Error(), "0/03000100") || strings.Contains(err.Error(), "hunter2") {
					t.Fatalf("message %q", err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			mc.verify(t)
			s := mc.c.Stats()
			if policy == "stale" && s.StaleReads != 1 || policy == "primary" && s.Fallbacks != 1 || policy == "error" && s.BehindErrors != 1 {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}

func TestPollTimeoutFallsBack(t *testing.T) {
	mc := newMockCluster(t, 1, "wait_method=poll wait_timeout=5ms")
	mc.expectWrite("0/3000100")
	for i := 0; i < 50; i++ {
		mc.replicas[0].ExpectQuery(sqlPoll).WillReturnRows(pollRow("0/3000000", true))
	}
	mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	if _, err := mc.db.Exec(insertSQL, int64(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := readOne(t, mc.db); err != nil {
		t.Fatal(err)
	}
	if err := mc.primary.ExpectationsWereMet(); err != nil {
		t.Fatal(err)
	}
}

// A failed autocommit write whose outcome is unknown (here an error that is
// not the server's) may have committed: its position is read before the
// next replica read, which then waits for it.
func TestFailedWriteCoversItsPosition(t *testing.T) {
	mc := newMockCluster(t, 1, "wait_method=poll")
	mc.primary.ExpectExec(insertSQL).WithArgs(1).WillReturnError(errors.New("boom"))
	mc.primary.ExpectQuery(sqlCapture).WillReturnRows(lsnRow("0/3000100"))
	mc.replicas[0].ExpectQuery(sqlPoll).WillReturnRows(pollRow("0/3000100", true))
	mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	if _, err := mc.db.Exec(insertSQL, int64(1)); err == nil {
		t.Fatal("want error")
	}
	if _, err := readOne(t, mc.db); err != nil {
		t.Fatal(err)
	}
	mc.verify(t)
}

func TestReadYourWritesOff(t *testing.T) {
	mc := newMockCluster(t, 1, "read_your_writes=off")
	mc.primary.ExpectExec(insertSQL).WithArgs(1).WillReturnResult(sqlmock.NewResult(0, 1))
	mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	if _, err := mc.db.Exec(insertSQL, int64(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := readOne(t, mc.db); err != nil {
		t.Fatal(err)
	}
	mc.verify(t)
}

func TestNoReplicasPassesThrough(t *testing.T) {
	mc := newMockCluster(t, 0, "")
	mc.primary.ExpectExec(insertSQL).WithArgs(1).WillReturnResult(sqlmock.NewResult(0, 1))
	mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	if _, err := mc.db.Exec(insertSQL, int64(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := readOne(t, mc.db); err != nil {
		t.Fatal(err)
	}
	mc.verify(t)
}

func TestReadWriteTransaction(t *testing.T) {
	mc := newMockCluster(t, 1, "wait_method=poll")
	mc.primary.ExpectBegin()
	mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	mc.primary.ExpectExec(insertSQL).WithArgs(1).WillReturnResult(sqlmock.NewResult(0, 1))
	mc.primary.ExpectCommit()
	mc.primary.ExpectQuery(sqlCapture).WillReturnRows(lsnRow("0/5000000"))
	// A rolled-back transaction moves nothing.
	mc.primary.ExpectBegin()
	mc.primary.ExpectExec(insertSQL).WithArgs(1).WillReturnResult(sqlmock.NewResult(0, 1))
	mc.primary.ExpectRollback()
	mc.replicas[0].ExpectQuery(sqlPoll).WillReturnRows(pollRow("0/5000000", true))
	mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))

	tx, err := mc.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readOne(t, tx); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(insertSQL, int64(1)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	tx, _ = mc.db.Begin()
	tx.Exec(insertSQL, int64(1))
	tx.Rollback()
	if _, err := readOne(t, mc.db); err != nil {
		t.Fatal(err)
	}
	mc.verify(t)
	if got := mc.c.db.wm.Load().String(); got != "0/05000000" {
		t.Fatalf("watermark %s", got)
	}
}

func TestReadOnlyTransactionWaitsBeforeBegin(t *testing.T) {
	mc := newMockCluster(t, 1, "wait_method=wait_for")
	mc.expectWrite("0/3000100")
	mc.replicas[0].ExpectQuery("WAIT FOR LSN '0/03000100' WITH (MODE 'standby_replay', TIMEOUT '500ms', NO_THROW)").
		WillReturnRows(statusRow("success"))
	mc.replicas[0].ExpectBegin()
	mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	mc.replicas[0].ExpectCommit()
	if _, err := mc.db.Exec(insertSQL, int64(1)); err != nil {
		t.Fatal(err)
	}
	tx, err := mc.db.BeginTx(context.Background(), &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readOne(t, tx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	mc.verify(t)
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
	mc.primary.ExpectQuery(sqlCapture).WillReturnRows(lsnRow("0/6000000"))
	mc.primary.ExpectQuery(q).WithArgs(7).WillReturnRows(valueRow(1))
	mc.primary.ExpectQuery(sqlCapture).WillReturnRows(lsnRow("0/6000010"))
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

func TestExecBeginCommit(t *testing.T) {
	mc := newMockCluster(t, 1, "wait_method=poll")
	// A block that wrote: its COMMIT moves the watermark.
	mc.primary.ExpectExec("BEGIN").WillReturnResult(sqlmock.NewResult(0, 0))
	mc.primary.ExpectExec(insertSQL).WithArgs(int64(1)).WillReturnResult(sqlmock.NewResult(0, 1))
	mc.primary.ExpectQuery(selectSQL).WithArgs(int64(7)).WillReturnRows(valueRow(1)) // inside the block: primary
	mc.primary.ExpectExec("COMMIT").WillReturnResult(sqlmock.NewResult(0, 0))
	mc.primary.ExpectQuery(sqlCapture).WillReturnRows(lsnRow("0/7000000"))
	// A block that only read: its COMMIT moves nothing.
	mc.primary.ExpectExec("BEGIN").WillReturnResult(sqlmock.NewResult(0, 0))
	mc.primary.ExpectQuery(selectSQL).WithArgs(int64(7)).WillReturnRows(valueRow(1))
	mc.primary.ExpectExec("COMMIT").WillReturnResult(sqlmock.NewResult(0, 0))

	ctx := context.Background()
	conn, err := mc.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, step := range []string{"BEGIN", "insert", "read", "COMMIT", "BEGIN", "read", "COMMIT"} {
		switch step {
		case "insert":
			_, err = conn.ExecContext(ctx, insertSQL, int64(1))
		case "read":
			_, err = readOne(t, conn)
		default:
			_, err = conn.ExecContext(ctx, step)
		}
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	mc.verify(t)
	if got := mc.c.db.wm.Load().String(); got != "0/07000000" {
		t.Fatalf("watermark %s", got)
	}
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
