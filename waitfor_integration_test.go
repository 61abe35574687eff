package pgryw_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// openWaitForDB opens a pool whose replicas sit behind pgtest's WAIT FOR
// emulation, so pgryw's PostgreSQL 19 path (WAIT FOR … NO_THROW in the same
// flush as the read) runs against real standbys.
func openWaitForDB(t *testing.T, extra string) (*sql.DB, *pgryw.Connector, []*pgtest.WaitForProxy) {
	t.Helper()
	pgtest.Require(t, cluster)
	if err := cluster.InstallWaitFor(context.Background()); err != nil {
		t.Fatal(err)
	}
	var addrs []string
	proxies := cluster.WaitForFronts()
	if proxies == nil {
		for i, r := range cluster.Replicas {
			p, err := pgtest.StartWaitForProxy(pgtest.WaitForOptions{Target: r.Addr(), DSN: cluster.ReplicaDSN(i), Polls: pgtest.IsReplayPoll})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			proxies = append(proxies, p)
		}
	}
	for _, p := range proxies {
		addrs = append(addrs, p.Addr())
	}
	db, c := openDSN(t, cluster.WriterDSN()+"&wait_method=wait_for&replicas="+strings.Join(addrs, ",")+"&"+extra)
	return db, c, proxies
}

func rewritten(ps []*pgtest.WaitForProxy) (n int64) {
	for _, p := range ps {
		n += p.Rewritten()
	}
	return n
}

func TestIntegrationWaitForPath(t *testing.T) {
	setDelay(t, 100*time.Millisecond)
	t.Run("budget 1s", func(t *testing.T) {
		db, c, ps := openWaitForDB(t, "wait_timeout=1s")
		w := insertThenRead(t, db, newTable(t), workers, 50)
		w.fresh(t, c)
		w.onReplicas(t)
		if rewritten(ps) == 0 {
			t.Fatal("no WAIT FOR statement reached the replicas")
		}
	})
	t.Run("budget 10ms", func(t *testing.T) {
		db, c, _ := openWaitForDB(t, "wait_timeout=10ms")
		w := insertThenRead(t, db, newTable(t), workers, 50)
		w.fresh(t, c)
		w.onPrimary(t)
	})
	t.Run("on_timeout=error", func(t *testing.T) {
		db, _, _ := openWaitForDB(t, "wait_timeout=10ms&on_timeout=error")
		w := insertThenRead(t, db, newTable(t), workers, 20)
		if w.stale.Load() != 0 || w.errs.Load() == 0 {
			t.Fatalf("stale=%d errors=%d", w.stale.Load(), w.errs.Load())
		}
	})
}
