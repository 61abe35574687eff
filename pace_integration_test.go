package pgryw_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
)

// A read right behind its write waits, before its first check on a polled
// replica, until the replica's learned delay after the write has passed
// (pace.go), and what the check finds moves the delay; where the server
// waits (WAIT FOR, or the harness's emulation of it) nothing is paced.
// Seeded with a delay far longer than a local replica needs, the first
// read after a write takes at least that long, and the reads after bring
// the delay down; every read sees its write.
func TestIntegrationPacedFirstCheck(t *testing.T) {
	ctx := context.Background()
	table := newTable(t)
	db, c := openDB(t, "wait_timeout=2s")
	replicas := len(c.NodeStats()) - 1
	const seeded = 5 * time.Millisecond
	for i := range replicas {
		pgryw.SetFirstDelay(c, i, seeded)
	}
	writeRead := func(id int) (time.Duration, pgryw.ServedBy) {
		t.Helper()
		if _, err := db.ExecContext(ctx, "INSERT INTO "+table+" (id, v) VALUES ($1, 1)", id); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		var by pgryw.ServedBy
		sctx := pgryw.WithServedBy(ctx, func(_ context.Context, s pgryw.ServedBy) { by = s })
		var n int
		if err := db.QueryRowContext(sctx, "SELECT count(*) FROM "+table+" WHERE id = $1", id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("read %d did not see its write", id)
		}
		return time.Since(start), by
	}
	took, by := writeRead(1)
	if by.Role != pgryw.RoleReplica {
		t.Fatalf("the read after the write ran on the primary (%+v): nothing to pace", by)
	}
	if emulatesOr19() {
		// The server waits: no pause, and the delay stays as it was. (Which
		// branch runs is the cluster's, not a count of WAIT FOR checks: the
		// first read may find its replica caught up and send none.)
		for i := range 50 {
			writeRead(2 + i)
		}
		for i := range replicas {
			if d := pgryw.FirstDelay(c, i); d != seeded {
				t.Errorf("WAIT FOR: replica %d's delay moved to %v", i, d)
			}
		}
		return
	}
	if took < seeded-time.Millisecond {
		t.Errorf("the first read after a write took %v, want the seeded pause of %v first", took, seeded)
	}
	// Which replica serves is the topology's choice: a replica that served
	// many of the reads must have learned; one that served few may not
	// have been the first tried.
	served := map[string]int{}
	for i := range 200 {
		_, by := writeRead(2 + i)
		if by.Role == pgryw.RoleReplica {
			served[by.Addr]++
		}
	}
	nodes := c.NodeStats()
	moved := 0
	for i := range replicas {
		d := pgryw.FirstDelay(c, i)
		n := served[nodes[1+i].Addr]
		t.Logf("replica %d served %d reads; delay %v", i, n, d)
		if d < 0 {
			t.Errorf("replica %d's delay is %v", i, d)
		}
		if d < seeded {
			moved++
		} else if n >= 50 {
			t.Errorf("replica %d served %d reads after writes and its delay stayed %v, want less than the %v seeded", i, n, d, seeded)
		}
	}
	if moved == 0 {
		t.Errorf("no replica's delay moved from the %v seeded in 200 reads after writes", seeded)
	}
}
