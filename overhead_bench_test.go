package pgryw_test

import (
	"database/sql"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// BenchmarkNoReplicasOverhead runs the same point query through pgx's
// database/sql driver and through pgryw without replicas, alternating
// within one loop so both see the same machine, and reports pgryw's time as
// a ratio of pgx's (target: ≤ 1.03).
func BenchmarkNoReplicasOverhead(b *testing.B) {
	pgtest.Require(b, cluster)
	plain, err := sql.Open("pgx", cluster.WriterDSN())
	if err != nil {
		b.Fatal(err)
	}
	defer plain.Close()
	ryw, err := sql.Open("pgryw", cluster.WriterDSN())
	if err != nil {
		b.Fatal(err)
	}
	defer ryw.Close()
	const q = "SELECT $1::int + 1"
	var v int
	run := func(db *sql.DB) time.Duration {
		start := time.Now()
		if err := db.QueryRow(q, 41).Scan(&v); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for i := 0; i < 100; i++ {
		run(plain)
		run(ryw)
	}
	var tPlain, tRyw time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			tPlain += run(plain)
			tRyw += run(ryw)
		} else {
			tRyw += run(ryw)
			tPlain += run(plain)
		}
	}
	b.ReportMetric(float64(tPlain.Nanoseconds())/float64(b.N), "pgx-ns/op")
	b.ReportMetric(float64(tRyw.Nanoseconds())/float64(b.N), "pgryw-ns/op")
	b.ReportMetric(float64(tRyw)/float64(tPlain), "pgryw/pgx")
}
