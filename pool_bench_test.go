package pgryw_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// pgx's front end against pgxpool, as overhead_bench_test.go's
// benchmarks are database/sql's against pgx's stdlib: the same point
// query, alternating in one loop, p50s and their ratio.

// pgxQuerier is what a point query runs on: pgxpool's or pgryw's Pool.
type pgxRowQuerier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// alternatePgxP50 runs the point query on plain and on ryw in turn, and
// reports both p50s and their ratio.
func alternatePgxP50(b *testing.B, plain, ryw pgxRowQuerier) {
	alternatePgxP50With(b, plain, ryw, "SELECT $1::int + 1")
}

// alternatePgxP50With is alternatePgxP50 of q, a statement of one int
// argument (41) answering one int.
func alternatePgxP50With(b *testing.B, plain, ryw pgxRowQuerier, q string) {
	ctx := context.Background()
	var v int
	run := func(db pgxRowQuerier) time.Duration {
		start := time.Now()
		if err := db.QueryRow(ctx, q, 41).Scan(&v); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for range 100 {
		run(plain)
		run(ryw)
	}
	var tp, tr []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			tp = append(tp, run(plain))
			tr = append(tr, run(ryw))
		} else {
			tr = append(tr, run(ryw))
			tp = append(tp, run(plain))
		}
	}
	pp, pr := p50ns(tp), p50ns(tr)
	b.ReportMetric(pp, "pgxpool-p50-ns")
	b.ReportMetric(pr, "pgryw-p50-ns")
	b.ReportMetric(pr/pp, "pgryw/pgxpool-p50")
}

func benchPgxpool(b *testing.B, dsn string) *pgxpool.Pool {
	p, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	return p
}

func benchPool(b *testing.B, dsn string) *pgryw.Pool {
	p, err := pgryw.NewPool(context.Background(), dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	return p
}

// BenchmarkPoolNoReplicasOverhead: the Pool without replicas against
// pgxpool on the primary (target: ≤ 1.03).
func BenchmarkPoolNoReplicasOverhead(b *testing.B) {
	pgtest.Require(b, cluster)
	alternatePgxP50(b, benchPgxpool(b, cluster.WriterDSN()), benchPool(b, cluster.WriterDSN()))
}

// BenchmarkPoolReplicaReadOverhead: a read with no watermark pending on
// the Pool's replica against pgxpool on that replica (target: ≤ 1.05).
func BenchmarkPoolReplicaReadOverhead(b *testing.B) {
	pgtest.Require(b, cluster)
	addr := cluster.ReplicaAddrs()[0]
	replicaDSN := cluster.ReplicaDSN(0)
	alternatePgxP50(b, benchPgxpool(b, replicaDSN), benchPool(b, cluster.WriterDSN()+"&replicas="+addr))
}

// BenchmarkPoolWriteOverhead: an autocommit insert through the Pool (with
// replicas: the capture rides behind it) against pgxpool on the primary.
func BenchmarkPoolWriteOverhead(b *testing.B) {
	pgtest.Require(b, cluster)
	ctx := context.Background()
	plain := benchPgxpool(b, cluster.WriterDSN())
	ryw := benchPool(b, cluster.WriterDSN()+"&replicas="+cluster.ReplicaAddrs()[0])
	if _, err := plain.Exec(ctx, "CREATE TABLE IF NOT EXISTS bench_pw (id bigserial PRIMARY KEY, v int)"); err != nil {
		b.Fatal(err)
	}
	// An insert, through QueryRow so that its answer is one int.
	alternatePgxP50With(b, plain, ryw, "INSERT INTO bench_pw (v) VALUES ($1) RETURNING v + 1")
}
