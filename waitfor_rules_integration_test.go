package pgryw_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// PostgreSQL 19.0's lock rule against pgryw, through the WAIT FOR
// emulation in front of real standbys: pgryw never sends a wait (or a
// replay poll) on a replica connection that holds a lock, and a 55000 from
// a wait never reaches the caller.

// waitForNotes is what the emulation saw at each locked wait or poll.
func waitForNotes(ps []*pgtest.WaitForProxy) (out []string) {
	for _, p := range ps {
		out = append(out, p.Notes()...)
	}
	return out
}

func waitForCounts(ps []*pgtest.WaitForProxy) pgtest.WaitForCounts {
	var n pgtest.WaitForCounts
	for _, p := range ps {
		n = n.Add(p.Counts())
	}
	return n
}

// noCallerError fails the test on an error of the lock rule's (55000) or
// any other.
func noCallerError(t *testing.T, what string, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55000" {
		t.Fatalf("%s: a 55000 reached the caller: %v", what, err)
	}
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func TestIntegrationWaitForLockRule(t *testing.T) {
	table := newTable(t)
	setDelay(t, 50*time.Millisecond)
	ctx := context.Background()
	next := 0
	insert := func(db *sql.DB) {
		t.Helper()
		next++
		_, err := db.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s VALUES (%d, 1)", table, next))
		noCallerError(t, "insert", err)
	}

	t.Run("read-only transaction whose watermark rises", func(t *testing.T) {
		db, c, ps := openWaitForDB(t, "wait_timeout=2s")
		before := waitForCounts(ps)
		insert(db)
		tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		noCallerError(t, "BEGIN READ ONLY", err)
		// Its first statement takes a lock on the table (until the end of
		// the transaction) ...
		if n := countRows(t, ctx, tx, table); n != next {
			t.Fatalf("first read in the transaction: %d rows, want %d", n, next)
		}
		// ... and the pool's watermark rises past what the replica was
		// checked for: no wait goes out inside the transaction.
		insert(db)
		for i := 0; i < 3; i++ {
			var n int
			noCallerError(t, "read in the transaction", tx.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n))
		}
		noCallerError(t, "COMMIT", tx.Commit())
		// After it, reads see every write again.
		if n := countRows(t, ctx, db, table); n != next {
			t.Fatalf("after the transaction: %d rows, want %d", n, next)
		}
		d := waitForCounts(ps).Sub(before)
		if d.LockedWaits != 0 || d.LockedPolls != 0 || d.LockRefusals != 0 || d.Emulated == 0 {
			t.Fatalf("emulation counts %+v; want waits, none while a lock is held; %q", d, waitForNotes(ps))
		}
		if c.Stats().WaitRefusals != 0 {
			t.Fatalf("stats %+v", c.Stats())
		}
	})

	t.Run("connection holding a session advisory lock", func(t *testing.T) {
		db, _, ps := openWaitForDB(t, "wait_timeout=2s")
		conn := oneConn(t, db)
		before := waitForCounts(ps)
		_, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock(4242)")
		noCallerError(t, "lock", err)
		for i := 0; i < 5; i++ {
			next++
			_, err := conn.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s VALUES (%d, 1)", table, next))
			noCallerError(t, "insert", err)
			// Pinned by the lock: on the primary, no wait at all.
			if n := countRows(t, ctx, conn, table); n != next {
				t.Fatalf("pinned read: %d rows, want %d", n, next)
			}
			// A replica hint: on a replica connection, which holds no lock.
			var n int
			noCallerError(t, "hinted read", conn.QueryRowContext(ctx, "SELECT count(*) FROM "+table+" /* pgryw:replica */").Scan(&n))
			if n != next {
				t.Fatalf("hinted read: %d rows, want %d", n, next)
			}
		}
		_, err = conn.ExecContext(ctx, "SELECT pg_advisory_unlock(4242)")
		noCallerError(t, "unlock", err)
		d := waitForCounts(ps).Sub(before)
		if d.LockedWaits != 0 || d.LockedPolls != 0 || d.LockRefusals != 0 || d.Emulated == 0 {
			t.Fatalf("emulation counts %+v; want waits, none while a lock is held; %q", d, waitForNotes(ps))
		}
	})

	t.Run("a function told to read only takes a lock", func(t *testing.T) {
		// pgryw cannot see a session lock that a function it was told only
		// reads takes on a replica: the emulated lock rule refuses the
		// next wait there, and pgryw takes the read elsewhere.
		w, err := sql.Open("pgx", cluster.WriterDSN())
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if _, err := w.Exec(`CREATE OR REPLACE FUNCTION wf_sneaky_lock() RETURNS int LANGUAGE sql STABLE AS 'SELECT 1 FROM (SELECT pg_advisory_lock(777)) x'`); err != nil {
			t.Fatal(err)
		}
		setDelay(t, 0)
		if err := cluster.WaitCaughtUp(ctx); err != nil {
			t.Fatal(err)
		}
		setDelay(t, 50*time.Millisecond)
		db, c, ps := openWaitForDB(t, "wait_timeout=2s&read_functions=wf_sneaky_lock")
		conn := oneConn(t, db)
		before := waitForCounts(ps)
		for i := 0; i < 6; i++ {
			var one int
			noCallerError(t, "the function", conn.QueryRowContext(ctx, "SELECT wf_sneaky_lock()").Scan(&one))
			next++
			_, err := conn.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s VALUES (%d, 1)", table, next))
			noCallerError(t, "insert", err)
			if n := countRows(t, ctx, conn, table); n != next {
				t.Fatalf("read after write: %d rows, want %d", n, next)
			}
		}
		d := waitForCounts(ps).Sub(before)
		st := c.Stats()
		t.Logf("emulation %+v; stats %+v", d, st)
		if d.LockRefusals == 0 || st.WaitRefusals != d.LockRefusals {
			t.Fatalf("the lock rule fired %d times, pgryw counted %d refusals; want at least one, and the same", d.LockRefusals, st.WaitRefusals)
		}
		for _, ns := range c.NodeStats()[1:] {
			if ns.Health != pgryw.HealthUp {
				t.Errorf("replica %s %v after a refused wait", ns.Addr, ns.Health)
			}
		}
	})
}
