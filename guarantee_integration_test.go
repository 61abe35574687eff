package pgryw_test

// Regression tests for the defect classes of the guarantees, each against the real
// cluster. Each failed on the code before its fix.

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// rowQuerier is what *sql.DB, *sql.Conn and *sql.Tx share for one row.
type rowQuerier interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}

// countRows reads count(*) of table through q.
func countRows(t *testing.T, ctx context.Context, q rowQuerier, table string) int {
	t.Helper()
	var n int
	if err := q.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Class 1: a string that commits and then fails moves the watermark.
func TestIntegrationCommitThenFailMovesWatermark(t *testing.T) {
	for _, scope := range []string{"conn", "db"} {
		for _, shape := range []string{
			"INSERT INTO %s VALUES (%d, 1); COMMIT; SELECT 1/0",
			"BEGIN; INSERT INTO %s VALUES (%d, 1); COMMIT; SELECT 1/0",
		} {
			t.Run(scope+"/"+strings.Fields(shape)[0], func(t *testing.T) {
				table := newTable(t)
				setDelay(t, 100*time.Millisecond)
				db, _ := openDB(t, "session_scope="+scope+"&wait_timeout=2s")
				ctx := context.Background()
				conn := oneConn(t, db)
				for i := 1; i <= 5; i++ {
					_, err := conn.ExecContext(ctx, fmt.Sprintf(shape, table, i))
					if err == nil || !strings.Contains(err.Error(), "division by zero") {
						t.Fatalf("want division by zero, got %v", err)
					}
					if n := countRows(t, ctx, conn, table); n != i {
						t.Fatalf("after %d committed inserts the session read %d rows", i, n)
					}
				}
			})
		}
	}
}

// Class 1: a write whose caller gave up after the server committed counts
// as a possible commit: the pool's next read sees it.
func TestIntegrationCancelledAfterCommitMovesWatermark(t *testing.T) {
	table := newTable(t)
	setDelay(t, 700*time.Millisecond)
	db, _ := openDB(t, "wait_timeout=2s")
	for i := 1; i <= 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		_, err := db.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s VALUES (%d, 1); COMMIT; SELECT pg_sleep(1)", table, i))
		cancel()
		if err == nil {
			t.Fatal("want a context error")
		}
		if n := countRows(t, context.Background(), db, table); n != i {
			t.Fatalf("after %d committed inserts the pool read %d rows", i, n)
		}
	}
}

// Class 1: writes made through the escape hatch move the watermark.
func TestIntegrationRunOnPrimaryMovesWatermark(t *testing.T) {
	table := newTable(t)
	setDelay(t, 100*time.Millisecond)
	db, _ := openDB(t, "session_scope=conn&wait_timeout=2s")
	ctx := context.Background()
	conn := oneConn(t, db)
	for i := 0; i < 3; i++ {
		err := conn.Raw(func(dc any) error {
			return dc.(*pgryw.Conn).RunOnPrimary(ctx, func(pc *pgx.Conn) error {
				_, err := pc.CopyFrom(ctx, pgx.Identifier{table}, []string{"id", "v"},
					pgx.CopyFromRows([][]any{{int64(10*i + 1), int32(1)}, {int64(10*i + 2), int32(2)}}))
				return err
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		if n := countRows(t, ctx, conn, table); n != 2*(i+1) {
			t.Fatalf("after copying %d rows the session read %d", 2*(i+1), n)
		}
	}
}

// cutConn cuts the first write that contains marker right after the
// protocol message holding it: the statement reaches the server whole, the
// statement pgryw rides behind it does not, and the socket closes.
type cutConn struct {
	net.Conn
	marker []byte
	armed  *atomic.Bool
}

func (c *cutConn) Write(b []byte) (int, error) {
	if i := bytes.Index(b, c.marker); i >= 0 && c.armed.CompareAndSwap(true, false) {
		for at := 0; at+5 <= len(b); {
			end := at + 1 + int(binary.BigEndian.Uint32(b[at+1:at+5]))
			if end > i {
				n, _ := c.Conn.Write(b[:min(end, len(b))])
				// A half close sends FIN after the bytes (a full close with
				// unread input would send RST, and the server could lose
				// them): the statement surely arrives, nothing after it.
				if tc, ok := c.Conn.(interface{ CloseWrite() error }); ok {
					tc.CloseWrite()
				} else {
					c.Conn.Close()
				}
				return n, errors.New("cutConn: write cut")
			}
			at = end
		}
	}
	return c.Conn.Write(b)
}

// Class 2: a write cut part-way, after the caller's statement reached the
// server, is never run a second time: the caller gets the error (before the
// fix the wire layer reported 0 bytes written, pgx called that safe to
// retry, and database/sql ran the INSERT again and returned success).
func TestIntegrationPartialWriteRunsOnce(t *testing.T) {
	table := newTable(t)
	var armed atomic.Bool
	marker := []byte("INSERT INTO " + table)
	db := openHooked(t, "", func(nc net.Conn) net.Conn {
		return &cutConn{Conn: nc, marker: marker, armed: &armed}
	})
	ctx := context.Background()
	for i := 1; i <= 3; i++ {
		armed.Store(true)
		_, err := db.ExecContext(ctx, "INSERT INTO "+table+" (id, v) SELECT coalesce(max(id), 0) + 1, 1 FROM "+table)
		if err == nil {
			t.Fatal("want the cut write's error")
		}
		if errors.Is(err, driver.ErrBadConn) {
			t.Fatalf("a statement that reached the server reported as never sent: %v", err)
		}
		// The cut statement reached the server, whole. pgx, seeing the
		// write fail, cancels it (a CancelRequest), so it may or may not
		// have committed: at most once, never twice.
		atMostOnce(t, db, table, i)
	}
}

// atMostOnce fails the test if table has more than n rows once a cut
// statement has had time to finish (pgx cancels it; it may still run).
func atMostOnce(t *testing.T, db *sql.DB, table string, n int) {
	t.Helper()
	time.Sleep(200 * time.Millisecond)
	var got int
	if err := db.QueryRowContext(pgryw.WithPrimary(context.Background()), "SELECT count(*) FROM "+table).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got > n {
		t.Fatalf("after %d cut inserts the table has %d rows", n, got)
	}
}

// Class 3: with an unresponsive primary every wait pgryw adds ends with the
// caller's deadline.
func TestIntegrationDeadlineWithStalledPrimary(t *testing.T) {
	table := newTable(t)
	db, _ := openDB(t, "")
	db.SetMaxOpenConns(1)
	ctx := context.Background()
	conn := oneConn(t, db)
	var pid int
	if err := conn.QueryRowContext(pgryw.WithPrimary(ctx), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	stop := func(sig string) {
		if out, err := exec.Command("kill", "-"+sig, strconv.Itoa(pid)).CombinedOutput(); err != nil {
			t.Fatalf("kill -%s %d: %v %s", sig, pid, err, out)
		}
	}
	stop("STOP")
	defer stop("CONT")
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := conn.ExecContext(dctx, "INSERT INTO "+table+" VALUES (1, 1)")
	took := time.Since(start)
	if err == nil {
		t.Fatal("want a deadline error")
	}
	// pgx alone returns at the deadline; anything near it is fine, seconds
	// past it is the defect (10.3 s before the fix).
	if took > 3*time.Second {
		t.Fatalf("ExecContext with a 300ms deadline returned after %v", took)
	}
}

// Class 4: a read never sees an older state than an earlier read of the
// same connection, whether the earlier one ran on the primary or on a more
// advanced replica.
func TestIntegrationMonotonicAcrossNodes(t *testing.T) {
	table := newTable(t)
	ctx := context.Background()
	// Replica 1 stops replaying; replica 0 keeps up.
	if err := cluster.PauseReplay(ctx, 1); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cluster.ResumeReplay(ctx, 1); err != nil {
			t.Error(err)
		}
		if err := cluster.WaitCaughtUp(ctx); err != nil {
			t.Error(err)
		}
	}()
	other, _ := openDB(t, "")
	var id atomic.Int64
	insert := func() {
		if _, err := other.ExecContext(ctx, "INSERT INTO "+table+" VALUES ($1, 1)", id.Add(1)); err != nil {
			t.Error(err)
		}
	}
	for i := 0; i < 5; i++ {
		insert()
	}
	waitReplicaCount(t, 0, table, 5)
	t.Run("after a primary read", func(t *testing.T) {
		db, _ := openDB(t, "session_scope=conn&wait_timeout=50ms")
		conn := oneConn(t, db)
		insert()
		seen := countRows(t, pgryw.WithPrimary(ctx), conn, table)
		for i := 0; i < 20; i++ {
			if n := countRows(t, ctx, conn, table); n < seen {
				t.Fatalf("read %d saw %d rows after a primary read saw %d", i, n, seen)
			}
		}
	})
	t.Run("across replicas", func(t *testing.T) {
		db, _ := openDB(t, "session_scope=conn&wait_timeout=50ms")
		conn := oneConn(t, db)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(2 * time.Millisecond):
					insert()
				}
			}
		}()
		defer func() { close(stop); wg.Wait() }()
		seen := 0
		for i := 0; i < 200; i++ {
			n := countRows(t, ctx, conn, table)
			if n < seen {
				t.Fatalf("read %d saw %d rows after an earlier read saw %d", i, n, seen)
			}
			seen = n
		}
	})
}

// TestIntegrationMonotonicOneReplicaAddress: with one replica no replay poll
// rides behind reads (a connection's reads stay on one server connection,
// whose replay never goes backwards). When that connection is replaced, the
// new one may reach another server (an address in front of several
// standbys, a restarted standby back at an earlier consistent point): the
// next replica read must not see less than the last one did. Replica 0 is
// ahead, replica 1 paused behind; one address points at 0, then at 1.
func TestIntegrationMonotonicOneReplicaAddress(t *testing.T) {
	table := newTable(t)
	ctx := context.Background()
	pauseReplicas(t, 1)
	pc, err := pgx.Connect(ctx, cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close(ctx)
	if _, err := pc.Exec(ctx, "INSERT INTO "+table+" SELECT g, 1 FROM generate_series(1, 5) g"); err != nil {
		t.Fatal(err)
	}
	waitReplicaCount(t, 0, table, 5)
	for _, mode := range []string{"on", "off"} {
		t.Run("read_your_writes="+mode, func(t *testing.T) {
			p, err := pgtest.StartSwitchProxy(cluster.ReplicaAddrs()[0])
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			db, _ := openDSN(t, cluster.WriterDSN()+"&replicas="+p.Addr()+"&session_scope=conn&wait_timeout=50ms&read_your_writes="+mode)
			conn := oneConn(t, db)
			var on pgryw.Role
			served := pgryw.WithServedBy(ctx, func(_ context.Context, s pgryw.ServedBy) { on = s.Role })
			seen := countRows(t, served, conn, table)
			if on != pgryw.RoleReplica || seen < 5 {
				t.Fatalf("first read: %d rows on %v, want 5 on the replica", seen, on)
			}
			p.SetTarget(cluster.ReplicaAddrs()[1])
			// While conn is idle, the monitor sees the replica go and come
			// back: conn's next replica read is on a new server connection,
			// with no failed read (and no primary read) in between.
			time.Sleep(1500 * time.Millisecond)
			stale := 0
			deadline := time.Now().Add(3 * time.Second)
			for i := 0; time.Now().Before(deadline); i++ {
				time.Sleep(20 * time.Millisecond) // let the closed connection show
				if n := countRows(t, served, conn, table); n < seen {
					stale++
					if mode == "on" {
						t.Fatalf("read %d saw %d rows on %v after an earlier read saw %d", i, n, on, seen)
					}
				}
			}
			if mode == "off" && stale == 0 {
				t.Fatalf("read_your_writes=off: no read saw fewer than %d rows; the test cannot fail", seen)
			}
		})
	}
}

// Class 4: with session_scope=db, reads do not raise the pool's watermark:
// a session that never wrote does not wait for what others read.
func TestIntegrationReadsDoNotRaisePoolWatermark(t *testing.T) {
	table := newTable(t)
	ctx := context.Background()
	db, c := openDB(t, "session_scope=db")
	for i := 0; i < 20; i++ {
		countRows(t, ctx, db, table)
	}
	if wm := pgryw.PoolWatermark(c); wm != "0/00000000" {
		t.Fatalf("reads alone raised the pool's watermark to %s", wm)
	}
}

// Class 5: nothing pgryw adds runs inside a block an Exec'd BEGIN opened:
// SET TRANSACTION still works, and REPEATABLE READ takes its snapshot at the
// first query, as with pgx.
func TestIntegrationExecBlockSemantics(t *testing.T) {
	table := newTable(t)
	ctx := context.Background()
	db, _ := openDB(t, "")
	other, _ := openDB(t, "")
	conn := oneConn(t, db)
	for _, begin := range []string{
		"BEGIN; SET LOCAL statement_timeout = '5s'",
		"BEGIN ISOLATION LEVEL REPEATABLE READ; SET LOCAL statement_timeout = '5s'",
		"INSERT INTO " + table + " VALUES (1000, 1) ON CONFLICT DO NOTHING; COMMIT; BEGIN",
	} {
		if _, err := conn.ExecContext(ctx, begin); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.ExecContext(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"); err != nil {
			t.Fatalf("after %q: %v", begin, err)
		}
		before := countRows(t, pgryw.WithPrimary(ctx), other, table)
		if _, err := other.ExecContext(ctx, "INSERT INTO "+table+" SELECT coalesce(max(id), 0) + 1, 1 FROM "+table); err != nil {
			t.Fatal(err)
		}
		// The block's first query takes its snapshot now, after the insert.
		if n := countRows(t, ctx, conn, table); n != before+1 {
			t.Fatalf("after %q the first query saw %d rows, want %d", begin, n, before+1)
		}
		if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
			t.Fatal(err)
		}
	}
}

// Class 6: the session's own ALTER TABLE is followed by a SELECT * that
// works, even when a discarded attempt on a lagging replica described it.
func TestIntegrationOwnSchemaChange(t *testing.T) {
	table := newTable(t)
	setDelay(t, 100*time.Millisecond)
	db, _ := openDB(t, "session_scope=conn&wait_timeout=2s&wait_method=poll")
	ctx := context.Background()
	conn := oneConn(t, db)
	if _, err := conn.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1, 1)"); err != nil {
		t.Fatal(err)
	}
	// Described (and cached) on the replicas before the ALTERs, too.
	for i := 0; i < 4; i++ {
		if _, err := conn.ExecContext(ctx, "SELECT * FROM "+table+" WHERE id = $1", 1); err != nil {
			t.Fatal(err)
		}
		rows, err := conn.QueryContext(ctx, "SELECT * FROM "+table+" WHERE id = $1", 1)
		if err != nil {
			t.Fatal(err)
		}
		rows.Close()
	}
	for i := 0; i < 4; i++ {
		if _, err := conn.ExecContext(ctx, fmt.Sprintf("ALTER TABLE %s ADD COLUMN c%d int DEFAULT %d", table, i, i)); err != nil {
			t.Fatal(err)
		}
		rows, err := conn.QueryContext(ctx, "SELECT * FROM "+table+" WHERE id = $1", 1)
		if err != nil {
			t.Fatalf("after ALTER %d: %v", i, err)
		}
		cols, _ := rows.Columns()
		n := 0
		for rows.Next() {
			n++
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("after ALTER %d: %v", i, err)
		}
		rows.Close()
		if n != 1 || len(cols) != 3+i {
			t.Fatalf("after ALTER %d: %d rows, columns %v", i, n, cols)
		}
	}
}

// Class 7: settings meant for the primary do not disable the replicas, and a
// read-only serializable transaction runs where it can.
func TestIntegrationReplicaSettings(t *testing.T) {
	table := newTable(t)
	ctx := context.Background()
	db, c := openDB(t, "target_session_attrs=read-write")
	for i := 0; i < 5; i++ {
		countRows(t, ctx, db, table)
	}
	if s := c.Stats(); s.ReplicaReads == 0 {
		t.Fatalf("target_session_attrs=read-write disabled replica reads: %+v", s)
	}
	// A startup setting a standby refuses must not disable the replicas.
	for _, extra := range []string{"transaction_read_only=off", "options=-c%20transaction_read_only%3Doff%20-c%20work_mem%3D8MB"} {
		db, c := openDB(t, extra)
		for i := 0; i < 5; i++ {
			countRows(t, ctx, db, table)
		}
		if s := c.Stats(); s.ReplicaReads == 0 {
			t.Fatalf("%s disabled replica reads: %+v", extra, s)
		}
	}
	// A default a standby cannot run (SERIALIZABLE) sends reads to the
	// primary rather than failing them.
	sdb, _ := openDB(t, "options=-c%20default_transaction_isolation%3Dserializable")
	for i := 0; i < 3; i++ {
		countRows(t, ctx, sdb, table)
		tx, err := sdb.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		countRows(t, ctx, tx, table)
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	for _, iso := range []sql.IsolationLevel{sql.LevelDefault, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable} {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true, Isolation: iso})
		if err != nil {
			t.Fatal(err)
		}
		countRows(t, ctx, tx, table)
		if err := tx.Commit(); err != nil {
			t.Fatalf("%v: %v", iso, err)
		}
	}
}

// waitReplicaCount waits until replica i has n rows in table.
func waitReplicaCount(t *testing.T, i int, table string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pc, err := pgx.Connect(ctx, cluster.ReplicaDSN(i))
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close(ctx)
	for {
		var got int
		if err := pc.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Failures fall back, not through: a read in flight on a replica that shuts
// down before its first row reached the caller is sent to another node, not
// failed.
func TestIntegrationReplicaStopsMidRead(t *testing.T) {
	table := newTable(t)
	db, _ := openDB(t, "")
	ctx := context.Background()
	var wg sync.WaitGroup
	var reads, errs atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Only a failure before the first row is the driver's to
				// hide: once a row has reached the caller, a replica that
				// dies before the end of the result fails the read, as on
				// any server.
				reads.Add(1)
				rows, err := db.QueryContext(ctx, "SELECT count(*) FROM "+table+" WHERE pg_sleep(0.005) IS NOT NULL")
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				if !rows.Next() && rows.Err() != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, rows.Err())
				}
				rows.Close()
			}
		}()
	}
	for i := 0; i < 2; i++ {
		time.Sleep(100 * time.Millisecond)
		if err := cluster.StopNode(i); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if err := cluster.StartNode(i); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if errs.Load() > 0 {
		t.Fatalf("%d of %d reads failed while replicas stopped; first: %v", errs.Load(), reads.Load(), firstErr.Load())
	}
}

// faultConn delays the first write holding marker, or cuts the first read
// after it (closing the socket without reading the answer).
type faultConn struct {
	net.Conn
	marker    []byte
	armed     *atomic.Bool
	delay     time.Duration
	cutAnswer bool
	cutNext   atomic.Bool
}

func (c *faultConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, c.marker) && c.armed.CompareAndSwap(true, false) {
		if c.delay > 0 {
			time.Sleep(c.delay)
		}
		if c.cutAnswer {
			c.cutNext.Store(true)
		}
	}
	return c.Conn.Write(b)
}

func (c *faultConn) Read(b []byte) (int, error) {
	if c.cutNext.CompareAndSwap(true, false) {
		c.Conn.Close()
		return 0, errors.New("faultConn: read cut")
	}
	return c.Conn.Read(b)
}

// openFaulty opens a pool whose server connections go through faultConn.
func openFaulty(t *testing.T, marker string, delay time.Duration, cutAnswer bool) (*sql.DB, *atomic.Bool) {
	t.Helper()
	armed := new(atomic.Bool)
	db := openHooked(t, "", func(nc net.Conn) net.Conn {
		return &faultConn{Conn: nc, marker: []byte(marker), armed: armed, delay: delay, cutAnswer: cutAnswer}
	})
	return db, armed
}

// openHooked opens a pool on the test cluster, with extra DSN keys, whose
// server connections go through hook (under pgryw's wire layer).
func openHooked(t *testing.T, extra string, hook func(net.Conn) net.Conn) *sql.DB {
	t.Helper()
	cfg, err := pgryw.ParseDSN(cluster.WriterDSN() + "&replicas=" + strings.Join(cluster.ReplicaAddrs(), ",") + extra)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgryw.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pgryw.SetNetHook(c, func(port uint16, nc net.Conn) net.Conn { return hook(nc) })
	db := sql.OpenDB(c)
	t.Cleanup(func() { db.Close() })
	return db
}

// Class 2, found by the history checker: pgx v5.12 calls a read that fails
// after a no-argument statement was sent safe to retry, and database/sql
// ran the statement again. pgryw reports ErrConnLost instead.
func TestIntegrationAnswerCutRunsOnce(t *testing.T) {
	table := newTable(t)
	db, armed := openFaulty(t, "INSERT INTO "+table, 0, true)
	ctx := context.Background()
	for i := 1; i <= 3; i++ {
		armed.Store(true)
		_, err := db.ExecContext(ctx, "INSERT INTO "+table+" (id, v) SELECT coalesce(max(id), 0) + 1, 1 FROM "+table)
		if !errors.Is(err, pgryw.ErrConnLost) {
			t.Fatalf("want ErrConnLost, got %v", err)
		}
		atMostOnce(t, db, table, i)
	}
}

// Found by the history checker: a slow write makes pgx start a background
// reader, which must not keep pgryw from reading the answer riding behind
// the statement (the write returned after 30 s).
func TestIntegrationSlowWriteReturns(t *testing.T) {
	table := newTable(t)
	db, armed := openFaulty(t, "INSERT INTO "+table, 100*time.Millisecond, false)
	ctx := context.Background()
	for i := 1; i <= 3; i++ {
		armed.Store(true)
		start := time.Now()
		if _, err := db.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s VALUES (%d, 1)", table, i)); err != nil {
			t.Fatal(err)
		}
		// A 100 ms stall; seconds more is the defect.
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("a write stalled 100ms returned after %v", took)
		}
		if n := countRows(t, ctx, db, table); n != i {
			t.Fatalf("read %d rows after %d inserts", n, i)
		}
	}
}

// lateConn sends, for the first write holding marker, the protocol message
// holding it at once and the rest of the write (pgryw's ride-along) only
// after delay; later writes wait for it.
type lateConn struct {
	net.Conn
	marker []byte
	armed  *atomic.Bool
	delay  time.Duration
	mu     sync.Mutex
}

func (c *lateConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	if i := bytes.Index(b, c.marker); i >= 0 && c.armed.CompareAndSwap(true, false) {
		for at := 0; at+5 <= len(b); {
			end := at + 1 + int(binary.BigEndian.Uint32(b[at+1:at+5]))
			if end > i && end < len(b) {
				if _, err := c.Conn.Write(b[:end]); err != nil {
					c.mu.Unlock()
					return 0, err
				}
				rest := append([]byte(nil), b[end:]...)
				go func() {
					defer c.mu.Unlock()
					time.Sleep(c.delay)
					c.Conn.Write(rest)
				}()
				return len(b), nil
			}
			at = end
		}
	}
	defer c.mu.Unlock()
	return c.Conn.Write(b)
}

// Found by the history checker on PostgreSQL 19: a read on the primary
// whose ride-along position could not be awaited (the caller's context
// ended first, so the connection was closed) left the connection's floor
// where it was, and the connection's next read, on a replica behind the
// primary, went back in time.
func TestIntegrationPrimaryReadFloorLost(t *testing.T) {
	table := newTable(t)
	ctx := context.Background()
	var armed atomic.Bool
	marker := []byte("SELECT count(*) FROM " + table + " /* late */")
	db := openHooked(t, "&session_scope=conn&wait_timeout=50ms", func(nc net.Conn) net.Conn {
		return &lateConn{Conn: nc, marker: marker, armed: &armed, delay: 300 * time.Millisecond}
	})
	other, _ := openDB(t, "")
	conn := oneConn(t, db)
	countRows(t, ctx, conn, table) // the connection's replica connections exist
	for i := 0; i < 2; i++ {
		if err := cluster.PauseReplay(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for i := 0; i < 2; i++ {
			cluster.ResumeReplay(ctx, i)
		}
		cluster.WaitCaughtUp(ctx)
	}()
	if _, err := other.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1, 1)"); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	rctx, cancel := context.WithTimeout(pgryw.WithPrimary(ctx), 100*time.Millisecond)
	// The simple protocol: one Query message, then pgryw's capture.
	rows, err := conn.QueryContext(rctx, string(marker), pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatal(err)
	}
	var seen int
	for rows.Next() {
		rows.Scan(&seen)
	}
	<-rctx.Done() // the ride-along answer is still on its way
	rows.Close()
	cancel()
	if seen != 1 {
		t.Fatalf("the primary read saw %d rows", seen)
	}
	var n int
	err = conn.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n)
	if err == nil && n < seen {
		t.Fatalf("a read on the same connection went back in time: %d rows after %d", n, seen)
	}
	t.Logf("next read: %d rows, %v", n, err)
}
