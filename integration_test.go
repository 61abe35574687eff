package pgryw_test

// Integration tests: a real primary and two real streaming replicas, started
// from local PostgreSQL binaries by internal/pgtest for the whole package.
// On CI a missing server fails the run; elsewhere these tests skip and say why.

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

var cluster *pgtest.Cluster

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.fuzz"); f != nil && f.Value.String() != "" {
		// A fuzzing run (and each of its worker processes) needs no servers.
		os.Exit(m.Run())
	}
	if os.Getenv(childDSNEnv) != "" {
		// A child process of TestIntegrationSessionTokenAcrossProcesses:
		// it uses the parent's cluster.
		os.Exit(m.Run())
	}
	os.Exit(pgtest.Main(m, pgtest.Options{Replicas: 2}, func(c *pgtest.Cluster) {
		cluster = c
		if c != nil {
			if err := installNodeProbes(c); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
	}))
}

// The tests tell which node served a read by asking it, in the read
// itself. pgryw answers node identity (inet_server_port(),
// pg_is_in_recovery()) from the primary, as pgx on the primary would; these
// wrappers are what text cannot show (STABLE user functions, listed in the
// test pools' read_functions), so the node that runs the read answers them.
const (
	nodePort    = "ryw_port()"    // inet_server_port() of the node that ran the read
	nodeStandby = "ryw_standby()" // pg_is_in_recovery() of the node that ran the read
)

var nodeProbes = []string{"ryw_port", "ryw_standby", "ryw_backend"}

// installNodeProbes creates nodePort and nodeStandby on the writer and
// waits for the replicas to have them.
func installNodeProbes(c *pgtest.Cluster) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := sql.Open("pgx", c.WriterDSN())
	if err != nil {
		return err
	}
	defer db.Close()
	for _, q := range []string{
		"CREATE OR REPLACE FUNCTION ryw_port() RETURNS int STABLE LANGUAGE sql AS 'SELECT inet_server_port()'",
		"CREATE OR REPLACE FUNCTION ryw_standby() RETURNS boolean STABLE LANGUAGE sql AS 'SELECT pg_is_in_recovery()'",
		"CREATE OR REPLACE FUNCTION ryw_backend() RETURNS int STABLE LANGUAGE sql AS 'SELECT pg_backend_pid()'",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("node probes: %s: %w", q, err)
		}
	}
	return c.WaitCaughtUp(ctx)
}

// openDB opens a pgryw pool on the test cluster with extra DSN keys.
func openDB(t *testing.T, extra string) (*sql.DB, *pgryw.Connector) {
	t.Helper()
	pgtest.Require(t, cluster)
	dsn := cluster.WriterDSN() + "&replicas=" + strings.Join(cluster.ReplicaAddrs(), ",")
	if extra != "" {
		dsn += "&" + extra
	}
	return openDSN(t, dsn)
}

// openDSN opens a pgryw pool through NewConnector, closed with the test.
func openDSN(t *testing.T, dsn string) (*sql.DB, *pgryw.Connector) {
	t.Helper()
	cfg, err := pgryw.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ReadFunctions = append(cfg.ReadFunctions, nodeProbes...)
	c, err := pgryw.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { db.Close() })
	return db, c
}

// setDelay sets recovery_min_apply_delay on both replicas for one test and
// restores 0 (and a caught-up cluster) afterwards.
func setDelay(t *testing.T, d time.Duration) {
	t.Helper()
	pgtest.Require(t, cluster)
	ctx := context.Background()
	if err := cluster.SetApplyDelay(ctx, -1, d); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.SetApplyDelay(ctx, -1, 0); err != nil {
			t.Error(err)
		}
		if err := cluster.WaitCaughtUp(ctx); err != nil {
			t.Error(err)
		}
	})
}

var tableSeq atomic.Int64

// newTable creates a fresh table on the primary and waits until the replicas
// have it.
func newTable(t *testing.T) string {
	t.Helper()
	pgtest.Require(t, cluster)
	name := fmt.Sprintf("ryw_%d_%d", os.Getpid(), tableSeq.Add(1))
	db, err := sql.Open("pgryw", cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE " + name + " (id bigint PRIMARY KEY, v int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitCaughtUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	return name
}

type workload struct {
	reads, stale, onReplica, errs atomic.Int64
	firstErr                      atomic.Value
}

func (w *workload) replicaShare() float64 {
	return float64(w.onReplica.Load()) / float64(w.reads.Load())
}

// fresh fails the test unless every read succeeded and saw its own write.
func (w *workload) fresh(t *testing.T, c *pgryw.Connector) {
	t.Helper()
	t.Logf("reads=%d stale=%d replica=%d errors=%d stats=%+v", w.reads.Load(), w.stale.Load(), w.onReplica.Load(), w.errs.Load(), c.Stats())
	if w.errs.Load() != 0 {
		t.Fatalf("errors: %v", w.firstErr.Load())
	}
	if w.stale.Load() != 0 {
		t.Fatalf("%d stale reads", w.stale.Load())
	}
}

// onReplicas fails the test unless at least 95% of reads were served by replicas.
func (w *workload) onReplicas(t *testing.T) {
	t.Helper()
	if share := w.replicaShare(); share < 0.95 {
		t.Fatalf("only %.1f%% of reads served by replicas", share*100)
	}
}

// onPrimary fails the test unless (nearly) every read was served by the primary.
func (w *workload) onPrimary(t *testing.T) {
	t.Helper()
	if share := w.replicaShare(); share > maxLuckyShare {
		t.Fatalf("%.1f%% of reads served by replicas 100ms behind with a 10ms budget", share*100)
	}
}

// insertThenRead is the workload: each worker inserts a row and at
// once reads it back through the same *sql.DB.
func insertThenRead(t *testing.T, db *sql.DB, table string, workers, iterations int) *workload {
	t.Helper()
	primaryPort := cluster.Writer.Port
	var w workload
	var wg sync.WaitGroup
	var id atomic.Int64
	for g := 0; g < workers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < iterations; i++ {
				k := id.Add(1)
				if _, err := db.Exec("INSERT INTO "+table+" (id, v) VALUES ($1, $2)", k, k*10); err != nil {
					t.Errorf("insert: %v", err)
					return
				}
				var v, port int
				err := db.QueryRow("SELECT v, "+nodePort+" FROM "+table+" WHERE id = $1", k).Scan(&v, &port)
				w.reads.Add(1)
				switch {
				case errors.Is(err, sql.ErrNoRows):
					w.stale.Add(1)
					continue
				case err != nil:
					w.errs.Add(1)
					w.firstErr.CompareAndSwap(nil, err)
					continue
				case v != int(k*10):
					w.stale.Add(1)
				}
				if port != primaryPort {
					w.onReplica.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return &w
}

const (
	workers    = 8
	iterations = 100
	// maxLuckyShare bounds the reads a replica 100ms behind may serve under
	// a 10ms budget. It is not zero: a worker descheduled for 100ms between
	// its insert and its read (2 cores, 8 workers, 3 servers) finds the
	// replica caught up, and serving that read from the replica is right.
	maxLuckyShare = 0.05
)

func TestIntegrationReadYourWrites(t *testing.T) {
	setDelay(t, 100*time.Millisecond)
	db, c := openDB(t, "wait_timeout=1s")
	w := insertThenRead(t, db, newTable(t), workers, iterations)
	w.fresh(t, c)
	w.onReplicas(t)
}

// With REPEATABLE READ as the session default, the read's snapshot is
// taken by its own statement, after the check: on PostgreSQL 19 WAIT FOR
// runs first in the read's implicit transaction (chained, no Sync of its
// own) and must take no snapshot there.
func TestIntegrationRepeatableReadDefault(t *testing.T) {
	setDelay(t, 100*time.Millisecond)
	db, c := openDB(t, "wait_timeout=1s&options=-c%20default_transaction_isolation%3Drepeatable%5C%20read")
	var iso string
	if err := db.QueryRow("SHOW default_transaction_isolation").Scan(&iso); err != nil || iso != "repeatable read" {
		t.Fatalf("default_transaction_isolation %q, %v", iso, err)
	}
	w := insertThenRead(t, db, newTable(t), workers, 50)
	w.fresh(t, c)
	w.onReplicas(t)
}

func TestIntegrationShortBudgetReadsPrimary(t *testing.T) {
	setDelay(t, 100*time.Millisecond)
	db, c := openDB(t, "wait_timeout=10ms")
	w := insertThenRead(t, db, newTable(t), workers, iterations)
	w.fresh(t, c)
	w.onPrimary(t)
}

func TestIntegrationOnTimeoutError(t *testing.T) {
	setDelay(t, 100*time.Millisecond)
	db, _ := openDB(t, "wait_timeout=10ms&on_timeout=error")
	w := insertThenRead(t, db, newTable(t), workers, 50)
	if w.stale.Load() != 0 {
		t.Fatalf("%d stale rows served", w.stale.Load())
	}
	if w.errs.Load() == 0 {
		t.Fatal("no ErrReplicaBehind with replicas 100ms behind and a 10ms budget")
	}
	if err, _ := w.firstErr.Load().(error); !errors.Is(err, pgryw.ErrReplicaBehind) {
		t.Fatalf("error %v does not match ErrReplicaBehind", err)
	}
}

// TestIntegrationOffIsStale is the control: the same workload without the
// wait observes its own writes missing. If this fails, the other tests prove
// nothing.
func TestIntegrationOffIsStale(t *testing.T) {
	setDelay(t, 100*time.Millisecond)
	db, _ := openDB(t, "read_your_writes=off")
	w := insertThenRead(t, db, newTable(t), workers, 25)
	t.Logf("reads=%d stale=%d replica=%d", w.reads.Load(), w.stale.Load(), w.onReplica.Load())
	if w.stale.Load() == 0 {
		t.Fatal("read_your_writes=off observed no stale reads: the lag simulation is not working")
	}
}

func TestIntegrationTransactionsAndSessions(t *testing.T) {
	setDelay(t, 100*time.Millisecond)
	ctx := context.Background()
	for _, scope := range []string{"db", "conn"} {
		t.Run(scope, func(t *testing.T) {
			db, c := openDB(t, "wait_timeout=2s&session_scope="+scope)
			table := newTable(t)
			read := func(q interface {
				QueryRowContext(context.Context, string, ...any) *sql.Row
			}, id int) (int, bool) {
				t.Helper()
				var v, port int
				err := q.QueryRowContext(ctx, "SELECT v, "+nodePort+" FROM "+table+" WHERE id = $1", id).Scan(&v, &port)
				if errors.Is(err, sql.ErrNoRows) {
					t.Fatalf("row %d not visible: stale read", id)
				}
				if err != nil {
					t.Fatal(err)
				}
				return v, port != cluster.Writer.Port
			}

			// A read-write transaction runs on the primary; its commit moves the watermark.
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			tx, err := conn.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec("INSERT INTO "+table+" VALUES (1, 10)", nil...); err != nil {
				t.Fatal(err)
			}
			if _, onReplica := read(tx, 1); onReplica {
				t.Fatal("read inside a read-write transaction served by a replica")
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if v, onReplica := read(conn, 1); v != 10 || !onReplica {
				t.Fatalf("after commit: v=%d onReplica=%v", v, onReplica)
			}

			// A rolled-back transaction's row never appears.
			tx, _ = conn.BeginTx(ctx, nil)
			tx.Exec("INSERT INTO " + table + " VALUES (2, 20)")
			tx.Rollback()

			// sql.Conn session: write, then read on the same connection.
			if _, err := conn.ExecContext(ctx, "UPDATE "+table+" SET v = 11 WHERE id = 1"); err != nil {
				t.Fatal(err)
			}
			if v, onReplica := read(conn, 1); v != 11 || !onReplica {
				t.Fatalf("sql.Conn: v=%d onReplica=%v", v, onReplica)
			}

			// A read-only transaction runs on a replica that caught up before BEGIN,
			// at REPEATABLE READ too.
			if _, err := conn.ExecContext(ctx, "UPDATE "+table+" SET v = 12 WHERE id = 1"); err != nil {
				t.Fatal(err)
			}
			rtx, err := conn.BeginTx(ctx, &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead})
			if err != nil {
				t.Fatal(err)
			}
			defer rtx.Rollback() // (after a failure: conn.Close waits for it)
			// Through the cluster's bouncers (PGRYW_PGBOUNCER), which pgryw
			// takes for transaction poolers, pgx's BEGIN goes in the simple
			// protocol, where no check can share its transaction: a
			// read-only transaction with a watermark runs on the primary.
			wantReplica := len(cluster.Bouncers()) == 0
			if v, onReplica := read(rtx, 1); v != 12 || onReplica != wantReplica {
				t.Fatalf("read-only tx: v=%d onReplica=%v", v, onReplica)
			}
			if err := rtx.Commit(); err != nil {
				t.Fatal(err)
			}
			// Blocks managed with Exec'd BEGIN/COMMIT, a multi-statement
			// string with its own block, and COMMIT AND CHAIN.
			for i, steps := range [][]string{
				{"BEGIN", "UPDATE " + table + " SET v = 20 WHERE id = 1", "COMMIT"},
				{"BEGIN; UPDATE " + table + " SET v = 21 WHERE id = 1; COMMIT"},
				{"BEGIN; UPDATE " + table + " SET v = 22 WHERE id = 1; COMMIT AND CHAIN", "COMMIT"},
			} {
				for _, q := range steps {
					if _, err := conn.ExecContext(ctx, q); err != nil {
						t.Fatalf("%s: %v", q, err)
					}
				}
				if v, onReplica := read(conn, 1); v != 20+i || !onReplica {
					t.Fatalf("after %q: v=%d onReplica=%v; stats %+v", steps, v, onReplica, c.Stats())
				}
			}

			if scope == "db" {
				// The pool-wide watermark covers db.Exec then db.Query on
				// whatever connections the pool hands out.
				if _, err := db.ExecContext(ctx, "UPDATE "+table+" SET v = 30 WHERE id = 1"); err != nil {
					t.Fatal(err)
				}
				if v, _ := read(db, 1); v != 30 {
					t.Fatalf("db scope: v=%d", v)
				}
			}
		})
	}
}

func TestIntegrationUnreachableReplica(t *testing.T) {
	db, c := openDB(t, "")
	table := newTable(t)
	if err := cluster.StopNode(0); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cluster.StartNode(0); err != nil {
			t.Fatal(err)
		}
	}()
	for i := 0; i < 20; i++ {
		if _, err := db.Exec("INSERT INTO "+table+" VALUES ($1, 1)", i); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := db.QueryRow("SELECT count(*) FROM "+table+" WHERE id = $1", i).Scan(&n); err != nil || n != 1 {
			t.Fatalf("read %d: n=%d err=%v", i, n, err)
		}
	}
	t.Logf("stats %+v", c.Stats())
}
