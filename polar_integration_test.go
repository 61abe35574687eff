package pgryw_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// openPolarDB opens a pool whose replicas sit behind pgtest's PolarDB
// stand-in, with wait_method=polar.
func openPolarDB(t *testing.T, extra string) (*sql.DB, *pgryw.Connector, []*pgtest.PolarProxy) {
	t.Helper()
	pgtest.Require(t, cluster)
	var addrs []string
	var proxies []*pgtest.PolarProxy
	for i, r := range cluster.ReplicaAddrs() {
		p, err := pgtest.StartPolarProxy(r, cluster.ReplicaDSN(i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		proxies = append(proxies, p)
		addrs = append(addrs, p.Addr())
	}
	db, c := openDSN(t, cluster.WriterDSN()+"&wait_method=polar&replicas="+strings.Join(addrs, ",")+"&"+extra)
	return db, c, proxies
}

func polarWaits(ps []*pgtest.PolarProxy) (waits, timeouts int64) {
	for _, p := range ps {
		w, to := p.Waits()
		waits += w
		timeouts += to
	}
	return
}

// wait_method=polar: the replica waits for the session's position when the
// read takes its snapshot; every read sees its session's writes, and
// on_timeout maps onto strict (primary, error) and best_effort (stale).
func TestIntegrationPolarWait(t *testing.T) {
	ctx := context.Background()
	t.Run("fresh", func(t *testing.T) {
		table := newTable(t)
		setDelay(t, 50*time.Millisecond)
		db, c, ps := openPolarDB(t, "session_scope=conn&wait_timeout=2s")
		insertThenCount(t, db, table, 10)
		waits, timeouts := polarWaits(ps)
		t.Logf("stats %+v; stand-in waits %d, timeouts %d", c.Stats(), waits, timeouts)
		if s := c.Stats(); s.ReplicaReads == 0 || waits == 0 || timeouts != 0 {
			t.Fatalf("want replica reads that waited on the replica: %+v, waits %d, timeouts %d", s, waits, timeouts)
		}
	})
	for _, policy := range []string{"primary", "error", "stale"} {
		t.Run("timeout/"+policy, func(t *testing.T) {
			table := newTable(t)
			setDelay(t, 300*time.Millisecond)
			db, c, ps := openPolarDB(t, "session_scope=conn&wait_timeout=20ms&on_timeout="+policy)
			conn := oneConn(t, db)
			if _, err := conn.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1, 1)"); err != nil {
				t.Fatal(err)
			}
			var n int
			err := conn.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n)
			s := c.Stats()
			_, timeouts := polarWaits(ps)
			t.Logf("n=%d err=%v stats %+v timeouts %d", n, err, s, timeouts)
			switch policy {
			case "primary":
				if err != nil || n != 1 || s.Fallbacks != 1 {
					t.Fatalf("strict timeout should read the primary: n=%d err=%v %+v", n, err, s)
				}
			case "error":
				if !errors.Is(err, pgryw.ErrReplicaBehind) {
					t.Fatalf("want ErrReplicaBehind, got %v", err)
				}
			case "stale":
				if err != nil || n != 0 || s.StaleReads != 1 {
					t.Fatalf("best_effort should serve the replica's stale rows and count them: n=%d err=%v %+v", n, err, s)
				}
			}
			if timeouts == 0 {
				t.Fatal("the stand-in never timed out")
			}
		})
	}
	t.Run("not PolarDB", func(t *testing.T) {
		table := newTable(t)
		setDelay(t, 50*time.Millisecond)
		db, _ := openDB(t, "wait_method=polar&session_scope=conn")
		conn := oneConn(t, db)
		if _, err := conn.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1, 1)"); err != nil {
			t.Fatal(err)
		}
		err := conn.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(new(int))
		if err == nil || !strings.Contains(err.Error(), "wait_method=polar needs PolarDB replicas") {
			t.Fatalf("want a configuration error, got %v", err)
		}
	})
}
