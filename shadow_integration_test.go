package pgryw_test

import (
	"context"
	"testing"
	"time"
)

// pgryw's own statements run in the application's sessions: the capture
// behind a write in its primary session, the check in front of a read in
// its replica session, with the session's search_path, which may put a
// schema ahead of pg_catalog. A function there named like one pgryw calls
// must not change what pgryw reads. Here a schema's pg_current_wal_insert_lsn
// says 0/1 and its pg_last_wal_replay_lsn says every position is replayed:
// with unqualified names the first write's capture was the former and every
// check the latter, and reads after writes on replicas 100 ms behind came
// back without the write. Its text = is never true: with the read-back's
// unqualified operators a session's advisory lock went unseen, and its
// reads went on to replicas.
func TestIntegrationShadowedCatalogFunctions(t *testing.T) {
	ctx := context.Background()
	setDelay(t, 100*time.Millisecond)
	table := newTable(t)
	setup, _ := openDB(t, "")
	for _, q := range []string{
		"DROP SCHEMA IF EXISTS ryw_shadow CASCADE",
		"CREATE SCHEMA ryw_shadow",
		"CREATE FUNCTION ryw_shadow.pg_current_wal_insert_lsn() RETURNS pg_lsn LANGUAGE sql AS $$SELECT '0/1'::pg_lsn$$",
		"CREATE FUNCTION ryw_shadow.pg_last_wal_replay_lsn() RETURNS pg_lsn LANGUAGE sql AS $$SELECT 'FFFFFFFF/FFFFFFFF'::pg_lsn$$",
		// And a text = that is never true: the state read-back then
		// found no advisory lock and no session setting.
		"CREATE FUNCTION ryw_shadow.never(text, text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$SELECT false$$",
		"CREATE OPERATOR ryw_shadow.= (LEFTARG = text, RIGHTARG = text, FUNCTION = ryw_shadow.never)",
	} {
		if _, err := setup.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { setup.Exec("DROP SCHEMA IF EXISTS ryw_shadow CASCADE") })
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	db, c := openDB(t, "wait_timeout=2s")
	cn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cn.Close()
	if _, err := cn.ExecContext(ctx, "SET search_path = ryw_shadow, pg_catalog, public"); err != nil {
		t.Fatal(err)
	}
	stale, onReplica := 0, 0
	for id := 1; id <= 10; id++ {
		if _, err := cn.ExecContext(ctx, "INSERT INTO "+table+" (id, v) VALUES ($1, 1)", id); err != nil {
			t.Fatal(err)
		}
		var n int
		var standby bool
		if err := cn.QueryRowContext(ctx, "SELECT count(*), "+nodeStandby+" FROM "+table+" WHERE id = $1", id).Scan(&n, &standby); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			stale++
		}
		if standby {
			onReplica++
		}
	}
	if stale > 0 {
		t.Fatalf("%d of 10 reads after a write did not see it; stats %+v", stale, c.Stats())
	}
	if onReplica == 0 {
		t.Fatalf("no read ran on a replica; stats %+v", c.Stats())
	}
	// A session advisory lock pins the connection to the primary.
	if _, err := cn.ExecContext(ctx, "SELECT pg_advisory_lock(4242)"); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Pinned != 1 {
		t.Errorf("after pg_advisory_lock: %d connections pinned (%v), want 1", st.Pinned, st.PinnedBy)
	}
	if _, err := cn.ExecContext(ctx, "SELECT pg_advisory_unlock(4242)"); err != nil {
		t.Fatal(err)
	}
}
