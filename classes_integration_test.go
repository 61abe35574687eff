package pgryw_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/sqlclass"
)

// TestIntegrationPrimaryClasses runs every kind of statement that must run on
// the primary through pgryw with replicas configured, on one connection, in
// an order where a misrouted statement fails: a write on a replica fails with
// SQLSTATE 25006, and a statement that depends on earlier session state
// (temporary table, prepared statement, setting, cursor, sequence currval,
// advisory lock) fails or answers wrongly on another node. Reads that do not
// depend on session state must be served by replicas.
func TestIntegrationPrimaryClasses(t *testing.T) {
	db, c := openDB(t, "")
	ctx := context.Background()
	setup := []string{
		"CREATE TABLE wc_t (id int PRIMARY KEY, v int)",
		"INSERT INTO wc_t SELECT g, g FROM generate_series(1, 10) g",
		"CREATE SEQUENCE wc_s",
		"CREATE MATERIALIZED VIEW wc_mv AS SELECT count(*) AS n FROM wc_t",
		"CREATE FUNCTION wc_bump() RETURNS int LANGUAGE sql VOLATILE AS 'UPDATE wc_t SET v = v + 1 WHERE id = 1 RETURNING v'",
		"CREATE FUNCTION wc_get(i int) RETURNS int LANGUAGE sql STABLE AS 'SELECT v FROM wc_t WHERE id = i'",
		"CREATE PROCEDURE wc_proc() LANGUAGE sql AS 'UPDATE wc_t SET v = v WHERE id = 2'",
	}
	for _, q := range setup {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		for _, q := range []string{"DROP MATERIALIZED VIEW IF EXISTS wc_mv", "DROP TABLE IF EXISTS wc_t, wc_into", "DROP SEQUENCE IF EXISTS wc_s",
			"DROP FUNCTION IF EXISTS wc_bump(), wc_get(int)", "DROP PROCEDURE IF EXISTS wc_proc()"} {
			db.Exec(q)
		}
	})
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}

	// Reads first, on a fresh connection: no session state yet, so replicas.
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	reads := []string{
		"SELECT count(*) FROM wc_t",
		"VALUES (1), (2)",
		"TABLE wc_mv",
		"WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT max(n) FROM r",
		"SELECT * FROM wc_t WHERE v > $1 ORDER BY id LIMIT 1",
		"SHOW server_version",
		"EXPLAIN SELECT * FROM wc_t",
		"SELECT 'DELETE FROM wc_t', $$INSERT$$, \"id\" FROM wc_t LIMIT 1 -- for update",
		"(SELECT 1) UNION (SELECT 2)",
	}
	for _, q := range reads {
		if !servedByReplica(t, ctx, conn, q) {
			t.Errorf("read served by the primary: %s", q)
		}
	}
	// The stable user function is a read once the catalog has answered.
	deadline := time.Now().Add(5 * time.Second)
	for !servedByReplica(t, ctx, conn, "SELECT wc_get(1)") {
		if time.Now().After(deadline) {
			t.Fatal("SELECT wc_get(1) (STABLE) never served by a replica")
		}
		time.Sleep(20 * time.Millisecond)
	}

	writes := []string{
		"INSERT INTO wc_t VALUES (100, 1)",
		"UPDATE wc_t SET v = 2 WHERE id = 100",
		"DELETE FROM wc_t WHERE id = 100",
		"MERGE INTO wc_t USING (VALUES (101, 1)) s(id, v) ON wc_t.id = s.id WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.v)",
		"WITH d AS (DELETE FROM wc_t WHERE id = 101 RETURNING *) SELECT count(*) FROM d",
		"SELECT * INTO wc_into FROM wc_t",
		"SELECT * FROM wc_t WHERE id = 1 FOR UPDATE",
		"SELECT * FROM wc_t WHERE id = 1 FOR NO KEY UPDATE NOWAIT",
		"SELECT * FROM wc_t WHERE id = 1 FOR SHARE SKIP LOCKED",
		"SELECT * FROM wc_t t WHERE id = 1 FOR KEY SHARE OF t",
		"EXPLAIN ANALYZE UPDATE wc_t SET v = v WHERE id = 3",
		"SELECT nextval('wc_s')",
		"SELECT currval('wc_s')",
		"SELECT setval('wc_s', 10)",
		"SELECT txid_current()",
		"SELECT pg_current_xact_id()",
		"SELECT lo_create(0)",
		"SELECT pg_notify('wc', 'x')",
		"NOTIFY wc",
		"SELECT wc_bump()",
		"CALL wc_proc()",
		"DO $$ BEGIN UPDATE wc_t SET v = v WHERE id = 4; END $$",
		"VACUUM wc_t",
		"ANALYZE wc_t",
		"REINDEX TABLE wc_t",
		"CLUSTER wc_t USING wc_t_pkey",
		"REFRESH MATERIALIZED VIEW wc_mv",
		"CHECKPOINT",
		"COMMENT ON TABLE wc_t IS 'x'",
		"ALTER TABLE wc_t ADD COLUMN w int",
		"TRUNCATE wc_into",
	}
	for _, q := range writes {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Errorf("%s: %v", q, err)
		}
	}

	// Session state: each pair fails if the second statement lands elsewhere.
	session := [][2]string{
		{"SET application_name = 'wc_test'", "SHOW application_name"},
		{"SELECT set_config('pgryw.test', 'on', false)", "SELECT current_setting('pgryw.test')"},
		{"CREATE TEMP TABLE wc_tmp AS SELECT 1 AS x", "SELECT count(*) FROM wc_tmp"},
		{"PREPARE wc_p AS SELECT 1", "EXECUTE wc_p"},
		{"SELECT pg_advisory_lock(42)", "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"},
		{"LISTEN wc", "SELECT count(*) FROM pg_listening_channels()"},
		{"DECLARE wc_cur CURSOR WITH HOLD FOR SELECT id FROM wc_t", "FETCH 1 FROM wc_cur"},
	}
	for _, p := range session {
		if _, err := conn.ExecContext(ctx, p[0]); err != nil {
			t.Errorf("%s: %v", p[0], err)
			continue
		}
		var got string
		if err := conn.QueryRowContext(ctx, p[1]).Scan(&got); err != nil {
			t.Errorf("%s after %s: %v", p[1], p[0], err)
			continue
		}
		if got == "0" || got == "" {
			t.Errorf("%s after %s = %q: the session state is not there", p[1], p[0], got)
		}
	}
	for _, q := range []string{"CLOSE wc_cur", "DEALLOCATE wc_p", "UNLISTEN wc", "SELECT pg_advisory_unlock(42)", "RESET application_name", "DISCARD TEMP"} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Errorf("%s: %v", q, err)
		}
	}
	// A transaction with LOCK and a cursor.
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"LOCK TABLE wc_t IN SHARE MODE", "DECLARE c2 CURSOR FOR SELECT 1", "FETCH 1 FROM c2", "CLOSE c2", "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"} {
		if _, err := tx.ExecContext(ctx, q); err != nil && !strings.Contains(err.Error(), "SET TRANSACTION ISOLATION LEVEL must be called before any query") {
			t.Errorf("in transaction: %s: %v", q, err)
		}
	}
	tx.Rollback()
	t.Logf("stats %+v", c.Stats())
}

// servedByReplica runs q and reports whether a replica answered, by asking
// the same node for its port right after on a read-only query that follows
// the same route.
func servedByReplica(t *testing.T, ctx context.Context, conn *sql.Conn, q string) bool {
	t.Helper()
	before := statsOf(t, conn)
	rows, err := conn.QueryContext(ctx, q, argsFor(q)...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	for rows.Next() {
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	rows.Close()
	return statsOf(t, conn).ReplicaReads > before.ReplicaReads
}

func argsFor(q string) []any {
	if strings.Contains(q, "$1") {
		return []any{0}
	}
	return nil
}

func statsOf(t *testing.T, conn *sql.Conn) pgryw.Stats {
	var st pgryw.Stats
	if err := conn.Raw(func(dc any) error {
		c, ok := dc.(*pgryw.Conn)
		if !ok {
			return fmt.Errorf("driver conn is %T", dc)
		}
		st = c.Connector().Stats()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestIntegrationCaseTableReads sends every read of the classifier's case
// table (internal/sqlclass/testdata/cases.tsv) that calls no user function
// through pgryw. Many name tables that do not exist, so errors are expected;
// what must never happen is a replica refusing a "read" as a write (25006).
// Every read that succeeds must have been served by a replica, but for
// reads of node identity or node-local state (sqlclass.Result.Node), which
// the primary answers, as pgx on the primary would.
func TestIntegrationCaseTableReads(t *testing.T) {
	db, c := openDB(t, "")
	cases := readCaseTable(t)
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ran, ok := 0, 0
	for _, q := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		before := c.Stats().ReplicaReads
		rows, err := conn.QueryContext(ctx, q, argsFor(q)...)
		if err == nil {
			for rows.Next() {
			}
			err = rows.Err()
			rows.Close()
		}
		cancel()
		ran++
		if err != nil {
			if strings.Contains(err.Error(), "25006") {
				t.Errorf("replica refused a read as a write: %s: %v", q, err)
			}
			continue
		}
		ok++
		onReplica := c.Stats().ReplicaReads != before
		if node := sqlclass.Classify(q).Node; onReplica == node {
			t.Errorf("read served by a replica %v, node-local %v: %s", onReplica, node, q)
		}
	}
	t.Logf("%d reads sent, %d succeeded on replicas", ran, ok)
	if ran < 50 {
		t.Fatalf("only %d reads in the case table", ran)
	}
}

// readCaseTable returns the SQL of the case table's reads without functions.
func readCaseTable(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("internal/sqlclass/testdata/cases.tsv")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, "\t")
		if len(f) < 6 || f[0] != "read" || f[1] != "none" || f[3] != "-" || f[2] == "primary" {
			continue
		}
		q := f[4]
		if strings.HasPrefix(q, `"`) {
			if err := json.Unmarshal([]byte(q), &q); err != nil {
				t.Fatalf("bad JSON in case table: %s", q)
			}
		}
		out = append(out, q)
	}
	return out
}
