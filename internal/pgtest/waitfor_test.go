package pgtest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/pgryw/pgryw/internal/pgtest"
)

// The WAIT FOR emulation, checked rule by rule against a real standby
// through pgx alone: each rule of PostgreSQL 19.0's WAIT FOR that the
// emulation implements gets a case that fires it.

// waitForProxy starts the emulation in front of replica 0.
func waitForProxy(t *testing.T, ctx context.Context) *pgtest.WaitForProxy {
	t.Helper()
	pgtest.Require(t, cluster)
	if err := cluster.InstallWaitFor(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := pgtest.StartWaitForProxy(pgtest.WaitForOptions{Target: cluster.Replicas[0].Addr(), DSN: cluster.ReplicaDSN(0),
		ServerVersion: "19.0 (emulated)", Polls: pgtest.IsReplayPoll})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// behindTarget pauses replica 0's replay and returns a position it has not
// replayed (a write made after the pause); replay resumes with the test.
func behindTarget(t *testing.T, ctx context.Context) string {
	t.Helper()
	if err := cluster.PauseReplay(ctx, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.ResumeReplay(context.Background(), 0); err != nil {
			t.Error(err)
		}
	})
	w := dial(t, ctx, cluster.WriterDSN())
	exec(t, ctx, w, "CREATE TABLE IF NOT EXISTS wf_behind (id int)")
	exec(t, ctx, w, "INSERT INTO wf_behind VALUES (1)")
	var target string
	if err := w.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&target); err != nil {
		t.Fatal(err)
	}
	return target
}

// replayedTarget returns a position replica 0 has replayed.
func replayedTarget(t *testing.T, ctx context.Context) string {
	t.Helper()
	var target string
	if err := dial(t, ctx, cluster.ReplicaDSN(0)).QueryRow(ctx, "SELECT pg_last_wal_replay_lsn()::text").Scan(&target); err != nil {
		t.Fatal(err)
	}
	return target
}

// proxyConn connects through p, in the given exec mode.
func proxyConn(t *testing.T, ctx context.Context, p *pgtest.WaitForProxy, mode pgx.QueryExecMode, params string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig("postgres://postgres@" + p.Addr() + "/postgres?sslmode=disable" + params)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = mode
	// A context's end sends a cancel request (pgx's default closes the
	// connection instead).
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 2 * time.Second}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func waitSQL(target, with string) string {
	if with == "" {
		return fmt.Sprintf("WAIT FOR LSN '%s'", target)
	}
	return fmt.Sprintf("WAIT FOR LSN '%s' WITH (%s)", target, with)
}

// status runs a wait and returns its status row, or its error's SQLSTATE.
func status(ctx context.Context, conn *pgx.Conn, sql string) (string, error) {
	var st string
	err := conn.QueryRow(ctx, sql).Scan(&st)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code, nil
	}
	return st, err
}

var execModes = []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec, pgx.QueryExecModeCacheStatement}

func TestWaitForEmulationRules(t *testing.T) {
	ctx := ctxFor(t)
	p := waitForProxy(t, ctx)
	behind := behindTarget(t, ctx)
	done := replayedTarget(t, ctx)
	for _, mode := range execModes {
		t.Run(mode.String(), func(t *testing.T) {
			conn := proxyConn(t, ctx, p, mode, "")
			if v := conn.PgConn().ParameterStatus("server_version"); !strings.HasPrefix(v, "19.0") {
				t.Fatalf("server_version %q", v)
			}
			cases := []struct{ name, sql, want string }{
				{"replayed", waitSQL(done, "MODE 'standby_replay', TIMEOUT '10ms', NO_THROW"), "success"},
				{"replayed, no options", waitSQL(done, ""), "success"},
				{"timeout row", waitSQL(behind, "TIMEOUT '20ms', NO_THROW"), "timeout"},
				{"timeout error", waitSQL(behind, "TIMEOUT 20"), "57014"},
				{"2^31-1 ms is allowed", waitSQL(done, "TIMEOUT '2147483647'"), "success"},
				{"2^31 ms is refused", waitSQL(behind, "TIMEOUT '2147483648ms', NO_THROW"), "22023"},
				{"a negative timeout is refused", waitSQL(behind, "TIMEOUT '-1', NO_THROW"), "22023"},
				{"1.5 ms rounds to 2", waitSQL(behind, "TIMEOUT '1.5ms', NO_THROW"), "timeout"},
			}
			for _, c := range cases {
				got, err := status(ctx, conn, c.sql)
				if err != nil || got != c.want {
					t.Errorf("%s: %s: got %q, %v; want %q", c.name, c.sql, got, err, c.want)
				}
			}
			// The connection is still in step after every answer.
			var one int
			if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
				t.Fatalf("after the waits: %d, %v", one, err)
			}
		})
	}
	if n := p.Counts(); n.RangeErrors != 2*int64(len(execModes)) || n.Timeouts != 3*int64(len(execModes)) {
		t.Errorf("counts %+v", n)
	}
}

// 0.4 ms rounds to 0, which waits for ever: only a cancel ends it, with
// 57014.
func TestWaitForEmulationRoundsToForever(t *testing.T) {
	ctx := ctxFor(t)
	p := waitForProxy(t, ctx)
	behind := behindTarget(t, ctx)
	conn := proxyConn(t, ctx, p, pgx.QueryExecModeExec, "")
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := conn.Exec(cctx, waitSQL(behind, "TIMEOUT '0.4ms', NO_THROW"))
	if took := time.Since(start); err == nil || took < 250*time.Millisecond {
		t.Fatalf("TIMEOUT '0.4ms' returned after %v: %v (0.4 ms rounds to 0: no timeout)", took, err)
	}
	if n := p.Counts(); n.Cancels != 1 || n.Timeouts != 0 {
		t.Fatalf("counts %+v", n)
	}
}

// A cancel that is pending when the timeout has passed wins: 57014, not a
// 'timeout' row.
func TestWaitForEmulationCancelWinsOverTimeout(t *testing.T) {
	ctx := ctxFor(t)
	p := waitForProxy(t, ctx)
	behind := behindTarget(t, ctx)
	conn := proxyConn(t, ctx, p, pgx.QueryExecModeSimpleProtocol, "")
	// The context ends when the TIMEOUT does: pgx's cancel request races
	// the timeout.
	for i := 0; i < 5; i++ {
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		var st string
		err := conn.QueryRow(cctx, waitSQL(behind, "TIMEOUT '50ms', NO_THROW")).Scan(&st)
		cancel()
		if err == nil && st != "timeout" {
			t.Fatalf("status %q", st)
		}
		if conn.IsClosed() {
			conn = proxyConn(t, ctx, p, pgx.QueryExecModeSimpleProtocol, "")
		}
	}
	// And a cancel sent while the wait runs ends it at once.
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	conn = proxyConn(t, ctx, p, pgx.QueryExecModeSimpleProtocol, "")
	start := time.Now()
	_, err := conn.Exec(cctx, waitSQL(behind, "TIMEOUT '10s', NO_THROW"))
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("cancelled wait: %v after %v", err, time.Since(start))
	}
	if n := p.Counts(); n.Cancels == 0 {
		t.Fatalf("no cancel seen: %+v", n)
	}
}

// The lock rule: a session holding a lock cannot wait for a position not
// yet replayed; one already replayed succeeds; the first statement after
// BEGIN may wait.
func TestWaitForEmulationLockRule(t *testing.T) {
	ctx := ctxFor(t)
	p := waitForProxy(t, ctx)
	w := dial(t, ctx, cluster.WriterDSN())
	exec(t, ctx, w, "CREATE TABLE IF NOT EXISTS wf_lock (id int)")
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	behind := behindTarget(t, ctx)
	done := replayedTarget(t, ctx)
	for _, mode := range execModes {
		t.Run(mode.String(), func(t *testing.T) {
			before := p.Counts()
			conn := proxyConn(t, ctx, p, mode, "")
			// A session advisory lock, taken outside any transaction.
			exec(t, ctx, conn, "SELECT pg_advisory_lock(42)")
			if got, err := status(ctx, conn, waitSQL(behind, "TIMEOUT '10ms', NO_THROW")); err != nil || got != "55000" {
				t.Fatalf("holding a session advisory lock: %q, %v", got, err)
			}
			if got, err := status(ctx, conn, waitSQL(done, "TIMEOUT '10ms', NO_THROW")); err != nil || got != "success" {
				t.Fatalf("holding a lock, target replayed: %q, %v", got, err)
			}
			exec(t, ctx, conn, "SELECT pg_advisory_unlock(42)")
			if got, err := status(ctx, conn, waitSQL(behind, "TIMEOUT '10ms', NO_THROW")); err != nil || got != "timeout" {
				t.Fatalf("lock released: %q, %v", got, err)
			}
			// A READ COMMITTED block: the first statement may wait; after
			// a read of a table it holds that table's lock.
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := status(ctx, conn, waitSQL(behind, "TIMEOUT '10ms', NO_THROW")); err != nil || got != "timeout" {
				t.Fatalf("first after BEGIN: %q, %v", got, err)
			}
			exec(t, ctx, conn, "SELECT count(*) FROM wf_lock")
			if got, err := status(ctx, conn, waitSQL(behind, "TIMEOUT '10ms', NO_THROW")); err != nil || got != "55000" {
				t.Fatalf("after a read in the block: %q, %v", got, err)
			}
			// The refusal aborted the block, as an error does.
			if _, err := conn.Exec(ctx, "SELECT 1"); err == nil || !strings.Contains(err.Error(), "25P02") {
				t.Fatalf("after the refusal the block should be aborted: %v", err)
			}
			tx.Rollback(ctx)
			n := p.Counts().Sub(before)
			if n.LockRefusals != 2 || n.LockedWaits != 3 {
				t.Fatalf("counts %+v", n)
			}
		})
	}
}

// The snapshot rule, the top-level rule, the session's statement_timeout
// and a wait in front of a read in one pipeline segment.
func TestWaitForEmulationSnapshotAndTopLevel(t *testing.T) {
	ctx := ctxFor(t)
	p := waitForProxy(t, ctx)
	behind := behindTarget(t, ctx)
	done := replayedTarget(t, ctx)
	conn := proxyConn(t, ctx, p, pgx.QueryExecModeSimpleProtocol, "")
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := status(ctx, conn, waitSQL(done, "")); err != nil || got != "success" {
		t.Fatalf("first in a REPEATABLE READ block: %q, %v", got, err)
	}
	exec(t, ctx, conn, "SELECT 1")
	if got, err := status(ctx, conn, waitSQL(done, "")); err != nil || got != "55000" {
		t.Fatalf("after the block's first query: %q, %v", got, err)
	}
	tx.Rollback(ctx)
	if _, err := conn.Exec(ctx, "DO $$BEGIN EXECUTE 'WAIT FOR LSN ''0/1'''; END$$"); err == nil || !strings.Contains(err.Error(), "0A000") {
		t.Fatalf("WAIT FOR in a DO block: %v", err)
	}
	// Two statements in one Query: the wait's row, then the read's.
	rr := conn.PgConn().Exec(ctx, waitSQL(done, "NO_THROW")+"; SELECT 7")
	res, err := rr.ReadAll()
	if err != nil || len(res) != 2 || string(res[0].Rows[0][0]) != "success" || string(res[1].Rows[0][0]) != "7" {
		t.Fatalf("WAIT FOR; SELECT: %v, %v", res, err)
	}
	// statement_timeout from the connection's start ends a wait.
	st := proxyConn(t, ctx, p, pgx.QueryExecModeExec, "&statement_timeout=30")
	if got, err := status(ctx, st, waitSQL(behind, "TIMEOUT '5s', NO_THROW")); err != nil || got != "57014" {
		t.Fatalf("statement_timeout: %q, %v", got, err)
	}
	n := p.Counts()
	if n.SnapshotRefusals != 1 || n.TopLevelRefusals != 1 || n.StatementTimeouts != 1 {
		t.Fatalf("counts %+v", n)
	}
	// pg_stat_recovery reads the stand-in.
	var tli int
	var end string
	if err := conn.QueryRow(ctx, "SELECT last_replayed_end_lsn::text, last_replayed_tli FROM pg_catalog.pg_stat_recovery").Scan(&end, &tli); err != nil || tli == 0 {
		t.Fatalf("pg_stat_recovery: %s %d %v", end, tli, err)
	}
}
