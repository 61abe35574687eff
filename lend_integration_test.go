package pgryw_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// Replica connections are lent: a Conn borrows one for its reads and gives
// it back when database/sql takes the Conn back. Eight Conns, held at
// once and reading one after another, each given back after its read,
// are served by one replica connection, not eight; and that connection
// serves each with its own settings only, as pgx on the primary would
// give each its own session: one Conn's search_path does not reach the
// next, and one that set a custom parameter keeps its connection to
// itself (a session keeps such a parameter defined, as ”, after a reset).
func TestIntegrationLentReplicaConnections(t *testing.T) {
	ctx := context.Background()
	pgtest.Require(t, cluster)
	app := fmt.Sprintf("pgryw_lend_%d", time.Now().UnixNano())
	// The SETs' positions bound the reads after them (monotonic reads):
	// a replica still replaying an earlier test's writes must not send
	// them to the primary.
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	db, c := openDSN(t, cluster.WriterDSN()+"&application_name="+app+"&wait_timeout=10s&replicas="+cluster.ReplicaAddrs()[0])
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	var conns []*sql.Conn
	for range 8 {
		cn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, cn)
	}
	exec := func(cn *sql.Conn, q string) {
		t.Helper()
		if _, err := cn.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	pids := map[int]bool{}
	for i, cn := range conns {
		switch i {
		case 2:
			exec(cn, "SET search_path TO pg_catalog, public")
		case 5:
			exec(cn, "SET app.lend_probe = 'five'")
		}
		var pid int
		var by pgryw.ServedBy
		sctx := pgryw.WithServedBy(ctx, func(_ context.Context, s pgryw.ServedBy) { by = s })
		if !onReplica(t, sctx, cn, "SELECT ryw_backend()", &pid) {
			t.Fatalf("conn %d: the read did not run on the replica: %+v; stats %+v", i, by, c.Stats())
		}
		pids[pid] = true
		var path string
		onReplica(t, ctx, cn, "SELECT current_setting('search_path')", &path)
		if want := map[bool]string{true: "pg_catalog, public", false: `"$user", public`}[i == 2]; path != want {
			t.Errorf("conn %d: search_path %q on the replica, want %q", i, path, want)
		}
		var custom sql.NullString
		onReplica(t, ctx, cn, "SELECT current_setting('app.lend_probe', true)", &custom)
		want := sql.NullString{}
		if i == 5 {
			want = sql.NullString{String: "five", Valid: true}
		}
		if custom != want {
			t.Errorf("conn %d: app.lend_probe %+v on the replica, want %+v (as a session of its own)", i, custom, want)
		}
		if err := cn.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// Conn 5's connection stays with it (a custom parameter), and Conn
	// 6 borrowed the one the others gave back.
	if len(pids) != 2 {
		t.Errorf("%d replica connections served 8 Conns reading one after another, want 2", len(pids))
	}
	if n := pgryw.IdleReplicaConns(c, 0); n != 1 {
		t.Errorf("%d replica connections idle after the reads, want 1", n)
	}
	r0, err := sql.Open("pgx", cluster.ReplicaDSN(0))
	if err != nil {
		t.Fatal(err)
	}
	defer r0.Close()
	var held int
	if err := r0.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND backend_type = 'client backend'", app).Scan(&held); err != nil {
		t.Fatal(err)
	}
	// The monitor's own connection comes beside them.
	if held > 3 {
		t.Errorf("the replica holds %d of the pool's connections, want at most 3 (two lent, the monitor's)", held)
	}
}

// twoLendConns opens a pool on one replica and two of its connections,
// so that what one gives back the other borrows.
func twoLendConns(t *testing.T, extra string) (*sql.DB, *pgryw.Connector, *sql.Conn, *sql.Conn) {
	t.Helper()
	pgtest.Require(t, cluster)
	if err := cluster.WaitCaughtUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	db, c := openDSN(t, cluster.WriterDSN()+"&wait_timeout=10s&replicas="+cluster.ReplicaAddrs()[0]+extra)
	db.SetMaxOpenConns(2)
	db.SetMaxIdleConns(2)
	ctx := context.Background()
	var cs [2]*sql.Conn
	for i := range cs {
		cn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cn.Close() })
		cs[i] = cn
	}
	return db, c, cs[0], cs[1]
}

// A SET LOCAL of a custom parameter in a read-only transaction on the
// replica leaves the parameter defined, as ”, in that replica session:
// its connection is not lent to the next Conn, whose session (as pgx's on
// the primary) has no such parameter.
func TestIntegrationLentReplicaSetLocal(t *testing.T) {
	ctx := context.Background()
	_, _, a, b := twoLendConns(t, "")
	tx, err := a.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var rec bool
	if err := tx.QueryRowContext(ctx, "SELECT "+nodeStandby).Scan(&rec); err != nil || !rec {
		t.Fatalf("the read-only transaction is not on the replica: %v, %v", rec, err)
	}
	if _, err := tx.ExecContext(ctx, "SET LOCAL app.lend_local = '7'"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	var got sql.NullString
	if !onReplica(t, ctx, b, "SELECT current_setting('app.lend_local', true)", &got) {
		t.Fatal("the read did not run on the replica")
	}
	if got.Valid {
		t.Fatalf("another Conn sees app.lend_local = %q on the replica; a session of its own has none", got.String)
	}
}

// A Conn whose session authorization was set gives its replica
// connection back; the next Conn, with a SET ROLE of its own, reads there
// as its role: the last user's session_authorization is reset before the
// new role is set, not after (which would reset the role too, and read as
// the login role).
func TestIntegrationLentReplicaRole(t *testing.T) {
	ctx := context.Background()
	setup, _ := openDB(t, "")
	for _, q := range []string{
		"DROP ROLE IF EXISTS lend_alice", "DROP ROLE IF EXISTS lend_bob",
		"CREATE ROLE lend_bob", "CREATE ROLE lend_alice IN ROLE lend_bob",
	} {
		if _, err := setup.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { setup.Exec("DROP ROLE IF EXISTS lend_alice"); setup.Exec("DROP ROLE IF EXISTS lend_bob") })
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	_, _, a, b := twoLendConns(t, "")
	if _, err := a.ExecContext(ctx, "SET SESSION AUTHORIZATION lend_alice"); err != nil {
		t.Fatal(err)
	}
	var who string
	if !onReplica(t, ctx, a, "SELECT current_user::text", &who) || who != "lend_alice" {
		t.Fatalf("the first Conn reads on the replica as %q, want lend_alice", who)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ExecContext(ctx, "SET ROLE lend_bob"); err != nil {
		t.Fatal(err)
	}
	var prim string
	if err := b.QueryRowContext(ctx, "/* pgryw:primary */ SELECT current_user::text").Scan(&prim); err != nil {
		t.Fatal(err)
	}
	if !onReplica(t, ctx, b, "SELECT current_user::text", &who) {
		t.Fatal("the read did not run on the replica")
	}
	if who != prim {
		t.Fatalf("the second Conn reads on the replica as %q, on the primary as %q", who, prim)
	}
}

// The limits the application puts on its pool bound the replicas'
// connections too: with no idle connections kept, a replica keeps none of
// the pool's once its Conns are closed (the monitor's alone remains).
func TestIntegrationLentReplicaIdleLimit(t *testing.T) {
	ctx := context.Background()
	pgtest.Require(t, cluster)
	app := fmt.Sprintf("pgryw_lend_idle_%d", time.Now().UnixNano())
	db, c := openDSN(t, cluster.WriterDSN()+"&application_name="+app+"&replicas="+cluster.ReplicaAddrs()[0])
	db.SetMaxOpenConns(10)
	db.SetMaxIdleConns(0)
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var x int
			if err := db.QueryRowContext(ctx, "SELECT 1 FROM pg_sleep(0.05)").Scan(&x); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	r0, err := sql.Open("pgx", cluster.ReplicaDSN(0))
	if err != nil {
		t.Fatal(err)
	}
	defer r0.Close()
	var held int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err := r0.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND backend_type = 'client backend'", app).Scan(&held); err != nil {
			t.Fatal(err)
		}
		if held <= 1 || time.Now().After(deadline) {
			break
		}
	}
	if held > 1 || pgryw.IdleReplicaConns(c, 0) != 0 {
		t.Fatalf("the replica holds %d of a pool with no connection open (%d idle lent)", held, pgryw.IdleReplicaConns(c, 0))
	}
}
