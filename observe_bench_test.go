package pgryw

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
)

// A cached read routed to a replica and a cached write on the primary, on
// scripted servers, next to pgx's stdlib driver on the same servers:
// pgryw's routing, plan, executor and reporting add no allocation to pgx's
// (database/sql's and pgx's own are the same on both sides).

// routedPair is a pgryw pool on a scripted cluster (read_your_writes=off,
// one replica) and pgx stdlib pools on its primary and its replica.
type routedPair struct {
	fc                     *fakeCluster
	pgxPrimary, pgxReplica *sql.DB
}

func newRoutedPair(tb testing.TB) *routedPair {
	fc := newFakeCluster(tb, 1, "")
	fc.replicas[0].Always(benchRead, valueRow(1))
	fc.primary.Always(benchWrite, nil)
	open := func(n *fakeNode) *sql.DB {
		db, err := sql.Open("pgx", fmt.Sprintf("host=%s port=%d user=app password=x dbname=app sslmode=disable", n.srv.Host(), n.srv.Port()))
		if err != nil {
			tb.Fatal(err)
		}
		db.SetMaxOpenConns(1)
		tb.Cleanup(func() { db.Close() })
		return db
	}
	return &routedPair{fc: fc, pgxPrimary: open(fc.primary), pgxReplica: open(fc.replicas[0])}
}

const (
	benchRead  = "SELECT v FROM t WHERE id = $1"
	benchWrite = "UPDATE t SET v = v + 1 WHERE id = $1"
)

// readOn and writeOn run the cached read and write on db.
func readOn(tb testing.TB, ctx context.Context, db *sql.DB) {
	var v int
	if err := db.QueryRowContext(ctx, benchRead, int64(7)).Scan(&v); err != nil {
		tb.Fatal(err)
	}
}

func writeOn(tb testing.TB, ctx context.Context, db *sql.DB) {
	if _, err := db.ExecContext(ctx, benchWrite, int64(7)); err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkStatementRouted runs a cached read (to the replica) and a cached
// write (to the primary) through pgryw, and the same through pgx stdlib
// pools on the same scripted servers; the sub-benchmarks differ only in
// what observes pgryw's statements. "no hook" must allocate no more than
// pgx, and "hooks" no more than "no hook".
func BenchmarkStatementRouted(b *testing.B) {
	rp := newRoutedPair(b)
	run := func(b *testing.B, ctx context.Context, read, write *sql.DB) {
		readOn(b, ctx, read)
		writeOn(b, ctx, write)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			readOn(b, ctx, read)
			writeOn(b, ctx, write)
		}
	}
	b.Run("pgx", func(b *testing.B) { run(b, context.Background(), rp.pgxReplica, rp.pgxPrimary) })
	b.Run("no hook", func(b *testing.B) { run(b, context.Background(), rp.fc.db, rp.fc.db) })
	b.Run("hooks", func(b *testing.B) {
		var n int
		rp.fc.c.SetServedBy(func(context.Context, ServedBy) { n++ })
		defer rp.fc.c.SetServedBy(nil)
		run(b, WithServedBy(context.Background(), func(_ context.Context, s ServedBy) { n += int(s.Route) }), rp.fc.db, rp.fc.db)
	})
}

// TestStatementRoutedAllocs: a cached read routed to a replica and a
// cached write on the primary allocate exactly what they do through pgx's
// stdlib driver on the same servers: the plan, the executor's state and
// the attempt stay on the stack.
func TestStatementRoutedAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts under -race mean nothing; make allocs runs this without it")
	}
	rp := newRoutedPair(t)
	ctx := context.Background()
	readOn(t, ctx, rp.fc.db)
	writeOn(t, ctx, rp.fc.db)
	if st := rp.fc.c.Stats(); st.ReplicaReads != 1 {
		t.Fatalf("%d reads reached a replica, want 1", st.ReplicaReads)
	}
	for _, c := range []struct {
		name       string
		pgryw, pgx func()
	}{
		{"read", func() { readOn(t, ctx, rp.fc.db) }, func() { readOn(t, ctx, rp.pgxReplica) }},
		{"write", func() { writeOn(t, ctx, rp.fc.db) }, func() { writeOn(t, ctx, rp.pgxPrimary) }},
	} {
		c.pgx()
		mine, theirs := testing.AllocsPerRun(200, c.pgryw), testing.AllocsPerRun(200, c.pgx)
		if mine != theirs {
			t.Errorf("%s: %v allocations through pgryw, %v through pgx", c.name, mine, theirs)
		}
	}
}
