package pgryw_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/pgryw/pgryw/internal/pgtest"
)

// TestIntegrationIdleSessionTimeout: with idle_session_timeout in the DSN
// the servers end every connection left idle longer, pgryw's replica
// connections among them (they idle while reads go elsewhere). A program
// that pauses longer than that between statements gets the same answers
// through pgryw as through pgx, which replaces its pool's dead connections
// (database/sql's ResetSession check); no read fails, and none is stale.
func TestIntegrationIdleSessionTimeout(t *testing.T) {
	pgtest.Require(t, cluster)
	ctx := context.Background()
	setDelay(t, 50*time.Millisecond)
	table := newTable(t)
	const param = "idle_session_timeout=400"
	pdb, err := sql.Open("pgx", cluster.WriterDSN()+"&"+param)
	if err != nil {
		t.Fatal(err)
	}
	defer pdb.Close()
	db, c := openDB(t, param)
	for _, d := range []*sql.DB{pdb, db} {
		d.SetMaxOpenConns(2)
	}
	run := func(d *sql.DB, id int) (string, error) {
		if _, err := d.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s VALUES (%d, 1) ON CONFLICT (id) DO UPDATE SET v = %[1]s.v + 1", table, id)); err != nil {
			return "", err
		}
		var n, sum int
		if err := d.QueryRowContext(ctx, fmt.Sprintf("SELECT count(*), coalesce(sum(v), 0) FROM %s WHERE id = %d", table, id)).Scan(&n, &sum); err != nil {
			return "", err
		}
		return fmt.Sprintf("%d %d", n, sum), nil
	}
	for round := 0; round < 4; round++ {
		want, perr := run(pdb, 1000+round)
		got, rerr := run(db, 2000+round)
		if perr != nil || rerr != nil || want != got {
			t.Fatalf("round %d: pgx %q %v; pgryw %q %v", round, want, perr, got, rerr)
		}
		time.Sleep(1100 * time.Millisecond) // > 1 s: database/sql's ResetSession checks pgx's connection
	}
	st := c.Stats()
	t.Logf("stats %+v; nodes %v", st, c.NodeStats()[1:])
	if st.ReplicaReads == 0 {
		t.Fatal("no read reached a replica")
	}
}
