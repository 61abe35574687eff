package pgryw_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// A replay poll that rode behind a read, but whose answer was read only by
// the connection's next read, says how far behind the replica was when it
// ran, not when it was read: a Conn held across a pause must not come back
// to find the replicas judged seconds behind. With two replicas (so a poll
// rides behind each read), held Conns read, another writes (the primary is
// then seen past what those reads' polls found), and 1.5 s later they read
// again, settling their polls. Taking the lag from when an answer was read
// made it 1.5 s; a read after a write then judged the replica unable to
// catch up within wait_timeout=1s and fell back to the primary without
// waiting ("replica behind", WaitTimeouts 0): TestIntegrationPoolReadYourWrites
// failed so now and then.
func TestIntegrationLatePollAnswerIsNotLag(t *testing.T) {
	ctx := context.Background()
	pgtest.Require(t, cluster)
	if len(cluster.ReplicaAddrs()) < 2 {
		t.Fatal("the test cluster has fewer than two replicas")
	}
	table := newTable(t)
	db, c := openDB(t, "wait_timeout=1s")
	// Three Conns, so that a poll is left to settle later on at least one
	// (a poll whose answer is in by the time its read returns is read at
	// once).
	var conns []*sql.Conn
	for range 3 {
		a, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		conns = append(conns, a)
	}
	id := 0
	writeRead := func(a *sql.Conn) pgryw.ServedBy {
		t.Helper()
		id++
		if _, err := a.ExecContext(ctx, "INSERT INTO "+table+" (id, v) VALUES ($1, 1)", id); err != nil {
			t.Fatal(err)
		}
		var by pgryw.ServedBy
		sctx := pgryw.WithServedBy(ctx, func(_ context.Context, s pgryw.ServedBy) { by = s })
		var n int
		if err := a.QueryRowContext(sctx, "SELECT count(*) FROM "+table+" WHERE id = $1", id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("read %d did not see its write", id)
		}
		return by
	}
	for _, a := range conns {
		writeRead(a)
	}
	// Another connection of the pool writes: the primary is seen past
	// what the polls behind those reads found.
	if _, err := db.ExecContext(ctx, "INSERT INTO "+table+" (id, v) VALUES (0, 1)"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	for i, a := range conns {
		writeRead(a) // settles the poll behind its last read
		// At once: the replica's next poll would take a wrong lag back.
		for _, s := range c.NodeStats() {
			if s.Lag > 500*time.Millisecond {
				t.Errorf("conn %d: replica %s measured %v behind on a cluster with no apply delay", i, s.Addr, s.Lag)
			}
		}
	}
	for i, a := range conns {
		if by := writeRead(a); by.Route != pgryw.RouteReplica {
			t.Errorf("conn %d: the read after the pause was served by %+v, not a replica", i, by)
		}
	}
}
