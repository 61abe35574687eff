package pgryw_test

import (
	"context"
	"testing"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// An address that starts leading to another standby (a DNS name moved, a
// TCP balancer's target changed) while connections to the old one live on.
// What the old standby was seen to replay, through a connection still open
// to it, says nothing of the new one: a read on a connection that reaches
// the new standby checks there, in every pooler mode. Replica 0 replays;
// replica 1 is paused, so a read there that skips its check misses the
// session's own row. Before the fix, with pooler=none the instance was
// never read (zero on every connection, and zero matched zero): every read
// on the new connection came back without its row.
func TestIntegrationAddressLeadsToAnotherStandby(t *testing.T) {
	table := newTable(t)
	pauseReplicas(t, 1)
	ctx := context.Background()
	id := int64(0)
	for _, mode := range []string{"none", "auto", "session", "transaction"} {
		t.Run("pooler="+mode, func(t *testing.T) {
			p, err := pgtest.StartSwitchProxy(cluster.ReplicaAddrs()[0])
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			db, _ := openDSN(t, cluster.WriterDSN()+"&replicas="+p.Addr()+"&pooler="+mode+"&wait_timeout=150ms")
			held := oneConn(t, db)
			var port int
			if err := held.QueryRowContext(ctx, "SELECT "+nodePort).Scan(&port); err != nil {
				t.Fatal(err)
			}
			if want := cluster.Replicas[0].Port; port != want {
				t.Fatalf("the first read ran on port %d, want replica 0's %d", port, want)
			}
			p.Repoint(cluster.ReplicaAddrs()[1]) // held's replica connection stays on replica 0
			conn := oneConn(t, db)
			stale, onNew := 0, 0
			for i := 0; i < 5; i++ {
				id++
				if _, err := conn.ExecContext(ctx, "INSERT INTO "+table+" VALUES ($1, 1)", id); err != nil {
					t.Fatal(err)
				}
				// held's read carries the pool's watermark (session_scope=db)
				// to replica 0, which replays it: the node is seen past the
				// write, through a connection to the old standby.
				waitReplicaCount(t, 0, table, int(id))
				countRows(t, ctx, held, table)
				var n int
				var served pgryw.ServedBy
				rctx := pgryw.WithServedBy(ctx, func(_ context.Context, s pgryw.ServedBy) { served = s })
				if err := conn.QueryRowContext(rctx, "SELECT count(*) FROM "+table+" WHERE id = $1", id).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != 1 {
					stale++
				}
				if served.Role == pgryw.RoleReplica {
					onNew++
				}
			}
			if stale > 0 {
				t.Errorf("%d of 5 reads on a connection to the other standby missed the session's own row", stale)
			}
			t.Logf("pooler=%s: %d of 5 reads served by a replica (the other standby is paused: a check there falls back)", mode, onNew)
		})
	}
}

// replicaProxies starts a pgtest.SwitchProxy in front of each replica
// address, closed with the test: the checkers repoint one at the other
// standby for new connections while the ones made through it live on.
func replicaProxies(t *testing.T) []*pgtest.SwitchProxy {
	t.Helper()
	var ps []*pgtest.SwitchProxy
	for _, a := range cluster.ReplicaAddrs() {
		p, err := pgtest.StartSwitchProxy(a)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		ps = append(ps, p)
	}
	return ps
}
