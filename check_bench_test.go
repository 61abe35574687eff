package pgryw_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// BenchmarkCheckChained is the wire pattern of a read whose replica must be
// checked first, on PostgreSQL 15 and 18, both ways pgryw has sent it, on
// one connection to a standby, alternating: the prepared replay poll with a
// Sync of its own in front of the read ([poll; Sync][read; Sync], before
// 989831e), and chained into the read's implicit transaction ([check][read;
// Sync], as pgryw sends it under READ COMMITTED), in blocks of 50. It
// reports both p50s and the standby backend's CPU per read (from
// /proc/<pid>/schedstat, read around each block), and the chained form's
// ratios to the other's.
func BenchmarkCheckChained(b *testing.B) {
	pgtest.Require(b, cluster)
	ctx := context.Background()
	c, err := pgconn.Connect(ctx, cluster.ReplicaDSN(0))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(ctx)
	for name, sql := range map[string]string{
		"poll":  "SELECT pg_catalog.pg_last_wal_replay_lsn(), pg_catalog.pg_is_in_recovery()",
		"check": "SELECT pg_catalog.pg_last_wal_replay_lsn(), pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('transaction_isolation')",
		"read":  "SELECT relname FROM pg_class WHERE oid = $1",
	} {
		if _, err := c.Prepare(ctx, name, sql, nil); err != nil {
			b.Fatal(err)
		}
	}
	cpu := func() time.Duration {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", c.PID()))
		if err != nil {
			b.Skip("no schedstat for the standby's backend:", err)
		}
		var ns int64
		fmt.Sscan(strings.Fields(string(raw))[0], &ns)
		return time.Duration(ns)
	}
	one := func(chained bool) time.Duration {
		start := time.Now()
		fe := c.Frontend()
		syncs := 1
		if chained {
			fe.Send(&pgproto3.Bind{PreparedStatement: "check"})
			fe.Send(&pgproto3.Execute{})
		} else {
			fe.Send(&pgproto3.Bind{PreparedStatement: "poll"})
			fe.Send(&pgproto3.Execute{})
			fe.Send(&pgproto3.Sync{})
			syncs = 2
		}
		fe.Send(&pgproto3.Bind{PreparedStatement: "read", Parameters: [][]byte{[]byte("1259")}})
		fe.Send(&pgproto3.Execute{})
		fe.Send(&pgproto3.Sync{})
		if err := fe.Flush(); err != nil {
			b.Fatal(err)
		}
		for syncs > 0 {
			m, err := fe.Receive()
			if err != nil {
				b.Fatal(err)
			}
			switch m := m.(type) {
			case *pgproto3.ReadyForQuery:
				syncs--
			case *pgproto3.ErrorResponse:
				b.Fatal(m.Message)
			}
		}
		return time.Since(start)
	}
	for range 200 {
		one(false)
		one(true)
	}
	// In blocks of 50, alternating which goes first; the backend's CPU is
	// read around each block.
	const block = 50
	var tSync, tChain []time.Duration
	var cSync, cChain time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i += block {
		for _, chained := range [2]bool{i/block%2 == 0, i/block%2 != 0} {
			c0 := cpu()
			for k := 0; k < block; k++ {
				lat := one(chained)
				if chained {
					tChain = append(tChain, lat)
				} else {
					tSync = append(tSync, lat)
				}
			}
			if chained {
				cChain += cpu() - c0
			} else {
				cSync += cpu() - c0
			}
		}
	}
	n := float64(len(tSync))
	ps, pc := p50ns(tSync), p50ns(tChain)
	b.ReportMetric(ps, "sync-p50-ns")
	b.ReportMetric(pc, "chained-p50-ns")
	b.ReportMetric(pc/ps, "chained/sync-p50")
	b.ReportMetric(float64(cSync.Nanoseconds())/n, "sync-server-cpu-ns")
	b.ReportMetric(float64(cChain.Nanoseconds())/n, "chained-server-cpu-ns")
	b.ReportMetric(float64(cChain)/float64(cSync), "chained/sync-cpu")
}
