package pgryw_test

import (
	"database/sql"
	"slices"
	"strings"
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
	var tPlain, tRyw time.Duration
	alternate(b, plain, ryw, 100, pointQuery(b), func(p, r time.Duration) { tPlain, tRyw = tPlain+p, tRyw+r })
	b.ReportMetric(float64(tPlain.Nanoseconds())/float64(b.N), "pgx-ns/op")
	b.ReportMetric(float64(tRyw.Nanoseconds())/float64(b.N), "pgryw-ns/op")
	b.ReportMetric(float64(tRyw)/float64(tPlain), "pgryw/pgx")
}

// BenchmarkWriteOverhead runs the same autocommit insert through pgx's
// driver and through pgryw with replicas (which reads the primary's WAL
// position in the same flush), alternating in one loop, and reports pgryw's
// time as a ratio of pgx's.
func BenchmarkWriteOverhead(b *testing.B) {
	pgtest.Require(b, cluster)
	plain, err := sql.Open("pgx", cluster.WriterDSN())
	if err != nil {
		b.Fatal(err)
	}
	defer plain.Close()
	ryw, err := sql.Open("pgryw", cluster.WriterDSN()+"&replicas="+strings.Join(cluster.ReplicaAddrs(), ","))
	if err != nil {
		b.Fatal(err)
	}
	defer ryw.Close()
	if _, err := plain.Exec("CREATE TABLE IF NOT EXISTS bench_w (id bigserial PRIMARY KEY, v int)"); err != nil {
		b.Fatal(err)
	}
	const q = "INSERT INTO bench_w (v) VALUES ($1)"
	run := func(db *sql.DB) time.Duration {
		start := time.Now()
		if _, err := db.Exec(q, 1); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	alternateP50(b, plain, ryw, run)
}

// BenchmarkReplicaReadOverhead runs the same read on a replica through
// pgx's driver and through pgryw (with no watermark pending: the read goes
// alone, as pgryw-read does in rywbench), alternating in one loop, and
// reports pgryw's p50 as a ratio of pgx's.
func BenchmarkReplicaReadOverhead(b *testing.B) {
	plain, ryw := replicaReadPools(b)
	run := pointQuery(b)
	alternateP50(b, plain, ryw, run)
}

// replicaReadPools opens pgx's pool on the first replica and pgryw's with
// that replica, both closed when b ends.
func replicaReadPools(b *testing.B) (plain, ryw *sql.DB) {
	pgtest.Require(b, cluster)
	plain, err := sql.Open("pgx", cluster.ReplicaDSN(0))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { plain.Close() })
	ryw, err = sql.Open("pgryw", cluster.WriterDSN()+"&replicas="+cluster.ReplicaAddrs()[0])
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ryw.Close() })
	return plain, ryw
}

// alternate runs run on plain and on ryw in turn, warm times each
// uncounted, then b.N times each, swapping which goes first every time, and
// hands each pair of measurements to add.
func alternate(b *testing.B, plain, ryw *sql.DB, warm int, run func(*sql.DB) time.Duration, add func(plain, ryw time.Duration)) {
	for i := 0; i < warm; i++ {
		run(plain)
		run(ryw)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			p := run(plain)
			add(p, run(ryw))
		} else {
			r := run(ryw)
			add(run(plain), r)
		}
	}
}

// alternateP50 runs run on plain and on ryw in turn (alternate, a warm-up
// of 100 each) and reports both p50s and their ratio.
func alternateP50(b *testing.B, plain, ryw *sql.DB, run func(*sql.DB) time.Duration) {
	var tPlain, tRyw []time.Duration
	alternate(b, plain, ryw, 100, run, func(p, r time.Duration) {
		tPlain, tRyw = append(tPlain, p), append(tRyw, r)
	})
	pp, pr := p50ns(tPlain), p50ns(tRyw)
	b.ReportMetric(pp, "pgx-p50-ns")
	b.ReportMetric(pr, "pgryw-p50-ns")
	b.ReportMetric(pr/pp, "pgryw/pgx-p50")
}

// p50ns is d's median, in nanoseconds (d is sorted).
func p50ns(d []time.Duration) float64 {
	slices.Sort(d)
	return float64(d[len(d)/2].Nanoseconds())
}

// pointQuery returns a timed run of SELECT $1::int + 1 on a pool.
func pointQuery(b *testing.B) func(*sql.DB) time.Duration {
	base := time.Now()
	return pointQueryBy(b, func() time.Duration { return time.Since(base) })
}

// pointQueryBy is pointQuery measured by clock (any monotonic count).
func pointQueryBy(b *testing.B, clock func() time.Duration) func(*sql.DB) time.Duration {
	var v int
	return func(db *sql.DB) time.Duration {
		start := clock()
		if err := db.QueryRow("SELECT $1::int + 1", 41).Scan(&v); err != nil {
			b.Fatal(err)
		}
		return clock() - start
	}
}

// BenchmarkWriteRunThenRead runs a run of three inserts and then, at once,
// a read of the last row (which waits on the replica for it), through two
// pgryw pools that differ only in capture=always and capture=auto (the
// default: the run's second and third inserts go without their captures,
// and the read sends one ahead of its check), alternating in one loop. It
// reports each pool's p50 for the read and for the whole iteration, and
// auto's as a ratio of always's.
func BenchmarkWriteRunThenRead(b *testing.B) {
	pgtest.Require(b, cluster)
	dsn := cluster.WriterDSN() + "&replicas=" + strings.Join(cluster.ReplicaAddrs(), ",")
	always, err := sql.Open("pgryw", dsn+"&capture=always")
	if err != nil {
		b.Fatal(err)
	}
	defer always.Close()
	auto, err := sql.Open("pgryw", dsn+"&capture=auto")
	if err != nil {
		b.Fatal(err)
	}
	defer auto.Close()
	if _, err := always.Exec("CREATE TABLE IF NOT EXISTS bench_run (id bigserial PRIMARY KEY, v int)"); err != nil {
		b.Fatal(err)
	}
	var reads [2][]time.Duration
	run := func(db *sql.DB) time.Duration {
		start := time.Now()
		var id int64
		for range 3 {
			if err := db.QueryRow("INSERT INTO bench_run (v) VALUES (1) RETURNING id").Scan(&id); err != nil {
				b.Fatal(err)
			}
		}
		read := time.Now()
		var v int
		if err := db.QueryRow("SELECT v FROM bench_run WHERE id = $1", id).Scan(&v); err != nil {
			b.Fatal(err)
		}
		k := 0
		if db == auto {
			k = 1
		}
		reads[k] = append(reads[k], time.Since(read))
		return time.Since(start)
	}
	var tAlways, tAuto []time.Duration
	alternate(b, always, auto, 50, run, func(p, r time.Duration) {
		tAlways, tAuto = append(tAlways, p), append(tAuto, r)
	})
	ra, rr := p50ns(reads[0][len(reads[0])-b.N:]), p50ns(reads[1][len(reads[1])-b.N:])
	b.ReportMetric(ra, "always-read-p50-ns")
	b.ReportMetric(rr, "auto-read-p50-ns")
	b.ReportMetric(rr/ra, "auto/always-read-p50")
	pa, pr := p50ns(tAlways), p50ns(tAuto)
	b.ReportMetric(pa, "always-p50-ns")
	b.ReportMetric(pr, "auto-p50-ns")
	b.ReportMetric(pr/pa, "auto/always-p50")
}
