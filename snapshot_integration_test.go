package pgryw_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// snapTx is a transaction as the snapshot program uses it, of database/sql
// or of pgx.
type snapTx interface {
	query(ctx context.Context, q string) (string, error)
	commit(ctx context.Context) error
}

type sqlSnapTx struct{ tx *sql.Tx }

func (s sqlSnapTx) query(ctx context.Context, q string) (string, error) {
	var v string
	err := s.tx.QueryRowContext(ctx, q).Scan(&v)
	return v, err
}

func (s sqlSnapTx) commit(context.Context) error { return s.tx.Commit() }

type pgxSnapTx struct{ tx pgx.Tx }

func (s pgxSnapTx) query(ctx context.Context, q string) (string, error) {
	var v any
	err := s.tx.QueryRow(ctx, q).Scan(&v)
	return fmt.Sprint(v), err
}

func (s pgxSnapTx) commit(ctx context.Context) error { return s.tx.Commit(ctx) }

// plainPgxPool opens a pgxpool on the primary alone, closed with the test:
// the pgx program pgryw's Pool is compared with.
func plainPgxPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// snapProgram is a read-only REPEATABLE READ transaction that reads a
// table (taking its snapshot), lets another session commit a row, and goes
// on with node, the statements that must be answered by the primary,
// before it reads the table again and fails a statement. It returns what a
// program sees, line by line. begin opens the transaction after the first
// row is written.
func snapProgram(t *testing.T, table string, node []string, begin func(ctx context.Context) snapTx) []string {
	ctx := context.Background()
	var out []string
	see := func(what string, v string, err error) {
		if err != nil {
			v = "error " + errText(err)
		}
		out = append(out, what+": "+v)
	}
	tx := begin(ctx)
	v, err := tx.query(ctx, "SELECT count(*) FROM "+table)
	see("first read", v, err)
	other, err := pgx.Connect(ctx, cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	if _, err := other.Exec(ctx, "INSERT INTO "+table+" VALUES (2, 1)"); err != nil {
		t.Fatal(err)
	}
	for _, q := range node {
		v, err := tx.query(ctx, q)
		see(q, v, err)
	}
	v, err = tx.query(ctx, "SELECT count(*) FROM "+table)
	see("second read", v, err)
	v, err = tx.query(ctx, "SELECT current_setting('port')::bool")
	see("failing node read", v, err)
	v, err = tx.query(ctx, "SELECT count(*) FROM "+table)
	see("after the failure", v, err)
	see("commit", "", tx.commit(ctx))
	return out
}

// TestIntegrationReadOnlySnapshotKept: a read-only REPEATABLE READ
// transaction on a replica answers reads of node identity
// (pg_is_in_recovery(), inet_server_port(), SHOW in_hot_standby) from the
// primary, as pgx on the primary does, and keeps its snapshot: it sees the
// same rows as pgx's transaction, through database/sql and through the
// Pool. A failing one aborts it as it does pgx's. The controls: a
// statement with lasting effects (a session SET), and a read of node-local
// state that is not such a probe (pg_stat_replication, which PostgreSQL
// freezes for the rest of a transaction), still move the transaction, and
// the rest of it sees the row pgx's transaction does not (the intended
// difference in docs/guarantees.md, counted in Stats.SnapshotMoves).
func TestIntegrationReadOnlySnapshotKept(t *testing.T) {
	pgtest.Require(t, cluster)
	nodeReads := []string{
		"SELECT pg_is_in_recovery()",
		"SELECT pg_catalog.inet_server_port() AS port",
		"SHOW in_hot_standby",
		"SELECT current_setting('port')",
	}
	opts := &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}
	popts := pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}

	// fresh creates the table with its first row, seen by the replicas.
	fresh := func(t *testing.T) string {
		table := newTable(t)
		conn, err := pgx.Connect(context.Background(), cluster.WriterDSN())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "INSERT INTO "+table+" VALUES (1, 1)"); err != nil {
			t.Fatal(err)
		}
		if err := cluster.WaitCaughtUp(context.Background()); err != nil {
			t.Fatal(err)
		}
		return table
	}
	// onReplica fails the test unless c's transactions began on a replica
	// (else the comparison shows nothing) and moved as many times as want.
	onReplica := func(t *testing.T, c *pgryw.Connector, begins *[]pgryw.ServedBy, moves int64) {
		t.Helper()
		for _, s := range *begins {
			if s.Role != pgryw.RoleReplica {
				t.Fatalf("a transaction began on %s (%s): the program needs it on a replica", s.Addr, s.Route)
			}
		}
		if len(*begins) == 0 {
			t.Fatal("no transaction began")
		}
		if got := c.Stats().SnapshotMoves; got != moves {
			t.Fatalf("Stats.SnapshotMoves = %d, want %d", got, moves)
		}
	}
	hook := func(c *pgryw.Connector) *[]pgryw.ServedBy {
		var begins []pgryw.ServedBy
		c.SetServedBy(func(_ context.Context, s pgryw.ServedBy) {
			if s.Begin {
				begins = append(begins, s)
			}
		})
		return &begins
	}

	sqlRun := func(t *testing.T, node []string) (want, got []string, c *pgryw.Connector, begins *[]pgryw.ServedBy) {
		plain, err := sql.Open("pgx", cluster.WriterDSN())
		if err != nil {
			t.Fatal(err)
		}
		defer plain.Close()
		db, c := openDB(t, "")
		begins = hook(c)
		for side, d := range []*sql.DB{plain, db} {
			out := snapProgram(t, fresh(t), node, func(ctx context.Context) snapTx {
				tx, err := d.BeginTx(ctx, opts)
				if err != nil {
					t.Fatal(err)
				}
				return sqlSnapTx{tx}
			})
			if side == 0 {
				want = out
			} else {
				got = out
			}
		}
		return want, got, c, begins
	}
	pgxRun := func(t *testing.T, node []string) (want, got []string, c *pgryw.Connector, begins *[]pgryw.ServedBy) {
		plain, pool := plainPgxPool(t), openPool(t, "")
		c = pool.Connector()
		begins = hook(c)
		want = snapProgram(t, fresh(t), node, func(ctx context.Context) snapTx {
			tx, err := plain.BeginTx(ctx, popts)
			if err != nil {
				t.Fatal(err)
			}
			return pgxSnapTx{tx}
		})
		got = snapProgram(t, fresh(t), node, func(ctx context.Context) snapTx {
			tx, err := pool.BeginTx(ctx, popts)
			if err != nil {
				t.Fatal(err)
			}
			return pgxSnapTx{tx}
		})
		return want, got, c, begins
	}

	for name, run := range map[string]func(*testing.T, []string) ([]string, []string, *pgryw.Connector, *[]pgryw.ServedBy){
		"database/sql": sqlRun, "pgx": pgxRun,
	} {
		t.Run(name, func(t *testing.T) {
			want, got, c, begins := run(t, nodeReads)
			if !slices.Equal(want, got) {
				t.Fatalf("pgx:\n  %s\npgryw:\n  %s", strings.Join(want, "\n  "), strings.Join(got, "\n  "))
			}
			if want[len(nodeReads)+1] != "second read: 1" {
				t.Fatalf("pgx's transaction saw %q: the program shows nothing", want[len(nodeReads)+1])
			}
			onReplica(t, c, begins, 0)
		})
		for _, move := range []string{"SELECT set_config('search_path', 'public', false)", "SELECT count(*) FROM pg_stat_replication"} {
			t.Run(name+"/control: "+move+" moves it", func(t *testing.T) {
				want, got, c, begins := run(t, []string{move})
				if want[2] != "second read: 1" || got[2] != "second read: 2" {
					t.Fatalf("second reads: pgx %q, pgryw %q; want the moved transaction to see the other session's row", want[2], got[2])
				}
				onReplica(t, c, begins, 1)
			})
		}
	}
}

// TestIntegrationReadOnlySnapshotTakenLate: a read-only REPEATABLE READ
// transaction on a replica takes its snapshot at its first statement that
// takes one, not at a SHOW or SET LOCAL before it. When the pool's
// watermark rises in between (another connection of the pool writes,
// session_scope=db) the transaction moves to the primary before that
// statement, and it sees the write, as pgx's transaction on the primary
// does. Counting the SHOW as the snapshot kept it on a replica 300 ms
// behind, where the read missed the write.
func TestIntegrationReadOnlySnapshotTakenLate(t *testing.T) {
	table := newTable(t)
	setDelay(t, 300*time.Millisecond)
	ctx := context.Background()
	db, c := openDB(t, "session_scope=db&wait_timeout=2s")
	begins := []pgryw.ServedBy{}
	c.SetServedBy(func(_ context.Context, s pgryw.ServedBy) {
		if s.Begin {
			begins = append(begins, s)
		}
	})
	firsts := [][]string{
		{"SHOW search_path"},
		{"SET LOCAL statement_timeout = '5s'"},
		{""},
		// A statement that fails before it takes a snapshot.
		{"SAVEPOINT s", "SELECT 1 1", "ROLLBACK TO SAVEPOINT s"},
	}
	for i, first := range firsts {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
		noCallerError(t, "BEGIN", err)
		for _, q := range first {
			if _, err := tx.ExecContext(ctx, q); err != nil && q != "SELECT 1 1" {
				t.Fatalf("%q: %v", q, err)
			}
		}
		_, err = db.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s VALUES (%d, 1)", table, i+1))
		noCallerError(t, "insert", err)
		if n := countRows(t, ctx, tx, table); n != i+1 {
			t.Errorf("after %q: the transaction's first read saw %d rows, want %d (the pool's write before it)", first, n, i+1)
		}
		noCallerError(t, "COMMIT", tx.Commit())
	}
	if len(begins) != len(firsts) {
		t.Fatalf("%d transactions began, want %d", len(begins), len(firsts))
	}
	for _, b := range begins {
		if b.Role != pgryw.RoleReplica {
			t.Fatalf("transactions began on %+v: the test needs them on a replica", begins)
		}
	}
	if n := c.Stats().SnapshotMoves; n != 0 {
		t.Fatalf("Stats.SnapshotMoves = %d: no snapshot was taken before the moves", n)
	}
}

// TestIntegrationReadOnlyProbeClientError: a probe that pgx fails before
// sending it (a wrong number of arguments) leaves the read-only
// transaction usable, as pgx's, where pgryw aborted it.
func TestIntegrationReadOnlyProbeClientError(t *testing.T) {
	pgtest.Require(t, cluster)
	table := newTable(t)
	ctx := context.Background()
	plain, pool := plainPgxPool(t), openPool(t, "")
	run := func(begin func() (pgx.Tx, error)) []string {
		tx, err := begin()
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		var out []string
		for _, q := range []struct {
			sql  string
			args []any
		}{{"SELECT count(*) FROM " + table, nil}, {"SELECT pg_is_in_recovery()", []any{1}}, {"SELECT count(*) FROM " + table, nil}} {
			var v any
			err := tx.QueryRow(ctx, q.sql, q.args...).Scan(&v)
			out = append(out, fmt.Sprintf("%s: %v, error %v", q.sql, v, err != nil))
		}
		return out
	}
	opts := pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}
	want := run(func() (pgx.Tx, error) { return plain.BeginTx(ctx, opts) })
	got := run(func() (pgx.Tx, error) { return pool.BeginTx(ctx, opts) })
	if !slices.Equal(want, got) {
		t.Fatalf("pgx:\n  %s\npgryw:\n  %s", strings.Join(want, "\n  "), strings.Join(got, "\n  "))
	}
}

// TestIntegrationReadOnlySerializableDefaultAfterShow: with SERIALIZABLE
// as the session's default isolation (here from the DSN), a standby
// refuses a read-only transaction when it takes its snapshot, not at
// BEGIN. After a SHOW, the refused read moves the transaction to the
// primary and succeeds, as with pgx; pgryw returned the standby's refusal
// when it took the SHOW for the transaction's first statement.
func TestIntegrationReadOnlySerializableDefaultAfterShow(t *testing.T) {
	table := newTable(t)
	ctx := context.Background()
	db, _ := openDB(t, "default_transaction_isolation=serializable")
	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	noCallerError(t, "BEGIN", err)
	defer tx.Rollback()
	var iso string
	noCallerError(t, "SHOW", tx.QueryRowContext(ctx, "SHOW transaction_isolation").Scan(&iso))
	if iso != "serializable" {
		t.Fatalf("transaction_isolation %q: the test needs serializable as the default", iso)
	}
	countRows(t, ctx, tx, table)
	noCallerError(t, "COMMIT", tx.Commit())
}

// TestIntegrationReadOnlyPrepareTakesSnapshot: preparing a query in a
// read-only REPEATABLE READ transaction takes its snapshot (the server's
// parse analysis does), as in pgx's transaction on the primary. A write
// the pool makes afterwards is not seen by the prepared read: pgryw kept
// the transaction on its replica, where it had moved it to the primary
// under a newer snapshot.
func TestIntegrationReadOnlyPrepareTakesSnapshot(t *testing.T) {
	pgtest.Require(t, cluster)
	ctx := context.Background()
	plain, err := sql.Open("pgx", cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	db, c := openDB(t, "session_scope=db")
	var out [2]string
	for side, d := range []*sql.DB{plain, db} {
		table := newTable(t)
		tx, err := d.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
		noCallerError(t, "BEGIN", err)
		st, err := tx.PrepareContext(ctx, "SELECT count(*) FROM "+table)
		noCallerError(t, "prepare", err)
		_, err = d.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1, 1)")
		noCallerError(t, "insert", err)
		var n int
		noCallerError(t, "read", st.QueryRowContext(ctx).Scan(&n))
		out[side] = fmt.Sprint(n)
		noCallerError(t, "COMMIT", tx.Commit())
	}
	if out[0] != out[1] {
		t.Fatalf("the prepared read saw %s rows with pgx, %s with pgryw", out[0], out[1])
	}
	if n := c.Stats().SnapshotMoves; n != 0 {
		t.Fatalf("Stats.SnapshotMoves = %d, want 0", n)
	}
}
