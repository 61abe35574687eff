package pgryw_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/faultnet"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// Regression tests for the divergences from pgx found by hostile reviews and other projects' suites, one
// program each, run through pgryw and through pgx on the primary as
// TestTransparency runs its random ones (no faults): each failed before
// its fix.

// tpClass runs fixed programs through both drivers and fails on the first
// difference that is not an intended one.
func tpClass(t *testing.T, rywDSN string, progs ...[]tpStep) {
	t.Helper()
	pgtest.Require(t, cluster)
	r := &tpRun{t: t, nw: faultnet.New(), ryw: rywDSN}
	r.setup()
	setDelay(t, 30*time.Millisecond)
	for k, prog := range progs {
		if i, pgx, ryw := r.compare(prog, "", 0); i >= 0 {
			step := "final contents"
			if i < len(prog) {
				step = prog[i].String()
			}
			t.Fatalf("program %d differs at step %d (%s):\n  pgx:   %s\n  pgryw: %s", k, i, step, pgx, ryw)
		}
	}
}

func q(sess int, sql string, args ...any) tpStep {
	return tpStep{sess: sess, op: "query", sql: sql, args: args}
}
func x(sess int, sql string, args ...any) tpStep {
	return tpStep{sess: sess, op: "exec", sql: sql, args: args}
}
func begin(sess int, iso sql.IsolationLevel) tpStep {
	return tpStep{sess: sess, op: "begin", tx: sql.TxOptions{Isolation: iso, ReadOnly: true}}
}
func commit(sess int) tpStep { return tpStep{sess: sess, op: "commit"} }

// Class 1: session statements inside a read-only transaction reach the
// primary, where the session is.
func TestTransparencyClassReadOnlyTxSession(t *testing.T) {
	tpClass(t, "",
		// SET search_path inside it decides where the next INSERT goes.
		[]tpStep{begin(0, sql.LevelDefault), q(0, "SELECT count(*) FROM t"), x(0, "SET search_path = s1, public"), commit(0),
			x(0, "INSERT INTO t VALUES (1, 1)"), q(0, "SHOW search_path")},
		// A transaction advisory lock is the primary's, where another
		// session holds it.
		[]tpStep{q(1, "SELECT pg_try_advisory_lock(5)"), begin(0, sql.LevelReadCommitted),
			q(0, "SELECT pg_try_advisory_xact_lock(5)"), commit(0), q(1, "SELECT pg_advisory_unlock(5)")},
		// LISTEN and NOTIFY in it.
		[]tpStep{begin(0, sql.LevelDefault), q(0, "SELECT 1"), x(0, "LISTEN "+tpChannel), x(0, "NOTIFY "+tpChannel+", 'ro'"), commit(0),
			q(0, "SELECT pg_listening_channels()")},
		// PREPARE and DECLARE … WITH HOLD made in it are used after it.
		[]tpStep{begin(0, sql.LevelRepeatableRead), q(0, "SELECT count(*) FROM t"), x(0, "PREPARE p1 AS SELECT count(*) FROM t"),
			x(0, "DECLARE c1 CURSOR WITH HOLD FOR SELECT 1"), commit(0), q(0, "EXECUTE p1"), q(0, "FETCH 1 FROM c1")},
		// Node identity inside it.
		[]tpStep{begin(0, sql.LevelDefault), q(0, "SELECT inet_server_port(), pg_is_in_recovery()"), q(0, "SHOW transaction_read_only"), commit(0)},
		// A write elsewhere in the pool while it is open (READ COMMITTED
		// sees it on the primary).
		[]tpStep{begin(0, sql.LevelReadCommitted), q(0, "SELECT count(*) FROM t"), x(-1, "INSERT INTO t VALUES (2, 2)"),
			q(0, "SELECT count(*) FROM t"), commit(0)},
	)
}

// Class 2: session state changed inside a function or a DO block.
func TestTransparencyClassStateInFunctions(t *testing.T) {
	tpClass(t, "",
		[]tpStep{q(0, "SELECT set_tenant($1)", "a"), q(0, "SELECT id FROM my_rows ORDER BY id"), q(0, "SELECT id FROM my_rows ORDER BY id")},
		[]tpStep{x(0, "DO $$BEGIN PERFORM set_config('app.tenant', 'b', false); END$$"), q(0, "SELECT id FROM my_rows ORDER BY id")},
		[]tpStep{q(0, "SELECT lock_it(3)"), q(0, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"),
			q(0, "SELECT pg_advisory_unlock_all()")},
		[]tpStep{x(0, "SELECT make_temp()"), q(0, "SELECT count(*) FROM ft"), x(0, "DROP TABLE ft")},
	)
}

// Class 3: reads a standby refuses but the primary serves.
func TestTransparencyClassStandbyRefusals(t *testing.T) {
	tpClass(t, "",
		[]tpStep{x(0, "INSERT INTO u VALUES (1)"), q(0, "SELECT count(*) FROM u"), q(0, "SELECT count(*) FROM u"), q(1, "SELECT count(*) FROM u")},
		[]tpStep{q(0, "SELECT pg_walfile_name(pg_current_wal_lsn()) IS NOT NULL")},
		[]tpStep{begin(0, sql.LevelDefault), q(0, "SELECT count(*) FROM t"), q(0, "SELECT count(*) FROM u"), commit(0)},
	)
}

// Class 4: node identity and node-local state, answered as the primary
// answers them.
func TestTransparencyClassNodeLocal(t *testing.T) {
	tpClass(t, "",
		[]tpStep{q(0, "SELECT nextval('s')"), q(0, "SELECT last_value, is_called FROM s"),
			q(0, "SELECT last_value FROM pg_sequences WHERE schemaname = 'public' AND sequencename = 's'")},
		[]tpStep{q(0, "SELECT pg_is_in_recovery()"), q(0, "SHOW transaction_read_only"), q(0, "SHOW in_hot_standby"),
			q(0, "SELECT current_setting('transaction_read_only')"), q(0, "SELECT inet_server_port()"),
			q(0, "SELECT count(*) FROM pg_stat_replication"), q(0, "SELECT count(*) FROM pg_stat_activity WHERE pid = pg_backend_pid()")},
	)
}

// Classes 6 and 9: db.Prepare reaches the server, as pgx's does.
func TestTransparencyClassPrepare(t *testing.T) {
	prep := func(sess, k int, sql string) tpStep { return tpStep{sess: sess, op: "prepare", sql: sql, stmt: k} }
	tpClass(t, "",
		[]tpStep{prep(0, 0, "SELECT * FROM no_such_table WHERE id = $1"), prep(0, 1, "SELECT v FROM t WHERE id = $1"),
			{sess: 0, op: "squery", stmt: 1, args: []any{int64(1), int64(2)}}, // one too many: database/sql's own check
			{sess: 0, op: "squery", stmt: 1, args: []any{int64(1)}},
			q(0, "SELECT count(*) FROM pg_prepared_statements WHERE statement = 'SELECT v FROM t WHERE id = $1'")},
	)
	// Under the simple protocol a prepared statement's parameter types come
	// from the server: []byte into a json column.
	pgtest.Require(t, cluster)
	r := &tpRun{t: t, nw: faultnet.New()}
	r.setup()
	prog := []tpStep{prep(0, 0, "INSERT INTO j VALUES ($1, $2)"), {sess: 0, op: "sexec", stmt: 0, args: []any{int64(1), []byte(`{"a": 1}`)}},
		q(0, "SELECT doc::text FROM j")}
	if i, pgx, ryw := r.compare(prog, "default_query_exec_mode=simple_protocol", 0); i >= 0 {
		t.Fatalf("simple protocol: step %d:\n  pgx:   %s\n  pgryw: %s", i, pgx, ryw)
	}
}

// Class 7: write_functions holds however the call names the function.
func TestTransparencyClassWriteFunctions(t *testing.T) {
	tpClass(t, "write_functions=lock_quietly",
		// The first call waits for the catalog; the later ones are routed
		// by what it said (STABLE) and by the override.
		[]tpStep{q(0, "SELECT public.lock_quietly($1)", int64(8)), q(0, "SELECT pg_advisory_unlock_all()"),
			q(0, "SELECT count(*) FROM t"), q(0, "SELECT count(*) FROM t"),
			q(0, "SELECT public.lock_quietly($1)", int64(9)), q(0, "SELECT lock_quietly($1)", int64(10)),
			q(0, `SELECT "public".lock_quietly($1)`, int64(11)), q(0, "SELECT pg_advisory_unlock_all()")},
	)
}

// Class 11: two pools of one process on one database see each other's
// writes (session_scope=db). With session_scope=conn, the control, they do
// not.
func TestIntegrationTwoPoolsOneDatabase(t *testing.T) {
	table := newTable(t)
	setDelay(t, 100*time.Millisecond)
	ctx := context.Background()
	for _, scope := range []string{"db", "conn"} {
		a, _ := openDB(t, "session_scope="+scope+"&wait_timeout=1s")
		b, cb := openDB(t, "session_scope="+scope+"&wait_timeout=1s")
		stale := 0
		for i := 1; i <= 20; i++ {
			id := i
			if scope == "conn" {
				id += 100
			}
			if _, err := a.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s VALUES (%d, 1)", table, id)); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := b.QueryRowContext(ctx, fmt.Sprintf("SELECT count(*) FROM %s WHERE id = %d", table, id)).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				stale++
			}
		}
		st := cb.Stats()
		t.Logf("session_scope=%s: %d of 20 reads through the second pool stale; its stats %+v", scope, stale, st)
		switch {
		case scope == "db" && stale != 0:
			t.Fatalf("session_scope=db: %d reads through the second pool missed the first pool's writes", stale)
		case scope == "db" && st.ReplicaReads == 0:
			t.Fatal("session_scope=db: no read of the second pool was served by a replica")
		case scope == "conn" && stale == 0:
			t.Fatal("the control: with session_scope=conn the second pool should miss writes of the first")
		}
	}
}

// Class 12 is an intended difference: sql.Conn.Raw hands out *pgryw.Conn,
// whose RunOnPrimary gives the *pgx.Conn that pgx's *stdlib.Conn would.
func TestIntegrationRawIsPgrywConn(t *testing.T) {
	db, _ := openDB(t, "")
	conn := oneConn(t, db)
	err := conn.Raw(func(dc any) error {
		pc, ok := dc.(*pgryw.Conn)
		if !ok {
			return fmt.Errorf("Raw gave %T", dc)
		}
		return pc.RunOnPrimary(context.Background(), func(c *pgx.Conn) error {
			var rec bool
			return c.QueryRow(context.Background(), "SELECT pg_is_in_recovery()").Scan(&rec)
		})
	})
	var pgErr *pgconn.PgError
	if err != nil || errors.As(err, &pgErr) {
		t.Fatal(err)
	}
}

// Class 5: a hot standby of another cluster listed in replicas (a
// blue/green migration leaves one behind). Its WAL positions are ahead of
// this cluster's, so every catch-up check would pass at once there; its
// system identifier is not the writer's, and the monitor keeps it out of
// reads. The reads after writes must all see their rows.
func TestIntegrationForeignStandbyIgnored(t *testing.T) {
	ctx := context.Background()
	other, otherPos := startForeignCluster(t)
	var ourPos string
	table := newTable(t)
	setDelay(t, 100*time.Millisecond)
	db, c := openDSN(t, cluster.WriterDSN()+"&wait_timeout=2s&replicas="+other.ReplicaAddrs()[0]+","+cluster.ReplicaAddrs()[0])
	if err := db.PingContext(ctx); err != nil { // the pool's first connection starts the monitor
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.NodeStats()[1].Health != pgryw.HealthForeign {
		if time.Now().After(deadline) {
			t.Fatalf("the other cluster's standby: %+v", c.NodeStats()[1])
		}
		time.Sleep(20 * time.Millisecond)
	}
	stale := 0
	for i := 1; i <= 20; i++ {
		if _, err := db.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s VALUES (%d, 1)", table, i)); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := db.QueryRowContext(ctx, fmt.Sprintf("SELECT count(*) FROM %s WHERE id = %d", table, i)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			stale++
		}
	}
	db.QueryRowContext(pgryw.WithPrimary(ctx), "SELECT pg_current_wal_insert_lsn()::text").Scan(&ourPos)
	ns := c.NodeStats()
	t.Logf("other cluster at %s, ours at %s; nodes %v / %v; stats %+v", otherPos, ourPos, ns[1].Health, ns[2].Health, c.Stats())
	if stale != 0 {
		t.Fatalf("%d reads missed their own writes", stale)
	}
	if ns[1].Reads != 0 {
		t.Fatalf("the other cluster's standby served %d reads", ns[1].Reads)
	}
	if ns[2].Reads == 0 {
		t.Fatal("no read was served by this cluster's replica")
	}
}

// startForeignCluster starts another cluster with one standby, closed with
// the test, its WAL moved well ahead of this one's; it returns the cluster
// and its writer's position.
func startForeignCluster(t *testing.T) (*pgtest.Cluster, string) {
	t.Helper()
	pgtest.Require(t, cluster)
	ctx := context.Background()
	other, err := pgtest.Start(ctx, pgtest.Options{Replicas: 1, BinDir: cluster.BinDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	ow, err := pgx.Connect(ctx, other.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer ow.Close(ctx)
	for i := 0; i < 8; i++ {
		if _, err := ow.Exec(ctx, "SELECT pg_switch_wal(), txid_current()"); err != nil {
			t.Fatal(err)
		}
	}
	var pos string
	ow.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&pos)
	if err := other.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	return other, pos
}

// TestIntegrationForeignStandbyBeforeMonitor: each replica connection
// compares its server's system identifier with the writer's when it opens,
// so another cluster's standby serves no read even before the monitor
// first looks at it (here it never does).
func TestIntegrationForeignStandbyBeforeMonitor(t *testing.T) {
	other, _ := startForeignCluster(t)
	setDelay(t, 100*time.Millisecond)
	for _, pooler := range []string{"auto", "none"} {
		t.Run("pooler="+pooler, func(t *testing.T) {
			foreignBeforeMonitor(t, cluster.WriterDSN()+"&wait_timeout=2s&pooler="+pooler+"&replicas="+other.ReplicaAddrs()[0])
		})
	}
}

func foreignBeforeMonitor(t *testing.T, dsn string) {
	ctx := context.Background()
	table := newTable(t)
	cfg, err := pgryw.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgryw.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pgryw.StopMonitor(c)
	db := sql.OpenDB(c)
	defer db.Close()
	stale, readErrs := 0, 0
	for i := 1; i <= 10; i++ {
		if _, err := db.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s VALUES (%d, 1)", table, i)); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := db.QueryRowContext(ctx, fmt.Sprintf("SELECT count(*) FROM %s WHERE id = %d", table, i)).Scan(&n); err != nil {
			readErrs++
			t.Logf("read %d: %v", i, err)
			continue
		}
		if n == 0 {
			stale++
		}
	}
	ns := c.NodeStats()
	t.Logf("foreign standby: %+v; stats %+v", ns[1], c.Stats())
	if stale != 0 || readErrs != 0 {
		t.Fatalf("%d reads missed their own writes, %d failed", stale, readErrs)
	}
	if ns[1].Reads != 0 {
		t.Fatalf("the other cluster's standby served %d reads", ns[1].Reads)
	}
	if ns[1].Health != pgryw.HealthForeign {
		t.Fatalf("the other cluster's standby is %v", ns[1].Health)
	}
}

// TestIntegrationFailedStatementLeavesStateAlone is class 8: a statement
// that may change session state (UNLISTEN *, NOTIFY) and fails before it
// executes (pgx's Parse refuses a multi-statement string in the extended
// protocol) changed nothing, so the connection's next read goes to a
// replica, as after any other statement that changed nothing. It used to
// keep the connection's reads on the primary ("state not read back yet"),
// and the read-back's own statement, marked prepared though its Parse never
// went out, then failed with 26000, which made pgryw take the node to be
// behind a transaction pooler for good.
func TestIntegrationFailedStatementLeavesStateAlone(t *testing.T) {
	pgtest.Require(t, cluster)
	ctx := context.Background()
	pdb, err := sql.Open("pgx", cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer pdb.Close()
	traps := []string{"UNLISTEN *; NOTIFY tc8, 'x'", "LISTEN tc8; UNLISTEN *; NOTIFY tc8, 'x'", "SET application_name = 'tc8'; SELECT 1"}
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec"} {
		for _, trap := range traps {
			db, c := openDB(t, "default_query_exec_mode="+mode)
			db.SetMaxOpenConns(1)
			for round := 0; round < 2; round++ {
				_, perr := pdb.QueryContext(ctx, trap)
				_, rerr := db.QueryContext(ctx, trap)
				if code(perr) != code(rerr) || perr == nil {
					t.Fatalf("%s %q: pgx %v, pgryw %v", mode, trap, perr, rerr)
				}
				var n int
				if !onReplica(t, ctx, db, "SELECT 1", &n) {
					t.Fatalf("%s %q, round %d: the next read ran on the primary; %+v", mode, trap, round, c.Stats().PinnedBy)
				}
			}
			// Session state taken and released afterwards still pins and unpins.
			for _, q := range []string{"LISTEN tc8", "UNLISTEN *"} {
				if _, err := db.ExecContext(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			var n int
			if st := c.Stats(); st.Pinned != 0 || !onReplica(t, ctx, db, "SELECT 1", &n) {
				t.Fatalf("%s %q: after LISTEN and UNLISTEN *, still on the primary: %+v", mode, trap, st.PinnedBy)
			}
			db.Close()
		}
	}
}

// code is err's SQLSTATE, or its text when it has none.
func code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	if err != nil {
		return err.Error()
	}
	return ""
}
