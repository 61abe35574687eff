package pgryw_test

import (
	"context"
	"database/sql"
	"fmt"
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
	db, c := openDSN(t, cluster.WriterDSN()+"&application_name="+app+"&replicas="+cluster.ReplicaAddrs()[0])
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
		if !onReplica(t, ctx, cn, "SELECT ryw_backend()", &pid) {
			t.Fatalf("conn %d: the read did not run on the replica", i)
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
