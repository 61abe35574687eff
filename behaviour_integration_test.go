package pgryw_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// Server errors reach the caller as *pgconn.PgError, by errors.As and by a
// plain type assertion (GORM uses the latter), from the primary and from a
// replica.
func TestIntegrationErrorsUnwrapped(t *testing.T) {
	db, _ := openDB(t, "")
	_, werr := db.Exec("INSERT INTO no_such_table VALUES (1)")
	rows, rerr := db.Query("SELECT * FROM no_such_table")
	if rows != nil {
		rows.Close()
	}
	for name, err := range map[string]error{"primary": werr, "replica": rerr} {
		if _, ok := err.(*pgconn.PgError); !ok {
			t.Errorf("%s: error %T (%v) is not a *pgconn.PgError", name, err, err)
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
			t.Errorf("%s: errors.As: %v", name, err)
		}
	}
}

// A caller's deadline ends a wait promptly, long before wait_timeout.
func TestIntegrationContextEndsWait(t *testing.T) {
	pgtest.Require(t, cluster)
	ctx := context.Background()
	if err := cluster.PauseReplay(ctx, -1); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cluster.ResumeReplay(ctx, -1); err != nil {
			t.Fatal(err)
		}
	}()
	db, _ := openDB(t, "wait_timeout=10s")
	table := newTableNoWait(t)
	if _, err := db.Exec("INSERT INTO " + table + " VALUES (1, 1)"); err != nil {
		t.Fatal(err)
	}
	for _, dl := range []time.Duration{50 * time.Millisecond, 200 * time.Millisecond} {
		cctx, cancel := context.WithTimeout(ctx, dl)
		start := time.Now()
		var v int
		err := db.QueryRowContext(cctx, "SELECT v FROM "+table+" WHERE id = 1").Scan(&v)
		took := time.Since(start)
		cancel()
		// The wait's budget is what is left of the deadline; when it runs
		// out, on_timeout=primary reads the primary, which may still fit
		// before the deadline (then the row is there) or not.
		switch {
		case err == nil && v != 1:
			t.Errorf("deadline %v: read %d, want the row", dl, v)
		case err != nil && !errors.Is(err, context.DeadlineExceeded):
			t.Errorf("deadline %v: got %v, want the row or context.DeadlineExceeded", dl, err)
		}
		// Generous: this is a bound on promptness, not a timing assertion
		// on speed; a wait that ignored the context would take 10s.
		if took > dl+2*time.Second {
			t.Errorf("deadline %v: the read returned after %v", dl, took)
		}
	}
}

// newTableNoWait creates a table on the primary without waiting for replicas
// (they may be paused).
func newTableNoWait(t *testing.T) string {
	t.Helper()
	pgtest.Require(t, cluster)
	name := "ryw_nowait_" + time.Now().Format("150405_000000")
	conn, err := pgx.Connect(context.Background(), cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), "CREATE TABLE "+name+" (id bigint PRIMARY KEY, v int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return name
}

// Monotonic reads: once a session has seen a row on one replica, it never
// reads from a replica that has not replayed it, even without writing
// itself. Replica 1 is paused; another client's row reaches replica 0 only.
// With read_your_writes=off (the control) the same reads flip between seen
// and unseen as they rotate over the replicas.
// waitPositionsKnown waits until the monitor of db's connector c (started
// by db's first connection) has read a replay position of every replica.
func waitPositionsKnown(t *testing.T, db *sql.DB, c *pgryw.Connector) {
	t.Helper()
	if err := db.Ping(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		known := 0
		for _, ns := range c.NodeStats() {
			if ns.Role == pgryw.RoleReplica && ns.Position > 0 {
				known++
			}
		}
		if known == len(cluster.Replicas) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the monitor knows %d of %d replicas' positions after 10s", known, len(cluster.Replicas))
		}
	}
}

func TestIntegrationMonotonicReads(t *testing.T) {
	ctx := context.Background()
	table := newTable(t)
	if err := cluster.PauseReplay(ctx, 1); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cluster.ResumeReplay(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}()
	other, err := pgx.Connect(ctx, cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	if _, err := other.Exec(ctx, "INSERT INTO "+table+" VALUES (1, 1)"); err != nil {
		t.Fatal(err)
	}
	r0, err := pgx.Connect(ctx, cluster.ReplicaDSN(0))
	if err != nil {
		t.Fatal(err)
	}
	defer r0.Close(ctx)
	for deadline := time.Now().Add(10 * time.Second); ; {
		var n int
		if err := r0.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("replica 0 never replayed the row")
		}
		time.Sleep(10 * time.Millisecond)
	}
	flips := func(extra string) (seenThenUnseen int, seen int) {
		db, c := openDB(t, "wait_timeout=20ms&session_scope=conn&"+extra)
		db.SetMaxOpenConns(1)
		if extra == "" {
			// Let the monitor learn both replicas' positions: until it
			// has, a read sticks to the replica it knows (the paused
			// one) and sees nothing, which proves nothing either way.
			waitPositionsKnown(t, db, c)
		} else {
			time.Sleep(300 * time.Millisecond)
		}
		was := false
		for i := 0; i < 40; i++ {
			var n int
			if err := db.QueryRow("SELECT count(*) FROM " + table).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 1 {
				seen++
				was = true
			} else if was {
				seenThenUnseen++
			}
		}
		return seenThenUnseen, seen
	}
	if back, seen := flips(""); back != 0 || seen == 0 {
		t.Errorf("pgryw: %d reads went back in time after the row was seen (%d seen)", back, seen)
	}
	if back, _ := flips("read_your_writes=off"); back == 0 {
		t.Errorf("control: read_your_writes=off never went back in time; the test proves nothing")
	}
	_ = sql.ErrNoRows
}
