package pgryw_test

// Proof that read-your-writes costs no extra round trips: a counting layer
// under pgryw's wire layer counts the client's turns to speak on each
// server connection.

import (
	"bytes"
	"context"
	"database/sql"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/pgryw/pgryw"
)

// turnConn counts round trips: a write that follows a read (or is the
// first) starts one; consecutive writes before the answer are one flush.
type turnConn struct {
	net.Conn
	trips *atomic.Int64
	mu    sync.Mutex
	spoke bool
}

func (c *turnConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	if !c.spoke {
		c.trips.Add(1)
		c.spoke = true
	}
	c.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *turnConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.mu.Lock()
		c.spoke = false
		c.mu.Unlock()
	}
	return n, err
}

func TestRoundTrips(t *testing.T) {
	db, c := openDB(t, "")
	pgryw.StopMonitor(c) // its polls would be counted; Observe stands in for it
	trips := map[uint16]*atomic.Int64{}
	var mu sync.Mutex
	pgryw.SetNetHook(c, func(port uint16, nc net.Conn) net.Conn {
		mu.Lock()
		defer mu.Unlock()
		if trips[port] == nil {
			trips[port] = new(atomic.Int64)
		}
		return &turnConn{Conn: nc, trips: trips[port]}
	})
	db.SetMaxOpenConns(1)
	table := newTable(t)
	ctx := context.Background()
	insert := "INSERT INTO " + table + " (id, v) VALUES ($1, $2)"
	read := "SELECT v FROM " + table + " WHERE id = $1"
	primaryPort := uint16(cluster.Writer.Port)

	snapshot := func() map[uint16]int64 {
		mu.Lock()
		defer mu.Unlock()
		m := map[uint16]int64{}
		for p, n := range trips {
			m[p] = n.Load()
		}
		return m
	}
	delta := func(before map[uint16]int64) (primary, replicas int64) {
		for p, n := range snapshot() {
			if p == primaryPort {
				primary += n - before[p]
			} else {
				replicas += n - before[p]
			}
		}
		return
	}
	// learn plays the monitor: it reads each replica's replay position and
	// tells the connector.
	learn := func() {
		for i := range cluster.Replicas {
			conn, err := pgx.Connect(ctx, cluster.ReplicaDSN(i))
			if err != nil {
				t.Fatal(err)
			}
			var pos string
			if err := conn.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn()::text").Scan(&pos); err != nil {
				t.Fatal(err)
			}
			conn.Close(ctx)
			pgryw.Observe(c, i, pos)
		}
	}
	var v int
	// Warm up: connections open and statements prepared on every node, as
	// in a running application.
	for i := 1; i <= 6; i++ {
		if _, err := db.Exec(insert, i, i); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow(read, i).Scan(&v); err != nil {
			t.Fatal(err)
		}
	}
	// Reads with every replica known caught up rotate over all of them.
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	learn()
	for i := 1; i <= 6; i++ {
		if err := db.QueryRow(read, i).Scan(&v); err != nil {
			t.Fatal(err)
		}
	}

	b := snapshot()
	if _, err := db.Exec(insert, 100, 100); err != nil {
		t.Fatal(err)
	}
	if w, r := delta(b); w != 1 || r != 0 {
		t.Errorf("autocommit write: %d round trips to the primary, %d to replicas; want 1 and 0", w, r)
	}

	// Replica known to be caught up: the read goes alone.
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	learn()
	b = snapshot()
	if err := db.QueryRow(read, 100).Scan(&v); err != nil || v != 100 {
		t.Fatalf("read: v=%d err=%v", v, err)
	}
	if w, r := delta(b); w != 0 || r != 1 {
		t.Errorf("read, replica known caught up: %d round trips to the primary, %d to replicas; want 0 and 1", w, r)
	}

	// Replica caught up but not known to be: check and read in one flush.
	if _, err := db.Exec(insert, 101, 101); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	b = snapshot()
	st0 := c.Stats()
	if err := db.QueryRow(read, 101).Scan(&v); err != nil || v != 101 {
		t.Fatalf("read: v=%d err=%v", v, err)
	}
	if w, r := delta(b); w != 0 || r != 1 {
		t.Errorf("read, replica not known caught up: %d round trips to the primary, %d to replicas; want 0 and 1 (%+v -> %+v)", w, r, st0, c.Stats())
	}

	// A read-only transaction after a write: its check rides with BEGIN,
	// then the read and COMMIT: three, all on the replica.
	if _, err := db.Exec(insert, 103, 103); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	b = snapshot()
	rtx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	if err := rtx.QueryRow(read, 103).Scan(&v); err != nil || v != 103 {
		t.Fatalf("read-only transaction: v=%d err=%v", v, err)
	}
	if err := rtx.Commit(); err != nil {
		t.Fatal(err)
	}
	if w, r := delta(b); w != 0 || r != 3 {
		t.Errorf("read-only transaction: %d round trips to the primary, %d to replicas; want 0 and 3", w, r)
	}

	// A transaction: BEGIN, INSERT, and COMMIT with its capture: three.
	b = snapshot()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(insert, 102, 102); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if w, r := delta(b); w != 3 || r != 0 {
		t.Errorf("transaction: %d round trips to the primary, %d to replicas; want 3 and 0", w, r)
	}
	// A SET: one round trip, its read-back riding behind it. The read
	// after it carries the setting to the replica in the same flush: as
	// many round trips as a read without one.
	timeoutRead := "SELECT current_setting('statement_timeout') FROM " + table + " LIMIT 1"
	var timeout string
	for i := 0; i < 4; i++ { // prepared on every replica, as in the warm-up
		// Both replicas known caught up, so that the reads take turns: a
		// WAIT FOR that succeeded teaches only its own replica.
		if err := cluster.WaitCaughtUp(ctx); err != nil {
			t.Fatal(err)
		}
		learn()
		if err := db.QueryRow(timeoutRead).Scan(&timeout); err != nil {
			t.Fatal(err)
		}
	}
	b = snapshot()
	if _, err := db.Exec("SET statement_timeout = '7s'"); err != nil {
		t.Fatal(err)
	}
	if w, r := delta(b); w != 1 || r != 0 {
		t.Errorf("SET: %d round trips to the primary, %d to replicas; want 1 and 0", w, r)
	}
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	learn()
	b = snapshot()
	if err := db.QueryRow(timeoutRead).Scan(&timeout); err != nil || timeout != "7s" {
		t.Fatalf("read after SET: statement_timeout=%q err=%v", timeout, err)
	}
	if w, r := delta(b); w != 0 || r != 1 {
		t.Errorf("read after SET: %d round trips to the primary, %d to replicas; want 0 and 1", w, r)
	}
	if st := c.Stats(); st.Pinned != 0 {
		t.Errorf("a SET pinned the connection: %+v", st)
	}
	if st := c.Stats(); st.Captures < 9 || st.CaptureFailures != 0 {
		t.Errorf("stats %+v", st)
	}
}

// recConn keeps what the client wrote.
type recConn struct {
	net.Conn
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (c *recConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	c.buf.Write(b)
	c.mu.Unlock()
	return c.Conn.Write(b)
}

// After a connection's first capture, writes carry a fast-path FunctionCall
// of pg_current_wal_insert_lsn (its OID as this server reports it), and
// its answers are the positions reads wait for: every read after a write
// sees the write, with no capture failing.
func TestIntegrationFastPathCapture(t *testing.T) {
	db, c := openDB(t, "")
	var (
		mu    sync.Mutex
		wrote bytes.Buffer
	)
	primaryPort := uint16(cluster.Writer.Port)
	pgryw.SetNetHook(c, func(port uint16, nc net.Conn) net.Conn {
		if port != primaryPort {
			return nc
		}
		return &recConn{Conn: nc, mu: &mu, buf: &wrote}
	})
	db.SetMaxOpenConns(1)
	table := newTable(t)
	ctx := context.Background()
	var oid uint32
	if err := db.QueryRowContext(ctx, "SELECT 'pg_catalog.pg_current_wal_insert_lsn()'::regprocedure::oid /* pgryw:primary */").Scan(&oid); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := db.ExecContext(ctx, "INSERT INTO "+table+" (id, v) VALUES ($1, $2)", i, i*10); err != nil {
			t.Fatal(err)
		}
		var v int
		if err := db.QueryRowContext(ctx, "SELECT v FROM "+table+" WHERE id = $1", i).Scan(&v); err != nil || v != i*10 {
			t.Fatalf("read after write %d: %d, %v", i, v, err)
		}
	}
	call := []byte{'F', 0, 0, 0, 14, byte(oid >> 24), byte(oid >> 16), byte(oid >> 8), byte(oid), 0, 0, 0, 0, 0, 0}
	mu.Lock()
	n := bytes.Count(wrote.Bytes(), call)
	mu.Unlock()
	if n < 5 {
		t.Errorf("%d fast-path captures of OID %d went to the primary, want one behind each of the 5 writes at least", n, oid)
	}
	if st := c.Stats(); st.CaptureFailures != 0 || st.StaleReads != 0 {
		t.Errorf("stats %+v: want no capture failures and no stale reads", st)
	}
}
