package pgryw_test

import (
	"bytes"
	"context"
	"database/sql"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
)

// onReplica runs q (one row, one column) through the pool and reports
// whether a replica served it, from nodeStandby in the same row.
func onReplica(t *testing.T, ctx context.Context, q rowQuerier, query string, dst any) bool {
	t.Helper()
	var rec bool
	if err := q.QueryRowContext(ctx, "SELECT ("+query+"), "+nodeStandby).Scan(dst, &rec); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return rec
}

// TestIntegrationSessionStatePinsWhileItLives takes each kind of session
// state on a pool of one connection, checks that statements depending on it
// see it (on the primary) and that reads stay there while it lives, then
// releases it and checks that the next reads, on the same checkout and on
// the next ones, are served by replicas again. Before pgryw read the state
// back, any of these pinned the connection for its life.
func TestIntegrationSessionStatePinsWhileItLives(t *testing.T) {
	ctx := context.Background()
	setup, _ := openDB(t, "")
	for _, q := range []string{"CREATE SEQUENCE IF NOT EXISTS st_seq", "CREATE TABLE IF NOT EXISTS st_t (v int)"} {
		if _, err := setup.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { setup.Exec("DROP SEQUENCE IF EXISTS st_seq"); setup.Exec("DROP TABLE IF EXISTS st_t") })
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		take    []string
		reason  string   // Stats.PinnedBy while held; "" never pins
		uses    []string // depend on the state: must work while held
		release []string
	}{
		{"advisory lock", []string{"SELECT pg_advisory_lock(91)"}, "advisory lock", nil, []string{"SELECT pg_advisory_unlock(91)"}},
		{"try advisory lock", []string{"SELECT pg_try_advisory_lock(92)", "SELECT pg_try_advisory_lock(92)"}, "advisory lock", nil,
			[]string{"SELECT pg_advisory_unlock(92)", "SELECT pg_advisory_unlock(92)"}},
		{"advisory unlock all", []string{"SELECT pg_advisory_lock_shared(93)", "SELECT pg_advisory_lock(94)"}, "advisory lock", nil,
			[]string{"SELECT pg_advisory_unlock_all()"}},
		{"transaction advisory lock", []string{"BEGIN", "SELECT pg_advisory_xact_lock(95)", "COMMIT"}, "", nil, nil},
		{"LISTEN", []string{"LISTEN st_chan"}, "LISTEN", nil, []string{"UNLISTEN *"}},
		{"temporary table dropped", []string{"CREATE TEMP TABLE st_tmp (i int)", "INSERT INTO st_tmp VALUES (1)"}, "temporary table",
			[]string{"SELECT count(*) FROM st_tmp"}, []string{"DROP TABLE st_tmp"}},
		{"temporary table discarded", []string{"CREATE TEMP TABLE st_tmp2 AS SELECT 1 AS i"}, "temporary table",
			[]string{"SELECT i FROM st_tmp2"}, []string{"DISCARD TEMP"}},
		{"prepared statement", []string{"PREPARE st_p AS SELECT 41"}, "prepared statement", []string{"EXECUTE st_p"}, []string{"DEALLOCATE st_p"}},
		{"cursor WITH HOLD", []string{"BEGIN", "DECLARE st_c CURSOR WITH HOLD FOR SELECT g FROM generate_series(1, 3) g", "COMMIT"},
			"cursor WITH HOLD", []string{"FETCH 1 FROM st_c"}, []string{"CLOSE st_c"}},
		{"DISCARD ALL", []string{"SELECT pg_advisory_lock(96)", "LISTEN st_chan2", "CREATE TEMP TABLE st_tmp3 (i int)", "SET ROLE NONE"},
			"advisory lock", []string{"SELECT count(*) FROM st_tmp3"}, []string{"DISCARD ALL"}},
		{"a default a standby refuses", []string{"SET default_transaction_isolation = 'serializable'"}, "setting a standby refuses",
			[]string{"SELECT count(*) FROM st_t"}, []string{"RESET default_transaction_isolation"}},
		{"set_config with a computed name", []string{"SELECT set_config(lower('APP.X'), '1', false)"}, "set_config with a computed name",
			nil, []string{"DISCARD ALL"}},
		{"currval", []string{"SELECT nextval('st_seq')"}, "", []string{"SELECT currval('st_seq')"}, nil},
		{"transaction-scoped settings", []string{"SET transaction_read_only = off", "SET transaction_isolation = 'repeatable read'"}, "", nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			db, c := openDB(t, "")
			db.SetMaxOpenConns(1)
			var rec bool
			for _, q := range tc.take {
				if _, err := db.ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			st := c.Stats()
			if tc.reason == "" {
				if st.Pinned != 0 {
					t.Fatalf("pinned: %+v", st)
				}
			} else {
				if st.Pinned != 1 || st.PinnedBy[tc.reason] != 1 {
					t.Fatalf("want pinned by %q: %+v", tc.reason, st)
				}
				var one int
				if onReplica(t, ctx, db, "SELECT 1", &one) {
					t.Fatal("a read left the primary while the state lives")
				}
			}
			for _, q := range tc.uses {
				var v any
				if err := db.QueryRowContext(ctx, q).Scan(&v); err != nil {
					t.Fatalf("%s while the state lives: %v", q, err)
				}
				if tc.name == "currval" {
					var cur int64
					if onReplica(t, ctx, db, "SELECT currval('st_seq')", &cur) {
						t.Fatal("currval served by a replica")
					}
				}
			}
			for _, q := range tc.release {
				if _, err := db.ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			if st := c.Stats(); st.Pinned != 0 || len(st.PinnedBy) != 0 {
				t.Fatalf("still pinned after release: %+v", st)
			}
			// The same connection, checked out again and again.
			for i := 0; i < 3; i++ {
				var one int
				if !onReplica(t, ctx, db, "SELECT 1", &one) {
					t.Fatalf("read %d after release served by the primary", i)
				}
			}
			_ = rec
		})
	}
}

// TestIntegrationSettingsTravel checks that session settings reach the
// replica that serves the next read, without pinning: search_path resolves
// an unqualified table that exists only in another schema to the same
// table on the replica as on the primary; set_config of a custom parameter,
// SET ROLE and statement_timeout are seen there; RESET takes them back.
// Settings made in a transaction that rolled back, or with SET LOCAL, do
// not travel.
func TestIntegrationSettingsTravel(t *testing.T) {
	ctx := context.Background()
	setup, _ := openDB(t, "")
	for _, q := range []string{
		"DROP SCHEMA IF EXISTS st_s CASCADE", "CREATE SCHEMA st_s", "CREATE TABLE st_s.st_only (v int)",
		"INSERT INTO st_s.st_only VALUES (7)", "DROP ROLE IF EXISTS st_role", "CREATE ROLE st_role",
		"GRANT USAGE ON SCHEMA st_s TO st_role", "GRANT SELECT ON st_s.st_only TO st_role",
	} {
		if _, err := setup.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		setup.Exec("DROP SCHEMA IF EXISTS st_s CASCADE")
		setup.Exec("DROP ROLE IF EXISTS st_role")
	})
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	pool, c := openDB(t, "")
	c.SetLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	// One connection throughout: an Exec'd BEGIN must not return it to
	// the pool inside a transaction block.
	db, err := pool.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	exec := func(q string) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// want reads query on a replica and checks its text value.
	want := func(query, value string) {
		t.Helper()
		for i := 0; i < 2; i++ { // both replicas, in turn
			var got sql.NullString
			if !onReplica(t, ctx, db, query, &got) {
				t.Fatalf("%s served by the primary", query)
			}
			if got.String != value {
				t.Fatalf("%s on a replica: %q, want %q", query, got.String, value)
			}
		}
	}

	exec("SET search_path TO st_s, public")
	want("SELECT v::text FROM st_only", "7")
	exec("SELECT set_config('app.tenant', '42', false)")
	want("SELECT current_setting('app.tenant')", "42")
	exec("SET ROLE st_role")
	want("SELECT current_user::text", "st_role")
	want("SELECT v::text FROM st_only", "7")
	exec("RESET ROLE")
	want("SELECT current_user::text", "postgres")
	exec("SET statement_timeout = '4s'")
	want("SELECT current_setting('statement_timeout')", "4s")
	exec("RESET search_path")
	want("SELECT current_setting('search_path')", `"$user", public`)
	// A transaction that rolls back takes its SET with it.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "SET statement_timeout = '9s'"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	want("SELECT current_setting('statement_timeout')", "4s")
	// SET LOCAL lives and dies with its transaction.
	exec("BEGIN")
	exec("SET LOCAL statement_timeout = '8s'")
	exec("COMMIT")
	want("SELECT current_setting('statement_timeout')", "4s")
	// A committed one travels.
	exec("BEGIN")
	exec("SET statement_timeout = '5s'")
	exec("COMMIT")
	want("SELECT current_setting('statement_timeout')", "5s")
	exec("RESET ALL") // app.tenant is reset to '' (a placeholder stays)
	want("SELECT current_setting('statement_timeout')", "0")
	want("SELECT current_setting('app.tenant', true)", "")
	if st := c.Stats(); st.Pinned != 0 || st.PrimaryReads != 0 {
		t.Fatalf("settings pinned the connection or sent reads to the primary: %+v", st)
	}
	// An advisory lock pins and is logged, its release too; no statement
	// text or value in the lines.
	exec("SELECT pg_advisory_lock(97)")
	exec("SELECT pg_advisory_unlock(97)")
	out := logs.String()
	if !strings.Contains(out, "pinned to the primary") || !strings.Contains(out, "reasons=\"advisory lock\"") || !strings.Contains(out, "released") {
		t.Fatalf("log lines:\n%s", out)
	}
	if strings.Contains(out, "(97)") || strings.Contains(out, "st_role") || strings.Contains(out, "'42'") || strings.Contains(out, "statement=\"\"") {
		t.Fatalf("a log line carries statement text or values:\n%s", out)
	}
}

// TestIntegrationSettingsOffPinsNothingElse: with read_your_writes=off the
// settings still travel (routing does not depend on watermarks).
func TestIntegrationSettingsWithoutReadYourWrites(t *testing.T) {
	ctx := context.Background()
	db, c := openDB(t, "read_your_writes=off")
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, "SET application_name = 'st_app'"); err != nil {
		t.Fatal(err)
	}
	var name string
	if !onReplica(t, ctx, db, "SELECT current_setting('application_name')", &name) || name != "st_app" {
		t.Fatalf("application_name on the replica: %q", name)
	}
	if st := c.Stats(); st.Pinned != 0 {
		t.Fatalf("%+v", st)
	}
	_ = pgryw.Stats{}
}

// TestIntegrationResetSession: with reset_session=on, a connection handed
// out again starts clean (on the primary and on its replica connections);
// without it, what its last user left behind is still there.
func TestIntegrationResetSession(t *testing.T) {
	ctx := context.Background()
	for _, on := range []bool{false, true} {
		extra := "reset_session=off"
		if on {
			extra = "reset_session=on"
		}
		t.Run(extra, func(t *testing.T) {
			db, c := openDB(t, extra)
			db.SetMaxOpenConns(1)
			for _, q := range []string{"SET search_path TO pg_catalog, public", "SET ROLE NONE", "SELECT set_config('app.rs', 'left', false)",
				"LISTEN rs_chan", "CREATE TEMP TABLE rs_tmp (i int)"} {
				if _, err := db.ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			var path string
			if replica := onReplica(t, ctx, db, "SELECT current_setting('search_path')", &path); replica != on {
				t.Fatalf("served by a replica: %v; want %v (pinned by LISTEN unless reset)", replica, on)
			}
			// Each statement above was a checkout; the state survives
			// them unless reset_session is on.
			primary := pgryw.WithPrimary(ctx)
			var listening, temps int
			if err := db.QueryRowContext(primary, "SELECT (SELECT count(*) FROM pg_listening_channels()), (SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema())").Scan(&listening, &temps); err != nil {
				t.Fatal(err)
			}
			var tenant sql.NullString
			onReplica(t, ctx, db, "SELECT current_setting('app.rs', true)", &tenant)
			if on {
				if path != `"$user", public` || listening != 0 || temps != 0 || tenant.String != "" {
					t.Fatalf("state survived the reset: search_path %q, %d channels, %d temporary tables, app.rs %q", path, listening, temps, tenant.String)
				}
				if st := c.Stats(); st.Pinned != 0 {
					t.Fatalf("%+v", st)
				}
			} else if path != "pg_catalog, public" || listening != 1 || temps != 1 || tenant.String != "left" {
				t.Fatalf("state lost without reset_session: search_path %q, %d channels, %d temporary tables, app.rs %q", path, listening, temps, tenant.String)
			}
			// An advisory lock left behind is released before the next
			// user gets the connection (checked from another session).
			if _, err := db.ExecContext(ctx, "SELECT pg_advisory_lock(98)"); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, "SELECT 1"); err != nil { // a checkout: the reset
				t.Fatal(err)
			}
			other, _ := openDB(t, "")
			var got bool
			if err := other.QueryRowContext(ctx, "SELECT pg_try_advisory_lock(98)").Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != on {
				t.Fatalf("another session took the lock: %v, want %v", got, on)
			}
			other.ExecContext(ctx, "SELECT pg_advisory_unlock_all()")
		})
	}
}

// TestIntegrationResetSessionUnseenState: with reset_session=on, state a
// statement left through code that does not show it (a SQL function, a
// procedure or a DO block calling a PL/pgSQL function that calls
// set_config and takes an advisory lock) is reset too, at once, before the
// connection's next user gets it, even one that only reads on replicas:
// pgryw cannot see such state, so a call of a volatile function of the
// database's, a CALL and a DO block count as leaving state behind.
func TestIntegrationResetSessionUnseenState(t *testing.T) {
	ctx := context.Background()
	setup, _ := openDB(t, "")
	for _, q := range []string{
		"CREATE OR REPLACE FUNCTION rs_inner() RETURNS int LANGUAGE plpgsql AS $$BEGIN PERFORM set_config('app.rs2', 'left', false); PERFORM pg_advisory_lock(88); RETURN 1; END$$",
		"CREATE OR REPLACE FUNCTION rs_outer() RETURNS int LANGUAGE sql AS 'SELECT rs_inner()'",
		"CREATE OR REPLACE PROCEDURE rs_proc() LANGUAGE sql AS 'SELECT rs_inner()'",
	} {
		if _, err := setup.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		setup.Exec("DROP PROCEDURE IF EXISTS rs_proc(); DROP FUNCTION IF EXISTS rs_outer(), rs_inner()")
	})
	db, _ := openDB(t, "reset_session=on")
	db.SetMaxOpenConns(1)
	for _, q := range []string{"SELECT rs_outer()", "CALL rs_proc()", "DO $$BEGIN PERFORM rs_inner(); END$$"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
		// The next user only reads, on a replica: the lock must be gone
		// all the same, before it gets the connection.
		var one int
		onReplica(t, ctx, db, "SELECT 1", &one)
		other, _ := openDB(t, "")
		var got bool
		if err := other.QueryRowContext(ctx, "SELECT pg_try_advisory_lock(88)").Scan(&got); err != nil {
			t.Fatal(err)
		}
		other.ExecContext(ctx, "SELECT pg_advisory_unlock_all()")
		var tenant sql.NullString
		if err := db.QueryRowContext(pgryw.WithPrimary(ctx), "SELECT current_setting('app.rs2', true)").Scan(&tenant); err != nil {
			t.Fatal(err)
		}
		if tenant.String != "" || !got {
			t.Fatalf("%s: state survived the reset: app.rs2 %q; another session could take the lock: %v", q, tenant.String, got)
		}
	}
}

// TestIntegrationEndedWriterSessionStateGone: a pooled connection holds
// session state on the writer (an advisory lock, which pins its reads
// there, and a setting, which its replica reads carry) when the server
// ends that session while the connection sits idle in the pool
// (pg_terminate_backend). The next statement runs on a new writer session
// with no error, and the ended session's state is gone with it, as README
// says: the connection is no longer pinned, its reads go to replicas
// again, and without the setting.
func TestIntegrationEndedWriterSessionStateGone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, c := openDB(t, "")
	db.SetMaxOpenConns(1)
	for _, q := range []string{"SELECT pg_advisory_lock(97)", "SET application_name = 'st_ended'"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if got := c.Stats().Pinned; got != 1 {
		t.Fatalf("Stats.Pinned = %d after taking an advisory lock, want 1", got)
	}
	var pid int
	if err := db.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	admin, err := sql.Open("pgx", cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var ok bool
	if err := admin.QueryRowContext(ctx, "SELECT pg_terminate_backend($1, 5000)", pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %v, %v", pid, ok, err)
	}
	time.Sleep(50 * time.Millisecond) // for the session's last words to cross loopback
	var newPID int
	if err := db.QueryRowContext(ctx, "SELECT pg_backend_pid() /* pgryw:primary */").Scan(&newPID); err != nil {
		t.Fatalf("first statement on the writer after its session ended: %v", err)
	}
	if newPID == pid {
		t.Fatalf("still on writer session %d", pid)
	}
	if got := c.Stats().Pinned; got != 0 {
		t.Errorf("Stats.Pinned = %d after the pinned session ended, want 0", got)
	}
	var name string
	if !onReplica(t, ctx, db, "SELECT current_setting('application_name')", &name) {
		t.Error("a read after the pinned session ended stayed on the primary")
	}
	if name == "st_ended" {
		t.Error("the ended session's setting still travels with replica reads")
	}
}
